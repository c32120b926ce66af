"""CollabDict and CollabVAE estimators (spec collabdict §2-§11): scikit-learn outlier detectors.

Sites with no coordinator learn a shared dictionary of sparse Gaussian patterns
``{mu_k, Lambda_k}`` while each keeps private mixture weights ``pi^s``; a sample's anomaly
score at site ``s`` is its log loss under ``p^s(x) = sum_k pi_k^s N(x | mu_k, Lambda_k^{-1})``.

>>> model = CollabDict(n_components=5).fit([X_site0, X_site1, X_site2])   # doctest: +SKIP
>>> model = CollabDict(n_components=5).fit(X, groups=df.mote)             # pooled rows, a site label  # doctest: +SKIP
>>> model.anomaly_score(X_new, site=1)     # the paper's score, higher = more anomalous  # doctest: +SKIP

Scores follow scikit-learn's outlier-detector convention (``IsolationForest``, ``EllipticEnvelope``):
``score_samples`` is higher for more normal samples (it is minus the paper's anomaly score, which
:meth:`CollabDict.anomaly_score` gives), ``decision_function`` is negative for outliers (the site's
threshold minus the anomaly score) and ``predict`` returns -1 for an outlier and 1 for an inlier.
The site's threshold is the ``1 - contamination`` quantile of its training anomaly scores
(``thresholds_``; ``offset_ = -thresholds_``).  Every scoring method takes ``site=`` (an index into
``sites_``, every row at that site) or ``groups=`` (the site label of each row); a single-site fit
needs neither.  A site not in the fit has no private weights (or encoder) and is refused.
"""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from sklearn.base import BaseEstimator, OutlierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.validation import check_is_fitted, validate_data

from ..data.validation import check_site_index
from ..privacy.sampling import NoiseSource
from ..runtime.graphs import check_adjacency
from ..protocol.messages import Field, MessageSpec
from ..protocol.collab import (GGMMixtureProtocol, MomentsProtocol, VAEProtocol, check_site_matrix,
                                         check_vae_options, standardise)
from ..models.collabdict.rdp import (dp_event, epsilon_dp, optimal_order, paper_epsilon, precision_norm_bound,
                                    release_pattern_means, tight_epsilon)
from ..models.collabdict.scores import score_expected, score_logloss, variable_scores
from ..utils.io import atomic_write_bytes, json_text
from ..utils.untrusted import check_finite, read_meta_json, read_npz
from ._input import NOT_FITTED, site_labels, site_of_rows, split_site_column

__all__ = ["CollabDict", "CollabVAE"]

_RUNTIMES = ("peer", "star")


def _public_seed(random_state: int | None) -> int:
    """The run's public seed: ``random_state``, or a fresh draw when None."""
    if random_state is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(random_state, bool) or not isinstance(random_state, (int, np.integer)) or random_state < 0:
        raise ValueError(f"random_state must be None or a non-negative integer seed, got {random_state!r}")
    return int(random_state)


def _check_max_iter(max_iter: Any) -> None:
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")


def _write_model(path: str | Path, kind: str, arrays: dict[str, np.ndarray], meta: dict[str, Any],
                 graph: np.ndarray | None) -> Path:
    """One ``.npz`` of declared arrays (and the peer ``graph``, if one was given) plus a JSON ``meta`` entry
    naming ``kind``; no pickle, written atomically."""
    meta = {"kind": kind, **meta}
    if graph is not None:
        arrays = {**arrays, "graph": np.asarray(graph, dtype=float)}
    buf = io.BytesIO()
    np.savez(buf, **arrays, meta=np.frombuffer(json_text(meta).encode(), dtype=np.uint8))
    return atomic_write_bytes(path, buf.getvalue())


def _read_model(path: str | Path, kind: str, required: Sequence[str]) -> tuple[dict[str, np.ndarray], dict[str, Any],
                                                                              np.ndarray | None]:
    """Arrays, meta and peer graph (or None) of a file written by :func:`_write_model`; refuses another kind
    or missing arrays."""
    arrays = read_npz(path)
    if "meta" not in arrays:
        raise ValueError(f"{path}: not a fedhier model file (no meta entry)")
    meta = read_meta_json(arrays, "meta", str(path))
    del arrays["meta"]
    graph = arrays.pop("graph", None)
    check_finite({**arrays, **({} if graph is None else {"graph": graph})}, str(path),
                 nan_means_unknown=("weights_", "thresholds_", "thresholds"))
    found = meta.get("kind", "CollabDict")  # files written before the kind was recorded hold a CollabDict
    if found != kind:
        raise ValueError(f"{path} holds a {found}, not a {kind}; use {found}.load")
    missing = [name for name in required if name not in arrays]
    if missing:
        raise ValueError(f"{path}: arrays {missing} missing; the file is damaged or from another version")
    return arrays, meta, graph


def _names_meta(model: Any) -> dict[str, Any]:
    names = getattr(model, "feature_names_in_", None)
    return {"feature_names_in": None if names is None else [str(n) for n in names],
            "sites": [s.item() if hasattr(s, "item") else s for s in model.sites_]}


def _restore_names(model: Any, meta: dict[str, Any]) -> None:
    if meta.get("feature_names_in") is not None:
        model.feature_names_in_ = np.asarray(meta["feature_names_in"], dtype=object)
    sites = meta.get("sites")
    model.sites_ = np.asarray(sites) if sites is not None and len(sites) == model.n_sites_ else np.arange(model.n_sites_)


