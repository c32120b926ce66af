"""Reading and passing on a deployment's ``fit.toml`` (shared by every family's configuration dataclass)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any


#: where the sites' rows are and how they are read: the same keys for every family and command (docs/cli.md)
DATA_KEYS = frozenset({"sites", "file", "site_column", "id", "scale", "partial", "missing_values", "ranges",
                       "scaling_outside_privacy"})
#: what each family models
MODEL_KEYS = {"fed-mv-ppca": frozenset({"views"}), "fedlin": frozenset({"target", "features", "intercept"}),
              "collab": frozenset({"variables", "label"})}
#: FedLin estimator options a ``fit.toml`` may set, per model
FEDLIN_OPTIONS = {
    "fedlin-hm1": frozenset({"n_local_steps", "eta", "alpha", "omega_rule", "batch_size", "gradient", "shrink_scale", "init", "jitter"}),
    "fedlin-hm2": frozenset({"prior", "covariance", "random", "noise", "tau", "mu_scale", "damping", "tol", "tilted_method",
                             "n_draws", "mcmc", "n_posterior_draws", "level", "standardize"}),
}
#: each family's options on the command line (a file may hold several families' keys; each command reads its own)
FAMILY_OPTIONS = {
    "fed-mv-ppca": frozenset({"n_components", "n_rounds", "n_local_iter", "n_first_iter", "n_init", "tol", "init",
                              "local_tol", "seed", "ig_solver", "sigma2_prior", "epsilon", "delta", "privacy_unit",
                              "aggregation"}),
    "fedlin": frozenset({"model", "n_rounds", "seed", "aggregation"}).union(*FEDLIN_OPTIONS.values()),
    "collab": frozenset({"n_components", "rho", "weights", "aggregation", "max_iter", "seed"}),
}
#: the keys that ask for a differentially private fit (only Fed-mv-PPCA has one)
PRIVACY_KEYS = ("epsilon", "delta", "privacy_unit", "scaling_outside_privacy")
#: every top-level key of a configuration
CONFIG_KEYS = DATA_KEYS | {"model", "flower", "secure"} | frozenset().union(*MODEL_KEYS.values(), *FAMILY_OPTIONS.values())


def deployment_keys(raw: dict[str, Any], source: str, family: str,
                    own: frozenset[str] | set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A parsed ``fit.toml`` without the command line's data keys and the keys only other families read, and how
    each site reads its file: ``{"partial": ..., "missing_values": ..., "ranges": ..., "id": ...}``.

    The Flower deployment reads the same file as ``fedhier fit``: ``[sites]``, ``file`` and ``site_column`` are
    the command line's (each SuperNode names its own file); ``id``, when set, is checked at each site (the column
    is there, no id repeats).  ``scale = "minmax"`` needs public
    ``[ranges]`` (each site applies them to its own file, nothing is sent; the deployment checks that every
    column has one); a scaling fitted on the sites' data (``"standard"``, or ``"minmax"`` without ranges) is
    refused.  ``own``: the keys the deployment itself reads.
    """
    raw = dict(raw)
    if family != "fed-mv-ppca":
        refuse_privacy_keys(raw, source, "a FedLin fit" if family == "fedlin" else "a CollabDict fit")
    scale = raw.get("scale", "none")
    ranges = check_ranges(raw.get("ranges", {}), source)
    if scale == "minmax" and not ranges:
        raise ValueError(f"{source}: scale = 'minmax' over Flower needs public bounds for every column in a [ranges] "
                         "table (column = [low, high]); a scaling fitted on the sites' data is not run over Flower: "
                         "declare [ranges], or scale the sites' files beforehand and set scale = \"none\"")
    if scale not in ("minmax", "none"):
        raise ValueError(f"{source}: scale = {scale!r} is not applied over Flower (it would be fitted on the sites' data): "
                         "use scale = \"minmax\" with public bounds in a [ranges] table, or scale the sites' files "
                         "beforehand and set scale = \"none\"")
    if ranges and scale != "minmax":
        raise ValueError(f"{source}: [ranges] sets a min-max scaling: add scale = \"minmax\" (or remove [ranges])")
    partial = raw.get("partial", "missing")
    if partial not in ("missing", "refuse"):
        raise ValueError(f"{source}: partial must be 'missing' or 'refuse', got {partial!r}")
    missing = check_missing_values(raw.get("missing_values", {}), source)
    id_column = raw.get("id")
    if id_column is not None and not (isinstance(id_column, str) and id_column):
        raise ValueError(f"{source}: id must name a column, e.g. id = \"patient_id\"")
    for key in CONFIG_KEYS - set(own) - FAMILY_OPTIONS[family] - MODEL_KEYS[family] - {"model", "flower", "secure"}:
        raw.pop(key, None)
    return raw, {"partial": partial, "missing_values": missing, "ranges": ranges, "id": id_column}


