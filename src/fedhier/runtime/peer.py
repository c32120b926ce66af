"""Serverless runtime: sites on a peer graph, no coordinator (spec collabdict §2-§4).

Runs any ``combine == "sum"`` :class:`~fedhier.protocol.base.RoundProtocol` the CollabDict
way (Algorithm 1): every site runs ``site_step``; the replies are summed *without a
centre* by one of

* ``"consensus"``: average consensus Eq. (3) on the peer graph for a fixed number of
  steps ``T`` (stopping rule §3.4), sums ``= S x average`` (§3.5);
* ``"chunked"``: the same on ``C`` random zero-sum chunks, with the sites relabelled on
  the graph at every session (§4.1);
* ``"shamir"``: Shamir shares of the fixed-point encoded replies, sent to a public
  committee of ``k`` peers drawn from the run's seed (every peer up to 31 peers), summed
  there and reconstructed by everyone (§4.2): exact and identical everywhere;

then every site runs ``global_step`` on its own copy of the sum.  After consensus a
max-consensus over ``diameter`` steps makes all copies bit-identical (O7).

The algorithm is written once against a small transport interface (neighbour exchange,
all-to-all, all-gather).  :func:`simulate_peers` runs all sites in one process and passes
every message along the graph's edges as encoded bytes (never pickled), counting bytes;
:mod:`fedhier.runtime.mpi` runs the identical code with one site per MPI process.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, get_args

import numpy as np

from .consensus import (consensus_update, max_update, random_chunks, session_placement)
from .graphs import (GraphSpectrum, StepRule, check_adjacency, consensus_schedule, default_graph, diameter,
                     laplacian_spectrum, relabel)
from ..protocol.base import RoundProtocol, SiteContext, check_disclosure
from ..protocol.messages import Field, Message, MessageSpec, decode, encode
from .observers import round_done
if TYPE_CHECKING:
    from .workers import SiteWorkers
from .simulate import (RoundRecord, SiteFailedWarning, _LOST, _pool_init, _site_step_in_worker, decode_state,
                       encode_site_broadcast, encode_state, site_rng)
from ..privacy.sampling import NoiseSource

__all__ = ["PeerAggregation", "ConsensusPlan", "PeerResult", "simulate_peers", "run_peer_rounds", "Transport",
           "InProcessTransport", "aggregate_sums", "Agreement", "PeerLost", "PeerGraphSplit"]


class PeerLost(RuntimeError):
    """Peers did not answer within the deadline (or another peer reported them lost).

    Raised by a :class:`Transport`; :func:`run_peer_rounds` then agrees with the other
    peers on who is lost and redoes the round's aggregation without them.
    """

    public_message = True

    def __init__(self, sites=(), detail: str = "") -> None:
        self.sites = frozenset(int(s) for s in sites)
        super().__init__(f"peer(s) {sorted(self.sites)} stopped answering" + (f" ({detail})" if detail else ""))


@dataclass(frozen=True)
class Agreement:
    """What the surviving peers agreed on after a loss (:meth:`Transport.agree_lost`).

    A message lost half-way leaves peers at different places: a peer that received the
    lost peer's last message passed the barrier (:meth:`Transport.commit` or
    :meth:`Transport.all_true`) the others are still waiting at.  It could only pass it
    because every other peer had already sent it its part, so the others pass it too,
    with the same outcome.

    Attributes
    ----------
    lost : frozenset of int
        Sites that did not take part in the agreement.
    barrier : int
        The most barriers any survivor had passed (this site has passed ``barrier`` or
        ``barrier - 1``).
    outcome : bool or None
        The result of that barrier when it was an :meth:`Transport.all_true`.
    """

    lost: frozenset
    barrier: int
    outcome: bool | None = None


class PeerGraphSplit(RuntimeError):
    """The fit stopped: after losing peers the remaining graph is split (or the survivors
    could not agree on who was lost, or too few remain for the Shamir threshold).

    ``result`` holds this process's sites as they were after the last completed round
    (their copies of the model, private states and history), so that they can be saved.
    """

    public_message = True

    def __init__(self, round: int, lost, message: str, result: "PeerResult") -> None:
        self.round, self.lost, self.result = int(round), sorted(int(s) for s in lost), result
        super().__init__(f"round {round}: {message}; the fit stopped after round {round - 1} "
                         f"(peers lost: {self.lost})")


@dataclass(frozen=True)
class PeerAggregation:
    """How the sum of the replies is computed without a centre (spec §3-§4, O1-O7).

    Attributes
    ----------
    method : {"consensus", "chunked", "shamir"}
    step : {"finite-time", "max-degree", "optimal", "paper"} or float
        Consensus step ``epsilon`` (O1).  ``"finite-time"`` (default): step ``k`` is ``1/mu_k`` for
        the graph's distinct Laplacian eigenvalues ``mu_k``, which reaches the average exactly in
        as many steps (:func:`~fedhier.runtime.graphs.finite_time_steps`), where that is fewer
        steps than ``"max-degree"``, else ``"max-degree"``; the others are constant steps,
        ``"paper"`` the paper's ``1/S``.
    rel_tol : float
        Consensus tolerance relative to the magnitude of the summed vector (sets ``T`` of a
        constant step).
    n_chunks : int
        ``C`` for ``"chunked"`` (O5 default 3).
    mask_scale : float
        Standard deviation of the chunk masks, in the units of the reply: public, the same
        at every site and independent of the data (a mask scaled to the reply would tell
        its scale).  It should exceed the replies' largest entries; the consensus then runs
        to ``rel_tol / mask_scale`` so that the masks cancel.
    relabel : bool
        Re-draw the sites' graph positions at every session (§4.1).
    agree : bool
        Run max-consensus after averaging so every copy is identical (O7).
    frac_bits : int
        Fixed-point fractional bits for ``"shamir"`` (O6: 24).
    threshold : int or None
        Shamir threshold ``t``: the number of committee members whose shares give back the
        sum; default ``floor(k/2) + 1`` for a committee of ``k`` peers.
    committee_size : int or None
        ``k`` for ``"shamir"``: the peers that receive the shares, drawn from the run's
        public seed.  Default: every peer up to 31 peers, then
        ``max(31, 2 ceil(log2 S) + 1, threshold)``, so that each peer sends ``k`` shares, not ``S``.

    Chunk masks are each site's secret: they come from the operating system's CSPRNG at the
    site (:class:`~fedhier.privacy.sampling.NoiseSource`), never from a seed.  Shamir coefficients always
    come from a cryptographic source (the sum does not depend on them).
    """

    method: str = "consensus"
    step: StepRule | float = "finite-time"
    rel_tol: float = 1e-12
    n_chunks: int = 3
    mask_scale: float = 1e4
    relabel: bool = True
    agree: bool = True
    frac_bits: int = 24
    threshold: int | None = None
    committee_size: int | None = None

    def __post_init__(self) -> None:
        if self.method not in ("consensus", "chunked", "shamir"):
            raise ValueError(f"aggregation method must be 'consensus', 'chunked' or 'shamir', got {self.method!r}")
        if isinstance(self.step, str) and self.step not in get_args(StepRule):
            raise ValueError(f"consensus step must be {', '.join(map(repr, get_args(StepRule)))} or a number, "
                             f"got {self.step!r}")
        if self.n_chunks < 1:
            raise ValueError(f"n_chunks must be >= 1, got {self.n_chunks}")
        if self.committee_size is not None and self.committee_size < 1:
            raise ValueError(f"committee_size must be >= 1, got {self.committee_size}")


@dataclass(frozen=True)
class ConsensusPlan:
    """Public constants every site derives offline from the graph (spec §3.2-3.4): the step size of
    each consensus step (:func:`~fedhier.runtime.graphs.consensus_schedule`), for plain sums and for
    chunks (whose masks need the tighter tolerance ``rel_tol / mask_scale``), and the diameter."""

    adjacency: np.ndarray
    spectrum: GraphSpectrum
    steps: tuple[float, ...]
    steps_chunked: tuple[float, ...]
    diameter: int

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def n_steps_chunked(self) -> int:
        return len(self.steps_chunked)

    @classmethod
    def build(cls, adjacency: np.ndarray, aggregation: PeerAggregation) -> "ConsensusPlan":
        a = check_adjacency(adjacency)
        spec = laplacian_spectrum(a)
        steps = consensus_schedule(spec, aggregation.step, aggregation.rel_tol)
        chunked = consensus_schedule(spec, aggregation.step, aggregation.rel_tol / max(aggregation.mask_scale, 1.0))
        return cls(a, spec, steps, chunked, diameter(a))


def _neighbours(adjacency: np.ndarray, site: int) -> tuple[np.ndarray, np.ndarray]:
    idx = np.flatnonzero(adjacency[site])
    return idx, adjacency[site, idx]


class Transport(ABC):
    """Message passing among the sites run by this process (all of them, or one).

    ``alive`` lists the sites still taking part (every site at the start); a method that
    waits for a peer which does not answer raises :class:`PeerLost`.
    """

    n_sites: int
    local_sites: list[int]
    bytes_sent: dict[int, int]
    alive: list[int]
    barriers_passed: int = 0          # commits and all_true calls completed so far
    last_outcome: bool | None = None  # the result of the last one, when an all_true

    def agree_lost(self, suspects) -> Agreement:
        """The lost sites every surviving peer agrees on, starting from this process's
        ``suspects``, and where the survivors stand (all-knowing in-process: the suspects
        themselves, and every site stands at the same place)."""
        return Agreement(frozenset(int(s) for s in suspects), self.barriers_passed, self.last_outcome)

    def set_alive(self, alive) -> None:
        """From now on only ``alive`` take part."""
        self.alive = sorted(int(s) for s in alive)
        self.local_sites = [s for s in self.local_sites if s in self.alive]

    def start_round(self, round: int) -> None:
        """Called at the start of every round (fault injection in tests)."""

    def commit(self) -> None:
        """Return once every surviving peer has finished this round's aggregation (a
        transport whose peers can fail mid-round makes sure no peer applies a round that
        another is redoing).  In-process: nothing to wait for."""

    def pass_barrier(self, agreement: Agreement) -> bool:
        """True when a survivor passed the barrier this site is waiting at: this site then
        passes it too, with the agreed outcome.  Raises PeerLost if the agreement puts
        this site further behind, which a correct peer cannot do."""
        if agreement.barrier == self.barriers_passed:
            return False
        if agreement.barrier != self.barriers_passed + 1:
            raise PeerLost(set(), f"the survivors passed {agreement.barrier} barriers, this site {self.barriers_passed}")
        self.barriers_passed, self.last_outcome = agreement.barrier, agreement.outcome
        return True

    @abstractmethod
    def open_topology(self, adjacency: np.ndarray) -> Any:
        """Prepare neighbour exchange on a (relabelled) graph for one session."""

    @abstractmethod
    def close_topology(self, topology: Any) -> None:
        """Release what :meth:`open_topology` created."""

    @abstractmethod
    def exchange(self, topology: Any, spec: MessageSpec, messages: Mapping[int, Message]) -> dict[int, list[Message]]:
        """Every local site sends its message to each neighbour; returns what each received.

        Received messages are listed in increasing neighbour order.
        """

    def exchange_sessions(self, topologies: Sequence[Any], spec: MessageSpec,
                          messages: Mapping[int, Sequence[Message]]) -> dict[int, list[list[Message]]]:
        """One step of several sessions at once: every local site sends ``messages[s][k]`` to
        each of its neighbours in ``topologies[k]``; returns, for each local site, what it
        received in each session (as :meth:`exchange`).  A transport whose messages cost a
        round trip sends each neighbour one message holding its sessions' parts."""
        inboxes = [self.exchange(topo, spec, {s: messages[s][k] for s in messages})
                   for k, topo in enumerate(topologies)]
        return {s: [inbox[s] for inbox in inboxes] for s in messages}

    @abstractmethod
    def all_to_all(self, spec: MessageSpec, messages: Mapping[int, Sequence[Message]],
                   receivers: Sequence[int] | None = None) -> dict[int, list[Message]]:
        """Site ``s`` sends ``messages[s][i]`` privately to site ``receivers[i]`` (default
        ``alive``); returns, for each local ``j`` among the receivers, the messages received
        from the sites of ``alive``, in that order."""

    @abstractmethod
    def all_gather(self, spec: MessageSpec, messages: Mapping[int, Message], senders: Sequence[int],
                   receivers: Sequence[int] | None = None) -> list[Message]:
        """The sites in ``senders`` send a message to every site of ``receivers`` (default ``alive``),
        which receive all of them (in order); a site outside ``receivers`` gets []."""

    @abstractmethod
    def all_true(self, flags: Mapping[int, bool]) -> bool:
        """Logical AND of one flag per site over all sites."""

    def _count(self, site: int, nbytes: int) -> None:
        self.bytes_sent[site] = self.bytes_sent.get(site, 0) + int(nbytes)