def _agreed_resume_point(transport, paths: Sequence[Path], X: np.ndarray, seed: int, n_sites: int):
    """(moments, PeerResult) of this rank at the last round every rank saved (collective).

    ``paths``: this rank's state file and the one of the round before.  Every rank sends the
    latest and earliest round it holds; the ranks resume from the smallest latest round, which
    each must hold.  If one cannot, every rank raises the same ValueError, naming the sites.
    """
    from ..runtime.checkpoint import read_checkpoint
    from ..runtime.peer import PeerResult

    saved, problem = {}, ""
    for path in paths:
        if path.exists():
            try:
                checkpoint = read_checkpoint(path, n_sites=1)
            except ValueError as exc:
                problem = str(exc)
                continue
            if checkpoint.seed != seed:
                problem = f"{path} was saved by a fit with another seed"
            else:
                saved[checkpoint.round] = checkpoint
    spec = MessageSpec("collab-resume", {"latest": Field((), "int64"), "earliest": Field((), "int64")})
    mine = {"latest": 0, "earliest": 0} if problem or not saved else {"latest": max(saved), "earliest": min(saved)}
    rows = transport.all_gather(spec, {transport.rank: mine}, list(range(n_sites)))
    agreed = min(int(r["latest"]) for r in rows)
    missing = [s for s, r in enumerate(rows) if not int(r["earliest"]) <= agreed <= int(r["latest"]) or agreed == 0]
    if missing:
        here = f" (here: {problem or 'no saved state in ' + str(paths[0])})" if transport.rank in missing else ""
        raise ValueError(f"cannot resume: site(s) {missing} hold no saved state of the last round every site "
                         f"completed{here}; fit again without resume")
    checkpoint = saved[agreed]
    moments = MomentsProtocol(X.shape[1]).broadcast_spec.validate(
        {k.split("/", 1)[1]: v for k, v in checkpoint.broadcast.items() if k.startswith("moments/")})
    broadcast = {k: v for k, v in checkpoint.broadcast.items() if not k.startswith("moments/")}
    return moments, PeerResult({transport.rank: broadcast}, checkpoint.history,
                               {transport.rank: checkpoint.site_states[0]}, None, seed)


class _SiteOutlierDetector(OutlierMixin, BaseEstimator):
    """The data forms (module docstring) and the scikit-learn scores, from a per-site ``anomaly_score``.

    Subclasses define ``_site_anomaly(Z, site)`` on standardised rows ``Z`` of one site and set
    ``thresholds_`` (S,) in fit.
    """

    _min_features = 1

    def _fit_sites(self, X: Any, groups: Any) -> list[np.ndarray]:
        """The sites' arrays of any form; sets ``sites_`` (and, for one array, scikit-learn's
        ``n_features_in_`` / ``feature_names_in_``)."""
        name = type(self).__name__
        if isinstance(X, (list, tuple)) and X and all(np.ndim(x) == 2 for x in X):
            if groups is not None:
                raise ValueError(f"{name}.fit: give either a list of arrays, one per site, or one array with groups=, not both")
            self.sites_ = np.arange(len(X))
            for stale in ("feature_names_in_", "n_features_in_"):
                if hasattr(self, stale):
                    delattr(self, stale)
            return [np.asarray(x, dtype=float) for x in X]
        if isinstance(X, (list, tuple)) and X and any(np.ndim(x) == 2 for x in X):
            raise ValueError(f"{name}.fit: pass a list of 2-D arrays, one per site, or one array with groups=")
        X, groups = split_site_column(self, X, groups)
        X = validate_data(self, X, ensure_min_samples=2, ensure_min_features=self._min_features, dtype=np.float64)
        if groups is None:
            self.sites_ = np.arange(1)
            return [X]
        labels, site = site_labels(groups, X.shape[0])
        self.sites_ = labels
        return [X[site == k] for k in range(labels.size)]

    def _rows_sites(self, n: int, site: Any, groups: Any) -> np.ndarray:
        """The site index (into ``sites_``) of each of ``n`` rows."""
        if site is not None and groups is not None:
            raise ValueError("give site= (one site for every row) or groups= (a site per row), not both")
        if site is not None:
            return np.full(n, check_site_index(site, self.n_sites_))
        if groups is not None:
            index = site_of_rows(self.sites_, groups, n)
            if np.any(index < 0):
                unseen = sorted({str(g) for g, k in zip(np.asarray(groups), index) if k < 0})
                raise ValueError(f"groups holds site label(s) {unseen[:5]} not in the fit; a site's scores need its own "
                                 f"{'weights' if isinstance(self, CollabDict) else 'encoder'}, learnt in the fit")
            return index
        if self.n_sites_ == 1:
            return np.zeros(n, dtype=int)
        raise ValueError(f"this {type(self).__name__} has {self.n_sites_} sites, each with its own scores: pass site= "
                         "(an index into sites_) or groups= (each row's site label)")

    def _checked(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "center_", msg=NOT_FITTED)
        return np.asarray(validate_data(self, X, reset=False, dtype=np.float64), dtype=float)

    def _checked_rows(self, X: Any, site: Any, groups: Any) -> tuple[np.ndarray, np.ndarray]:
        """The checked rows of X and each one's site index (from ``site``, ``groups`` or ``site_column``)."""
        if site is None:
            X, groups = split_site_column(self, X, groups, required=False)
        X = self._checked(X)
        return X, self._rows_sites(X.shape[0], site, groups)

    def anomaly_score(self, X, site: int | None = None, groups=None) -> np.ndarray:
        """The paper's anomaly score of each row at its site (higher = more anomalous), shape (n,)."""
        return self._anomaly_at(*self._checked_rows(X, site, groups))

    def score_samples(self, X, site: int | None = None, groups=None) -> np.ndarray:
        """scikit-learn's convention, higher = more normal: minus :meth:`anomaly_score`, shape (n,)."""
        return -self.anomaly_score(X, site=site, groups=groups)

    def decision_function(self, X, site: int | None = None, groups=None) -> np.ndarray:
        """The row's site threshold minus its anomaly score (negative = outlier), shape (n,)."""
        X, index = self._checked_rows(X, site, groups)
        thr = self.thresholds_[index]
        if np.any(np.isnan(thr)):
            raise ValueError("a site's threshold is not held by this process; use anomaly_score and a threshold of your own")
        return thr - self._anomaly_at(X, index)

    def _anomaly_at(self, X: np.ndarray, index: np.ndarray) -> np.ndarray:
        Z = standardise(X, self.center_, self.scale_)
        out = np.empty(X.shape[0])
        for k in np.unique(index):
            rows = index == k
            out[rows] = self._site_anomaly(Z[rows], int(k))
        return out

    def predict(self, X, site: int | None = None, groups=None, threshold: float | None = None) -> np.ndarray:
        """-1 for an outlier (anomaly score above the site's threshold, or ``threshold``), 1 otherwise."""
        X, index = self._checked_rows(X, site, groups)
        thr = self.thresholds_[index] if threshold is None else np.full(X.shape[0], float(threshold))
        if np.any(np.isnan(thr)):
            raise ValueError("a site's training threshold is not held by this process; pass threshold=")
        return np.where(self._anomaly_at(X, index) > thr, -1, 1)

    def fit_predict(self, X, y=None, groups=None) -> np.ndarray:
        """``fit(X, groups=groups).predict(X, groups=groups)``: -1 / 1 for the training rows at their sites."""
        fitted = self.fit(X, groups=groups)
        if isinstance(X, (list, tuple)) and X and all(np.ndim(x) == 2 for x in X):
            return np.concatenate([fitted.predict(x, site=s) for s, x in enumerate(X)])
        return fitted.predict(X, groups=groups)

    @property
    def offset_(self) -> np.ndarray:
        """scikit-learn's offset, per site: ``decision_function = score_samples - offset_[site]``."""
        check_is_fitted(self, "thresholds_", msg=NOT_FITTED)
        return -self.thresholds_