def refuse_privacy_keys(raw: dict[str, Any], source: str, fit: str, spent: str = "") -> None:
    """Refuse a file that sets a privacy budget for ``fit`` (e.g. "a FedLin fit"), which takes none.

    A file may hold several families' keys and each command reads its own, but a privacy setting is never
    skipped in silence: the fit would run while its user believes it bounded by the budget.  ``spent``: what
    the fit says about privacy instead, if anything.
    """
    asked = [key for key in PRIVACY_KEYS if key in raw]
    if asked:
        raise ValueError(f"{source}: sets {', '.join(asked)}, but {fit} takes no privacy budget (only Fed-mv-PPCA "
                         f"takes one){spent}; remove {', '.join(asked)} to run it")


def check_privacy_unit(unit: Any, source: str, *, private: bool, minmax: bool, aggregation: str,
                       budget: str = "set epsilon") -> None:
    """``privacy_unit``: ``"site"`` (a site's whole data set, over every round) or ``"record"`` (one subject, by one
    release of noisy moments per site), which needs a budget (``budget`` says how to set one), data min-max scaled to
    [0, 1] (``minmax``) and plain aggregation.  The rules of ``fedhier fit`` and of the Flower deployment."""
    if unit not in ("site", "record"):
        raise ValueError(f"{source}: privacy_unit must be 'site' or 'record', got {unit!r}")
    if unit != "record":
        return
    if not private:
        raise ValueError(f"{source}: privacy_unit = 'record' needs a privacy budget: {budget}")
    if not minmax:
        raise ValueError(f"{source}: record-level privacy (privacy_unit = 'record') bounds each subject's row on data "
                         "min-max scaled to [0, 1]: set scale = \"minmax\" with public bounds in a [ranges] table")
    if aggregation != "plain":
        raise ValueError(f"{source}: record-level privacy (privacy_unit = 'record') sends one noisy release per site, "
                         "with nothing to sum securely: remove aggregation = \"secure\"")


def check_ranges(value: Any, source: str) -> dict[str, tuple[float, float]]:
    """``[ranges]``: a table column = [low, high] of public bounds (e.g. an assay's range), finite with low < high."""
    if not isinstance(value, dict):
        raise ValueError(f"{source}: [ranges] must map columns to [low, high], e.g. [ranges] age = [18, 100]")
    bad = [str(c) for c, v in value.items()
           if not (isinstance(v, (list, tuple)) and len(v) == 2
                   and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)
                   and v[0] < v[1])]
    if bad:
        raise ValueError(f"{source}: [ranges]: column(s) {bad} need two finite numbers [low, high] with low < high")
    return {str(c): (float(v[0]), float(v[1])) for c, v in value.items()}


def check_range_columns(ranges: dict[str, Any], columns: list[str], source: str) -> None:
    """Every column of a deployment has a declared range, and every declared range names one of its columns."""
    from ..data.sitefiles import close_matches

    unknown = [f"{c!r}{close_matches(c, columns)}" for c in ranges if c not in columns]
    if unknown:
        raise ValueError(f"{source}: [ranges] names column(s) that are not modelled: {'; '.join(unknown)} (columns: {columns})")
    lacking = [c for c in columns if c not in ranges]
    if lacking:
        raise ValueError(f"{source}: scale = 'minmax' over Flower needs a declared range for every column; "
                         f"[ranges] lacks {lacking}")


def check_missing_values(value: Any, source: str) -> dict[str, list[str]]:
    """``missing_values``: a table column = list of cells that mean "missing" in that column (e.g. chol = ["0"])."""
    if not isinstance(value, dict) or not all(
            isinstance(v, list) and all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in v)
            for v in value.values()):
        raise ValueError(f"{source}: missing_values must map columns to lists of cells, e.g. missing_values = {{ chol = [\"0\"] }}")
    return {str(c): [str(x) for x in v] for c, v in value.items()}


class TomlFit:
    """Mixin of a frozen configuration dataclass with a ``from_toml(text, source)`` classmethod and a ``model`` name."""

    model: str

    @classmethod
    def read(cls, path: str | Path):
        """Read ``fit.toml``; a relative ``out`` is resolved against the file's folder."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"fit configuration {path} does not exist")
        config = cls.from_toml(path.read_text(), str(path))
        out = Path(config.out)
        if not out.is_absolute():
            config = config.replace(out=str((path.parent / out).resolve()))
        return config

    def replace(self, **changes: Any):
        return type(self)(**{**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values (tuples become lists)."""
        def plain(value):
            if isinstance(value, (tuple, list)):
                return [plain(v) for v in value]
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            return value

        return {k: plain(v) for k, v in asdict(self).items()}

    def to_json(self) -> str:
        """The form that travels in the Flower run config (key ``RUN_CONFIG_KEY``), with ``model``."""
        return json.dumps({"model": self.model, **self.to_dict()}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str):
        values = json.loads(text)
        if "model" not in {f.name for f in fields(cls)} and values.pop("model", cls.model) != cls.model:
            raise ValueError(f"the run configuration is not a {cls.model} fit")
        return cls(**values)
