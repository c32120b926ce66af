"""What a round is, independent of model and transport (ARCHITECTURE "One idea").

    site (private data) --reply--> combine --aggregate--> global step --broadcast--> every site

A :class:`RoundProtocol` declares

* ``reply_spec`` / ``broadcast_spec``: the messages that cross the site boundary;
* :meth:`site_broadcast` / ``site_broadcast_spec``: the part of the broadcast one site
  receives (default: all of it; FedLin HM1 sends site k only its own column of Theta, so
  no site ever receives another site's parameters);
* ``combine``: ``"sum"`` (the global step needs only the field-wise sum of the replies,
  so secure summation can replace plain summation) or ``"gather"`` (the global step
  needs the individual replies, e.g. FedLin HM1's Gram matrix Theta^T Theta);
* :meth:`site_step`: the local computation, run where the data lives;
* :meth:`global_step`: the closed-form update from the combined replies.

Runtimes (:mod:`fedhier.runtime`) own seeding, transport, participation and byte
counting; a protocol only ever sees declared messages.

A protocol that runs with differential privacy (:attr:`RoundProtocol.private`) declares
what each reply field reveals (``Field.disclosure``); every runtime calls
:func:`check_disclosure` on a site's reply before it leaves the site, so a field computed
from the site's data without a DP release is refused, not sent.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import numpy as np

from .messages import Message, MessageSpec

__all__ = ["RoundProtocol", "SiteContext", "SiteError", "DisclosureError", "check_disclosure", "sum_messages"]


@dataclass
class SiteContext:
    """Everything a site step may use besides the broadcast.

    Attributes
    ----------
    site : int
        Index of the site (0-based, in the order the sites were given).
    round : int
        Communication round, 1-based.
    rng : numpy.random.Generator
        The site's own generator for this round: every secret the step draws (DP noise,
        random starts) comes from it.  It is seeded from the site's own entropy or its
        secret seed (:func:`fedhier.runtime.simulate.site_rng`), never from anything the
        coordinator or a peer sends.
    data : Any
        The site's private data, never sent anywhere.
    state : dict[str, ndarray]
        Site-private arrays kept by the runtime between rounds (empty in round 1).
        A protocol whose sites are stateless ignores it.
    releases : list of (label, dp_accounting.DpEvent)
        The differentially private releases this step made (a private protocol appends
        one per released block); :func:`check_disclosure` reads it.
    """

    site: int
    round: int
    rng: np.random.Generator
    data: Any
    state: dict[str, np.ndarray] = field(default_factory=dict)
    releases: list[tuple[str, Any]] = field(default_factory=list)


class SiteError(Exception):
    """A site's failure whose message may be sent to the coordinator.

    Its text names the site, the column, the row and the kind of problem, never a value of
    the site's data.  Any other exception raised by a site step reaches the coordinator as
    its category only (:func:`fedhier.runtime.simulate.failure_report`); its full text
    stays in the site's own log.  Other exception classes whose text is equally safe say so
    with the class attribute ``public_message = True``.
    """

    public_message = True


class DisclosureError(SiteError, RuntimeError):
    """A private protocol's reply holds a field that is neither public nor a DP release; nothing is sent."""


class RoundProtocol(ABC):
    """Abstract round protocol; see the module docstring."""

    #: short machine name, used in message headers and reports
    name: str = "protocol"
    combine: Literal["sum", "gather"] = "sum"

    @property
    def private(self) -> bool:
        """True when the sites' replies are differentially private releases: every reply field must then be
        declared ``"public"`` or ``"release"`` (:func:`check_disclosure`)."""
        return False

    @property
    @abstractmethod
    def reply_spec(self) -> MessageSpec:
        """Declared fields of a site's reply."""

    @property
    @abstractmethod
    def broadcast_spec(self) -> MessageSpec:
        """Declared fields of the broadcast."""

    @property
    def site_broadcast_spec(self) -> MessageSpec:
        """Declared fields of what one site receives (default: the whole broadcast)."""
        return self.broadcast_spec

    def site_broadcast(self, broadcast: Message, site: int) -> Message:
        """The part of ``broadcast`` sent to ``site``; runs on the server (default: all of it)."""
        return broadcast

    @property
    def broadcast_is_common(self) -> bool:
        """True when every site receives the whole broadcast (:meth:`site_broadcast` not overridden)."""
        return type(self).site_broadcast is RoundProtocol.site_broadcast

    @abstractmethod
    def initial_broadcast(self) -> Message:
        """Public, data-independent broadcast sent before round 1 (may be empty)."""

    @abstractmethod
    def site_step(self, ctx: SiteContext, broadcast: Message) -> Message:
        """Local computation of one site in one round; returns its reply.

        ``broadcast`` is what this site received: :meth:`site_broadcast` of the server's broadcast.
        """

    @abstractmethod
    def global_step(self, combined: Message | Mapping[int, Message], round: int, previous: Message) -> Message:
        """New broadcast from the combined replies.

        ``combined`` is the field-wise sum of the replies for ``combine == "sum"``
        (absent optional fields count as zeros) and ``{site: reply}`` for ``"gather"``.
        ``previous`` is the broadcast of the previous round.
        """

    def round_metrics(self, combined: Message | Mapping[int, Message], round: int) -> dict[str, float]:
        """Scalars recorded in the history for this round (e.g. expected log-likelihood)."""
        return {}

    def validate_site_data(self, site: int, data: Any) -> None:  # pragma: no cover - default
        """Raise ``ValueError`` naming the site and problem before any work is done."""


def check_disclosure(protocol: RoundProtocol, reply: Mapping[str, Any], releases: list) -> None:
    """Refuse a private protocol's reply that would reveal the site's data outside a DP release.

    Runs at the site, after :meth:`RoundProtocol.site_step` and before anything is sent.
    For ``protocol.private``: every field present in ``reply`` must be declared
    ``"public"`` or ``"release"`` in ``protocol.reply_spec``, and ``"release"`` fields
    need at least one DP release recorded by the step (``releases``, the step's
    :attr:`SiteContext.releases`).  Raises :class:`DisclosureError` naming the fields.
    """
    if not protocol.private:
        return
    fields = protocol.reply_spec.fields
    raw = sorted(k for k in reply if k not in fields or fields[k].disclosure == "raw")
    if raw:
        raise DisclosureError(
            f"reply field(s) {raw} would be computed from the site's data without a differentially private "
            "release; a private fit does not send them"
        )
    if not releases and any(fields[k].disclosure == "release" for k in reply):
        raise DisclosureError("the reply holds release fields but the step recorded no differentially private release")


def sum_messages(spec: MessageSpec, replies: Mapping[int, Message]) -> Message:
    """Field-wise sum of replies; optional fields absent from a reply count as zero."""
    out: Message = {}
    for key, f in spec.fields.items():
        present = [r[key] for r in replies.values() if key in r]
        if present or not f.optional:
            acc = np.zeros(f.shape, dtype=f.dtype)
            for arr in present:
                acc = acc + arr
            out[key] = acc
    return out
