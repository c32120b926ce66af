"""A site's own privacy policy: what any analysis may take from it (the data owner decides, not the analyst).

A :class:`SitePolicy` is a small TOML file that the site's administrator keeps next to the
data (``fedhier.privacy.policy.SitePolicy.read``); for Flower, the SuperNode's
``node_config`` names it (``policy="..."``).  Before the site reads its data for an
analysis, the runtime builds an :class:`AnalysisRequest` from the analysis' own
configuration (which views, which mode, every DP release it would make over all its
rounds) and :meth:`SitePolicy.check` refuses it, with a reason the coordinator sees, when
it would break the policy:

.. code-block:: toml

    views = ["proteins", "csf"]          # views an analysis may use (omit: any)
    min_subjects = 20                    # fewest subjects in a view the site releases
    modes = ["dp", "dp+secure"]          # allowed: "plain", "dp", "secure", "dp+secure"
    unit = "site"                        # the unit DP must protect: "site" (whole data set) or "record"
    max_epsilon = 1.0                    # per analysis, at delta
    lifetime_epsilon = 4.0               # over every analysis in the site's ledger, at delta
    delta = 1e-5
    ledger = "privacy-ledger.jsonl"      # the site's persistent ledger (relative to this file)

The lifetime budget composes the site's :class:`~fedhier.privacy.site_ledger.SiteLedger`
(every release of every earlier analysis) with the request's planned releases, with
dp_accounting's PLD accountant.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dp_accounting import dp_event

from .ledger import epsilon_of_events
from .site_ledger import SiteLedger

__all__ = ["SitePolicy", "AnalysisRequest", "PolicyRefusal", "MODES", "UNITS", "request_mode"]

MODES = ("plain", "dp", "secure", "dp+secure")
#: a guarantee for the whole site implies one for each record: "site" is the stronger unit
UNITS = ("record", "site")
_KEYS = {"views", "min_subjects", "modes", "unit", "max_epsilon", "lifetime_epsilon", "delta", "ledger"}


class PolicyRefusal(RuntimeError):
    """The site refuses an analysis that would break its policy (before reading its data)."""

    #: its text names the rule and the request's configuration, never data
    public_message = True


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
    """

    name: str
    mode: str
    views: tuple[str, ...]
    unit: str | None = None
    events: tuple[dp_event.DpEvent, ...] = ()

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
    modes: tuple[str, ...] = MODES
    unit: str = "record"
    max_epsilon: float | None = None
    lifetime_epsilon: float | None = None
    delta: float = 1e-5
    ledger: Path | None = None
    source: str = field(default="", compare=False)

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
        for name in ("max_epsilon", "lifetime_epsilon"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{where}: {name} must be a positive number, got {value!r}")
        if not (isinstance(self.delta, float) and 0 < self.delta < 1):
            raise ValueError(f"{where}: delta must be a number in (0, 1), got {self.delta!r}")
        if self.lifetime_epsilon is not None and self.ledger is None:
            raise ValueError(f"{where}: a lifetime_epsilon needs a ledger file to compose the site's analyses")
        budgeted = self.max_epsilon is not None or self.lifetime_epsilon is not None
        if budgeted and set(self.modes) & {"plain", "secure"}:
            raise ValueError(f"{where}: a budget (max_epsilon, lifetime_epsilon) bounds only DP analyses; "
                             "allow modes 'dp' and 'dp+secure' only")

    @classmethod
    def read(cls, path: str | Path) -> "SitePolicy":
        """Read a policy TOML file; a relative ``ledger`` path is relative to the file's folder."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
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
        if "ledger" in options:
            if not isinstance(options["ledger"], str) or not options["ledger"]:
                raise ValueError(f"site policy {path}: ledger must be a file name")
            options["ledger"] = (path.parent / options["ledger"]).resolve()
        return cls(**options, source=str(path))

    # ------------------------------------------------------------------ enforcement
    def site_ledger(self) -> SiteLedger | None:
        """The site's persistent ledger (verified on open), or None when the policy keeps none."""
        return None if self.ledger is None else SiteLedger(self.ledger)

    def check(self, request: AnalysisRequest, ledger: SiteLedger | None = None) -> None:
        """Refuse ``request`` (:class:`PolicyRefusal`) when it breaks this policy; nothing is read or spent.

        ``ledger``: the site's ledger, for the lifetime budget (default: :meth:`site_ledger`).
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
        if self.lifetime_epsilon is not None:
            ledger = ledger if ledger is not None else self.site_ledger()
            spent = ledger.epsilon(self.delta)
            after = ledger.epsilon(self.delta, request.events)
            if after > self.lifetime_epsilon * (1 + 1e-9):
                raise PolicyRefusal(f"the site has spent epsilon {spent:.4g} of its lifetime {self.lifetime_epsilon:g} "
                                    f"(delta {self.delta:g}); with this analysis it would reach {after:.4g}")

    def check_subjects(self, counts: dict[str, int]) -> None:
        """Refuse when a view the site would release has fewer than ``min_subjects`` subjects."""
        few = sorted(v for v, n in counts.items() if n < self.min_subjects)
        if few:
            raise PolicyRefusal(f"view(s) {few} have fewer than the {self.min_subjects} subjects the site's policy "
                                "requires for a release")


def request_mode(private: bool, secure: bool) -> str:
    """The :data:`MODES` name of an analysis with or without DP and secure summation."""
    if private:
        return "dp+secure" if secure else "dp"
    return "secure" if secure else "plain"
