"""Tilted moments of one EP site and the device posterior (spec §3.4 "Tilted moments", §4.1).

The tilted distribution of site :math:`k` is

.. math:: q_{\\backslash k}(\\phi,u)\\ \\propto\\ \\mathcal N(\\phi;m_{-k},\\Sigma_{-k})\\,p(u)\\,f_k(\\phi\\mid u),

with :math:`u` the site-local coordinates (e.g. :math:`\\log\\sigma_k`), integrated out by keeping
only the :math:`\\phi` part of the moments. Estimators, chosen by ``method``:

``"exact"``
    Conjugate case (:math:`f_k` Gaussian in :math:`\\phi`): tilted natural parameters are the cavity's
    plus :meth:`conjugate_factor`; exact.
``"quadrature"``
    Tensor Gauss–Hermite rule centred at the Laplace approximation (mode and inverse Hessian) of
    the tilted log density; used when ``p + n_local <= 3`` (``"auto"``). Exact up to quadrature
    error (the ESS of the Gauss–Hermite weights is reported, not tested: it is small by design).
``"importance"``
    Self-normalised importance sampling from the Laplace approximation :math:`\\mathcal N(\\hat z,H^{-1})`
    with antithetic pairs, and the Laplace moments as control variate (the same draws, unweighted,
    estimate the known Laplace mean and covariance; their error is subtracted). When the tilted law
    is nearly Gaussian -- the usual case once the cavity is informative -- the Monte-Carlo error, and
    with it the upward bias of an inverted noisy covariance that parallel EP would add up over all
    sites each round, nearly vanishes. The effective sample size (ESS) is the diagnostic; the site
    fails the round when it falls below ``min_ess``.
``"mcmc"``
    The Bayesian lasso (no closed form): the Gibbs/Metropolis sampler of :mod:`.lasso`, with
    split-:math:`\\hat R` as diagnostic and the unbiased precision :math:`(n-p-2)M^{-1}`.

Every result carries weighted points (or draws) that also give the device posterior of eq. (8):
:math:`\\theta_k` is drawn from the same tilted distribution (cavity, not :math:`q`).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import numpy as np
from scipy import special

from .lasso import sample_lasso_tilted
from .natural import inv_pd, is_pd, moments_from_draws, symmetrise, to_moments, unbiased_precision
from .stats import SiteStats

__all__ = ["TiltedFailure", "TiltedResult", "tilted_moments", "DevicePosterior", "device_posterior", "METHODS"]

#: the ways of computing the tilted moments (``method`` of :func:`tilted_moments`)
METHODS = ("auto", "exact", "quadrature", "importance", "mcmc")


class TiltedFailure(ValueError):
    """The tilted moments of a site could not be estimated reliably this round."""


@dataclass
class TiltedResult:
    """Tilted moments of :math:`\\phi` and the points that represent the tilted distribution.

    Attributes
    ----------
    mean : ndarray, shape (p,)
    cov : ndarray, shape (p, p)
    r, Q : ndarray, shapes (p,), (p, p)
        Tilted natural parameters used in the EP update.
    phi : ndarray, shape (n, p)
        Points or draws of :math:`\\phi`.
    local : ndarray, shape (n, n_local)
    weights : ndarray, shape (n,)
        Normalised weights (equal for MCMC draws).
    theta : ndarray, shape (n, d) or None
        MCMC draws of :math:`\\theta_k` (lasso only).
    method : str
    diagnostics : dict
        ``ess`` (importance/quadrature), ``rhat`` and ``acceptance`` (MCMC).
    gaussian : bool
        The tilted distribution is exactly Gaussian (conjugate case).
    """

    mean: np.ndarray
    cov: np.ndarray
    r: np.ndarray
    Q: np.ndarray
    phi: np.ndarray
    local: np.ndarray
    weights: np.ndarray
    theta: np.ndarray | None
    method: str
    diagnostics: dict = field(default_factory=dict)
    gaussian: bool = False


def _log_tilted(model, stats, cavity_mean, cavity_prec, z):
    p = model.p
    phi, u = z[:, :p], z[:, p:]
    diff = phi - cavity_mean
    out = -0.5 * ((diff @ cavity_prec) * diff).sum(1) + model.local_log_prior(u)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        try:
            ll = model.log_lik(stats, phi, u)
        except np.linalg.LinAlgError:
            ll = np.full(z.shape[0], -np.inf)
    return np.where(np.isfinite(ll), out + ll, -np.inf)


@functools.lru_cache(maxsize=16)
def _stencil(D: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Central-difference stencil of :func:`_derivatives` in D dimensions.

    Returns the first and second unit offsets of every point, ``A, B`` (shape (1 + 2D + 4P, D),
    P = D(D+1)/2 pairs i <= j; point = (x + A h) + B h, as x + E_i + E_j), and the pairs ``I, J``.
    """
    I, J = np.triu_indices(D)
    eye = np.eye(D)
    first = np.repeat(eye[I], 4, axis=0) * np.tile([1.0, 1.0, -1.0, -1.0], I.size)[:, None]
    second = np.repeat(eye[J], 4, axis=0) * np.tile([1.0, -1.0, 1.0, -1.0], I.size)[:, None]
    A = np.concatenate([np.zeros((1, D)), eye, -eye, first])
    B = np.concatenate([np.zeros((1 + 2 * D, D)), second])
    for array in (A, B, I, J):
        array.flags.writeable = False  # shared by every call (cached)
    return A, B, I, J


