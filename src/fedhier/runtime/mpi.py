"""MPI runtime: one site per process, messages point to point with deadlines (spec collabdict §3-§4).

Install with ``pip install -e ".[mpi]"`` (``mpi4py`` and the ``mpich`` wheel, which
provides ``mpiexec``).  The same fit then runs as ``S`` real processes::

    mpiexec -n 7 python -m fedhier.cli.collab fit --runtime mpi --csv data.csv --site-column site --out model.npz

(across machines: ``mpiexec -f hostfile -n S ...``).  Rank ``s`` is site ``s``.

The algorithm is :func:`fedhier.runtime.peer.run_peer_rounds`, unchanged; this module only
supplies the transport:

* every message goes point to point (non-blocking ``Isend``, receives polled against a
  deadline, with a pause that starts at microseconds after every arrival): neighbour exchange
  on the peer graph (one message per neighbour per consensus step, holding the parts of every
  session of the step in which it is a neighbour), Shamir shares to the committee, the
  publishers' sums to each other and the sum down the publishing tree; only the run's seed (when not given) is broadcast at the start;
* every payload is the byte string of :func:`fedhier.protocol.messages.encode` sent as a
  ``uint8`` buffer behind an (epoch, sequence) stamp (upper-case mpi4py methods): nothing is
  pickled;
* a peer silent past the deadline (``timeout``, :data:`DEFAULT_TIMEOUT`) is reported lost;
  the survivors agree on it, and on the last barrier any of them passed, and go on without
  it, or stop (``docs/architecture.md``, "Failures").  MPICH itself ends the whole job
  when a rank is killed; a frozen rank is left out.

Each rank's secrets (its chunk masks, its step's noise) come from the operating system's
CSPRNG at the rank, whatever the seeds; ``site_seed`` seeds only its step's generator for
what is not secret (starts), for tests and reproductions.  With ``random_state`` and
``site_seed`` both equal to the simulator's ``random_state`` the two runtimes start alike
and agree up to the consensus tolerance (the masks differ).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import struct
import sys
import time
from typing import Any, Callable, Iterator

import numpy as np

from .graphs import check_adjacency, default_graph
from ..protocol.base import RoundProtocol
from ..protocol.messages import Message, MessageError, MessageSpec, decode, encode
from .peer import Agreement, PeerAggregation, PeerLost, PeerResult, Transport, run_peer_rounds

__all__ = ["MPITransport", "run_mpi", "world", "DEFAULT_TIMEOUT"]


def world(timeout: float | None = None):
    """``MPI.COMM_WORLD``; raises ImportError with the install hint if mpi4py is missing.

    ``timeout``: seconds MPI's start-up may take in this process (the peers' deadline).  Start-up
    waits for every process of the job, so one frozen or never started holds the others inside
    MPI's own code, where no Python runs; past the deadline a watcher process started for it
    prints one line, ``fedhier: error: ...``, and ends this process, which ends the job (MPICH stops
    every rank when one ends abnormally).  None: no deadline.
    """
    try:
        import mpi4py  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError('the MPI runtime needs mpi4py: pip install -e ".[mpi]" (mpi4py + mpich)') from exc
    with _start_up_deadline(None if "mpi4py.MPI" in sys.modules else timeout):
        from mpi4py import MPI
    return MPI.COMM_WORLD


@contextlib.contextmanager
def _start_up_deadline(timeout: float | None) -> Iterator[None]:
    """Within the block (MPI's start-up), a process forked for it ends this one after ``timeout`` seconds.

    MPI_Init holds Python's interpreter lock while it waits for the other processes, so no thread of
    this process could act; the watcher is a separate process that only waits on a pipe, which this
    process closes when the block ends."""
    if timeout is None:
        yield
        return
    parent = os.getpid()
    done, signal_done = os.pipe()
    watcher = os.fork()
    if watcher == 0:  # the watcher: waits for the pipe to close, or for the deadline
        os.close(signal_done)
        ready, _, _ = select.select([done], [], [], timeout)
        if not ready:
            rank = os.environ.get("PMI_RANK", "?")
            os.write(2, (f"fedhier: error: site {rank}: MPI start-up did not finish within {timeout:g} s: a process of "
                         "the job has not joined it (frozen, or never started); the job is stopped, start it again\n").encode())
            os.kill(parent, signal.SIGKILL)
        os._exit(0)
    os.close(done)
    try:
        yield
    finally:
        os.close(signal_done)
        os.waitpid(watcher, 0)


#: seconds a peer waits for a message before it reports the sender lost
DEFAULT_TIMEOUT = 300.0
_DATA, _CONTROL = 7101, 7102   # message tags: payloads, and the agreement on lost peers
#: first and longest pause (seconds) between two polls of a receive: the pause grows by half while nothing
#: arrives and starts again from the first after every arrival, so a message is taken within about half the
#: time it was waited for, and at most ``_MAX_PAUSE`` after it came
_FIRST_PAUSE, _MAX_PAUSE = 2e-5, 1e-3
_HEADER = struct.Struct("<qq")  # (epoch, sequence number) in front of every payload
_STAND = struct.Struct("<qb")   # barriers passed, and the last one's outcome (-1: none, 0: false, 1: true)


class MPITransport(Transport):
    """The site of this MPI rank; see the module docstring.

    Every receive has a deadline: a peer that sends nothing for ``timeout`` seconds is
    reported lost (:class:`~fedhier.runtime.peer.PeerLost`); None waits for ever.  Messages
    go point to point (non-blocking sends, polled receives), each stamped with the
    agreement epoch and its sequence number, so that a message of an aborted attempt is
    recognised and dropped.
    """

    def __init__(self, comm, timeout: float | None = None) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"the peer timeout must be a positive number of seconds or None, got {timeout!r}")
        self.comm = comm
        self.rank = comm.Get_rank()
        self.n_sites = comm.Get_size()
        self.local_sites = [self.rank]
        self.alive = list(range(self.n_sites))
        self.bytes_sent = {}
        self.timeout = timeout
        self.barriers_passed = 0
        self.last_outcome = None
        self._epoch = 0
        self._seq = 0
        self._sends: list = []   # (request, buffer): a buffer lives until its send completes
        self._control: dict[int, list[tuple[int, int, bytes]]] = {}

    # ------------------------------------------------------------------ point to point
    def _send(self, dest: int, payload: bytes, tag: int = _DATA, stamp: tuple[int, int] | None = None) -> None:
        stamp = (self._epoch, self._seq) if stamp is None else stamp
        buf = np.frombuffer(_HEADER.pack(*stamp) + payload, dtype=np.uint8)
        self._sends.append((self.comm.Isend(buf, dest=dest, tag=tag), buf))

    def _reap(self) -> None:
        self._sends = [(req, buf) for req, buf in self._sends if not req.Test()]

    def _take(self, source: int, tag: int) -> tuple[int, int, bytes] | None:
        from mpi4py import MPI

        status = MPI.Status()
        if not self.comm.Iprobe(source=source, tag=tag, status=status):
            return None
        buf = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
        self.comm.Recv(buf, source=status.Get_source(), tag=tag)
        epoch, seq = _HEADER.unpack_from(buf.tobytes(), 0)
        if tag == _CONTROL:
            self._control.setdefault(status.Get_source(), []).append((epoch, seq, buf[_HEADER.size:].tobytes()))
            return epoch, seq, b""
        return epoch, seq, buf[_HEADER.size:].tobytes()

    def _receive(self, sources, deadline_factor: float = 1.0) -> dict[int, bytes]:
        """One message of the current (epoch, sequence) from each of ``sources``; raises PeerLost
        for those silent past the deadline, or as soon as another peer starts an agreement."""
        from mpi4py import MPI

        expected = (self._epoch, self._seq)
        deadline = None if self.timeout is None else time.monotonic() + deadline_factor * self.timeout
        got: dict[int, bytes] = {}
        pause = _FIRST_PAUSE
        while len(got) < len(sources):
            progressed = False
            for src in sources:
                while src not in got:
                    item = self._take(src, _DATA)
                    if item is None:
                        break
                    progressed = True
                    if item[:2] < expected:
                        continue  # a message of an attempt that was aborted
                    if item[:2] != expected:
                        raise PeerLost({src}, "out of step")
                    got[src] = item[2]
            while self._take(MPI.ANY_SOURCE, _CONTROL) is not None:
                pass
            if any(epoch == self._epoch for msgs in self._control.values() for epoch, _, _ in msgs):
                raise PeerLost(set(), "another peer reported a lost peer")
            if deadline is not None and time.monotonic() > deadline:
                raise PeerLost(set(sources) - set(got), f"no message within {self.timeout:g} s")
            if progressed:
                pause = _FIRST_PAUSE
            else:
                time.sleep(pause)
                pause = min(1.5 * pause, _MAX_PAUSE)
        self._reap()
        return got

    def _round_trip(self, payloads: dict[int, bytes], sources) -> dict[int, bytes]:
        for dest, payload in payloads.items():
            self._send(dest, payload)
        try:
            return self._receive(sources)
        finally:
            self._seq += 1

    @property
    def lost(self) -> list[int]:
        """Peers agreed lost so far."""
        return [s for s in range(self.n_sites) if s not in self.alive]

    def _others(self) -> list[int]:
        return [s for s in self.alive if s != self.rank]

    # ------------------------------------------------------------------ Transport
    def open_topology(self, adjacency: np.ndarray):
        return [int(j) for j in np.flatnonzero(adjacency[self.rank])]

    def close_topology(self, topology) -> None:
        return None

    def exchange(self, topology, spec: MessageSpec, messages):
        nbrs = topology
        payload = encode(spec, messages[self.rank])
        got = self._round_trip({j: payload for j in nbrs}, nbrs)
        self._count(self.rank, len(payload) * len(nbrs))
        return {self.rank: [decode(spec, got[j]) for j in nbrs]}

    def exchange_sessions(self, topologies, spec: MessageSpec, messages):
        """One message per neighbour per step: the parts of the sessions in which it is a neighbour, in session
        order (the graphs are undirected, so each side knows how many parts the other sends)."""
        payloads = [encode(spec, m) for m in messages[self.rank]]
        sessions: dict[int, list[int]] = {}
        for k, nbrs in enumerate(topologies):
            for j in nbrs:
                sessions.setdefault(j, []).append(k)
        sends = {j: b"".join(payloads[k] for k in ks) for j, ks in sessions.items()}
        got = self._round_trip(sends, sorted(sessions))
        self._count(self.rank, sum(len(payload) for payload in sends.values()))
        size = len(payloads[0])  # every part is a message of one spec and shape, so of one length
        parts = {}
        for j, ks in sessions.items():
            if len(got[j]) != size * len(ks):  # a part cut short, or bytes beyond the last one
                raise MessageError(f"{spec.name}: a neighbour's message of {len(got[j])} bytes does not hold "
                                   f"{len(ks)} parts of {size} bytes")
            parts[j] = {k: got[j][i * size:(i + 1) * size] for i, k in enumerate(ks)}
        return {self.rank: [[decode(spec, parts[j][k]) for j in nbrs] for k, nbrs in enumerate(topologies)]}

    def all_to_all(self, spec: MessageSpec, messages, receivers=None):
        receivers = self.alive if receivers is None else [int(j) for j in receivers]
        rows = {j: encode(spec, m) for j, m in zip(receivers, messages[self.rank])}
        sends = {j: payload for j, payload in rows.items() if j != self.rank}
        got = self._round_trip(sends, self._others() if self.rank in rows else [])
        self._count(self.rank, sum(len(payload) for payload in sends.values()))
        if self.rank not in rows:
            return {}
        got[self.rank] = rows[self.rank]
        return {self.rank: [decode(spec, got[j]) for j in self.alive]}

    def all_gather(self, spec: MessageSpec, messages, senders, receivers=None):
        receivers = self.alive if receivers is None else [int(j) for j in receivers]
        mine = encode(spec, messages[self.rank]) if self.rank in senders else None
        others = [j for j in receivers if j != self.rank]
        got = self._round_trip({j: mine for j in others} if mine is not None else {},
                               [s for s in senders if s != self.rank] if self.rank in receivers else [])
        if mine is not None:
            got[self.rank] = mine
            self._count(self.rank, len(mine) * len(others))
        if self.rank not in receivers:
            return []
        return [decode(spec, got[s]) for s in senders]

    def all_true(self, flags) -> bool:
        others = self._others()
        mine = bool(flags[self.rank])
        got = self._round_trip({j: bytes([mine]) for j in others}, others)
        self.barriers_passed += 1
        self.last_outcome = mine and all(v == b"\x01" for v in got.values())
        return self.last_outcome

    def commit(self) -> None:
        others = self._others()
        self._round_trip({j: b"" for j in others}, others)
        self.barriers_passed += 1
        self.last_outcome = None

    def agree_lost(self, suspects) -> Agreement:
        """Two all-to-all exchanges among the peers still alive.

        First every peer tells every other where it stands (barriers passed, the last
        one's outcome) and whom it suspects.  A peer heard is alive, whoever suspected it
        (a peer that is only behind, waiting for a message the lost peer never sent it,
        answers); one not heard within two timeouts is lost, and one that some peer
        suspects is waited for one timeout once all the others were heard.  Then every
        peer sends the set of peers it heard and the furthest stand among them; all must
        be equal, else PeerLost.
        """
        others = self._others()
        suspects = {int(s) for s in suspects}
        outcome = {None: -1, False: 0, True: 1}[self.last_outcome]
        stand = _STAND.pack(self.barriers_passed, outcome)
        for dest in others:
            self._send(dest, stand + _bitmap(suspects, self.n_sites), tag=_CONTROL, stamp=(self._epoch, 0))
        first = {self.rank: stand}
        for src, payload in self._receive_control(others, 0, suspects).items():
            if len(payload) == _STAND.size + self.n_sites:
                first[src] = payload[:_STAND.size]
        survivors = sorted(first)
        furthest = max(_STAND.unpack(v) for v in first.values())
        summary = _bitmap(survivors, self.n_sites) + _STAND.pack(*furthest)
        for dest in others:
            self._send(dest, summary, tag=_CONTROL, stamp=(self._epoch, 1))
        second = self._receive_control([s for s in survivors if s != self.rank], 1)
        if any(len(v) == len(summary) and not v[self.rank] for v in second.values()):
            raise PeerLost(set(), "the other peers reported this site lost")
        if len(second) < len(survivors) - 1 or any(v != summary for v in second.values()) or \
                len({v for v in first.values() if _STAND.unpack(v)[0] == furthest[0]}) > 1:
            raise PeerLost(set(self.alive) - set(second) - {self.rank},
                           "the surviving peers did not agree on which peers were lost")
        self._epoch += 1
        self._seq = 0
        return Agreement(frozenset(set(self.alive) - set(survivors)), furthest[0],
                         None if furthest[1] < 0 else bool(furthest[1]))

    def _receive_control(self, sources, it: int, suspects=frozenset()) -> dict[int, bytes]:
        """The payloads of exchange ``it`` of this epoch from ``sources``, each waited for
        ``2 + it`` timeouts; ``suspects`` grows with the suspects each sender lists, and
        once only suspects are missing they are waited for one timeout."""
        from mpi4py import MPI

        start = time.monotonic()
        heard: dict[int, bytes] = {}
        pause = _FIRST_PAUSE
        while True:
            while self._take(MPI.ANY_SOURCE, _CONTROL) is not None:
                pass
            for src in sources:
                msgs = [m for m in self._control.get(src, []) if m[0] >= self._epoch]
                match = [m for m in msgs if m[:2] == (self._epoch, it)]
                if match and src not in heard:
                    heard[src] = match[0][2]
                    if it == 0 and len(heard[src]) == _STAND.size + self.n_sites:
                        suspects |= {i for i, flag in enumerate(heard[src][_STAND.size:]) if flag}
                    msgs.remove(match[0])
                self._control[src] = msgs
            missing = [src for src in sources if src not in heard]
            if not missing:
                return heard
            if self.timeout is not None:
                waited = time.monotonic() - start
                if waited > (2 + it) * self.timeout or (waited > self.timeout and set(missing) <= suspects):
                    return heard
            time.sleep(pause)
            pause = min(1.5 * pause, _MAX_PAUSE)

    def common_seed(self, random_state: int | None) -> int:
        """The run's seed: ``random_state``, or when not given rank 0's draw (so every rank agrees)."""
        if random_state is not None:
            return int(random_state)
        value = np.array([np.random.SeedSequence(random_state).entropy % 2**62 if random_state is None
                          else int(random_state)], dtype=np.int64)
        self.comm.Bcast(value, root=0)
        return int(value[0])


def _bitmap(sites, n_sites: int) -> bytes:
    return bytes(int(s in sites) for s in range(n_sites))


def run_mpi(protocol: RoundProtocol, data: Any, *, n_rounds: int, graph: np.ndarray | None = None,
            aggregation: PeerAggregation | None = None, random_state: int | None = None,
            site_seed: int | None = None, stop: Callable[[Message], bool] | None = None, comm=None,
            timeout: float | None = DEFAULT_TIMEOUT, transport: MPITransport | None = None,
            on_round: Callable[[PeerResult], None] | None = None, start: PeerResult | None = None) -> PeerResult:
    """Run ``protocol`` with this process as site ``rank`` (collective over ``comm``).

    Parameters
    ----------
    data : the private data of this rank's site
    graph : ndarray (S, S), optional
        Peer graph, identical on every rank; default
        :func:`~fedhier.runtime.graphs.default_graph` from the common seed.
    random_state : int, optional
        The run's public seed (peer graph, relabelling), taken from rank 0 when not given.
    site_seed : int, optional
        Seed of this rank's generator for what is not secret (starts); None: the operating
        system's entropy.  Its secrets come from the operating system whatever this is.
    timeout : float or None, default DEFAULT_TIMEOUT (300 s)
        Seconds a peer waits for a message before reporting its sender lost; it must
        exceed the longest site step.  None waits for ever.
    transport : MPITransport, optional
        Reuse the transport of an earlier run on the same ranks (its knowledge of lost peers).
    on_round : callable, optional
        ``on_round(result)`` after every round (e.g. to save this site's state).
    start : PeerResult, optional
        This site's result after an earlier run's round ``r``, every rank's at the same ``r``:
        the run resumes with round ``r + 1`` (:func:`~fedhier.runtime.peer.run_peer_rounds`).
    Other parameters as :func:`fedhier.runtime.peer.simulate_peers`.

    Returns
    -------
    PeerResult holding this site's copy of the model, its history and private state.

    Raises
    ------
    PeerGraphSplit
        Lost peers left a split graph (or too few peers): this site's result after the
        last completed round is in the exception's ``result``.
    """
    if transport is None:
        transport = MPITransport(comm if comm is not None else world(), timeout)
    seed = transport.common_seed(random_state)
    adjacency = default_graph(transport.n_sites, seed) if graph is None else check_adjacency(graph)
    if adjacency.shape[0] != transport.n_sites:
        raise ValueError(f"peer graph has {adjacency.shape[0]} vertices but {transport.n_sites} MPI processes")
    return run_peer_rounds(protocol, {transport.rank: data}, transport, n_rounds=n_rounds, adjacency=adjacency,
                           aggregation=aggregation or PeerAggregation(), seed=seed, site_seed=site_seed, stop=stop,
                           on_round=on_round, start=start)
