"""Fed-mv-PPCA over Flower: the ``fit.toml`` of a deployment and what the runtime asks of it.

:class:`FlowerFitConfig` is the :class:`~fedhier.runtime.flower.Deployment` of
:class:`fedhier.estimators.mvppca.FedMVPPCA` (``model = "fed-mv-ppca"``, the default of a ``fit.toml``
without ``model``): the views and their columns, the estimator's options, DP and secure
summation, and the ``[flower]`` table; ``docs/flower.md`` has the recipe.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..protocol.base import RoundProtocol
from ..protocol.defaults import MVPPCA_TOL, default_n_components
from ..protocol.messages import MessageSpec
from ._toml import TomlFit, check_privacy_unit, check_range_columns, deployment_keys
from ..runtime.flower import Deployment, FitHooks, FlowerFitResult, check_flower_settings, check_secure_settings, read_fit_tables

__all__ = ["FlowerFitConfig"]

_ALLOWED_KEYS = {
    "n_components", "n_rounds", "n_local_iter", "n_first_iter", "tol", "init", "local_tol", "seed", "ig_solver",
    "sigma2_prior", "prior_update", "views",
    "epsilon", "delta", "privacy_unit", "aggregation",
}


@dataclass(frozen=True)
class FlowerFitConfig(TomlFit, Deployment):
    """A Fed-mv-PPCA fit over Flower, as written in ``fit.toml`` (see ``docs/flower.md``).

    Parameters
    ----------
    views : mapping view name -> tuple of column names
        View order and dimensions (the schema every site is checked against).
    sites : tuple of str
        Site names in site-index order; each SuperNode declares its name in its
        ``node_config`` (``site="..."``).
    n_components, n_rounds, n_local_iter, n_first_iter, tol, init, local_tol, ig_solver, sigma2_prior, prior_update
        As :class:`fedhier.estimators.mvppca.FedMVPPCA`, with its defaults (``tol``: stop after
        the first round in which the model's predictions changed by less, the estimator's rule;
        ``tol = "none"`` runs every round).  ``prior_update="em"`` (default) adds each site's posterior spread to
        its reply (two summed scalars per view, released under DP like the rest);
        ``"paper"`` keeps the paper's update.
    seed : int or None
        The coordinator's public seed (recorded in the result); None draws one.  It never
        reaches a site's secrets (see the module docstring).
    min_sites : int
        Fewest replies a round needs; fewer stop the fit.
    round_timeout : float
        Seconds the server waits for a new reply before it gives up on the sites that have not
        answered (each reply restarts the wait).
    connect_timeout : float
        Seconds the server waits, before round 1, for a SuperNode per listed site.
    poll_interval : float
        Seconds between two pulls of replies from the SuperLink.
    out : str
        Folder, on the machine that runs the ServerApp (the SuperLink host), that
        receives ``model.npz``, ``broadcast.fhm``, ``history.json`` and ``summary.json``.
    epsilon, delta : float
        Total DP budget per site (``epsilon`` None = no DP).
    privacy_unit : "site" or "record"
        What a private fit protects.  ``"site"`` (default): a site's whole data set, by noise
        in every round's reply (client-level DP, calibrated for ``n_rounds`` rounds).
        ``"record"``: one subject, by one release of the site's noisy moments
        (:class:`fedhier.privacy.analyze_gauss.RecordDP`); the fit is that one round
        (``n_rounds`` is 1) and the coordinator's post-processing.  Needs ``scale = "minmax"``
        with ``[ranges]`` (a record's bound is on the [0, 1] scale) and ``aggregation = "plain"``.
    aggregation : "plain" or "secure"
        "secure": the server only learns the sum of the replies (Bonawitz et al. secure
        summation, ``docs/secure-aggregation.md``), with the ``[secure]`` settings:
    threshold : int or None
        Shamir threshold t (``[secure] threshold``); default ``len(sites) // 2 + 1``.
    frac_bits : int
        Fixed-point fractional bits (``[secure] frac_bits``), default 30.  Both as
        :class:`fedhier.secure.secure_round.SecureAggregator`.
    partial : "missing" or "refuse"
        A subject observed in only part of a view lacks the view, or the site's file is refused
        (as ``fedhier fit``; the file's other data keys -- ``[sites]``, ``file`` -- are the command
        line's).
    missing_values : mapping column -> cells
        Cells that also mean "missing" in a column (``docs/cli.md``).
    ranges : mapping column -> (low, high)
        ``scale = "minmax"`` with public bounds for every column: each site scales its own file
        ``z = (x - low) / (high - low)`` and refuses a value outside its bound; nothing is sent for
        it.  Empty: the files are used in their own units.
    id : str or None
        The column that identifies a subject: each site refuses its file if the column is absent or an
        id repeats (a subject counted twice).  Never read into the model.
    """

    views: Mapping[str, tuple[str, ...]]
    sites: tuple[str, ...]
    n_components: int | None = None
    n_rounds: int = 100
    n_local_iter: int = 100
    n_first_iter: int = 30
    tol: float | None = MVPPCA_TOL
    init: str = "pca"
    local_tol: float | None = 1e-8
    seed: int | None = None
    ig_solver: str = "newton"
    sigma2_prior: str | None = "weak"
    prior_update: str = "em"
    min_sites: int = 1
    round_timeout: float = 600.0
    connect_timeout: float = 300.0
    poll_interval: float = 0.2
    out: str = "fedhier-flower-fit"
    epsilon: float | None = None
    delta: float = 1e-5
    privacy_unit: str = "site"
    aggregation: str = "plain"
    threshold: int | None = None
    frac_bits: int = 30
    partial: str = "missing"
    missing_values: Mapping[str, list[str]] = field(default_factory=dict)
    ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    id: str | None = None

    model = "fed-mv-ppca"

    def __post_init__(self) -> None:
        object.__setattr__(self, "views", {str(v): tuple(c) for v, c in dict(self.views).items()})
        object.__setattr__(self, "sites", tuple(self.sites))
        object.__setattr__(self, "ranges", {str(c): (float(lo), float(hi)) for c, (lo, hi) in dict(self.ranges).items()})
        if self.privacy_unit == "record":  # one release per site: the fit is one round
            object.__setattr__(self, "n_rounds", 1)
        self._check()

    def _check(self) -> None:
        if not self.views:
            raise ValueError("fit configuration: [views] must map at least one view name to its columns")
        seen: dict[str, str] = {}
        for view, columns in self.views.items():
            if not columns or not all(isinstance(c, str) and c for c in columns):
                raise ValueError(f"fit configuration: view {view!r} must list its columns as non-empty strings")
            for c in columns:
                if c in seen:
                    raise ValueError(f"fit configuration: column {c!r} is in both view {seen[c]!r} and view {view!r}")
                seen[c] = view
        check_flower_settings(self)
        if self.ranges:
            check_range_columns(self.ranges, list(seen), "fit configuration")
        largest = max(len(c) for c in self.views.values())
        if self.n_components is None:  # the estimator's default, from the declared views' widths
            object.__setattr__(self, "n_components", default_n_components(largest))
        for name in ("n_components", "n_local_iter", "n_first_iter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"fit configuration: {name} must be a positive integer, got {value!r}")
        if self.n_components >= largest:
            raise ValueError(
                f"fit configuration: n_components={self.n_components} must be smaller than the largest view dimension ({largest})"
            )
        if self.tol is not None and (
            isinstance(self.tol, bool) or not isinstance(self.tol, (int, float)) or not 0 < self.tol < math.inf
        ):
            raise ValueError(f"fit configuration: tol must be a positive number, got {self.tol!r}")
        if self.local_tol is not None and (
            isinstance(self.local_tol, bool) or not isinstance(self.local_tol, (int, float)) or not 0 < self.local_tol < math.inf
        ):
            raise ValueError(f"fit configuration: local_tol must be a positive number, got {self.local_tol!r}")
        if self.init not in ("pca", "random"):
            raise ValueError(f"fit configuration: init must be 'pca' or 'random', got {self.init!r}")
        if self.ig_solver not in ("newton", "fixed_point"):
            raise ValueError(f"fit configuration: ig_solver must be 'newton' or 'fixed_point', got {self.ig_solver!r}")
        if self.prior_update not in ("em", "paper"):
            raise ValueError(f"fit configuration: prior_update must be 'em' or 'paper', got {self.prior_update!r}")
        if self.sigma2_prior not in ("weak", None):
            raise ValueError(f"fit configuration: sigma2_prior must be 'weak' or 'none', got {self.sigma2_prior!r}")
        if self.epsilon is not None and (isinstance(self.epsilon, bool) or not isinstance(self.epsilon, (int, float)) or not self.epsilon > 0):
            raise ValueError(f"fit configuration: epsilon must be a positive number, got {self.epsilon!r}")
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or not 0 < self.delta < 1:
            raise ValueError(f"fit configuration: delta must be in (0, 1), got {self.delta!r}")
        check_privacy_unit(self.privacy_unit, "fit configuration", private=self.epsilon is not None,
                           minmax=bool(self.ranges), aggregation=self.aggregation)  # over Flower, min-max needs [ranges]
        check_secure_settings(self)

    # ------------------------------------------------------------------ reading / writing
    @classmethod
    def from_toml(cls, text: str, source: str = "fit.toml") -> "FlowerFitConfig":
        """Parse the TOML text of a fit configuration; ValueError naming ``source`` and the key."""
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{source}: invalid TOML: {exc}") from exc
        if raw.get("model", cls.model) != cls.model:
            raise ValueError(f"{source}: model = {raw['model']!r} is not a {cls.model} fit")
        raw, reading = deployment_keys(raw, source, "fed-mv-ppca", _ALLOWED_KEYS)
        raw, flower, secure = read_fit_tables(raw, source, _ALLOWED_KEYS)
        views = raw.pop("views", None)
        if not isinstance(views, dict) or not all(isinstance(c, list) for c in views.values()):
            raise ValueError(f"{source}: a [views] table mapping view names to column lists is required")
        for key in ("sigma2_prior", "local_tol", "tol"):  # TOML has no null
            if raw.get(key) == "none":
                raw[key] = None
        try:
            return cls(views=views, **raw, **flower, **secure, **reading)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None

    # ------------------------------------------------------------------ the model
    def schema(self):
        from ..data.schema import ViewSchema

        return ViewSchema(tuple(self.views), tuple(len(c) for c in self.views.values()))

    def protocol(self) -> RoundProtocol:
        """The Fed-mv-PPCA round, built as :class:`fedhier.estimators.mvppca.FedMVPPCA` builds it: with record-level
        privacy the one-shot release of noisy moments (:class:`fedhier.protocol.record_dp.MVPPCARecordDPProtocol`)."""
        if self.privacy_unit == "record":
            from ..protocol.record_dp import MVPPCARecordDPProtocol

            return MVPPCARecordDPProtocol(self.schema(), self.n_components, self.privacy(), ig_solver=self.ig_solver)
        from ..protocol.mvppca import MVPPCAProtocol

        return MVPPCAProtocol.from_settings(self.schema(), self, self.privacy())

    def reply_spec(self) -> MessageSpec:
        """A site's declared reply, ``protocol().reply_spec``, without calibrating the DP noise (it does not depend on it)."""
        if self.privacy_unit == "record":
            return self.protocol().reply_spec
        from ..protocol.mvppca import reply_spec

        return reply_spec(self.schema(), self.n_components, self.prior_update, private=self.epsilon is not None)

    def aggregator(self):
        """The :class:`~fedhier.secure.secure_round.SecureAggregator` of a secure fit, else None.

        Built as :class:`fedhier.estimators.mvppca.FedMVPPCA` builds it for ``simulate()`` (one site per
        listed name), so both runtimes sum with the same fixed point and threshold.
        """
        if self.aggregation == "plain":
            return None
        from ..secure.secure_round import SecureAggregator

        return SecureAggregator(len(self.sites), threshold=self.threshold, frac_bits=self.frac_bits)

    def privacy(self):
        """The DP configuration of a fit with a total budget (``epsilon``, ``delta``), else None.

        Site-level: calibrated for ``n_rounds`` rounds of releases of every view, so each site's
        end-to-end epsilon is at most ``epsilon`` (client-level DP, docs/privacy.md).  Record-level:
        the :class:`~fedhier.privacy.analyze_gauss.RecordDP` of the site's one release.
        """
        if self.epsilon is None:
            return None
        if self.privacy_unit == "record":
            from ..privacy.analyze_gauss import RecordDP

            return RecordDP(float(self.epsilon), float(self.delta))
        from ..models.mvppca.dp import DPConfig

        return DPConfig.total(float(self.epsilon), float(self.delta), n_rounds=self.n_rounds, n_views=len(self.views),
                              spread=self.prior_update == "em")


    # ------------------------------------------------------------------ the site's file, the result
    def load_site(self, site: str, path: str | Path) -> dict[str, np.ndarray]:
        """Read and check one site's CSV file (columns named as in ``views``).

        Returns ``{view: (n, d_view) float64 array}`` in schema order, views the file lacks
        omitted, min-max scaled with the declared ``ranges`` if any (a value outside its range is
        refused).  Raises :class:`~fedhier.data.sitefiles.SiteDataError` naming the site, view,
        column and row of a problem, never a value.
        """
        from ..data.validation import check_sites
        from ..data.sitefiles import SiteDataError, check_id_column, check_within_ranges, read_site_table, read_table

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"site {site!r}: data file {path} does not exist")
        table = read_table(path, site, self.missing_values, expected={c for cols in self.views.values() for c in cols})
        check_id_column(table, self.id)
        check_within_ranges([table], self.ranges)
        views = read_site_table(table, {v: list(c) for v, c in self.views.items()}, site, partial=self.partial)
        scaling = self.scaling()
        views = {v: scaling.transform(self.views[v], X) for v, X in views.items()}
        try:
            checked, _ = check_sites([views], schema=self.schema(), n_components=self.n_components, min_subjects=2,
                                     site_names=[site])
        except ValueError as exc:  # check_sites names sites, views, rows and columns, never values
            raise SiteDataError(str(exc)) from None
        return checked[0]

    def scaling(self):
        """The :class:`~fedhier.data.scaling.ColumnScaling` of every column: from the declared ``ranges``, else none."""
        from ..data.scaling import ColumnScaling

        columns = [c for cols in self.views.values() for c in cols]
        return ColumnScaling.from_ranges(columns, self.ranges) if self.ranges else ColumnScaling("none", columns)

    def hooks(self, previous=None) -> FitHooks:
        """The metrics :meth:`FedMVPPCA.fit` records (global sds, changes of theta~ and of the predictions) and its ``tol`` rule."""
        from ..protocol.mvppca import BroadcastMetrics, stopping_rule

        return FitHooks(callbacks=[BroadcastMetrics(self.schema(), previous)], stop=stopping_rule(self.tol, self.privacy()))

    def write_model(self, out: Path, result: FlowerFitResult, hooks: FitHooks) -> dict[str, Any]:
        """``model.npz``: a :class:`fedhier.estimators.mvppca.FedMVPPCA` file of the final broadcast; the privacy spent per site."""
        from ..estimators.mvppca import FedMVPPCA

        model = FedMVPPCA.from_broadcast(
            result.broadcast, self.schema(), result.history, seed=result.seed, n_sites=len(self.sites),
            n_components=self.n_components, n_rounds=self.n_rounds, n_local_iter=self.n_local_iter,
            n_first_iter=self.n_first_iter, tol=self.tol, init=self.init, local_tol=self.local_tol,
            prior_update=self.prior_update, random_state=result.seed, ig_solver=self.ig_solver,
            sigma2_prior=self.sigma2_prior, min_sites=self.min_sites, aggregation=self.aggregation,
        )
        model.save(Path(out) / "model.npz")
        return {"model_file": str(Path(out) / "model.npz"), "scaling": self.scaling().to_dict(), **self._privacy_summary(result)}

    def _privacy_summary(self, result: FlowerFitResult) -> dict[str, Any]:
        """Epsilon spent per site: with site-level privacy every site releases every view in every round it replies."""
        if self.epsilon is None:
            return {}
        if self.privacy_unit == "record":
            from ..record_dp import ledger_of

            ledger = ledger_of(self.privacy(), result.history)
            return {"privacy_unit": "record",
                    "privacy_spent": {self.sites[s]: v for s, v in ledger.spent(self.delta).items()}}
        from ..models.mvppca.dp import ledger_from_history

        ledger = ledger_from_history(self.privacy(), [list(self.views)] * len(self.sites), result.history,
                                     spread=self.prior_update == "em")
        return {"privacy_spent": {self.sites[s]: v for s, v in ledger.spent(self.delta).items()}}
