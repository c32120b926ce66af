"""Secure summation as the combine step of a sum-protocol round (``aggregation="secure"``).

Adapter between the runtime and :mod:`fedhier.secure.secagg`: every reply is flattened
in its spec's declared order (absent optional fields as zeros), encoded in fixed point,
masked, and only the masked vectors and the Shamir shares reach the server object, which
recovers the field-wise sum.  :meth:`SecureAggregator.sum` runs the whole exchange in
process (:func:`fedhier.runtime.simulate`); :meth:`SecureAggregator.params` gives a runtime
that carries each step over the network (:mod:`fedhier.runtime.flower`) the same session.
See ``docs/secure-aggregation.md``.
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterable, Mapping

import numpy as np

from ..protocol.messages import Message, MessageSpec
from . import keys as crypto
from .fixedpoint import FixedPoint
from .secagg import SecAggParams, default_neighbours, harary_graph, secure_sum

__all__ = ["SecureAggregator"]


class SecureAggregator:
    """Secure sum for the round loop of :func:`fedhier.runtime.simulate`.

    Parameters
    ----------
    n_sites : int
        Number of sites of the federation.
    threshold : int, optional
        Shamir threshold t: the sum is recovered while at least t sites remain (on a
        sparse graph: while at least t sites of every neighbourhood remain), and fewer
        than t colluding sites (neighbours) learn nothing. Default a majority:
        ``n_sites // 2 + 1`` on the complete graph, ``(k + 1) // 2 + 1`` on a sparse one.
    neighbours : "auto", None or int, default "auto"
        The communication graph of the secure sum.  None: complete (every pair of sites
        shares masks; O(S) work and bytes per site).  An even k: SecAgg+ on a public random
        k-regular graph drawn each round from the round's label (O(k) per site).
        "auto": complete up to :data:`~fedhier.secure.secagg.COMPLETE_UP_TO` (100) sites,
        above it ``k = 2 * ceil(1.5 * log2 S)``
        (:func:`~fedhier.secure.secagg.default_neighbours`; 26 for 300 sites, 30 for 1,000).
    frac_bits : int, default 30
        Fixed-point fractional bits: each reply entry is rounded to 2^-frac_bits
        (precision 9.3e-10).  The largest magnitude that can be summed without wrapping
        is ``2^(60 - frac_bits - ceil(log2(n_sites + 1)))`` (1.3e8 for 5 sites); a larger
        entry is refused with ``OverflowError``.
    drop_before_masking, drop_after_masking : mapping round -> sites, optional
        Fault injection for tests and demonstrations: sites that drop out of the secure
        sum before sending their masked input (their reply is not counted) or after it
        (it is counted, its masks are removed with the other sites' shares).

    In a simulation (:meth:`sum`) every site gets a long-term Ed25519 key from the
    operating system when the aggregator is made; the roster is their public keys
    (:attr:`roster`), and each site keeps a journal of the broadcasts it answered.
    """

    def __init__(
        self,
        n_sites: int,
        *,
        threshold: int | None = None,
        neighbours: int | None | str = "auto",
        frac_bits: int = 30,
        drop_before_masking: Mapping[int, Iterable[int]] | None = None,
        drop_after_masking: Mapping[int, Iterable[int]] | None = None,
    ):
        if n_sites < 2:
            raise ValueError("secure aggregation needs at least 2 sites")
        self.n_sites = int(n_sites)
        if isinstance(neighbours, str):
            if neighbours != "auto":
                raise ValueError(f"neighbours must be 'auto', None or an even integer, got {neighbours!r}")
            neighbours = default_neighbours(self.n_sites)
        if neighbours is not None:
            harary_graph(range(self.n_sites), neighbours, b"")  # refuses an odd or too large k now
            neighbours = int(neighbours)
        self.neighbours = neighbours
        largest = self.n_sites if neighbours is None else int(neighbours) + 1
        self.threshold = int(threshold) if threshold is not None else largest // 2 + 1
        if not largest // 2 + 1 <= self.threshold <= largest:
            raise ValueError(f"threshold must be more than half of {largest}"
                             f"{' sites' if neighbours is None else ' (neighbours + 1)'} and at most {largest}, "
                             f"got {self.threshold}")
        self.fixed_point = FixedPoint(
            frac_bits=frac_bits, max_abs=2.0 ** (60 - frac_bits - math.ceil(math.log2(self.n_sites + 1)))
        )
        self.drop_before_masking = {int(r): [int(s) for s in v] for r, v in (drop_before_masking or {}).items()}
        self.drop_after_masking = {int(r): [int(s) for s in v] for r, v in (drop_after_masking or {}).items()}
        self._signing_keys = {s: crypto.generate_signing_key() for s in range(self.n_sites)}
        self._journals: dict[int, set[bytes]] = {s: set() for s in range(self.n_sites)}

    def __getstate__(self) -> dict:
        # the simulated sites' long-term keys are secrets of this process: a copy (pickle) draws its own
        return {k: v for k, v in self.__dict__.items() if k != "_signing_keys"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._signing_keys = {s: crypto.generate_signing_key() for s in range(self.n_sites)}

    @property
    def roster(self) -> dict[int, object]:
        """The simulated sites' long-term public keys (site -> Ed25519 public key)."""
        return {s: key.public_key() for s, key in self._signing_keys.items()}
    @property
    def precision(self) -> float:
        """Rounding step of each summand (the bound on a sum's error is n * precision / 2)."""
        return self.fixed_point.precision

    def params(self, spec: MessageSpec, round: int) -> SecAggParams:
        """Public parameters of the secure sum of the ``spec`` replies of ``round`` among sites 0..n_sites-1.

        For a runtime that drives :class:`~fedhier.secure.secagg.SecAggSite` and
        :class:`~fedhier.secure.secagg.SecAggServer` over a network (Flower): both halves
        build the same parameters; a site without a reply this round never advertises keys.
        Each site's input is ``spec.flatten(reply)``, of length ``sum of the field sizes``;
        the server's total unflattens with ``spec.unflatten``.  Threshold, fixed point and
        session label are those of :meth:`sum`, so both give the same total.  On a sparse
        graph (``neighbours`` not None) the server's key list and signatures are one
        message per site (:func:`fedhier.secure.secagg.to_site`).
        """
        length = sum(f.size for f in spec.fields.values())
        return SecAggParams(tuple(range(self.n_sites)), self.threshold, self.fixed_point, length, _session(spec, round),
                            self.neighbours)

    def sum(
        self, spec: MessageSpec, replies: Mapping[int, Message], round: int, rng: np.random.Generator,
        context: bytes = b"",
    ) -> tuple[Message, dict[int, int], list[int]]:
        """Field-wise sum of ``replies``; returns (sum, bytes sent per site, contributing sites).

        ``context`` names what the replies answer (the run and its broadcast): each site
        sends a masked input for a given context and reply kind once.  Raises
        :class:`fedhier.secure.secagg.InsufficientSitesError` (no partial sum) when fewer
        than ``threshold`` sites remain, :class:`fedhier.secure.secagg.SecAggProtocolError`
        when a site already answered this context.
        """
        vectors = {int(s): spec.flatten(r) for s, r in replies.items()}
        before = [s for s in self.drop_before_masking.get(round, ()) if s in vectors]
        after = [s for s in self.drop_after_masking.get(round, ()) if s in vectors]
        result = secure_sum(
            vectors,
            threshold=self.threshold,
            fixed_point=self.fixed_point,
            drop_before_masking=before,
            drop_after_masking=after,
            rng=None,  # cryptographic randomness: masks cancel exactly, the sum is deterministic
            session=_session(spec, round),
            neighbours=self.neighbours,
            signing_keys=self._signing_keys,
            journals=self._journals,
            context=hashlib.sha256(b"fedhier-secagg-answer\0" + spec.name.encode() + b"\0" + context).digest(),
        )
        contributors = sorted(s for s in vectors if s not in before)
        return spec.unflatten(result.total), {int(k): int(v) for k, v in result.bytes_sent.items()}, contributors


def _session(spec: MessageSpec, round: int) -> bytes:
    """Session label of a round's secure sum: fresh per round and per message kind."""
    return f"fedhier/{spec.name}/round-{round}".encode()
