"""Per-site privacy ledger over all rounds and blocks (spec fed-mv-ppca §8.4 [R], §14 row 16).

The ledger holds, for every site, the ``dp_accounting`` event of each release it
made, labelled with the round and the parameter block.  The end-to-end
(epsilon, delta) of a site is what dp_accounting's accountants make of the
composition of *all* its events -- the privacy-loss-distribution (PLD) accountant
for the reported figure, the Renyi (RDP) accountant as a cross-check.  Nothing is
composed by hand but Gaussian releases, whose composition has a closed form (below).

Conventions
-----------
* Neighbouring relation: events are accounted under dp_accounting's
  ``ADD_OR_REMOVE_ONE`` relation, whose unit of sensitivity is one shift of the
  output by ``Delta``.  Our events carry noise multipliers relative to the full
  sensitivity ``Delta`` of the released quantity (``2 g`` for a clipped difference,
  which bounds the change between *any* two datasets of a site, §8.3), so the figure
  is client-level DP: it holds when a site's whole dataset is replaced.
* Partial participation: a site that skips a round simply records nothing for it
  and spends nothing.
* Composition is adaptive: clipping bounds and anchors are functions of earlier
  releases only (§8.2), which the accountants' composition theorems allow.
* Identical events are grouped into ``SelfComposedDpEvent``\\ s before accounting.
  Composition is commutative, so this changes nothing but the speed (a run of the
  paper has hundreds of identical releases per site).
* The PLD accountant discretises privacy losses; by default the interval is
  ``1e-4 * 2^ceil(log2 max(1, epsilon_RDP))`` so that its relative error stays about
  1e-4 while a vacuous budget of thousands stays cheap to compute.
* Where every event is a Gaussian mechanism the privacy loss distribution needs no
  discretising: that of a Gaussian mechanism of noise multiplier sigma_i is itself
  Gaussian, and the composition is the Gaussian mechanism of
  ``1 / sqrt(sum_i 1 / sigma_i^2)`` (Dong, Roth & Su's composition of Gaussian DP), whose
  delta(epsilon) dp_accounting's ``GaussianPrivacyLoss`` gives in closed form; the ledger
  solves delta(epsilon) = delta for epsilon.  The exact figure lies at most the PLD
  accountant's rounding below its pessimistic one.
* The ledger serialises to JSON (:meth:`PrivacyLedger.to_json`); never pickled.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Literal

import attr
import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss
from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant
from scipy import optimize

__all__ = [
    "Accountant",
    "PrivacyLedger",
    "Release",
    "epsilon_of_events",
    "event_from_dict",
    "event_to_dict",
]

Accountant = Literal["pld", "rdp"]
Site = int | str
_FORMAT = "fedhier.privacy_ledger/1"


@dataclass(frozen=True)
class Release:
    """One private release: which site, which round, which block, and its DpEvent."""

    site: Site
    round: int
    block: str
    event: dp_event.DpEvent


def event_to_dict(event: dp_event.DpEvent) -> dict[str, Any]:
    """JSON-ready description of a dp_accounting event: ``{"class_name": ..., <fields>}``."""
    if not isinstance(event, dp_event.DpEvent):
        raise ValueError(f"expected a dp_accounting DpEvent, got {type(event).__name__}")
    out: dict[str, Any] = {"class_name": type(event).__name__}
    for name, value in attr.asdict(event, recurse=False).items():
        if isinstance(value, dp_event.DpEvent):
            value = event_to_dict(value)
        elif isinstance(value, list):
            value = [event_to_dict(v) if isinstance(v, dp_event.DpEvent) else v for v in value]
        out[name] = value
    return out


def event_from_dict(data: dict[str, Any]) -> dp_event.DpEvent:
    """Inverse of :func:`event_to_dict` (only classes of ``dp_accounting.dp_event``)."""
    fields = dict(data)
    name = fields.pop("class_name", None)
    cls = getattr(dp_event, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, dp_event.DpEvent)):
        raise ValueError(f"unknown dp_accounting event class {name!r}")
    for key, value in fields.items():
        if isinstance(value, dict) and "class_name" in value:
            fields[key] = event_from_dict(value)
        elif isinstance(value, list):
            fields[key] = [event_from_dict(v) if isinstance(v, dict) else v for v in value]
    return cls(**fields)


def _counts(events: Iterable[dp_event.DpEvent]) -> tuple[tuple[dp_event.DpEvent, int], ...]:
    return tuple(Counter(events).items())  # insertion-ordered: first appearance first


def _grouped(counts: tuple[tuple[dp_event.DpEvent, int], ...]) -> dp_event.ComposedDpEvent:
    return dp_event.ComposedDpEvent(
        [event if n == 1 else dp_event.SelfComposedDpEvent(event, n) for event, n in counts]
    )


class PrivacyLedger:
    """Per-site record of every DP release and its end-to-end accounting.

    Parameters
    ----------
    value_discretization_interval : float or None
        Interval of dp_accounting's PLD accountant.  None (default) chooses
        ``1e-4 * 2^ceil(log2 max(1, epsilon_RDP))`` per query (module docstring).
    """

    def __init__(self, value_discretization_interval: float | None = None) -> None:
        if value_discretization_interval is not None and not value_discretization_interval > 0:
            raise ValueError(
                f"value_discretization_interval must be positive, got {value_discretization_interval!r}"
            )
        self.value_discretization_interval = value_discretization_interval
        self._releases: list[Release] = []
        self._stops: list[dict[str, Any]] = []
        self._cache: dict[tuple, float] = {}

    # ------------------------------------------------------------------ recording
    def record(self, site: Site, round: int, block: str, event: dp_event.DpEvent) -> None:
        """Add one release of ``site`` in ``round`` for parameter ``block``."""
        if not isinstance(event, dp_event.DpEvent):
            raise ValueError(
                f"site {site!r}, round {round}, block {block!r}: expected a dp_accounting DpEvent, "
                f"got {type(event).__name__}"
            )
        if int(round) < 1:
            raise ValueError(f"site {site!r}, block {block!r}: rounds are 1-based, got round {round}")
        self._releases.append(Release(site=site, round=int(round), block=str(block), event=event))

    def record_stop(self, site: Site, round: int, reason: str) -> None:
        """Note that ``site`` stopped releasing from ``round`` on (budget stop)."""
        self._stops.append({"site": site, "round": int(round), "reason": str(reason)})

    # ------------------------------------------------------------------ queries
    @property
    def sites(self) -> list[Site]:
        """Sites with at least one release or stop, in order of first appearance."""
        seen = [r.site for r in self._releases] + [s["site"] for s in self._stops]
        return list(dict.fromkeys(seen))

    @property
    def stops(self) -> list[dict[str, Any]]:
        """Budget stops: ``[{"site", "round", "reason"}]``."""
        return [dict(s) for s in self._stops]

    def releases(self, site: Site | None = None, up_to_round: int | None = None) -> list[Release]:
        """Releases of one site (all sites if None), optionally up to a round included."""
        return [
            r
            for r in self._releases
            if (site is None or r.site == site) and (up_to_round is None or r.round <= up_to_round)
        ]

    def events(self, site: Site, up_to_round: int | None = None) -> list[dp_event.DpEvent]:
        """DpEvents of one site in release order."""
        return [r.event for r in self.releases(site, up_to_round)]

    def composed_event(self, site: Site, up_to_round: int | None = None) -> dp_event.ComposedDpEvent:
        """All events of a site as one ``ComposedDpEvent`` (identical events grouped)."""
        return _grouped(_counts(self.events(site, up_to_round)))

    def epsilon(
        self,
        site: Site,
        delta: float,
        accountant: Accountant = "pld",
        *,
        up_to_round: int | None = None,
        extra_events: Iterable[dp_event.DpEvent] = (),
    ) -> float:
        """End-to-end epsilon of ``site`` at ``delta`` over all its recorded releases.

        Parameters
        ----------
        site : int or str
        delta : float in (0, 1)
        accountant : {"pld", "rdp"}
            dp_accounting's PLD accountant (reported) or RDP accountant (cross-check).
        up_to_round : int or None
            Only releases of rounds ``<= up_to_round``.
        extra_events : iterable of DpEvent
            Planned releases added hypothetically (used by the budget stop).

        Returns
        -------
        float
            0 for a site with no release; ``inf`` if any release was non-private.
        """
        if not 0 < delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
        events = self.events(site, up_to_round) + list(extra_events)
        if not events:
            return 0.0
        counts = _counts(events)
        key = (counts, float(delta), accountant)
        if key not in self._cache:
            self._cache[key] = _epsilon_of(
                _grouped(counts), delta, accountant, self.value_discretization_interval
            )
        return self._cache[key]

    def is_void(self, site: Site) -> bool:
        """True if ``site`` made a non-private release (its guarantee is void)."""
        return any(isinstance(r.event, dp_event.NonPrivateDpEvent) for r in self.releases(site))

    def spent(self, delta: float) -> dict[Site, dict[str, Any]]:
        """Budget spent per site: ``{site: {"epsilon", "delta", "accountant": "pld", ...}}``.

        Extra keys: ``"releases"`` (count), ``"rounds"`` (rounds with a release),
        ``"stopped_at_round"`` when a budget stop occurred, and ``"note"`` when the
        guarantee is void (a non-private release, e.g. a non-private round 1).
        """
        out: dict[Site, dict[str, Any]] = {}
        for site in self.sites:
            releases = self.releases(site)
            entry: dict[str, Any] = {
                "epsilon": self.epsilon(site, delta, "pld"),
                "delta": float(delta),
                "accountant": "pld",
                "releases": len(releases),
                "rounds": len({r.round for r in releases}),
            }
            stopped = [s["round"] for s in self._stops if s["site"] == site]
            if stopped:
                entry["stopped_at_round"] = min(stopped)
            if self.is_void(site):
                void_rounds = sorted(
                    {r.round for r in releases if isinstance(r.event, dp_event.NonPrivateDpEvent)}
                )
                entry["note"] = f"guarantee void: non-private release(s) in round(s) {void_rounds}"
            out[site] = entry
        return out

    def round_table(self, delta: float, accountant: Accountant = "pld") -> list[dict[str, Any]]:
        """Rows ``{"round", "site", "releases", "epsilon"}``: cumulative epsilon after each round.

        One row per (round, site) in which the site released something; a site that
        skipped a round has no row for it (and spent nothing).
        """
        rows = []
        for round_ in sorted({r.round for r in self._releases}):
            for site in self.sites:
                count = sum(1 for r in self._releases if r.site == site and r.round == round_)
                if count:
                    rows.append(
                        {
                            "round": round_,
                            "site": site,
                            "releases": count,
                            "epsilon": self.epsilon(site, delta, accountant, up_to_round=round_),
                        }
                    )
        return rows

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready content of the ledger."""
        return {
            "format": _FORMAT,
            "value_discretization_interval": self.value_discretization_interval,
            "releases": [
                {"site": r.site, "round": r.round, "block": r.block, "event": event_to_dict(r.event)}
                for r in self._releases
            ],
            "stops": self.stops,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PrivacyLedger":
        if data.get("format") != _FORMAT:
            raise ValueError(f"not a fedhier privacy ledger (format {data.get('format')!r}, expected {_FORMAT!r})")
        ledger = cls(data.get("value_discretization_interval"))
        for row in data["releases"]:
            ledger.record(row["site"], row["round"], row["block"], event_from_dict(row["event"]))
        for stop in data["stops"]:
            ledger.record_stop(stop["site"], stop["round"], stop["reason"])
        return ledger

    @classmethod
    def from_json(cls, text: str) -> "PrivacyLedger":
        return cls.from_dict(json.loads(text))


def epsilon_of_events(
    events: Iterable[dp_event.DpEvent],
    delta: float,
    accountant: Accountant = "pld",
    value_discretization_interval: float | None = None,
) -> float:
    """Epsilon at ``delta`` of the composition of ``events``, exactly as the ledger computes it.

    Identical events are grouped; ``value_discretization_interval=None`` is the
    ledger's adaptive PLD interval.  Used to calibrate a total budget so that the
    ledger's own figure meets it (:class:`fedhier.privacy.budget.TotalBudget`).
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    counts = _counts(events)
    if not counts:
        return 0.0
    return _epsilon_of(_grouped(counts), delta, accountant, value_discretization_interval)


def _epsilon_of(
    event: dp_event.DpEvent, delta: float, accountant: Accountant, interval: float | None
) -> float:
    rdp = RdpAccountant()
    rdp.compose(event)
    epsilon_rdp = float(rdp.get_epsilon(delta))
    if accountant == "rdp":
        return epsilon_rdp
    if accountant != "pld":
        raise ValueError(f"unknown accountant {accountant!r}; expected 'pld' or 'rdp'")
    if math.isinf(epsilon_rdp):
        return math.inf
    multiplier = _gaussian_multiplier(event)
    if multiplier is not None:
        return _gaussian_epsilon(multiplier, delta, epsilon_rdp)
    if interval is None:
        # 1e-4 times epsilon_RDP rounded up to a power of two: relative error ~1e-4,
        # and the same interval for nearly identical compositions.
        interval = 1e-4 * 2.0 ** math.ceil(math.log2(max(1.0, epsilon_rdp)))
    pld = PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=interval,
    )
    pld.compose(event)
    # dp_accounting's epsilon search divides by masses that underflow for tiny losses;
    # the overflow is benign there (it returns the right bound) and is not ours to report.
    with np.errstate(over="ignore", divide="ignore"):
        return float(pld.get_epsilon(delta))


def _gaussian_multiplier(event: dp_event.DpEvent) -> float | None:
    """The noise multiplier of the one Gaussian mechanism equal to ``event``, or None where it is not all Gaussian.

    Composing Gaussian mechanisms of noise multipliers sigma_i gives the Gaussian mechanism of
    ``1 / sqrt(sum_i 1 / sigma_i^2)`` (module docstring).
    """
    def precision(e: dp_event.DpEvent) -> float | None:
        if isinstance(e, dp_event.GaussianDpEvent):
            return math.inf if e.noise_multiplier == 0 else 1.0 / e.noise_multiplier**2
        if isinstance(e, dp_event.SelfComposedDpEvent):
            inner = precision(e.event)
            return None if inner is None else e.count * inner
        if isinstance(e, dp_event.ComposedDpEvent):
            parts = [precision(x) for x in e.events]
            return None if any(p is None for p in parts) else float(sum(parts))
        return None

    total = precision(event)
    if total is None:
        return None
    return 0.0 if math.isinf(total) else math.inf if total == 0 else 1.0 / math.sqrt(total)


def _gaussian_epsilon(multiplier: float, delta: float, upper: float) -> float:
    """The smallest epsilon with delta(epsilon) <= ``delta`` for the Gaussian mechanism of ``multiplier``
    (sensitivity 1), searched on [0, ``upper``], ``upper`` an epsilon known to hold (the RDP accountant's)."""
    if multiplier == 0.0:
        return math.inf
    if math.isinf(multiplier):
        return 0.0
    loss = GaussianPrivacyLoss(standard_deviation=multiplier, sensitivity=1.0)
    excess = lambda eps: loss.get_delta_for_epsilon(eps) - delta  # noqa: E731  (decreasing in eps)
    if excess(0.0) <= 0.0:
        return 0.0
    while excess(upper) > 0.0:  # the RDP bound holds; this guards against its rounding only
        upper *= 2.0
    return float(optimize.brentq(excess, 0.0, upper, xtol=1e-12, rtol=1e-12))
