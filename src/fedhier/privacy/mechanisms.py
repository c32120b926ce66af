"""Additive noise mechanisms that report what they did as ``dp_accounting`` events (§8.1).

Each release returns the noised value **and** the ``DpEvent`` describing it, so that
an accountant (:class:`fedhier.privacy.ledger.PrivacyLedger`) can compose releases
without any hand-rolled composition.

Event semantics (dp_accounting ``dp_event.py``): a ``GaussianDpEvent(z)`` is a
Gaussian release whose noise standard deviation is ``z`` times the l2 distance
between the outputs on two neighbouring inputs; a ``LaplaceDpEvent(m)`` is a
coordinate-wise Laplace release of scale ``m`` times the l1 distance.  Here that
distance is the sensitivity ``Delta`` passed in (``2 g`` for a clipped difference,
§8.2), and the events are accounted with dp_accounting's ``ADD_OR_REMOVE_ONE``
relation, under which a pair of neighbouring outputs is exactly one shift by
``Delta`` (see :mod:`fedhier.privacy.ledger`).

The matrix-normal mechanism ``MN(0, I_d, sigma^2 I_q)`` (§8.1, Corollary 6) is the
Gaussian mechanism on ``vec``: :func:`release_gaussian` accepts arrays of any shape
and adds i.i.d. ``N(0, sigma^2)`` per entry; its ``sensitivity`` is then the
Frobenius sensitivity.

Noise comes from a :class:`~fedhier.privacy.sampling.NoiseSource` (the operating system's
CSPRNG at the site) and is sampled on a lattice (discrete Gaussian or discrete Laplace,
:mod:`fedhier.privacy.sampling`), which resists the floating-point attacks on textbook
samplers; the recorded event holds for the lattice release.
"""

from __future__ import annotations

import numpy as np
from dp_accounting import GaussianDpEvent, LaplaceDpEvent

from .sampling import NoiseSource, lattice_gaussian, lattice_laplace

__all__ = ["release_gaussian", "release_laplace"]


def _check_release(value, noise_multiplier: float, sensitivity: float) -> np.ndarray:
    array = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(array)):
        raise ValueError("the value to release contains NaN or infinite entries")
    if not (np.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be positive and finite, got {sensitivity!r}")
    if not (np.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be positive and finite, got {noise_multiplier!r}")
    return array


def release_gaussian(
    value, noise_multiplier: float, sensitivity: float, noise: NoiseSource
) -> tuple[np.ndarray, GaussianDpEvent]:
    """Gaussian (or matrix-normal) mechanism: ``value + N(0, sigma^2 I)``, ``sigma = z Delta`` (§8.1).

    Theorems 4/5 and Corollary 6 of the spec; ``z`` comes from
    :func:`fedhier.privacy.calibration.gaussian_noise_multiplier` (one release at a
    given (epsilon, delta)) or from a total-budget calibration
    (:class:`fedhier.privacy.budget.TotalBudget`).

    Parameters
    ----------
    value : array_like of any shape
        The (clipped) quantity to release.
    noise_multiplier : float
        ``z = sigma / Delta``; the event records exactly this number.
    sensitivity : float
        l2 (Frobenius) sensitivity ``Delta`` of ``value``.
    noise : NoiseSource
        The site's source of secrets (a seeded numpy Generator is accepted in tests only:
        its noise is reproducible, hence not private).

    Returns
    -------
    noised : ndarray, same shape as ``value``
        ``value`` plus discrete Gaussian noise of standard deviation about ``z Delta``.
    event : dp_accounting.GaussianDpEvent
        ``GaussianDpEvent(noise_multiplier=z)``.
    """
    array = _check_release(value, noise_multiplier, sensitivity)
    noised = lattice_gaussian(array, noise_multiplier, sensitivity, noise)
    return noised, GaussianDpEvent(noise_multiplier=float(noise_multiplier))


def release_laplace(
    value, noise_multiplier: float, sensitivity: float, noise: NoiseSource
) -> tuple[np.ndarray, LaplaceDpEvent]:
    """Laplace mechanism: ``value + Laplace(0, b)`` i.i.d. per entry, ``b = m Delta_1`` (§8.1, Thm 3).

    For an epsilon-DP release ``m = 1 / epsilon`` (``b = Delta_1 / epsilon``, see
    :func:`fedhier.privacy.calibration.laplace_scale`); the noise standard
    deviation is ``sqrt(2) b``.

    Parameters
    ----------
    value : array_like of any shape
    noise_multiplier : float
        ``m = b / Delta_1``; the event records exactly this number.
    sensitivity : float
        l1 sensitivity ``Delta_1`` of ``value``.
    noise : NoiseSource
        As for :func:`release_gaussian`.

    Returns
    -------
    noised : ndarray, same shape as ``value``
        ``value`` plus discrete Laplace noise of scale about ``m Delta_1``.
    event : dp_accounting.LaplaceDpEvent
        ``LaplaceDpEvent(noise_multiplier=m)``.
    """
    array = _check_release(value, noise_multiplier, sensitivity)
    noised = lattice_laplace(array, noise_multiplier, sensitivity, noise)
    return noised, LaplaceDpEvent(noise_multiplier=float(noise_multiplier))
