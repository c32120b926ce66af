"""Differential privacy shared by every method: calibration, clipping, noise, accounting.

Layering (ARCHITECTURE.md): this package knows nothing about any model.  A model's
privacy step clips its blocks (:mod:`.clipping`), releases them with a mechanism
(:mod:`.mechanisms`) calibrated per release or for a total budget
(:mod:`.calibration`, :mod:`.budget`), and records the resulting ``dp_accounting``
events in a per-site :class:`PrivacyLedger` (:mod:`.ledger`), whose PLD accountant
gives the end-to-end (epsilon, delta).
"""

from .budget import PerReleaseBudget, PrivacyBudgetExhausted, TotalBudget, check_budget
from .calibration import gaussian_delta, gaussian_noise_multiplier, gaussian_sigma, laplace_scale
from .clipping import clip_difference, clipping_bound
from .ledger import PrivacyLedger, Release, epsilon_of_events
from .mechanisms import release_gaussian, release_laplace

__all__ = [
    "PerReleaseBudget",
    "PrivacyBudgetExhausted",
    "PrivacyLedger",
    "Release",
    "TotalBudget",
    "check_budget",
    "clip_difference",
    "clipping_bound",
    "epsilon_of_events",
    "gaussian_delta",
    "gaussian_noise_multiplier",
    "gaussian_sigma",
    "laplace_scale",
    "release_gaussian",
    "release_laplace",
]
