"""Centralised anchors: pooled scikit-learn PCA / FactorAnalysis behind the estimator interface."""

import numpy as np
import pytest
from sklearn.decomposition import PCA, FactorAnalysis

from fedhier.baselines import PooledFactorAnalysis, PooledPCA


def _sites(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(60, 2))
    A, B = rng.normal(size=(2, 5)), rng.normal(size=(2, 3))
    views = {"a": x @ A + 0.1 * rng.normal(size=(60, 5)), "b": x @ B + 0.1 * rng.normal(size=(60, 3))}
    return [{v: X[:25] for v, X in views.items()}, {v: X[25:] for v, X in views.items()}], views


def test_pooled_pca_equals_sklearn_on_the_concatenated_views():
    sites, views = _sites()
    pooled = np.hstack([views["a"], views["b"]])
    ours = PooledPCA(2).fit(sites)
    ref = PCA(2).fit(pooled)
    np.testing.assert_allclose(np.abs(ours.transform(views)), np.abs(ref.transform(pooled)), atol=1e-10)
    rec = ours.reconstruct(views)
    np.testing.assert_allclose(np.hstack([rec["a"], rec["b"]]), ref.inverse_transform(ref.transform(pooled)), atol=1e-10)


def test_pooled_fa_reconstruction_is_the_posterior_mean_map():
    sites, views = _sites(1)
    pooled = np.hstack([views["a"], views["b"]])
    ours = PooledFactorAnalysis(2, random_state=0).fit(sites)
    ref = FactorAnalysis(2, random_state=0).fit(pooled)
    z = ref.transform(pooled)
    np.testing.assert_allclose(ours.transform(views), z, atol=1e-8)
    rec = ours.reconstruct(views)
    np.testing.assert_allclose(np.hstack([rec["a"], rec["b"]]), ref.mean_ + z @ ref.components_, atol=1e-8)


@pytest.mark.parametrize("cls", [PooledPCA, PooledFactorAnalysis])
def test_missing_views_are_refused(cls):
    sites, _ = _sites()
    del sites[1]["b"]
    with pytest.raises(ValueError, match="site 1 lacks view 'b'"):
        cls(2).fit(sites)
    sites, _ = _sites()
    sites[0]["b"][3] = np.nan
    with pytest.raises(ValueError, match="site 0, view 'b'"):
        cls(2).fit(sites)
