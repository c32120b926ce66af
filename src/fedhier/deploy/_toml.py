"""Reading and passing on a deployment's ``fit.toml`` (shared by every family's configuration dataclass)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Mapping


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

_STRING, _BOOLEAN, _INTEGER, _NUMBER, _TABLE = "string", "boolean", "integer", "number", "table"
_STRINGS, _NUMBERS, _TABLES = "list of strings", "list of numbers", "list of tables"
_NONE = "none"  # the string "none", where a key may be turned off (tol = "none": no stopping rule)
#: the TOML type(s) each top-level key takes; a value of another type is refused (a string is never a boolean)
KEY_TYPES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(["file", "site_column", "id", "scale", "partial", "model", "target", "label", "init", "ig_solver",
                     "sigma2_prior", "privacy_unit", "aggregation", "omega_rule", "gradient", "prior", "covariance",
                     "tilted_method", "weights"], (_STRING,)),
    **dict.fromkeys(["scaling_outside_privacy", "intercept", "jitter", "standardize"], (_BOOLEAN,)),
    **dict.fromkeys(["n_components", "n_rounds", "n_local_iter", "n_first_iter", "n_init", "seed", "n_local_steps",
                     "batch_size", "n_draws", "n_posterior_draws", "max_iter"], (_INTEGER,)),
    **dict.fromkeys(["tol", "local_tol"], (_NUMBER, _NONE)),
    **dict.fromkeys(["epsilon", "delta", "eta", "alpha", "shrink_scale", "mu_scale", "damping",
                     "level", "rho"], (_NUMBER,)),
    **dict.fromkeys(["missing_values", "ranges", "views", "mcmc", "flower", "secure"], (_TABLE,)),
    "sites": (_TABLE, _TABLES),  # [sites] name = "file", or [[sites]] with name and path
    **dict.fromkeys(["features", "variables"], (_STRINGS,)),
    "random": (_STRINGS, _STRING),
    "noise": (_STRING, _NUMBER),
    "tau": (_NUMBER, _NUMBERS),
}


def _is(value: Any, kind: str) -> bool:
    if kind == _STRING:
        return isinstance(value, str)
    if kind == _BOOLEAN:
        return isinstance(value, bool)
    if kind == _INTEGER:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == _TABLE:
        return isinstance(value, dict)
    if kind == _NONE:
        return value == "none"
    item = {_STRINGS: _STRING, _NUMBERS: _NUMBER, _TABLES: _TABLE}[kind]
    return isinstance(value, list) and all(_is(v, item) for v in value)


def _toml_type(value: Any) -> str:
    """What a parsed TOML value is, for an error line: 'the string "false"', 'the number 2.5', 'a table'."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f'the string "{value}"' if len(value) <= 40 else "a string"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value:g}"
    if isinstance(value, list):
        return "a list" + ("" if all(isinstance(v, (str, int, float)) for v in value) else " of tables or lists")
    return "a table" if isinstance(value, dict) else "a date or time"


_HOW = {_STRING: "a string in quotes", _BOOLEAN: "true or false, without quotes",
        _INTEGER: "a whole number without quotes, e.g. 20", _NUMBER: "a number without quotes, e.g. 0.5",
        _TABLE: "a table", _TABLES: "a list of tables", _STRINGS: 'a list of strings, e.g. ["age", "bmi"]',
        _NUMBERS: "a list of numbers, e.g. [0.5, 1.0]", _NONE: '"none"'}


def check_key_types(raw: Mapping[str, Any], source: str) -> None:
    """Refuse, in one line, every top-level key of a parsed ``fit.toml`` whose value is not of the TOML type that
    key takes (:data:`KEY_TYPES`): ``intercept = "false"`` is a string, not the boolean ``false``."""
    wrong = [(key, kinds) for key, kinds in KEY_TYPES.items() if key in raw and not any(_is(raw[key], k) for k in kinds)]
    if wrong:
        parts = [f"{key} must be {' or '.join(_HOW[k] for k in kinds)}, got {_toml_type(raw[key])}" for key, kinds in wrong]
        raise ValueError(f"{source}: {'; '.join(parts)}")


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
    check_key_types(raw, source)
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
