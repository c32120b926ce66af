"""Anomaly scores of the GGM mixture (spec §6, O12, O13).

All functions take a site's test samples ``X`` ``(n, M)`` in the model's (standardised)
coordinates, the shared dictionary ``mu`` ``(K, M)``, ``precision`` ``(K, M, M)`` and the
site's private ``weights`` ``(K,)`` (zero for pruned components).
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from .ggm import log_gaussian, responsibilities

__all__ = ["score_expected", "score_logloss", "variable_scores"]

_LOG_2PI = np.log(2.0 * np.pi)


def score_expected(X: np.ndarray, mu: np.ndarray, precision: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Eq. (20): ``a^s(x) = sum_k r_k^s(x) {-ln N(x | mu_k, Lambda_k^{-1})}``, shape (n,).

    Equals ``-ln p^s(x) - KL(r^s(x) || pi^s)`` (spec §6.1).
    """
    log_dens = log_gaussian(X, mu, precision)
    resp = responsibilities(log_dens, weights)
    return -np.sum(resp * np.where(resp > 0, log_dens, 0.0), axis=1)


def score_logloss(X: np.ndarray, mu: np.ndarray, precision: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Eq. (1): ``a^s(x) = -ln sum_k pi_k^s N(x | mu_k, Lambda_k^{-1})``, shape (n,)."""
    log_dens = log_gaussian(X, mu, precision)
    with np.errstate(divide="ignore"):
        logw = np.log(weights)
    return -logsumexp(log_dens + logw, axis=1)


def variable_scores(X: np.ndarray, mu: np.ndarray, precision: np.ndarray, weights: np.ndarray,
                    kind: str = "logloss") -> np.ndarray:
    """Variable-wise scores (spec §6.2) with gating ``g_k = r_k^s(x)`` (O13).

    The conditional of ``x_i`` given the rest under component ``k`` is
    ``N(x_i | u_ki(x), 1/Lambda_k,ii)`` with ``x_i - u_ki(x) = [Lambda_k (x - mu_k)]_i / Lambda_k,ii``.

    ``kind="logloss"``: ``a_i = -ln sum_k r_k(x) N(x_i | u_ki, 1/Lambda_k,ii)``;
    ``kind="expected"``: ``a_i = sum_k r_k(x) [1/2 ln(2pi/Lambda_k,ii) + ([Lambda_k(x-mu_k)]_i)^2/(2 Lambda_k,ii)]``.

    Returns
    -------
    ndarray of shape (n, M)
    """
    if kind not in ("logloss", "expected"):
        raise ValueError(f"variable score kind must be 'logloss' or 'expected', got {kind!r}")
    X = np.asarray(X, dtype=float)
    resp = responsibilities(log_gaussian(X, mu, precision), weights)
    diag = np.diagonal(precision, axis1=1, axis2=2)  # (K, M)
    resid = np.einsum("kij,nkj->nki", precision, X[:, None, :] - mu[None])  # [Lambda_k (x - mu_k)]_i
    cond = -0.5 * _LOG_2PI + 0.5 * np.log(diag)[None] - 0.5 * resid**2 / diag[None]  # ln N(x_i|u_ki, 1/Lambda_ii)
    if kind == "expected":
        return -np.einsum("nk,nki->ni", resp, np.where(resp[:, :, None] > 0, cond, 0.0))
    with np.errstate(divide="ignore"):
        return -logsumexp(cond + np.log(resp)[:, :, None], axis=1)
