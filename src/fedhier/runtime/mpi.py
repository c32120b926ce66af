"""MPI runtime: one site per process on a distributed graph communicator (spec collabdict §3-§4).

Install with ``pip install "fedhier[mpi]"`` (``mpi4py`` and the ``mpich`` wheel, which
provides ``mpiexec``).  The same fit then runs as ``S`` real processes::

    mpiexec -n 7 python -m fedhier.collab fit --runtime mpi --csv data.csv --site-column site --out model.npz

(across machines: ``mpiexec -f hostfile -n S ...``).  Rank ``s`` is site ``s``.

The algorithm is :func:`fedhier.runtime.peer.run_peer_rounds`, unchanged; this module only
supplies the transport:

* neighbour exchange on the peer graph uses ``Create_dist_graph_adjacent`` (one
  communicator per aggregation session, since sites are relabelled on the graph at
  every session, §4.1) and ``Neighbor_allgather``;
* Shamir shares travel with ``Alltoall``, holder sums are published with ``Allgather``;
* every payload is the byte string of :func:`fedhier.protocol.messages.encode` sent as a
  ``uint8`` buffer (upper-case mpi4py methods): nothing is pickled.

Each rank's secrets (its step's generator, its chunk masks) come from its own entropy;
``site_seed`` replaces it for tests and reproductions.  With ``random_state`` and
``site_seed`` both equal to the simulator's ``random_state`` the result is bit-identical
to :func:`fedhier.runtime.peer.simulate_peers`: both perform the same floating-point
operations in the same order.  (A seed shared by the ranks is no secret among them:
leave ``site_seed`` out in a deployment.)
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..models.collabdict.graphs import check_adjacency, default_graph
from ..protocol.base import RoundProtocol
from ..protocol.messages import Message, MessageSpec, decode, encode
from .peer import PeerAggregation, PeerResult, Transport, run_peer_rounds

__all__ = ["MPITransport", "run_mpi", "world"]


def world():
    """``MPI.COMM_WORLD``; raises ImportError with the install hint if mpi4py is missing."""
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError('the MPI runtime needs mpi4py: pip install "fedhier[mpi]" (mpi4py + mpich)') from exc
    return MPI.COMM_WORLD


def _as_buffer(payload: bytes) -> np.ndarray:
    return np.frombuffer(payload, dtype=np.uint8)


class MPITransport(Transport):
    """The site of this MPI rank; see the module docstring."""

    def __init__(self, comm) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.n_sites = comm.Get_size()
        self.local_sites = [self.rank]
        self.bytes_sent = {}

    def open_topology(self, adjacency: np.ndarray):
        nbrs = [int(j) for j in np.flatnonzero(adjacency[self.rank])]
        graph_comm = self.comm.Create_dist_graph_adjacent(nbrs, nbrs, reorder=False)
        return graph_comm, nbrs

    def close_topology(self, topology) -> None:
        topology[0].Free()

    def exchange(self, topology, spec: MessageSpec, messages):
        graph_comm, nbrs = topology
        payload = _as_buffer(encode(spec, messages[self.rank]))
        received = np.empty((len(nbrs), payload.size), dtype=np.uint8)
        graph_comm.Neighbor_allgather(payload, received)
        self._count(self.rank, payload.size * len(nbrs))
        return {self.rank: [decode(spec, received[i].tobytes()) for i in range(len(nbrs))]}

    def all_to_all(self, spec: MessageSpec, messages):
        rows = [_as_buffer(encode(spec, m)) for m in messages[self.rank]]
        sizes = {r.size for r in rows}
        if len(sizes) != 1:
            raise ValueError("all_to_all: the messages of one site must have the same encoded size")
        send = np.stack(rows)
        received = np.empty_like(send)
        self.comm.Alltoall(send, received)
        self._count(self.rank, send.size - rows[self.rank].size)
        return {self.rank: [decode(spec, received[i].tobytes()) for i in range(self.n_sites)]}

    def all_gather(self, spec: MessageSpec, messages, senders):
        mine = _as_buffer(encode(spec, messages[self.rank]))
        received = np.empty((self.n_sites, mine.size), dtype=np.uint8)
        self.comm.Allgather(mine, received)
        if self.rank in senders:
            self._count(self.rank, mine.size * (self.n_sites - 1))
        return [decode(spec, received[s].tobytes()) for s in senders]

    def all_true(self, flags) -> bool:
        from mpi4py import MPI

        mine = np.array([int(bool(flags[self.rank]))], dtype=np.int64)
        out = np.empty_like(mine)
        self.comm.Allreduce(mine, out, op=MPI.MIN)
        return bool(out[0])

    def common_seed(self, random_state: int | None) -> int:
        """The run's seed, taken from rank 0 when not given (so every rank agrees)."""
        value = np.array([np.random.SeedSequence(random_state).entropy % 2**62 if random_state is None
                          else int(random_state)], dtype=np.int64)
        self.comm.Bcast(value, root=0)
        return int(value[0])


def run_mpi(protocol: RoundProtocol, data: Any, *, n_rounds: int, graph: np.ndarray | None = None,
            aggregation: PeerAggregation | None = None, random_state: int | None = None,
            site_seed: int | None = None, stop: Callable[[Message], bool] | None = None, comm=None) -> PeerResult:
    """Run ``protocol`` with this process as site ``rank`` (collective over ``comm``).

    Parameters
    ----------
    data : the private data of this rank's site
    graph : ndarray (S, S), optional
        Peer graph, identical on every rank; default
        :func:`~fedhier.models.collabdict.graphs.default_graph` from the common seed.
    random_state : int, optional
        The run's public seed (peer graph, relabelling), taken from rank 0 when not given.
    site_seed : int, optional
        This rank's secret seed; None (a deployment): the operating system's entropy.
    Other parameters as :func:`fedhier.runtime.peer.simulate_peers`.

    Returns
    -------
    PeerResult holding this site's copy of the model, its history and private state.
    """
    comm = comm if comm is not None else world()
    transport = MPITransport(comm)
    seed = transport.common_seed(random_state)
    adjacency = default_graph(transport.n_sites, seed) if graph is None else check_adjacency(graph)
    if adjacency.shape[0] != transport.n_sites:
        raise ValueError(f"peer graph has {adjacency.shape[0]} vertices but {transport.n_sites} MPI processes")
    return run_peer_rounds(protocol, {transport.rank: data}, transport, n_rounds=n_rounds, adjacency=adjacency,
                           aggregation=aggregation or PeerAggregation(), seed=seed, site_seed=site_seed, stop=stop)