class InProcessTransport(Transport):
    """All sites in this process; every message is encoded to bytes and decoded by its receiver."""

    def __init__(self, n_sites: int, lose: Mapping[int, Sequence[int]] | None = None) -> None:
        self.n_sites = n_sites
        self.local_sites = list(range(n_sites))
        self.alive = list(range(n_sites))
        self.bytes_sent = {}
        self.silent: set[int] = set()
        self.lose = {int(r): [int(s) for s in v] for r, v in (lose or {}).items()}

    def silence(self, sites) -> None:
        """Fault injection: ``sites`` stop answering (as a killed or frozen process would)."""
        self.silent |= {int(s) for s in sites}

    def start_round(self, round: int) -> None:
        self.silence(self.lose.get(round, ()))

    def _check_heard(self, senders) -> None:
        lost = self.silent & {int(s) for s in senders}
        if lost:
            raise PeerLost(lost, "fault injected")

    def open_topology(self, adjacency: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        return [_neighbours(adjacency, s) for s in range(self.n_sites)]

    def close_topology(self, topology: Any) -> None:
        return None

    def exchange(self, topology, spec, messages):
        self._check_heard(j for s in self.local_sites for j in topology[s][0])
        payloads = {s: encode(spec, messages[s]) for s in self.local_sites}
        # every neighbour receives the same bytes; decoding them once per sender is equivalent
        received = {s: decode(spec, payloads[s]) for s in self.local_sites}
        out = {}
        for s in self.local_sites:
            nbrs, _ = topology[s]
            self._count(s, len(payloads[s]) * len(nbrs))
            out[s] = [received[int(j)] for j in nbrs]
        return out

    def all_to_all(self, spec, messages, receivers=None):
        receivers = self.alive if receivers is None else [int(j) for j in receivers]
        self._check_heard(self.alive)
        out: dict[int, list[Message]] = {j: [] for j in self.local_sites if j in receivers}
        for s in self.local_sites:
            for j, message in zip(receivers, messages[s]):
                payload = encode(spec, message)
                if j != s:
                    self._count(s, len(payload))
                if j in out:
                    out[j].append(decode(spec, payload))
        return out

    def all_gather(self, spec, messages, senders, receivers=None):
        receivers = self.alive if receivers is None else [int(j) for j in receivers]
        self._check_heard(senders)
        out = []
        for s in senders:
            payload = encode(spec, messages[s])
            self._count(s, len(payload) * len([j for j in receivers if j != s]))
            out.append(decode(spec, payload))
        return out if any(s in receivers for s in self.local_sites) else []

    def all_true(self, flags):
        self._check_heard(self.alive)
        return all(bool(v) for v in flags.values())


def _vector_spec(size: int, dtype: str = "float64") -> MessageSpec:
    return MessageSpec("collab-aggregate", {"x": Field((size,), dtype)})


def _consensus_sessions(transport: Transport, adjacencies: Sequence[np.ndarray], values: dict[int, np.ndarray],
                        steps: Sequence[float], spec: MessageSpec) -> dict[int, np.ndarray]:
    """Consensus steps of sizes ``steps`` of K sessions in lock step, session k on ``adjacencies[k]``:
    ``values[s]`` (K, m) -> each row averaged over the sites of its session's graph.  The
    sessions are independent; running them together only puts a step's K messages to a
    neighbour in one round trip."""
    topos = [transport.open_topology(a) for a in adjacencies]
    try:
        mult = {s: [_neighbours(a, s)[1] for a in adjacencies] for s in transport.local_sites}
        x = {s: list(v) for s, v in values.items()}
        for eps in steps:
            inbox = transport.exchange_sessions(topos, spec, {s: [{"x": xk} for xk in x[s]] for s in x})
            x = {s: [consensus_update(xk, [m["x"] for m in inbox[s][k]], mult[s][k], eps) for k, xk in enumerate(x[s])]
                 for s in x}
    finally:
        for topo in topos:
            transport.close_topology(topo)
    return {s: np.array(v) for s, v in x.items()}


def _agree(transport: Transport, adjacency: np.ndarray, values: dict[int, np.ndarray], n_steps: int,
           spec: MessageSpec) -> dict[int, np.ndarray]:
    topo = transport.open_topology(adjacency)
    try:
        x = dict(values)
        for _ in range(n_steps):
            inbox = transport.exchange(topo, spec, {s: {"x": x[s]} for s in x})
            x = {s: max_update(x[s], [m["x"] for m in inbox[s]]) for s in x}
    finally:
        transport.close_topology(topo)
    return x


def _shamir_sums(transport: Transport, vectors: dict[int, np.ndarray], aggregation: PeerAggregation,
                 seed: int) -> tuple[dict[int, np.ndarray], int]:
    """Sum of the replies by Shamir sharing to a committee (spec §4.2).

    Every alive site ``s`` encodes its reply ``v_s`` (m,) in fixed point and sends share ``i``
    (the evaluation at ``z = i + 1``) of it to committee member ``i`` only; member ``i`` adds
    the shares it receives, ``sigma_i = sum_s f_s(i + 1)``, a share of ``sum_s v_s``; the
    first ``t`` members send theirs to each other and each interpolates the sum at 0.  The sum
    then passes down a public tree rooted at those ``t`` (:func:`publishing_tree`): in each of
    its ``depth`` steps every site sends its tree neighbours the encoded sum if it has it, else
    -1 (no field element), and keeps the elementwise maximum.  So every site has the sum, and
    none sends more than ``t - 1 + depth (b + 1)`` vectors besides its ``k`` shares, where the
    depth grows as ``log_b(S / t)``.  Returns the sums and the tree's depth (exchanges).
    """
    from ..secure.fixedpoint import PRIME, FixedPoint
    from ..secure.shamir import reconstruct, share

    n_sites, alive = transport.n_sites, transport.alive
    size = next(iter(vectors.values())).size
    threshold = shamir_threshold(aggregation, n_sites)
    committee = shamir_committee(seed, n_sites, alive, shamir_committee_size(aggregation, n_sites))
    codec = FixedPoint(frac_bits=aggregation.frac_bits, modulus=PRIME,
                       max_abs=2.0 ** (60 - aggregation.frac_bits) / (n_sites + 1))
    spec = _vector_spec(size, "int64")
    shares = {}
    for s, v in vectors.items():
        try:
            encoded = codec.encode(v)
        except OverflowError as exc:
            raise OverflowError(
                f"site {s}: Shamir sharing encodes values up to {codec.max_abs:.3g} in fixed point "
                f"(frac_bits={aggregation.frac_bits}), and this site's sums are larger ({exc}). Centre and scale the "
                "data before fitting (a round of raw moments shares sums of squares), lower frac_bits, or use the "
                "'consensus' or 'chunked' aggregation"
            ) from None
        rows = share(encoded, len(committee), threshold, rng=None)  # row i at z = i + 1, for committee[i]
        shares[s] = [{"x": row} for row in rows]
    received = transport.all_to_all(spec, shares, receivers=committee)
    member_sums = {}
    for j, msgs in received.items():
        acc = np.zeros(size, dtype=np.int64)
        for m in msgs:
            acc = (acc + m["x"]) % PRIME
        member_sums[j] = {"x": acc}
    publishers = committee[:threshold]
    published = transport.all_gather(spec, {j: member_sums[j] for j in publishers if j in member_sums}, publishers,
                                     receivers=publishers)
    unknown = np.full(size, -1, dtype=np.int64)
    totals = {s: unknown for s in transport.local_sites}
    if published:
        total = np.asarray(reconstruct(np.stack([m["x"] for m in published]), np.arange(1, threshold + 1)),
                           dtype=np.int64)
        totals.update({s: total for s in transport.local_sites if s in publishers})
    tree, depth = publishing_tree(shamir_committee(seed, n_sites, alive, len(alive)), threshold, n_sites)
    totals = _agree(transport, tree, totals, depth, spec)
    return {s: codec.decode(totals[s], n_summands=len(alive)) for s in transport.local_sites}, depth


#: Up to this many peers every peer receives a share; above it the shares go to a committee this large or larger.
SMALLEST_COMMITTEE = 31
_COMMITTEE_STREAM = 0x5A3  # keeps the committee's draw apart from the other public draws from the seed


def shamir_committee_size(aggregation: PeerAggregation, n_sites: int) -> int:
    """``k``, the number of peers that receive Shamir shares in a run of ``n_sites`` peers.

    ``aggregation.committee_size`` if set, else ``max(31, 2 ceil(log2 S) + 1, t)`` for a
    user's threshold ``t``; never more than ``S``.
    """
    if aggregation.committee_size is not None:
        return min(n_sites, aggregation.committee_size)
    return min(n_sites, max(SMALLEST_COMMITTEE, 2 * int(np.ceil(np.log2(n_sites))) + 1, aggregation.threshold or 0))


def shamir_committee(seed: int, n_sites: int, alive: Sequence[int], size: int) -> list[int]:
    """The Shamir committee: the first ``size`` alive sites in an order of all ``n_sites`` sites
    drawn from the run's public seed, so every site derives the same committee; when a member
    is lost the next alive site in that order takes its place."""
    alive_set = {int(s) for s in alive}
    order = np.random.default_rng([int(seed), _COMMITTEE_STREAM]).permutation(n_sites)
    return [int(s) for s in order if int(s) in alive_set][:size]


#: children of a site in the tree that passes the Shamir sum on from the publishing committee members
TREE_BRANCHING = 4


def publishing_tree(order: Sequence[int], n_roots: int, n_sites: int) -> tuple[np.ndarray, int]:
    """The public tree that passes a sum from the first ``n_roots`` sites of ``order`` to the others.

    Site ``order[i]``, ``i >= n_roots``, hangs below ``order[(i - n_roots) // b]`` (``b =``
    :data:`TREE_BRANCHING`), so every site has at most ``b`` children and one parent, and the
    sum reaches every site within ``depth`` steps, the smallest ``D`` with
    ``n_roots (1 + b + ... + b^D) >= len(order)``.  Returns the adjacency (n_sites, n_sites) and ``depth``.
    """
    tree = np.zeros((n_sites, n_sites), dtype=int)
    for i in range(n_roots, len(order)):
        parent = order[(i - n_roots) // TREE_BRANCHING]
        tree[order[i], parent] = tree[parent, order[i]] = 1
    depth, covered, level = 0, n_roots, n_roots
    while covered < len(order):
        level *= TREE_BRANCHING
        covered += level
        depth += 1
    return tree, depth


def shamir_threshold(aggregation: PeerAggregation, n_sites: int) -> int:
    """The Shamir threshold t of a run with ``n_sites`` peers (default ``floor(k/2) + 1`` for a committee of k)."""
    size = shamir_committee_size(aggregation, n_sites)
    threshold = aggregation.threshold or size // 2 + 1
    if not 1 <= threshold <= size:
        raise ValueError(f"Shamir threshold must lie in 1..{size} (the committee size), got {threshold}")
    return threshold


def _embed(sub: np.ndarray, alive: Sequence[int], n_sites: int) -> np.ndarray:
    """The graph on ``alive`` (its own numbering) as an ``n_sites`` x ``n_sites`` adjacency (lost sites isolated)."""
    if len(alive) == n_sites:
        return sub
    full = np.zeros((n_sites, n_sites), dtype=sub.dtype)
    full[np.ix_(alive, alive)] = sub
    return full


def connected(adjacency: np.ndarray) -> bool:
    """Whether the graph is connected (breadth-first search)."""
    n = adjacency.shape[0]
    seen, frontier = {0}, [0]
    while frontier:
        nxt = [int(j) for i in frontier for j in np.flatnonzero(adjacency[i]) if int(j) not in seen]
        seen.update(nxt)
        frontier = nxt
    return len(seen) == n


def aggregate_sums(transport: Transport, vectors: dict[int, np.ndarray], *, round: int, seed: int,
                   plan: ConsensusPlan, aggregation: PeerAggregation) -> tuple[dict[int, np.ndarray], int]:
    """Every local site's copy of ``sum_s vectors[s]`` computed without a centre.

    Parameters
    ----------
    vectors : dict site -> ndarray (m,)
        The flattened replies of the local sites.
    seed : int
        The run's public seed (relabelling of the graph, known to every site).  The chunk
        masks come from each site's operating system (:class:`~fedhier.privacy.sampling.NoiseSource`).

    Returns
    -------
    sums : dict site -> ndarray (m,)
    n_exchanges : int
        Neighbour exchanges (consensus + agreement steps) in this aggregation.
    """
    n_sites, alive = transport.n_sites, transport.alive
    if aggregation.method == "shamir":
        return _shamir_sums(transport, vectors, aggregation, seed)
    size = next(iter(vectors.values())).size
    spec = _vector_spec(size)
    if aggregation.method == "chunked":
        chunks = {}
        for s, v in vectors.items():
            chunks[s] = random_chunks(v, aggregation.n_chunks, aggregation.mask_scale, NoiseSource())
        steps = plan.steps_chunked
    else:
        chunks = {s: v[None, :] for s, v in vectors.items()}
        steps = plan.steps
    n_sessions = next(iter(chunks.values())).shape[0]
    adjacencies = []
    for session in range(n_sessions):  # plan.adjacency is the graph on the alive sites, in their own numbering
        adjacency = plan.adjacency
        if aggregation.relabel:
            adjacency = relabel(plan.adjacency, session_placement(seed, round, session, len(alive)))
        adjacencies.append(_embed(adjacency, alive, n_sites))
    avg = _consensus_sessions(transport, adjacencies, chunks, steps, spec)
    totals = {s: np.zeros(size) for s in vectors}
    for session in range(n_sessions):
        totals = {s: totals[s] + avg[s][session] for s in totals}
    exchanges = n_sessions * len(steps)
    if aggregation.agree:
        totals = _agree(transport, adjacencies[-1], totals, plan.diameter, spec)
        exchanges += plan.diameter
    return {s: len(alive) * t for s, t in totals.items()}, exchanges


@dataclass
class PeerResult:
    """Outcome of a serverless run.

    Attributes
    ----------
    broadcasts : dict site -> Message
        Each local site's own copy of the global model after the last round.
    history : list of dict
        Per round: ``round``, ``exchanges`` (neighbour exchanges per site), ``bytes_sent``
        (per local site, this round), ``disagreement`` (max abs difference between the
        sites' copies of the sum; in-process only), protocol metrics.
    site_states : dict site -> dict
    plan : ConsensusPlan or None
    seed : int
        The run's public seed.
    """

    broadcasts: dict[int, Message]
    history: list[dict[str, Any]]
    site_states: dict[int, dict[str, np.ndarray]]
    plan: ConsensusPlan | None
    seed: int

    @property
    def broadcast(self) -> Message:
        """The global model held by the lowest-numbered local site."""
        return self.broadcasts[min(self.broadcasts)]


def _remaining_problem(adjacency: np.ndarray | None, alive: Sequence[int], aggregation: PeerAggregation,
                       n_sites: int) -> str | None:
    """Why the fit cannot go on with the sites ``alive``, or None."""
    if aggregation.method == "shamir":
        threshold = shamir_threshold(aggregation, n_sites)
        if len(alive) < threshold:
            return f"{len(alive)} peers remain, fewer than the Shamir threshold {threshold}"
        return None
    if len(alive) < 3:
        return f"only {len(alive)} peer(s) remain; the peer graph needs at least 3"
    if not connected(adjacency[np.ix_(alive, alive)]):
        return "the remaining peers no longer form a connected graph (the lost peers split it)"
    return None


def _plan(adjacency: np.ndarray | None, alive: Sequence[int], aggregation: PeerAggregation) -> ConsensusPlan | None:
    if aggregation.method == "shamir":
        return None
    graph = check_adjacency(adjacency[np.ix_(alive, alive)])
    return _plan_of(graph.tobytes(), graph.shape[0], aggregation)


@lru_cache(maxsize=4)
def _plan_of(graph: bytes, n_sites: int, aggregation: PeerAggregation) -> ConsensusPlan:
    """The plan of a graph (its int64 adjacency's bytes), kept: a fit needs the same plan for every run of its
    rounds (the variables' moments, then the model's), and its spectrum and schedule cost a millisecond at 7
    sites and a quarter of a second at 1,000."""
    plan = ConsensusPlan.build(np.frombuffer(graph, dtype=np.int64).reshape(n_sites, n_sites), aggregation)
    plan.adjacency.setflags(write=False)  # shared by every run that uses it
    return plan


def run_peer_rounds(protocol: RoundProtocol, site_data: Mapping[int, Any], transport: Transport, *, n_rounds: int,
                    adjacency: np.ndarray | None, aggregation: PeerAggregation, seed: int,
                    site_seed: int | None = None, stop: Callable[[Message], bool] | None = None,
                    on_round: Callable[["PeerResult"], None] | None = None,
                    workers: SiteWorkers | None = None, start: "PeerResult | None" = None) -> PeerResult:
    """Algorithm 1 on the sites of ``transport`` (shared by the in-process and MPI runtimes).

    ``seed`` is the run's public seed, known to every site (graph relabelling);
    ``site_seed`` seeds the local sites' generators for what is not secret (starts,
    :func:`~fedhier.runtime.simulate.site_rng`), None for the operating system's entropy;
    their secrets (chunk masks, mitigation noise) always come from the operating system.

    ``stop(broadcast)`` is evaluated by every site on its own copy after each global
    step; the run ends when it holds at every site (a fixed cap ``n_rounds`` applies, O7).
    ``on_round(result)`` is called after every round with the local sites' result so far
    (e.g. to save their state).

    Lost peers: when the transport reports peers that stopped answering
    (:class:`PeerLost`), the survivors agree on who is lost (:meth:`Transport.agree_lost`)
    and redo the round's aggregation on the graph that remains, from the replies they
    already computed: the round's sum is then the sum over the surviving sites (as if the
    lost ones had been absent), and so is every later round's.  If the remaining graph is
    split, fewer than 3 peers (or fewer than the Shamir threshold) remain, or the
    survivors cannot agree, the run stops with :class:`PeerGraphSplit`, which carries
    every local site's model, state and history after the last completed round.

    ``workers`` (in-process sites only, :func:`simulate_peers` with ``site_timeout``): the local
    sites' steps run in these worker processes under their deadline; a site whose step overruns
    it, fails or loses its worker stops answering from that round on (it is lost, as above).

    ``start``: the local sites' result after round ``r = len(start.history)`` of an earlier run of
    the same fit, every site's at the same round (a resume); the run goes on with round ``r + 1``,
    which draws what an uninterrupted run's round ``r + 1`` draws.
    """
    if protocol.combine != "sum":
        raise ValueError(f"protocol {protocol.name!r} combines by {protocol.combine!r}; the peer runtime computes sums")
    n_sites = transport.n_sites
    alive = list(transport.alive)
    plan = _plan(adjacency, alive, aggregation)
    for s in transport.local_sites:
        protocol.validate_site_data(s, site_data[s])
    initial = protocol.broadcast_spec.validate(protocol.initial_broadcast())
    if start is None:
        broadcasts = {s: dict(initial) for s in transport.local_sites}
        states: dict[int, dict[str, np.ndarray]] = {s: {} for s in transport.local_sites}
        history: list[dict[str, Any]] = []
    else:
        broadcasts = {s: protocol.broadcast_spec.validate(start.broadcasts[s]) for s in transport.local_sites}
        states = {s: dict(start.site_states[s]) for s in transport.local_sites}
        history = list(start.history)
        if stop is not None and transport.all_true({s: stop(broadcasts[s]) for s in transport.local_sites}):
            return PeerResult(broadcasts, history, states, plan, seed)  # it had stopped after its last saved round
    lost_so_far: set[int] = set()
    carried: set[int] = set()  # lost while finishing the last round, after a survivor had started this one
    for rnd in range(len(history) + 1, int(n_rounds) + 1):
        before = dict(transport.bytes_sent)
        completed = PeerResult(dict(broadcasts), list(history), dict(states), plan, seed)
        lost_now, carried = carried, set()

        def recover(exc: PeerLost) -> Agreement:
            nonlocal alive, plan
            try:
                agreement = transport.agree_lost(exc.sites)
            except PeerLost as disagreement:
                raise PeerGraphSplit(rnd, lost_so_far | exc.sites, str(disagreement), completed) from None
            lost = agreement.lost - lost_so_far
            lost_now.update(lost)
            lost_so_far.update(lost)
            alive = [s for s in alive if s not in lost]
            transport.set_alive(alive)
            for s in list(broadcasts):
                if s not in transport.local_sites:
                    del broadcasts[s], states[s]
            problem = _remaining_problem(adjacency, alive, aggregation, n_sites)
            if problem:
                keep = transport.local_sites
                raise PeerGraphSplit(rnd, lost_so_far, problem, PeerResult(
                    {s: b for s, b in completed.broadcasts.items() if s in keep}, completed.history,
                    {s: st for s, st in completed.site_states.items() if s in keep}, completed.plan, seed))
            plan = _plan(adjacency, alive, aggregation)
            return agreement

        def passed_elsewhere(agreement: Agreement) -> bool:
            try:
                return transport.pass_barrier(agreement)
            except PeerLost as exc:
                raise PeerGraphSplit(rnd, lost_so_far, str(exc), completed) from None

        transport.start_round(rnd)
        vectors = {}
        if workers is None:
            for s in transport.local_sites:
                ctx = SiteContext(site=s, round=rnd, rng=site_rng(site_seed, rnd, s), data=site_data[s],
                                  state=dict(states[s]))
                reply = protocol.site_step(ctx, protocol.site_broadcast(broadcasts[s], s))
                check_disclosure(protocol, reply, ctx.releases)
                states[s] = ctx.state
                vectors[s] = protocol.reply_spec.flatten(reply)
        else:
            _steps_in_workers(workers, protocol, transport, rnd, site_seed, broadcasts, states, vectors)
        while True:
            sums = None
            try:
                sums, exchanges = aggregate_sums(transport, {s: vectors[s] for s in transport.local_sites}, round=rnd,
                                                 seed=seed, plan=plan, aggregation=aggregation)
                transport.commit()
                break
            except PeerLost as exc:
                if passed_elsewhere(recover(exc)):  # a survivor passed the commit: every site had its sum
                    if sums is None:  # this one was still summing, which no correct peer allows
                        raise PeerGraphSplit(rnd, lost_so_far, "the surviving peers are out of step", completed) from None
                    break
        cache: dict[bytes, Message] = {}
        for s in transport.local_sites:
            key = sums[s].tobytes() + b"|" + encode(protocol.broadcast_spec, broadcasts[s])
            if key not in cache:  # identical inputs give identical outputs: compute once per distinct copy
                combined = protocol.reply_spec.unflatten(sums[s])
                cache[key] = protocol.broadcast_spec.validate(protocol.global_step(combined, rnd, broadcasts[s]))
            broadcasts[s] = dict(cache[key])
        first = transport.local_sites[0]
        stacked = np.stack([sums[s] for s in transport.local_sites])
        record = {
            "round": rnd,
            "exchanges": exchanges,
            "bytes_sent": {s: transport.bytes_sent.get(s, 0) - before.get(s, 0) for s in transport.local_sites},
            "disagreement": float(np.max(np.abs(stacked - stacked[0]))) if len(stacked) > 1 else 0.0,
            "metrics": protocol.round_metrics(protocol.reply_spec.unflatten(sums[first]), rnd),
            "sites": list(alive),
            "lost": sorted(lost_now),
            "absent": sorted(lost_so_far),
        }
        history.append(record)
        round_done(RoundRecord(round=rnd, sites=list(alive), absent=sorted(lost_so_far), failed={s: "lost" for s in lost_now},
                               bytes_up=record["bytes_sent"], bytes_down={}, metrics=record["metrics"]), broadcasts[first])
        result = PeerResult(broadcasts, history, states, plan, seed)
        if on_round is not None:
            on_round(result)
        if stop is None:
            continue
        while True:
            try:
                done = transport.all_true({s: stop(broadcasts[s]) for s in transport.local_sites})
                break
            except PeerLost as exc:
                completed, known = result, set(lost_now)
                if passed_elsewhere(recover(exc)):  # a survivor has its outcome: it finished, or began the next round
                    done, carried = bool(transport.last_outcome), lost_now - known
                    break
                # lost after this round's aggregation
                history[-1].update(sites=list(alive), lost=sorted(lost_now), absent=sorted(lost_so_far))
        if done:
            break
    return PeerResult(broadcasts, history, states, plan, seed)


def simulate_peers(protocol: RoundProtocol, sites: Sequence[Any], *, n_rounds: int, graph: np.ndarray | None = None,
                   aggregation: PeerAggregation | None = None, random_state: int | None = None,
                   stop: Callable[[Message], bool] | None = None,
                   lose: Mapping[int, Sequence[int]] | None = None, site_timeout: float | None = None) -> PeerResult:
    """Run ``protocol`` on ``S = len(sites)`` peers in this process (spec Algorithm 1).

    Parameters
    ----------
    protocol : RoundProtocol with ``combine == "sum"``
    sites : sequence
        Private data of site ``s`` at position ``s``.
    n_rounds : int
        Cap on outer iterations.
    graph : ndarray (S, S), optional
        Peer graph; default :func:`~fedhier.runtime.graphs.default_graph` (O2)
        from the run's seed.
    aggregation : PeerAggregation, optional
    random_state : int, optional
        The run's public seed (graph, relabelling, the sites' starts), as for
        :func:`fedhier.runtime.simulate.simulate`; None: one is drawn.  Every site's secrets
        (chunk masks, mitigation noise) come from the operating system.
    stop : callable, optional
        ``stop(broadcast) -> bool``, see :func:`run_peer_rounds`.
    lose : mapping round -> sites, optional
        Fault injection: these sites stop answering in that round, after their site step
        (as a killed or frozen peer would); the others go on without them, or stop with
        :class:`PeerGraphSplit` (see :func:`run_peer_rounds`).
    site_timeout : float, optional
        Deadline of one site step, in seconds (None: no deadline).  The steps then run in a
        worker process (:class:`~fedhier.runtime.workers.SiteWorkers`); a site that has not
        answered by the deadline, or whose step failed, is lost from that round on, as a frozen
        peer is (see ``lose``).
    """
    n_sites = len(sites)
    seed = int(np.random.SeedSequence(random_state).entropy if random_state is None else random_state)
    aggregation = aggregation or PeerAggregation()
    adjacency = default_graph(n_sites, seed) if graph is None else check_adjacency(graph)
    if adjacency.shape[0] != n_sites:
        raise ValueError(f"peer graph has {adjacency.shape[0]} vertices but there are {n_sites} sites")
    transport = InProcessTransport(n_sites, lose)
    if site_timeout is None:
        return run_peer_rounds(protocol, dict(enumerate(sites)), transport, n_rounds=n_rounds, adjacency=adjacency,
                               aggregation=aggregation, seed=seed, site_seed=seed, stop=stop)
    from .workers import SiteWorkers

    with SiteWorkers(1, _site_step_in_worker, _pool_init, (protocol, sites), timeout=site_timeout) as workers:
        return run_peer_rounds(protocol, dict(enumerate(sites)), transport, n_rounds=n_rounds, adjacency=adjacency,
                               aggregation=aggregation, seed=seed, site_seed=seed, stop=stop,
                               workers=workers)


def _steps_in_workers(workers: SiteWorkers, protocol: RoundProtocol, transport: InProcessTransport, rnd: int,
                      site_seed: int | None, broadcasts: dict, states: dict, vectors: dict) -> None:
    """The local sites' steps of round ``rnd`` in ``workers``, under their deadline; fills ``states`` and ``vectors``.

    A site without a reply (its step overran the deadline, failed, or lost its worker) is silenced: it stops
    answering, so the round's aggregation reports it lost and the others go on without it.  Its vector is
    zeros, never summed (the survivors redo the round without it)."""
    import warnings

    done = workers.run({s: (s, rnd, site_seed, encode_site_broadcast(protocol, broadcasts[s], s), encode_state(states[s]))
                        for s in transport.local_sites}, describe_lost=lambda why: _LOST[why].format(workers.timeout))
    for s in transport.local_sites:
        status, payload, state_bytes = done[s]
        if status == "ok":
            states[s] = decode_state(state_bytes)
            vectors[s] = protocol.reply_spec.flatten(decode(protocol.reply_spec, payload))
        else:
            transport.silence([s])
            vectors[s] = np.zeros(sum(f.size for f in protocol.reply_spec.fields.values()))
            warnings.warn(f"round {rnd}: site {s} gave no reply ({str(payload).splitlines()[0]}); the other peers go on "
                          "without it for the rest of the fit", SiteFailedWarning, stacklevel=3)
