"""Baselines of spec §6: Separate, Centralised, FedAvg (server mean), Ditto, and MixedLM.

FedAvg runs through :class:`fedhier.protocol.fedlin.FedAvgProtocol`; this module holds the
local pieces and the closed forms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hm1 import local_steps

__all__ = ["fit_separate", "fit_centralised_ols", "ditto_personalise", "mixedlm_pooled", "MixedLMFit"]


def fit_separate(sites, *, eta: float, n_steps: int, batch_size: int | None = None, gradient: str = "sum", rng=None) -> np.ndarray:
    """Separate baseline: each site runs :math:`C\\cdot T` local steps from 0, no communication.

    Returns :math:`\\Theta`, shape (d, K).
    """
    cols = []
    for X, y in sites:
        cols.append(local_steps(X, y, np.zeros(X.shape[1]), eta=eta, n_steps=n_steps, batch_size=batch_size, gradient=gradient, rng=rng))
    return np.stack(cols, axis=1)


def fit_centralised_ols(sites) -> np.ndarray:
    """Least squares on the pooled data (one :math:`\\theta` for all sites), shape (d,)."""
    X = np.vstack([X for X, _ in sites])
    y = np.concatenate([y for _, y in sites])
    return np.linalg.lstsq(X, y, rcond=None)[0]


def ditto_personalise(X: np.ndarray, y: np.ndarray, theta_global: np.ndarray, lam: float) -> np.ndarray:
    """Ditto as described in the paper (spec §6), closed form:
    :math:`v_k=(2X_kX_k^\\top/N_k+\\lambda I)^{-1}(2X_kY_k/N_k+\\lambda\\bar\\theta)`; shape (d,)."""
    n, d = X.shape
    A = 2.0 * X.T @ X / n + lam * np.eye(d)
    return np.linalg.solve(A, 2.0 * X.T @ y / n + lam * theta_global)


@dataclass
class MixedLMFit:
    """Result of :func:`mixedlm_pooled`.

    Attributes
    ----------
    fe, se : ndarray, shape (d,)
        Fixed effects and their standard errors.
    random_effects : ndarray, shape (K, r)
        Predicted random effects (BLUPs) per site.
    cov_re : ndarray, shape (r, r)
        Random-effects covariance.
    scale : float
        Residual variance.
    """

    fe: np.ndarray
    se: np.ndarray
    random_effects: np.ndarray
    cov_re: np.ndarray
    scale: float

    def site_coef(self, random: list[int]) -> np.ndarray:
        """Per-site coefficients ``fe`` plus the BLUPs on the ``random`` columns, shape (K, d)."""
        out = np.tile(self.fe, (self.random_effects.shape[0], 1))
        out[:, random] += self.random_effects
        return out


def mixedlm_pooled(sites, *, random: list[int] | None = None) -> MixedLMFit:
    """statsmodels MixedLM (REML) on the pooled data: the centralised hierarchical anchor.

    Parameters
    ----------
    sites : list of (X (n_k, d), y (n_k,))
    random : list of int, optional
        Columns with site-level random effects (default: column 0, a random intercept).

    Uses Powell's method first (the default gradient optimisers stall on the radon data), then
    L-BFGS.
    """
    import statsmodels.api as sm

    random = [0] if random is None else list(random)
    X = np.vstack([X for X, _ in sites])
    y = np.concatenate([y for _, y in sites])
    groups = np.concatenate([np.full(len(y_k), k) for k, (_, y_k) in enumerate(sites)])
    fit = sm.MixedLM(y, X, groups=groups, exog_re=X[:, random]).fit(reml=True, method=["powell", "lbfgs"])
    d = X.shape[1]
    re = np.array([np.asarray(fit.random_effects[k], dtype=float) for k in range(len(sites))])
    return MixedLMFit(np.asarray(fit.fe_params)[:d], np.asarray(fit.bse_fe)[:d], re, np.atleast_2d(np.asarray(fit.cov_re, dtype=float)), float(fit.scale))
