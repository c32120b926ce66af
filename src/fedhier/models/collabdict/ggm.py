"""Sparse Gaussian graphical model mixture: local and global updates (spec §5).

Shapes: ``X`` is ``(n, M)``; a dictionary of ``K`` patterns is ``mu`` ``(K, M)`` and
``precision`` ``(K, M, M)``; ``weights`` (a site's ``pi^s``) is ``(K,)``; ``active`` is a
boolean ``(K,)`` mask of the components that survived pruning.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.special import logsumexp
from sklearn import config_context
from sklearn.covariance import graphical_lasso
from sklearn.exceptions import ConvergenceWarning

__all__ = [
    "log_gaussian",
    "responsibilities",
    "sufficient_statistics",
    "local_update",
    "mean_update",
    "scatter_matrix",
    "solve_precision",
    "glasso_admm",
    "global_update",
    "pack_symmetric",
    "unpack_symmetric",
    "initial_dictionary",
    "l0_weights",
]

_LOG_2PI = np.log(2.0 * np.pi)


def log_gaussian(X: np.ndarray, mu: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """``ln N(x^(n) | mu_k, Lambda_k^{-1})`` for every sample and component (spec §5.2).

    ``-M/2 ln 2pi + 1/2 ln det Lambda_k - 1/2 (x - mu_k)^T Lambda_k (x - mu_k)``.

    Returns
    -------
    ndarray of shape (n, K)
    """
    X = np.asarray(X, dtype=float)
    n_features = X.shape[1]
    out = np.empty((X.shape[0], mu.shape[0]))
    for k in range(mu.shape[0]):
        sign, logdet = np.linalg.slogdet(precision[k])
        if sign <= 0:
            raise ValueError(f"GGM mixture: precision of component {k} is not positive definite")
        diff = X - mu[k]
        maha = np.einsum("ni,ij,nj->n", diff, precision[k], diff)
        out[:, k] = -0.5 * n_features * _LOG_2PI + 0.5 * logdet - 0.5 * maha
    return out


def responsibilities(log_dens: np.ndarray, weights: np.ndarray, active: np.ndarray | None = None) -> np.ndarray:
    """Eq. (12)/(18) in the log domain: ``r_k = pi_k N_k / sum_l pi_l N_l``.

    Parameters
    ----------
    log_dens : ndarray of shape (n, K)
    weights : ndarray of shape (K,)
    active : ndarray of bool, shape (K,), optional
        Inactive (pruned) components get ``r = 0``.

    Returns
    -------
    ndarray of shape (n, K)
    """
    with np.errstate(divide="ignore"):
        logw = np.log(np.asarray(weights, dtype=float))
    if active is not None:
        logw = np.where(active, logw, -np.inf)
    joint = log_dens + logw
    total = logsumexp(joint, axis=1, keepdims=True)
    far = np.isneginf(total[:, 0])  # a row no component can produce (its densities underflow to 0)
    if far.any():  # then the mixture weights, so that its scores are +inf instead of nan
        joint[far], total[far] = logw, logsumexp(logw)
    return np.exp(joint - total)


def sufficient_statistics(X: np.ndarray, resp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eq. (13): ``N_k = sum_n r_k``, ``m_k = sum_n r_k x``, ``C_k = sum_n r_k x x^T``.

    Returns
    -------
    n : ndarray (K,)
    m : ndarray (K, M)   unnormalised first moments
    c : ndarray (K, M, M) unnormalised second moments
    """
    n = resp.sum(axis=0)
    m = resp.T @ X
    c = np.einsum("nk,ni,nj->kij", resp, X, X)
    return n, m, c


