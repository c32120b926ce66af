"""MPI runtime: 7 real processes under mpiexec give the in-process simulator's model (issue 8)."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install 'fedhier[mpi]')")

from fedhier.estimators.collab import CollabDict  # noqa: E402

pytestmark = pytest.mark.integration

N_SITES = 7


def _mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.fail("mpi4py is importable but no mpiexec was found (the mpich wheel provides it)")
    return found


def _frame():
    import pandas as pd

    rng = np.random.default_rng(11)
    parts = []
    for s in range(N_SITES):
        n = 30 + 5 * s
        shift = 1.5 if s % 2 else -1.5
        x = rng.multivariate_normal([shift, -shift, 0], [[1, 0.7, 0], [0.7, 1, 0], [0, 0, 0.5]], size=n)
        parts.append(pd.DataFrame(x, columns=["a", "b", "c"]).assign(site=s))
    return pd.concat(parts, ignore_index=True)


def _run_mpi(args, tmp_path):
    proc = subprocess.Popen([_mpiexec(), "-n", str(N_SITES), sys.executable, "-m", "fedhier.cli.collab", *args],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:  # clean up mpiexec and its 7 ranks
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"mpiexec failed\nstdout:\n{out}\nstderr:\n{err}"
    return out


@pytest.mark.parametrize("aggregation", ["chunked", "shamir"])
def test_mpi_fit_equals_in_process_simulator(tmp_path, aggregation):
    frame = _frame()
    frame.to_csv(tmp_path / "data.csv", index=False)
    _run_mpi(["fit", "--runtime", "mpi", "--csv", "data.csv", "--site-column", "site", "--components", "3",
              "--max-iter", "6", "--aggregation", aggregation, "--seed", "5", "--site-seed", "5", "--no-mitigate",
              "--out", "model_{site}.npz"], tmp_path)
    sites = [frame.loc[frame.site == s, ["a", "b", "c"]].to_numpy() for s in range(N_SITES)]
    # without mitigation noise, a secret of each site, the two runtimes differ only by the masks' rounding
    ref = CollabDict(n_components=3, max_iter=6, aggregation=aggregation, random_state=5, mitigate=False).fit(sites)
    for s in range(N_SITES):
        got = CollabDict.load(tmp_path / f"model_{s}.npz")
        # every process holds the same global dictionary, equal to the simulator's
        assert np.allclose(got.mu_, ref.mu_, rtol=0, atol=1e-10)
        assert np.allclose(got.precision_, ref.precision_, rtol=0, atol=1e-10)
        assert np.array_equal(got.active_, ref.active_)
        # and its own private weights, equal to the simulator's site s
        assert np.allclose(got.weights_[s], ref.weights_[s], atol=1e-12)
        assert np.all(np.isnan(np.delete(got.weights_, s, axis=0)))
        assert np.allclose(got.score_samples(sites[s], site=s), ref.score_samples(sites[s], site=s), atol=1e-9)


_COMMITTEE_SCRIPT = """
import sys
import numpy as np
from fedhier.runtime.mpi import MPITransport, world
from fedhier.runtime.peer import PeerAggregation, aggregate_sums
transport = MPITransport(world(), timeout=120)
rank, n_sites = transport.rank, transport.n_sites
aggregation = PeerAggregation(method="shamir", committee_size=3)
for round in (1, 2):
    sums, _ = aggregate_sums(transport, {rank: np.arange(5.0) * (rank + 1)}, round=round, seed=9, plan=None,
                             aggregation=aggregation)
    # one write per line: with PYTHONUNBUFFERED, print writes each item separately and the ranks' lines interleave
    sys.stdout.write(" ".join(map(str, [rank, round, transport.bytes_sent[rank], *sums[rank].tolist()])) + "\\n")
    sys.stdout.flush()
"""


def test_mpi_shamir_committee_sums_with_peers_outside_the_committee(tmp_path):
    from fedhier.protocol.messages import Field, MessageSpec, encode
    from fedhier.runtime.peer import shamir_committee

    script = tmp_path / "committee.py"
    script.write_text(_COMMITTEE_SCRIPT)
    n_sites, k = 5, 3
    proc = subprocess.Popen([_mpiexec(), "-n", str(n_sites), sys.executable, str(script)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"mpiexec failed\nstdout:\n{out}\nstderr:\n{err}"
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert len(rows) == 2 * n_sites
    exact = np.arange(5.0) * sum(range(1, n_sites + 1))  # closed form: sum over ranks of (rank + 1) * arange(5)
    committee = shamir_committee(9, n_sites, range(n_sites), k)
    msg = len(encode(MessageSpec("collab-aggregate", {"x": Field((5,), "int64")}), {"x": np.zeros(5, np.int64)}))
    for rank, round, sent, *values in rows:
        np.testing.assert_allclose(np.array(values, dtype=float), exact, rtol=0, atol=n_sites * 2.0 ** -25)
    sent = {int(r[0]): int(r[2]) for r in rows if r[1] == "2"}
    outsiders = [s for s in range(n_sites) if s not in committee]
    publishers = committee[:k // 2 + 1]
    # per round: an outsider sends its k shares and, as a leaf of the tree below the first publisher, one vector to
    # it; the t = 2 publishers send k - 1 shares and their sums to each other, and the first publisher the sum to
    # the n_sites - t sites below it (4 children fit in one step)
    assert outsiders and all(sent[s] == 2 * (k + 1) * msg for s in outsiders)
    t = k // 2 + 1
    assert sent[publishers[0]] == 2 * (k - 1 + t - 1 + n_sites - t) * msg
    assert sent[publishers[1]] == 2 * (k - 1 + t - 1) * msg
