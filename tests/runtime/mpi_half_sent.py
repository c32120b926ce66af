"""Run under ``mpiexec -n 7`` by ``test_mpi_faults.py``: rank 3 sends its part of one barrier
(a commit or a stop check) to some peers only, then freezes, so that those peers pass the
barrier and the others wait for it.  Each survivor writes its per-round totals, history and
the senders of a last all-gather (as CollabDict gathers the sites' norms) to a JSON file.

usage: python mpi_half_sent.py OUT METHOD CALL RECEIVERS STOP TIMEOUT
  OUT        output path with ``{site}``
  METHOD     ``commit`` or ``all_true``; CALL: which call of it is cut
  RECEIVERS  comma-separated ranks that still receive rank 3's part
  STOP       ``never`` or ``always`` (the stop rule's answer after every round)
"""

import json
import os
import signal
import sys
from pathlib import Path

from fedhier.protocol.messages import Field, MessageSpec
from fedhier.runtime.mpi import MPITransport, run_mpi, world
from fedhier.runtime.peer import PeerAggregation, PeerLost

sys.path.insert(0, str(Path(__file__).parent))
from test_peer import SumProtocol, _data  # noqa: E402

FROZEN, N_ROUNDS = 3, 3


def cut(method: str, call: int, receivers: list[int]) -> None:
    """Make this rank's ``call``-th ``method`` send its part to ``receivers`` only, then freeze."""
    original = getattr(MPITransport, method)
    calls = 0

    def half_sent(self, *args):
        nonlocal calls
        calls += 1
        if calls != call:
            return original(self, *args)
        part = bytes([bool(args[0][self.rank])]) if method == "all_true" else b""
        for dest in receivers:
            self._send(dest, part)
        for request, _ in self._sends[-len(receivers):]:
            request.Wait()
        os.kill(os.getpid(), signal.SIGSTOP)

    setattr(MPITransport, method, half_sent)


def main(out: str, method: str, call: str, receivers: str, stop: str, timeout: str) -> None:
    comm = world()
    rank = comm.Get_rank()
    if rank == FROZEN:
        cut(method, int(call), [int(r) for r in receivers.split(",")])
    transport = MPITransport(comm, float(timeout))
    totals = []
    res = run_mpi(SumProtocol(4), _data(comm.Get_size())[rank], n_rounds=N_ROUNDS, random_state=5, site_seed=5,
                  aggregation=PeerAggregation(method="chunked"), stop=lambda b: stop == "always", transport=transport,
                  on_round=lambda r: totals.append(r.broadcast["total"].tolist()))
    spec = MessageSpec("test-rank", {"x": Field((), "float64")})
    while True:
        try:
            gathered = transport.all_gather(spec, {rank: {"x": float(rank)}}, transport.alive)
            break
        except PeerLost as exc:
            transport.set_alive(set(transport.alive) - transport.agree_lost(exc.sites).lost)
    Path(out.format(site=rank)).write_text(json.dumps({
        "totals": totals, "lost": [h["lost"] for h in res.history], "sites": [h["sites"] for h in res.history],
        "gathered": [int(m["x"]) for m in gathered], "alive": transport.alive}))
    transport.commit()  # every survivor has written its file
    os._exit(0)  # MPI_Finalize would wait for the frozen peer


if __name__ == "__main__":
    main(*sys.argv[1:])
