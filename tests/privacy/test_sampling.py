"""The lattice noise sampler: exact distributions against their closed forms, outputs on the lattice, OS bits."""

import math

import numpy as np
import pytest
from scipy import stats

from fedhier.privacy.mechanisms import release_gaussian, release_laplace
from fedhier.privacy.sampling import LATTICE_BITS, NoiseSource

N = 200_000


def _chi_square_p(draws: np.ndarray, pmf) -> float:
    """Goodness of fit of integer draws to ``pmf(k)``, the tail beyond |k| = K pooled into one cell."""
    K = int(np.quantile(np.abs(draws), 0.999))
    ks = np.arange(-K, K + 1)
    expected = np.array([pmf(k) for k in ks]) * draws.size
    observed = np.array([(draws == k).sum() for k in ks])
    tail_expected, tail_observed = draws.size - expected.sum(), draws.size - observed.sum()
    expected, observed = np.append(expected, tail_expected), np.append(observed, tail_observed)
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("sigma", [0.8, 2.5])
def test_discrete_gaussian_has_the_closed_form_pmf(sigma):
    norm = sum(math.exp(-k * k / (2 * sigma**2)) for k in range(-60, 61))
    draws = NoiseSource.seeded(7).discrete_gaussian(sigma, N)
    assert _chi_square_p(draws, lambda k: math.exp(-k * k / (2 * sigma**2)) / norm) > 1e-3


@pytest.mark.parametrize("scale", [0.7, 3.0])
def test_discrete_laplace_has_the_closed_form_pmf(scale):
    r = math.exp(-1.0 / scale)
    draws = NoiseSource.seeded(8).discrete_laplace(scale, N)
    assert _chi_square_p(draws, lambda k: (1 - r) / (1 + r) * r ** abs(k)) > 1e-3


@pytest.mark.parametrize("release", [release_gaussian, release_laplace])
def test_releases_lie_on_the_lattice_with_the_stated_spread(release):
    sensitivity, z = 0.3, 1.7
    grid = sensitivity * 2.0**-LATTICE_BITS
    value = np.random.default_rng(0).normal(size=20_000)
    noised, event = release(value, z, sensitivity, NoiseSource())
    steps = noised / grid  # every output is a lattice point (to the float's last bits): no floating-point holes
    assert np.abs(steps - np.rint(steps)).max() < 1e-6
    noise = noised - value
    sd = z * sensitivity * (math.sqrt(2) if release is release_laplace else 1.0)
    assert abs(noise.std() / sd - 1) < 0.03 and abs(noise.mean()) < 4 * sd / math.sqrt(value.size)
    assert event.noise_multiplier == z


def test_the_operating_systems_source_is_fresh_and_a_seeded_one_repeats():
    a, b = NoiseSource().discrete_gaussian(2.0**20, 8), NoiseSource().discrete_gaussian(2.0**20, 8)
    assert not np.array_equal(a, b)
    assert np.array_equal(NoiseSource.seeded(3).standard_normal(8), NoiseSource.seeded(3).standard_normal(8))
    with pytest.raises(TypeError, match="NoiseSource"):
        release_gaussian(np.zeros(2), 1.0, 1.0, noise=0)
