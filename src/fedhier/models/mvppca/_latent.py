"""Latent posterior and marginal likelihood of multi-view PPCA (spec §4.1, §9, §10).

For a subject with observed views O (§2.2),

    P_O = I_q + sum_{k in O} W_k^T W_k / sigma2_k          (posterior precision)
    b   = sum_{k in O} W_k^T (t_k - mu_k) / sigma2_k        (q,)
    x | t^O ~ N(M_O b, M_O),  M_O = P_O^{-1},

and, by the matrix determinant lemma and Woodbury (§10),

    ln p(t^O) = -1/2 [ d_O ln 2 pi + ln|P_O| + sum_k d_k ln sigma2_k
                       + sum_k ||t_k - mu_k||^2 / sigma2_k - b^T M_O b ].

Only q x q matrices are factorised (one Cholesky per observed-view pattern); the data
enter through one (n_k, d_k) x (d_k, q) product per view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
from ._data import MultiViewData, squared_distances
from ._linalg import inverse_from_factor, log_determinant, spd_factors, spd_inverse, threads_for
from .params import ViewParams

__all__ = ["LatentPosterior", "pattern_precisions", "posterior", "pattern_moments", "marginal_loglik_rows", "check_model", "moments_from_covariance"]

_LOG_2PI = float(np.log(2.0 * np.pi))


def check_model(model: Mapping[str, ViewParams], what: str = "model") -> int:
    """Check a point model (mapping view -> ViewParams) and return its q.

    Raises
    ------
    ValueError
        If the model is empty, views disagree on q, a mu/W shape is inconsistent, or a
        sigma2 is not a positive finite number.
    """
    if not isinstance(model, Mapping) or len(model) == 0:
        raise ValueError(f"{what}: expected a non-empty mapping view name -> ViewParams")
    q = None
    for name, p in model.items():
        W = np.asarray(p.W)
        mu = np.asarray(p.mu)
        if W.ndim != 2 or mu.shape != (W.shape[0],):
            raise ValueError(f"{what}: view {name!r} needs W of shape (d, q) and mu of shape (d,), got {W.shape} and {mu.shape}")
        if q is None:
            q = W.shape[1]
        elif W.shape[1] != q:
            raise ValueError(f"{what}: view {name!r} has {W.shape[1]} latent components, other views have {q}")
        if not (np.isfinite(p.sigma2) and p.sigma2 > 0):
            raise ValueError(f"{what}: view {name!r} has sigma2 = {p.sigma2}; it must be positive and finite")
    return int(q)


@dataclass(frozen=True)
class LatentPosterior:
    """Gaussian posterior of the latent variables of n subjects (§4.1).

    Attributes
    ----------
    means : ndarray of shape (n, q)
        <x_n> = M_{O_n} b_n.
    b : ndarray of shape (n, q)
        sum_{k in O_n} W_k^T (t_k - mu_k) / sigma2_k.
    covariances : ndarray of shape (P, q, q)
        M_O per observed-view pattern (``data.patterns``).
    precision_factors : ndarray of shape (P, q, q)
        L_O with P_O = L_O L_O^T (Cholesky), per pattern.
    """

    means: np.ndarray
    b: np.ndarray
    covariances: np.ndarray
    precision_factors: np.ndarray

    @property
    def logdets(self) -> np.ndarray:
        """ln|P_O| = -ln|M_O| per pattern, shape (P,)."""
        return log_determinant(self.precision_factors)


def pattern_precisions(
    data: MultiViewData,
    W: Mapping[str, np.ndarray],
    sigma2: Mapping[str, float],
    row_covariances: Mapping[str, np.ndarray] | None = None,
) -> np.ndarray:
    """P_O = I_q + sum_{k in O} W_k^T W_k / sigma2_k of every observed-view pattern, shape (P, q, q).

    ``W`` and ``sigma2`` map each view of ``data`` to W_k (d_k, q) and sigma2_k.  With ``row_covariances``
    (view -> Sigma_k, the (q, q) covariance of each row of W_k under its posterior) the expectation over the
    loadings: E[W_k^T W_k] = W_k^T W_k + d_k Sigma_k, so P_O gains sum_{k in O} d_k Sigma_k / sigma2_k.
    """
    gram = {}
    for name in data.views:
        loadings = np.asarray(W[name], dtype=float)
        gram[name] = loadings.T @ (loadings / sigma2[name])
    q = next(iter(gram.values())).shape[0]
    precisions = np.zeros((data.patterns.shape[0], q, q))
    precisions.reshape(-1, q * q)[:, :: q + 1] = 1.0  # I_q in every pattern
    for p in range(precisions.shape[0]):
        for name in data.pattern_views(p):
            precisions[p] += gram[name]
        if row_covariances is not None:
            for name in data.pattern_views(p):
                precisions[p] += data.views[name].dim * row_covariances[name] / sigma2[name]
    return precisions


def posterior(
    data: MultiViewData,
    model: Mapping[str, ViewParams],
    factors: tuple[np.ndarray, np.ndarray] | None = None,
) -> LatentPosterior:
    """Latent posterior of every subject of ``data`` under ``model`` (§4.1, §9).

    Costs one (n_k, d_k) x (d_k, q) product per view and the Cholesky factors of the patterns' precisions:
    ``factors`` = (L, L^{-1}) of :func:`pattern_precisions`, each (P, q, q), when the caller has them
    (:func:`._linalg.spd_factors`), else computed here.  Every view of ``data`` must be in ``model``
    (checked by the caller).
    """
    q = next(iter(model.values())).W.shape[1]
    b = np.zeros((data.n, q))
    for name, block in data.views.items():
        p = model[name]
        scaled = np.asarray(p.W, dtype=float) / p.sigma2
        with threads_for(block.values.size * q):
            proj = block.values @ scaled
        proj -= np.asarray(p.mu, dtype=float) @ scaled
        if block.rows is None:
            b += proj
        else:
            b[block.rows] += proj
    if factors is None:
        factors = spd_factors(pattern_precisions(data, {k: p.W for k, p in model.items()},
                                                 {k: p.sigma2 for k, p in model.items()}))
    covariances = inverse_from_factor(factors[1])
    if data.pattern_rows[0] is None:  # one pattern, every subject's
        means = b @ covariances[0]
    else:
        means = np.empty((data.n, q))
        for p, rows in enumerate(data.pattern_rows):
            means[rows] = b[rows] @ covariances[p]
    return LatentPosterior(means=means, b=b, covariances=covariances, precision_factors=factors[0])


def pattern_moments(data: MultiViewData, post: LatentPosterior) -> tuple[np.ndarray, np.ndarray]:
    """Per observed-view pattern p: sum_{n in p} <x_n x_n^T> = X_p^T X_p + N_p M_p and N_p M_p, each (P, q, q)."""
    n_patterns = data.patterns.shape[0]
    sum_cov = data.pattern_sizes[:, None, None] * post.covariances
    outer = np.empty_like(sum_cov)
    for p in range(n_patterns):
        rows = data.pattern_rows[p]
        X = post.means if rows is None else post.means[rows]
        outer[p] = X.T @ X
    return outer + sum_cov, sum_cov


def marginal_loglik_rows(data: MultiViewData, model: Mapping[str, ViewParams], post: LatentPosterior | None = None) -> np.ndarray:
    """ln p(t^{O_n}) for every subject, x integrated out (§10); 0 for a subject with no view.

    Returns
    -------
    ndarray of shape (n,)
    """
    if post is None:
        post = posterior(data, model)
    twice_neg = np.zeros(data.n)
    for name, block in data.views.items():
        p = model[name]
        term = squared_distances(block.values, np.asarray(p.mu, dtype=float)) / p.sigma2
        term += block.dim * (_LOG_2PI + np.log(p.sigma2))
        if block.rows is None:
            twice_neg += term
        else:
            twice_neg[block.rows] += term
    twice_neg += post.logdets[data.pattern_of]
    twice_neg -= np.einsum("ij,ij->i", post.b, post.means)
    return -0.5 * twice_neg


def moments_from_covariance(
    covariance: np.ndarray, params: Mapping[str, ViewParams], n: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The E-step's sums for complete views with mu_k = t-bar_k, from their joint covariance: no pass over the data.

    With B = [W_k / sigma2_k]_k stacked (d, q) and M = (I_q + sum_k W_k^T W_k / sigma2_k)^{-1}, the
    posterior means are <x_n> = M B^T (t_n - t-bar), so with C = sum_n (t_n - t-bar)(t_n - t-bar)^T / N

        sum_n <x_n x_n^T> = N (M + M B^T C B M),    sum_n (t_nk - t-bar_k) <x_n>^T = N [C B M]_k,

    at O(d^2 q) operations instead of the data's O(N d q).

    Parameters
    ----------
    covariance : ndarray of shape (d, d)
        C of the views side by side, in the order of ``params`` (:func:`fedhier.models.mvppca.start.joint_covariance`).
    params : mapping view -> ViewParams
    n : int
        N, the number of subjects (all have every view).

    Returns
    -------
    second_moment : ndarray of shape (q, q)
        sum_n <x_n x_n^T>.
    cross : dict view -> ndarray of shape (d_k, q)
        sum_n (t_nk - t-bar_k) <x_n>^T.
    """
    B = np.vstack([np.asarray(p.W, dtype=float) / p.sigma2 for p in params.values()])
    W = np.vstack([np.asarray(p.W, dtype=float) for p in params.values()])
    q = B.shape[1]
    precision = W.T @ B
    precision.flat[:: q + 1] += 1.0
    M, _ = spd_inverse(precision)
    CBM = covariance @ B @ M
    second_moment = n * (M + M @ (B.T @ CBM))
    second_moment = 0.5 * (second_moment + second_moment.T)
    edges = np.cumsum([0] + [np.shape(p.W)[0] for p in params.values()])
    cross = {name: n * CBM[edges[j]:edges[j + 1]] for j, name in enumerate(params)}
    return second_moment, cross
