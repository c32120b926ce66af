"""Site data and the local sufficient statistics of a linear regression (spec §1, §3.2).

The library takes each site's design the scikit-learn way, ``X`` of shape ``(n_k, d)`` with
one row per observation; the spec's :math:`X_k` (one column per observation) is ``X.T``.
Everything HM2 needs from a site is :math:`X_kX_k^\\top`, :math:`X_kY_k`, :math:`Y_k^\\top Y_k`
and :math:`N_k` (spec §3.2); these never leave the site.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SiteStats", "check_site", "check_sites"]


def check_site(X, y, *, site: int | str = 0, n_features: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(X, y)`` as float arrays of shapes ``(n, d)`` and ``(n,)``.

    Raises
    ------
    ValueError
        Naming the site when the shapes disagree, the site is empty, values are not finite
        or the number of features differs from ``n_features``.
    """
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    if X.ndim != 2:
        raise ValueError(f"site {site}: X must be 2-D (n_samples, n_features), got shape {X.shape}")
    if y.ndim != 1:
        raise ValueError(f"site {site}: y must be 1-D (n_samples,), got shape {y.shape}")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"site {site}: X has {X.shape[0]} rows but y has {y.shape[0]} values")
    if X.shape[0] == 0:
        raise ValueError(f"site {site}: no observations")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"site {site}: X has {X.shape[1]} features, expected {n_features}")
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
        raise ValueError(f"site {site}: X or y contains NaN or inf")
    return X, y


def check_sites(sites) -> list[tuple[np.ndarray, np.ndarray]]:
    """Validate a list of ``(X, y)`` pairs with a common number of features (at least 2 sites)."""
    sites = list(sites)
    if len(sites) < 1:
        raise ValueError("no sites given")
    out = []
    d = None
    for k, pair in enumerate(sites):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"site {k}: expected an (X, y) pair, got {type(pair).__name__}")
        X, y = check_site(pair[0], pair[1], site=k, n_features=d)
        d = X.shape[1]
        out.append((X, y))
    return out


@dataclass(frozen=True)
class SiteStats:
    """Sufficient statistics of one site (spec §3.2).

    Attributes
    ----------
    n : int
        :math:`N_k`.
    xx : ndarray, shape (d, d)
        :math:`X_kX_k^\\top` (``X.T @ X`` for row-major ``X``).
    xy : ndarray, shape (d,)
        :math:`X_kY_k`.
    yy : float
        :math:`Y_k^\\top Y_k`.
    """

    n: int
    xx: np.ndarray
    xy: np.ndarray
    yy: float

    @classmethod
    def from_data(cls, X, y, *, site: int | str = 0) -> "SiteStats":
        X, y = check_site(X, y, site=site)
        return cls(n=int(X.shape[0]), xx=X.T @ X, xy=X.T @ y, yy=float(y @ y))

    @property
    def d(self) -> int:
        return int(self.xy.shape[0])
