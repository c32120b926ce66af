"""Local computation of one site: EM / MAP-EM of multi-view PPCA (spec fed-mv-ppca §3, §4).

:func:`fit_local` runs the iterations of one round at one site.  Round 1 (``prior`` None)
runs EM without priors on mu and W, started either from a PCA of the site's own views
(``init="pca"``, [R], :mod:`.start`) or as in the paper from W_ij ~ U(-2, 2),
sigma2 ~ U(0.1, 0.5) (``init="random"``, §4.5 [RC]); rounds >= 2 draw W and sigma2 from the
broadcast prior and run MAP-EM.  With ``tol`` the iterations stop once the parameters
settle (relative change below ``tol``), ``n_iter`` being the cap.
Every iteration follows the order of §4.3:

    (1) mu (eq. 11, Woodbury)  ->  (2) E-step  ->  (3) W (lambda_i = sigma2[s] / sigma2_Wi, per column i)
    ->  (4) sigma2 (eq. 21, with N_c^(k) d_k).

With ``loading_uncertainty`` (rounds >= 2, [R]) the E-step and step (4) are expectations over the
posterior of the loadings as well, as in variational Bayes: given the latent moments, the rows of W_k
are independent Gaussians N(w_kj, Sigma_k), Sigma_k = sigma2_k (S_xx + Lambda_k)^{-1} (the covariance of
step (3)'s ridge regression, the one :mod:`.spread` sends), so that

    E[W_k^T W_k] = W_k^T W_k + d_k Sigma_k,        E sum_n ||t_n - mu - W_k x_n||^2 = S_k + d_k tr(Sigma_k S_xx):

the latents' precision gains sum_k d_k Sigma_k / sigma2_k and S_k of eq. 21 the second term.  The
MAP-EM of the paper takes W_k as known; where a site has few subjects against d_k q its loadings are
uncertain, the latents then absorb what the loadings cannot show, and round after round the global
loadings drift (docs/mvppca.md, "The loadings' uncertainty at the sites").

Subjects may lack views (entirely-NaN rows, §2.3 [R]): the E-step is done once per
observed-view pattern and each view's M-step sums over the subjects that have it.
One iteration costs two BLAS products per view, (N_k, d_k) x (d_k, q) and
(d_k, N_k) x (N_k, q), plus O(N q^2 + d q^2 + q^3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ._data import MultiViewData, check_views, row_blocks
from ._latent import (
    check_model,
    marginal_loglik_rows,
    moments_from_covariance,
    pattern_moments,
    pattern_precisions,
    posterior,
)
from ._linalg import spd_factors, threads_for
from .mstep import (
    effective_columns,
    loading_step,
    loading_system,
    mean_step,
    mean_system,
    residual_dof,
    scatter_first_form,
    scatter_second_form,
    sigma2_step,
)
from .params import GlobalParams, GlobalView, LocalParams, ViewParams

__all__ = ["LocalFit", "fit_local", "e_step", "local_objective", "log_prior"]

_LOG_2PI = float(np.log(2.0 * np.pi))
#: below this fraction of sum ||t - mu||^2, S_k is recomputed with the second form (cancellation)
_CANCELLATION_RATIO = 1e-6
#: the largest N ||t-bar||^2 / sum ||t - t-bar||^2 of a view at which its covariance, formed as
#: (T^T T - N t-bar t-bar^T) / N, gives its scatter and round 1's EM: rounding then costs at most ~1e-12 relative
_MEAN_TO_SPREAD = 1e4


@dataclass(frozen=True)
class LocalFit:
    """Result of :func:`fit_local`.

    Attributes
    ----------
    params : LocalParams
        theta_c: one ViewParams per fitted view.
    expected_ll : ndarray of shape (n_iterations,)
        Q_c of §4.2 with all constants, evaluated after each iteration at that
        iteration's new (mu, W, sigma2) and its E-step moments (with ``loading_uncertainty``
        the residual is its expectation over the loadings' posterior as well); one entry per
        iteration run (``n_iter``, or fewer when ``tol`` stopped the fit).
    safeguards : tuple of str
        Notes on safeguards that triggered (rejected sigma2, halved weak prior, ...).
    covariance : ndarray of shape (d, d) or None
        The joint covariance of the site's views (in the order of ``params``) when round 1's EM
        ran on it (:func:`.start.joint_covariance`), for later moments at mu = t-bar; else None.
    """

    params: LocalParams
    expected_ll: np.ndarray
    safeguards: tuple[str, ...]
    covariance: np.ndarray | None = None


def _check_prior(prior: GlobalParams, data: MultiViewData, q: int) -> None:
    for name, block in data.views.items():
        if name not in prior:
            raise ValueError(f"site data: view {name!r} has no prior (prior views: {sorted(prior)})")
        g = prior[name]
        if np.shape(g.W) != (block.dim, q) or np.shape(g.mu) != (block.dim,):
            raise ValueError(
                f"prior: view {name!r} has mu {np.shape(g.mu)} and W {np.shape(g.W)}, "
                f"the site's data need ({block.dim},) and ({block.dim}, {q})"
            )
        for field in ("sigma2_mu", "sigma2_W", "alpha", "beta"):
            value = getattr(g, field)
            if not (np.isfinite(value) and value > 0):
                raise ValueError(f"prior: view {name!r} has {field} = {value}; it must be positive and finite")
        columns = np.asarray(g.sigma2_W_columns, dtype=float)
        if columns.shape != (q,) or not (np.all(np.isfinite(columns)) and np.all(columns > 0)):
            raise ValueError(f"prior: view {name!r} needs {q} positive finite column variances of W")


def _scatter_about(values: np.ndarray, centre: np.ndarray) -> float:
    """sum_n ||t_n - centre||^2 of (N, d) rows, by cache-sized blocks of rows (no N x d temporary)."""
    total = 0.0
    for block in row_blocks(values):
        diff = block - centre
        total += float(np.einsum("ij,ij->", diff, diff))
    return total


def _covariance_is_accurate(n: int, mean: np.ndarray, scatter: float) -> bool:
    """True while N ||t-bar||^2 <= 1e4 sum_n ||t_n - t-bar||^2: the covariance (T^T T - N t-bar t-bar^T) / N then
    loses at most about 1e-12 of its scale to the digits the mean takes from T^T T."""
    return n * float(mean @ mean) <= _MEAN_TO_SPREAD * scatter


def _settled(before: dict, mu: dict, W: dict, sigma2: dict, tol: float) -> bool:
    """True when every view's relative change of (mu_k, W_k, sigma2_k) since ``before`` is below ``tol``.

    Per view: max(|d sigma2| / sigma2, ||dW||_F / ||W||_F, ||d mu|| / (||mu|| + ||W||_F)), the norms from dot
    products of the flattened arrays; the first change at or above ``tol`` answers, the cheapest tried first.
    """
    for name, (mu0, W0, s0) in before.items():
        if abs(sigma2[name] - s0) / sigma2[name] >= tol:
            return False
        w = W[name].ravel()
        squared_W = w @ w
        if squared_W > 0:
            scale_W = math.sqrt(squared_W)
            dW = w - W0.ravel()
            if math.sqrt(dW @ dW) / scale_W >= tol:
                return False
            dmu = mu[name] - mu0
            if math.sqrt(dmu @ dmu) / (math.sqrt(mu[name] @ mu[name]) + scale_W) >= tol:
                return False
    return True


def fit_local(
    data: Mapping[str, np.ndarray],
    n_components: int,
    prior: GlobalParams | None = None,
    *,
    n_iter: int,
    rng: np.random.Generator | int | None,
    sigma2_prior: str | None = "weak",
    init: str = "pca",
    tol: float | None = None,
    noise_dof: bool = False,
    loading_uncertainty: bool = False,
) -> LocalFit:
    """Fit theta_c = {mu_k, W_k, sigma2_k} at one site for one round (§4.3–§4.5).

    Parameters
    ----------
    data : mapping str -> ndarray of shape (n, d_k)
        The site's views; entirely-NaN rows mark subjects without that view.
    n_components : int
        q, the latent dimension.
    prior : GlobalParams, optional
        theta~[r-1]; None in round 1.  Must contain every view of ``data``; prior views
        the site lacks are not fitted.
    n_iter : int
        Number of (MAP-)EM iterations (I_1 or I).
    rng : numpy.random.Generator or seed
        Source of the initial W and sigma2.
    sigma2_prior : {"weak", None}
        Round 1 only: "weak" applies the [RC] IG(2.25, 0.625) prior with the halving
        retry to sigma2; None runs plain EM.  Ignored when ``prior`` is given (then
        IG(alpha, beta) of the prior is used).
    init : {"pca", "random"}
        Round 1 only: start from the PCA of the site's views ([R], :func:`.start.pca_start`)
        or from W_ij ~ U(-2, 2), sigma2 ~ U(0.1, 0.5) ([RC], the paper's start).
    tol : float or None
        Stop after the iteration where every view's relative change
        max(||dW||_F / ||W||_F, |d sigma2| / sigma2, ||d mu|| / (||mu|| + ||W||_F)) falls
        below ``tol``; None runs exactly ``n_iter`` iterations.
    noise_dof : bool
        Step (4) divides the residual by its degrees of freedom, N d_k less what the mean and the
        loadings took (:func:`.mstep.residual_dof`) [R], instead of N d_k (eq. 21).
    loading_uncertainty : bool
        With a prior: the E-step and step (4) take the expectation over the loadings' posterior
        (module docstring) [R]; False is the paper's MAP-EM, W_k taken as known.  Ignored in round 1.

    Returns
    -------
    LocalFit

    Raises
    ------
    ValueError
        On malformed data (see :func:`check_views`), a view without observed rows, a
        missing or mis-shaped prior view, or bad arguments.
    """
    q = int(n_components)
    if q < 1:
        raise ValueError(f"n_components must be >= 1, got {n_components}")
    if int(n_iter) < 1:
        raise ValueError(f"n_iter must be >= 1, got {n_iter}")
    if sigma2_prior not in ("weak", None):
        raise ValueError(f"sigma2_prior must be 'weak' or None, got {sigma2_prior!r}")
    if init not in ("pca", "random"):
        raise ValueError(f"init must be 'pca' or 'random', got {init!r}")
    if tol is not None and not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be None or a positive number, got {tol!r}")
    rng = np.random.default_rng(rng)
    site = check_views(data, what="site data")
    for name, block in site.views.items():
        if block.n_obs == 0:
            raise ValueError(f"site data: view {name!r} has no observed row; leave the view out instead")
    if prior is not None:
        _check_prior(prior, site, q)

    sample_mean, scatter, n_cols = {}, {}, {}
    mu, W, sigma2 = {}, {}, {}  # mu: t-bar without a prior, else first set by step (1)
    for name, block in site.views.items():
        sample_mean[name] = block.values.mean(axis=0)
    covariance = None  # the views' joint covariance, when the start forms it
    if prior is None and init == "pca":
        from .start import joint_covariance, pca_start  # round 1 only: the later rounds' site steps need not import scipy

        covariance = joint_covariance(site, sample_mean, q)
    # a view's scatter sum_n ||t_n - t-bar||^2 is N tr C_kk where its covariance block is accurate, else a pass
    # over the data; round 1's EM runs on the covariance when every view's block is accurate
    offset, accurate = 0, covariance is not None
    for name, block in site.views.items():
        view_accurate = False
        if covariance is not None:
            from_covariance = block.n_obs * float(np.trace(covariance[offset:offset + block.dim, offset:offset + block.dim]))
            view_accurate = _covariance_is_accurate(block.n_obs, sample_mean[name], from_covariance)
            offset += block.dim
        scatter[name] = from_covariance if view_accurate else _scatter_about(block.values, sample_mean[name])
        accurate = accurate and view_accurate
        n_cols[name] = effective_columns(block.dim, q)
        if prior is not None:
            g = prior[name]
            W[name] = np.asarray(g.W, dtype=float) + np.sqrt(g.sigma2_W_columns) * rng.standard_normal((block.dim, q))
            sigma2[name] = float(g.beta / rng.gamma(g.alpha))
        elif init == "random":
            W[name] = rng.uniform(-2.0, 2.0, size=(block.dim, q))
            sigma2[name] = float(rng.uniform(0.1, 0.5))
    if prior is None and init == "pca":
        W, sigma2 = pca_start(site, sample_mean, scatter, q, rng, covariance=covariance)
    em_covariance = covariance if accurate else None
    for name in site.views:
        W[name][:, n_cols[name]:] = 0.0

    names = list(site.views)
    # per view, fixed over the iterations: the patterns that have it, N_c^(k) d_k and the prior's arrays
    view_patterns = {name: np.flatnonzero(site.patterns[:, j]) for j, name in enumerate(names)}
    n_obs = {name: block.n_obs for name, block in site.views.items()}
    n_dof = {name: block.n_obs * block.dim for name, block in site.views.items()}
    if prior is None:
        mu = dict(sample_mean)  # step (1) without a prior: mu = t-bar at every iteration
    else:
        prior_mu = {name: np.asarray(prior[name].mu, dtype=float) for name in names}
        prior_W = {name: np.asarray(prior[name].W, dtype=float) for name in names}
        prior_columns = {name: np.asarray(prior[name].sigma2_W_columns, dtype=float) for name in names}
    expected_ll = np.empty(int(n_iter))
    notes: list[str] = []
    # Sigma_k, the covariance of a row of W_k under its posterior, from the last step (3); 0 before the first
    uncertain = bool(loading_uncertainty) and prior is not None
    row_cov = {name: np.zeros((q, q)) for name in names} if uncertain else None
    for it in range(int(n_iter)):
        if tol is not None:
            before = {k: (mu.get(k), W[k], sigma2[k]) for k in names}
        # the q x q systems of W[s], sigma2[s] factorised at once: each view's mean step and each pattern's precision
        systems = []
        if prior is not None:
            systems = [mean_system(n_obs[k], W[k], sigma2[k], prior[k].sigma2_mu) for k in names]
        if em_covariance is None:
            systems.extend(pattern_precisions(site, W, sigma2, row_cov))
        chol, inverse_chol = spd_factors(np.array(systems)) if systems else (None, None)
        # (1) mu, with W[s], sigma2[s]
        if prior is not None:
            for j, (name, block) in enumerate(site.views.items()):
                mu[name] = mean_step(sample_mean[name], n_obs[name], W[name], sigma2[name], prior_mu[name],
                                     prior[name].sigma2_mu, inverse_factor=inverse_chol[j])
        # (2) E-step with mu[s+1], W[s], sigma2[s]: from the data, or from their covariance
        current = {k: ViewParams(mu[k], W[k], sigma2[k]) for k in names}
        if em_covariance is None:
            n_mean = len(names) if prior is not None else 0
            post = posterior(site, current, factors=(chol[n_mean:], inverse_chol[n_mean:]))
            xx_pattern, cov_pattern = pattern_moments(site, post)
            total_second_moment = xx_pattern[0] if len(xx_pattern) == 1 else xx_pattern.sum(axis=0)
        else:
            post = None
            total_second_moment, cross_of = moments_from_covariance(em_covariance, current, site.n)
        q_value = -0.5 * (site.n * q * _LOG_2PI + total_second_moment.trace())
        # each view's sum <x x^T> over its subjects and ridge lambda = sigma2[s] / sigma2_W~, and the factors of
        # the systems of step (3), all views at once
        xx_of, ridge_of = {}, {}
        for name in names:
            patterns = view_patterns[name]
            if em_covariance is None:
                xx_of[name] = xx_pattern[patterns[0]] if patterns.size == 1 else xx_pattern[patterns].sum(axis=0)
            else:
                xx_of[name] = total_second_moment
            ridge_of[name] = 0.0 if prior is None else sigma2[name] / prior_columns[name]
        loading_factors = spd_factors(np.array([loading_system(xx_of[k], ridge_of[k]) for k in names]))[1]
        for j, (name, block) in enumerate(site.views.items()):
            patterns, xx, ridge = view_patterns[name], xx_of[name], ridge_of[name]
            if em_covariance is None:
                X = post.means if block.rows is None else post.means[block.rows]
                with threads_for(block.values.size * q):
                    cross = block.values.T @ X
                cross -= mu[name][:, None] * X.sum(axis=0)
            else:
                cross = cross_of[name]
            # (3) W with the current sigma2[s]
            g = None if prior is None else prior[name]
            W[name] = loading_step(cross, xx, ridge, None if g is None else prior_W[name], n_cols[name],
                                   inverse_factor=loading_factors[j])
            if uncertain:  # Sigma_k = sigma2[s] (S_xx + Lambda)^{-1} over the effective columns (the others are 0)
                row_cov[name] = sigma2[name] * (loading_factors[j].T @ loading_factors[j])
                if n_cols[name] < q:
                    row_cov[name][n_cols[name]:, :] = 0.0
                    row_cov[name][:, n_cols[name]:] = 0.0
            # (4) sigma2 with W[s+1], mu[s+1]
            S = scatter_first_form(scatter[name], n_obs[name], sample_mean[name], mu[name], W[name], cross, xx)
            shift = sample_mean[name] - mu[name]
            if S <= _CANCELLATION_RATIO * (scatter[name] + n_obs[name] * (shift @ shift)):
                if post is None:  # the second form needs the posterior means from the data
                    post = posterior(site, current)
                    cov_pattern = pattern_moments(site, post)[1]
                X = post.means if block.rows is None else post.means[block.rows]
                S = scatter_second_form(block.values, mu[name], W[name], X, cov_pattern[patterns].sum(axis=0))
            if uncertain:  # E sum_n ||t_n - mu - W x_n||^2 over the rows' posterior as well
                S += block.dim * float(np.vdot(row_cov[name], xx))
            dof = residual_dof(n_obs[name], block.dim, xx, ridge, n_cols[name]) if noise_dof else n_dof[name]
            new, view_notes = sigma2_step(
                S, dof, old=sigma2[name], view=name,
                alpha=None if g is None else g.alpha, beta=None if g is None else g.beta,
                weak=(g is None and sigma2_prior == "weak"),
            )
            if view_notes:
                notes.extend(f"iteration {it + 1}: {note}" for note in view_notes)
            sigma2[name] = new
            q_value -= 0.5 * (n_dof[name] * (_LOG_2PI + np.log(new)) + S / new)
        expected_ll[it] = q_value
        if tol is not None and it > 0 and _settled(before, mu, W, sigma2, tol):
            expected_ll = expected_ll[: it + 1]
            break

    params = {k: ViewParams(mu=mu[k], W=W[k], sigma2=sigma2[k]) for k in names}
    return LocalFit(params=params, expected_ll=expected_ll, safeguards=tuple(notes), covariance=em_covariance)


def e_step(data: Mapping[str, np.ndarray], params: Mapping[str, ViewParams]) -> tuple[np.ndarray, np.ndarray]:
    """Posterior moments of the latent variables (§4.1), one subject per row.

    Parameters
    ----------
    data : mapping str -> ndarray of shape (n, d_k)
        Views of the site; every view must be in ``params``.
    params : mapping str -> ViewParams

    Returns
    -------
    means : ndarray of shape (n, q)
        <x_n>.
    covariances : ndarray of shape (n, q, q)
        M_{O_n} per subject (equal within an observed-view pattern); a subject with no
        view gets the prior, I_q.  <x_n x_n^T> = covariances[n] + outer(means[n], means[n]).
    """
    check_model(params, "params")
    site = check_views(data, what="site data", dims={k: p.dim for k, p in params.items()})
    post = posterior(site, params)
    return post.means, post.covariances[site.pattern_of]


def log_prior(params: ViewParams, prior: GlobalView) -> float:
    """ln p(mu) + ln p(W) + ln p(sigma2) of one view under theta~, all constants kept (§3)."""
    d, q = np.shape(params.W)
    dmu = np.asarray(params.mu) - np.asarray(prior.mu)
    dW = np.asarray(params.W) - np.asarray(prior.W)
    ln_mu = -0.5 * d * np.log(2 * np.pi * prior.sigma2_mu) - 0.5 * (dmu @ dmu) / prior.sigma2_mu
    columns = np.asarray(prior.sigma2_W_columns, dtype=float)
    ln_W = -0.5 * d * np.sum(np.log(2 * np.pi * columns)) - 0.5 * np.sum(np.sum(dW**2, axis=0) / columns)
    ln_s = (
        prior.alpha * np.log(prior.beta) - math.lgamma(prior.alpha)
        - (prior.alpha + 1.0) * np.log(params.sigma2) - prior.beta / params.sigma2
    )
    return float(ln_mu + ln_W + ln_s)


def local_objective(
    data: Mapping[str, np.ndarray],
    params: Mapping[str, ViewParams],
    prior: GlobalParams | None,
) -> float:
    """Local MAP objective J_c(theta_c) of §3.

    J_c = sum_n ln p(t_n^{O_n} | theta_c) + sum_{k in K_c} [ln p(mu_k) + ln p(W_k) + ln p(sigma2_k)],

    with x integrated out (§10 formula) and the prior terms over the views of ``data``;
    ``prior`` None gives the log-likelihood alone.
    """
    check_model(params, "params")
    site = check_views(data, what="site data", dims={k: p.dim for k, p in params.items()})
    value = float(marginal_loglik_rows(site, params).sum())
    if prior is not None:
        for name in site.views:
            if name not in prior:
                raise ValueError(f"prior: view {name!r} is missing")
            value += log_prior(params[name], prior[name])
    return value
