"""Record-level DP fits of the estimators: one release per site, then post-processing.

``FedMVPPCA(privacy=RecordDP(...))`` and ``FedHM2Regressor(privacy=RecordDP(...))`` call these;
each runs the one-shot protocol of :mod:`fedhier.protocol.record_dp` for one round through
:func:`fedhier.runtime.simulate` (so the sites' policies and ledgers apply as in any fit)
and keeps the accountant's ledger of the releases the sites made.
"""

from __future__ import annotations

from typing import Any, Sequence

from .models.fedlin.stats import SiteStats
from .privacy.analyze_gauss import RecordDP
from .privacy.ledger import PrivacyLedger
from .protocol.record_dp import FedLinRecordDPProtocol, MVPPCARecordDPProtocol
from .runtime.simulate import simulate

__all__ = ["fit_mvppca", "release_fedlin_stats", "ledger_of"]


def ledger_of(config: RecordDP, history) -> PrivacyLedger:
    """The accountant's ledger: one ``moments`` release per site that replied in round 1."""
    ledger = PrivacyLedger()
    for record in history:
        for site in record.sites:
            ledger.record(site, record.round, "moments", config.event())
    return ledger


def fit_mvppca(model: Any, sites: Sequence[dict], schema, *, site_policies=None) -> Any:
    """Fit ``model`` (a FedMVPPCA whose ``privacy`` is a RecordDP) on validated ``sites``; returns it."""
    if model.aggregation != "plain":
        raise ValueError("record-level DP post-processes each site's release on its own, so secure summation does "
                         "not apply: use aggregation='plain' (the releases are already private)")
    protocol = MVPPCARecordDPProtocol(schema, model.n_components_, model.privacy, ig_solver=model.ig_solver)
    result = simulate(protocol, sites, n_rounds=1, random_state=model.random_state, min_sites=model.min_sites,
                      site_policies=site_policies, insecure_reproducible_noise=bool(model.insecure_reproducible_noise))
    model._adopt(result.broadcast, schema, result.history, seed=result.seed, n_sites=len(sites))
    model.privacy_ledger_ = ledger_of(model.privacy, result.history)
    model.privacy_spent_ = model._spent()
    return model


def release_fedlin_stats(sites: Sequence[tuple], config: RecordDP, *, random_state: int | None = None,
                         site_policies=None) -> tuple[list[SiteStats], PrivacyLedger]:
    """Every site's released (post-processed) sufficient statistics and the accountant's ledger."""
    protocol = FedLinRecordDPProtocol(len(sites), sites[0][0].shape[1], config)
    result = simulate(protocol, sites, n_rounds=1, random_state=random_state, site_policies=site_policies)
    b = result.broadcast
    stats = [SiteStats(n=int(b["n"][k]), xx=b["xx"][k].copy(), xy=b["xy"][k].copy(), yy=float(b["yy"][k]))
             for k in range(len(sites))]
    return stats, ledger_of(config, result.history)
