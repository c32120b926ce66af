"""Machine-readable privacy reports: what was released, under which mechanism, and what it cost.

:func:`fit_report` describes one fit from the accountant's ledger
(:class:`~fedhier.privacy.ledger.PrivacyLedger`); :func:`site_report` describes everything
one site ever released, from its persistent :class:`~fedhier.privacy.site_ledger.SiteLedger`,
with the policy in force.  Both are plain JSON-ready dicts (``fedhier.privacy_report/1``):

* ``software``: fedhier's and dp-accounting's versions;
* per site: every release (round, block, mechanism and noise multiplier, the epsilon of that
  release alone at ``delta``), the cumulative epsilon after each round (PLD accountant) and
  in total (PLD, with the RDP accountant's figure as a cross-check);
* the unit protected, delta, and the site's policy when one is given.
"""

from __future__ import annotations

from dataclasses import asdict
from importlib import metadata
from typing import Any, Mapping

from dp_accounting import dp_event

from .ledger import PrivacyLedger, epsilon_of_events, event_to_dict
from .policy import SitePolicy
from .site_ledger import LedgerEntry, SiteLedger

__all__ = ["fit_report", "site_report"]

_FORMAT = "fedhier.privacy_report/1"


def _software() -> dict[str, str]:
    out = {}
    for name in ("fedhier", "dp-accounting"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:  # pragma: no cover - a source checkout without metadata
            out[name] = "unknown"
    return out


def _release_rows(releases, delta: float) -> list[dict[str, Any]]:
    single: dict[dp_event.DpEvent, float] = {}
    rows = []
    for r in releases:
        if r.event not in single:
            single[r.event] = epsilon_of_events([r.event], delta)
        rows.append({**({"analysis": r.analysis} if isinstance(r, LedgerEntry) else {}), "round": r.round,
                     "block": r.block, "event": event_to_dict(r.event), "epsilon_alone": single[r.event]})
    return rows


def _policy(policy: SitePolicy | None) -> dict[str, Any] | None:
    if policy is None:
        return None
    out = asdict(policy)
    for key in ("ledger", "anchor"):
        out[key] = None if getattr(policy, key) is None else str(getattr(policy, key))
    out.pop("source", None)
    return out


def fit_report(ledger: PrivacyLedger, delta: float, *, unit: str = "site", site_names: Mapping[Any, str] | None = None,
               policies: Mapping[Any, SitePolicy] | None = None) -> dict[str, Any]:
    """The privacy report of one fit (its accountant's ``ledger``) at ``delta``; ``unit`` is what the DP protects."""
    sites = {}
    for site in ledger.sites:
        releases = ledger.releases(site)
        sites[str(site if site_names is None else site_names[site])] = {
            "releases": _release_rows(releases, delta),
            "epsilon_after_round": [
                {"round": row["round"], "epsilon": row["epsilon"]}
                for row in ledger.round_table(delta) if row["site"] == site
            ],
            "epsilon": ledger.epsilon(site, delta, "pld"),
            "epsilon_rdp": ledger.epsilon(site, delta, "rdp"),
            "stops": [s for s in ledger.stops if s["site"] == site],
            "policy": _policy(None if policies is None else policies.get(site)),
        }
    return {"format": _FORMAT, "kind": "fit", "software": _software(), "unit": unit, "delta": float(delta),
            "accountant": "dp-accounting PLD (RDP as a cross-check)", "sites": sites}


def site_report(ledger: SiteLedger, delta: float, policy: SitePolicy | None = None) -> dict[str, Any]:
    """Everything one site released over its lifetime (its verified ``ledger``), at ``delta``."""
    ledger.verify()
    events = ledger.events()
    return {
        "format": _FORMAT, "kind": "site", "software": _software(), "delta": float(delta),
        "accountant": "dp-accounting PLD (RDP as a cross-check)",
        "analyses": list(ledger.analyses),
        "releases": _release_rows(ledger.entries, delta),
        "epsilon": epsilon_of_events(events, delta) if events else 0.0,
        "epsilon_rdp": epsilon_of_events(events, delta, "rdp") if events else 0.0,
        "policy": _policy(policy),
    }
