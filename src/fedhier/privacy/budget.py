"""Two ways to set privacy, and the budget stop (spec fed-mv-ppca §8.2, §8.4, §12.4).

* :class:`PerReleaseBudget` -- the paper's semantics [P]: every release (one block of
  one view in one round) is (epsilon, delta)-DP on its own (Gaussian blocks) or
  epsilon-DP (Laplace blocks).  The end-to-end figure is whatever the ledger's
  accountant makes of all releases; there is no target and no stop.
* :class:`TotalBudget` -- [R]: a target (epsilon, delta) for the whole fit of each
  site.  Given the planned number of rounds and of releases per round, one Gaussian
  noise multiplier is calibrated up front with dp_accounting's
  ``calibrate_dp_mechanism`` and PLD accountant, so that the ledger's figure for
  the whole run is at most the target.  All blocks use the Gaussian mechanism
  (one accountant family, §8.4 [R]).

:func:`check_budget` is the budget stop: called before a site's releases of a round,
it refuses (and records in the ledger) any release that would take the site's
ledger figure above the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Literal

import dp_accounting
from dp_accounting import dp_event
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

from .calibration import GaussianCalibration, gaussian_noise_multiplier
from .ledger import PrivacyLedger, epsilon_of_events

__all__ = ["Mechanism", "PerReleaseBudget", "PrivacyBudgetExhausted", "TotalBudget", "check_budget"]

Mechanism = Literal["gaussian", "laplace"]


class PrivacyBudgetExhausted(RuntimeError):
    """A site's next releases would exceed its total budget; it must stop releasing.

    Attributes
    ----------
    site, round : the site and the round it stopped in
    epsilon_after : float
        The ledger epsilon the site would reach with the refused releases.
    target : tuple (epsilon, delta)
    """

    #: its text (site, round, epsilons of the configuration) may cross the site boundary
    public_message = True

    def __init__(self, site, round: int, epsilon_after: float, target: tuple[float, float]) -> None:
        self.site, self.round, self.epsilon_after, self.target = site, round, epsilon_after, target
        super().__init__(
            f"site {site!r}, round {round}: releasing would bring epsilon to {epsilon_after:.4g} "
            f"> target {target[0]:.4g} at delta={target[1]:.3g}; the site stops releasing"
        )


def _check_target(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")


@dataclass(frozen=True)
class PerReleaseBudget:
    """(epsilon, delta) per release, the paper's semantics (§8.2, §12.4) [P].

    Parameters
    ----------
    epsilon, delta : float
        Per block, per view, per round. The paper's runs use (10, 0.01).
    calibration : {"zhao", "analytic", "classical"}
        Gaussian calibration (§8.1); "zhao" reproduces the paper, "analytic" is
        exact (less noise) [R].

    Notes
    -----
    The Laplace mechanism of a block is epsilon-DP with noise multiplier
    ``1 / epsilon`` (``b = Delta_1 / epsilon``).
    """

    epsilon: float
    delta: float
    calibration: GaussianCalibration = "zhao"

    def __post_init__(self) -> None:
        _check_target(self.epsilon, self.delta)
        gaussian_noise_multiplier(self.epsilon, self.delta, self.calibration)  # validates the calibration

    @property
    def target(self) -> None:
        """No end-to-end target: the ledger reports the resulting figure."""
        return None

    def noise_multiplier(self, mechanism: Mechanism) -> float:
        """``z = sigma / Delta`` (Gaussian) or ``b / Delta_1 = 1/epsilon`` (Laplace) of one release."""
        if mechanism == "gaussian":
            return gaussian_noise_multiplier(self.epsilon, self.delta, self.calibration)
        if mechanism == "laplace":
            return 1.0 / self.epsilon
        raise ValueError(f"unknown mechanism {mechanism!r}; expected 'gaussian' or 'laplace'")


@dataclass(frozen=True)
class TotalBudget:
    """Target (epsilon, delta) for a whole fit of each site; noise calibrated up front (§8.4 [R]).

    Parameters
    ----------
    epsilon, delta : float
        End-to-end target per site (client-level DP).
    n_rounds : int
        Planned number of rounds in which a site releases (round 1 included when it
        is private).
    releases_per_round : int
        Largest number of releases a site makes in one round (3 per observed view for
        Fed-mv-PPCA).

    Attributes
    ----------
    gaussian_multiplier : float
        Calibrated noise multiplier ``z`` of every release: the smallest (to a
        relative 1e-6) ``z`` such that ``n_rounds * releases_per_round`` Gaussian
        releases have ledger epsilon <= target at the target delta.

    Raises
    ------
    ValueError
        If the target or the plan is invalid, or the calibration cannot meet the
        target (the fit must not start).
    """

    epsilon: float
    delta: float
    n_rounds: int
    releases_per_round: int
    gaussian_multiplier: float = field(init=False)

    def __post_init__(self) -> None:
        _check_target(self.epsilon, self.delta)
        for name in ("n_rounds", "releases_per_round"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        object.__setattr__(self, "gaussian_multiplier", self._calibrate())

    @property
    def n_releases(self) -> int:
        return self.n_rounds * self.releases_per_round

    @property
    def target(self) -> tuple[float, float]:
        return (self.epsilon, self.delta)

    def noise_multiplier(self, mechanism: Mechanism) -> float:
        """The calibrated Gaussian ``z``; a total budget uses no Laplace release (§8.4 [R])."""
        if mechanism == "gaussian":
            return self.gaussian_multiplier
        if mechanism == "laplace":
            raise ValueError(
                "a total budget is calibrated for Gaussian releases only (one accountant family); "
                "use the Gaussian mechanism for every block"
            )
        raise ValueError(f"unknown mechanism {mechanism!r}; expected 'gaussian' or 'laplace'")

    def _ledger_epsilon(self, z: float) -> float:
        return epsilon_of_events([dp_event.GaussianDpEvent(z)] * self.n_releases, self.delta)

    def _calibrate(self) -> float:
        n = self.n_releases
        # n Gaussian releases with multiplier z compose exactly to one with z / sqrt(n)
        # (Dong, Roth & Su), so the exact answer brackets the PLD search tightly.
        z_exact = math.sqrt(n) * gaussian_noise_multiplier(self.epsilon, self.delta, "analytic")
        interval = 1e-4 * 2.0 ** math.ceil(math.log2(max(1.0, self.epsilon)))
        try:
            z = dp_accounting.calibrate_dp_mechanism(
                lambda: PLDAccountant(
                    dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                    value_discretization_interval=interval,
                ),
                lambda z: dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(z), n),
                self.epsilon,
                self.delta,
                bracket_interval=dp_accounting.ExplicitBracketInterval(0.5 * z_exact, 2.0 * z_exact),
                tol=1e-6 * z_exact,
            )
        except (ValueError, OverflowError, dp_accounting.mechanism_calibration.NoBracketIntervalFoundError) as err:
            # OverflowError: the accountant's discretisation overflows for an epsilon in the millions
            raise ValueError(
                f"cannot calibrate Gaussian noise for a total budget of (epsilon={self.epsilon}, "
                f"delta={self.delta}) over {self.n_rounds} rounds x {self.releases_per_round} releases: {err}"
            ) from err
        # The ledger must report <= target: nudge z up past the search tolerance.
        for _ in range(100):
            if self._ledger_epsilon(z) <= self.epsilon:
                return float(z)
            z *= 1.0 + 1e-5
        raise ValueError(
            f"cannot meet a total budget of (epsilon={self.epsilon}, delta={self.delta}) over "
            f"{self.n_rounds} rounds x {self.releases_per_round} releases: the accountant stays above the target"
        )


def check_budget(
    ledger: PrivacyLedger,
    budget: PerReleaseBudget | TotalBudget,
    site,
    round: int,
    planned_events: Iterable[dp_event.DpEvent],
) -> None:
    """Budget stop: refuse a site's planned releases if they would exceed its target.

    With a :class:`TotalBudget`, computes the site's ledger epsilon with the planned
    events added; if it exceeds the target, records the stop in the ledger and raises.
    A :class:`PerReleaseBudget` has no target and never stops.

    Raises
    ------
    PrivacyBudgetExhausted
    """
    target = budget.target
    if target is None:
        return
    epsilon, delta = target
    planned = list(planned_events)
    past = [r.event for r in ledger.releases(site)]
    calibrated = dp_event.GaussianDpEvent(budget.gaussian_multiplier)
    if len(past) + len(planned) <= budget.n_releases and all(e == calibrated for e in past + planned):
        # Within the calibrated plan: epsilon grows with the number of identical releases
        # and the calibration checked the ledger figure at n_releases, so no new PLD is needed.
        return
    after = ledger.epsilon(site, delta, "pld", extra_events=planned)
    if after > epsilon:
        ledger.record_stop(site, round, f"epsilon would reach {after:.6g} > target {epsilon:.6g}")
        raise PrivacyBudgetExhausted(site, round, after, target)
