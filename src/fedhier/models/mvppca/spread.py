"""Posterior spread of a site's parameters, for the empirical-Bayes prior update ([R]).

The paper's master step (spec §5.1) estimates the between-site variances from the sites'
*point* estimates, which the local MAP has already shrunk toward the prior:

    sigma2_W~ = sum_c ||W_c - W~||_F^2 / (C_k d_k q).

Shrinkage removes part of the spread, the next round's prior is tighter, the next
estimates are shrunk more, and the variance can fall to zero (docs/mvppca.md).  The EM
update of a random-effect variance adds each site's posterior uncertainty:

    sigma2_W~ = sum_c E||W_c - W~||_F^2 / (C_k d_k q_k)
              = sum_c [ ||W_c - W~||_F^2 + tr Cov(W_c | data_c, theta~) ] / (C_k d_k q_k),

and likewise for mu.  This module computes the traces at one site, from the site's
final (mu, W, sigma2) and the prior it used; only the two scalars travel.

* W (one view, d_k x q_k effective columns): given the latent moments of the E-step the
  rows of W are independent Gaussians with covariance sigma2 (S_xx + Lambda)^{-1},
  S_xx = sum_n <x_n x_n^T> over the subjects with the view, Lambda = diag(sigma2 / sigma2_Wi~)
  (the ridge of step (3)), so column i has tr Cov(w_i) = d_k sigma2 [(S_xx + Lambda)^{-1}]_ii
  and tr Cov(W) is their sum.
* mu (one view): step (1) maximises the view's marginal likelihood plus the prior, whose
  curvature gives Cov(mu) = (N C^{-1} + I / sigma2_mu~)^{-1}, C = W W^T + sigma2 I;
  with e_i the eigenvalues of W W^T (the q of W^T W, then zeros),
  tr Cov(mu) = sum_i 1 / (N / (sigma2 + e_i) + 1 / sigma2_mu~).

Without a prior (round 1) both use a flat prior (lambda = 0, 1 / sigma2_mu~ = 0): the
sampling variance of the maximum-likelihood estimates.

:func:`latent_moment` gives the third quantity the update needs, the site's summed
posterior second moment of the latent variables, sum_n <x_n x_n^T> (q x q), and its subject
count: their sums over sites fix the scale (and once the shape) of W~ (:func:`.master.latent_scale`).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ._data import MultiViewData, check_views
from ._latent import moments_from_covariance, pattern_moments, posterior
from .mstep import effective_columns
from .params import GlobalParams, ViewParams

__all__ = ["posterior_spread", "mean_spread", "loading_spread", "latent_moment", "latent_second_moments"]


def loading_spread(second_moment: np.ndarray, sigma2: float, dim: int, ridge: float | np.ndarray) -> np.ndarray:
    """tr Cov(w_i) = d_k sigma2 [(S_xx + Lambda)^{-1}]_ii for each effective column i.

    Parameters
    ----------
    second_moment : ndarray of shape (q_k, q_k)
        S_xx = sum_n <x_n x_n^T> restricted to the effective columns.
    sigma2 : float
    dim : int
        d_k.
    ridge : float or ndarray of shape (q_k,)
        lambda_i = sigma2 / sigma2_Wi~ (0 without a prior).

    Returns
    -------
    ndarray of shape (q_k,)
    """
    q = second_moment.shape[0]
    if q == 0:
        return np.zeros(0)
    system = second_moment + np.diag(np.broadcast_to(np.asarray(ridge, dtype=float), (q,)))
    return dim * sigma2 * np.diag(np.linalg.inv(system)).copy()


def mean_spread(W: np.ndarray, sigma2: float, n_obs: int, prior_var: float | None) -> float:
    """tr (N C^{-1} + I / sigma2_mu~)^{-1}, C = W W^T + sigma2 I (flat prior when ``prior_var`` is None)."""
    d, q = W.shape
    eig = np.clip(np.linalg.eigvalsh(W.T @ W), 0.0, None)[::-1][: min(d, q)]
    cov_eig = sigma2 + np.concatenate([eig, np.zeros(d - eig.size)])
    precision = n_obs / cov_eig + (0.0 if prior_var is None else 1.0 / prior_var)
    return float(np.sum(1.0 / precision))


def latent_second_moments(
    data: Mapping[str, np.ndarray],
    params: Mapping[str, ViewParams],
    covariance: np.ndarray | None = None,
) -> tuple[MultiViewData, np.ndarray]:
    """The site's checked views and, per observed-view pattern p, sum_{n in p} <x_n x_n^T> under ``params``.

    One pass over the data (the latent posterior), which :func:`posterior_spread` and
    :func:`latent_moment` of the same parameters can share (``given``); none when ``covariance``,
    the joint covariance of complete views with every mu_k = t-bar_k, is given
    (:attr:`.local.LocalFit.covariance`, :func:`._latent.moments_from_covariance`).

    Returns
    -------
    site : MultiViewData
    second_moments : ndarray of shape (P, q, q)
    """
    site = check_views(data, what="site data", dims={k: p.dim for k, p in params.items()})
    if covariance is not None:
        return site, moments_from_covariance(covariance, params, site.n)[0][None]
    return site, pattern_moments(site, posterior(site, params))[0]


def posterior_spread(
    data: Mapping[str, np.ndarray],
    params: Mapping[str, ViewParams],
    prior: GlobalParams | None,
    *,
    columns: bool = False,
    given: tuple[MultiViewData, np.ndarray] | None = None,
) -> dict[str, tuple[float, float | np.ndarray]]:
    """Per view, (tr Cov(mu_k), tr Cov(W_k)) at one site (module docstring).

    Parameters
    ----------
    data : mapping view -> ndarray of shape (n, d_k)
        The site's views (entirely-NaN rows: subject lacks the view).
    params : mapping view -> ViewParams
        The site's fitted theta_c (every view of ``data``).
    prior : GlobalParams or None
        The prior theta~[r-1] the site fitted with; None in round 1 (flat prior).
    columns : bool
        Give tr Cov(W_k) per column, an ndarray of shape (q,) (0 beyond the effective
        columns), instead of its sum.
    given : (MultiViewData, ndarray of shape (P, q, q)), optional
        :func:`latent_second_moments` of ``data`` and ``params``, if already computed.

    Returns
    -------
    dict view -> (float, float or ndarray of shape (q,))
    """
    site, second_moments = latent_second_moments(data, params) if given is None else given
    out = {}
    for j, (name, block) in enumerate(site.views.items()):
        p = params[name]
        W = np.asarray(p.W, dtype=float)
        q_k = effective_columns(block.dim, W.shape[1])
        second = second_moments[np.flatnonzero(site.patterns[:, j])].sum(axis=0)
        g = None if prior is None else prior[name]
        ridge = 0.0 if g is None else p.sigma2 / np.asarray(g.sigma2_W_columns, dtype=float)[:q_k]
        per_column = np.zeros(W.shape[1])
        per_column[:q_k] = loading_spread(second[:q_k, :q_k], p.sigma2, block.dim, ridge)
        out[name] = (
            mean_spread(W, p.sigma2, block.n_obs, None if g is None else g.sigma2_mu),
            per_column if columns else float(per_column.sum()),
        )
    return out


def latent_moment(
    data: Mapping[str, np.ndarray],
    params: Mapping[str, ViewParams],
    *,
    given: tuple[MultiViewData, np.ndarray] | None = None,
) -> tuple[np.ndarray, int]:
    """The site's summed posterior second moment of the latents and its number of subjects.

    sum_n <x_n x_n^T> = sum_n (M_{O_n} + <x_n> <x_n>^T), each subject given its observed
    views O_n (spec §4.1).

    Parameters
    ----------
    data : mapping view -> ndarray of shape (n, d_k)
    params : mapping view -> ViewParams
        The site's fitted theta_c.
    given : (MultiViewData, ndarray of shape (P, q, q)), optional
        :func:`latent_second_moments` of ``data`` and ``params``, if already computed.

    Returns
    -------
    moment : ndarray of shape (q, q)
    n_subjects : int
    """
    site, second_moments = latent_second_moments(data, params) if given is None else given
    return second_moments.sum(axis=0), int(site.n)
