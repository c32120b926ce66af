"""Gaussian / Laplace calibration (spec fed-mv-ppca §8.1) against independent computations."""

import math

import dp_accounting
import numpy as np
import pytest
from scipy.stats import norm

from fedhier.privacy.calibration import gaussian_delta, gaussian_noise_multiplier, gaussian_sigma, laplace_scale


def balle_wang_delta(z, eps):
    """Exact delta of the Gaussian mechanism, written directly from the condition in §8.1
    (plain scipy, high-precision via mpmath-free direct evaluation; fine for eps <= 50)."""
    return norm.cdf(0.5 / z - eps * z) - math.exp(eps) * norm.cdf(-0.5 / z - eps * z)


def bisect_noise_multiplier(eps, delta):
    """Independent calibration: plain bisection on z of balle_wang_delta(z) = delta."""
    lo, hi = 1e-3, 1e3
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if balle_wang_delta(mid, eps) > delta:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


GRID = [(eps, delta) for eps in (0.1, 0.5, 1.0, 3.0, 10.0, 30.0, 50.0) for delta in (1e-5, 1e-3, 0.01, 0.1, 0.49)]


@pytest.mark.parametrize("eps,delta", GRID)
def test_analytic_meets_balle_wang_with_equality(eps, delta):
    z = gaussian_noise_multiplier(eps, delta, "analytic")
    assert balle_wang_delta(z, eps) == pytest.approx(delta, abs=1e-9, rel=1e-9)
    # smallest such z: slightly less noise breaks the condition
    assert balle_wang_delta(z * (1 - 1e-6), eps) > delta


@pytest.mark.parametrize("eps,delta", GRID)
def test_zhao_satisfies_balle_wang(eps, delta):
    z = gaussian_noise_multiplier(eps, delta, "zhao")
    assert balle_wang_delta(z, eps) <= delta
    assert z >= gaussian_noise_multiplier(eps, delta, "analytic")


@pytest.mark.parametrize("eps,delta", [(0.1, 1e-5), (0.5, 1e-3), (0.9, 0.01)])
def test_classical_satisfies_balle_wang_below_one(eps, delta):
    z = gaussian_noise_multiplier(eps, delta, "classical")
    assert z == pytest.approx(math.sqrt(2 * math.log(1.25 / delta)) / eps)
    assert balle_wang_delta(z, eps) <= delta


@pytest.mark.parametrize("eps", [1.0, 10.0])
def test_classical_refuses_epsilon_at_least_one(eps):
    with pytest.raises(ValueError, match="only valid for epsilon < 1"):
        gaussian_noise_multiplier(eps, 0.01, "classical")


def test_classical_at_paper_settings_is_not_dp():
    # §8.1: the classical sigma at (10, 0.01) only achieves delta = 0.041
    z = math.sqrt(2 * math.log(1.25 / 0.01)) / 10
    assert gaussian_delta(z, 10) == pytest.approx(balle_wang_delta(z, 10), rel=1e-10)
    assert round(gaussian_delta(z, 10), 3) == 0.041


@pytest.mark.parametrize(
    "eps,delta,zhao,analytic",
    [(10, 0.01, 0.385, 0.350), (1, 0.01, 2.735, 1.878)],
)
def test_noise_multiplier_table(eps, delta, zhao, analytic):
    """Spec §8.1 table, checked against an independent bisection and Zhao's formula by hand."""
    z_analytic = gaussian_noise_multiplier(eps, delta, "analytic")
    assert z_analytic == pytest.approx(bisect_noise_multiplier(eps, delta), rel=1e-9)
    assert round(z_analytic, 3) == analytic
    c = math.sqrt(math.log(2 / (math.sqrt(16 * delta + 1) - 1)))
    z_zhao = gaussian_noise_multiplier(eps, delta, "zhao")
    assert z_zhao == pytest.approx((c + math.sqrt(c * c + eps)) / (eps * math.sqrt(2)), rel=1e-14)
    assert round(z_zhao, 3) == zhao


@pytest.mark.parametrize("eps,delta", [(200.0, 1e-5), (800.0, 1e-12), (0.01, 1e-10), (1e-4, 0.3)])
def test_analytic_is_robust_at_extreme_epsilon(eps, delta):
    # e^800 overflows a float: the log-space evaluation must still calibrate.
    z = gaussian_noise_multiplier(eps, delta, "analytic")
    assert np.isfinite(z) and z > 0
    assert gaussian_delta(z, eps) == pytest.approx(delta, rel=1e-8)
    # dp_accounting's own exact calibration (independent code) agrees
    assert z == pytest.approx(dp_accounting.get_sigma_gaussian(eps, delta), rel=1e-7)


def test_sigma_scales_with_sensitivity():
    assert gaussian_sigma(1.0, 1e-5, 3.0) == pytest.approx(3.0 * gaussian_noise_multiplier(1.0, 1e-5))
    assert laplace_scale(2.0, 3.0) == pytest.approx(1.5)


@pytest.mark.parametrize(
    "call",
    [
        lambda: gaussian_noise_multiplier(0.0, 0.01),
        lambda: gaussian_noise_multiplier(1.0, 0.0),
        lambda: gaussian_noise_multiplier(1.0, 1.0),
        lambda: gaussian_noise_multiplier(1.0, 0.6, "zhao"),
        lambda: gaussian_noise_multiplier(1.0, 0.01, "dwork"),
        lambda: gaussian_sigma(1.0, 0.01, 0.0),
        lambda: laplace_scale(-1.0, 1.0),
        lambda: laplace_scale(1.0, np.inf),
    ],
)
def test_invalid_inputs_raise(call):
    with pytest.raises(ValueError):
        call()
