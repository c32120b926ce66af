"""Secure summation with dropout recovery for star protocols (Bonawitz et al., CCS 2017).

The server learns ``sum_{u in U3} x_u`` for the sites ``U3`` whose masked inputs arrived,
and nothing else about any single ``x_u``, even when it deviates from the protocol, as
long as fewer than ``t`` sites collude with it and ``t`` is more than half of the sites
(see ``docs/secure-aggregation.md``).  This is the malicious-server protocol of Bonawitz
et al. (their Fig. 4 with signatures and the consistency check), on fixed-point encodings
in Z_q (:class:`~fedhier.secure.fixedpoint.FixedPoint`).  Every site holds a long-term
signing key and the roster of every site's public key, agreed by the operators.

Step 0 -- ``advertise_keys``
    site ``u`` draws two X25519 key pairs ``(c_u^SK, c_u^PK)`` (encryption) and
    ``(s_u^SK, s_u^PK)`` (masks) and sends both public keys with its long-term signature
    ``SIG(d_u, H(params, u, c_u^PK, s_u^PK))``; the server broadcasts them (``U1``).
Step 1 -- ``share_keys``
    ``u`` checks every signature against the roster, draws a self-mask seed ``b_u``
    (32 bytes) and Shamir-shares ``b_u`` and ``s_u^SK`` with threshold ``t`` over
    GF(2^61 - 1) (:mod:`~fedhier.secure.shamir`); share ``j`` goes to site ``v`` (point
    ``z_v`` = 1 + position of ``v`` in ``params.sites``), AES-GCM-encrypted under
    ``HKDF(X25519(c_u^SK, c_v^PK))``, and routed through the server, which sees only
    ciphertexts.  ``U2`` = sites whose shares arrived.
Step 2 -- ``masked_input``
    ``u`` sends ``y_u = enc(x_u) + PRG(b_u) + sum_{v in U2, v > u} PRG(s_uv)
    - sum_{v in U2, v < u} PRG(s_uv)  (mod q)`` with ``s_uv = HKDF(X25519(s_u^SK, s_v^PK))``
    (= ``s_vu``), PRG = AES-256-CTR (:func:`~fedhier.secure.keys.prg`), once per context
    (analysis, reply, broadcast).  The server only accumulates ``sum_u y_u`` and
    broadcasts the list ``U3`` of senders.
Step 3 -- ``sign_survivors`` (consistency check)
    ``u`` signs the list ``U3`` it was given; the server forwards the signatures (``U4`` =
    the signers).
Step 4 -- ``unmask``
    ``u`` checks that at least ``t`` signatures (its own included) are valid on its own
    ``U3``, then reveals, for every ``v in U2``, its share of ``b_v`` if ``v in U3`` and its
    share of ``s_v^SK`` if ``v`` dropped (``v in U2 \\ U3``) -- never both.  From ``t``
    responders the server rebuilds every ``b_v`` (``v in U3``) and every dropped
    ``s_v^SK``, recomputes the dangling pairwise masks ``PRG(s_uv)``, ``u in U3``, and
    removes all masks from the accumulated sum.

Every step refuses (:class:`InsufficientSitesError`, no partial result) when fewer than
``t`` sites remain, so the total is recovered whenever at most ``n - t`` sites drop, before
or after sending their masked input.  Messages are declared
:class:`~fedhier.protocol.messages.MessageSpec` s encoded with
:func:`~fedhier.protocol.messages.encode` (bytes; nothing pickled), so a runtime can carry
each one and the byte counts are real.

Driving it step by step (what a runtime does; :func:`secure_sum` does exactly this)::

    params = SecAggParams(sites=(0, 1, 2, 3, 4), threshold=3, fixed_point=FixedPoint(), length=m)
    roster = {u: signing_key[u].public_key() for u in params.sites}
    sites = {u: SecAggSite(u, params, signing_key=signing_key[u], roster=roster) for u in params.sites}
    server = SecAggServer(params)
    keys = server.collect_keys({u: s.advertise_keys() for u, s in sites.items()})
    routed = server.route_shares({u: s.share_keys(keys) for u, s in sites.items()})
    listing = server.collect_masked({u: sites[u].masked_input(x[u], routed[u]) for u in routed})
    signed = server.collect_signatures({u: sites[u].sign_survivors(listing) for u in server.survivors})
    total = server.unmask({u: sites[u].unmask(signed) for u in server.survivors})

A site that drops simply sends nothing from then on; the mapping passed to the next
server step omits it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Mapping, MutableSet

import numpy as np

from ..protocol.messages import Field, MessageError, MessageSpec, decode, encode, header_fields
from . import keys as crypto
from .field import PRIME
from .fixedpoint import FixedPoint
from .shamir import reconstruct, share

__all__ = [
    "SecAggParams", "SecAggSite", "SecAggServer", "SecureSumResult", "secure_sum", "to_site",
    "InsufficientSitesError", "SecAggProtocolError", "default_neighbours", "harary_graph", "COMPLETE_UP_TO",
]

_ELEMENT_BYTES = 7                                   # 56-bit chunks < 2^61 - 1
SECRET_ELEMENTS = -(-crypto.KEY_BYTES // _ELEMENT_BYTES)   # a 32-byte secret = 5 field elements
_KEY_WORDS = crypto.KEY_BYTES // 8
_PLAINTEXT_BYTES = 8 * (2 + 2 * SECRET_ELEMENTS)    # sender, recipient, b-share, sk-share
_CIPHERTEXT_WORDS = (_PLAINTEXT_BYTES + 16) // 8     # + GCM tag
_SIGNATURE_WORDS = crypto.SIGNATURE_BYTES // 8


class InsufficientSitesError(RuntimeError):
    """Fewer than ``threshold`` sites remain at some step: the round is aborted, no total.

    Attributes
    ----------
    step : str
        The protocol step that could not proceed.
    remaining : tuple of int
        Sites still taking part at that step.
    threshold : int
    """

    #: its text (step, sites, threshold) may cross the site boundary
    public_message = True

    def __init__(self, step: str, remaining, threshold: int) -> None:
        self.step = step
        self.remaining = tuple(int(v) for v in remaining)
        self.threshold = int(threshold)
        super().__init__(
            f"secure sum aborted at step {step!r}: {len(self.remaining)} site(s) remain "
            f"{list(self.remaining)}, fewer than the threshold t = {self.threshold}; no total is released"
        )


class SecAggProtocolError(ValueError):
    """A message breaks the protocol (malformed, out of order, or revealing what it must not)."""

    #: its text names steps and sites, never a value: it may cross the site boundary
    public_message = True


def _require(step: str, remaining, threshold: int) -> None:
    if len(remaining) < threshold:
        raise InsufficientSitesError(step, sorted(remaining), threshold)


def _words(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<u8").astype(np.uint64)


def _raw(words) -> bytes:
    return np.asarray(words, dtype="<u8").tobytes()


def _info(purpose: bytes, a: int, b: int) -> bytes:
    return b"fedhier-secagg/" + purpose + b"/" + int(a).to_bytes(8, "big") + int(b).to_bytes(8, "big")


def _secret_to_elements(secret: bytes) -> np.ndarray:
    padded = secret.ljust(SECRET_ELEMENTS * _ELEMENT_BYTES, b"\0")
    return np.array([int.from_bytes(padded[i : i + _ELEMENT_BYTES], "little")
                     for i in range(0, len(padded), _ELEMENT_BYTES)], dtype=np.int64)


def _elements_to_secret(elements: np.ndarray, what: str) -> bytes:
    if np.any(elements >= 2 ** (8 * _ELEMENT_BYTES)):
        raise SecAggProtocolError(f"reconstructed {what} is not a valid secret: inconsistent shares")
    raw = b"".join(int(e).to_bytes(_ELEMENT_BYTES, "little") for e in elements)
    if any(raw[crypto.KEY_BYTES :]):
        raise SecAggProtocolError(f"reconstructed {what} is not a valid secret: inconsistent shares")
    return raw[: crypto.KEY_BYTES]


def _ring_add(a: np.ndarray, b: np.ndarray, q: int) -> np.ndarray:
    s = a + b
    return np.where(s >= q, s - q, s)


def _ring_sub(a: np.ndarray, b: np.ndarray, q: int) -> np.ndarray:
    d = a - b
    return np.where(d < 0, d + q, d)


def _decode(spec: MessageSpec, data: bytes, sender: int | None = None) -> dict[str, np.ndarray]:
    try:
        msg = decode(spec, data)
    except MessageError as exc:
        who = "" if sender is None else f"site {sender}: "
        raise SecAggProtocolError(f"{who}{exc}") from exc
    if sender is not None and "site" in msg and int(msg["site"]) != sender:
        raise SecAggProtocolError(f"message from site {sender} claims to come from site {int(msg['site'])}")
    return msg


#: session size above which :func:`default_neighbours` (and ``SecureAggregator``'s "auto") use a sparse graph
COMPLETE_UP_TO = 100


def default_neighbours(n_sites: int) -> int | None:
    """Neighbours per site of the sparse graph for ``n_sites`` sites: ``k = 2 * ceil(1.5 * log2 S)``.

    None (the complete graph) when ``S <= COMPLETE_UP_TO`` or when ``k >= S - 1``.  For
    S = 300 and 1,000 this gives k = 26 and 30 (closed neighbourhoods of 27 and 31 sites).
    """
    n_sites = int(n_sites)
    if n_sites <= COMPLETE_UP_TO:
        return None
    k = 2 * math.ceil(1.5 * math.log2(n_sites))
    return None if k >= n_sites - 1 else k


def harary_graph(sites, k: int, label: bytes) -> dict[int, tuple[int, ...]]:
    """The session's communication graph: every site's closed neighbourhood (itself and its ``k`` neighbours).

    The sites are placed on a ring in a pseudo-random order, and each is joined to the
    ``k / 2`` nearest sites on either side (a k-regular Harary graph, as in Bell et al.
    2020).  The order is a permutation drawn from SHA-256 of the public session label and
    the site list, so every site and the server derive the same graph and can check it;
    it is public, not a secret.  ``k`` must be even and below the number of sites.
    """
    ids = np.array(sorted(int(v) for v in sites), dtype=np.int64)
    n, k = ids.size, int(k)
    if k % 2 or not 2 <= k < n - 1:
        raise ValueError(f"the number of neighbours must be even, at least 2 and below {n - 1} "
                         f"(the number of sites minus one), got {k}")
    digest = hashlib.sha256(b"fedhier-secagg-graph\0" + label + b"\0" + ids.astype("<i8").tobytes()).digest()
    ring = ids[np.random.Generator(np.random.PCG64(int.from_bytes(digest, "little"))).permutation(n)]
    offsets = np.concatenate([np.arange(-(k // 2), 0), np.arange(0, k // 2 + 1)])
    return {int(ring[i]): tuple(sorted(int(v) for v in ring[(i + offsets) % n])) for i in range(n)}


def _state_site(data: bytes) -> int:
    """The site named by a saved site state (to pick its neighbourhood's spec before decoding it)."""
    try:
        fields = {k: Field(tuple(shape), dtype) for k, dtype, shape in header_fields(data)}
        return int(decode(MessageSpec("secagg.site-state", fields), data)["site"])
    except (MessageError, KeyError, ValueError) as exc:
        raise SecAggProtocolError(f"saved state: {exc}") from exc


@dataclass(frozen=True)
class SecAggParams:
    """Public parameters of one secure-sum session, known to every site and the server.

    Parameters
    ----------
    sites : tuple of int
        All sites that may take part (non-negative ids).
    threshold : int
        ``t``: any ``t`` holders of a site's shares can rebuild its secrets, fewer learn
        nothing.  On the complete graph ``2 <= t <= len(sites)`` (usually
        ``len(sites) // 2 + 1``); on a sparse graph the shares stay within each site's
        closed neighbourhood of ``neighbours + 1`` sites and ``2 <= t <= neighbours + 1``
        (usually ``(neighbours + 1) // 2 + 1``).
    fixed_point : FixedPoint
        Encoding of the inputs; masks live in Z_q with ``q = fixed_point.modulus``.
    length : int
        Number ``m`` of entries of every input vector.
    session : bytes
        Label bound into every key derivation (use a fresh one per round); on a sparse
        graph it also draws the graph (:func:`harary_graph`).
    neighbours : int or None
        None: the complete graph (Bonawitz et al. 2017: every pair of sites shares masks,
        every site holds a share of every other).  An even ``k``: SecAgg+ (Bell et al.
        2020): masks and shares only between neighbours of a public random k-regular
        graph, O(k) work and bytes per site instead of O(S); :func:`default_neighbours`.

    Site ``v`` holds Shamir point ``z = 1 + position of v in the owner's closed
    neighbourhood`` of each secret it holds a share of (:meth:`point`); on the complete
    graph that is ``1 + sites.index(v)``.
    """

    sites: tuple[int, ...]
    threshold: int
    fixed_point: FixedPoint
    length: int
    session: bytes = b"fedhier-secagg"
    neighbours: int | None = None

    def __post_init__(self) -> None:
        sites = tuple(int(v) for v in self.sites)
        if len(sites) < 2 or len(set(sites)) != len(sites) or min(sites) < 0:
            raise ValueError(f"sites must be at least 2 distinct non-negative ids, got {list(self.sites)}")
        object.__setattr__(self, "sites", tuple(sorted(sites)))
        if self.neighbours is not None:
            if isinstance(self.neighbours, bool) or int(self.neighbours) != self.neighbours:
                raise ValueError(f"neighbours must be None or an even integer, got {self.neighbours!r}")
            object.__setattr__(self, "neighbours", int(self.neighbours))
        largest = len(sites) if self.neighbours is None else self.neighbours + 1
        if isinstance(self.threshold, bool) or not 2 <= int(self.threshold) <= largest:
            what = "number of sites" if self.neighbours is None else "neighbours + 1, the size of a neighbourhood"
            raise ValueError(f"threshold must lie in [2, {largest}] ({what}), got {self.threshold!r}")
        object.__setattr__(self, "threshold", int(self.threshold))
        if 2 * self.threshold <= largest:
            raise ValueError(f"threshold must be more than half of the {largest} sites of a "
                             f"{'session' if self.neighbours is None else 'neighbourhood'} (at least {largest // 2 + 1}), "
                             f"got {self.threshold}: with fewer, a coordinator that tells some sites a site dropped "
                             "and others that it did not can rebuild that site's input")
        if not isinstance(self.fixed_point, FixedPoint):
            raise ValueError(f"fixed_point must be a FixedPoint, got {type(self.fixed_point).__name__}")
        if len(sites) > self.fixed_point.max_summands:
            raise ValueError(f"{len(sites)} sites exceed fixed_point.max_summands = {self.fixed_point.max_summands}: "
                             "the sum could wrap; lower max_abs or frac_bits")
        if isinstance(self.length, bool) or int(self.length) < 1:
            raise ValueError(f"length must be a positive integer, got {self.length!r}")
        object.__setattr__(self, "length", int(self.length))
        if not isinstance(self.session, bytes):
            raise ValueError(f"session must be bytes, got {type(self.session).__name__}")
        if self.neighbours is not None:
            self.graph  # noqa: B018 - checks k against the number of sites now

    @property
    def modulus(self) -> int:
        return self.fixed_point.modulus

    @property
    def sparse(self) -> bool:
        """True for SecAgg+ (a sparse graph), False for the complete graph."""
        return self.neighbours is not None

    @cached_property
    def graph(self) -> dict[int, tuple[int, ...]] | None:
        """Closed neighbourhood of every site on the sparse graph (:func:`harary_graph`); None if complete."""
        return None if self.neighbours is None else harary_graph(self.sites, self.neighbours, self.session)

    def neighbourhood(self, site: int) -> tuple[int, ...]:
        """``site`` and the sites it shares masks and secrets with, in increasing order."""
        return self.sites if self.graph is None else self.graph[int(site)]

    def statement(self, kind: bytes, *parts: bytes) -> bytes:
        """What a site signs: SHA-256 of ``kind``, these parameters (session, sites, threshold, length, graph) and ``parts``."""
        h = hashlib.sha256(b"fedhier-secagg/" + kind + b"\0" + self.session + b"\0")
        h.update(np.array([*self.sites, -1, self.threshold, self.length, self.neighbours or 0], dtype="<i8").tobytes())
        for part in parts:
            h.update(len(part).to_bytes(8, "big") + part)
        return h.digest()

    def point(self, holder: int, owner: int | None = None) -> int:
        """Shamir evaluation point of ``holder`` for the secrets of ``owner`` (complete graph: any owner)."""
        nbhd = self.sites if owner is None else self.neighbourhood(owner)
        return nbhd.index(holder) + 1

    # ----------------------------------------------------------- message specs
    # Messages name the sites of one neighbourhood (every site on the complete graph); on a
    # sparse graph each site has its own specs, built once per session.
    @cached_property
    def _specs(self) -> dict:
        return {}

    def spec(self, kind: str, site: int) -> MessageSpec:
        """The spec of message ``kind`` ("key-list", "shares", "routed", "signatures", "unmask",
        "site-state") as sent to or by ``site``: it names only ``site``'s neighbourhood."""
        nbhd = self.neighbourhood(site)
        key = (kind, nbhd)
        if key not in self._specs:
            self._specs[key] = getattr(self, f"_{kind.replace('-', '_')}_spec")(nbhd)
        return self._specs[key]

    @cached_property
    def keys_spec(self) -> MessageSpec:
        """Step 0, site -> server: the two public keys, signed with the site's long-term key."""
        return MessageSpec("secagg.keys", {"site": Field((), "int64"), "c_pk": Field((_KEY_WORDS,), "uint64"),
                                           "s_pk": Field((_KEY_WORDS,), "uint64"), "sig": Field((_SIGNATURE_WORDS,), "uint64")})

    @cached_property
    def survivors_spec(self) -> MessageSpec:
        """Step 2, server -> sites: which sites' masked inputs arrived (U3, over all ``sites``; one broadcast)."""
        return MessageSpec("secagg.survivors", {"included": Field((len(self.sites),), "bool")})

    @cached_property
    def consistency_spec(self) -> MessageSpec:
        """Step 3, site -> server: the site's signature of the survivor list it was given."""
        return MessageSpec("secagg.consistency", {"site": Field((), "int64"), "sig": Field((_SIGNATURE_WORDS,), "uint64")})

    @cached_property
    def masked_spec(self) -> MessageSpec:
        """Step 2, site -> server: the masked input y_u."""
        return MessageSpec("secagg.masked", {"site": Field((), "int64"), "y": Field((self.length,), "int64")})

    @property
    def key_list_spec(self) -> MessageSpec:
        """Step 0, server -> sites: public keys of the sites in U1 (complete graph)."""
        return self.spec("key-list", self.sites[0])

    @property
    def shares_spec(self) -> MessageSpec:
        """Step 1, site -> server: one encrypted share bundle per other site in U1 (complete graph)."""
        return self.spec("shares", self.sites[0])

    @property
    def routed_spec(self) -> MessageSpec:
        """Step 1, server -> site: the bundles addressed to it (complete graph)."""
        return self.spec("routed", self.sites[0])

    @property
    def unmask_spec(self) -> MessageSpec:
        """Step 3, site -> server: per site v, a share of b_v or of s_v^SK (complete graph)."""
        return self.spec("unmask", self.sites[0])

    @property
    def site_state_spec(self) -> MessageSpec:
        """A site's secrets between two steps (:meth:`SecAggSite.to_state`; complete graph)."""
        return self.spec("site-state", self.sites[0])

    @staticmethod
    def _key_list_spec(nbhd) -> MessageSpec:
        fields = {}
        for v in nbhd:
            fields[f"c_pk_{v}"] = Field((_KEY_WORDS,), "uint64", optional=True)
            fields[f"s_pk_{v}"] = Field((_KEY_WORDS,), "uint64", optional=True)
            fields[f"sig_{v}"] = Field((_SIGNATURE_WORDS,), "uint64", optional=True)
        return MessageSpec("secagg.key-list", fields)

    @staticmethod
    def _shares_spec(nbhd) -> MessageSpec:
        fields = {"site": Field((), "int64")}
        fields.update({f"to_{v}": Field((_CIPHERTEXT_WORDS,), "uint64", optional=True) for v in nbhd})
        return MessageSpec("secagg.shares", fields)

    @staticmethod
    def _routed_spec(nbhd) -> MessageSpec:
        fields = {"site": Field((), "int64")}
        fields.update({f"from_{v}": Field((_CIPHERTEXT_WORDS,), "uint64", optional=True) for v in nbhd})
        return MessageSpec("secagg.routed", fields)

    @staticmethod
    def _signatures_spec(nbhd) -> MessageSpec:
        return MessageSpec("secagg.signatures", {f"sig_{v}": Field((_SIGNATURE_WORDS,), "uint64", optional=True) for v in nbhd})

    @staticmethod
    def _unmask_spec(nbhd) -> MessageSpec:
        fields = {"site": Field((), "int64")}
        for v in nbhd:
            fields[f"b_{v}"] = Field((SECRET_ELEMENTS,), "int64", optional=True)
            fields[f"sk_{v}"] = Field((SECRET_ELEMENTS,), "int64", optional=True)
        return MessageSpec("secagg.unmask", fields)

    def _site_state_spec(self, nbhd) -> MessageSpec:
        fields = {"site": Field((), "int64"), "step": Field((), "int64"),
                  "c_sk": Field((_KEY_WORDS,), "uint64"), "s_sk": Field((_KEY_WORDS,), "uint64"),
                  "b": Field((_KEY_WORDS,), "uint64", optional=True),
                  "u2": Field((len(nbhd),), "bool", optional=True),
                  "u3": Field((len(self.sites),), "bool", optional=True)}
        for v in nbhd:
            fields[f"c_pk_{v}"] = Field((_KEY_WORDS,), "uint64", optional=True)
            fields[f"s_pk_{v}"] = Field((_KEY_WORDS,), "uint64", optional=True)
            fields[f"held_{v}"] = Field((2 * SECRET_ELEMENTS,), "int64", optional=True)
        return MessageSpec("secagg.site-state", fields)


class SecAggSite:
    """The site side of one secure-sum session; holds the private input and all secrets.

    Call :meth:`advertise_keys`, :meth:`share_keys`, :meth:`masked_input`,
    :meth:`sign_survivors`, :meth:`unmask` once each, in this order, passing the server's
    replies; each returns the encoded message to send.  Calling a step twice or out of
    order raises :class:`SecAggProtocolError` (so a site can never be made to reveal twice).

    Against a coordinator that deviates (Bonawitz et al. 2017, the malicious-server
    variant), the site

    * signs its key advertisement with its long-term key and accepts only advertisements
      signed by the key ``roster`` holds for the site that claims them (no substituted keys);
    * signs the survivor list it was given and reveals shares only once at least ``t``
      sites of its neighbourhood, itself included, signed the very same list (no
      "that site dropped" told to some sites and not to others);
    * sends a masked input for a given ``context`` (analysis, reply kind, broadcast) only
      once, recording it in ``journal`` (no second cohort for the same reply).

    Parameters
    ----------
    site : int
        This site's id, one of ``params.sites``.
    params : SecAggParams
    rng : numpy.random.Generator or None
        ``None`` = cryptographic randomness for keys, seeds and shares; a Generator
        makes the session reproducible and is not cryptographically secure.
    signing_key : Ed25519 or ECDSA P-384 private key
        This site's long-term key (:func:`fedhier.secure.keys.load_signing_key`).
    roster : mapping site id -> public key
        The long-term public keys of every site of ``params.sites``, agreed by the
        operators and given to each site out of band (:class:`fedhier.secure.keys.Roster`).
    journal : mutable set of bytes, optional
        The contexts this site has already answered (kept by the site across sessions).
    context : bytes, optional
        What this session's input answers, e.g. a hash of the analysis, the reply kind and
        the broadcast; required with ``journal``.
    """

    def __init__(self, site: int, params: SecAggParams, rng: np.random.Generator | None = None, *,
                 signing_key: crypto.SigningKey, roster: Mapping[int, object],
                 journal: MutableSet[bytes] | None = None, context: bytes | None = None) -> None:
        if site not in params.sites:
            raise ValueError(f"site {site} is not one of the session's sites {list(params.sites)}")
        if rng is not None and not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be None or a numpy.random.Generator, got {type(rng).__name__}")
        missing = sorted(set(params.sites) - set(roster))
        if missing:
            raise ValueError(f"site {site}: the roster has no key for sites {missing} of the session")
        if crypto.public_key_text(signing_key) != crypto.public_key_text(roster[site]):
            raise ValueError(f"site {site}: its signing key is not the key the roster holds for it")
        if journal is not None and not isinstance(context, bytes):
            raise ValueError(f"site {site}: a journal needs the session's context (bytes)")
        self.site = int(site)
        self.params = params
        self._rng = rng
        self._signing_key = signing_key
        self._roster = {int(v): roster[v] for v in params.sites}
        self._journal = journal
        self._context = context
        self._step = 0

    def to_state(self) -> bytes:
        """This site's secrets between two steps, encoded with ``params.site_state_spec``.

        For a runtime that runs each step in a fresh process (a Flower ClientApp): the site
        keeps these bytes and resumes with :meth:`from_state`.  They hold the private keys,
        the self-mask seed ``b_u`` and the shares received -- whoever reads them can unmask
        this site's input, so they never leave the site.  Only after :meth:`advertise_keys`.
        """
        if self._step == 0:
            raise SecAggProtocolError(f"site {self.site}: no secrets to keep before 'advertise_keys'")
        p, nbhd = self.params, self.params.neighbourhood(self.site)
        state: dict[str, np.ndarray] = {"site": np.int64(self.site), "step": np.int64(self._step),
                                        "c_sk": _words(crypto.private_bytes(self._c_key)),
                                        "s_sk": _words(crypto.private_bytes(self._s_key))}
        if self._step >= 2:
            state["b"] = _words(self._b)
            for v, (c_pk, s_pk) in self._public.items():
                state[f"c_pk_{v}"], state[f"s_pk_{v}"] = _words(c_pk), _words(s_pk)
            state.update({f"held_{v}": held for v, held in self._shares_held.items()})
        if self._step >= 3:
            state["u2"] = np.array([v in self._u2 for v in nbhd])
        if self._step >= 4:
            state["u3"] = self._included
        return encode(p.spec("site-state", self.site), state)

    @classmethod
    def from_state(cls, params: SecAggParams, data: bytes, *, signing_key: crypto.SigningKey,
                   roster: Mapping[int, object], journal: MutableSet[bytes] | None = None,
                   context: bytes | None = None) -> "SecAggSite":
        """The site saved by :meth:`to_state`, at the step where it stopped.

        ``signing_key``, ``roster``, ``journal`` and ``context`` as in :class:`SecAggSite` (the
        site's own, never saved in the state).  Later steps draw cryptographic randomness
        (``rng=None``).  Raises :class:`SecAggProtocolError` if ``data`` is not a site state
        of ``params``.
        """
        owner = _state_site(data)
        if owner not in params.sites:
            raise SecAggProtocolError(f"saved state names site {owner}, not one of the session's sites")
        nbhd = params.neighbourhood(owner)
        msg = _decode(params.spec("site-state", owner), data)
        site = cls(int(msg["site"]), params, signing_key=signing_key, roster=roster, journal=journal, context=context)
        site._step = int(msg["step"])
        needed = {2: "b", 3: "u2", 4: "u3"}
        missing = [key for step, key in needed.items() if site._step >= step and key not in msg]
        if not 1 <= site._step <= 5 or missing:
            raise SecAggProtocolError(f"site {site.site}: saved state at step {site._step} is incomplete {missing}")
        site._c_key = crypto.private_key_from_bytes(_raw(msg["c_sk"]))
        site._s_key = crypto.private_key_from_bytes(_raw(msg["s_sk"]))
        if site._step >= 2:
            site._b = _raw(msg["b"])
            site._public = {v: (_raw(msg[f"c_pk_{v}"]), _raw(msg[f"s_pk_{v}"])) for v in nbhd if f"c_pk_{v}" in msg}
            site._shares_held = {v: msg[f"held_{v}"] for v in nbhd if f"held_{v}" in msg}
        if site._step >= 3:
            site._u2 = [v for v, inc in zip(nbhd, msg["u2"]) if inc]
        if site._step >= 4:
            site._included = np.asarray(msg["u3"], dtype=bool)
        return site

    def _advance(self, step: int, name: str) -> None:
        if self._step != step:
            raise SecAggProtocolError(f"site {self.site}: step {name!r} called out of order (already at step {self._step})")
        self._step = step + 1

    def advertise_keys(self) -> bytes:
        """Step 0: generate the encryption and mask key pairs; return the public keys, signed.

        The signature (long-term key) covers the session's parameters, this site's id and
        both public keys: ``sig_u = SIG(d_u, H(params, u, c_u^PK, s_u^PK))``.
        """
        self._advance(0, "advertise_keys")
        self._c_key = crypto.generate_private_key(self._rng)
        self._s_key = crypto.generate_private_key(self._rng)
        c_pk, s_pk = crypto.public_bytes(self._c_key), crypto.public_bytes(self._s_key)
        sig = crypto.sign(self._signing_key, _keys_statement(self.params, self.site, c_pk, s_pk))
        return encode(self.params.keys_spec, {"site": self.site, "c_pk": _words(c_pk), "s_pk": _words(s_pk),
                                              "sig": _words(sig)})

    def share_keys(self, key_list: bytes) -> bytes:
        """Step 1: check every advertisement's signature against the roster; Shamir-share ``b_u``
        and ``s_u^SK``; return one encrypted bundle per other site of U1 in this site's
        neighbourhood (every other site of U1 on the complete graph)."""
        self._advance(1, "share_keys")
        p, u = self.params, self.site
        nbhd = p.neighbourhood(u)
        msg = _decode(p.spec("key-list", u), key_list)
        self._public = {}
        for v in nbhd:
            present = [f"{k}_{v}" in msg for k in ("c_pk", "s_pk", "sig")]
            if any(present) and not all(present):
                raise SecAggProtocolError(f"site {u}: the server's key list carries only part of site {v}'s advertisement")
            if all(present):
                c_pk, s_pk = _raw(msg[f"c_pk_{v}"]), _raw(msg[f"s_pk_{v}"])
                if not crypto.verify(self._roster[v], _raw(msg[f"sig_{v}"]), _keys_statement(p, v, c_pk, s_pk)):
                    raise SecAggProtocolError(f"site {u}: the keys listed for site {v} are not signed by its key in "
                                              "the roster; this site aborts the secure sum")
                self._public[v] = (c_pk, s_pk)
        mine = (crypto.public_bytes(self._c_key), crypto.public_bytes(self._s_key))
        if self._public.get(u) != mine:
            raise SecAggProtocolError(f"site {u}: the server's key list does not carry this site's public keys")
        _require("share_keys", self._public, p.threshold)
        self._b = crypto.random_bytes(crypto.KEY_BYTES, self._rng)
        secrets = np.concatenate([_secret_to_elements(self._b), _secret_to_elements(crypto.private_bytes(self._s_key))])
        shares = share(secrets, len(nbhd), p.threshold, self._rng, modulus=PRIME)  # row j: point j + 1
        self._shares_held = {u: shares[p.point(u, u) - 1]}
        out: dict[str, np.ndarray] = {"site": np.int64(u)}
        for v, (c_pk, _) in self._public.items():
            if v == u:
                continue
            info = _info(b"share", u, v)
            key = crypto.agree(self._c_key, c_pk, salt=p.session, info=info)
            plaintext = np.concatenate([[u, v], shares[p.point(v, u) - 1]]).astype("<i8").tobytes()
            out[f"to_{v}"] = _words(crypto.encrypt(key, plaintext, info))
        return encode(p.spec("shares", u), out)

    def masked_input(self, x, routed: bytes) -> bytes:
        """Step 2: decrypt the shares received, return ``y_u`` = encoded ``x`` plus all masks.

        Parameters
        ----------
        x : float ndarray, shape (params.length,)
            This site's private input; it never leaves the site unmasked.
        routed : bytes
            The server's routed bundle for this site.

        Raises
        ------
        ValueError / OverflowError
            If ``x`` has the wrong shape, non-finite entries, or ``|x| > max_abs``.
        SecAggProtocolError
            If the site already sent a masked input for this session's ``context``.
        """
        self._advance(2, "masked_input")
        p, u, q = self.params, self.site, self.params.modulus
        if self._journal is not None:
            if self._context in self._journal:
                raise SecAggProtocolError(f"site {u}: this site already answered this reply to this broadcast; "
                                          "it refuses to answer it again for another cohort")
            self._journal.add(self._context)
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (p.length,):
            raise ValueError(f"site {u}: input has shape {x.shape}, expected ({p.length},)")
        try:
            encoded = p.fixed_point.encode(x)
        except (ValueError, OverflowError) as exc:
            raise type(exc)(f"site {u}: {exc}") from exc
        msg = _decode(p.spec("routed", u), routed, u)
        senders = [v for v in p.neighbourhood(u) if f"from_{v}" in msg]
        if u in senders or not set(senders) <= set(self._public):
            raise SecAggProtocolError(f"site {u}: routed shares come from sites {senders} outside the key list")
        self._u2 = sorted(senders + [u])
        _require("masked_input", self._u2, p.threshold)
        for v in senders:
            info = _info(b"share", v, u)
            key = crypto.agree(self._c_key, self._public[v][0], salt=p.session, info=info)
            try:
                plain = np.frombuffer(crypto.decrypt(key, _raw(msg[f"from_{v}"]), info), dtype="<i8")
            except ValueError as exc:
                raise SecAggProtocolError(f"site {u}: share bundle from site {v}: {exc}") from exc
            if plain.shape != (_PLAINTEXT_BYTES // 8,) or plain[0] != v or plain[1] != u:
                raise SecAggProtocolError(f"site {u}: share bundle from site {v} is mislabelled")
            self._shares_held[v] = plain[2:].astype(np.int64)
        y = _ring_add(encoded, crypto.prg(self._b, p.length, q), q)
        for v in self._u2:
            if v == u:
                continue
            seed = crypto.agree(self._s_key, self._public[v][1], salt=p.session, info=_info(b"mask", min(u, v), max(u, v)))
            mask = crypto.prg(seed, p.length, q)
            y = _ring_add(y, mask, q) if v > u else _ring_sub(y, mask, q)
        return encode(p.masked_spec, {"site": np.int64(u), "y": y})

    def sign_survivors(self, survivors: bytes) -> bytes:
        """Step 3 (consistency check): sign the survivor list U3 the server sent; return the signature."""
        self._advance(3, "sign_survivors")
        p, u = self.params, self.site
        included = np.asarray(_decode(p.survivors_spec, survivors)["included"], dtype=bool)
        u3 = {v for v, inc in zip(p.sites, included) if inc} & set(p.neighbourhood(u))
        if not u3 <= set(self._u2):
            raise SecAggProtocolError(f"site {u}: survivor list {sorted(u3)} includes sites that never shared keys")
        if u not in u3:
            raise SecAggProtocolError(f"site {u}: survivor list omits this site, which sent its masked input")
        _require("sign_survivors", u3, p.threshold)
        self._included = included
        sig = crypto.sign(self._signing_key, p.statement(b"survivors", included.tobytes()))
        return encode(p.consistency_spec, {"site": np.int64(u), "sig": _words(sig)})

    def unmask(self, signatures: bytes) -> bytes:
        """Step 4: check that at least ``t`` sites of this site's neighbourhood, itself included,
        signed the same survivor list; then for each ``v`` in U2 reveal the share of ``b_v``
        (v in U3) or of ``s_v^SK`` (v dropped).

        Raises
        ------
        SecAggProtocolError
            A signature that does not verify on this site's survivor list (the sites were
            told different lists): nothing is revealed.
        InsufficientSitesError
            Fewer than ``t`` sites of its neighbourhood signed this list: nothing is revealed.
        """
        self._advance(4, "unmask")
        p, u = self.params, self.site
        msg = _decode(p.spec("signatures", u), signatures)
        u3 = {v for v, inc in zip(p.sites, self._included) if inc} & set(p.neighbourhood(u))
        statement = p.statement(b"survivors", self._included.tobytes())
        signers = [v for v in p.neighbourhood(u) if f"sig_{v}" in msg]
        for v in signers:
            if v not in u3 or not crypto.verify(self._roster[v], _raw(msg[f"sig_{v}"]), statement):
                raise SecAggProtocolError(f"site {u}: site {v} did not sign the survivor list this site was given "
                                          "(the sites were told different lists); this site aborts the secure sum")
        if u not in signers:
            raise SecAggProtocolError(f"site {u}: its own signature of the survivor list is missing; this site aborts "
                                      "the secure sum")
        _require("unmask", signers, p.threshold)  # fewer than t confirmed this list: reveal nothing
        out: dict[str, np.ndarray] = {"site": np.int64(u)}
        for v in self._u2:
            held = self._shares_held[v]
            if v in u3:
                out[f"b_{v}"] = held[:SECRET_ELEMENTS]
            else:
                out[f"sk_{v}"] = held[SECRET_ELEMENTS:]
        return encode(p.spec("unmask", u), out)


def _keys_statement(params: SecAggParams, site: int, c_pk: bytes, s_pk: bytes) -> bytes:
    """What site ``site`` signs in its key advertisement."""
    return params.statement(b"keys", int(site).to_bytes(8, "big"), c_pk, s_pk)


class SecAggServer:
    """The server side of one secure-sum session.

    It receives only signed public keys, ciphertexts it cannot read, masked vectors (of
    which it keeps only their running modular sum), the sites' signatures of the survivor
    list, and Shamir shares of self-mask seeds of sites whose input is in the sum or of
    mask keys of sites that dropped.  It holds no roster: the sites check the signatures.  It never holds an
    unmasked individual input.  Each method takes ``{site: bytes}`` from the sites that
    answered the previous step and returns what to send back.
    """

    def __init__(self, params: SecAggParams) -> None:
        self.params = params
        self._step = 0
        self._aborted = False
        self._public: dict[int, tuple] = {}
        self._u2: list[int] = []
        self._u3: list[int] = []
        self._u4: list[int] = []

    def _advance(self, step: int, name: str, messages: Mapping[int, bytes], allowed) -> None:
        if self._aborted:
            raise SecAggProtocolError(f"server: session was aborted; {name!r} refused")
        if self._step != step:
            raise SecAggProtocolError(f"server: step {name!r} called out of order (at step {self._step})")
        unknown = sorted(set(messages) - set(allowed))
        if unknown:
            raise SecAggProtocolError(f"server: step {name!r} got messages from sites {unknown} not entitled to it")
        self._step = step + 1

    def _check(self, step: str, remaining) -> None:
        try:
            _require(step, remaining, self.params.threshold)
        except InsufficientSitesError:
            self._aborted = True
            raise

    @property
    def survivors(self) -> tuple[int, ...]:
        """U3: sites whose masked inputs are in the sum (after :meth:`collect_masked`)."""
        return tuple(self._u3)

    def collect_keys(self, messages: Mapping[int, bytes]) -> bytes | dict[int, bytes]:
        """Step 0: gather the signed public keys; return the key list of U1.

        Complete graph: one message, broadcast to every site of U1.  Sparse graph: a mapping
        ``{u: bytes}``, site ``u`` receiving the keys of its own neighbourhood only.
        """
        p = self.params
        self._advance(0, "collect_keys", messages, p.sites)
        self._public = {}
        for u, data in messages.items():
            msg = _decode(p.keys_spec, data, u)
            self._public[u] = (_raw(msg["c_pk"]), _raw(msg["s_pk"]), msg["sig"])
        self._check("collect_keys", self._public)

        def key_list(u: int) -> bytes:
            out = {}
            for v in p.neighbourhood(u):
                if v in self._public:
                    out[f"c_pk_{v}"], out[f"s_pk_{v}"] = _words(self._public[v][0]), _words(self._public[v][1])
                    out[f"sig_{v}"] = self._public[v][2]
            return encode(p.spec("key-list", u), out)

        return {u: key_list(u) for u in sorted(self._public)} if p.sparse else key_list(p.sites[0])

    def route_shares(self, messages: Mapping[int, bytes]) -> dict[int, bytes]:
        """Step 1: forward each encrypted share bundle to its recipient; returns ``{v: bytes}`` for v in U2."""
        p = self.params
        self._advance(1, "route_shares", messages, self._public)
        bundles = {}
        for u, data in messages.items():
            msg = _decode(p.spec("shares", u), data, u)
            nbhd = p.neighbourhood(u)
            recipients = {v for v in nbhd if f"to_{v}" in msg}
            expected = (set(self._public) & set(nbhd)) - {u}
            if recipients != expected:
                raise SecAggProtocolError(f"site {u} sent shares to {sorted(recipients)}, expected every other "
                                          f"site of the key list in its neighbourhood {sorted(expected)}")
            bundles[u] = msg
        self._u2 = sorted(bundles)
        self._check("route_shares", self._u2)
        return {v: encode(p.spec("routed", v),
                          {"site": np.int64(v),
                           **{f"from_{u}": bundles[u][f"to_{v}"] for u in p.neighbourhood(v) if u != v and u in bundles}})
                for v in self._u2}

    def collect_masked(self, messages: Mapping[int, bytes]) -> bytes:
        """Step 2: add up the masked inputs; return the survivor list U3, one broadcast to the sites of U3."""
        p, q = self.params, self.params.modulus
        self._advance(2, "collect_masked", messages, self._u2)
        self._masked_sum = np.zeros(p.length, dtype=np.int64)
        for u, data in messages.items():
            y = _decode(p.masked_spec, data, u)["y"]
            if np.any(y < 0) or np.any(y >= q):
                raise SecAggProtocolError(f"site {u}: masked input has entries outside [0, {q})")
            self._masked_sum = _ring_add(self._masked_sum, y, q)
        self._u3 = sorted(messages)
        self._check("collect_masked", self._u3)
        return encode(p.survivors_spec, {"included": np.array([v in messages for v in p.sites])})

    def collect_signatures(self, messages: Mapping[int, bytes]) -> bytes | dict[int, bytes]:
        """Step 3 (consistency check): gather the sites' signatures of the survivor list; return them.

        Complete graph: one message for all.  Sparse graph: ``{u: bytes}``, each site sent
        the signatures of its own neighbourhood.  The sites that signed (U4) answer the
        unmasking step.
        """
        p = self.params
        self._advance(3, "collect_signatures", messages, self._u3)
        signed = {u: _decode(p.consistency_spec, data, u)["sig"] for u, data in messages.items()}
        self._u4 = sorted(signed)
        self._check("collect_signatures", self._u4)

        def signatures(u: int) -> bytes:
            return encode(p.spec("signatures", u), {f"sig_{v}": signed[v] for v in p.neighbourhood(u) if v in signed})

        return {u: signatures(u) for u in self._u4} if p.sparse else signatures(p.sites[0])

    def unmask(self, messages: Mapping[int, bytes]) -> np.ndarray:
        """Step 3: rebuild the seeds and dropped keys from the shares, remove all masks.

        Returns
        -------
        ndarray of float64, shape (params.length,)
            ``sum_{u in U3} x_u`` to fixed-point precision (``|U3| * precision / 2``).

        Raises
        ------
        InsufficientSitesError
            If fewer than ``threshold`` sites answered, or fewer than ``threshold`` holders
            of some site's shares (its neighbourhood, on a sparse graph).
        SecAggProtocolError
            If a site reveals both shares for one peer, the key share of a site whose
            input is in the sum, or shares that do not reconstruct consistent secrets.
        """
        p, q = self.params, self.params.modulus
        self._advance(4, "unmask", messages, self._u4)
        u3, dropped = set(self._u3), set(self._u2) - set(self._u3)
        b_shares: dict[int, dict[int, np.ndarray]] = {v: {} for v in u3}
        sk_shares: dict[int, dict[int, np.ndarray]] = {v: {} for v in dropped}
        for u, data in messages.items():
            msg = _decode(p.spec("unmask", u), data, u)
            for v in p.neighbourhood(u):
                has_b, has_sk = f"b_{v}" in msg, f"sk_{v}" in msg
                if has_b and has_sk:
                    self._aborted = True
                    raise SecAggProtocolError(f"site {u} revealed both the self-mask share and the key share of "
                                              f"site {v}; refused")
                if has_b and v not in u3:
                    self._aborted = True
                    raise SecAggProtocolError(f"site {u} revealed the self-mask share of site {v}, whose input "
                                              "is not in the sum; refused")
                if has_sk and v not in dropped:
                    self._aborted = True
                    raise SecAggProtocolError(f"site {u} revealed the mask-key share of site {v}, which is not a "
                                              "dropped site (this would unmask its input); refused")
                if has_b:
                    b_shares[v][u] = msg[f"b_{v}"]
                if has_sk:
                    sk_shares[v][u] = msg[f"sk_{v}"]
        self._check("unmask", messages)
        for v, held in (*b_shares.items(), *sk_shares.items()):
            self._check(f"unmask (shares of site {v})", held)

        masks = np.zeros(p.length, dtype=np.int64)
        for v in sorted(u3):
            b_v = _elements_to_secret(self._reconstruct(v, b_shares[v]), f"self-mask seed of site {v}")
            masks = _ring_add(masks, crypto.prg(b_v, p.length, q), q)
        for v in sorted(dropped):
            raw = _elements_to_secret(self._reconstruct(v, sk_shares[v]), f"mask key of site {v}")
            s_key = crypto.private_key_from_bytes(raw)
            if crypto.public_bytes(s_key) != self._public[v][1]:
                self._aborted = True
                raise SecAggProtocolError(f"reconstructed mask key of site {v} does not match its public key: "
                                          "inconsistent shares")
            for u in sorted(u3 & set(p.neighbourhood(v))):
                seed = crypto.agree(s_key, self._public[u][1], salt=p.session, info=_info(b"mask", min(u, v), max(u, v)))
                pair = crypto.prg(seed, p.length, q)
                # y_u carries +PRG(s_uv) if v > u and -PRG(s_uv) if v < u; remove that term
                masks = _ring_add(masks, pair, q) if v > u else _ring_sub(masks, pair, q)
        self._step = 5
        try:
            return p.fixed_point.decode(_ring_sub(self._masked_sum, masks, q), n_summands=len(u3))
        except OverflowError as exc:
            self._aborted = True
            raise SecAggProtocolError(f"unmasked sum is out of range, the masks did not cancel: {exc}") from exc

    def _reconstruct(self, owner: int, held: Mapping[int, np.ndarray]) -> np.ndarray:
        holders = sorted(held)[: self.params.threshold]
        return reconstruct(np.stack([held[u] for u in holders]),
                           np.array([self.params.point(u, owner) for u in holders]), modulus=PRIME)


def to_site(message: bytes | Mapping[int, bytes], site: int) -> bytes:
    """What the server sends ``site``: the broadcast (complete graph) or its own message (sparse graph)."""
    return message if isinstance(message, bytes) else message[site]


@dataclass(frozen=True)
class SecureSumResult:
    """Outcome of :func:`secure_sum`.

    Attributes
    ----------
    total : ndarray of float64
        Sum of the inputs of ``survivors``, same shape as each input.
    survivors : tuple of int
        Sites whose inputs are in ``total`` (U3: they sent a masked input).
    bytes_sent : dict[int, int]
        Encoded bytes each site sent to the server over the session.
    bytes_received : dict[int, int]
        Encoded bytes the server delivered to each site.
    unmasked_by : tuple of int
        Sites that answered the unmasking step.
    """

    total: np.ndarray
    survivors: tuple[int, ...]
    bytes_sent: dict[int, int]
    bytes_received: dict[int, int]
    unmasked_by: tuple[int, ...]


def secure_sum(vectors: Mapping[int, np.ndarray], *, threshold: int, fixed_point: FixedPoint,
               drop_before_masking=(), drop_after_masking=(), rng=None,
               session: bytes = b"fedhier-secagg", neighbours: int | None = None,
               signing_keys: Mapping[int, crypto.SigningKey] | None = None,
               journals: Mapping[int, MutableSet[bytes]] | None = None, context: bytes | None = None) -> SecureSumResult:
    """Run a whole secure-sum session in-process, with optional site drops.

    Parameters
    ----------
    vectors : mapping site id -> float ndarray
        Each site's private input; all of the same shape.
    threshold : int
        ``t`` of :class:`SecAggParams`.
    fixed_point : FixedPoint
        Encoding of the inputs.
    drop_before_masking : iterable of int
        Sites that share their keys (step 1) and then drop without sending a masked input;
        their inputs are not in the total.
    drop_after_masking : iterable of int
        Sites that send their masked input and then drop before unmasking; their inputs
        are in the total, recovered from the other sites' shares.
    rng : None, int or numpy.random.Generator
        ``None`` = cryptographic randomness; an int or Generator seeds one independent
        child generator per site (reproducible, not cryptographically secure).
    session : bytes
        Session label bound into the key derivations (and, on a sparse graph, drawing it).
    neighbours : int or None
        None: the complete graph; an even ``k``: SecAgg+ on a public k-regular graph
        (:class:`SecAggParams`, :func:`default_neighbours`).
    signing_keys : mapping site id -> private key, optional
        Each site's long-term key; the roster is their public keys.  Default: a fresh
        Ed25519 key per site from the operating system.
    journals : mapping site id -> mutable set of bytes, optional
        Each site's record of the contexts it answered (:class:`SecAggSite`); with ``context``.
    context : bytes, optional
        What the inputs answer; a site whose journal holds it refuses to send its masked input.

    Returns
    -------
    SecureSumResult

    Raises
    ------
    InsufficientSitesError
        If fewer than ``threshold`` sites remain at some step (no total is returned).
    """
    if not isinstance(vectors, Mapping) or len(vectors) < 2:
        raise ValueError("vectors must map at least two site ids to arrays")
    arrays = {int(u): np.asarray(x, dtype=np.float64) for u, x in vectors.items()}
    shape = next(iter(arrays.values())).shape
    for u, x in arrays.items():
        if x.shape != shape:
            raise ValueError(f"site {u}: input has shape {x.shape}, site {next(iter(arrays))} has {shape}")
    before, after = {int(u) for u in drop_before_masking}, {int(u) for u in drop_after_masking}
    for name, group in (("drop_before_masking", before), ("drop_after_masking", after)):
        if not group <= set(arrays):
            raise ValueError(f"{name} names unknown sites {sorted(group - set(arrays))}")
    if before & after:
        raise ValueError(f"sites {sorted(before & after)} are in both drop_before_masking and drop_after_masking")
    params = SecAggParams(tuple(arrays), threshold, fixed_point, int(np.prod(shape, dtype=np.int64)), session,
                          neighbours)
    if isinstance(rng, (int, np.integer)):
        rng = np.random.default_rng(int(rng))
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be None, an int or a numpy.random.Generator, got {type(rng).__name__}")
    site_rngs = rng.spawn(len(params.sites)) if rng is not None else [None] * len(params.sites)
    if signing_keys is None:
        signing_keys = {u: crypto.generate_signing_key() for u in params.sites}
    roster = {u: key.public_key() for u, key in signing_keys.items()}
    sites = {u: SecAggSite(u, params, r, signing_key=signing_keys[u], roster=roster,
                           journal=None if journals is None else journals[u], context=context)
             for u, r in zip(params.sites, site_rngs)}
    server = SecAggServer(params)
    sent = {u: 0 for u in params.sites}
    received = {u: 0 for u in params.sites}

    def send(replies: Mapping[int, bytes]) -> Mapping[int, bytes]:
        for u, data in replies.items():
            sent[u] += len(data)
        return replies

    def deliver(u: int, data: bytes) -> bytes:
        received[u] += len(data)
        return data

    key_list = server.collect_keys(send({u: s.advertise_keys() for u, s in sites.items()}))
    routed = server.route_shares(send({u: s.share_keys(deliver(u, to_site(key_list, u))) for u, s in sites.items()}))
    listing = server.collect_masked(send({u: sites[u].masked_input(arrays[u].ravel(), deliver(u, data))
                                          for u, data in routed.items() if u not in before}))
    responders = [u for u in server.survivors if u not in after]
    signatures = server.collect_signatures(send({u: sites[u].sign_survivors(deliver(u, listing)) for u in responders}))
    total = server.unmask(send({u: sites[u].unmask(deliver(u, to_site(signatures, u))) for u in responders}))
    return SecureSumResult(total=total.reshape(shape), survivors=server.survivors, bytes_sent=sent,
                           bytes_received=received, unmasked_by=tuple(responders))
