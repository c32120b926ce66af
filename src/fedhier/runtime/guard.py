"""What a site enforces on itself in every runtime: its policy and its persistent ledger.

A :class:`SiteGuard` runs at the site, in the site half of a round
(:func:`fedhier.runtime.simulate.run_site_step`), wherever that runs -- in-process, in a
pool worker, in a Flower ClientApp:

1. :meth:`SiteGuard.admit`, before the site reads its data for an analysis: builds the
   :class:`~fedhier.privacy.policy.AnalysisRequest` from the analysis' own configuration
   (the protocol's requested views, its DP unit and release plan over all rounds, the
   aggregation mode) and lets the site's :class:`~fedhier.privacy.policy.SitePolicy` refuse
   it; an admitted analysis reserves its whole planned spend in the site's ledger, in the
   same locked step as the check (two analyses admitted at once cannot both take the last
   of the budget);
2. :meth:`SiteGuard.check_data`, after reading and before any computation: the policy's
   minimum number of subjects per view (on a noisy count in a DP analysis);
3. :meth:`SiteGuard.record`, after each step and before its reply is sent: the releases it made
   are appended to the site's ledger, so that later analyses compose with them; releases beyond
   what the analysis reserved (a coordinator that asks for more rounds than it announced, or
   repeats one) are refused instead;
4. :meth:`SiteGuard.finish`, when the analysis ends: what it reserved and did not spend is
   given back.

A refusal is a :class:`~fedhier.privacy.policy.PolicyRefusal`; the coordinator is told
only that the site's policy refused, the reason stays in the site's log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..privacy.policy import AnalysisRequest, PolicyRefusal, SitePolicy, request_mode
from ..privacy.site_ledger import BeyondPlanError
from ..protocol.base import RoundProtocol

__all__ = ["SiteGuard"]


@dataclass
class SiteGuard:
    """A site's policy (and its ledger, if the policy keeps one) applied to one analysis named ``analysis``."""

    policy: SitePolicy
    analysis: str

    def request(self, protocol: RoundProtocol, n_rounds: int, secure: bool) -> AnalysisRequest:
        """What the analysis asks of this site, from its configuration only."""
        views = tuple(protocol.requested_views())
        return AnalysisRequest(
            name=self.analysis,
            mode=request_mode(protocol.private, secure),
            views=views,
            unit=protocol.protected_unit,
            events=tuple(protocol.release_plan(n_rounds)),
            site_events=self.policy.count_events(views) if protocol.private else (),
        )

    def admit(self, protocol: RoundProtocol, n_rounds: int, secure: bool) -> None:
        """Refuse (:class:`PolicyRefusal`) or admit the analysis; an admitted one reserves its plan in the ledger once."""
        self.policy.admit(self.request(protocol, n_rounds, secure))

    def check_admitted(self) -> None:
        """In a later round: the analysis must be one this site admitted (its ledger says so)."""
        ledger = self.policy.site_ledger()
        if ledger is not None and self.analysis not in ledger.analyses:
            raise PolicyRefusal(f"analysis {self.analysis!r} was never admitted by this site")

    def check_data(self, protocol: RoundProtocol, data: Any) -> None:
        """The policy's minimum of subjects per view: a noisy count in a DP analysis, exact otherwise."""
        counts = protocol.subject_counts(data)
        if protocol.private and self.policy.min_subjects > 1:
            self.policy.check_noisy_subjects(counts, self.policy.site_ledger(), self.analysis)
        else:
            self.policy.check_subjects(counts)

    def record(self, round: int, releases: list) -> None:
        """Append the step's releases ``[(block, DpEvent)]`` to the site's ledger (no-op without one)."""
        if releases and self.policy.ledger is not None:
            try:
                self.policy.site_ledger().record(self.analysis, round, releases)
            except BeyondPlanError as exc:  # the step's reply is then not sent
                raise PolicyRefusal(str(exc)) from None

    def finish(self) -> None:
        """The analysis ended: give back the part of its reservation it did not spend (no-op without a ledger)."""
        if self.policy.ledger is not None:
            self.policy.site_ledger().finish(self.analysis)
