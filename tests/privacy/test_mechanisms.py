"""Gaussian / matrix-normal / Laplace releases (spec fed-mv-ppca §8.1).

Statistical tests use a fixed seed and a false-alarm rate alpha = 1e-3 each: under a
correct implementation each fails for at most 0.1% of seeds.
"""

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from fedhier.privacy.mechanisms import release_gaussian, release_laplace

ALPHA = 1e-3


def test_gaussian_noise_has_the_calibrated_scale():
    rng = np.random.default_rng(20260101)
    value = np.linspace(-1, 1, 20_000)
    z, sensitivity = 0.35, 2.5
    noised, event = release_gaussian(value, z, sensitivity, rng)
    assert event == dp_accounting.GaussianDpEvent(noise_multiplier=z)
    assert noised.shape == value.shape
    noise = noised - value
    assert stats.kstest(noise, stats.norm(scale=z * sensitivity).cdf).pvalue > ALPHA


def test_matrix_normal_is_gaussian_on_vec():
    rng = np.random.default_rng(7)
    value = np.zeros((200, 30))
    noised, event = release_gaussian(value, 2.0, 0.5, rng)
    assert noised.shape == (200, 30)
    assert event.noise_multiplier == 2.0
    sigma = 2.0 * 0.5
    # i.i.d. N(0, sigma^2) per entry: KS on all entries, and rows/columns uncorrelated
    assert stats.kstest(noised.ravel(), stats.norm(scale=sigma).cdf).pvalue > ALPHA
    column_corr = np.corrcoef(noised, rowvar=False)[np.triu_indices(30, 1)]
    # Fisher z of 435 correlations from 200 rows: |z| sqrt(197) ~ N(0,1); Bonferroni at ALPHA
    threshold = stats.norm.isf(ALPHA / 2 / column_corr.size) / np.sqrt(200 - 3)
    assert np.max(np.abs(np.arctanh(column_corr))) < threshold


def test_laplace_noise_has_the_calibrated_scale():
    rng = np.random.default_rng(99)
    value = np.full(20_000, 3.0)
    epsilon, sensitivity = 10.0, 0.4
    noised, event = release_laplace(value, 1 / epsilon, sensitivity, rng)
    assert event == dp_accounting.LaplaceDpEvent(noise_multiplier=1 / epsilon)
    noise = noised - value
    assert stats.kstest(noise, stats.laplace(scale=sensitivity / epsilon).cdf).pvalue > ALPHA


def test_releases_are_reproducible_from_the_generator():
    a, _ = release_gaussian(np.ones(5), 1.0, 1.0, np.random.default_rng(3))
    b, _ = release_gaussian(np.ones(5), 1.0, 1.0, np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("release", [release_gaussian, release_laplace])
@pytest.mark.parametrize(
    "value,multiplier,sensitivity",
    [(np.array([np.nan]), 1.0, 1.0), (np.ones(2), 0.0, 1.0), (np.ones(2), 1.0, -1.0), (np.ones(2), np.inf, 1.0)],
)
def test_invalid_release_raises(release, value, multiplier, sensitivity):
    with pytest.raises(ValueError):
        release(value, multiplier, sensitivity, np.random.default_rng(0))
