"""A site's own privacy policy: what any analysis may take from it (the data owner decides, not the analyst).

A :class:`SitePolicy` is a small TOML file that the site's administrator keeps next to the
data (``fedhier.privacy.policy.SitePolicy.read``); for Flower, the SuperNode's
``node_config`` names it (``policy="..."``).  Before the site reads its data for an
analysis, the runtime builds an :class:`AnalysisRequest` from the analysis' own
configuration (which views, which mode, every DP release it would make over all its
rounds) and :meth:`SitePolicy.check` refuses it when it would break the policy.  The
coordinator is told only that the site's policy refused (:attr:`PolicyRefusal.public_summary`);
the reason, with its numbers, stays in the site's log:

.. code-block:: toml

    views = ["proteins", "csf"]          # views an analysis may use (omit: any)
    min_subjects = 20                    # fewest subjects in a view the site releases (a noisy count in DP analyses)
    subjects_epsilon = 0.1               # epsilon of that noisy count, per view and analysis
    modes = ["dp", "dp+secure"]          # allowed: "plain", "dp", "secure", "dp+secure"
    unit = "site"                        # the unit DP must protect: "site" (whole data set) or "record"
    max_epsilon = 1.0                    # per analysis, at delta
    lifetime_epsilon = 4.0               # over every analysis in the site's ledger, at delta
    delta = 1e-5
    ledger = "privacy-ledger.jsonl"      # the site's persistent ledger (relative to this file)
    anchor = "/backup/site-a/ledger.anchor"  # its roll-back anchor, kept apart from the ledger (optional)

The lifetime budget composes the site's :class:`~fedhier.privacy.site_ledger.SiteLedger`
(every release of every earlier analysis, and the reserved plan of every analysis still
running) with the request's planned releases, with dp_accounting's PLD accountant; the
check and the reservation of the request's plan are one step under the ledger's lock.
Each admission records the policy file's SHA-256, ``lifetime_epsilon`` and ``delta`` in
the ledger; a policy whose lifetime budget is larger (or whose ``delta`` is larger) than
one the ledger recorded is refused: a lifetime budget is never raised on the same ledger.

In a DP analysis ``min_subjects`` is decided on a noisy count, so that one subject does not
decide whether the site takes part: the count ``n`` of a view plus Laplace noise of scale
``1 / subjects_epsilon`` (sensitivity 1: one subject added or removed), drawn once per
analysis and view from the operating system's CSPRNG, must reach ``min_subjects``; the
outcome is kept in the ledger for the analysis' later rounds.  Each
count is a release of ``subjects_epsilon`` (a ``LaplaceDpEvent``) recorded in the site's
ledger and reserved at admission; it counts against ``lifetime_epsilon``, not against the
analysis' ``max_epsilon``.  It protects each subject, not the size of the whole data set.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dp_accounting import dp_event

from .ledger import epsilon_of_events
from .site_ledger import LedgerIntegrityError, SiteLedger

site_log = logging.getLogger("fedhier.site")

__all__ = ["SitePolicy", "AnalysisRequest", "PolicyRefusal", "MODES", "UNITS", "request_mode"]

MODES = ("plain", "dp", "secure", "dp+secure")
#: a guarantee for the whole site implies one for each record: "site" is the stronger unit
UNITS = ("record", "site")
_KEYS = {"views", "min_subjects", "subjects_epsilon", "modes", "unit", "max_epsilon", "lifetime_epsilon", "delta",
         "ledger", "anchor"}


class PolicyRefusal(RuntimeError):
    """The site refuses an analysis that would break its policy (before reading its data).

    Its text (the rule, the budget, the views) is for the site's own log; the coordinator is
    told :attr:`public_summary` only, so that refusals do not disclose the policy or the
    budget left.
    """

    public_summary = "refused by the site's policy (the reason is in the site's own log)"


@dataclass(frozen=True)
class AnalysisRequest:
    """What an analysis asks of one site, as the site derives it from the analysis' configuration.

    Attributes
    ----------
    name : an id of the analysis (the run's), recorded in the site ledger.
    mode : one of :data:`MODES`.
    views : the views the analysis would read at this site.
    unit : the unit its DP protects ("site" or "record"), None without DP.
    events : every DP release (``dp_accounting`` events) it would make at this site over all
        its rounds (the most it could make: the admission check is on this plan).
    site_events : the releases the site itself makes to check the analysis (its noisy subject
        counts, :meth:`SitePolicy.count_events`); reserved and charged to the lifetime budget.
    """

    name: str
    mode: str
    views: tuple[str, ...]
    unit: str | None = None
    events: tuple[dp_event.DpEvent, ...] = ()
    site_events: tuple[dp_event.DpEvent, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {self.mode!r}")
        if self.unit is not None and self.unit not in UNITS:
            raise ValueError(f"unit must be one of {list(UNITS)}, got {self.unit!r}")


@dataclass(frozen=True)
class SitePolicy:
    """A site's privacy policy (see the module docstring for the TOML keys)."""

    views: tuple[str, ...] | None = None
    min_subjects: int = 1
    subjects_epsilon: float = 0.1
    modes: tuple[str, ...] = MODES
    unit: str = "record"
    max_epsilon: float | None = None
    lifetime_epsilon: float | None = None
    delta: float = 1e-5
    ledger: Path | None = None
    anchor: Path | None = None
    source: str = field(default="", compare=False)
    #: SHA-256 of the policy file's bytes ("" for a policy made in code), recorded with each admission
    sha256: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"site policy {self.source}" if self.source else "site policy"
        if self.views is not None and (not self.views or not all(isinstance(v, str) and v for v in self.views)):
            raise ValueError(f"{where}: views must be a non-empty list of view names")
        if isinstance(self.min_subjects, bool) or not isinstance(self.min_subjects, int) or self.min_subjects < 1:
            raise ValueError(f"{where}: min_subjects must be a positive integer, got {self.min_subjects!r}")
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"{where}: modes must be a non-empty list of {list(MODES)}, got {list(self.modes)}")
        if self.unit not in UNITS:
            raise ValueError(f"{where}: unit must be one of {list(UNITS)}, got {self.unit!r}")
        for name in ("max_epsilon", "lifetime_epsilon", "subjects_epsilon"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{where}: {name} must be a positive number, got {value!r}")
        if not (isinstance(self.delta, float) and 0 < self.delta < 1):
            raise ValueError(f"{where}: delta must be a number in (0, 1), got {self.delta!r}")
        if self.lifetime_epsilon is not None and self.ledger is None:
            raise ValueError(f"{where}: a lifetime_epsilon needs a ledger file to compose the site's analyses")
        if self.anchor is not None and self.ledger is None:
            raise ValueError(f"{where}: an anchor protects a ledger; name the ledger file too")
        budgeted = self.max_epsilon is not None or self.lifetime_epsilon is not None
        if budgeted and set(self.modes) & {"plain", "secure"}:
            raise ValueError(f"{where}: a budget (max_epsilon, lifetime_epsilon) bounds only DP analyses; "
                             "allow modes 'dp' and 'dp+secure' only")

    @classmethod
    def read(cls, path: str | Path) -> "SitePolicy":
        """Read a policy TOML file; a relative ``ledger`` path is relative to the file's folder."""
        path = Path(path)
        try:
            raw = path.read_bytes()
            data = tomllib.loads(raw.decode())
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"site policy {path}: cannot be read ({exc})") from None
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"site policy {path}: invalid TOML ({exc})") from None
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise ValueError(f"site policy {path}: unknown key(s) {unknown}; allowed: {sorted(_KEYS)}")
        options: dict[str, Any] = dict(data)
        for key in ("views", "modes"):
            if key in options:
                if not isinstance(options[key], list):
                    raise ValueError(f"site policy {path}: {key} must be a list")
                options[key] = tuple(options[key])
        if "delta" in options and isinstance(options["delta"], int):
            options["delta"] = float(options["delta"])
        for key in ("ledger", "anchor"):
            if key in options:
                if not isinstance(options[key], str) or not options[key]:
                    raise ValueError(f"site policy {path}: {key} must be a file name")
                options[key] = (path.parent / options[key]).resolve()
        return cls(**options, source=str(path), sha256=hashlib.sha256(raw).hexdigest())

    # ------------------------------------------------------------------ enforcement
    def site_ledger(self) -> SiteLedger | None:
        """The site's persistent ledger (verified on open, with its anchor), or None when the policy keeps none."""
        if self.ledger is None:
            return None
        ledger = SiteLedger(self.ledger, anchor=self.anchor)
        if ledger.anchored and self.anchor is None:
            raise LedgerIntegrityError(f"{self.ledger}: the ledger keeps an anchor but the site's policy "
                                       f"{self.source or '(in code)'} names none")
        return ledger

    def record(self) -> dict[str, Any]:
        """What an admission records of this policy in the ledger: the file's SHA-256 and the lifetime budget."""
        return {"sha256": self.sha256, "lifetime_epsilon": self.lifetime_epsilon, "delta": self.delta}

    def admit(self, request: AnalysisRequest, ledger: SiteLedger | None = None) -> None:
        """Check ``request`` and, with a ledger, reserve its whole plan there in one locked step.

        Raises :class:`PolicyRefusal` (nothing reserved).  An analysis already running in the
        ledger (a second round 1 of it) is checked but not reserved again.
        """
        ledger = ledger if ledger is not None else self.site_ledger()
        if ledger is None:
            self.check(request)
            return
        with ledger.locked():
            ledger.verify()
            if request.name in ledger.open_analyses:
                self.check(request, ledger, running=True)
                return
            ledger.start(request.name, request.events + request.site_events, self.record(),
                         admit=lambda led: self.check(request, led))

    def check(self, request: AnalysisRequest, ledger: SiteLedger | None = None, *, running: bool = False) -> None:
        """Refuse ``request`` (:class:`PolicyRefusal`) when it breaks this policy; nothing is read or spent.

        ``ledger``: the site's ledger, for the lifetime budget (default: :meth:`site_ledger`).
        ``running``: the request is already admitted there (its plan is reserved; not added again).
        """
        if request.mode not in self.modes:
            raise PolicyRefusal(f"the site allows modes {list(self.modes)}; the analysis runs {request.mode!r}")
        if self.views is not None:
            refused = sorted(set(request.views) - set(self.views))
            if refused:
                raise PolicyRefusal(f"the site allows views {list(self.views)}; the analysis asks for {refused}")
        if request.mode in ("dp", "dp+secure"):
            if request.unit is None or UNITS.index(request.unit) < UNITS.index(self.unit):
                raise PolicyRefusal(f"the site requires DP protecting each {self.unit}; the analysis protects "
                                    f"each {request.unit}")
            if any(isinstance(e, dp_event.NonPrivateDpEvent) for e in request.events) and (
                    self.max_epsilon is not None or self.lifetime_epsilon is not None):  # a budget cannot hold
                raise PolicyRefusal("the analysis would make a non-private release (infinite epsilon)")
        if self.max_epsilon is not None:
            epsilon = epsilon_of_events(request.events, self.delta) if request.events else 0.0
            if epsilon > self.max_epsilon * (1 + 1e-9):
                raise PolicyRefusal(f"the analysis would spend epsilon {epsilon:.4g} at delta {self.delta:g}; "
                                    f"the site allows {self.max_epsilon:g} per analysis")
        if request.site_events and self.ledger is None:
            raise PolicyRefusal("min_subjects in a DP analysis is decided on a noisy count, which needs a ledger "
                                "to record it; the site's policy names none")
        if self.ledger is not None:
            ledger = ledger if ledger is not None else self.site_ledger()
            self._check_unchanged_budget(ledger)
        if self.lifetime_epsilon is not None:
            after = ledger.epsilon(self.delta, () if running else request.events + request.site_events)
            if after > self.lifetime_epsilon * (1 + 1e-9):
                spent = ledger.epsilon(self.delta)  # for the site's log
                raise PolicyRefusal(f"the site has spent or reserved epsilon {spent:.4g} of its lifetime "
                                    f"{self.lifetime_epsilon:g} (delta {self.delta:g}); with this analysis it would "
                                    f"reach {after:.4g}")

    def _check_unchanged_budget(self, ledger: SiteLedger) -> None:
        """Refuse when this policy's lifetime budget is looser than one an earlier admission recorded."""
        for earlier in ledger.policies:
            was, delta = earlier.get("lifetime_epsilon"), earlier.get("delta")
            if was is None:
                continue
            now = math.inf if self.lifetime_epsilon is None else self.lifetime_epsilon
            if now > was * (1 + 1e-12) or (delta is not None and self.delta > delta * (1 + 1e-12)):
                raise PolicyRefusal(
                    f"the policy file {self.source or '(in code)'} allows lifetime epsilon {now:g} at delta "
                    f"{self.delta:g}, but an earlier analysis in the ledger was admitted under {was:g} at delta "
                    f"{delta:g}: a lifetime budget cannot be raised on the same ledger (start a new ledger and "
                    "anchor to change it)"
                )
        if ledger.policies and self.sha256 and ledger.policies[-1].get("sha256") not in ("", self.sha256):
            site_log.warning("site policy %s changed since the ledger's last admission (its SHA-256 differs)",
                         self.source)

    def count_events(self, views: tuple[str, ...]) -> tuple[dp_event.DpEvent, ...]:
        """The releases of the noisy subject counts of a DP analysis of ``views`` (none without a minimum)."""
        if self.min_subjects <= 1:
            return ()
        return (dp_event.LaplaceDpEvent(1.0 / self.subjects_epsilon),) * len(views)

    def check_noisy_subjects(self, counts: dict[str, int], ledger: SiteLedger | None, analysis: str) -> None:
        """Refuse when a view's noisy count ``n + Laplace(1 / subjects_epsilon)`` is below ``min_subjects``.

        The noise is drawn from the operating system's CSPRNG the first time an (analysis,
        view) is checked; the release and its outcome (never the noise or the count) are
        recorded in the ledger, and every later round of the analysis reuses the outcome.
        """
        if self.min_subjects <= 1:
            return
        if ledger is None:
            raise PolicyRefusal("min_subjects in a DP analysis is decided on a noisy count, which needs a ledger "
                                "to record it; the site's policy names none")
        event = dp_event.LaplaceDpEvent(1.0 / self.subjects_epsilon)
        with ledger.locked():
            ledger.verify()
            for view, n in sorted(counts.items()):
                if (analysis, view) not in ledger.count_checks:
                    noisy = n + _laplace(1.0 / self.subjects_epsilon)
                    ledger.record_count_check(analysis, view, event, noisy >= self.min_subjects)
            few = sorted(view for view in counts if not ledger.count_checks[(analysis, view)])
        if few:
            raise PolicyRefusal(f"view(s) {few}: the noisy subject count is below the site's minimum of "
                                f"{self.min_subjects}")

    def check_subjects(self, counts: dict[str, int]) -> None:
        """Refuse when a view the site would release has fewer than ``min_subjects`` subjects (exact count: for
        analyses without DP, whose releases are exact anyway)."""
        few = sorted(v for v, n in counts.items() if n < self.min_subjects)
        if few:
            raise PolicyRefusal(f"view(s) {few} have fewer than the {self.min_subjects} subjects the site's policy "
                                "requires for a release")


def _laplace(scale: float) -> float:
    """One draw of Laplace(0, ``scale``) from the operating system's CSPRNG, by inversion of a uniform in (-1/2, 1/2)."""
    u = (secrets.randbits(53) + 0.5) / 2.0**53 - 0.5
    return -scale * math.copysign(1.0, u) * math.log1p(-2.0 * abs(u))


def request_mode(private: bool, secure: bool) -> str:
    """The :data:`MODES` name of an analysis with or without DP and secure summation."""
    if private:
        return "dp+secure" if secure else "dp"
    return "secure" if secure else "plain"
