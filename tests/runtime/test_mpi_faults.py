"""MPI runtime under faults: a frozen peer is left out and the others finish; a killed peer
ends the job (MPICH's process manager stops every rank) with every site's last completed
round saved.  Deadlines below bound a broken test, they are not speed requirements."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install 'fedhier[mpi]')")

from fedhier.estimators.collab import CollabDict  # noqa: E402
from fedhier.runtime.checkpoint import read_checkpoint  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from procs import descendants  # noqa: E402
from test_mpi import N_SITES, _frame, _mpiexec  # noqa: E402

pytestmark = pytest.mark.integration
BOUND = 600  # seconds: only a hung job reaches it


def _rank_pid(root, rank):
    for pid in descendants(root):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in env and b"fedhier.cli.collab" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    return None


def _wait(condition, proc):
    deadline = time.monotonic() + BOUND
    while not condition() and time.monotonic() < deadline:
        if proc.poll() is not None and not condition():
            return condition()
        time.sleep(0.2)
    return condition()


#: runs ``fedhier.cli.collab`` with rank RANK stopping itself (SIGSTOP) right after it saved round ROUND's state
_STOP_AFTER_ROUND = (
    "import os, runpy, signal, sys; import fedhier.runtime.checkpoint as c; write = c.write_checkpoint\n"
    "def write_then_stop(path, checkpoint):\n"
    "    out = write(path, checkpoint)\n"
    "    if os.environ.get('PMI_RANK') == '{rank}' and checkpoint.round == {round}: os.kill(os.getpid(), signal.SIGSTOP)\n"
    "    return out\n"
    "c.write_checkpoint = write_then_stop; sys.argv[0] = 'fedhier.cli.collab'\n"
    "runpy.run_module('fedhier.cli.collab', run_name='__main__')")


#: the same, with rank RANK stopping itself as it begins to write round ROUND's state (its round before already kept
#: as the previous state)
_STOP_BEFORE_SAVING = (
    "import os, runpy, signal, sys; import fedhier.runtime.checkpoint as c; write = c.write_checkpoint\n"
    "def stop_then_write(path, checkpoint):\n"
    "    if os.environ.get('PMI_RANK') == '{rank}' and checkpoint.round == {round}: os.kill(os.getpid(), signal.SIGSTOP)\n"
    "    return write(path, checkpoint)\n"
    "c.write_checkpoint = stop_then_write; sys.argv[0] = 'fedhier.cli.collab'\n"
    "runpy.run_module('fedhier.cli.collab', run_name='__main__')")


def _saved_round(path):
    try:
        return read_checkpoint(path).round
    except ValueError:  # not written yet, or half-way
        return None


def _start(tmp_path, extra=(), stop_after_round=None, script=_STOP_AFTER_ROUND):
    _frame().to_csv(tmp_path / "data.csv", index=False)
    run = ["-m", "fedhier.cli.collab"] if stop_after_round is None else \
        ["-c", script.format(rank=stop_after_round[0], round=stop_after_round[1])]
    args = [_mpiexec(), "-n", str(N_SITES), "-disable-auto-cleanup", sys.executable, *run, "fit",
            "--runtime", "mpi", "--csv", "data.csv", "--site-column", "site", "--components", "3", "--max-iter", "8",
            "--aggregation", "chunked", "--seed", "5", "--site-seed", "5", "--peer-timeout", "60",
            "--out", "model_{site}.npz", *extra]
    return subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.communicate()


def test_a_frozen_peer_is_left_out_and_the_others_finish(tmp_path):
    proc = _start(tmp_path)
    frozen = 3
    try:
        assert _wait(lambda: (tmp_path / f"model_{frozen}.state.npz").exists(), proc), "round 1 never finished"
        pid = _rank_pid(proc.pid, frozen)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        survivors = [s for s in range(N_SITES) if s != frozen]
        done = _wait(lambda: all((tmp_path / f"model_{s}.npz").exists() for s in survivors), proc)
    finally:
        out, err = _stop(proc)
    assert done, f"the other sites did not finish\nstdout:\n{out}\nstderr:\n{err}"
    assert not (tmp_path / f"model_{frozen}.npz").exists()
    assert out.count(f"sites [{str(frozen)!r}] stopped answering") == len(survivors)  # sites by name
    models = [CollabDict.load(tmp_path / f"model_{s}.npz") for s in survivors]
    for m in models[1:]:  # every survivor holds the same global model
        np.testing.assert_allclose(m.mu_, models[0].mu_, rtol=0, atol=1e-10)
        np.testing.assert_array_equal(m.active_, models[0].active_)
    for s in survivors:  # each site's state after every round was saved, with who took part
        saved = read_checkpoint(tmp_path / f"model_{s}.state.npz")
        assert saved.round == models[0].n_iter_
        lost_rounds = [h["round"] for h in saved.history if h["lost"]]
        assert len(lost_rounds) == 1 and saved.history[-1]["absent"] == [frozen]
        assert saved.history[-1]["sites"] == survivors


def test_a_killed_peer_ends_the_job_with_every_sites_last_round_saved(tmp_path):
    proc = _start(tmp_path)
    killed = 5
    try:
        assert _wait(lambda: all((tmp_path / f"model_{s}.state.npz").exists() for s in range(N_SITES)), proc)
        pid = _rank_pid(proc.pid, killed)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + BOUND
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        ended = proc.poll() is not None
    finally:
        out, err = _stop(proc)
    # MPICH ends every rank once one is killed (or, where it does not, the others finish without it)
    assert ended, f"the job hung after a peer was killed\nstdout:\n{out}\nstderr:\n{err}"
    for s in range(N_SITES):
        saved = read_checkpoint(tmp_path / f"model_{s}.state.npz")
        assert saved.round >= 1 and saved.site_states[0]  # the site's model and private state after a round


def test_a_rank_stopped_while_saving_a_round_still_holds_the_round_before(tmp_path):
    """Rank 5 stops itself as it begins to write round 2's state: its state file must still hold round 1 (a kill
    there would otherwise leave it no state file of its last round, only the one before)."""
    stopped = 5
    proc = _start(tmp_path, ["--peer-timeout", "600", "--no-mitigate"], stop_after_round=(stopped, 2),
                  script=_STOP_BEFORE_SAVING)

    def is_stopped():
        pid = _rank_pid(proc.pid, stopped)
        try:
            return pid is not None and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
        except OSError:
            return False

    try:
        halted = _wait(is_stopped, proc)
        state = _saved_round(tmp_path / f"model_{stopped}.state.npz")
        previous = _saved_round(tmp_path / f"model_{stopped}.state.previous.npz")
    finally:
        out, err = _stop(proc)
    assert halted, f"rank {stopped} never reached its save of round 2\nstdout:\n{out}\nstderr:\n{err}"
    assert state == 1 and previous == 1


@pytest.mark.parametrize("method, call, stop, rounds_with_it, lost_rounds", [
    ("all_true", 1, "never", 1, [2]),   # stop check of round 1: peer 5 begins round 2, the others wait for rank 3's flag
    ("commit", 2, "never", 2, [2]),     # commit of round 2: peer 5 applies round 2, the others wait for rank 3's commit
    ("all_true", 1, "always", 1, []),   # the last stop check: peer 5 finishes and gathers, the others wait
])
def test_a_peer_frozen_half_way_through_a_barrier_leaves_the_survivors_in_step(tmp_path, method, call, stop,
                                                                                rounds_with_it, lost_rounds):
    """Rank 3 sends its part of a barrier to peer 5 only and freezes: peer 5 passes the barrier,
    the others time out at it.  All survivors must agree that rank 3 is lost and where they
    stand, and end with the closed-form totals: round r's total is r times the sum of the data
    of the sites that took part."""
    from test_peer import _data

    script = Path(__file__).parent / "mpi_half_sent.py"
    proc = subprocess.Popen([_mpiexec(), "-n", str(N_SITES), "-disable-auto-cleanup", sys.executable, str(script),
                             "out_{site}.json", method, str(call), "5", stop, "60"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    survivors = [s for s in range(N_SITES) if s != 3]
    try:
        done = _wait(lambda: all((tmp_path / f"out_{s}.json").exists() for s in survivors), proc)
    finally:
        out, err = _stop(proc)
    assert done, f"the survivors did not finish\nstdout:\n{out}\nstderr:\n{err}"
    data = _data(N_SITES)
    n_rounds = 1 if stop == "always" else 3
    expected = [r * sum(data[s] for s in (range(N_SITES) if r <= rounds_with_it else survivors))
                for r in range(1, n_rounds + 1)]
    results = [json.loads((tmp_path / f"out_{s}.json").read_text()) for s in survivors]
    for got in results:
        np.testing.assert_allclose(got["totals"], expected, rtol=1e-8, atol=1e-8)
        assert got["gathered"] == survivors and got["alive"] == survivors
        assert got["lost"] == results[0]["lost"] and got["sites"] == results[0]["sites"]  # one history
    assert [r for r, lost in enumerate(results[0]["lost"], 1) if lost] == lost_rounds


def test_a_peer_frozen_before_mpi_start_up_ends_the_job_with_one_line(tmp_path):
    """Rank 2 stops itself before MPI's start-up: the others, waiting inside MPI_Init, stop at the peer deadline with
    one line saying why, instead of waiting for ever; nothing is saved (no round ran)."""
    _frame().to_csv(tmp_path / "data.csv", index=False)
    freeze_rank_2 = ("import os, runpy, signal, sys; os.environ.get('PMI_RANK') == '2' and os.kill(os.getpid(), signal.SIGSTOP); "
                     "sys.argv[0] = 'fedhier.cli.collab'; runpy.run_module('fedhier.cli.collab', run_name='__main__')")
    proc = subprocess.Popen([_mpiexec(), "-n", str(N_SITES), sys.executable, "-c", freeze_rank_2, "fit", "--runtime", "mpi",
                             "--csv", "data.csv", "--site-column", "site", "--components", "3", "--max-iter", "4",
                             "--seed", "5", "--peer-timeout", "20", "--out", "model_{site}.npz"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ended = _wait(lambda: proc.poll() is not None, proc)
    finally:
        out, err = _stop(proc)
    assert ended, f"the job hung with a peer frozen before start-up\nstdout:\n{out}\nstderr:\n{err}"
    assert proc.returncode != 0
    lines = [line for line in err.splitlines() if line.startswith("fedhier: error:")]
    assert lines and all(line.endswith("MPI start-up did not finish within 20 s: a process of the job has not joined it "
                                       "(frozen, or never started); the job is stopped, start it again") for line in lines)
    assert not list(tmp_path.glob("model_*"))


def test_a_peer_frozen_while_reading_its_data_is_left_out_and_the_others_finish(tmp_path):
    """Rank 2 stops itself when it starts reading its data, before any round: the others, past MPI's start-up, leave it
    out at the peer deadline and finish without it, as with a peer lost in the round loop."""
    _frame().to_csv(tmp_path / "data.csv", index=False)
    frozen = 2
    freeze_reading = ("import os, runpy, signal, sys; import fedhier.cli.sitedata as sd; read = sd.site_data\n"
                      "def site_data(*args, **kwargs):\n"
                      f"    os.environ.get('PMI_RANK') == '{frozen}' and os.kill(os.getpid(), signal.SIGSTOP)\n"
                      "    return read(*args, **kwargs)\n"
                      "sd.site_data = site_data; sys.argv[0] = 'fedhier.cli.collab'; "
                      "runpy.run_module('fedhier.cli.collab', run_name='__main__')")
    proc = subprocess.Popen([_mpiexec(), "-n", str(N_SITES), "-disable-auto-cleanup", sys.executable, "-c", freeze_reading,
                             "fit", "--runtime", "mpi", "--csv", "data.csv", "--site-column", "site", "--components", "3",
                             "--max-iter", "4", "--seed", "5", "--site-seed", "5", "--peer-timeout", "20",
                             "--out", "model_{site}.npz"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    survivors = [s for s in range(N_SITES) if s != frozen]
    try:
        done = _wait(lambda: all((tmp_path / f"model_{s}.npz").exists() for s in survivors), proc)
    finally:
        out, err = _stop(proc)
    assert done, f"the other sites did not finish\nstdout:\n{out}\nstderr:\n{err}"
    assert not (tmp_path / f"model_{frozen}.npz").exists()
    models = [CollabDict.load(tmp_path / f"model_{s}.npz") for s in survivors]
    for m in models[1:]:  # every survivor holds the same global model
        np.testing.assert_allclose(m.mu_, models[0].mu_, rtol=0, atol=1e-10)
    saved = read_checkpoint(tmp_path / f"model_{survivors[0]}.state.npz")
    assert [h["sites"] for h in saved.history] == [survivors] * len(saved.history), saved.history  # from the start


@pytest.mark.parametrize("behind", [[], [0, 1, 2]])
def test_a_killed_job_resumes_to_the_uninterrupted_result(tmp_path, behind):
    """Rank 3 stops itself after saving round 2, the others save it and wait for rank 3 in round 3, and the job is
    killed; ``--resume`` goes on from the last round every site saved and ends with the in-process simulator's model,
    which an uninterrupted MPI fit equals bit for bit (test_mpi).  ``behind``: these ranks' files are put back one
    round (as a kill that came before they saved the round the others had), so the others must go on from their
    previous round's state.  (A stop sent from the test could land half-way through a save, or after the fit's end.)"""
    paused = 3
    # later flags win: nobody is left out while rank 3 is stopped; no mitigation noise, which is each site's own secret
    proc = _start(tmp_path, ["--peer-timeout", "600", "--no-mitigate"], stop_after_round=(paused, 2))
    try:
        saved = _wait(lambda: all(_saved_round(tmp_path / f"model_{s}.state.npz") == 2 for s in range(N_SITES)), proc)
    finally:
        out, err = _stop(proc)  # kills the whole job
    assert saved, f"round 2 was not saved by every rank\nstdout:\n{out}\nstderr:\n{err}"
    rounds = [read_checkpoint(tmp_path / f"model_{s}.state.npz").round for s in range(N_SITES)]
    for s in behind:  # every site saved round 2: put these back to round 1
        os.replace(tmp_path / f"model_{s}.state.previous.npz", tmp_path / f"model_{s}.state.npz")
        rounds[s] -= 1
    assert not list(tmp_path.glob("model_?.npz")) and max(rounds) - min(rounds) <= 1
    proc = _start(tmp_path, ["--peer-timeout", "600", "--no-mitigate", "--resume"])
    try:
        done = _wait(lambda: proc.poll() is not None, proc)
    finally:
        out, err = _stop(proc)
    assert done and proc.returncode == 0, f"the resumed job failed\nstdout:\n{out}\nstderr:\n{err}"
    assert out.count(f"resumed after round {min(rounds)}; wrote") == N_SITES  # not fitted again from the start
    frame = _frame()
    sites = [frame.loc[frame.site == s, ["a", "b", "c"]].to_numpy() for s in range(N_SITES)]
    ref = CollabDict(n_components=3, max_iter=8, aggregation="chunked", random_state=5, mitigate=False).fit(sites)
    assert ref.n_iter_ > max(rounds)  # the kill came before the fit's end
    for s in range(N_SITES):
        got = CollabDict.load(tmp_path / f"model_{s}.npz")
        assert got.n_iter_ == ref.n_iter_
        np.testing.assert_allclose(got.mu_, ref.mu_, rtol=0, atol=1e-10)
        np.testing.assert_allclose(got.precision_, ref.precision_, rtol=0, atol=1e-10)
        np.testing.assert_array_equal(got.active_, ref.active_)
        # the chunk masks (each site's own, of scale 1e4) cancel in the sums up to about 1e-12: both fits carry it
        np.testing.assert_allclose(got.weights_[s], ref.weights_[s], rtol=0, atol=1e-10)
