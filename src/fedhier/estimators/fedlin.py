"""FedLin estimators (spec ``fedlin.md``): HM1 and HM2, scikit-learn regressors fitted across sites.

>>> model = FedHM2Regressor(prior="lasso").fit([(X1, y1), (X2, y2)])   # doctest: +SKIP
>>> model = FedHM2Regressor().fit(X, y, groups=df.county)            # pooled rows, a site label  # doctest: +SKIP
>>> model.coef_interval(0.9)[0]            # 90% credible intervals of site 0   # doctest: +SKIP
>>> model.selected_features_[1]            # spec §5 inclusion decisions of site 1  # doctest: +SKIP

Fits run through :func:`fedhier.runtime.simulate` with the protocols of
:mod:`fedhier.protocol.fedlin`; only the declared messages cross a site boundary.
The data: a list of ``(X (n_k, d), y (n_k,))``, one pair per site; or ``X (n, d), y (n,)`` with
``groups`` (n,), the site of each row; or ``X, y`` alone, one site (the centralised fit).
With ``fit_intercept=True`` (the default, as in scikit-learn) the model's design gets a leading
column of ones whose coefficient varies across sites (the random intercept of a mixed model).
"""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import r2_score
from sklearn.utils.validation import check_is_fitted, validate_data

from ..data.validation import check_site_index
from ..models.fedlin.ep import cavity, converged
from ..models.fedlin.hierarchy import BayesianRidge, GaussianHierarchy
from ..models.fedlin.inference import credible_interval, gaussian_interval, inclusion_score, reject_null, select_features, tail_probability
from ..models.fedlin.lasso import BayesianLasso
from ..models.fedlin.natural import to_moments
from ..models.fedlin.stats import SiteStats, check_site, check_sites
from ..models.fedlin.tilted import METHODS as TILTED_METHODS
from ..models.fedlin.tilted import NEAR_GAUSSIAN, TiltedFailure, device_posterior, reweight, tilted_moments
from ..protocol.fedlin import EPProtocol, HM1Protocol, laplace_start, sample_fraction, settle_site_factor
from ..runtime.observers import unobserved
from ..runtime.simulate import simulate, site_rng
from ..utils.io import atomic_write_bytes, json_text
from ..utils.untrusted import check_finite, read_meta_json, read_npz
from ._input import NOT_FITTED, site_labels, site_of_rows, split_site_column

__all__ = ["FedHM1Regressor", "FedHM2Regressor", "FedLinWarning", "load"]

_FORMAT = "fedhier-fedlin-v1"


_INTERCEPT = "(intercept)"



def _check_fitted(model: Any) -> None:
    check_is_fitted(model, "coef_", msg=NOT_FITTED)


def name_components(phi_names: Sequence[str], labels: Sequence[str]) -> list[str]:
    """``mu[0]`` -> ``mu[(intercept)]``, ``mu[1]`` -> ``mu[age]``: design indices replaced by ``labels``."""
    return [re.sub(r"\[(\d+)\]", lambda m: f"[{labels[int(m.group(1))]}]", name) for name in phi_names]


def _is_site_list(X: Any) -> bool:
    """True for a list of ``(X_k, y_k)`` pairs (the federated form), False for a design matrix."""
    return isinstance(X, (list, tuple)) and len(X) > 0 and all(
        isinstance(pair, (tuple, list)) and len(pair) == 2 and np.ndim(pair[0]) == 2 for pair in X
    )


class FedLinWarning(UserWarning):
    """A FedLin fit finished with a caveat (e.g. a site's posterior had to use q instead of its cavity)."""


def _participation(value):
    return None if value is None or value == 1.0 else sample_fraction(value)


def _save_npz(path, arrays: dict[str, np.ndarray], params: dict[str, Any]) -> Path:
    buf = io.BytesIO()
    meta = {"format": _FORMAT, **params}
    np.savez(buf, __meta__=np.array(json_text(meta)), **arrays)
    return atomic_write_bytes(path, buf.getvalue())


