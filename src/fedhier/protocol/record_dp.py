"""One-shot record-level DP protocols: each site releases its DP sufficient statistics once ("Analyze Gauss").

    site (private data) --one noisy moment matrix--> coordinator: the model, by post-processing

* :class:`MVPPCARecordDPProtocol` -- Fed-mv-PPCA (:mod:`fedhier.models.mvppca.record_dp`):
  the broadcast is the hierarchical prior theta~, the same message as the iterative
  protocol's, so the estimator's predictive methods apply unchanged.
* :class:`FedLinRecordDPProtocol` -- FedLin (:mod:`fedhier.models.fedlin.record_dp`): the
  broadcast holds every site's released (post-processed) statistics n, X^T X, X^T y, y^T y,
  on which HM2 then runs.

Both are ``private`` with ``protected_unit`` the configuration's unit ("record" by default),
declare their reply, the ``moments`` alone, a ``"release"`` (which views a Fed-mv-PPCA site
measures is in the release's noisy counts, not sent apart), record the release in ``ctx.releases`` and plan exactly one ``GaussianDpEvent`` per site
(:meth:`release_plan`), so a site's :class:`~fedhier.privacy.policy.SitePolicy` and ledger
apply as to any private protocol.  ``combine="gather"``: each site's release is
post-processed on its own.  They run for one round; a later round is refused at the site.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..data.schema import ViewSchema
from ..models.fedlin import record_dp as fedlin_record_dp
from ..models.fedlin.stats import check_site
from ..models.mvppca import record_dp as mvppca_record_dp
from ..privacy.analyze_gauss import RecordDP
from .base import RoundProtocol, SiteContext
from .messages import Field, Message, MessageSpec
from .mvppca import MVPPCAProtocol, global_to_message

__all__ = ["MVPPCARecordDPProtocol", "FedLinRecordDPProtocol"]


class _OneShot(RoundProtocol):
    """What both one-shot protocols share: privacy declarations and the single round."""

    combine = "gather"
    config: RecordDP

    @property
    def private(self) -> bool:
        return True

    @property
    def protected_unit(self) -> str:
        return self.config.unit

    def release_plan(self, n_rounds: int) -> list:
        return [self.config.event()]  # one release, whatever the number of rounds

    def _check_round(self, ctx: SiteContext) -> None:
        if ctx.round != 1:
            raise ValueError(f"site {ctx.site}: a one-shot release runs in round 1 only, not round {ctx.round}")


class MVPPCARecordDPProtocol(_OneShot):
    """Record-level DP Fed-mv-PPCA in one round.

    Parameters
    ----------
    schema : ViewSchema
    n_components : int
    config : RecordDP
    ig_solver : "newton" or "fixed_point" (the master step's inverse-gamma MLE)

    Messages: reply ``moments`` (D + K, D + K) (release), every view's blocks noised whether
    or not the site measures it; broadcast: the iterative protocol's (has_prior, per view theta~).
    """

    name = "fed-mv-ppca-record-dp"

    def __init__(self, schema: ViewSchema, n_components: int, config: RecordDP, *, ig_solver: str = "newton"):
        if not isinstance(config, RecordDP):
            raise ValueError(f"config must be a RecordDP, got {type(config).__name__}")
        self.schema, self.n_components, self.config, self.ig_solver = schema, int(n_components), config, ig_solver
        size = sum(schema.dims) + len(schema.names)
        self._reply_spec = MessageSpec("fed-mv-ppca-record-dp-reply", {
            "moments": Field((size, size), disclosure="release"),
        })
        # the iterative protocol's broadcast (theta~), view checks and subject counts apply unchanged
        self._iterative = MVPPCAProtocol(schema, self.n_components)
        self._broadcast_spec = self._iterative.broadcast_spec

    @property
    def reply_spec(self) -> MessageSpec:
        return self._reply_spec

    @property
    def broadcast_spec(self) -> MessageSpec:
        return self._broadcast_spec

    def requested_views(self) -> tuple[str, ...]:
        return tuple(self.schema.names)

    def subject_counts(self, data: Any) -> dict[str, int]:
        return self._iterative.subject_counts(data)

    def validate_site_data(self, site: int, data: Any) -> None:
        """The iterative protocol's checks, with its warning for data far from the unit scale the default clip assumes."""
        self._iterative.validate_site_data(site, data)

    def initial_broadcast(self) -> Message:
        return {"has_prior": np.asarray(0.0)}

    def site_step(self, ctx: SiteContext, broadcast: Message) -> Message:
        self._check_round(ctx)
        moments, event = mvppca_record_dp.site_release(
            ctx.data, self.schema.names, self.schema.dims, self.config, ctx.noise)
        ctx.releases.append(("moments", event))
        return {"moments": moments}

    def global_step(self, combined: Mapping[int, Message], round: int, previous: Message) -> Message:
        releases = [reply["moments"] for _, reply in sorted(combined.items())]
        theta, _ = mvppca_record_dp.global_from_releases(
            releases, self.schema.names, self.schema.dims, self.n_components, self.config, ig_solver=self.ig_solver)
        return global_to_message(theta)

    def round_metrics(self, combined: Mapping[int, Message], round: int) -> dict[str, float]:
        """``<view>/sites``: how many sites' releases show the view (:func:`~fedhier.models.mvppca.record_dp.measured_views`)."""
        counts = np.zeros(len(self.schema.names))
        for reply in combined.values():
            counts[mvppca_record_dp.measured_views(reply["moments"], self.schema.dims, self.config)] += 1
        return {f"{view}/sites": float(c) for view, c in zip(self.schema.names, counts)}


class FedLinRecordDPProtocol(_OneShot):
    """Record-level DP release of FedLin's sufficient statistics in one round.

    Site data: ``(X (n_k, d), y (n_k,))``.  Reply ``moments`` (d + 2, d + 2) (release);
    broadcast: ``n`` (K,), ``xx`` (K, d, d), ``xy`` (K, d), ``yy`` (K,), every site's
    released statistics (zeros for a site that did not reply).
    """

    name = "fedlin-record-dp"

    def __init__(self, n_sites: int, n_features: int, config: RecordDP):
        self.K, self.d, self.config = int(n_sites), int(n_features), config
        fedlin_record_dp.check_config(config, self.d)

    @property
    def reply_spec(self) -> MessageSpec:
        size = self.d + 2
        return MessageSpec("fedlin-record-dp-reply", {"moments": Field((size, size), disclosure="release")})

    @property
    def broadcast_spec(self) -> MessageSpec:
        K, d = self.K, self.d
        return MessageSpec("fedlin-record-dp-broadcast", {
            "n": Field((K,)), "xx": Field((K, d, d)), "xy": Field((K, d)), "yy": Field((K,))})

    def validate_site_data(self, site: int, data: Any) -> None:
        if not isinstance(data, (tuple, list)) or len(data) != 2:
            raise ValueError(f"site {site}: expected an (X, y) pair")
        check_site(data[0], data[1], site=site, n_features=self.d)

    def initial_broadcast(self) -> Message:
        K, d = self.K, self.d
        return {"n": np.zeros(K), "xx": np.zeros((K, d, d)), "xy": np.zeros((K, d)), "yy": np.zeros(K)}

    def site_step(self, ctx: SiteContext, broadcast: Message) -> Message:
        self._check_round(ctx)
        X, y = ctx.data
        moments, event = fedlin_record_dp.site_release(X, y, self.config, ctx.noise)
        ctx.releases.append(("moments", event))
        return {"moments": moments}

    def global_step(self, combined: Mapping[int, Message], round: int, previous: Message) -> Message:
        out = {key: np.array(value, dtype=float) for key, value in previous.items()}
        for k, reply in combined.items():
            stats = fedlin_record_dp.release_to_stats(reply["moments"], self.config)
            out["n"][k], out["xx"][k], out["xy"][k], out["yy"][k] = stats.n, stats.xx, stats.xy, stats.yy
        return out
