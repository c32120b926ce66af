"""Empirical privacy audit of one clipped-and-noised release (spec fed-mv-ppca §8.2, §8.3).

Two neighbouring site datasets in the worst case: their local parameters lie far on
opposite sides of the anchor, so the clipped differences are +g u and -g u (distance
2 g = the sensitivity).  A likelihood-ratio distinguisher (for a Gaussian or a Laplace
shift the LR is monotone in the projection on u, so it thresholds the projection)
guesses which dataset produced each release.  (epsilon, delta)-DP implies, for every
threshold t,

    TPR(t) <= e^epsilon FPR(t) + delta   =>   epsilon >= ln((TPR - delta) / FPR).

The threshold is chosen on one half of the draws; on the other half Clopper--Pearson
bounds (TPR lower, FPR upper, each at level alpha/2) give an empirical lower bound on
epsilon that exceeds the true epsilon with probability at most alpha = 1e-3.  The
audit must stay below the claimed epsilon, and must *exceed* it when the mechanism is
deliberately broken (sensitivity understated) or the claim deliberately too small --
otherwise the audit could not fail.
"""

import math

import numpy as np
import pytest
from audit_bounds import empirical_epsilon_lower_bound

from fedhier.privacy.calibration import gaussian_noise_multiplier
from fedhier.privacy.clipping import clip_difference
from fedhier.privacy.mechanisms import release_gaussian, release_laplace

N_GAUSSIAN = 1_000_000  # draws per dataset: the Gaussian tail needs them for power
N_LAPLACE = 200_000


def _gaussian_scores(epsilon, delta, sensitivity_factor, rng):
    dim, g = 5, 0.7
    anchor = rng.normal(size=dim)
    u = np.ones(dim) / math.sqrt(dim)
    clipped_d, clipped_d_prime = (clip_difference(anchor + s * 50 * g * u, anchor, g, "l2")[0] for s in (1, -1))
    assert np.linalg.norm(clipped_d - clipped_d_prime) == pytest.approx(2 * g)
    z = gaussian_noise_multiplier(epsilon, delta, "analytic")
    sensitivity = 2 * g * sensitivity_factor
    # N_GAUSSIAN independent releases at once: the noise is i.i.d. per entry
    y_d, _ = release_gaussian(np.tile(clipped_d, (N_GAUSSIAN, 1)), z, sensitivity, rng)
    y_d_prime, _ = release_gaussian(np.tile(clipped_d_prime, (N_GAUSSIAN, 1)), z, sensitivity, rng)
    sd = z * sensitivity
    return y_d @ u, y_d_prime @ u, np.linspace(0.0, 6 * sd, 121)


def _laplace_scores(epsilon, sensitivity_factor, rng):
    g = 0.3
    clipped_d, clipped_d_prime = (clip_difference(s * 5.0, 0.0, g, "abs")[0] for s in (1, -1))
    sensitivity = 2 * g * sensitivity_factor
    y_d, _ = release_laplace(np.full(N_LAPLACE, clipped_d), 1 / epsilon, sensitivity, rng)
    y_d_prime, _ = release_laplace(np.full(N_LAPLACE, clipped_d_prime), 1 / epsilon, sensitivity, rng)
    scale = sensitivity / epsilon
    return y_d, y_d_prime, np.linspace(-g, g + 8 * scale, 121)


def test_gaussian_release_audit():
    epsilon, delta = 1.0, 1e-5
    scores = _gaussian_scores(epsilon, delta, 1.0, np.random.default_rng(2026))
    bound = empirical_epsilon_lower_bound(*scores[:2], delta, scores[2])
    assert bound <= epsilon
    assert bound > epsilon / 4  # the audit has power: a claim of epsilon/4 would be refuted


def test_gaussian_audit_catches_understated_sensitivity():
    # noise calibrated for sensitivity g instead of 2 g: true epsilon ~ 2.15 at delta = 1e-5
    epsilon, delta = 1.0, 1e-5
    scores = _gaussian_scores(epsilon, delta, 0.5, np.random.default_rng(2027))
    assert empirical_epsilon_lower_bound(*scores[:2], delta, scores[2]) > epsilon


def test_laplace_release_audit():
    epsilon = 1.0
    scores = _laplace_scores(epsilon, 1.0, np.random.default_rng(2028))
    bound = empirical_epsilon_lower_bound(*scores[:2], 0.0, scores[2])
    assert bound <= epsilon
    assert bound > 0.9 * epsilon  # Laplace is tight: the audit nearly reaches epsilon


def test_laplace_audit_catches_understated_sensitivity():
    epsilon = 1.0
    scores = _laplace_scores(epsilon, 0.5, np.random.default_rng(2029))
    assert empirical_epsilon_lower_bound(*scores[:2], 0.0, scores[2]) > epsilon