def local_update(X: np.ndarray, mu: np.ndarray, precision: np.ndarray, weights: np.ndarray,
                 active: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """`local_update` of Algorithm 1 for the GGM mixture (spec §5.2, Eqs. (12)-(13)).

    Returns
    -------
    resp : ndarray (n, K)
        ``r_k^{s(n)}``.
    weights : ndarray (K,)
        ML update ``pi_k^s = N_k^s / N^s`` (zero on inactive components).
    stats : tuple
        ``(N^s, m^s, C^s)`` of :func:`sufficient_statistics`.
    """
    resp = responsibilities(log_gaussian(X, mu, precision), weights, active)
    stats = sufficient_statistics(X, resp)
    return resp, stats[0] / X.shape[0], stats


def mean_update(n_bar: np.ndarray, m_bar: np.ndarray, lambda0: float, m0: np.ndarray) -> np.ndarray:
    """Eq. (15): ``mu_k = (lambda0 m0 + Nbar_k mbar_k) / (lambda0 + Nbar_k)``, shape (K, M)."""
    return (lambda0 * m0 + n_bar[:, None] * m_bar) / (lambda0 + n_bar[:, None])


def scatter_matrix(n_bar: np.ndarray, m_bar: np.ndarray, c_bar: np.ndarray, lambda0: float,
                   m0: np.ndarray) -> np.ndarray:
    """``Sigma_k = Cbar_k - mbar mbar^T + lambda0/(lambda0+Nbar_k) (mbar - m0)(mbar - m0)^T`` (§5.4)."""
    d = m_bar - m0
    shrink = lambda0 / (lambda0 + n_bar)
    sigma = c_bar - np.einsum("ki,kj->kij", m_bar, m_bar) + shrink[:, None, None] * np.einsum("ki,kj->kij", d, d)
    return 0.5 * (sigma + np.swapaxes(sigma, 1, 2))


def _psd_floor(sigma: np.ndarray, rel_floor: float = 1e-8) -> np.ndarray:
    """Raise eigenvalues of a symmetric matrix to ``rel_floor * max(1, mean diagonal)``.

    A numerical safeguard [R]: ``Sigma_k`` is positive semi-definite when the statistics
    are exact sums of samples, but the l-diversity mitigation (O15) perturbs ``m_k^s``
    without ``C_k^s``, which can make it indefinite.  Unchanged when already well
    conditioned.
    """
    vals, vecs = np.linalg.eigh(sigma)
    floor = rel_floor * max(1.0, float(np.mean(np.diag(sigma))))
    if vals.min() >= floor:
        return sigma
    return (vecs * np.maximum(vals, floor)) @ vecs.T


def solve_precision(sigma: np.ndarray, n_bar: float, rho: float, *, tol: float = 1e-4,
                    max_iter: int = 100) -> np.ndarray:
    """Eq. (16) for one component with scikit-learn's graphical lasso (spec §5.4, O19).

    ``argmax_Lambda (Nbar+1)/Nbar ln det Lambda - Tr(Lambda Sigma) - rho/Nbar ||Lambda||_1``
    equals ``argmin -ln det Lambda + Tr(Lambda S~) + alpha ||Lambda||_1`` with
    ``S~ = Nbar/(Nbar+1) Sigma`` and ``alpha = rho/(Nbar+1)``; the diagonal is penalised
    by passing ``S~ + alpha I`` to the off-diagonal-only solver.

    Returns
    -------
    ndarray of shape (M, M)
    """
    if n_bar <= 0:
        raise ValueError(f"GGM mixture: effective count must be positive, got {n_bar}")
    alpha = rho / (n_bar + 1.0)
    s_tilde = n_bar / (n_bar + 1.0) * _psd_floor(sigma) + alpha * np.eye(sigma.shape[0])
    if alpha == 0.0:
        return np.linalg.inv(s_tilde)
    # the arguments are ours: checking their types costs scikit-learn a quarter of a small problem's time, paid
    # by every site at every round (the input's values are still checked)
    with warnings.catch_warnings(), config_context(skip_parameter_validation=True):
        warnings.simplefilter("ignore", ConvergenceWarning)
        try:
            _, prec = graphical_lasso(s_tilde, alpha, mode="cd", tol=tol, enet_tol=tol, max_iter=max_iter)
        except FloatingPointError:
            # scikit-learn refuses some badly scaled inputs; solve the same problem by ADMM instead
            prec = glasso_admm(s_tilde - alpha * np.eye(sigma.shape[0]), alpha)
    return 0.5 * (prec + prec.T)


def glasso_admm(s: np.ndarray, alpha: float, *, tol: float = 1e-8, max_iter: int = 5000) -> np.ndarray:
    """``argmin_{Theta > 0} -ln det Theta + Tr(Theta S) + alpha ||Theta||_1`` (diagonal included) by ADMM.

    Boyd et al. (2011, §6.5): ``Theta`` from the eigen-decomposition of ``rho (Z - U) - S``,
    ``Z`` by soft-thresholding, scaled dual ``U``; the penalty parameter ``rho`` is adapted
    by residual balancing.  Returns the sparse iterate ``Z``, shape ``(M, M)``.
    """
    m = s.shape[0]
    z = np.diag(1.0 / np.maximum(np.diag(s) + alpha, 1e-12))
    u = np.zeros_like(s)
    rho = 1.0
    for _ in range(max_iter):
        d, q = np.linalg.eigh(rho * (z - u) - s)
        theta = (q * ((d + np.sqrt(d * d + 4.0 * rho)) / (2.0 * rho))) @ q.T
        z_old = z
        v = theta + u
        z = np.sign(v) * np.maximum(np.abs(v) - alpha / rho, 0.0)
        u = u + theta - z
        primal = np.linalg.norm(theta - z)
        dual = rho * np.linalg.norm(z - z_old)
        scale = max(np.linalg.norm(theta), np.linalg.norm(z), 1.0)
        if primal <= tol * m * scale and dual <= tol * m * max(rho * np.linalg.norm(u), 1.0):
            break
        if primal > 10 * dual:
            rho, u = 2.0 * rho, u / 2.0
        elif dual > 10 * primal:
            rho, u = rho / 2.0, u * 2.0
    return z


def global_update(n_bar: np.ndarray, m_bar: np.ndarray, c_bar: np.ndarray, *, rho: float, lambda0: float,
                  m0: np.ndarray, active: np.ndarray,
                  glasso_tol: float = 1e-4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`optimize` of Algorithm 1 (spec §5.4): Eqs. (15) and (16) for every active component.

    Parameters
    ----------
    n_bar : ndarray (K,)      ``Nbar_k = sum_s N_k^s``
    m_bar : ndarray (K, M)    ``sum_s m_k^s / Nbar_k``
    c_bar : ndarray (K, M, M) ``sum_s C_k^s / Nbar_k``
    active : ndarray of bool (K,)
        Components to update (the others are returned as NaN-free placeholders: zeros
        for ``mu`` and identities for ``precision``).
    glasso_tol : float
        Duality-gap tolerance of the graphical lasso.

    Returns
    -------
    mu : ndarray (K, M)
    precision : ndarray (K, M, M)
    sigma : ndarray (K, M, M)
    """
    n_comp, n_features = m_bar.shape
    mu = np.zeros((n_comp, n_features))
    precision = np.tile(np.eye(n_features), (n_comp, 1, 1))
    sigma = np.tile(np.eye(n_features), (n_comp, 1, 1))
    idx = np.flatnonzero(active)
    mu[idx] = mean_update(n_bar[idx], m_bar[idx], lambda0, m0)
    sigma[idx] = scatter_matrix(n_bar[idx], m_bar[idx], c_bar[idx], lambda0, m0)
    for k in idx:
        precision[k] = solve_precision(sigma[k], float(n_bar[k]), rho, tol=glasso_tol)
    return mu, precision, sigma


def pack_symmetric(c: np.ndarray) -> np.ndarray:
    """Upper triangles of ``(K, M, M)`` symmetric matrices, shape ``(K, M(M+1)/2)`` (§3.5)."""
    iu = np.triu_indices(c.shape[-1])
    return c[..., iu[0], iu[1]]


def unpack_symmetric(packed: np.ndarray, n_features: int) -> np.ndarray:
    """Inverse of :func:`pack_symmetric`."""
    iu = np.triu_indices(n_features)
    out = np.zeros(packed.shape[:-1] + (n_features, n_features))
    out[..., iu[0], iu[1]] = packed
    out[..., iu[1], iu[0]] = packed
    return out


def initial_dictionary(n_components: int, n_features: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Spec §5.6 step 2: common-seed ``mu_k ~ N(0, I)``, ``Lambda_k = I`` (standardised data)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(4,))))
    return rng.standard_normal((n_components, n_features)), np.tile(np.eye(n_features), (n_components, 1, 1))


def l0_weights(counts: np.ndarray, tau: float, floor: float) -> np.ndarray:
    """Optional l0-sparse mixture weights (spec §5.5, [E+R] reconstruction).

    Maximises ``sum_k N_k ln pi_k - tau ||pi||_0`` over epsilon-sparse weights: for each
    ``j`` the active set is the ``j`` largest counts, active weights are
    ``(1 - (K-j) floor) N_k / sum_T N_l`` (required ``>= floor``), the rest get ``floor``.

    Parameters
    ----------
    counts : ndarray (K,)   ``N_k^s``
    tau : float             l0 penalty
    floor : float           ``epsilon_pi``, e.g. ``1/(100 K)``

    Returns
    -------
    ndarray (K,) summing to one
    """
    counts = np.asarray(counts, dtype=float)
    n_comp = counts.size
    if not 0.0 < floor * n_comp < 1.0:
        raise ValueError(f"l0 weights: floor must lie in (0, 1/K), got {floor}")
    order = np.argsort(-counts, kind="stable")
    best, best_value = None, -np.inf
    for j in range(1, n_comp + 1):
        on = order[:j]
        total = counts[on].sum()
        if total <= 0:
            continue
        pi = np.full(n_comp, floor)
        pi[on] = (1.0 - (n_comp - j) * floor) * counts[on] / total
        if np.any(pi[on] < floor):
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            value = float(np.sum(np.where(counts > 0, counts * np.log(pi), 0.0))) - tau * j
        if value > best_value:
            best, best_value = pi, value
    if best is None:
        return np.full(n_comp, 1.0 / n_comp)
    return best
