"""``FedMVPPCA``: the scikit-learn estimator of Fed-mv-PPCA (spec fed-mv-ppca).

Data: a list of sites, each a mapping ``{view: (n_c, d_view) array or DataFrame}``; or one mapping of
pooled views with ``groups`` (n,), the site of each row; or one mapping, one site; or one array
(n, d), a single view (named ``"X"``) at a single site, which is probabilistic PCA and what
scikit-learn's tools pass.  The estimator validates the sites, builds the round protocol
(:class:`fedhier.protocol.mvppca.MVPPCAProtocol`) and runs it on the in-process
runtime (:func:`fedhier.runtime.simulate`).  Prediction uses the global point model
(mu~, W~, s-bar) of §9.
"""

from __future__ import annotations

import io
import logging
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.utils.validation import check_is_fitted

from ..data.schema import ViewSchema
from ..data.validation import check_feature_names, check_sites, check_views, feature_names
from ..models.mvppca import predictive
from ..models.mvppca._linalg import one_blas_thread
from ..models.mvppca.accelerate import ACCELERATIONS
from ..models.mvppca.waic import waic_site_terms
from ..models.mvppca.params import GlobalParams, GlobalView, point_model
from ..protocol.defaults import MVPPCA_TOL, default_n_components
from ..models.mvppca.rotation import canonical_rotation, rotate
from ..protocol.mvppca import GLOBAL_FIELDS, BroadcastMetrics, DataScaleWarning, MVPPCAProtocol, global_from_message, stopping_rule
from ..runtime.checkpoint import read_checkpoint
from ..runtime.simulate import RoundRecord, simulate
from ..utils.io import atomic_write_bytes, json_text
from ..utils.untrusted import check_finite, read_meta_json, read_npz
from ..privacy.sampling import NOT_PRIVATE
from ._input import ARRAY_VIEW, NOT_FITTED, array_view, split_site_column, view_sites

__all__ = ["FedMVPPCA", "ComponentScores", "NotFittedError", "DataScaleWarning"]  # NotFittedError: scikit-learn's

log = logging.getLogger(__name__)
_FORMAT = "fedhier.FedMVPPCA/1"


def _record_dp(privacy: Any) -> bool:
    """True for record-level DP (:class:`fedhier.privacy.analyze_gauss.RecordDP`): a one-shot release per site."""
    from ..privacy.analyze_gauss import RecordDP

    return isinstance(privacy, RecordDP)


@dataclass(frozen=True)
class ComponentScores:
    """Result of :meth:`FedMVPPCA.score_n_components`.

    Attributes
    ----------
    candidates : list of int
        The latent dimensions scored.
    scores : ndarray (len(candidates),)
        Mean held-out cross-view log-likelihood per subject (higher is better) or WAIC
        (lower is better).
    errors : ndarray (len(candidates),)
        Standard error of each score's difference from the best score (nan for WAIC).
    best : int
        The chosen latent dimension.
    criterion : {"heldout", "waic"}
    """

    candidates: list[int]
    scores: np.ndarray
    errors: np.ndarray
    best: int
    criterion: str


class FedMVPPCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Federated multi-view probabilistic PCA with hierarchical priors.

    Parameters
    ----------
    n_components : int or None, default None
        Latent dimension q.  Views with d_k <= q use d_k - 1 columns (§4.4).  None: 5, or one less
        than the widest view's number of features if that is smaller (``n_components_``).
    n_rounds : int, default 100
        Communication rounds R.
    n_local_iter : int, default 100
        Most MAP-EM iterations per round from round 2 on (I); the site stops earlier once its
        parameters settle (``local_tol``).  The paper runs 15 [P]: on nearly noise-free data
        (SD after min-max scaling) 15 iterations leave part of the prior draw's noise in the
        loadings, which the global model can accumulate round after round (docs/mvppca.md,
        "Heterogeneous sites").
    n_first_iter : int, default 30
        EM iterations in round 1 (I_1).
    random_state : int or None
        Seed of what is not secret: the sites' starts and prior draws, participation.  It
        never seeds the privacy noise, which every site draws from the operating system's
        CSPRNG (docs/privacy.md, "Where secrets come from").
    n_init : int, default 1
        Federated fits from different random starts; the kept one has the highest final
        expected log-likelihood (the sum over sites of Q_c that every round reports, §4.2),
        as scikit-learn's ``GaussianMixture(n_init=...)`` keeps the best lower bound.  The
        fit depends on the start when the sites' data differ (docs/mvppca.md, "Known
        behaviour").  Start 0 uses ``random_state``; start i > 0 the seed
        ``SeedSequence([seed_0, i])``.  Costs n_init times the rounds and messages; not
        combined with ``privacy`` (every start would release the parameters again),
        ``participation`` (the starts' last rounds could hear different sites) or a checkpoint.
    tol : float or None, default 0.02
        Stopping rule [R]: end the fit after the first round in which the predictive
        distribution of a subject (at a new site, the sites' own mu_c, W_c integrated out)
        changed by less than ``tol``, measured as the square root of the symmetrised
        Kullback-Leibler divergence between the two rounds' distributions
        (:func:`fedhier.models.mvppca.model_change`; a move of the mean alone by ``tol``
        standard deviations); ``n_rounds`` is then the cap.  A change of theta~ that does
        not change predictions (a turn of the latent space, a between-site variance creeping
        toward 0 or the inverse-gamma shape toward its cap) does not keep the fit running.
        None runs all ``n_rounds`` rounds, as the paper does; so does a fit with a total privacy
        budget (``DPConfig.total``), whose noise is calibrated for all ``n_rounds`` rounds: an
        early stop would leave budget paid for in noise unspent, while every further round at
        that noise averages more releases into the model.  Every round's change is in
        ``history_`` either way (``metrics["model_change"]``, and the relative change of
        theta~ ``metrics["rel_change"]``); docs/mvppca.md, "Stopping early".
    init : {"pca", "random"}, default "pca"
        Start of every site's round-1 EM: the PCA of the site's own views, scaled to the
        PPCA maximum-likelihood solution of Tipping & Bishop [R] (for one view it *is* that
        solution, so EM starts at the optimum), or the paper's W_ij ~ U(-2, 2),
        sigma2 ~ U(0.1, 0.5) [RC], from which EM needs many iterations.
    local_tol : float or None, default 1e-8
        A site stops its (MAP-)EM of a round once no view's parameters change by more than
        this (relative change of mu, W, sigma2); ``n_first_iter`` / ``n_local_iter`` are
        then caps.  None runs every iteration, as the paper does; with ``init="random"``
        that reproduces the paper's fit.
    ig_solver : {"newton", "fixed_point"}, default "newton"
        Inverse-gamma MLE of §5.2: Newton to convergence [R] or the reference code's
        10-step fixed point [RC].
    sigma2_prior : {"weak", None}, default "weak"
        Weak IG(2.25, 0.625) on sigma2 in round 1 [RC], or plain EM.
    prior_update : {"em", "paper"}, default "em"
        How the master re-estimates the between-site variances sigma2_mu~, sigma2_W~ each
        round.  "em" [R]: the empirical-Bayes (EM) update, which adds each site's posterior
        spread of its mu_c, W_c to the spread of their point estimates, so the variances
        estimate the real differences between sites instead of collapsing (docs/mvppca.md,
        "Between-site variances"); each site then sends two more numbers per view.
        "paper": the paper's update from the point estimates alone (eqs. 14, 18).
    column_variances : bool, default True
        With ``prior_update="em"`` and no privacy: the columns of the loadings that carry
        signal share one between-site variance and each column without signal (when
        ``n_components`` is larger than the data need) has its own (w_ci ~ N(w~_i, sigma2_Wi I)),
        so that those columns do not pull ``sigma2_W`` down; each site then sends two vectors
        of ``n_components`` more per view.  False: one variance shared by all columns
        (docs/mvppca.md, "One variance per column").
    noise_dof : bool, default False
        Each site's noise variance divides its residual by the degrees of freedom the residual
        has, N d_k less one per feature for the mean and the loadings' effective number
        (:func:`fedhier.models.mvppca.mstep.residual_dof`) [R], instead of by N d_k (eq. 21,
        the paper's).  With few subjects per site the paper's divisor underestimates the noise
        (about by the factor (N - 1 - q) / N), which weakens the prior's pull on the sites'
        loadings; the option's effect on the between-site variances is measured in
        docs/mvppca.md, "Recovery on drawn designs".
    loading_uncertainty : bool, default True
        With ``prior_update="em"`` and no privacy: from round 2 on, each site's E-step and noise
        variance take the expectation over the posterior of its loadings, not only over the
        latents (variational Bayes for W_c) [R].  The paper's MAP-EM (False) takes a site's
        loadings as known; where a site has few subjects against its features they are not, and
        the global loadings then drift round after round, one column growing while another
        shrinks (docs/mvppca.md, "The loadings' uncertainty at the sites").
    acceleration : {"squarem", None}, default "squarem"
        Without privacy, the coordinator extrapolates the global means and loadings from every
        two rounds (SQUAREM, :mod:`fedhier.models.mvppca.accelerate`) and keeps an extrapolation
        only when the round from it changes the predictions at most twice as much as the plain
        round before it did; on the demo's splits the fit stops after about a quarter fewer rounds
        at the same test error (docs/mvppca.md, "Fewer rounds").  None broadcasts every master step as it is, as
        the paper does; a fit with privacy always does.
    privacy : privacy configuration or None
        Client-level differential privacy (spec §8), a ``DPConfig``; see :mod:`fedhier.privacy`.
        Or record-level DP, a :class:`fedhier.privacy.analyze_gauss.RecordDP`: each site releases
        its noisy moments once and the fit is post-processing (:mod:`fedhier.record_dp`).
    aggregation : {"plain", "secure"} or SecureAggregator, default "plain"
        "secure": the server only ever sees the sum of masked replies (secure summation
        with dropout recovery, :class:`fedhier.secure.secure_round.SecureAggregator`
        with its defaults); pass an aggregator instance to set the threshold or the
        fixed-point precision.
    n_jobs : int, default 1
        Worker processes for the site steps; results are identical for any value.
    site_timeout : float or None, default None
        Deadline of one site step, in seconds: a site that has not answered by then is a failed
        site of that round, and the round goes on with the others (``simulate(site_timeout=...)``;
        the steps then run in worker processes).  None: no deadline, a site that never answers
        holds the fit.
    participation, min_sites
        Partial participation and the fewest replies a round needs (see
        :func:`fedhier.runtime.simulate`).
    progress : bool, default False
        Show a progress bar over rounds.
    site_column : str or None, default None
        The column of a pandas DataFrame ``X`` (one view) that holds each row's site, used as
        ``groups`` and not as a feature, in ``fit`` and dropped in every other method.  It carries the
        sites through scikit-learn's cross-validation (``GridSearchCV(..., cv=GroupKFold())``), which
        passes ``groups`` to the splitter but not to ``fit`` unless metadata routing is switched on.
    insecure_reproducible_noise : bool, default False
        Insecure switch: derive the sites' privacy noise from ``random_state`` so that a
        fit can be repeated bit for bit (tests, reproductions).  Anyone who knows the seed
        can remove the noise: the result is not private, its privacy report claims no
        epsilon and its saved model says so.

    A fit whose ``tol`` rule has not stopped it after ``n_rounds`` rounds issues scikit-learn's
    ``ConvergenceWarning``; without privacy it advises more rounds, with privacy released per round it
    does not (the noise can keep the model moving, and every round spends budget).

    The latent space of the model is defined up to a rotation (any orthogonal R turns the loadings
    W~ into W~ R and the latents x into R^T x without changing a prediction); a fit returns it in the
    canonical rotation (:mod:`fedhier.models.mvppca.rotation`): the stacked global loadings of the
    views have orthogonal columns ordered by the variance they explain, each column's largest entry
    positive, as PCA's components are.

    Attributes
    ----------
    n_components_ : int
        The latent dimension q of the fit.
    global_params_ : dict
        ``{view: {"mu", "W", "sigma2_mu", "sigma2_W", "alpha", "beta", "noise_var", "var_sigma"}}``.
    history_ : list of dict
        Per round: expected log-likelihood (sum over sites of Q_c), bytes sent per
        site, sites that replied, and in ``metrics`` the number of sites per view and
        the global standard deviations ``<view>/sd_mu``, ``<view>/sd_W``,
        ``<view>/sd_sigma2`` (their evolution under DP is spec §8.5) and, from round 2,
        ``model_change`` (the quantity of ``tol``) and the relative change of theta~
        ``rel_change``.
    n_rounds_ : int
        Rounds run by the kept start (fewer than ``n_rounds`` when ``tol`` stopped it).
    schema_ : ViewSchema
    feature_names_in_ : dict or ndarray
        ``{view: column names}`` of the views the sites gave as pandas DataFrames; a DataFrame
        given for prediction must have these columns in this order (as in scikit-learn).  For data
        given as one array (one view), scikit-learn's array of column names, and ``n_features_in_``.
    n_sites_ : int
    sites_ : ndarray
        Site labels: the sorted distinct ``groups``, or ``0..n_sites_-1``.
    init_seeds_, init_scores_ : list of int, ndarray (n_init,)
        Seed and final expected log-likelihood of every start; ``seed_`` is the kept one's.
    """

    def __init__(
        self,
        n_components: int | None = None,
        n_rounds: int = 100,
        n_local_iter: int = 100,
        n_first_iter: int = 30,
        random_state: int | None = None,
        *,
        n_init: int = 1,
        tol: float | None = MVPPCA_TOL,
        init: str = "pca",
        local_tol: float | None = 1e-8,
        ig_solver: str = "newton",
        sigma2_prior: str | None = "weak",
        prior_update: str = "em",
        column_variances: bool = True,
        noise_dof: bool = False,
        loading_uncertainty: bool = True,
        acceleration: str | None = "squarem",
        privacy: Any = None,
        aggregation: str = "plain",
        n_jobs: int = 1,
        site_timeout: float | None = None,
        participation: Any = None,
        min_sites: int = 1,
        progress: bool = False,
        site_column: str | None = None,
        insecure_reproducible_noise: bool = False,
    ):
        self.n_components = n_components
        self.n_rounds = n_rounds
        self.n_local_iter = n_local_iter
        self.n_first_iter = n_first_iter
        self.random_state = random_state
        self.n_init = n_init
        self.tol = tol
        self.init = init
        self.local_tol = local_tol
        self.ig_solver = ig_solver
        self.sigma2_prior = sigma2_prior
        self.prior_update = prior_update
        self.column_variances = column_variances
        self.noise_dof = noise_dof
        self.loading_uncertainty = loading_uncertainty
        self.acceleration = acceleration
        self.privacy = privacy
        self.aggregation = aggregation
        self.n_jobs = n_jobs
        self.site_timeout = site_timeout
        self.participation = participation
        self.min_sites = min_sites
        self.progress = progress
        self.site_column = site_column
        self.insecure_reproducible_noise = insecure_reproducible_noise

    # ------------------------------------------------------------------ checks
    def _check_params(self) -> None:
        for name in ("n_components", "n_rounds", "n_local_iter", "n_first_iter", "n_init"):
            value = getattr(self, name)
            if name == "n_components" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.tol is not None and (
            isinstance(self.tol, bool) or not isinstance(self.tol, numbers.Real) or not 0.0 < float(self.tol) < np.inf
        ):
            raise ValueError(f"tol must be None or a positive number, got {self.tol!r}")
        if self.local_tol is not None and (
            isinstance(self.local_tol, bool) or not isinstance(self.local_tol, numbers.Real)
            or not 0.0 < float(self.local_tol) < np.inf
        ):
            raise ValueError(f"local_tol must be None or a positive number, got {self.local_tol!r}")
        for name in ("noise_dof", "loading_uncertainty"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.init not in ("pca", "random"):
            raise ValueError(f"init must be 'pca' or 'random', got {self.init!r}")
        if self.random_state is not None and (
            isinstance(self.random_state, bool) or not isinstance(self.random_state, (int, np.integer)) or self.random_state < 0
        ):
            raise ValueError(f"random_state must be None or a non-negative integer seed, got {self.random_state!r}")
        if self.ig_solver not in ("newton", "fixed_point"):
            raise ValueError(f"ig_solver must be 'newton' or 'fixed_point', got {self.ig_solver!r}")
        if self.sigma2_prior not in ("weak", None):
            raise ValueError(f"sigma2_prior must be 'weak' or None, got {self.sigma2_prior!r}")
        if self.prior_update not in ("em", "paper"):
            raise ValueError(f"prior_update must be 'em' or 'paper', got {self.prior_update!r}")
        if self.acceleration not in ACCELERATIONS:
            raise ValueError(f"acceleration must be 'squarem' or None, got {self.acceleration!r}")
        if isinstance(self.aggregation, str):
            if self.aggregation not in ("plain", "secure"):
                raise ValueError(f"aggregation must be 'plain', 'secure' or a SecureAggregator, got {self.aggregation!r}")
        elif not callable(getattr(self.aggregation, "sum", None)):
            raise ValueError(f"aggregation must be 'plain', 'secure' or a SecureAggregator, got {self.aggregation!r}")

    def _check_privacy(self, schema: ViewSchema) -> None:
        from ..models.mvppca.dp import DPConfig, released_blocks
        from ..privacy import TotalBudget

        if not isinstance(self.privacy, DPConfig):
            raise ValueError(
                f"privacy must be a DPConfig (DPConfig.per_release(...) or DPConfig.total(...)), got {type(self.privacy).__name__}"
            )
        budget = self.privacy.budget
        if isinstance(budget, TotalBudget):
            per_view = len(released_blocks(self.prior_update == "em"))
            most = per_view * len(schema.names)  # every site releases every view (fedhier.models.mvppca.dp)
            if budget.n_rounds != self.n_rounds or budget.releases_per_round < most:
                raise ValueError(
                    f"the total budget was calibrated for {budget.n_rounds} rounds of {budget.releases_per_round} releases, "
                    f"but this fit has {self.n_rounds} rounds and a site releasing {most} blocks per round; "
                    f"use DPConfig.total(epsilon, delta, n_rounds={self.n_rounds}, n_views={most // per_view}{', spread=True' if self.prior_update == 'em' else ''})"
                )

    def _check_fitted(self) -> None:
        check_is_fitted(self, "_global", msg=NOT_FITTED)

    # ------------------------------------------------------------------ fitting
    def _protocol(self, schema: ViewSchema) -> MVPPCAProtocol:
        settings = {name: getattr(self, name) for name in MVPPCAProtocol.SETTINGS}
        return MVPPCAProtocol(
            schema, self.n_components_, privacy=self.privacy, column_variances=bool(self.column_variances),
            noise_dof=bool(self.noise_dof), loading_uncertainty=bool(self.loading_uncertainty),
            acceleration=self.acceleration, **settings
        )

    def _aggregator(self, n_sites: int):
        if not isinstance(self.aggregation, str):
            return self.aggregation
        if self.aggregation == "plain":
            return None
        from ..secure.secure_round import SecureAggregator

        return SecureAggregator(n_sites)

    def fit(
        self,
        X: Any,
        y: None = None,
        groups: Any = None,
        callbacks: Sequence[Callable[[RoundRecord, Any], None]] = (),
        checkpoint: str | Path | None = None,
    ) -> "FedMVPPCA":
        """Fit the global model.

        ``X``: a list of sites ``{view: (n_c, d) array or DataFrame}``; or pooled views
        ``{view: (n, d)}`` with ``groups`` (n,), the site of each row; or one mapping (one site); or
        one array (n, d), a single view at a single site.  ``y`` is ignored.
        A site may lack views (absent keys) and subjects may lack views (all-NaN rows).
        Bad input raises ``ValueError`` naming the site and view before any work.
        ``callbacks`` are called after every round (of every start, with ``n_init > 1``)
        with ``(record, broadcast)``.
        ``checkpoint``: a file rewritten after every round; if it exists, the fit
        resumes from it and ends exactly as an uninterrupted fit would.

        The fit runs with one BLAS thread: its many small products and q x q systems gain nothing
        from more, and threads waiting for each other at every product slow it down on a busy
        machine.  Only the products of the data with a (d, q) or (N, q) block of at least a
        million multiply-adds, and the covariance of a narrow site, use the caller's threads, as
        many as the machine has cores free when the fit starts (``python
        benchmarks/bench_blas_threads.py``); the caller's setting is restored after.
        """
        with one_blas_thread():
            return self._fit(X, groups, callbacks, checkpoint)

    def _fit(self, X: Any, groups: Any, callbacks: Sequence[Callable[[RoundRecord, Any], None]],
             checkpoint: str | Path | None) -> "FedMVPPCA":
        self._check_params()
        if self.n_init > 1:
            for name, value in (("privacy", self.privacy), ("participation", self.participation), ("checkpoint", checkpoint)):
                if value is not None:
                    raise ValueError(f"n_init > 1 cannot be combined with {name} (see the n_init parameter); fit one start at a time")
        X, groups = split_site_column(self, X, groups)
        given = view_sites(self, X, groups)
        widest = max(np.shape(V)[1] for site in given for V in site.values())
        self.n_components_ = default_n_components(widest) if self.n_components is None else int(self.n_components)
        if self._array_input and self.n_components_ >= widest:
            raise ValueError(f"n_components={self.n_components} must be below the number of features; X has {widest} feature(s)")
        if self.n_components_ < 1:
            raise ValueError(f"Fed-mv-PPCA needs a view of at least 2 features for one latent factor; the widest has {widest}")
        sites, schema = check_sites(given, n_components=self.n_components_, min_subjects=2)
        if self._array_input:  # scikit-learn's names, set by validate_data
            names = getattr(self, "feature_names_in_", None)
        else:
            names = feature_names(given)  # of the views given as DataFrames; checked again at prediction
            if hasattr(self, "n_features_in_"):
                del self.n_features_in_
        if _record_dp(self.privacy):  # one release per site, the fit is post-processing (fedhier.record_dp)
            from ..record_dp import fit_mvppca

            fit_mvppca(self, sites, schema)
            self._set_names(names)
            return self
        protocol = self._protocol(schema)
        if self.privacy is not None:
            self._check_privacy(schema)
        # a resumed fit measures its first change of theta~ from the checkpointed broadcast
        saved = read_checkpoint(checkpoint, n_sites=len(sites)) if checkpoint is not None and Path(checkpoint).exists() else None
        stop = stopping_rule(self.tol, self.privacy)
        callbacks = list(callbacks)
        bar = None
        if self.progress:
            from ..utils.progress import RoundProgress

            bar = RoundProgress(self.n_init * self.n_rounds, description="Fed-mv-PPCA")
            callbacks.append(bar)
        results = []
        try:
            seed = self.random_state
            for start in range(self.n_init):
                if start > 0:
                    seed = int(np.random.SeedSequence([results[0].seed, start]).generate_state(1)[0])
                # the history's metrics first, then the caller's callbacks and the progress bar
                metrics = BroadcastMetrics(schema, None if saved is None else saved.broadcast)
                results.append(
                    simulate(
                        protocol,
                        sites,
                        n_rounds=self.n_rounds,
                        random_state=seed,
                        n_jobs=self.n_jobs,
                        site_timeout=self.site_timeout,
                        participation=self.participation,
                        min_sites=self.min_sites,
                        callbacks=[metrics, *callbacks],
                        aggregation="plain" if self.aggregation == "plain" else "secure",
                        aggregator=self._aggregator(len(sites)),
                        checkpoint=checkpoint,
                        stop=stop,
                        insecure_reproducible_noise=bool(self.insecure_reproducible_noise),
                    )
                )
        finally:
            if bar is not None:
                bar.close()
        # expected log-likelihoods pick the best start (without privacy, the only case with n_init > 1)
        scores = np.array([r.history[-1].metrics.get("expected_ll", np.nan) for r in results])
        result = results[int(np.argmax(scores))]
        self._adopt(result.broadcast, schema, result.history, seed=result.seed, n_sites=len(sites))
        self._set_names(names)
        # the stopping rule's quantity (a one-round fit, the centralised special case, has nothing to settle)
        last = self.history_[-1]["metrics"].get("model_change", np.inf) if self.history_ else np.inf
        if stop is not None and self.n_rounds > 1 and self.n_rounds_ >= self.n_rounds and not last < self.tol:
            import warnings

            # with noise in every round's release more rounds need not settle the model, and each spends budget
            advice = ("the privacy noise released every round can keep them from settling, and every further round "
                      "spends more of the privacy budget") if self.privacy is not None else "raise n_rounds"
            warnings.warn(f"Fed-mv-PPCA ran all n_rounds={self.n_rounds} rounds and its predictions still changed by "
                          f"{last:.3g} in the last one, above tol={self.tol}; {advice}", ConvergenceWarning, stacklevel=2)
        self.init_seeds_ = [r.seed for r in results]
        self.init_scores_ = scores
        if self.privacy is not None:
            from ..models.mvppca.dp import ledger_from_history

            # what the accountant knows: who replied in which round, each reply releasing every view
            self.privacy_ledger_ = ledger_from_history(
                self.privacy, [list(schema.names)] * len(sites), result.history, spread=self.prior_update == "em"
            )
            self.privacy_spent_ = self._spent()
        return self

    def _spent(self) -> dict[int, dict[str, Any]]:
        """ε spent per site, or under the insecure switch a "not private" entry per site with no ε."""
        if self.insecure_reproducible_noise:
            return {s: {"epsilon": None, "delta": None, "private": False, "note": NOT_PRIVATE}
                    for s in self.privacy_ledger_.spent(self._privacy_delta())}
        return self.privacy_ledger_.spent(self._privacy_delta())

    def _set_names(self, names: Any) -> None:
        if names is None:
            if hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
        else:
            self.feature_names_in_ = names

    def privacy_table(self, delta: float | None = None) -> list[dict[str, Any]]:
        """Cumulative epsilon per site after each round (one PLD computation per row).

        ``delta`` defaults to the total budget's delta, else 1e-5.
        """
        self._check_fitted()
        if self.privacy is None:
            raise ValueError("this model was fitted without privacy")
        if self.insecure_reproducible_noise:
            raise ValueError(NOT_PRIVATE)
        return self.privacy_ledger_.round_table(self._privacy_delta() if delta is None else delta)

    def privacy_report(self, delta: float | None = None, site_names=None) -> dict[str, Any]:
        """Machine-readable report of every release of the fit (:func:`fedhier.privacy.report.fit_report`).

        ``delta`` defaults to the total budget's delta, else 1e-5; ``site_names`` maps site index -> name.
        """
        self._check_fitted()
        if self.privacy is None:
            raise ValueError("this model was fitted without privacy")
        if self.insecure_reproducible_noise:
            return {"private": False, "note": NOT_PRIVATE, "epsilon": None, "delta": None}
        from ..privacy.report import fit_report

        unit = self.privacy.unit if _record_dp(self.privacy) else "site"
        return fit_report(self.privacy_ledger_, self._privacy_delta() if delta is None else delta, unit=unit,
                          site_names=site_names)

    def _privacy_delta(self) -> float:
        """delta at which the spent epsilon is reported: the total budget's, else 1e-5."""
        from ..privacy import TotalBudget

        if _record_dp(self.privacy):
            return float(self.privacy.delta)
        budget = self.privacy.budget
        return float(budget.delta) if isinstance(budget, TotalBudget) else 1e-5

    def _adopt(self, broadcast, schema: ViewSchema, history: Sequence[RoundRecord], *, seed: int, n_sites: int) -> None:
        """The fitted state from a run's final broadcast, its latent space in the canonical rotation."""
        glob = global_from_message(broadcast, schema)
        self._global: GlobalParams = rotate(glob, canonical_rotation(glob))
        self.n_components_ = int(next(iter(self._global.values())).W.shape[1])
        self.schema_ = schema
        self.n_sites_ = int(n_sites)
        self.seed_ = int(seed)
        self.history_ = [self._history_row(r) for r in history]
        self.n_rounds_ = len(self.history_)
        self.feature_names_in_: dict[str, tuple[str, ...]] = {}
        if not hasattr(self, "sites_") or len(self.sites_) != self.n_sites_:
            self.sites_ = np.arange(self.n_sites_)

    @classmethod
    def from_broadcast(
        cls,
        broadcast: Mapping[str, np.ndarray],
        schema: ViewSchema,
        history: Sequence[RoundRecord],
        *,
        seed: int,
        n_sites: int,
        **params: Any,
    ) -> "FedMVPPCA":
        """A fitted estimator from the final broadcast of a Fed-mv-PPCA run on any runtime.

        Used by deployments (e.g. :mod:`fedhier.runtime.flower`) that run the rounds
        themselves; ``params`` are the constructor's parameters of that run.
        """
        model = cls(**params)
        model._adopt(broadcast, schema, history, seed=seed, n_sites=n_sites)
        return model

    @staticmethod
    def _history_row(record: RoundRecord) -> dict[str, Any]:
        row = record.to_dict()
        row["expected_ll"] = record.metrics.get("expected_ll", float("nan"))
        row["bytes_sent"] = int(sum(record.bytes_up.values()))
        return row

    # ------------------------------------------------------------------ fitted model
    @property
    def global_params_(self) -> dict[str, dict[str, Any]]:
        self._check_fitted()
        return {view: g.to_dict() for view, g in self._global.items()}

    @property
    def model_(self):
        """Point model {view: ViewParams(mu~, W~, s-bar)} used by the predictive methods."""
        self._check_fitted()
        return point_model(self._global)

    @property
    def _n_features_out(self) -> int:
        """Number of columns of :meth:`transform` (scikit-learn's ``get_feature_names_out``)."""
        return self.n_components_

    def _views(self, X: Mapping[str, Any]) -> dict[str, np.ndarray]:
        self._check_fitted()
        X, _ = split_site_column(self, X, required=False)  # the global model predicts at any site
        X = array_view(self, X)
        views = check_views(X, self.schema_)
        if isinstance(getattr(self, "feature_names_in_", None), dict):
            check_feature_names(self.feature_names_in_, X)
        return views

    def transform(self, X: Mapping[str, Any]) -> np.ndarray:
        """Latent posterior means (n, q) given each subject's observed views (§9)."""
        mean, _ = predictive.latent_posterior(self.model_, self._views(X))
        return mean

    def reconstruct(self, X: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """W~ x-hat + mu~ for the views present in X (§9; what the MAE uses, §11)."""
        return predictive.reconstruct(self.model_, self._views(X))

    def impute(self, X: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Predictive means of ALL views given the observed ones (§9 conditional predictive)."""
        return predictive.impute(self.model_, self._views(X))

    def impute_variance(self, X: Mapping[str, Any], view: str) -> np.ndarray:
        """Per-feature predictive variance (n, d_view) of ``view`` given the observed views."""
        return predictive.impute_variance(self.model_, self._views(X), view)

    def impute_covariance(self, X: Mapping[str, Any], view: str) -> np.ndarray:
        """Full predictive covariance (n, d_view, d_view) of ``view`` given the observed views (§9).

        The only method that forms d x d matrices: use :meth:`impute_variance` for wide views.
        """
        return predictive.impute_covariance(self.model_, self._views(X), view)

    def impute_variance_new_site(self, X: Mapping[str, Any], view: str) -> np.ndarray:
        """Per-feature predictive variance for a subject of an unseen site (§9 [R]).

        Adds the between-site uncertainty of the hierarchical prior,
        sigma2_mu + sigma2_W (tr M_O + ||x-hat||^2), to :meth:`impute_variance`.
        """
        self._check_fitted()
        return predictive.hierarchical_predictive_variance(self._global, self._views(X), view)

    def score_samples(self, X: Mapping[str, Any]) -> np.ndarray:
        """Marginal log-likelihood (n,) of each subject's observed views (§10, x integrated out);
        0 for a subject with no observed view."""
        return predictive.marginal_loglik(self.model_, self._views(X))

    def score(self, X: Mapping[str, Any], y: None = None) -> float:
        """Mean marginal log-likelihood over the subjects that have at least one observed view
        (as scikit-learn's ``PCA.score``: the average log-likelihood; ``y`` is ignored)."""
        views = self._views(X)
        observed = np.zeros(next(iter(views.values())).shape[0], dtype=bool)
        for values in views.values():
            observed |= ~np.isnan(values).all(axis=1)
        return float(np.mean(predictive.marginal_loglik(self.model_, views)[observed]))

    def sample(self, n_samples: int, *, hierarchical: bool = False, random_state: int | None = None):
        """Draw subjects from the point model (§9a) or from a synthetic new site (§9b)."""
        self._check_fitted()
        if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) or n_samples < 1:
            raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
        rng = np.random.default_rng(random_state)
        if hierarchical:
            views, _ = predictive.sample_hierarchical(self._global, n_samples, rng)
        else:
            views, _ = predictive.sample(self.model_, n_samples, rng)
        return views

    def waic(self, sites: Sequence[Mapping[str, Any]], *, n_draws: int = 1000, seed: int = 0) -> float:
        """WAIC of the fitted hierarchical model on training sites (§10; lower is better).

        Each site computes two scalars (its lppd and p_WAIC sums) from the broadcast
        global model and a shared seed; only those travel.
        """
        self._check_fitted()
        sites, _ = check_sites(sites, schema=self.schema_, min_subjects=1)
        lppd = p_waic = 0.0
        for site in sites:
            a, b, _ = waic_site_terms(self._global, site, n_draws=n_draws, seed=seed)
            lppd += a
            p_waic += b
        return -2.0 * (lppd - p_waic)

    # ------------------------------------------------------------------ choosing q
    @classmethod
    def score_n_components(
        cls,
        sites: Sequence[Mapping[str, Any]],
        candidates: Sequence[int],
        *,
        criterion: str = "heldout",
        n_splits: int = 3,
        n_draws: int = 1000,
        tolerance: float = 0.02,
        random_state: int | None = 0,
        **params: Any,
    ) -> "ComponentScores":
        """Score every latent dimension q in ``candidates`` on ``sites`` and choose one.

        ``criterion="heldout"`` (default): federated cross-validated *cross-view*
        predictive log-likelihood.  Every site splits its own subjects into ``n_splits``
        folds; for each fold, a model fitted on all sites' other folds scores every
        held-out subject by sum_k ln p(t_k | the subject's other views) (the imputation
        task; a subject needs two observed views).  The latent dimension is what the views
        share, so components that only model one view's noise do not raise this score, as
        they raise the plain likelihood when the noise is not isotropic (min-max scaled
        data).  The choice is the smallest q whose mean score is within one standard error
        (paired, over subjects; the one-standard-error rule) or within ``tolerance`` times
        the range of the scores of the best: data are never exactly the model, and a
        larger q keeps buying small but consistent gains (on the experiments' SD, 0.1-0.4 nat
        per subject from q = 5 to 8, against 15-20 from 4 to 5).  A site sends per candidate
        the sum of its subjects' scores and per pair of candidates the sum of squared
        differences.  ``criterion="waic"``: WAIC of a fit on all the data
        (:meth:`waic`, ``n_draws`` draws), the smallest is chosen.  ``params`` go to the
        constructor; ``random_state`` seeds the fits and the folds.

        Returns
        -------
        ComponentScores
        """
        if criterion not in ("heldout", "waic"):
            raise ValueError(f"criterion must be 'heldout' or 'waic', got {criterion!r}")
        candidates = [int(q) for q in candidates]
        if not candidates or any(q < 1 for q in candidates) or len(set(candidates)) != len(candidates):
            raise ValueError(f"candidates must be distinct positive integers, got {candidates!r}")
        if isinstance(n_splits, bool) or not isinstance(n_splits, (int, np.integer)) or n_splits < 2:
            raise ValueError(f"n_splits must be an integer >= 2, got {n_splits!r}")
        if not (isinstance(tolerance, numbers.Real) and 0.0 <= float(tolerance) < 1.0):
            raise ValueError(f"tolerance must be a number in [0, 1), got {tolerance!r}")
        checked, _ = check_sites(sites, n_components=max(candidates), min_subjects=2 * n_splits)
        seeds = np.random.SeedSequence(random_state).spawn(len(candidates) + len(checked))
        fit_seeds = [int(seed.generate_state(1)[0]) for seed in seeds[: len(candidates)]]
        if criterion == "waic":
            waic = np.array([
                cls(n_components=q, random_state=seed, **params).fit(checked).waic(checked, n_draws=n_draws, seed=seed)
                for q, seed in zip(candidates, fit_seeds)
            ])
            return ComponentScores(candidates, waic, np.full(len(candidates), np.nan), candidates[int(np.argmin(waic))], criterion)
        folds = [
            np.random.default_rng(seed).permutation(next(iter(site.values())).shape[0]) % n_splits
            for site, seed in zip(checked, seeds[len(candidates):])
        ]
        pointwise = np.zeros((len(candidates), sum(f.size for f in folds)))  # subjects in site order
        offsets = np.cumsum([0] + [f.size for f in folds])
        for i, (q, seed) in enumerate(zip(candidates, fit_seeds)):
            for fold in range(n_splits):
                train = [{v: X[f != fold] for v, X in site.items()} for site, f in zip(checked, folds)]
                model = cls(n_components=q, random_state=seed, **params).fit(train)
                for c, (site, f) in enumerate(zip(checked, folds)):
                    rows = np.flatnonzero(f == fold)
                    pointwise[i, offsets[c] + rows] = model._cross_view_loglik({v: X[rows] for v, X in site.items()})
        scored = np.isfinite(pointwise[0])
        if not scored.any():
            raise ValueError("no subject has two observed views; use criterion='waic'")
        pointwise = pointwise[:, scored]
        scores = pointwise.mean(axis=1)
        top = int(np.argmax(scores))
        errors = (pointwise - pointwise[top]).std(axis=1, ddof=1) / np.sqrt(pointwise.shape[1])
        order = np.argsort(candidates)
        slack = np.maximum(errors, float(tolerance) * (scores.max() - scores.min()))
        best = next(candidates[j] for j in order if scores[j] >= scores[top] - slack[j])
        return ComponentScores(candidates, scores, errors, best, criterion)

    def _cross_view_loglik(self, X: Mapping[str, np.ndarray]) -> np.ndarray:
        """sum over observed views k of ln p(t_k | the other observed views) per subject (nan if < 2 views)."""
        full = self.score_samples(X)
        observed = np.stack([~np.isnan(np.asarray(V, dtype=float)).all(axis=1) for V in X.values()], axis=1)
        total = np.zeros(full.shape)
        for j, view in enumerate(X):
            rest = {v: V for v, V in X.items() if v != view and observed[:, list(X).index(v)].any()}
            if not rest:
                continue
            total += np.where(observed[:, j], full - self.score_samples(rest), 0.0)
        return np.where(observed.sum(axis=1) >= 2, total, np.nan)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Save the fitted model as ``.npz`` (arrays + JSON metadata; no pickle), atomically."""
        self._check_fitted()
        arrays: dict[str, np.ndarray] = {}
        for view, g in self._global.items():
            for name in GLOBAL_FIELDS:
                arrays[f"{view}/{name}"] = np.asarray(getattr(g, name), dtype=float)
        meta = {
            "format": _FORMAT,
            "params": {
                **{k: getattr(self, k) for k in ("n_components", "n_rounds", "n_local_iter", "n_first_iter", "random_state", "n_init", "tol", "init", "local_tol", "ig_solver", "sigma2_prior", "prior_update", "column_variances", "noise_dof", "loading_uncertainty", "acceleration", "insecure_reproducible_noise")},
                "aggregation": self.aggregation if isinstance(self.aggregation, str) else "secure",
            },
            **({"privacy": NOT_PRIVATE} if self.insecure_reproducible_noise and self.privacy is not None else {}),
            "schema": {"names": list(self.schema_.names), "dims": list(self.schema_.dims)},
            "n_sites": self.n_sites_,
            "n_components": self.n_components_,
            "feature_names_in": ({view: list(names) for view, names in self.feature_names_in_.items()}
                                 if isinstance(getattr(self, "feature_names_in_", None), dict) else {}),
            "array_input": bool(getattr(self, "_array_input", False)),
            "array_feature_names": (None if isinstance(getattr(self, "feature_names_in_", {}), dict)
                                    else [str(n) for n in self.feature_names_in_]),
            "history": self.history_,
        }
        arrays["__meta__"] = np.frombuffer(json_text(meta).encode(), dtype=np.uint8)
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        return atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> "FedMVPPCA":
        """Load a model written by :meth:`save`; the file is untrusted input.

        No pickle; every array's declared size is checked against the file before it is
        read (:func:`fedhier.utils.untrusted.read_npz`), shapes against the saved schema,
        and NaN or infinite parameters are refused, naming the array.
        """
        arrays = read_npz(path)
        meta = read_meta_json(arrays, "__meta__", str(path))
        if meta.get("format") != _FORMAT:
            raise ValueError(f"{path}: unsupported format {meta.get('format')!r}")
        try:
            # files from before the EM update, and from before the sites counted their loadings' uncertainty
            model = cls(**{"prior_update": "paper", "loading_uncertainty": False, **meta["params"]})
            schema = ViewSchema(tuple(meta["schema"]["names"]), tuple(int(d) for d in meta["schema"]["dims"]))
            q = int(meta.get("n_components", model.n_components))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: damaged model metadata ({type(exc).__name__}: {exc})") from None
        glob: GlobalParams = {}
        for view, dim in zip(schema.names, schema.dims):
            if f"{view}/mu" not in arrays:
                continue
            v = {}
            for name in GLOBAL_FIELDS:
                key = f"{view}/{name}"
                expected = {"mu": (dim,), "W": (dim, q), "sigma2_W_columns": (q,)}.get(name, ())
                if name == "sigma2_W_columns" and key not in arrays:  # files from before the per-column variances
                    continue
                if key not in arrays or arrays[key].shape != expected or arrays[key].dtype.kind != "f":
                    raise ValueError(f"{path}: array {key!r} is missing or not a float array of shape {expected}")
                v[name] = arrays[key]
            check_finite({f"{view}/{name}": value for name, value in v.items()}, str(path))
            glob[view] = GlobalView(mu=v["mu"], W=v["W"], sigma2_W_columns=v.get("sigma2_W_columns"),
                                    **{n: float(v[n]) for n in GLOBAL_FIELDS if n not in ("mu", "W", "sigma2_W_columns")})
        model._global = glob
        model.n_components_ = q
        model.schema_ = schema
        model.n_sites_ = meta["n_sites"]
        model.history_ = meta["history"]
        model.feature_names_in_ = {view: tuple(names) for view, names in meta.get("feature_names_in", {}).items()}
        model.n_rounds_ = len(model.history_)
        model.sites_ = np.arange(int(model.n_sites_))
        model._array_input = bool(meta.get("array_input", False))
        if model._array_input:
            model.n_features_in_ = int(schema.dims[0])
            model._set_names(None if meta.get("array_feature_names") is None
                             else np.asarray(meta["array_feature_names"], dtype=object))
        return model