_ARRAYS = ("center_", "scale_", "mu_", "precision_", "sigma_", "n_bar_", "active_", "published_means_",
           "thresholds_", "weights_")


class CollabDict(_SiteOutlierDetector):
    """Decentralised sparse GGM mixture for multi-site anomaly detection (spec §5-§6, §10-§11).

    Parameters
    ----------
    n_components : int
        Initial dictionary size ``K`` (pruned to components with ``Nbar_k >= n_min``).
    rho : float
        l1 strength on the precision matrices (Eq. (8)), on standardised data.
    lambda0 : float
        Prior strength of the pattern means (A3: > 0).
    n_min : float or None
        Pruning threshold ``N_min``; default ``max(M, 0.01 N / K)`` (§5.7).
    weights : {"local", "shared"}
        Private per-site weights (the paper) or one pooled weight vector.
    l0_penalty : float or None
        l0-sparse weights of §5.5 with this ``tau``.
    score_rule : {"expected", "logloss"}
        The anomaly score: Eq. (20) (paper, default) or Eq. (1).  (Not called ``score``, the name of
        scikit-learn's scoring method.)
    aggregation : {"consensus", "chunked", "shamir"}
        How sums are computed without a centre (§3-§4).
    graph : ndarray (S, S) or None
        Peer graph; default a random 4-regular graph drawn from the run's seed (the complete
        graph up to 5 sites) (O2).
    step : {"finite-time", "max-degree", "optimal", "paper"} or float
        Consensus step (O1).  ``"finite-time"``: one step ``1/mu`` per distinct Laplacian
        eigenvalue ``mu`` of the graph, which reaches the average exactly (up to rounding) in
        that many steps, where that is fewer than ``"max-degree"`` takes (graphs up to 200
        sites); else ``"max-degree"``, ``1/(d_max + 1)``.  ``"paper"``: the paper's ``1/S``.
    rel_tol : float
        Consensus tolerance (sets the fixed step count ``T`` of a constant step, §3.4).
    runtime : {"peer", "star"}
        ``"peer"``: serverless in-process simulator (``S > 2``); ``"star"``: exact sums
        through :func:`fedhier.runtime.simulate.simulate` (the centralised reference; also
        fits two sites).  A single site (one array) has no one to talk to and is fitted
        locally whatever this says (a local-only or pooled model).  Use
        :meth:`fit_mpi` under ``mpiexec`` for real processes.
    max_iter, tol : int, float
        Outer iteration cap and convergence tolerance (§5.7).
    glasso_tol : float
        Duality-gap tolerance of the graphical-lasso step (scikit-learn's default 1e-4).
    ell0 : float
        l-diversity threshold (§11).
    diversity_rule : {"min", "max"}
        ``E^s = min_k H_k^s`` [R] or ``max_k`` [P].
    mitigate : bool
        Add posterior-shaped noise to concentrated ``m_k^s`` on a breach (O15).
    clip_norm : float or None
        Clip standardised samples to this norm, enforcing (A1) with ``R = 2 clip_norm``; if
        None, ``R`` is twice the largest standardised training norm (reported, not enforced).
    delta : float
        DP ``delta`` for the ``(epsilon, delta)`` conversion (O16: 1e-5).
    contamination : float
        Expected share of outliers: each site's threshold is the ``1 - contamination`` quantile of
        its training anomaly scores (:meth:`predict`, :meth:`decision_function`).
    random_state : int or None, default None
        The run's public seed: peer graph, relabelling, starts (None: one is drawn, kept in
        ``seed_``).  It seeds no secret: the sites' chunk masks and mitigation noise and the
        published draw of the pattern means come from the operating system's CSPRNG.
    site_timeout : float or None
        Deadline of one site step, in seconds (in-process runtimes; None: no deadline).  The steps
        then run in a worker process; a site that has not answered by then is left out: of that
        round on the star runtime, of the rest of the fit on the peer runtime (as a peer that stops
        answering).  Under MPI the peers' deadline is ``fit_mpi``'s ``timeout``.
    site_column : str or None
        The column of a pandas DataFrame ``X`` that holds each row's site, used as ``groups`` (in fit
        and scoring) and not as a variable; it carries the sites through cross-validation.

    Attributes
    ----------
    mu_ : ndarray (K, M)               MAP pattern means (standardised coordinates)
    precision_ : ndarray (K, M, M)     pattern precision matrices
    active_ : ndarray of bool (K,)     retained components
    weights_ : ndarray (S, K)          per-site mixture weights (private to each site)
    published_means_ : ndarray (K, M)  posterior draws released under §10 (inactive rows zero)
    privacy_spent_ : dict site -> {"epsilon", "delta", "accountant", ...}
    history_ : list of dict            per-round records (consensus exchanges, bytes, l-diversity)
    thresholds_ : ndarray (S,)         default per-site anomaly thresholds (``offset_ = -thresholds_``)
    sites_ : ndarray (S,)              site labels (``groups`` values, or ``0..S-1``)
    resumed_round_ : int               ``fit_mpi(resume=True)`` only: the saved round the fit went on from

    Scores: module docstring (scikit-learn's signs; :meth:`anomaly_score` is the paper's).
    """

    _min_features = 2  # a model of the dependence between variables

    def __init__(self, n_components: int = 7, *, rho: float = 0.8, lambda0: float = 1.0, n_min: float | None = None,
                 weights: str = "local", l0_penalty: float | None = None, score_rule: str = "expected",
                 aggregation: str = "consensus", graph: np.ndarray | None = None, step: str | float = "finite-time",
                 rel_tol: float = 1e-12, n_chunks: int = 3, runtime: str = "peer",
                 max_iter: int = 100,
                 tol: float = 1e-4, glasso_tol: float = 1e-4, ell0: float = 10.0, diversity_rule: str = "min",
                 mitigate: bool = True,
                 clip_norm: float | None = None, delta: float = 1e-5, contamination: float = 0.05,
                 random_state: int | None = None, site_timeout: float | None = None, site_column: str | None = None) -> None:
        self.n_components = n_components
        self.site_timeout = site_timeout
        self.rho = rho
        self.lambda0 = lambda0
        self.n_min = n_min
        self.weights = weights
        self.l0_penalty = l0_penalty
        self.score_rule = score_rule
        self.aggregation = aggregation
        self.graph = graph
        self.step = step
        self.rel_tol = rel_tol
        self.n_chunks = n_chunks
        self.runtime = runtime
        self.max_iter = max_iter
        self.tol = tol
        self.glasso_tol = glasso_tol
        self.ell0 = ell0
        self.diversity_rule = diversity_rule
        self.mitigate = mitigate
        self.clip_norm = clip_norm
        self.delta = delta
        self.contamination = contamination
        self.random_state = random_state
        self.site_column = site_column

    # ------------------------------------------------------------------ helpers
    def _params(self) -> dict[str, Any]:
        keys = ("n_components", "rho", "lambda0", "n_min", "weights", "l0_penalty", "score_rule", "aggregation", "step",
                "rel_tol", "n_chunks", "runtime", "max_iter", "tol", "glasso_tol", "ell0",
                "diversity_rule", "mitigate", "clip_norm", "delta", "contamination", "random_state")
        return {k: getattr(self, k) for k in keys}

    def _check_params(self) -> None:
        if self.score_rule not in ("expected", "logloss"):
            raise ValueError(f"score_rule must be 'expected' or 'logloss', got {self.score_rule!r}")
        if self.runtime not in _RUNTIMES:
            raise ValueError(f"runtime must be one of {_RUNTIMES} (use fit_mpi for MPI), got {self.runtime!r}")
        if int(self.n_components) < 1:
            raise ValueError(f"n_components must be >= 1, got {self.n_components}")
        _check_max_iter(self.max_iter)
        if not 0.0 < self.contamination < 1.0:
            raise ValueError(f"contamination must lie in (0, 1), got {self.contamination}")

    def _aggregation(self):
        from ..runtime.peer import PeerAggregation

        return PeerAggregation(method=self.aggregation, step=self.step, rel_tol=self.rel_tol, n_chunks=self.n_chunks)

    def _ggm_protocol(self, n_features: int, moments: dict[str, np.ndarray]) -> GGMMixtureProtocol:
        n_total = float(moments["n_total"])
        n_min = self.n_min if self.n_min is not None else max(n_features, 0.01 * n_total / self.n_components)
        return GGMMixtureProtocol(n_features, int(self.n_components), moments["center"], moments["scale"],
                                  rho=self.rho, lambda0=self.lambda0, n_min=n_min, weights=self.weights,
                                  l0_penalty=self.l0_penalty, seed=self.seed_, ell0=self.ell0,
                                  diversity_rule=self.diversity_rule, mitigate=self.mitigate,
                                  clip_norm=self.clip_norm, tol=self.tol, glasso_tol=self.glasso_tol)

    def _run(self, protocol, sites, n_rounds, stop):
        """Run a protocol on the in-process runtime chosen by ``runtime`` (a single site: locally, through the
        star runtime); (broadcast, states, history)."""
        if self.runtime == "star" or len(sites) == 1:
            from ..runtime.simulate import simulate

            res = simulate(protocol, sites, n_rounds=n_rounds, random_state=self.seed_,
                           site_timeout=self.site_timeout)
            return res.broadcast, dict(enumerate(res.site_states)), [r.to_dict() for r in res.history]
        from ..runtime.peer import simulate_peers

        res = simulate_peers(protocol, sites, n_rounds=n_rounds, graph=self.graph, aggregation=self._aggregation(),
                             random_state=self.seed_, stop=stop, site_timeout=self.site_timeout)
        return res.broadcast, res.site_states, res.history

    # ------------------------------------------------------------------ fitting
    def fit(self, X, y=None, groups=None) -> "CollabDict":
        """Fit on the sites' private data (in-process runtimes).

        Parameters
        ----------
        X : list of ndarray (N^s, M), or ndarray (N, M)
            A list: site ``s``'s samples, one array per site (more than two sites for the serverless
            runtime, spec §1).  One array: with ``groups`` (N,), the site label of each row; without,
            a single site (fitted locally).
        y : ignored

        Raises
        ------
        ValueError
            Naming the site, on malformed data or two sites on the serverless runtime.
        """
        self._check_params()
        sites = self._fit_sites(X, groups)
        if self.runtime == "peer" and len(sites) == 2:
            raise ValueError("the serverless runtime needs more than 2 sites (the method's setting), got 2; "
                             "runtime='star' fits two sites")
        first = check_site_matrix(0, sites[0])
        sites = [check_site_matrix(s, x, first.shape[1]) for s, x in enumerate(sites)]
        if first.shape[1] < 2:
            raise ValueError("CollabDict models the dependence between variables and needs at least 2 of them, got "
                             "1 feature(s); CollabVAE fits a single variable")
        if self.graph is not None and check_adjacency(self.graph).shape[0] != len(sites):
            raise ValueError(f"graph has {np.shape(self.graph)[0]} vertices but there are {len(sites)} sites")

        self.seed_ = _public_seed(self.random_state)
        moments, _, _ = self._run(MomentsProtocol(first.shape[1]), sites, 1, None)
        protocol = self._ggm_protocol(first.shape[1], moments)
        model, states, history = self._run(protocol, sites, int(self.max_iter), protocol.converged)
        train = {s: protocol.transform(x) for s, x in enumerate(sites) if s in states}  # a lost peer's weights are lost
        self.lost_sites_ = [s for s in range(len(sites)) if s not in states]
        self._finish(protocol, moments, model, states, history, train, n_sites=len(sites))
        if not self.converged_:
            warnings.warn(f"CollabDict ran all max_iter={self.max_iter} iterations without meeting tol={self.tol}; "
                          "raise max_iter", ConvergenceWarning, stacklevel=2)
        return self

    def fit_mpi(self, X: np.ndarray, comm=None, site_seed: int | None = None, *, timeout: float | None = None,
                state_path: str | Path | None = None, resume: bool = False) -> "CollabDict":
        """Fit with this MPI process as site ``rank`` (collective; run under ``mpiexec -n S``).

        ``random_state`` is the run's public seed (every rank knows it; rank 0 draws it when
        None); ``site_seed`` seeds this site's starts for a reproducible test
        (:func:`fedhier.runtime.mpi.run_mpi`).  Its secrets (chunk masks, mitigation noise, the
        published draw of the pattern means) come from the operating system's CSPRNG.
        Only this site's weights, threshold and l-diversity log are known afterwards;
        the other sites' rows of ``weights_``/``thresholds_`` are NaN.

        ``timeout`` (default :data:`fedhier.runtime.mpi.DEFAULT_TIMEOUT`) also bounds MPI's start-up
        (:func:`fedhier.runtime.mpi.world`).  A peer silent for ``timeout`` seconds is lost: the others go on without it
        (``lost_sites_`` lists it) or, if the graph splits, stop with
        :class:`~fedhier.runtime.peer.PeerGraphSplit`.  ``state_path``: this site's model,
        private state, history and the variables' moments are written there after every round
        (:mod:`fedhier.runtime.checkpoint` format), and the round before it to ``<state_path stem>.previous.npz``.

        ``resume``: go on from the saved states of a job that was killed.  A killed job's ranks
        may have saved different rounds, r and r + 1 at most (a rank starts round r + 1 only
        after every rank saved round r); the ranks agree on the last round every one of them
        saved and go on from there, with the same ``site_seed`` giving the uninterrupted fit's result.
        """
        from ..runtime.mpi import DEFAULT_TIMEOUT, MPITransport, run_mpi, world
        from ..runtime.peer import PeerLost

        self._check_params()
        if resume and state_path is None:
            raise ValueError("resume needs the state_path the killed job saved its states to")
        comm = comm if comm is not None else world(DEFAULT_TIMEOUT if timeout is None else timeout)
        rank, n_sites = comm.Get_rank(), comm.Get_size()
        self.sites_ = np.arange(n_sites)
        X = check_site_matrix(rank, X)
        agg = self._aggregation()
        transport = MPITransport(comm, DEFAULT_TIMEOUT if timeout is None else timeout)
        seed = self.seed_ = transport.common_seed(self.random_state)
        paths = [] if state_path is None else [Path(state_path), Path(state_path).with_name(
            f"{Path(state_path).stem}.previous{Path(state_path).suffix}")]
        start = None
        if resume:
            moments, start = _agreed_resume_point(transport, paths, X, seed, n_sites)
            self.resumed_round_ = len(start.history)
        else:
            for path in paths:  # an earlier fit's states must not be taken for this one's
                path.unlink(missing_ok=True)
            moments = run_mpi(MomentsProtocol(X.shape[1]), X, n_rounds=1, graph=self.graph, aggregation=agg,
                              random_state=seed, site_seed=site_seed, transport=transport).broadcast
        protocol = self._ggm_protocol(X.shape[1], moments)

        def save(result) -> None:
            from ..runtime.checkpoint import Checkpoint, write_checkpoint
            from ..utils.io import atomic_write_bytes, remove_stale_temporaries

            history = json.loads(json.dumps(result.history, default=float))
            if paths[0].exists():  # copied, not moved: a rank killed at any moment still holds its last round's state
                atomic_write_bytes(paths[1], paths[0].read_bytes())
                remove_stale_temporaries(paths[1])
            saved = {**result.broadcast, **{f"moments/{k}": v for k, v in moments.items()}}
            write_checkpoint(paths[0], Checkpoint(protocol.name, len(history), seed, saved,
                                                  [result.site_states[rank]], history))

        res = run_mpi(protocol, X, n_rounds=int(self.max_iter), graph=self.graph, aggregation=agg, random_state=seed,
                      site_seed=site_seed, stop=protocol.converged, transport=transport,
                      on_round=save if state_path is not None else None, start=start)
        norm_spec = MessageSpec("collab-norm", {"x": Field((), "float64")})
        local_norm = float(np.linalg.norm(protocol.transform(X), axis=1).max())
        while True:  # a peer lost now is left out of the maximum, as of the rounds after its loss
            try:
                norms = transport.all_gather(norm_spec, {rank: {"x": local_norm}}, transport.alive)
                break
            except PeerLost as exc:
                transport.set_alive(set(transport.alive) - transport.agree_lost(exc.sites).lost)
        self.lost_sites_ = transport.lost
        self._transport = transport
        self._finish(protocol, moments, res.broadcast, res.site_states, res.history, {rank: protocol.transform(X)},
                     n_sites=n_sites, max_norm=max(float(m["x"]) for m in norms))
        return self

    def _finish(self, protocol: GGMMixtureProtocol, moments, model, states, history, train: dict[int, np.ndarray], *,
                n_sites: int, max_norm: float | None = None) -> None:
        k = int(self.n_components)
        self.n_sites_ = n_sites
        if not hasattr(self, "sites_") or len(self.sites_) != n_sites:
            self.sites_ = np.arange(n_sites)
        self.n_features_in_ = protocol.n_features
        self.center_, self.scale_ = np.asarray(moments["center"]), np.asarray(moments["scale"])
        self.n_min_ = protocol.n_min
        self.mu_, self.precision_ = np.asarray(model["mu"]), np.asarray(model["precision"])
        self.sigma_, self.n_bar_ = np.asarray(model["sigma"]), np.asarray(model["n_bar"])
        self.active_ = np.asarray(model["active"], dtype=bool)
        self.weights_ = np.full((n_sites, k), np.nan)
        self.thresholds_ = np.full(n_sites, np.nan)
        for s, state in states.items():
            self.weights_[s] = model["weights"] if self.weights == "shared" else state["weights"]
        self.n_iter_ = len(history)
        self.converged_ = protocol.converged(model)
        log = protocol.diversity_log
        for rec in history:
            rnd = rec["round"]
            rec["diversity"] = {r.site: {"level": r.level, "threshold": r.threshold, "breached": r.breached,
                                         "mitigated": r.mitigated} for r in log if r.round == rnd}
        self.history_ = history
        for s, Z in train.items():
            self.thresholds_[s] = float(np.quantile(self._score_std(Z, s), 1.0 - self.contamination))
        self._release(protocol, train, n_sites, max_norm)

    def _release(self, protocol: GGMMixtureProtocol, train, n_sites: int, max_norm: float | None) -> None:
        """Spec §10 / O16: publish posterior draws of the means and account for them."""
        from ..privacy.ledger import PrivacyLedger

        act = self.active_
        if self.clip_norm is not None:
            self.diameter_, self.diameter_enforced_ = 2.0 * float(self.clip_norm), True
        else:
            norm = max_norm if max_norm is not None else max(
                float(np.linalg.norm(z, axis=1).max()) for z in train.values())
            self.diameter_, self.diameter_enforced_ = 2.0 * norm, False
        n_total = float(self.n_bar_[act].sum())
        self.bound_ = precision_norm_bound(self.sigma_[act], self.n_bar_[act], rho=max(self.rho, 1e-12),
                                           n_min=self.n_min_, n_sites=n_sites,
                                           max_site_size=max(int(round(n_total)), 1))
        self.epsilon_rdp_paper_ = paper_epsilon(int(act.sum()), self.bound_, self.diameter_, self.lambda0)
        self.epsilon_rdp_tight_ = tight_epsilon(self.bound_, self.diameter_, self.lambda0, self.n_min_)
        self.published_means_ = np.zeros_like(self.mu_)
        self.published_means_[act] = release_pattern_means(self.mu_[act], self.precision_[act], self.n_bar_[act],
                                                           lambda0=self.lambda0, rng=NoiseSource())
        ledger = PrivacyLedger()
        event = dp_event(self.epsilon_rdp_tight_)
        for s in train:
            ledger.record(s, max(self.n_iter_, 1), "pattern-means", event)
        try:
            cross = {s: ledger.epsilon(s, self.delta, "pld") for s in train}
            cross_name = "epsilon_pld"
        except (OverflowError, ValueError):  # PLD discretisation overflows for astronomically large epsilon
            cross = {s: ledger.epsilon(s, self.delta, "rdp") for s in train}
            cross_name = "epsilon_rdp_accountant"
        eps = epsilon_dp(self.epsilon_rdp_tight_, self.delta)
        self.privacy_spent_ = {
            int(s): {"epsilon": float(eps), "delta": float(self.delta),
                     "accountant": "rdp (Mironov Prop. 3)",
                     "alpha": float(optimal_order(self.epsilon_rdp_tight_, self.delta)),
                     "epsilon_rdp_tight": float(self.epsilon_rdp_tight_),
                     "epsilon_rdp_paper": float(self.epsilon_rdp_paper_),
                     cross_name: float(cross[s]), "bound_B": float(self.bound_),
                     "diameter_R": float(self.diameter_), "diameter_enforced": bool(self.diameter_enforced_)}
            for s in train}

    # ------------------------------------------------------------------ scoring
    def _check_fitted(self) -> None:
        check_is_fitted(self, "mu_", msg=NOT_FITTED)

    def _site_weights(self, site: int) -> np.ndarray:
        self._check_fitted()
        site = check_site_index(site, self.n_sites_)
        w = self.weights_[site]
        if np.any(np.isnan(w)):
            raise ValueError(f"site {site}: its private weights are not held by this process")
        return np.where(self.active_, w, 0.0)

    def _site_anomaly(self, Z: np.ndarray, site: int) -> np.ndarray:
        """Anomaly score ``a^s(z)`` of standardised rows at ``site`` (Eq. (20) or (1)); shape (n,)."""
        w = self._site_weights(site)
        fn = score_expected if self.score_rule == "expected" else score_logloss
        return fn(Z, self.mu_, self.precision_, w)

    _score_std = _site_anomaly

    def variable_scores(self, X: np.ndarray, site: int | None = None, kind: str = "logloss") -> np.ndarray:
        """Variable-wise scores ``a_i^s(x)`` (spec §6.2) at ``site`` (optional for a single-site fit), shape (n, M)."""
        X = self._checked(X)
        site = int(self._rows_sites(1, site, None)[0])
        Z = standardise(X, self.center_, self.scale_)
        return variable_scores(Z, self.mu_, self.precision_, self._site_weights(site), kind)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write the fitted model to one ``.npz`` (arrays + a JSON ``meta`` entry; no pickle)."""
        self._check_fitted()
        meta = {"params": self._params(), "n_sites": self.n_sites_, "n_features": self.n_features_in_,
                "n_min": self.n_min_, "n_iter": self.n_iter_, "converged": bool(self.converged_),
                "privacy_spent": {str(k): v for k, v in self.privacy_spent_.items()},
                "diameter": self.diameter_, "bound": self.bound_, **_names_meta(self)}
        return _write_model(path, "CollabDict", {name: np.asarray(getattr(self, name)) for name in _ARRAYS}, meta,
                            self.graph)

    @classmethod
    def load(cls, path: str | Path) -> "CollabDict":
        """Read a model written by :meth:`save`."""
        arrays, meta, graph = _read_model(path, "CollabDict", _ARRAYS)
        params = dict(meta["params"])
        if "score" in params:  # files written before the parameter was renamed
            params["score_rule"] = params.pop("score")
        model = cls(**params, graph=graph)
        for name in _ARRAYS:
            setattr(model, name, arrays[name])
        model.active_ = model.active_.astype(bool)
        model.n_sites_, model.n_features_in_ = int(meta["n_sites"]), int(meta["n_features"])
        model.n_min_, model.n_iter_, model.converged_ = meta["n_min"], meta["n_iter"], meta["converged"]
        model.privacy_spent_ = {int(k): v for k, v in meta["privacy_spent"].items()}
        model.diameter_, model.bound_ = meta["diameter"], meta["bound"]
        model.history_ = []
        _restore_names(model, meta)
        return model


class CollabVAE(_SiteOutlierDetector):
    """Multi-task VAE on CollabDict (spec §8): shared decoder, private encoders.

    Parameters
    ----------
    n_latent, width : int
        Latent dimension ``d`` and hidden width ``H``.
    learning_rate : float
        Step ``eta`` on per-sample average gradients (decoder and encoders).
    max_grad_norm : float or None
        Those gradients are scaled to an L2 norm of at most this [R] (default 10); ``None`` is the
        paper's unclipped update, which diverges for most initialisations (see ``VAEProtocol``).
    local_steps : int
        Encoder steps per round.
    max_iter : int
        Rounds (fixed count, O7).
    aggregation, graph, step, rel_tol, n_chunks, runtime, random_state
        As :class:`CollabDict`.
    n_draws : int
        Monte Carlo draws ``J`` of the score (§8.4: ``J >= 32``).
    contamination : float
        As :class:`CollabDict`: each site's threshold is the ``1 - contamination`` quantile of its
        training anomaly scores.

    Attributes
    ----------
    decoder_ : dict of ndarray       the shared decoder ``theta``
    encoders_ : dict site -> dict    each site's private encoder ``phi^s``
    history_ : list of dict          per round, including ``elbo_per_sample``
    thresholds_ : ndarray (S,)       per-site anomaly thresholds (``offset_ = -thresholds_``)
    sites_ : ndarray (S,)            site labels

    Scores: module docstring (scikit-learn's signs; :meth:`anomaly_score` is Eq. (39)).

    Privacy of the shared gradients is not analysed (spec Table 1: "largely open").
    """

    def __init__(self, n_latent: int = 3, *, width: int = 32, learning_rate: float = 0.05,
                 max_grad_norm: float | None = 10.0, local_steps: int = 2, max_iter: int = 200,
                 aggregation: str = "consensus", graph: np.ndarray | None = None, step: str | float = "finite-time",
                 rel_tol: float = 1e-12, n_chunks: int = 3, runtime: str = "peer", n_draws: int = 32,
                 contamination: float = 0.05, random_state: int | None = None, site_column: str | None = None) -> None:
        self.n_latent, self.width, self.learning_rate = n_latent, width, learning_rate
        self.max_grad_norm = max_grad_norm
        self.local_steps, self.max_iter, self.aggregation = local_steps, max_iter, aggregation
        self.graph, self.step, self.rel_tol, self.n_chunks = graph, step, rel_tol, n_chunks
        self.runtime, self.n_draws, self.random_state = runtime, n_draws, random_state
        self.contamination = contamination
        self.site_column = site_column

    def fit(self, X, y=None, groups=None) -> "CollabVAE":
        """Fit on the sites' private data: a list of arrays, one per site, or one array with ``groups`` (the
        site of each row) or without (one site); see :meth:`CollabDict.fit`."""
        from ..models.collabdict.vae import check_n_draws, encoder_shapes

        check_vae_options(self.n_latent, self.width, self.learning_rate, self.local_steps, self.max_grad_norm)
        _check_max_iter(self.max_iter)
        check_n_draws(self.n_draws)
        if not 0.0 < self.contamination < 1.0:
            raise ValueError(f"contamination must lie in (0, 1), got {self.contamination}")
        self.seed_ = _public_seed(self.random_state)
        helper = CollabDict(aggregation=self.aggregation, graph=self.graph, step=self.step, rel_tol=self.rel_tol,
                            n_chunks=self.n_chunks, runtime=self.runtime, random_state=self.seed_)
        helper.seed_ = self.seed_
        sites = self._fit_sites(X, groups)
        n_features = check_site_matrix(0, sites[0]).shape[1]
        sites = [check_site_matrix(s, x, n_features) for s, x in enumerate(sites)]
        if self.runtime == "peer" and len(sites) == 2:
            raise ValueError("the serverless runtime needs more than 2 sites (the method's setting), got 2; runtime='star' fits two sites")
        moments, _, _ = helper._run(MomentsProtocol(n_features), sites, 1, None)
        protocol = VAEProtocol(n_features, moments["center"], moments["scale"], n_latent=self.n_latent,
                               width=self.width, learning_rate=self.learning_rate, local_steps=self.local_steps,
                               max_grad_norm=self.max_grad_norm, seed=self.seed_)
        model, states, history = helper._run(protocol, sites, int(self.max_iter), None)
        self.n_features_in_, self.n_sites_ = n_features, len(sites)
        self.center_, self.scale_ = np.asarray(moments["center"]), np.asarray(moments["scale"])
        self.decoder_ = protocol.decoder(model)
        self.encoders_ = {int(s): {k: state[k] for k in encoder_shapes(n_features, self.n_latent, self.width)}
                          for s, state in states.items()}
        self.history_ = history
        self.n_iter_ = len(history)
        self.thresholds_ = np.full(len(sites), np.nan)
        for s in self.encoders_:
            Z = standardise(sites[s], self.center_, self.scale_)
            self.thresholds_[s] = float(np.quantile(self._site_anomaly(Z, s), 1.0 - self.contamination))
        return self

    def _site_variable_scores(self, Z: np.ndarray, site: int) -> np.ndarray:
        """Variable-wise reconstruction scores (spec §8.4 [R]) of standardised rows at ``site``, shape (n, M)."""
        from ..models.collabdict.vae import reconstruction_scores

        site = check_site_index(site, self.n_sites_)
        if site not in self.encoders_:
            raise ValueError(f"site {site}: its encoder is not held by this process")
        seq = np.random.SeedSequence(self.seed_, spawn_key=(9, site))
        rng = np.random.Generator(np.random.PCG64(seq))
        return reconstruction_scores(Z, self.decoder_, self.encoders_[site], rng, self.n_draws)

    def _site_anomaly(self, Z: np.ndarray, site: int) -> np.ndarray:
        """Eq. (39): Monte Carlo reconstruction log loss of standardised rows at ``site``, shape (n,)."""
        return self._site_variable_scores(Z, site).sum(axis=1)

    def variable_scores(self, X: np.ndarray, site: int | None = None) -> np.ndarray:
        """Variable-wise reconstruction scores (spec §8.4 [R]) at ``site`` (optional for one site), shape (n, M)."""
        X = self._checked(X)
        site = int(self._rows_sites(1, site, None)[0])
        return self._site_variable_scores(standardise(X, self.center_, self.scale_), site)

    # ------------------------------------------------------------------ persistence
    def _params(self) -> dict[str, Any]:
        keys = ("n_latent", "width", "learning_rate", "max_grad_norm", "local_steps", "max_iter", "aggregation",
                "step", "rel_tol", "n_chunks", "runtime", "n_draws", "contamination", "random_state")
        return {k: getattr(self, k) for k in keys}

    def save(self, path: str | Path) -> Path:
        """Write the fitted model to one ``.npz``: ``center``, ``scale``, ``decoder/<name>`` and
        ``encoder/<site>/<name>`` arrays plus a JSON ``meta`` entry (no pickle).

        :meth:`load` gives back a model whose scores are bit-identical (the score draws are seeded
        by the run's public seed ``seed_`` and the site).  ``history_`` is not written.
        """
        check_is_fitted(self, "decoder_", msg=NOT_FITTED)
        arrays = {"center": self.center_, "scale": self.scale_, "thresholds": self.thresholds_}
        arrays.update({f"decoder/{name}": value for name, value in self.decoder_.items()})
        for site, encoder in self.encoders_.items():
            arrays.update({f"encoder/{site}/{name}": value for name, value in encoder.items()})
        meta = {"params": self._params(), "seed": self.seed_, "n_sites": self.n_sites_,
                "n_features": self.n_features_in_, **_names_meta(self)}
        return _write_model(path, "CollabVAE", arrays, meta, self.graph)

    @classmethod
    def load(cls, path: str | Path) -> "CollabVAE":
        """Read a model written by :meth:`save`; every array's shape is checked against the meta."""
        from ..models.collabdict.vae import decoder_shapes, encoder_shapes

        arrays, meta, graph = _read_model(path, "CollabVAE", ())
        model = cls(**meta["params"], graph=graph)
        M, d, H, n_sites = int(meta["n_features"]), int(model.n_latent), int(model.width), int(meta["n_sites"])
        expected = {"center": (M,), "scale": (M,), "thresholds": (n_sites,)}
        if "thresholds" not in arrays:  # files written before the thresholds were
            arrays["thresholds"] = np.full(n_sites, np.nan)
        expected.update({f"decoder/{name}": shape for name, shape in decoder_shapes(M, d, H).items()})
        for site in range(n_sites):
            expected.update({f"encoder/{site}/{name}": shape for name, shape in encoder_shapes(M, d, H).items()})
        if set(arrays) != set(expected):
            raise ValueError(f"{path}: arrays {sorted(set(expected) ^ set(arrays))} missing or unexpected")
        for name, shape in expected.items():
            if arrays[name].shape != shape:
                raise ValueError(f"{path}: {name} has shape {arrays[name].shape}, expected {shape}")
        model.n_features_in_, model.n_sites_ = M, n_sites
        model.center_, model.scale_, model.thresholds_ = arrays["center"], arrays["scale"], arrays["thresholds"]
        model.decoder_ = {name: arrays[f"decoder/{name}"] for name in decoder_shapes(M, d, H)}
        model.encoders_ = {site: {name: arrays[f"encoder/{site}/{name}"] for name in encoder_shapes(M, d, H)}
                           for site in range(n_sites)}
        model.seed_ = int(meta.get("seed", model.random_state or 0))  # files from before seed_ hold it as random_state
        model.history_ = []
        _restore_names(model, meta)
        return model
