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

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, is_dataclass
from typing import Any, Literal, Mapping

import numpy as np

from .messages import Message, MessageSpec
from ..privacy.sampling import NoiseSource

__all__ = ["RoundProtocol", "SiteContext", "SiteError", "DisclosureError", "check_disclosure", "sum_messages",
           "data_digest"]


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
        The site's generator for this round, for what is not secret (random starts,
        mini-batches): derived from the run's public seed
        (:func:`fedhier.runtime.simulate.site_rng`), so that a run can be repeated.
    data : Any
        The site's private data, never sent anywhere.
    noise : NoiseSource
        The site's source of secrets (DP noise, masks): the operating system's CSPRNG at
        the site (:class:`fedhier.privacy.sampling.NoiseSource`), seeded only under the
        insecure switch ``insecure_reproducible_noise``.
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
    noise: NoiseSource = field(default_factory=NoiseSource)
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

    def coordinator_state(self) -> dict[str, np.ndarray]:
        """What :meth:`global_step` carries from round to round besides the broadcast, as named arrays.

        A checkpoint stores it with the broadcast, so a fit resumed from it takes the steps an
        uninterrupted fit takes.  Default: nothing (each step depends on the broadcast alone).
        """
        return {}

    def restore_coordinator_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Take back :meth:`coordinator_state` from a checkpoint (untrusted: ValueError when it does not fit)."""
        if state:
            raise ValueError(f"the {self.name!r} protocol keeps no state between rounds, but the checkpoint holds some")

    def validate_site_data(self, site: int, data: Any) -> None:  # pragma: no cover - default
        """Raise ``ValueError`` naming the site and problem before any work is done."""

    # What a site's own policy checks before it takes part (fedhier.privacy.policy); none of
    # these reads data except subject_counts, which runs after admission, before any step.

    def requested_views(self) -> tuple[str, ...]:
        """The views (or data blocks) the analysis reads at a site (default: none named)."""
        return ()

    @property
    def protected_unit(self) -> str | None:
        """What the protocol's DP protects, ``"site"`` or ``"record"``; None without DP."""
        return None

    def release_plan(self, n_rounds: int) -> list[Any]:
        """Every ``dp_accounting`` event a site measuring every requested view would release over ``n_rounds``
        rounds (the most the analysis can spend at a site); empty without DP."""
        return []

    def subject_counts(self, data: Any) -> dict[str, int]:
        """Subjects per view in a site's data, for the site's minimum (default: none counted)."""
        return {}

    def site_fingerprint(self, site: int, data: Any) -> bytes:
        """Digest of a site's data, so that a checkpoint is never resumed on other data.

        Runs where the data is; the runtime stores only a salted keyed hash of it.  Default:
        SHA-256 over the dtype, shape and bytes of every array in ``data`` (an array, a
        mapping of arrays in key order, or a sequence of arrays); ``b""`` (not checked) for
        data of another kind.
        """
        return data_digest(data)

    def config_fingerprint(self) -> dict[str, str]:
        """Text of each setting of this protocol; resuming a checkpoint with one changed is refused, naming it.

        Default: the instance's public attributes that are numbers, strings, None,
        dataclasses, arrays (digested) or tuples/lists/mappings of these.
        """
        out = {}
        for key, value in sorted(vars(self).items()):
            text = None if key.startswith("_") else _setting_text(value)
            if text is not None:
                out[key] = text
        return out


def _setting_text(value: Any) -> str | None:
    """Deterministic text of a setting, or None for a value of another kind (not fingerprinted)."""
    if value is None or isinstance(value, (bool, int, float, str, np.number, np.bool_)):
        return repr(value)
    if isinstance(value, np.ndarray):
        return f"array{value.shape}:{data_digest(value).hex()}" if value.dtype != object else None
    if is_dataclass(value) and not isinstance(value, type):
        return repr(value)
    if isinstance(value, (tuple, list)):
        parts = [_setting_text(v) for v in value]
        return None if None in parts else "[" + ", ".join(parts) + "]"
    if isinstance(value, Mapping):
        parts = [(repr(k), _setting_text(v)) for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))]
        return None if any(t is None for _, t in parts) else "{" + ", ".join(f"{k}: {t}" for k, t in parts) + "}"
    return None


def data_digest(data: Any) -> bytes:
    """SHA-256 over the arrays of ``data`` (array, mapping of arrays, or sequence of arrays); ``b""`` otherwise."""
    digest = hashlib.sha256()

    def add(value: Any) -> bool:
        if isinstance(value, Mapping):
            for key in sorted(value, key=repr):
                digest.update(repr(key).encode())
                if not add(value[key]):
                    return False
            return True
        if isinstance(value, (tuple, list)):
            digest.update(f"seq{len(value)}".encode())
            return all(add(v) for v in value)
        arr = np.asarray(value)
        if arr.dtype == object:
            return False
        digest.update(f"{arr.dtype.str}{arr.shape}".encode())
        digest.update(np.ascontiguousarray(arr).tobytes())
        return True

    return digest.digest() if add(data) else b""


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