def _derivatives(logf, x: np.ndarray, h: np.ndarray):
    """Value, gradient and Hessian of ``logf`` at ``x`` by central differences, in one vectorised call.

    The 1 + 2D + 4 D(D+1)/2 points are x, x +- h_i e_i and x +- h_i e_i +- h_j e_j (i <= j).
    """
    D = x.size
    A, B, I, J = _stencil(D)
    vals = logf((x + A * h) + B * h)
    f0 = vals[0]
    quads = vals[1 + 2 * D :].reshape(-1, 4)
    H = np.empty((D, D))
    with np.errstate(invalid="ignore"):  # -inf - -inf: reported as a non-finite derivative
        grad = (vals[1 : 1 + D] - vals[1 + D : 1 + 2 * D]) / (2 * h)
        second = (quads[:, 0] - quads[:, 1] - quads[:, 2] + quads[:, 3]) / (4 * h[I] * h[J])
    H[I, J] = second
    H[J, I] = second
    return f0, grad, H


def _laplace(logf, x0: np.ndarray, max_iter: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Mode and inverse negative Hessian of a vectorised log density (damped Newton, finite differences).

    The full Newton step is tried with the derivatives at the new point, in one call of
    ``logf``: when it is accepted (the usual case) they serve the next iteration.

    Raises
    ------
    TiltedFailure
        If no finite mode with a positive-definite negative Hessian is found.
    """
    x = np.array(x0, dtype=float)
    D = x.size
    h = 1e-3 * np.maximum(1.0, np.abs(x))
    f0, g, H = _derivatives(logf, x, h)
    for _ in range(max_iter):
        if not (np.isfinite(f0) and np.all(np.isfinite(g)) and np.all(np.isfinite(H))):
            raise TiltedFailure("tilted log density is not finite near the current point")
        A = -H
        lam = 0.0
        while not is_pd(A + lam * np.eye(D)):
            lam = max(2 * lam, 1e-6 * max(1.0, float(np.abs(np.diag(A)).max())))
        step = np.linalg.solve(A + lam * np.eye(D), g)
        slope = g @ step
        # full step, with the derivatives there
        x_new = x + step
        h_new = 1e-3 * np.maximum(1.0, np.abs(x_new))
        derivs = _derivatives(logf, x_new, h_new)
        f_new = derivs[0]
        settled = abs(slope) < 1e-9 and lam == 0.0  # a step within rounding of the mode: no line search
        if not settled and not (np.isfinite(f_new) and f_new >= f0 + 1e-4 * slope):
            t = 0.5
            while t > 1e-8:
                x_new = x + t * step
                f_new = logf(x_new[None])[0]
                if np.isfinite(f_new) and f_new >= f0 + 1e-4 * t * slope:
                    break
                t *= 0.5
            else:
                break
            h_new = 1e-3 * np.maximum(1.0, np.abs(x_new))
            derivs = _derivatives(logf, x_new, h_new)
        x, h = x_new, h_new
        if settled:
            break
        f0, g, H = derivs
    H = derivs[2] if x is x_new else H
    try:
        cov = inv_pd(-H, "negative Hessian at the mode")
    except ValueError as exc:
        raise TiltedFailure(str(exc)) from exc
    return x, cov


def tilted_moments(
    model,
    stats: SiteStats,
    cavity_r: np.ndarray,
    cavity_Q: np.ndarray,
    rng: np.random.Generator,
    *,
    method: str = "auto",
    n_nodes: int = 12,
    n_draws: int = 2000,
    min_ess: float = 100.0,
    mcmc: dict | None = None,
    init: dict | None = None,
) -> TiltedResult:
    """Moments of the tilted distribution of one site (module docstring).

    Parameters
    ----------
    model : GaussianHierarchy, BayesianRidge or BayesianLasso
    stats : SiteStats
    cavity_r, cavity_Q : ndarray, shapes (p,), (p, p)
        Cavity natural parameters (``cavity_Q`` positive definite).
    rng : numpy.random.Generator
    method : {"auto", "exact", "quadrature", "importance", "mcmc"}
    n_nodes : int
        Gauss–Hermite nodes per dimension (quadrature).
    n_draws : int
        Importance-sampling draws.
    min_ess : float
        Fewest effective draws/nodes accepted.
    mcmc : dict, optional
        Keyword arguments of :func:`~.lasso.sample_lasso_tilted` (chains, warm-up, draws).
    init : dict, optional
        ``{"phi": (chains, p), "theta": (chains, d)}`` starting points for MCMC.

    Raises
    ------
    TiltedFailure
        When the estimate is unreliable (ESS too small, scatter matrix singular).
    """
    cavity_mean, cavity_cov = to_moments(cavity_r, cavity_Q)
    if method == "auto":
        if not model.closed_form:
            method = "mcmc"
        elif model.is_conjugate:
            method = "exact"
        else:
            method = "quadrature" if model.p + model.n_local <= 3 else "importance"
    if method == "exact":
        if not model.is_conjugate:
            raise ValueError("method='exact' needs a conjugate model (fixed tau, known noise)")
        r_f, Q_f = model.conjugate_factor(stats)
        Q = symmetrise(cavity_Q + Q_f)
        r = cavity_r + r_f
        mean, cov = to_moments(r, Q)
        # sigma points reproduce the first two moments of anything linear in phi exactly
        L = np.linalg.cholesky(cov)
        p = mean.size
        offsets = np.sqrt(p) * np.concatenate([L.T, -L.T])
        pts = mean + offsets
        return TiltedResult(mean, cov, r, Q, pts, np.zeros((2 * p, 0)), np.full(2 * p, 0.5 / p), None, "exact", {}, True)
    if method == "mcmc":
        if model.closed_form:
            raise ValueError("method='mcmc' is implemented for the Bayesian lasso only")
        init = init or {}
        draws = sample_lasso_tilted(
            stats, cavity_mean, cavity_cov, rng, init_phi=init.get("phi"), init_theta=init.get("theta"), **(mcmc or {})
        )
        phi = draws.phi.reshape(-1, model.p)
        try:
            r, Q = unbiased_precision(phi)
        except ValueError as exc:
            raise TiltedFailure(str(exc)) from exc
        mean, cov = moments_from_draws(phi)
        n = phi.shape[0]
        return TiltedResult(
            mean, cov, r, Q, phi, np.zeros((n, 0)), np.full(n, 1.0 / n), draws.theta.reshape(n, -1), "mcmc",
            {"rhat": draws.rhat, "acceptance": draws.acceptance, "last_phi": draws.phi[:, -1], "last_theta": draws.theta[:, -1]},
        )
    if method not in ("quadrature", "importance"):
        raise ValueError(f"unknown tilted-moment method {method!r}; one of {METHODS}")

    def logf(z):
        return _log_tilted(model, stats, cavity_mean, cavity_Q, z)

    x0 = np.concatenate([cavity_mean, model.local_start(stats)])
    mode, lap_cov = _laplace(logf, x0)
    D = mode.size
    L = np.linalg.cholesky(lap_cov)
    if method == "quadrature":
        x, w = special.roots_hermite(n_nodes)
        grid = np.array(list(itertools.product(range(n_nodes), repeat=D)))
        xs = x[grid]
        z = mode + np.sqrt(2.0) * xs @ L.T
        log_w = np.log(w[grid]).sum(1) + (xs**2).sum(1) + logf(z)
    else:
        half = max(n_draws // 2, 1)
        xi = rng.standard_normal((half, D))
        eps = xi @ L.T
        z = mode + np.concatenate([eps, -eps])  # antithetic pairs: the plain sample mean is the mode
        # log N(z; mode, L L^T) with L^{-1}(z - mode) = +-xi: no second factorisation or solve
        log_q = -0.5 * (xi * xi).sum(1) - np.log(np.diag(L)).sum() - 0.5 * D * np.log(2.0 * np.pi)
        log_w = logf(z) - np.concatenate([log_q, log_q])
    if not np.any(np.isfinite(log_w)):
        raise TiltedFailure("tilted density is not finite at any point")
    log_w = np.where(np.isfinite(log_w), log_w, -np.inf)
    weights = np.exp(log_w - log_w.max())
    weights /= weights.sum()
    ess = float(1.0 / np.sum(weights**2))
    if method == "importance" and ess < min_ess:
        raise TiltedFailure(f"effective sample size {ess:.1f} is below {min_ess}")
    phi = np.ascontiguousarray(z[:, : model.p])
    mean, cov = moments_from_draws(phi, weights)
    if method == "importance":
        # control variate: the same draws, unweighted, estimate the known Laplace moments
        plain_mean, plain_cov = moments_from_draws(phi)
        mean = mean - plain_mean + mode[: model.p]
        cov = symmetrise(cov - plain_cov + lap_cov[: model.p, : model.p])
    try:
        Q = inv_pd(cov, "tilted covariance")
    except ValueError as exc:
        raise TiltedFailure(str(exc)) from exc
    return TiltedResult(mean, cov, Q @ mean, Q, phi, z[:, model.p :], weights, None, method, {"ess": ess})


@dataclass
class DevicePosterior:
    """Posterior of one device's coefficients (spec §4.1).

    Attributes
    ----------
    mean : ndarray, shape (d,)
    cov : ndarray, shape (d, d)
    draws : ndarray, shape (n_draws, d)
    """

    mean: np.ndarray
    cov: np.ndarray
    draws: np.ndarray


def device_posterior(model, stats: SiteStats, tilted: TiltedResult, rng: np.random.Generator, n_draws: int = 4000) -> DevicePosterior:
    """Spec eq. (8): :math:`p(\\theta_k\\mid Y_{1:K})\\approx\\int q_{-k}(\\phi)p(Y_k\\mid\\theta_k,\\phi)p(\\theta_k\\mid\\phi)d\\phi`.

    ``tilted`` must have been computed under the site's cavity (or under the full :math:`q`
    for a new device, spec §4.3). For closed-form models the moments are Rao–Blackwellised
    over the tilted points, :math:`E[\\theta]=\\sum_iw_im_i`,
    :math:`\\mathrm{Cov}=\\sum_iw_i(C_i+m_im_i^\\top)-E[\\theta]E[\\theta]^\\top`, and draws come from
    the mixture (from the exact Gaussian tilted law in the conjugate case). For the lasso the
    MCMC draws of :math:`\\theta_k` are used.
    """
    if tilted.theta is not None:
        mean, cov = moments_from_draws(tilted.theta)
        return DevicePosterior(mean, cov, tilted.theta)
    m, C = model.theta_conditional(stats, tilted.phi, tilted.local)
    w = tilted.weights
    mean = w @ m
    cov = symmetrise(np.einsum("n,nij->ij", w, C) + np.einsum("n,ni,nj->ij", w, m, m) - np.outer(mean, mean))
    # C may be singular on fixed coordinates: draw through an eigen-decomposition, computed once
    # per distinct point (conjugate case: C does not depend on phi, one decomposition)
    if tilted.gaussian:
        phi = rng.multivariate_normal(tilted.mean, tilted.cov, size=n_draws)
        m_d, _ = model.theta_conditional(stats, phi, np.zeros((n_draws, 0)))
        which, C_u = np.zeros(n_draws, dtype=int), C[:1]
    else:
        idx = rng.choice(len(w), size=n_draws, p=w)
        used, which = np.unique(idx, return_inverse=True)
        m_d, C_u = m[idx], C[used]
    vals, vecs = np.linalg.eigh(C_u)
    z = rng.standard_normal(m_d.shape) * np.sqrt(np.clip(vals[which], 0.0, None))
    draws = m_d + np.einsum("nij,nj->ni", vecs[which], z)
    return DevicePosterior(mean, cov, draws)
