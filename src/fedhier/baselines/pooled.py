"""Centralised anchors: scikit-learn PCA and FactorAnalysis on pooled data (fed-mv-ppca §12.5 extension).

These are what a user tries first when the data *can* be pooled: the sites' training views are
concatenated column-wise (view order of the schema) and stacked row-wise, and one scikit-learn
model with ``n_components`` = q is fitted.  The same interface as the federated estimators:

* ``transform(X)`` -- latent coordinates (n, q): PCA scores, or the FA posterior means;
* ``reconstruct(X)`` -- ``{view: (n, d_view)}``: PCA ``inverse_transform``, or
  ``mean_ + E[z | x] components_`` for FA (the MAE of spec §11 uses it).

They need complete data: a missing view at a site or for a subject raises ``ValueError``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from sklearn.decomposition import PCA, FactorAnalysis

from ..data.validation import check_sites, check_views

__all__ = ["PooledPCA", "PooledFactorAnalysis"]


class _Pooled:
    """Shared pooling logic; subclasses define ``_estimator`` and ``_reconstruct``."""

    label = "pooled model"

    def __init__(self, n_components: int = 5, random_state: int | None = None):
        self.n_components = n_components
        self.random_state = random_state

    def _matrix(self, X: Mapping[str, np.ndarray], where: str) -> np.ndarray:
        for view in self.schema_.names:
            if view not in X:
                raise ValueError(f"{where} lacks view {view!r}: {self.label} needs every view (no missing views)")
            if np.isnan(X[view]).any():
                raise ValueError(f"{where}, view {view!r}: a subject lacks the view; {self.label} needs complete data")
        return np.hstack([X[v] for v in self.schema_.names])

    def fit(self, sites: Sequence[Mapping[str, Any]]):
        """Fit on the rows of all sites pooled (list of ``{view: (n_c, d_view)}``)."""
        sites, self.schema_ = check_sites(sites, n_components=self.n_components, min_subjects=1)
        pooled = np.vstack([self._matrix(site, f"site {s}") for s, site in enumerate(sites)])
        if pooled.shape[0] <= self.n_components:
            raise ValueError(f"{pooled.shape[0]} pooled subjects cannot fit {self.n_components} components")
        self.estimator_ = self._estimator().fit(pooled)
        return self

    def _input(self, X: Mapping[str, Any]) -> np.ndarray:
        if not hasattr(self, "estimator_"):
            raise RuntimeError(f"this {type(self).__name__} is not fitted yet: call fit(sites) first")
        return self._matrix(check_views(X, self.schema_), "X")

    def transform(self, X: Mapping[str, Any]) -> np.ndarray:
        """Latent coordinates (n, q)."""
        return self.estimator_.transform(self._input(X))

    def reconstruct(self, X: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Reconstruction of every view from the latent coordinates, ``{view: (n, d_view)}``."""
        full = self._reconstruct(self._input(X))
        cuts = np.cumsum(self.schema_.dims)[:-1]
        return dict(zip(self.schema_.names, np.split(full, cuts, axis=1)))


class PooledPCA(_Pooled):
    """``sklearn.decomposition.PCA(n_components)`` on the pooled, concatenated views."""

    label = "pooled PCA"

    def _estimator(self):
        return PCA(n_components=self.n_components, random_state=self.random_state)

    def _reconstruct(self, T: np.ndarray) -> np.ndarray:
        return self.estimator_.inverse_transform(self.estimator_.transform(T))


class PooledFactorAnalysis(_Pooled):
    """``sklearn.decomposition.FactorAnalysis(n_components)`` on the pooled, concatenated views."""

    label = "pooled factor analysis"

    def _estimator(self):
        return FactorAnalysis(n_components=self.n_components, random_state=self.random_state)

    def _reconstruct(self, T: np.ndarray) -> np.ndarray:
        fa = self.estimator_
        return fa.mean_ + fa.transform(T) @ fa.components_
