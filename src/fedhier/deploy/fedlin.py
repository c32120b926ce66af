"""FedLin (HM1, HM2) over Flower: the ``fit.toml`` of a deployment and what the runtime asks of it.

:class:`FedLinFitConfig` is the :class:`~fedhier.runtime.flower.Deployment` of
:class:`fedhier.estimators.fedlin.FedHM1Regressor` (``model = "fedlin-hm1"``) and
:class:`fedhier.estimators.fedlin.FedHM2Regressor` (``model = "fedlin-hm2"``).  Each site (e.g. one
machine of a fleet) holds one CSV file whose header names the response and the features::

    model = "fedlin-hm2"
    target = "sensor"                      # the response column
    features = ["t", "t2", "t3", "t4"]     # the predictor columns, in this order
    intercept = true                       # add a column of ones (first coefficient)
    n_rounds = 20
    seed = 0
    prior = "gaussian"                     # any option of the estimator (below)

    [flower]
    sites = ["machine-01", "machine-02", "machine-03"]
    out = "fedlin-fit"

Options: those of the estimator's constructor -- HM2: ``prior``, ``covariance``,
``random`` (the features whose coefficient varies by site; default all), ``noise``,
``tau``, ``mu_scale``, ``damping``, ``tol``, ``tilted_method``, ``n_draws``, ``mcmc``,
``n_posterior_draws``, ``level``, ``standardize``, and ``aggregation = "secure"`` with a
``[secure]`` table (secure summation of the EP deltas, as ``simulate()``); HM1:
``n_local_steps``, ``eta``, ``alpha``, ``omega_rule``, ``batch_size``, ``gradient``,
``shrink_scale``, ``init``, ``jitter``.  HM1 sends each site only its own column of
:math:`\\Theta` and gathers every site's reply (no secure summation).

Result folder (on the SuperLink host): ``model.npz`` (``fedhier.estimators.fedlin.load``), and
``coefficients.csv`` (HM1: every site's coefficients, which the coordinator holds in HM1)
or ``phi.csv`` (HM2: the posterior of the population parameters :math:`\\phi`, with
intervals).  An HM2 site's own coefficients and intervals are computed on its machine from
``model.npz`` and its own file (``FedHM2Regressor.adapt``); they never reach the coordinator.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..protocol.base import RoundProtocol
from ..runtime.flower import Deployment, FitHooks, FlowerFitResult, check_flower_settings, check_secure_settings, read_fit_tables
from ._toml import FEDLIN_OPTIONS, TomlFit, check_range_columns, deployment_keys

__all__ = ["FedLinFitConfig", "OPTIONS"]

#: estimator options a ``fit.toml`` may set, per model
OPTIONS = FEDLIN_OPTIONS
_KEYS = {"target", "features", "intercept", "n_rounds", "seed", "aggregation"}
_INTERCEPT = "(intercept)"


@dataclass(frozen=True)
class FedLinFitConfig(TomlFit, Deployment):
    """A FedLin fit over Flower, as written in ``fit.toml`` (module docstring; ``docs/flower.md``).

    Parameters
    ----------
    model : "fedlin-hm1" or "fedlin-hm2"
    target : str
        The response column of every site's file.
    features : tuple of str
        The predictor columns, in coefficient order.
    sites : tuple of str
        Site names in site-index order (``[flower] sites``).
    intercept : bool
        Add a column of ones before the features (coefficient ``"(intercept)"``).
    n_rounds : int or None
        Rounds (HM2: the largest number; its stopping rule may end the fit earlier); None (default):
        the estimator's own default, as every other option.
    seed : int or None
        The coordinator's public seed (HM1's random start, the runtime's draws); it never
        reaches a site's secrets.
    options : mapping
        Options of the estimator's constructor (:data:`OPTIONS`).
    min_sites, round_timeout, connect_timeout, poll_interval, out
        The ``[flower]`` table (:func:`fedhier.runtime.flower.check_flower_settings`).
    aggregation : "plain" or "secure"; threshold, frac_bits
        HM2 only: secure summation of the EP deltas, as
        :class:`fedhier.secure.secure_round.SecureAggregator`.
    ranges : mapping column -> (low, high)
        ``scale = "minmax"`` with public bounds for the target and every feature: each site scales
        its own file (a value outside its bound is refused) and the coefficients are in the scaled
        units; nothing is sent for it.  Empty: the files' own units.
    id : str or None
        The column that identifies a subject: each site refuses its file if the column is absent or an
        id repeats (a subject counted twice).  Never read into the model.
    """

    model: str
    target: str
    features: tuple[str, ...]
    sites: tuple[str, ...]
    intercept: bool = False
    n_rounds: int | None = None
    seed: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    min_sites: int = 1
    round_timeout: float = 600.0
    connect_timeout: float = 300.0
    poll_interval: float = 0.2
    out: str = "fedhier-flower-fit"
    aggregation: str = "plain"
    threshold: int | None = None
    frac_bits: int = 30
    partial: str = "missing"
    missing_values: Mapping[str, list[str]] = field(default_factory=dict)
    ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", tuple(self.features))
        object.__setattr__(self, "sites", tuple(self.sites))
        object.__setattr__(self, "options", dict(self.options))
        if self.n_rounds is None and self.model in OPTIONS:  # the estimator's default, as the file's other options
            import inspect

            from ..estimators.fedlin import FedHM1Regressor, FedHM2Regressor

            estimator = FedHM1Regressor if self.model == "fedlin-hm1" else FedHM2Regressor
            object.__setattr__(self, "n_rounds", inspect.signature(estimator).parameters["n_rounds"].default)
        object.__setattr__(self, "ranges", {str(c): (float(lo), float(hi)) for c, (lo, hi) in dict(self.ranges).items()})
        if self.model not in OPTIONS:
            raise ValueError(f"fit configuration: model must be one of {sorted(OPTIONS)}, got {self.model!r}")
        if not isinstance(self.target, str) or not self.target:
            raise ValueError("fit configuration: target must name the response column")
        if not self.features or not all(isinstance(c, str) and c for c in self.features):
            raise ValueError("fit configuration: features must list the predictor columns (non-empty strings)")
        repeated = sorted({c for c in (*self.features, self.target) if (*self.features, self.target).count(c) > 1})
        if repeated:
            raise ValueError(f"fit configuration: column(s) {repeated} named more than once in target and features")
        if not isinstance(self.intercept, bool):
            raise ValueError(f"fit configuration: intercept must be true or false, got {self.intercept!r}")
        check_flower_settings(self)
        if self.ranges:
            check_range_columns(self.ranges, [*self.features, self.target], "fit configuration")
        unknown = sorted(set(self.options) - OPTIONS[self.model])
        if unknown:
            raise ValueError(f"fit configuration: unknown option(s) {unknown} for {self.model}; allowed: {sorted(OPTIONS[self.model])}")
        check_secure_settings(self)
        if self.aggregation == "secure" and self.model != "fedlin-hm2":
            raise ValueError("fit configuration: aggregation = 'secure' needs model = 'fedlin-hm2' (HM1 gathers every site's reply)")
        try:  # the estimator checks its own options, as in simulate()
            self.protocol()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"fit configuration: {exc}") from None

    # ------------------------------------------------------------------ reading
    @classmethod
    def from_toml(cls, text: str, source: str = "fit.toml") -> "FedLinFitConfig":
        """Parse the TOML text of a FedLin ``fit.toml``; ValueError naming ``source`` and the key."""
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{source}: invalid TOML: {exc}") from exc
        model = raw.get("model")
        if model not in OPTIONS:
            raise ValueError(f"{source}: model must be one of {sorted(OPTIONS)}, got {model!r}")
        raw, reading = deployment_keys(raw, source, "fedlin", _KEYS | OPTIONS[model])
        raw, flower, secure = read_fit_tables(raw, source, _KEYS | OPTIONS[model])
        for key in ("target", "features"):
            if key not in raw:
                raise ValueError(f"{source}: {key} is required (the response column and the list of predictor columns)")
        if not isinstance(raw["features"], list):
            raise ValueError(f"{source}: features must be a list of column names")
        options = {k: raw.pop(k) for k in sorted(OPTIONS[model]) if k in raw}
        try:
            return cls(model=model, options=options, **raw, **flower, **secure, **reading)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {exc}") from None

    # ------------------------------------------------------------------ the estimator
    @property
    def columns(self) -> list[str]:
        """Coefficient names: ``"(intercept)"`` (with ``intercept``) then the features."""
        return [_INTERCEPT, *self.features] if self.intercept else list(self.features)

    def estimator_params(self) -> dict[str, Any]:
        """Constructor parameters of the estimator of this fit."""
        params = dict(self.options)
        params.update(n_rounds=self.n_rounds, random_state=self.seed, fit_intercept=False)  # the columns hold the intercept
        if self.model == "fedlin-hm1":
            params.setdefault("eta", 1e-4)  # the coordinator has no data to choose a step from
        if self.model == "fedlin-hm2":
            if params.get("random") is not None:
                wanted = params["random"]
                unknown = sorted(set(wanted) - set(self.columns)) if isinstance(wanted, list) else wanted
                if not isinstance(wanted, list) or unknown:
                    raise ValueError(f"random must list feature names among {self.columns}; unknown: {unknown}")
                params["random"] = [c in set(wanted) for c in self.columns]
            params.update(aggregation=self.aggregation, scale="none")  # the TOML's scale key scales the columns
        return params

    def estimator(self):
        """A fresh, unfitted estimator with this fit's parameters."""
        from ..estimators.fedlin import FedHM1Regressor, FedHM2Regressor

        if self.model == "fedlin-hm1":
            return FedHM1Regressor(**self.estimator_params())
        return FedHM2Regressor(**self.estimator_params(), aggregator=self.aggregator())

    def protocol(self) -> RoundProtocol:
        """The round protocol, built by the estimator as its ``fit`` builds it for ``simulate()``."""
        d = len(self.columns)
        if self.model == "fedlin-hm1":
            return self.estimator().protocol(len(self.sites), d)
        return self.estimator().protocol(d)

    def aggregator(self):
        """The :class:`~fedhier.secure.secure_round.SecureAggregator` of a secure HM2 fit, else None."""
        if self.aggregation == "plain":
            return None
        from ..secure.secure_round import SecureAggregator

        return SecureAggregator(len(self.sites), threshold=self.threshold, frac_bits=self.frac_bits)

    # ------------------------------------------------------------------ the site's file
    def load_site(self, site: str, path: str | Path):
        """Read one site's CSV file: ``(X (n, d), y (n,))`` for HM1, the site's own standardised
        sufficient statistics (:meth:`FedHM2Regressor.site_stats`) for HM2.

        A row with an empty cell is left out (``partial = "refuse"``: an error); with ``ranges`` every
        column is min-max scaled with its declared bounds (a value outside them is refused); errors name the site,
        column and row, never a value (:class:`~fedhier.data.sitefiles.SiteDataError`).
        """
        from ..data.sitefiles import SiteDataError, check_id_column, check_within_ranges, read_rows, read_table

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"site {site!r}: data file {path} does not exist")
        table = read_table(path, site, self.missing_values, expected=[*self.features, self.target])
        check_id_column(table, self.id)
        values, _ = read_rows(table, [*self.features, self.target], partial=self.partial, what="target and features")
        check_within_ranges([table], self.ranges)
        values = self.scaling().transform([*self.features, self.target], values)
        X, y = np.ascontiguousarray(values[:, :-1]), values[:, -1].copy()
        if X.shape[0] < 2:
            raise SiteDataError(f"site {site!r}: {X.shape[0]} row(s) in {path.name}; a site needs at least 2")
        if self.intercept:
            X = np.column_stack([np.ones(X.shape[0]), X])
        if self.model == "fedlin-hm1":
            return X, y
        stats, _ = self.estimator().site_stats(X, y, site=self.sites.index(site) if site in self.sites else site)
        return stats

    def scaling(self):
        """The :class:`~fedhier.data.scaling.ColumnScaling` of the features and target: from ``ranges``, else none."""
        from ..data.scaling import ColumnScaling

        columns = [*self.features, self.target]
        return ColumnScaling.from_ranges(columns, self.ranges) if self.ranges else ColumnScaling("none", columns)

    # ------------------------------------------------------------------ the result
    @property
    def sites_keep_state(self) -> bool:
        """HM2 sites keep their EP factor between rounds (a resumed Flower run would lose it); HM1 sites keep nothing."""
        return self.model == "fedlin-hm2"

    def hooks(self, previous=None) -> FitHooks:
        """HM2: the estimator's tracker (moments of q(phi) per round, the EP stopping rule); HM1: none."""
        if self.model == "fedlin-hm1":
            return FitHooks()
        estimator = self.estimator()
        stop, history = estimator.tracker(estimator.protocol(len(self.columns)))
        return FitHooks(stop=stop, notes={"history": history})

    def write_model(self, out: Path, result: FlowerFitResult, hooks: FitHooks) -> dict[str, Any]:
        """``model.npz`` (``fedhier.estimators.fedlin.load``) and ``coefficients.csv`` (HM1) or ``phi.csv`` (HM2)."""
        from ..estimators.fedlin import FedHM1Regressor, FedHM2Regressor
        from ..utils.io import write_csv

        out = Path(out)
        params, d = self.estimator_params(), len(self.columns)
        if self.model == "fedlin-hm1":
            model = FedHM1Regressor.from_broadcast(result.broadcast, result.history, n_sites=len(self.sites), n_features=d, **params)
            write_csv(out / "coefficients.csv", [
                {"site": name, "feature": c, "estimate": float(model.coef_[k, j])}
                for k, name in enumerate(self.sites) for j, c in enumerate(self.columns)
            ])
        else:
            history = hooks.notes.get("history")
            if history is None or len(history) != len(result.history):  # a fit whose hooks did not run: rebuild the rows
                history = [r.to_dict() for r in result.history]
            model = FedHM2Regressor.from_broadcast(result.broadcast, history, seed=result.seed, n_sites=len(self.sites),
                                                   n_features=d, **params)
            level = float(model.level)
            ci = model.phi_interval(level)
            write_csv(out / "phi.csv", [
                {"component": name, "mean": float(model.phi_mean_[i]), "lower": float(ci[i, 0]), "upper": float(ci[i, 1]),
                 "level": level}
                for i, name in enumerate(model.phi_names_)
            ])
        model.save(out / "model.npz")
        return {"model_file": str(out / "model.npz"), "coefficients": self.columns, "scaling": self.scaling().to_dict()}

