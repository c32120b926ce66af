"""Calibration of the Gaussian and Laplace mechanisms (spec fed-mv-ppca §8.1).

Every Gaussian calibration is expressed through the *noise multiplier*
``z = sigma / Delta`` (noise standard deviation over l2 sensitivity), the quantity a
``dp_accounting.GaussianDpEvent`` carries; ``sigma = z * Delta``.

Three calibrations of one (epsilon, delta)-DP Gaussian release:

* ``"classical"`` -- Dwork & Roth (2014), Thm A.1 / spec Thm 4 corrected:
  ``z = sqrt(2 ln(1.25 / delta)) / epsilon``, valid only for ``0 < epsilon < 1``.
* ``"zhao"`` -- Zhao et al. (arXiv:1911.12060, Sec. 5), spec Thm 5 [P]:
  ``z = (c + sqrt(c^2 + epsilon)) / (epsilon sqrt 2)``,
  ``c = sqrt(ln(2 / (sqrt(16 delta + 1) - 1)))``, for ``delta in (0, 1/2)``.
* ``"analytic"`` -- Balle & Wang (2018) [R]: the smallest ``z`` with
  ``Phi(1/(2z) - epsilon z) - e^epsilon Phi(-1/(2z) - epsilon z) <= delta``,
  which is exact (the condition is necessary and sufficient).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import numpy as np
from scipy import optimize, special

__all__ = [
    "GaussianCalibration",
    "gaussian_delta",
    "gaussian_noise_multiplier",
    "gaussian_sigma",
    "laplace_scale",
]

GaussianCalibration = Literal["classical", "zhao", "analytic"]
_CALIBRATIONS = ("classical", "zhao", "analytic")


def _check_epsilon_delta(epsilon: float, delta: float) -> None:
    if not (np.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    if not (0 < delta < 1):
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")


def _log_gaussian_delta(z: float, epsilon: float) -> float:
    """ln of the Balle--Wang delta of a Gaussian release with noise multiplier ``z``.

    ``ln[Phi(a) - e^eps Phi(b)] = ln Phi(a) + ln(1 - exp(eps + ln Phi(b) - ln Phi(a)))``
    with ``a = 1/(2z) - eps z``, ``b = -1/(2z) - eps z``; every term stays finite for
    large ``eps`` and large ``z`` (no ``e^eps`` overflow).  Returns ``-inf`` where
    the exact delta underflows to zero.
    """
    a = 0.5 / z - epsilon * z
    b = -0.5 / z - epsilon * z
    log_phi_a = special.log_ndtr(a)
    log_ratio = epsilon + special.log_ndtr(b) - log_phi_a
    if log_ratio >= 0.0:
        return -math.inf
    return float(log_phi_a + math.log(-math.expm1(log_ratio)))


def gaussian_delta(noise_multiplier: float, epsilon: float) -> float:
    """Exact delta of a Gaussian release at ``epsilon`` (Balle & Wang 2018, Thm 8).

    ``delta(eps) = Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z)`` with
    ``z = sigma / Delta`` (spec §8.1).  Used e.g. to show that the classical
    calibration at (10, 0.01) only achieves delta = 0.041.

    Parameters
    ----------
    noise_multiplier : float
        ``z = sigma / Delta > 0``.
    epsilon : float
        ``epsilon >= 0``.
    """
    if not (np.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be positive and finite, got {noise_multiplier!r}")
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    return math.exp(_log_gaussian_delta(float(noise_multiplier), float(epsilon)))


@lru_cache(maxsize=256)
def _analytic_noise_multiplier(epsilon: float, delta: float) -> float:
    """Smallest ``z`` meeting the Balle--Wang condition with equality.

    ``ln delta(z)`` is strictly decreasing in ``z``; brentq on ``ln z`` solves
    ``ln delta(z) = ln delta`` after a geometric search for a bracket.
    """
    log_delta = math.log(delta)

    def gap(log_z: float) -> float:
        value = _log_gaussian_delta(math.exp(log_z), epsilon)
        # -inf (delta underflow) is "far too much noise": a large negative gap keeps
        # brentq's sign logic intact.
        return max(value, -1e300) - log_delta

    lo = hi = math.log(math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon)
    while gap(lo) <= 0:
        lo -= math.log(10.0)
    while gap(hi) > 0:
        hi += math.log(10.0)
    log_z = optimize.brentq(gap, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    return math.exp(log_z)


def gaussian_noise_multiplier(
    epsilon: float, delta: float, calibration: GaussianCalibration = "analytic"
) -> float:
    """Noise multiplier ``z = sigma / Delta`` of one (epsilon, delta)-DP Gaussian release (§8.1).

    Parameters
    ----------
    epsilon : float
        > 0. ``"classical"`` requires ``epsilon < 1``.
    delta : float
        In (0, 1); ``"zhao"`` requires ``delta < 1/2``.
    calibration : {"classical", "zhao", "analytic"}
        See the module docstring.

    Returns
    -------
    float
        ``z``; the noise standard deviation is ``z * Delta``.

    Raises
    ------
    ValueError
        On an unknown calibration, or outside its range of validity.
    """
    _check_epsilon_delta(epsilon, delta)
    if calibration == "classical":
        if epsilon >= 1:
            raise ValueError(
                f"the classical Gaussian mechanism (Dwork & Roth, Thm A.1) is only valid for epsilon < 1, "
                f"got epsilon={epsilon}; use calibration='analytic' (exact) or 'zhao'"
            )
        return math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
    if calibration == "zhao":
        if delta >= 0.5:
            raise ValueError(f"the Zhao et al. calibration needs delta < 1/2, got delta={delta}")
        c = math.sqrt(math.log(2.0 / (math.sqrt(16.0 * delta + 1.0) - 1.0)))
        return (c + math.sqrt(c * c + epsilon)) / (epsilon * math.sqrt(2.0))
    if calibration == "analytic":
        return _analytic_noise_multiplier(float(epsilon), float(delta))
    raise ValueError(f"unknown Gaussian calibration {calibration!r}; expected one of {_CALIBRATIONS}")


def gaussian_sigma(
    epsilon: float, delta: float, sensitivity: float, calibration: GaussianCalibration = "analytic"
) -> float:
    """Noise standard deviation ``sigma = z(epsilon, delta) * Delta_2`` (§8.1).

    ``sensitivity`` is the l2 (Frobenius for a matrix, §8.1 Corollary 6) sensitivity,
    ``2 g`` for a clipped difference (§8.2 step 3).
    """
    if not (np.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be positive and finite, got {sensitivity!r}")
    return gaussian_noise_multiplier(epsilon, delta, calibration) * float(sensitivity)


def laplace_scale(epsilon: float, sensitivity: float) -> float:
    """Laplace scale ``b = Delta_1 / epsilon`` of an epsilon-DP release (§8.1, Thm 3).

    The standard deviation of the noise is ``sqrt(2) b`` (spec §15.13).
    """
    if not (np.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    if not (np.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be positive and finite, got {sensitivity!r}")
    return float(sensitivity) / float(epsilon)
