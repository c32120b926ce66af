"""External leakage: Rényi-DP release of the pattern means (spec §10, O16).

The published means are posterior draws ``eta_k ~ N(w_k, (lambda_k Lambda_k)^{-1})``
(Eq. (42)); publishing the MAP ``w_k`` itself carries no guarantee.  Under assumptions
(A1)-(A4) the release of all ``K`` components is ``(1, eps)``-RDP with the paper's
``eps = K B R^2 / (2 lambda0)`` (Eq. (46)) or the tighter
``eps_tight = B R^2 / (2 (lambda0 + N_min))``, and ``(alpha, alpha eps)``-RDP for every
``alpha > 1`` (§10.5), which converts to ``(eps + 2 sqrt(eps ln(1/delta)), delta)``-DP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ...privacy.sampling import NoiseSource

__all__ = [
    "precision_norm_bound",
    "paper_epsilon",
    "tight_epsilon",
    "epsilon_dp",
    "optimal_order",
    "release_pattern_means",
    "dp_event",
]


def precision_norm_bound(sigma: np.ndarray, n_bar: np.ndarray, *, rho: float, n_min: float, n_sites: int,
                         max_site_size: int) -> float:
    """The bound ``B >= ||Lambda_k||_2`` of Theorem 2 (spec §10.4), maximised over components.

    With ``b = M (1 + 1/N_min)``, ``c = rho / (S max_s N^s)``,
    ``F_k = Tr Sigma_k + rho M / Nbar_k`` and ``h_k = max_ij |Sigma_k - I|_ij``:
    ``B_k = max(1, t_k*)`` where ``t_k*`` is the largest root of
    ``g_k(t) = t - (1 + h_k/c) b ln t - (1 + h_k/c) F_k`` (``B_k = 1`` if
    ``g_k(t_0) > 0`` at the minimiser ``t_0 = (1 + h_k/c) b``); root by bisection.

    Parameters
    ----------
    sigma : ndarray (K, M, M)   scatter matrices ``Sigma_k`` of the retained components
    n_bar : ndarray (K,)        ``Nbar_k``
    """
    if rho <= 0 or n_min <= 0:
        raise ValueError(f"precision bound: rho and N_min must be positive, got rho={rho}, N_min={n_min}")
    n_features = sigma.shape[-1]
    b = n_features * (1.0 + 1.0 / n_min)
    c = rho / (n_sites * max_site_size)
    bound = 1.0
    for sig, nk in zip(sigma, n_bar):
        f = np.trace(sig) + rho * n_features / nk
        h = np.max(np.abs(sig - np.eye(n_features)))
        coef = 1.0 + h / c
        t0 = coef * b

        def g(t: float) -> float:
            return t - coef * b * np.log(t) - coef * f

        if g(t0) > 0:
            continue
        lo, hi = t0, 2.0 * t0
        while g(hi) <= 0:
            lo, hi = hi, 2.0 * hi
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if g(mid) <= 0:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-12 * hi:
                break
        bound = max(bound, hi)
    return float(bound)


def paper_epsilon(n_components: int, bound: float, diameter: float, lambda0: float) -> float:
    """Theorem 1, Eq. (46): ``eps = K B R^2 / (2 lambda0)`` for ``(1, eps)``-RDP."""
    if lambda0 <= 0:
        raise ValueError(f"lambda0 must be positive (A3), got {lambda0}")
    return n_components * bound * diameter**2 / (2.0 * lambda0)


def tight_epsilon(bound: float, diameter: float, lambda0: float, n_min: float) -> float:
    """Spec §10.3 [R]: ``eps_tight = B R^2 / (2 (lambda0 + N_min))``."""
    if lambda0 <= 0:
        raise ValueError(f"lambda0 must be positive (A3), got {lambda0}")
    return bound * diameter**2 / (2.0 * (lambda0 + n_min))


def epsilon_dp(eps_kl: float, delta: float, n_releases: int = 1) -> float:
    """``(eps, delta)``-DP from ``(alpha, alpha eps_1)``-RDP (spec §10.5, Mironov17 Prop. 3).

    ``T_r`` releases compose to ``eps_1 = T_r eps_kl``; then
    ``eps_DP = min_{alpha>1} [alpha eps_1 + ln(1/delta)/(alpha-1)] = eps_1 + 2 sqrt(eps_1 ln(1/delta))``.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    eps1 = n_releases * eps_kl
    return eps1 + 2.0 * np.sqrt(eps1 * np.log(1.0 / delta))


def optimal_order(eps_kl: float, delta: float, n_releases: int = 1) -> float:
    """``alpha* = 1 + sqrt(ln(1/delta) / eps_1)`` (spec §10.5)."""
    return 1.0 + np.sqrt(np.log(1.0 / delta) / (n_releases * eps_kl))


def dp_event(eps_kl: float, n_releases: int = 1):
    """The release as a ``dp_accounting`` event.

    A mechanism that is ``(alpha, alpha eps_1)``-RDP for all ``alpha`` has exactly the RDP
    curve of a Gaussian mechanism with noise multiplier ``1/sqrt(2 eps_1)``, so the
    release is ``GaussianDpEvent(1/sqrt(2 eps_kl))`` self-composed ``n_releases`` times.
    """
    import dp_accounting

    event = dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / np.sqrt(2.0 * eps_kl))
    return event if n_releases == 1 else dp_accounting.SelfComposedDpEvent(event, n_releases)


def release_pattern_means(mu_map: np.ndarray, precision: np.ndarray, n_bar: np.ndarray, *, lambda0: float,
                          rng: NoiseSource) -> np.ndarray:
    """Eq. (42): draw ``eta_k ~ N(w_k, (lambda_k Lambda_k)^{-1})``, ``lambda_k = lambda0 + Nbar_k``.

    Parameters
    ----------
    mu_map : ndarray (K, M)       ``w_k`` (= the MAP means of Eq. (15))
    precision : ndarray (K, M, M)
    n_bar : ndarray (K,)
    rng : NoiseSource             the operating system's CSPRNG (:class:`fedhier.privacy.sampling.NoiseSource`) of the
                                  process that publishes the draw; never seeded

    Returns
    -------
    ndarray (K, M)
    """
    out = np.empty_like(mu_map)
    for k in range(mu_map.shape[0]):
        lam = lambda0 + n_bar[k]
        chol = np.linalg.cholesky(lam * precision[k])  # L L^T = lambda_k Lambda_k
        z = rng.standard_normal(mu_map.shape[1])
        out[k] = mu_map[k] + np.linalg.solve(chol.T, z)  # covariance (L L^T)^{-1}
    return out
