"""Differential privacy shared by every method: calibration, clipping, noise, accounting.

Layering (ARCHITECTURE.md): this package knows nothing about any model.  A model's
privacy step clips its blocks (:mod:`.clipping`), releases them with a mechanism
(:mod:`.mechanisms`) calibrated per release or for a total budget
(:mod:`.calibration`, :mod:`.budget`), and records the resulting ``dp_accounting``
events in a per-site :class:`PrivacyLedger` (:mod:`.ledger`), whose PLD accountant
gives the end-to-end (epsilon, delta).
"""

from importlib import import_module

#: name -> submodule, imported on first use: a secure-summation step (``fedhier.secure``) does not
#: import dp_accounting, which the DP modules need and which takes seconds to import on a loaded machine
_LAZY = {
    **dict.fromkeys(["PerReleaseBudget", "PrivacyBudgetExhausted", "TotalBudget", "check_budget"], "budget"),
    **dict.fromkeys(["gaussian_delta", "gaussian_noise_multiplier", "gaussian_sigma", "laplace_scale"], "calibration"),
    **dict.fromkeys(["clip_difference", "clipping_bound"], "clipping"),
    **dict.fromkeys(["PrivacyLedger", "Release", "epsilon_of_events"], "ledger"),
    **dict.fromkeys(["release_gaussian", "release_laplace"], "mechanisms"),
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"fedhier.privacy.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'fedhier.privacy' has no attribute {name!r}")


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
