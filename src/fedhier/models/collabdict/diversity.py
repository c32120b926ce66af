"""Internal leakage monitor: entropy l-diversity of the shared means (spec §11, O14, O15).

Site ``s`` checks, after ``local_update`` and before entering consensus, how many of its
samples effectively stand behind each shared first moment
``m_k^s = N_k^s sum_n g_k^s(n) x^(n)``.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from .ggm import log_gaussian

__all__ = ["sample_weights_entropy", "paper_sample_weights_entropy", "diversity_level", "mitigation_noise"]


def _entropy_from_log_weights(log_g: np.ndarray) -> np.ndarray:
    """``H = -sum_n g ln g`` per column of normalised log weights ``(n, K)``."""
    g = np.exp(log_g)
    return -np.sum(g * np.where(g > 0, log_g, 0.0), axis=0)


def sample_weights_entropy(resp: np.ndarray) -> np.ndarray:
    """``H_k^s`` with the recommended ``g_k^s(n) = r_k^{s(n)} / N_k^s`` [R], shape (K,).

    Computed in the log domain; components with ``N_k^s = 0`` (nothing shared) get
    ``H = ln N^s``, the maximum.
    """
    n_samples = resp.shape[0]
    with np.errstate(divide="ignore"):
        log_r = np.log(resp)
    log_n = logsumexp(log_r, axis=0)
    out = np.full(resp.shape[1], np.log(n_samples))
    used = np.isfinite(log_n)
    out[used] = _entropy_from_log_weights(log_r[:, used] - log_n[used])
    return out


def paper_sample_weights_entropy(X: np.ndarray, mu: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """``H_k^s`` with the paper's Eq. (47) ``g_k^s(n) ∝ N(x^(n) | mu_k, Lambda_k^{-1})`` [P], shape (K,)."""
    log_dens = log_gaussian(X, mu, precision)
    return _entropy_from_log_weights(log_dens - logsumexp(log_dens, axis=0, keepdims=True))


def diversity_level(entropy: np.ndarray, active: np.ndarray | None = None, rule: str = "min") -> float:
    """``E^s``: ``min_k H_k^s`` [R, default] or ``max_k H_k^s`` [P] over active components.

    A breach is ``E^s < ln(l_0)`` with ``l_0`` capped at ``N^s``.
    """
    h = entropy if active is None else entropy[active]
    if rule == "min":
        return float(np.min(h))
    if rule == "max":
        return float(np.max(h))
    raise ValueError(f"l-diversity rule must be 'min' or 'max', got {rule!r}")


def mitigation_noise(precision: np.ndarray, n_bar: np.ndarray, lambda0: float,
                     rng: np.random.Generator) -> np.ndarray:
    """O15: ``zeta_k ~ N(0, lambda_k Lambda_k^{-1})`` to add to ``m_k^s`` on a breach, shape (K, M).

    Zero-mean, so ``mbar_k`` stays unbiased; it moves ``w_k`` by ``zeta_k / lambda_k`` with
    covariance ``(lambda_k Lambda_k)^{-1}``, the posterior covariance of Eq. (42).
    """
    n_comp, n_features = precision.shape[:2]
    out = np.empty((n_comp, n_features))
    for k in range(n_comp):
        lam = lambda0 + n_bar[k]
        chol = np.linalg.cholesky(precision[k] / lam)  # L L^T = Lambda_k / lambda_k
        out[k] = np.linalg.solve(chol.T, rng.standard_normal(n_features))  # cov lambda_k Lambda_k^{-1}
    return out
