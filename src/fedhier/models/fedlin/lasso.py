"""Bayesian lasso site model and its tilted sampler (spec §5, §3.4 "Tilted moments").

Model on one site, :math:`\\phi=(\\log\\lambda,\\log\\sigma^2)`:

.. math:: Y_k\\mid\\theta_k,\\phi\\sim\\mathcal N(X_k^\\top\\theta_k,\\sigma^2I),\\qquad
          \\theta_{kj}\\mid\\phi\\overset{iid}\\sim\\mathrm{Laplace}(0,\\sigma/\\lambda).

The Laplace prior has no closed-form marginal, so the tilted distribution
:math:`q_{-k}(\\phi)\\,p(\\theta_k\\mid\\phi)\\,p(Y_k\\mid\\theta_k,\\phi)` is sampled by MCMC. Instead of
NUTS (not available without Stan) we use the Park & Casella (2008) scale-mixture Gibbs sampler,
:math:`\\theta_{kj}\\mid s_j\\sim\\mathcal N(0,\\sigma^2 s_j)`, :math:`s_j\\sim\\mathrm{Exp}(\\lambda^2/2)`,
with one sweep =

1. :math:`\\phi\\mid\\theta_k` by random-walk Metropolis (``s`` integrated out, adaptive
   proposal covariance during warm-up),
2. :math:`1/s_j\\mid\\theta_k,\\phi\\sim\\text{Inverse-Gaussian}(\\lambda\\sigma/|\\theta_{kj}|,\\lambda^2)`,
3. :math:`\\theta_k\\mid s,\\phi,Y_k\\sim\\mathcal N(A^{-1}X_kY_k,\\sigma^2A^{-1})`, :math:`A=X_kX_k^\\top+\\mathrm{diag}(1/s)`.

Steps 1–2 draw :math:`(\\phi,s)` from :math:`p(\\phi,s\\mid\\theta_k)`, so the chain targets the
tilted joint exactly. Convergence is checked by the split-:math:`\\hat R` of Gelman et al. (BDA3)
over the chains; everything uses the sufficient statistics only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hierarchy import PenalisedHierarchy
from .stats import SiteStats

__all__ = ["BayesianLasso", "LassoDraws", "sample_lasso_tilted", "split_rhat"]


class BayesianLasso(PenalisedHierarchy):
    """HM2 lasso instance (spec §5); :math:`\\phi=(\\log\\lambda,\\log\\sigma^2)` with Gaussian priors."""

    closed_form = False
    is_conjugate = False


@dataclass
class LassoDraws:
    """Output of :func:`sample_lasso_tilted`.

    Attributes
    ----------
    phi : ndarray, shape (n_chains, n_draws, 2)
    theta : ndarray, shape (n_chains, n_draws, d)
    rhat : float
        Largest split-:math:`\\hat R` over the components of :math:`\\phi` and :math:`\\theta_k`.
    acceptance : float
        Metropolis acceptance rate of the :math:`\\phi` step after warm-up.
    """

    phi: np.ndarray
    theta: np.ndarray
    rhat: float
    acceptance: float


def split_rhat(chains: np.ndarray) -> np.ndarray:
    """Split-:math:`\\hat R` (BDA3 §11.4) of ``chains (m, n, ...)``; returns shape ``(...)``."""
    m, n = chains.shape[:2]
    half = n // 2
    x = np.concatenate([chains[:, :half], chains[:, half : 2 * half]], axis=0)
    means = x.mean(axis=1)
    W = x.var(axis=1, ddof=1).mean(axis=0)
    B = half * means.var(axis=0, ddof=1)
    var_plus = (half - 1) / half * W + B / half
    with np.errstate(divide="ignore", invalid="ignore"):
        rhat = np.sqrt(var_plus / W)
    return np.where(W > 0, rhat, 1.0)


def _log_phi_given_theta(stats: SiteStats, theta, phi, cavity_mean, cavity_prec):
    """log of :math:`q_{-k}(\\phi)\\prod_j\\mathrm{Laplace}(\\theta_j;\\sigma/\\lambda)\\,p(Y_k\\mid\\theta_k,\\sigma^2)` per chain."""
    log_lam, log_s2 = phi[:, 0], phi[:, 1]
    sigma = np.exp(0.5 * log_s2)
    lam = np.exp(log_lam)
    diff = phi - cavity_mean
    log_q = -0.5 * np.einsum("ci,ij,cj->c", diff, cavity_prec, diff)
    d = theta.shape[1]
    log_prior = d * (log_lam - np.log(2.0) - 0.5 * log_s2) - lam / sigma * np.abs(theta).sum(1)
    rss = stats.yy - 2.0 * theta @ stats.xy + np.einsum("ci,ij,cj->c", theta, stats.xx, theta)
    log_lik = -0.5 * stats.n * log_s2 - 0.5 * rss / np.exp(log_s2)
    return log_q + log_prior + log_lik


def sample_lasso_tilted(
    stats: SiteStats,
    cavity_mean: np.ndarray,
    cavity_cov: np.ndarray,
    rng: np.random.Generator,
    *,
    n_chains: int = 4,
    n_warmup: int = 500,
    n_draws: int = 500,
    init_phi: np.ndarray | None = None,
    init_theta: np.ndarray | None = None,
) -> LassoDraws:
    """Draw :math:`(\\theta_k,\\phi)` from the lasso tilted distribution (module docstring).

    Parameters
    ----------
    stats : SiteStats
        Site statistics (``xx`` of shape (d, d)).
    cavity_mean, cavity_cov : ndarray, shapes (2,), (2, 2)
        The cavity :math:`q_{-k}(\\phi)`.
    rng : numpy.random.Generator
    n_chains, n_warmup, n_draws : int
        Spec §9 #14 recommends 4 chains x (500 warm-up + 500 draws).
    init_phi, init_theta : ndarray, shapes (n_chains, 2), (n_chains, d), optional
        Starting points, e.g. the previous round's last draws (ep-stan); default: overdispersed
        draws around the cavity mean and zero.

    Returns
    -------
    LassoDraws
    """
    d = stats.d
    cavity_prec = np.linalg.inv(cavity_cov)
    cavity_prec = 0.5 * (cavity_prec + cavity_prec.T)
    if init_phi is None:
        L = np.linalg.cholesky(cavity_cov)
        phi = cavity_mean + rng.standard_normal((n_chains, 2)) @ L.T
        phi[:, 1] = np.log(max(stats.yy / stats.n, 1e-8)) + 0.5 * rng.standard_normal(n_chains)
    else:
        phi = np.array(init_phi, dtype=float, copy=True)
    theta = np.zeros((n_chains, d)) if init_theta is None else np.array(init_theta, dtype=float, copy=True)
    prop_cov = np.tile(0.05 * np.eye(2), (n_chains, 1, 1))
    log_target = _log_phi_given_theta(stats, theta, phi, cavity_mean, cavity_prec)
    out_phi = np.empty((n_chains, n_draws, 2))
    out_theta = np.empty((n_chains, n_draws, d))
    warm_phi = np.empty((n_chains, n_warmup, 2))
    accepted = 0
    eye = np.eye(d)
    for it in range(n_warmup + n_draws):
        # 1. phi | theta  (random-walk Metropolis, s integrated out)
        step = np.einsum("cij,cj->ci", np.linalg.cholesky(prop_cov), rng.standard_normal((n_chains, 2)))
        proposal = phi + step
        log_prop = _log_phi_given_theta(stats, theta, proposal, cavity_mean, cavity_prec)
        accept = np.log(rng.random(n_chains)) < log_prop - log_target
        phi = np.where(accept[:, None], proposal, phi)
        log_target = np.where(accept, log_prop, log_target)
        # 2. latent scales s | theta, phi
        lam = np.exp(phi[:, 0])
        sigma = np.exp(0.5 * phi[:, 1])
        abs_theta = np.maximum(np.abs(theta), 1e-10)
        inv_s = rng.wald(lam[:, None] * sigma[:, None] / abs_theta, np.repeat(lam[:, None] ** 2, d, axis=1))
        inv_s = np.maximum(inv_s, 1e-12)
        # 3. theta | s, phi, Y
        A = stats.xx[None] + inv_s[:, :, None] * eye[None]
        L = np.linalg.cholesky(A)
        w = np.linalg.solve(L, np.broadcast_to(stats.xy, (n_chains, d))[..., None])
        mean = np.linalg.solve(np.swapaxes(L, 1, 2), w)[..., 0]
        z = rng.standard_normal((n_chains, d, 1))
        theta = mean + sigma[:, None] * np.linalg.solve(np.swapaxes(L, 1, 2), z)[..., 0]
        log_target = _log_phi_given_theta(stats, theta, phi, cavity_mean, cavity_prec)
        if it < n_warmup:
            warm_phi[:, it] = phi
            if it >= 49 and (it + 1) % 50 == 0:
                hist = warm_phi[:, it // 2 : it + 1]
                centred = hist - hist.mean(axis=1, keepdims=True)
                emp = np.einsum("cni,cnj->cij", centred, centred) / max(hist.shape[1] - 1, 1)
                prop_cov = (2.38**2 / 2) * emp + 1e-6 * np.eye(2)
        else:
            accepted += int(accept.sum())
            out_phi[:, it - n_warmup] = phi
            out_theta[:, it - n_warmup] = theta
    rhat = float(max(split_rhat(out_phi).max(), split_rhat(out_theta).max()))
    return LassoDraws(out_phi, out_theta, rhat, accepted / max(n_chains * n_draws, 1))