def _read_npz(path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(meta, arrays) of a saved FedLin model; the file is untrusted input (sizes checked before
    reading, NaN/inf parameters refused naming the array)."""
    arrays = read_npz(path)
    meta = read_meta_json(arrays, "__meta__", str(path))
    del arrays["__meta__"]
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{path}: not a saved FedLin model (format {meta.get('format')!r})")
    check_finite(arrays, str(path))
    return meta, arrays


class _SiteRegressor(RegressorMixin, BaseEstimator):
    """What HM1 and HM2 share: the three data forms, the intercept column, prediction and R^2.

    ``site_column`` (both constructors, default None): the column of a pandas DataFrame ``X`` that
    holds each row's site, used as ``groups`` in ``fit`` and in prediction and not as a feature; it
    carries the sites through scikit-learn's cross-validation without metadata routing.

    Fitted attributes set here: ``sites_`` (the site labels: ``0..K-1`` for a list of sites, the
    sorted distinct ``groups`` otherwise), ``n_features_in_`` and, for DataFrame input,
    ``feature_names_in_``.
    """

    def _intercept_column(self) -> int:
        """1 when the model's design starts with a column of ones (the intercept), else 0."""
        return int(bool(self.fit_intercept))

    def _fit_sites(self, X, y, groups) -> list[tuple[np.ndarray, np.ndarray]]:
        """The sites' ``(X_k, y_k)`` (user features) of any of the three forms; sets ``sites_``."""
        name = type(self).__name__
        if not _is_site_list(X):
            X, groups = split_site_column(self, X, groups)
        if _is_site_list(X):
            if y is not None or groups is not None:
                raise ValueError(f"{name}.fit: give either a list of (X_k, y_k) pairs, one per site, or X, y "
                                 "(with groups= for the site of each row), not both")
            columns = [tuple(str(c) for c in Xk.columns) for Xk, _ in X if hasattr(Xk, "columns")]
            if any(c != columns[0] for c in columns):
                raise ValueError(f"{name}.fit: the sites' DataFrames have different columns; give every site the same "
                                 "columns in the same order")
            sites = check_sites(X)
            self.n_features_in_ = sites[0][0].shape[1]
            if columns:
                self.feature_names_in_ = np.asarray(columns[0], dtype=object)
            elif hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
            self.sites_ = np.arange(len(sites))
            return sites
        if y is None:
            raise ValueError(f"{name} requires y to be passed, but the target y is None: fit(X, y) for one site, fit(X, y, groups=site_labels) for pooled rows "
                             "with a site label, or fit(sites) with a list of (X_k, y_k) pairs, one per site")
        X, y = validate_data(self, X, y, y_numeric=True, ensure_min_samples=2)
        X, y = np.asarray(X, dtype=float), np.asarray(y, dtype=float)
        if groups is None:
            self.sites_ = np.arange(1)
            return [(X, y)]
        labels, site = site_labels(groups, X.shape[0])
        self.sites_ = labels
        return [(X[site == k], y[site == k]) for k in range(labels.size)]

    def _site_name(self, k: int) -> str:
        """Site ``k`` as the user named it (its ``groups`` value, or its index in a list of sites)."""
        return str(self.sites_[k]) if k < len(getattr(self, "sites_", ())) else str(k)

    def _design(self, X: np.ndarray) -> np.ndarray:
        """``X`` (n, d) with the intercept column of ones in front when the design has one."""
        return np.column_stack([np.ones(X.shape[0]), X]) if self._intercept_column() else X

    def _feature_labels(self, n_design: int) -> list[str]:
        """Names of the design's columns: ``(intercept)``, then the feature names (or their indices)."""
        j0 = self._intercept_column()
        names = getattr(self, "feature_names_in_", None)
        features = [str(n) for n in names] if names is not None else [str(j) for j in range(n_design - j0)]
        return [_INTERCEPT] * j0 + features

    def predict(self, X, site: int | None = None, groups=None) -> np.ndarray:
        """Predictions (n,) for the rows of ``X`` (n, d).

        ``site`` (an index into ``sites_``): every row at that site.  ``groups`` (n,): each row at its
        own site, by label; a label not seen in fit gets the population-level prediction.  Neither:
        the one site of a single-site fit, else the population-level prediction
        ``X @ population_coef_ + population_intercept_`` (as statsmodels' MixedLM predicts from the
        fixed effects), which is also what a site left out of the fit should use.
        """
        _check_fitted(self)
        if site is None:
            X, groups = split_site_column(self, X, groups, required=False)
        if site is not None and groups is not None:
            raise ValueError("give site= (one site for every row) or groups= (a site per row), not both")
        X = validate_data(self, X, reset=False)
        X = np.asarray(X, dtype=float)
        if site is not None:
            k = check_site_index(site, self.coef_.shape[0])
            return X @ self.coef_[k] + self.intercept_[k]
        if groups is None:
            if self.coef_.shape[0] == 1 and len(self.sites_) == 1:
                return X @ self.coef_[0] + self.intercept_[0]
            return X @ self.population_coef_ + self.population_intercept_
        index = site_of_rows(self.sites_[: self.coef_.shape[0]], groups, X.shape[0])
        out = X @ self.population_coef_ + self.population_intercept_
        known = index >= 0
        out[known] = np.einsum("nd,nd->n", X[known], self.coef_[index[known]]) + self.intercept_[index[known]]
        return out

    def score(self, X, y, sample_weight=None, groups=None) -> float:
        """:math:`R^2` of :meth:`predict` ``(X, groups=groups)`` against ``y`` (scikit-learn's ``r2_score``)."""
        return float(r2_score(y, self.predict(X, groups=groups), sample_weight=sample_weight))

    def _names_meta(self) -> dict[str, Any]:
        names = getattr(self, "feature_names_in_", None)
        return {"feature_names_in": None if names is None else [str(n) for n in names],
                "sites": [s.item() if hasattr(s, "item") else s for s in self.sites_]}

    def _restore_names(self, meta: dict[str, Any], n_features: int, n_sites: int) -> None:
        self.n_features_in_ = int(n_features)
        if meta.get("feature_names_in") is not None:
            self.feature_names_in_ = np.asarray(meta["feature_names_in"], dtype=object)
        sites = meta.get("sites")
        self.sites_ = np.asarray(sites) if sites is not None and len(sites) == n_sites else np.arange(n_sites)


class FedHM1Regressor(_SiteRegressor):
    """HM1 by Algorithm 1 (spec §2): federated MAP with a learned site covariance :math:`\\Omega`.

    Parameters mirror :class:`~fedhier.protocol.fedlin.HM1Protocol`; in addition ``fit_intercept``
    (a column of ones in front of the design, whose coefficient each site fits under the same
    :math:`\\Omega` as the others), ``n_rounds`` (:math:`C`), ``participation`` (fraction of sites
    per round, spec §9 #7), ``random_state``, ``n_jobs`` and ``site_timeout`` (as :class:`FedHM2Regressor`). ``eta`` (the step size) None, the default:
    chosen from the data as :math:`\\eta=1/(2\\max_k c\\,\\lambda_{\\max}(X_k^\\top X_k))` (``c = 1``, or
    :math:`1/n_k` with ``gradient="mean"``), half the largest step on which every site's full-batch local steps
    converge (each site computes its own eigenvalue; the fitted step is ``eta_``). HM1 gives a point estimate only: no
    intervals and no new-site adaptation (spec §2.3). It runs its ``n_rounds`` rounds (no stopping
    rule, hence no convergence warning).

    Attributes
    ----------
    coef_ : ndarray, shape (K, d)
        :math:`\\Theta^{(C)\\top}` without the intercept, one row per site.
    intercept_ : ndarray, shape (K,)
        The sites' intercepts (0 when ``fit_intercept=False``).
    population_coef_, population_intercept_ : ndarray (d,), float
        Averages over the sites: HM1 has no population mean, this is the prediction of
        :meth:`predict` for a site it has not seen.
    sites_ : ndarray, shape (K,)
        Site labels (``groups`` values, or ``0..K-1``).
    omega_ : ndarray, shape (K, K)
    history_ : list of dict
        Per-round records of the runtime (sites, bytes, ...), plus ``theta`` snapshots when
        ``record_theta=True``.
    """

    def __init__(
        self,
        *,
        fit_intercept: bool = True,
        n_rounds: int = 30,
        n_local_steps: int = 20,
        eta: float | None = None,
        alpha: float = 0.1,
        omega_rule: str = "paper",
        batch_size: int | None = None,
        gradient: str = "sum",
        shrink_scale: float = 1.0,
        init: str = "zeros",
        oracle_omega: np.ndarray | None = None,
        jitter: bool = False,
        participation: float | None = None,
        record_theta: bool = False,
        random_state: int | None = None,
        n_jobs: int = 1,
        site_timeout: float | None = None,
        site_column: str | None = None,
    ):
        self.fit_intercept = fit_intercept
        self.site_timeout = site_timeout
        self.n_rounds, self.n_local_steps, self.eta, self.alpha = n_rounds, n_local_steps, eta, alpha
        self.omega_rule, self.batch_size, self.gradient, self.shrink_scale = omega_rule, batch_size, gradient, shrink_scale
        self.init, self.oracle_omega, self.jitter, self.participation = init, oracle_omega, jitter, participation
        self.record_theta, self.random_state, self.n_jobs = record_theta, random_state, n_jobs
        self.site_column = site_column

    def _params(self) -> dict[str, Any]:
        keys = ["fit_intercept", "n_rounds", "n_local_steps", "eta", "alpha", "omega_rule", "batch_size", "gradient", "shrink_scale", "init", "jitter", "participation", "record_theta", "random_state", "n_jobs", "site_timeout"]
        return {k: getattr(self, k) for k in keys}

    def fit(self, X, y=None, groups=None) -> "FedHM1Regressor":
        """Run Algorithm 1 for ``n_rounds`` rounds.

        ``X``: a list of ``(X_k (n_k, d), y_k (n_k,))``, one per site (then no ``y``); or the pooled
        ``X (n, d)``, ``y (n,)`` with ``groups (n,)`` the site of each row; or ``X, y`` of one site.
        """
        sites = [(self._design(Xk), yk) for Xk, yk in self._fit_sites(X, y, groups)]
        K, d = len(sites), sites[0][0].shape[1]
        self.eta_ = float(self.eta) if self.eta is not None else self._stable_eta(sites)
        protocol = self.protocol(K, d, eta=self.eta_)
        snapshots: list[np.ndarray] = []
        callbacks = [lambda rec, b: snapshots.append(b["theta"].T.copy())] if self.record_theta else []
        result = simulate(
            protocol, sites, n_rounds=int(self.n_rounds), random_state=self.random_state, n_jobs=self.n_jobs,
            site_timeout=self.site_timeout, participation=_participation(self.participation), callbacks=callbacks,
        )
        self._adopt(result.broadcast, result.history, n_sites=K, n_features=d)
        self.theta_path_ = np.array(snapshots) if self.record_theta else None
        return self

    def _stable_eta(self, sites) -> float:
        """Half the largest step size on which every site's full-batch local steps converge (see the class docstring)."""
        def largest(X: np.ndarray) -> float:  # computed at the site
            c = 1.0 / X.shape[0] if self.gradient == "mean" else 1.0
            return c * float(np.linalg.eigvalsh(X.T @ X)[-1])

        top = max(largest(X) for X, _ in sites)
        return 0.5 / top if top > 0 else 1.0

    def protocol(self, n_sites: int, n_features: int, eta: float | None = None) -> HM1Protocol:
        """The round protocol of a fit to ``n_sites`` sites of ``n_features`` design columns (the intercept
        column included when ``fit_intercept``; every runtime builds it here).  ``eta``: the step size,
        default the constructor's, which a deployment must then give."""
        eta = self.eta if eta is None else eta
        if eta is None:
            raise ValueError("eta is needed: with eta=None the fit chooses it from the data, which a deployment's "
                             "coordinator does not see; set eta")
        return HM1Protocol(
            n_sites, n_features, eta=eta, n_local_steps=self.n_local_steps, alpha=self.alpha, omega_rule=self.omega_rule,
            batch_size=self.batch_size, gradient=self.gradient, shrink_scale=self.shrink_scale, init=self.init,
            oracle_omega=self.oracle_omega, jitter=self.jitter, random_state=self.random_state,
        )

    @classmethod
    def from_broadcast(cls, broadcast, history, *, n_sites: int, n_features: int, **params: Any) -> "FedHM1Regressor":
        """A fitted estimator from the final broadcast of an HM1 run on any runtime (e.g. over Flower).

        ``history``: the runtime's round records; ``n_features``: the design's columns (the intercept
        column included when ``params`` has ``fit_intercept``); ``params``: the constructor's parameters
        of that run.
        """
        model = cls(**params)
        model.sites_ = np.arange(int(n_sites))
        model._adopt(broadcast, history, n_sites=n_sites, n_features=n_features)
        model.eta_ = model.eta
        model.theta_path_ = None
        return model

    def _adopt(self, broadcast, history, *, n_sites: int, n_features: int) -> None:
        self._set_theta(np.asarray(broadcast["theta"], dtype=float).T.copy())
        self.omega_ = np.asarray(broadcast["omega"], dtype=float).copy()
        self.history_ = [rec.to_dict() for rec in history]
        self.n_sites_, self.n_features_ = int(n_sites), int(n_features)
        self.n_features_in_ = self.n_features_ - self._intercept_column()

    def _set_theta(self, theta: np.ndarray) -> None:
        """Split :math:`\\Theta^\\top` (K, design columns) into ``intercept_`` and ``coef_``."""
        self.design_coef_ = theta
        j0 = self._intercept_column()
        self.coef_ = theta[:, j0:]
        self.intercept_ = theta[:, 0].copy() if j0 else np.zeros(theta.shape[0])
        self.population_coef_ = self.coef_.mean(axis=0)
        self.population_intercept_ = float(self.intercept_.mean())

    def save(self, path) -> Path:
        """Save to ``path`` (a ``.npz`` of plain arrays plus a JSON header; no pickle)."""
        _check_fitted(self)
        params = {k: v for k, v in self._params().items()}
        return _save_npz(path, {"coef_": self.design_coef_, "omega_": self.omega_},
                         {"kind": "hm1", "params": params, "eta_": self.eta_, "history": self.history_, **self._names_meta()})


class FedHM2Regressor(_SiteRegressor):
    """HM2 by federated EP (spec §3–5): posterior of :math:`\\phi`, device posteriors, intervals, tests,
    variable selection and new-site adaptation.

    Parameters
    ----------
    fit_intercept : bool
        Fit an intercept per site (default True, as in scikit-learn). With the Gaussian hierarchy it is
        a leading column of ones in the design whose coefficient always varies across sites, as a mixed
        model's random intercept (:math:`\\mu` and :math:`\\tau` get a component ``(intercept)``);
        for a common intercept, pass False and a column of ones yourself with ``random`` False there.
        When ``standardize`` is on (lasso, ridge) every site centres its data instead, which fits each
        site's intercept whatever this says.
    prior : {"gaussian", "lasso", "ridge"}
        :math:`p(\\theta_k\\mid\\phi)`: the Gaussian hierarchy (spec §3.1) or a shrinkage prior (spec §5).
    covariance, random, noise, tau, mu_scale :
        Options of :class:`~fedhier.models.fedlin.hierarchy.GaussianHierarchy` (prior="gaussian");
        ``random`` has one entry per feature (the intercept varies anyway). ``mu_scale`` defaults
        to 10 (a vague prior on the population means, the command line's default too).
    log_tau_prior : (mean, sd)
        Gaussian prior of each :math:`\\log\\tau_j`, the log between-site variance of a coefficient in
        the fit's units (default ``(-1, 1)``). With the default scaling those are standard deviations,
        where the intercept's between-site variance is below the response's, 1: the default puts the
        median between-site sd at :math:`e^{-1/2}=0.61` and 84 % of its mass below a variance of 1
        (``(0, 1)``, the paper's, puts half of it above).
    n_rounds : int
        Largest number of EP rounds :math:`C` (spec §9 #15: 20).
    damping : float
        EP damping :math:`\\delta` (spec §3.4; grid of §9 #12) of a round whose whole step would move
        :math:`q(\\phi)` by more than one posterior standard deviation (or one unit of log variance); a
        smaller step, the rule near convergence, is taken whole
        (:func:`~fedhier.models.fedlin.ep.damped_update`).  ``history_`` records each round's damping.
    tol : float or None
        Early-stop threshold (None: always run ``n_rounds``): EP stops once the last round's change of
        :math:`q(\\phi)`, and the change the rounds to come would add at the last two rounds' rate of
        contraction, are both below ``tol`` posterior standard deviations (means) and log variances
        (:func:`~fedhier.models.fedlin.ep.converged`). A fit that runs all ``n_rounds`` without meeting
        it issues scikit-learn's ``ConvergenceWarning``.
    tilted_method : {"auto", "exact", "quadrature", "importance", "mcmc"}
        See :mod:`fedhier.models.fedlin.tilted`.
    n_draws : int
        Importance-sampling draws per site and round: antithetic pairs of randomised quasi-Monte Carlo
        points (powers of two are best; 1,024 match 2,000 independent draws' accuracy,
        ``benchmarks/tilted_accuracy.py``). In round 1, EP's start under the prior, a site draws a quarter of
        them; in later rounds it first tries a quarter and keeps those when their weights are nearly equal (ESS
        at least 90 % of the count: the tilted law is nearly Gaussian, the usual case after the first rounds).
        The device posteriors reweight the site's last round's draws for its final cavity when their weights
        stay nearly equal, and use all ``n_draws`` new ones otherwise.
    mcmc : dict, optional
        Lasso sampler settings (``n_chains``, ``n_warmup``, ``n_draws``; spec §9 #14 default 4 x (500 + 500)).
    n_posterior_draws : int
        Draws kept per site for intervals and tests.
    level : float
        Credible level of the selection rule (spec §5; 0.9).
    standardize : bool or None
        Centre ``y`` and standardise the columns of ``X`` per site (spec §9 #18); default True for
        lasso/ridge, False for the Gaussian hierarchy. Coefficients are reported on the original scale.
    scale : {"standard", "none"} or None
        "standard": before the fit, divide every column of ``X`` and ``y`` by its standard deviation
        over all the sites' rows, :math:`s_j` and :math:`s_y`, found in one round in which each site
        sends its count, sum and sum of squares per column (:class:`~fedhier.protocol.scaling.ColumnScalingProtocol`;
        a secure sum with ``aggregation="secure"``). Nothing is centred, so the model is the one you
        asked for, in units of standard deviations, where the default priors (``mu_scale``,
        ``log tau ~ N(-1, 1)``, the noise priors) are sensible; every coefficient, interval and
        between-site sd is reported back in your units (:math:`\\theta_j=s_y\\theta^{\\rm sd}_j/s_j`).
        A constant column (e.g. your own column of ones) is left as it is. "none": the data as given.
        None (default): "standard" for the Gaussian hierarchy, unless a prior is given in numbers
        (``tau``, a noise variance), ``standardize`` is on, or ``privacy`` is set (the sums are exact
        statistics, not DP releases; scale by public ranges instead).
    participation : float, optional
        Fraction of sites per round.
    aggregation, aggregator :
        Passed to :func:`~fedhier.runtime.simulate` ("secure" sums the EP deltas securely).
    random_state : int, optional
    n_jobs : int
    site_timeout : float or None
        Deadline of one site step, in seconds: a site that has not answered by then is a failed
        site of that round, and the round goes on with the others (``simulate(site_timeout=...)``;
        the steps then run in worker processes).  None: no deadline, a site that never answers
        holds the fit.
    privacy : RecordDP, optional
        Record-level differential privacy (:class:`fedhier.privacy.analyze_gauss.RecordDP`): each
        site releases its noisy sufficient statistics once and EP runs on them (post-processing,
        :mod:`fedhier.record_dp`); ``privacy_ledger_`` and ``privacy_spent_`` account the releases.
        Needs ``standardize=False`` (scale the columns by public ranges instead).

    Attributes
    ----------
    coef_ : ndarray, shape (K, d)
        Posterior means of :math:`\\theta_k` (original scale), without the intercept.
    intercept_ : ndarray, shape (K,)
        Site intercepts: the posterior mean of the intercept coordinate, or from centring when
        ``standardize`` is on (0 when neither).
    coef_draws_ : ndarray, shape (K, n_posterior_draws, d)
    intercept_draws_ : ndarray, shape (K, n_posterior_draws) or None
        Draws of the intercept coordinate (None when the design has none).
    population_coef_, population_intercept_ : ndarray (d,), float
        :math:`E[\\mu]` of the Gaussian hierarchy (its intercept component apart), in your units; for
        lasso and ridge, or a Gaussian fit with ``standardize``, the average of the sites' coefficients.
        :meth:`predict` uses them for a site not seen in fit; :meth:`population_interval` gives intervals.
    between_site_sd_, between_site_intercept_sd_ : ndarray (d,), float, or None
        Gaussian hierarchy: the standard deviation of each coefficient across sites in your units,
        :math:`s_y\\sqrt{\\tau_j}/s_j` with :math:`\\log\\tau_j` at its posterior mean (0 for a coefficient
        that does not vary; the intercept's is 0 without one). ``tau`` is a prior *variance*. None for
        lasso and ridge.
    scale_ : str
        The scaling the fit used ("standard" or "none"); ``x_scale_`` (K, design columns) and
        ``y_scale_`` (K,) hold :math:`s_j` and :math:`s_y` (ones for "none").
    sites_ : ndarray, shape (K,)
        Site labels (``groups`` values, or ``0..K-1``).
    phi_mean_, phi_cov_ : ndarray, shapes (p,), (p, p)
        Moments of :math:`q(\\phi)`; ``phi_names_`` names the components with the feature names
        (``mu[age]``, ``log_tau[(intercept)]``; indices when the features have no names).
    selected_features_ : ndarray of bool, shape (K, d)
        Spec §5: included iff the ``level`` interval excludes 0.
    inclusion_score_ : ndarray, shape (K, d)
        Graded score :math:`\\max\\{\\Pr(\\theta_{kj}>0),\\Pr(\\theta_{kj}<0)\\}` (spec §5).
    history_ : list of dict
        Runtime records per round plus the global mean and marginal variances of :math:`\\phi`.
    n_rounds_ : int
        Rounds actually run (early stop).
    cavity_fallback_ : list of int
        Sites whose final cavity was not positive definite; their posterior used :math:`q(\\phi)`
        (a :class:`FedLinWarning` is issued).
    """

    def __init__(
        self,
        *,
        fit_intercept: bool = True,
        prior: str = "gaussian",
        covariance: str = "diagonal",
        random=None,
        noise="local",
        tau=None,
        mu_scale: float = 10.0,
        log_tau_prior: tuple[float, float] = (-1.0, 1.0),
        n_rounds: int = 20,
        damping: float = 0.5,
        tol: float | None = 0.05,
        tilted_method: str = "auto",
        n_draws: int = 1024,
        mcmc: dict | None = None,
        n_posterior_draws: int = 4000,
        level: float = 0.9,
        standardize: bool | None = None,
        scale: str | None = None,
        participation: float | None = None,
        aggregation: str = "plain",
        aggregator: Any = None,
        random_state: int | None = None,
        n_jobs: int = 1,
        site_timeout: float | None = None,
        privacy: Any = None,
        site_column: str | None = None,
    ):
        self.fit_intercept = fit_intercept
        self.privacy = privacy
        self.prior, self.covariance, self.random, self.noise, self.tau, self.mu_scale = prior, covariance, random, noise, tau, mu_scale
        self.log_tau_prior = log_tau_prior
        self.n_rounds, self.damping, self.tol, self.tilted_method, self.n_draws = n_rounds, damping, tol, tilted_method, n_draws
        self.mcmc, self.n_posterior_draws, self.level, self.standardize = mcmc, n_posterior_draws, level, standardize
        self.scale = scale
        self.participation, self.aggregation, self.aggregator = participation, aggregation, aggregator
        self.random_state, self.n_jobs, self.site_timeout = random_state, n_jobs, site_timeout
        self.site_column = site_column

    # ------------------------------------------------------------------ set-up
    def _params(self) -> dict[str, Any]:
        keys = ["fit_intercept", "prior", "covariance", "noise", "tau", "mu_scale", "log_tau_prior", "n_rounds", "damping", "tol", "tilted_method", "n_draws", "mcmc", "n_posterior_draws", "level", "standardize", "scale", "participation", "aggregation", "random_state", "n_jobs", "site_timeout"]
        out = {k: getattr(self, k) for k in keys}
        out["random"] = None if self.random is None else np.asarray(self.random, dtype=bool).tolist()
        if isinstance(out["tau"], np.ndarray):
            out["tau"] = out["tau"].tolist()
        out["log_tau_prior"] = [float(v) for v in self.log_tau_prior]
        return out

    def _intercept_column(self) -> int:
        return int(bool(self.fit_intercept) and not self._standardizes())

    def _random_design(self, d: int):
        """``random`` over the ``d`` design columns: the intercept column (if any) always varies."""
        if self.random is None:
            return None
        mask = np.asarray(self.random, dtype=bool).reshape(-1)
        j0 = self._intercept_column()
        if mask.shape != (d - j0,):
            raise ValueError(f"random must have one entry per feature ({d - j0},), got shape {np.shape(self.random)}"
                             + ("; the intercept (fit_intercept=True) varies across sites anyway" if j0 else ""))
        return np.concatenate([[True], mask]) if j0 else mask

    def _make_model(self, d: int):
        if self.prior == "gaussian":
            return GaussianHierarchy(d, covariance=self.covariance, random=self._random_design(d), noise=self.noise,
                                     tau=self.tau, mu_scale=self.mu_scale, log_tau_prior=self._log_tau_prior())
        if self.prior == "ridge":
            return BayesianRidge(d)
        if self.prior == "lasso":
            return BayesianLasso(d)
        raise ValueError(f"prior must be 'gaussian', 'lasso' or 'ridge', got {self.prior!r}")

    def _log_tau_prior(self) -> tuple[float, float]:
        """``log_tau_prior`` checked: a mean and a positive sd."""
        prior = np.asarray(self.log_tau_prior, dtype=float)
        if prior.shape != (2,) or not np.isfinite(prior).all() or prior[1] <= 0:
            raise ValueError(f"log_tau_prior must be (mean, sd) with a positive sd, got {self.log_tau_prior!r}")
        return float(prior[0]), float(prior[1])

    def _standardizes(self) -> bool:
        return (self.prior != "gaussian") if self.standardize is None else bool(self.standardize)

    def _scaling(self, X: np.ndarray, y: np.ndarray):
        if not self._standardizes():
            return np.zeros(X.shape[1]), np.ones(X.shape[1]), 0.0
        sd = X.std(axis=0)
        return X.mean(axis=0), np.where(sd > 0, sd, 1.0), float(y.mean())

    def _resolved_scale(self) -> str:
        """``scale`` with None resolved (see the class docstring)."""
        if self.scale is not None:
            if self.scale not in ("standard", "none"):
                raise ValueError(f"scale must be 'standard', 'none' or None, got {self.scale!r}")
            if self.scale == "standard" and (self.privacy is not None or self._standardizes()):
                raise ValueError("scale='standard' cannot be combined with " + ("record-level privacy (its sums are exact "
                                 "statistics; scale by public ranges instead)" if self.privacy is not None else "standardize"))
            return self.scale
        numeric_prior = self.covariance == "fixed" or not isinstance(self.noise, str)
        plain = self.prior == "gaussian" and not numeric_prior and not self._standardizes() and self.privacy is None
        return "standard" if plain else "none"

    def _sd_across_sites(self, sites, seed: int) -> tuple[np.ndarray, float]:
        """``(s_x (d,), s_y)``: each column's standard deviation over all the sites' rows (ddof 0).

        One round of :class:`~fedhier.protocol.scaling.ColumnScalingProtocol`: site k sends
        :math:`n_k`, :math:`\\sum_i x_{ij}` and :math:`\\sum_i x_{ij}^2` per column of ``[X_k, y_k]``,
        summed (securely with ``aggregation="secure"``); :math:`s_j^2=\\sum_kS_{2kj}/N-(\\sum_kS_{1kj}/N)^2`.
        A constant column gets 1.
        """
        from ..protocol.scaling import ColumnScalingProtocol

        d = sites[0][0].shape[1]
        aggregator = None
        if self.aggregation == "secure":  # a summation of its own, as the command line's scaling round has
            from ..secure.secure_round import SecureAggregator

            aggregator = SecureAggregator(len(sites))
        with unobserved():  # not one of the fit's rounds
            result = simulate(ColumnScalingProtocol(d + 1, "standard"), [np.column_stack([X, y]) for X, y in sites],
                              n_rounds=1, random_state=seed, aggregation=self.aggregation, aggregator=aggregator)
        scale = np.asarray(result.broadcast["scale"], dtype=float)
        return scale[:-1], float(scale[-1])

    def _units(self) -> tuple[np.ndarray, float]:
        """``(s (design columns,), s_y)``: a standardised coefficient times ``s_y / s`` is in your units."""
        if self.scale_ == "standard" and self.x_scale_.shape[0]:
            return self.x_scale_[0], float(self.y_scale_[0])
        return np.ones(self.n_features_), 1.0

    def _tilted_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"method": self.tilted_method, "n_draws": int(self.n_draws), "n_pilot": int(self.n_draws) // 4}
        if self.mcmc:
            opts["mcmc"] = dict(self.mcmc)
        return opts

    def _check_response_scale(self, sites) -> None:
        """Warn, per site, when ``y`` varies far beyond the noise prior's unit scale (Gaussian hierarchy).

        The default priors (``mu ~ N(0, mu_scale^2)``, ``log tau ~ N(-1, 1)``, ``log sigma_k ~ N(0, 1.5^2)``
        or ``log sigma^2 ~ N(0, 1)``) assume a response on a unit scale.  When a site's standard deviation
        of ``y`` exceeds the noise prior's upper 3-sd point (90 with local noise), EP can stall at the prior
        and shrink every coefficient towards 0 (``python examples/fedlin_scale.py``); a site whose mean of ``y`` is
        beyond 3 ``mu_scale`` puts the population intercept out of the prior's reach.  Each site checks
        its own ``y``; nothing but the warning leaves it.
        """
        model = self.model_
        if self.prior != "gaussian" or not isinstance(model.noise, str):
            return
        if model.noise == "local":
            m, sd = model.log_sigma_local_prior
            bound = float(np.exp(m + 3.0 * sd))
        else:
            m, sd = model.log_sigma2_prior
            bound = float(np.exp(0.5 * (m + 3.0 * sd)))
        for k, (_, y) in enumerate(sites):
            spread = float(np.std(y))
            if spread > bound:
                warnings.warn(
                    f"site {self._site_name(k)}: y has standard deviation {spread:.3g}, beyond {bound:.3g}, the upper 3-sd point of the "
                    "noise prior; the default priors assume a response on a unit scale, and the fit may shrink every "
                    "coefficient towards 0. Divide y by a constant (the coefficients scale with it) or set the priors.",
                    FedLinWarning, stacklevel=3,
                )
        # the population coefficients' prior N(0, mu_scale^2): a response centred far from 0 puts the population
        # intercept out of the prior's reach; it is shrunk towards 0 and the between-site spread absorbs the rest
        far = [(k, float(np.mean(y))) for k, (_, y) in enumerate(sites) if abs(np.mean(y)) > 3.0 * float(self.mu_scale)]
        if far:
            k, centre = far[0]
            more = f" (and {len(far) - 1} more site(s))" if len(far) > 1 else ""
            warnings.warn(
                f"site {self._site_name(k)}{more}: y has mean {centre:.3g}, beyond 3 mu_scale = {3.0 * float(self.mu_scale):.3g} of the "
                "prior of the population coefficients; the population intercept is then shrunk towards 0 and the "
                "between-site spread inflated. Centre and scale y (on the command line: scale = \"standard\") or "
                "raise mu_scale.",
                FedLinWarning, stacklevel=3,
            )

    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None, groups=None) -> "FedHM2Regressor":
        """Run federated EP (Algorithm 3) over the sites and compute every site's posterior.

        ``X``: a list of ``(X_k (n_k, d), y_k (n_k,))``, one per site (then no ``y``); or the pooled
        ``X (n, d)``, ``y (n,)`` with ``groups (n,)`` the site of each row; or ``X, y`` of one site.
        """
        user_sites = self._fit_sites(X, y, groups)
        self.scale_ = self._resolved_scale()
        seed = int(np.random.SeedSequence().entropy % (2**63)) if self.random_state is None else int(self.random_state)
        if self.scale_ == "standard":
            s_x, s_y = self._sd_across_sites(user_sites, seed)
            user_sites = [(Xk / s_x, yk / s_y) for Xk, yk in user_sites]
        sites = [(self._design(Xk), yk) for Xk, yk in user_sites]
        K, d = len(sites), sites[0][0].shape[1]
        protocol = self.protocol(d)
        self.n_sites_ = K
        self._check_response_scale(sites)
        if self.privacy is None:
            stats, scalings = zip(*(self.site_stats(X, y, site=k) for k, (X, y) in enumerate(sites)))
            stats = list(stats)
        else:  # one release per site; everything below is post-processing of the released statistics
            if self._standardizes():
                raise ValueError("record-level DP needs standardize=False: scale the columns by public ranges instead")
            from ..record_dp import release_fedlin_stats

            scalings = [self._scaling(X, y) for X, y in sites]
            stats, self.privacy_ledger_ = release_fedlin_stats(sites, self.privacy, random_state=self.random_state)
            self.privacy_spent_ = self.privacy_ledger_.spent(self.privacy.delta)
        track, history = self.tracker(protocol)
        result = simulate(
            protocol, stats, n_rounds=int(self.n_rounds), random_state=seed, n_jobs=self.n_jobs, site_timeout=self.site_timeout,
            participation=_participation(self.participation), aggregation=self.aggregation,
            aggregator=self.aggregator, stop=track,
        )
        broadcast, states, rounds_run = result.broadcast, result.site_states, len(result.history)
        self._adopt(broadcast, history, rounds_run, seed)
        # device posteriors (spec §4.1), computed on each site from its cavity
        draws = []
        self.cavity_fallback_: list[int] = []
        for k in range(K):
            rng = site_rng(seed, rounds_run + 1, k)
            if "r_k" in states[k]:
                r_k, Q_k = settle_site_factor(states[k], broadcast)
            else:
                r_k, Q_k = np.zeros(self.model_.p), np.zeros((self.model_.p, self.model_.p))
            cav = cavity(self.r_, self.Q_, r_k, Q_k)
            if cav is None:
                warnings.warn(
                    f"site {self._site_name(k)}: the final cavity is not positive definite; its posterior uses q(phi) instead "
                    "(its own data then count twice); try more rounds or a smaller damping",
                    FedLinWarning, stacklevel=2,
                )
                self.cavity_fallback_.append(k)
                cav = (self.r_, self.Q_)
            draws.append(self._posterior_draws(stats[k], cav, rng, states[k], where=f"site {self._site_name(k)}"))
        self.x_mean_ = np.array([xm for xm, _, _ in scalings])
        self.x_scale_ = np.array([xs for _, xs, _ in scalings])
        self.y_mean_ = np.array([ym for _, _, ym in scalings])
        self.y_scale_ = np.ones(K)
        if self.scale_ == "standard":  # the per-site scalings are the identity here
            self.x_scale_ = np.tile(np.concatenate([np.ones(d - s_x.size), s_x]), (K, 1))
            self.y_scale_ = np.full(K, s_y)
        self._set_draws(np.stack(draws))
        if self.tol is not None and not history[-1]["converged"]:
            warnings.warn(f"EP ran all n_rounds={self.n_rounds} rounds without meeting its stopping rule (tol={self.tol}); "
                          "raise n_rounds, or lower damping if the history oscillates", ConvergenceWarning, stacklevel=2)
        return self

    def protocol(self, n_features: int) -> EPProtocol:
        """The EP round protocol of a fit with ``n_features`` design columns (the intercept column included when
        the design has one; every runtime builds it here); sets ``model_``.

        Checks the options first (``tilted_method``, ``n_posterior_draws``, ``prior``).
        """
        if self.tilted_method not in TILTED_METHODS:
            raise ValueError(f"tilted_method must be one of {TILTED_METHODS}, got {self.tilted_method!r}")
        if isinstance(self.n_posterior_draws, bool) or int(self.n_posterior_draws) != self.n_posterior_draws or self.n_posterior_draws < 2:
            raise ValueError(f"n_posterior_draws must be an integer >= 2 (intervals and tests are taken from the draws), "
                             f"got {self.n_posterior_draws!r}")
        self.model_ = self._make_model(int(n_features))
        self.n_features_ = int(n_features)
        return EPProtocol(self.model_, max_rounds=int(self.n_rounds), damping=self.damping, tilted_options=self._tilted_options())

    def site_stats(self, X: np.ndarray, y: np.ndarray, site: int | str = 0) -> tuple[SiteStats, tuple[np.ndarray, np.ndarray, float]]:
        """A site's EP data, computed where the data are: its sufficient statistics after its own centring and
        scaling (``standardize``), and that scaling ``(x_mean (d,), x_scale (d,), y_mean)``."""
        xm, xs, ym = self._scaling(X, y)
        return SiteStats.from_data((X - xm) / xs, y - ym, site=site), (xm, xs, ym)

    def tracker(self, protocol: EPProtocol):
        """``(stop, history)``: the runtime's ``stop(record, broadcast)`` callable, which records the moments of
        :math:`q(\\phi)` after each round into the list ``history`` and applies the stopping rule (:func:`~fedhier.models.fedlin.ep.converged`)."""
        m, S = to_moments(*(protocol.initial_broadcast()[k] for k in ("r", "Q")))
        means, variances, history = [m], [np.diag(S)], []

        def track(record, broadcast) -> bool:
            m, S = to_moments(broadcast["r"], broadcast["Q"])
            means.append(m)
            variances.append(np.diag(S))
            row = record.to_dict()
            row.update(damping=float(broadcast["damping_log"][record.round - 1]), phi_mean=m.tolist(), phi_var=np.diag(S).tolist())
            row["converged"] = bool(self.tol is not None and converged(means, variances, tol=self.tol))
            history.append(row)
            return row["converged"]

        return track, history

    def _adopt(self, broadcast, history: list, rounds_run: int, seed: int) -> None:
        self.history_, self.n_rounds_, self.seed_ = history, int(rounds_run), int(seed)
        self.r_, self.Q_ = np.asarray(broadcast["r"], float).copy(), np.asarray(broadcast["Q"], float).copy()
        self.phi_mean_, self.phi_cov_ = to_moments(self.r_, self.Q_)
        self.phi_names_ = self._named(self.model_.phi_names)

    def _named(self, phi_names: Sequence[str]) -> list[str]:
        return name_components(phi_names, self._feature_labels(self.n_features_))

    @classmethod
    def from_broadcast(cls, broadcast, history: list, *, seed: int, n_sites: int, n_features: int, **params: Any) -> "FedHM2Regressor":
        """The population part of a fit from the final broadcast of an EP run on any runtime (e.g. over Flower).

        Holds :math:`q(\\phi)` (``r_``, ``Q_``, ``phi_mean_``, ``phi_cov_``, :meth:`phi_interval`) and the
        history (``history`` as :meth:`tracker` records it); no site's posterior, which only its own data
        give: a site gets its coefficients with :meth:`adapt` on its own machine.  ``n_sites`` is the number
        of sites of the fit; ``params`` the constructor's parameters of that run.
        """
        model = cls(**params)
        model.protocol(n_features)
        model.n_features_in_ = int(n_features) - model._intercept_column()
        model._adopt(broadcast, history, len(history), seed)
        model.n_sites_ = int(n_sites)
        model.sites_ = np.arange(int(n_sites))
        d = int(n_features)
        model.x_mean_, model.x_scale_, model.y_mean_, model.y_scale_ = np.zeros((0, d)), np.ones((0, d)), np.zeros(0), np.ones(0)
        model.scale_ = "none"  # a deployment scales the columns itself, before the fit
        model.cavity_fallback_ = []
        model._set_draws(np.zeros((0, int(model.n_posterior_draws), d)))
        return model

    def _posterior_draws(self, stats: SiteStats, cav, rng, state=None, where: str = "site") -> np.ndarray:
        """A site's posterior draws of its coefficients under its cavity ``cav`` (spec §4.1), computed on the site.

        The site's last importance draws of the EP rounds (``state``) are reweighted for the cavity when their
        weights stay nearly equal (ESS at least :data:`~fedhier.models.fedlin.tilted.NEAR_GAUSSIAN` of their
        count, the rule by which a round keeps its pilot draws); otherwise the tilted moments are computed
        afresh with all ``n_draws``."""
        tilted = None
        if self.model_.closed_form and state is not None and "tilted_points" in state:
            points = state["tilted_points"]
            try:
                tilted = reweight(self.model_, points, state["tilted_log_ratio"], cav[0], cav[1],
                                  min_ess=NEAR_GAUSSIAN * points.shape[0])
            except TiltedFailure:
                tilted = None
        if tilted is None:
            tilted = self._fresh_tilted(stats, cav, rng, state, where)
        post = device_posterior(self.model_, stats, tilted, rng, n_draws=int(self.n_posterior_draws))
        draws = post.draws
        n = int(self.n_posterior_draws)
        if draws.shape[0] != n:  # MCMC draws: resample to the common count
            draws = draws[rng.choice(draws.shape[0], size=n, replace=draws.shape[0] < n)]
        return draws

    def _fresh_tilted(self, stats: SiteStats, cav, rng, state, where: str):
        options = self._tilted_options()
        del options["n_pilot"]  # all n_draws: the device posterior is a mixture over the points
        if not self.model_.closed_form and state is not None and "chain_phi" in state:
            options["init"] = {"phi": state["chain_phi"], "theta": state["chain_theta"]}
        elif self.model_.closed_form and state is not None:
            options["start"] = laplace_start(state)  # where the site's last search in the rounds ended
        try:
            return tilted_moments(self.model_, stats, cav[0], cav[1], rng, **options)
        except TiltedFailure as exc:
            warnings.warn(f"{where}: {exc}; retrying with ten times the draws and no ESS threshold", FedLinWarning, stacklevel=4)
            options.update(n_draws=10 * int(self.n_draws), min_ess=0.0)
            return tilted_moments(self.model_, stats, cav[0], cav[1], rng, **options)

    def _set_draws(self, std_draws: np.ndarray) -> None:
        """Store draws (K, n_posterior_draws, design columns) in your units: :math:`\\theta_j=s_y\\theta^{\\rm std}_j/s_j`,
        intercept :math:`\\bar y-\\bar x^\\top\\theta` plus the intercept coordinate when the design has one;
        the population and between-site parts from :math:`q(\\phi)` the same way."""
        self.design_draws_ = std_draws * self.y_scale_[:, None, None] / self.x_scale_[:, None, :]
        design_coef = self.design_draws_.mean(axis=1)
        j0 = self._intercept_column()
        self.coef_draws_ = self.design_draws_[:, :, j0:]
        self.intercept_draws_ = self.design_draws_[:, :, 0] if j0 else None
        self.coef_ = design_coef[:, j0:]
        self.intercept_ = self.y_mean_ - np.einsum("kd,kd->k", self.x_mean_, design_coef) + (design_coef[:, 0] if j0 else 0.0)
        self.between_site_sd_, self.between_site_intercept_sd_ = None, None
        if self.prior == "gaussian":
            sd = self._units()[1] * np.sqrt(self._tau()) / self._units()[0]
            self.between_site_sd_, self.between_site_intercept_sd_ = sd[j0:], float(sd[0]) if j0 else 0.0
        if self.prior == "gaussian" and not self._standardizes():
            mu = self.phi_mean_[: self.n_features_] * self._units()[1] / self._units()[0]
            self.population_coef_, self.population_intercept_ = mu[j0:].copy(), float(mu[0]) if j0 else 0.0
        elif self.coef_.shape[0]:
            self.population_coef_, self.population_intercept_ = self.coef_.mean(axis=0), float(self.intercept_.mean())
        else:
            self.population_coef_, self.population_intercept_ = np.zeros(self.coef_.shape[1]), 0.0
        # (n_posterior_draws, K, d), every site's intervals at once, with each coefficient's draws adjacent in
        # memory: the quantiles and counts along them run several times faster than along a strided axis
        by_draw = np.moveaxis(np.ascontiguousarray(np.moveaxis(self.coef_draws_, 1, -1)), -1, 0)
        self.selected_features_ = np.asarray(select_features(by_draw, self.level), dtype=bool)
        self.inclusion_score_ = np.asarray(inclusion_score(by_draw), dtype=float)

    def _tau(self) -> np.ndarray:
        """:math:`\\tau` (design columns,), the prior variances across sites in standardised units, with
        :math:`\\log\\tau` at its posterior mean (0 for a coordinate that does not vary)."""
        model, tau = self.model_, np.zeros(self.n_features_)
        if model.covariance == "diagonal":
            tau[model.random] = np.exp(self.phi_mean_[model.d : model.d + model.n_tau])
        elif model.covariance == "isotropic" and model.n_tau:
            tau[model.random] = np.exp(self.phi_mean_[model.d])
        elif model.covariance == "fixed":
            tau[model.random] = model.tau
        return tau

    # ------------------------------------------------------------------ products
    def population_interval(self, level: float = 0.9) -> tuple[np.ndarray, np.ndarray | None]:
        """Gaussian intervals of the population coefficients :math:`\\mu` in your units (Gaussian hierarchy).

        Returns ``(coef (d, 2), intercept (2,) or None)``: :math:`s_y\\mu_j/s_j` at the ``level``
        interval of :math:`q(\\phi)`; the intercept's is None when the design has none.
        """
        _check_fitted(self)
        if self.prior != "gaussian" or self._standardizes():
            raise ValueError("population intervals come from the Gaussian hierarchy's mu; this fit has "
                             f"prior={self.prior!r}" + (" with standardize on" if self.prior == "gaussian" else ""))
        s, s_y = self._units()
        d = self.n_features_
        ci = gaussian_interval(self.phi_mean_[:d], np.diag(self.phi_cov_)[:d], level) * (s_y / s)[:, None]
        j0 = self._intercept_column()
        return ci[j0:], (ci[0] if j0 else None)

    def coef_interval(self, level: float = 0.9) -> np.ndarray:
        """Equal-tailed credible intervals of every :math:`\\theta_{kj}` (spec §4.2), shape (K, d, 2)."""
        _check_fitted(self)
        return np.stack([credible_interval(dr, level) for dr in self.coef_draws_])

    def coef_test(self, value: float | np.ndarray = 0.0, level: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """Test :math:`H_0:\\theta_{kj}=c` (spec §4.2): (reject (K, d) bool, posterior tail probability (K, d)).

        ``value``: c, a number or one per feature (d,).
        """
        _check_fitted(self)
        if np.ndim(value) > 1 or np.size(value) not in (1, self.n_features_in_):
            raise ValueError(f"value must be a number or one per feature ({self.n_features_in_},), got shape {np.shape(value)}")
        reject = np.stack([reject_null(dr, value, level) for dr in self.coef_draws_])
        tail = np.stack([tail_probability(dr, value) for dr in self.coef_draws_])
        return reject, tail

    def phi_interval(self, level: float = 0.9, natural_scale: bool = False) -> np.ndarray:
        """Gaussian intervals of :math:`\\phi` (spec §4.2), shape (p, 2); ``natural_scale`` exponentiates log-components."""
        _check_fitted(self)
        ci = gaussian_interval(self.phi_mean_, np.diag(self.phi_cov_), level)
        if natural_scale:
            logs = np.array([n.startswith("log_") for n in self.phi_names_])
            ci[logs] = np.exp(ci[logs])
        return ci

    def adapt(self, X_new, y_new, label=None) -> int:
        """Posterior of a new site from its data and :math:`q(\\phi)` only (spec §4.3, full Bayesian version).

        The new site is appended (its index is returned; ``label`` is its entry in ``sites_``, default
        the index) so that :meth:`predict`, :meth:`coef_interval` and :attr:`selected_features_` cover it.
        """
        _check_fitted(self)
        X, y = check_site(X_new, y_new, site="new", n_features=self.n_features_in_)
        X = self._design(X)
        s, s_y = self._units()
        X, y = X / s, y / s_y  # the fit's scaling across sites (ones for scale "none")
        xm, xs, ym = self._scaling(X, y)
        stats = SiteStats.from_data((X - xm) / xs, y - ym, site="new")
        k = self.coef_draws_.shape[0]
        rng = site_rng(self.seed_, self.n_rounds_ + 1, k)
        std = self._posterior_draws(stats, (self.r_, self.Q_), rng, where="new site")
        previous = self.design_draws_ * self.x_scale_[:, None, :] / self.y_scale_[:, None, None]
        self.x_mean_ = np.vstack([self.x_mean_, xm * s])
        self.x_scale_ = np.vstack([self.x_scale_, xs * s])
        self.y_mean_ = np.append(self.y_mean_, ym * s_y)
        self.y_scale_ = np.append(self.y_scale_, s_y)
        self._set_draws(np.concatenate([previous, std[None]]))
        self.sites_ = np.append(self.sites_[:k], k if label is None else label)
        return k

    # ------------------------------------------------------------------ persistence
    def save(self, path) -> Path:
        """Save to ``path`` (``.npz`` of plain arrays plus a JSON header; no pickle)."""
        _check_fitted(self)
        arrays = {
            "r_": self.r_, "Q_": self.Q_, "coef_draws_": self.design_draws_, "x_mean_": self.x_mean_,
            "x_scale_": self.x_scale_, "y_mean_": self.y_mean_, "y_scale_": self.y_scale_,
        }
        meta = {"kind": "hm2", "params": self._params(), "scale_": self.scale_, "history": self.history_, "n_rounds_": self.n_rounds_, "seed_": self.seed_, "n_sites_": self.n_sites_,
                **self._names_meta()}
        return _save_npz(path, arrays, meta)


def _check_shapes(path, arrays: dict[str, np.ndarray], ndims: dict[str, int]) -> None:
    for name, ndim in ndims.items():
        if name not in arrays or arrays[name].ndim != ndim or arrays[name].dtype.kind != "f":
            raise ValueError(f"{path}: array {name!r} is missing or not a {ndim}-D float array; the file is damaged")


def load(path) -> FedHM1Regressor | FedHM2Regressor:
    """Load a model written by ``save`` (no pickle; refuses other files with a ValueError)."""
    meta, arrays = _read_npz(path)
    params = {"fit_intercept": False, "mu_scale": 1.0, "scale": "none", **meta["params"]}  # the defaults of files written before them
    if meta["kind"] == "hm1":
        params.pop("mu_scale")
        params.pop("scale")
        est = FedHM1Regressor(**params)
        _check_shapes(path, arrays, {"coef_": 2, "omega_": 2})
        est._set_theta(arrays["coef_"])
        est.omega_, est.history_ = arrays["omega_"], meta["history"]
        est.eta_ = meta.get("eta_", est.eta)
        est.n_sites_, est.n_features_ = est.design_coef_.shape
        est._restore_names(meta, est.n_features_ - est._intercept_column(), est.n_sites_)
        if est.omega_.shape != (est.n_sites_, est.n_sites_):
            raise ValueError(f"{path}: array 'omega_' has shape {est.omega_.shape}, expected {(est.n_sites_,) * 2}")
        est.theta_path_ = None
        return est
    if meta["kind"] != "hm2":
        raise ValueError(f"{path}: unknown model kind {meta['kind']!r}")
    est = FedHM2Regressor(**params)
    _check_shapes(path, arrays, {"r_": 1, "Q_": 2, "coef_draws_": 3, "x_mean_": 2, "x_scale_": 2, "y_mean_": 1})
    K, _, d = arrays["coef_draws_"].shape
    for name, shape in (("x_mean_", (K, d)), ("x_scale_", (K, d)), ("y_mean_", (K,))):
        if arrays[name].shape != shape:
            raise ValueError(f"{path}: array {name!r} has shape {arrays[name].shape}, expected {shape}")
    est.n_features_ = arrays["coef_draws_"].shape[2]
    est.model_ = est._make_model(est.n_features_)
    est.r_, est.Q_ = arrays["r_"], arrays["Q_"]
    est.phi_mean_, est.phi_cov_ = to_moments(est.r_, est.Q_)
    est._restore_names(meta, est.n_features_ - est._intercept_column(), K)
    est.phi_names_ = est._named(est.model_.phi_names)
    est.x_mean_, est.x_scale_, est.y_mean_ = arrays["x_mean_"], arrays["x_scale_"], arrays["y_mean_"]
    est.y_scale_ = arrays.get("y_scale_", np.ones(K))
    if est.y_scale_.shape != (K,):
        raise ValueError(f"{path}: array 'y_scale_' has shape {est.y_scale_.shape}, expected {(K,)}")
    est.scale_ = meta.get("scale_", "none")
    est.history_, est.n_rounds_, est.seed_, est.n_sites_ = meta["history"], meta["n_rounds_"], meta["seed_"], meta["n_sites_"]
    est._set_draws(arrays["coef_draws_"] * est.x_scale_[:, None, :] / est.y_scale_[:, None, None])
    return est
