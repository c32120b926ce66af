"""simulate() survives a killed worker and a blocking site, and leaves no worker process behind.

Deadlines here are generous against the work: a normal site step sums a few dozen numbers,
the blocking site sleeps forever; nothing asserts how long anything took.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from fedhier.runtime.simulate import SiteFailedWarning, simulate

sys.path.insert(0, str(Path(__file__).parent))
from procs import children_by_parent, running  # noqa: E402
from test_simulate import NoisyMean, make_sites  # noqa: E402


class Faulty(NoisyMean):
    """NoisyMean whose step kills its own worker process, or blocks forever, at chosen (round, site)."""

    name = "faulty-mean"

    def __init__(self, kill=(), block=(), parent=None):
        super().__init__()
        self.kill, self.block, self.parent = set(kill), set(block), parent or os.getpid()

    def site_step(self, ctx, broadcast):
        if os.getpid() != self.parent:  # only ever in a worker process, never the test's own
            if (ctx.round, ctx.site) in self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            if (ctx.round, ctx.site) in self.block:
                while True:
                    time.sleep(3600)
        return super().site_step(ctx, broadcast)


def _children():
    """Live child processes of this process."""
    return children_by_parent().get(os.getpid(), [])


pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_a_killed_worker_and_a_blocking_site_are_failed_sites_and_the_fit_completes(n_jobs):
    sites = make_sites(n_sites=4, seed=3)
    proto = Faulty(kill={(2, 1)}, block={(3, 2)})
    with pytest.warns(SiteFailedWarning):
        got = simulate(proto, sites, n_rounds=4, random_state=9, n_jobs=n_jobs, site_timeout=8.0)
    # the same fit with those sites simply absent in those rounds, in this process
    ref = simulate(NoisyMean(), sites, n_rounds=4, random_state=9, participation={2: [1], 3: [2]})
    np.testing.assert_allclose(got.broadcast["mean"], ref.broadcast["mean"], rtol=0, atol=1e-12)
    for a, b in zip(got.site_states, ref.site_states):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert [r.sites for r in got.history] == [r.sites for r in ref.history]
    assert list(got.history[1].failed) == [1] and "WorkerLost" in got.history[1].failed[1]
    assert list(got.history[2].failed) == [2] and "SiteTimeout" in got.history[2].failed[2]
    assert _children() == []  # every worker, replaced ones included, has ended


@pytest.mark.parametrize("error", [KeyError, KeyboardInterrupt])
def test_no_worker_outlives_a_fit_that_raises_or_is_interrupted(error):
    sites = make_sites(n_sites=3, seed=4)

    def boom(record, broadcast):
        raise error("stop here")

    with pytest.raises(error):
        simulate(NoisyMean(), sites, n_rounds=3, random_state=1, n_jobs=2, callbacks=[boom])
    assert _children() == []


def test_workers_end_when_the_parent_is_killed(tmp_path):
    # a child process runs a pooled fit whose site 0 blocks; its worker writes its pid, then we kill the parent
    script = tmp_path / "fit.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_simulate_faults import Faulty
        from test_simulate import make_sites
        from fedhier.runtime.simulate import simulate

        class Announce(Faulty):
            name = "announce"
            def site_step(self, ctx, broadcast):
                if os.getpid() != self.parent:
                    open({str(tmp_path)!r} + f"/worker-{{os.getpid()}}", "w").close()
                return super().site_step(ctx, broadcast)

        simulate(Announce(block={{(1, 0)}}), make_sites(3), n_rounds=2, random_state=0, n_jobs=2)
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, str(script)], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 300  # a bound for a broken test, not a speed requirement
        while len(list(tmp_path.glob("worker-*"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        workers = [int(p.name.split("-")[1]) for p in tmp_path.glob("worker-*")]
        assert len(workers) == 2, "the fit's workers never started"
        proc.kill()
        proc.wait()
        while any(running(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(running(w) for w in workers), "a worker outlived its killed parent"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for p in tmp_path.glob("worker-*"):
            pid = int(p.name.split("-")[1])
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_bad_deadline_is_refused():
    with pytest.raises(ValueError, match="site_timeout"):
        simulate(NoisyMean(), make_sites(), n_rounds=1, site_timeout=0)


def test_a_resumed_fit_removes_the_temporary_checkpoint_a_killed_one_left(tmp_path):
    """A process killed between writing its checkpoint's temporary file and renaming it leaves that file
    (``.NAME.XXXXXXXX``, made by the same ``mkstemp``); the next run of the fit removes it and nothing else."""
    import tempfile

    sites = make_sites()
    path = tmp_path / "run.ckpt.npz"
    simulate(NoisyMean(), sites, n_rounds=2, random_state=5, checkpoint=path)
    fd, left = tempfile.mkstemp(prefix=f".{path.name}.", dir=tmp_path)  # the killed writer's half-written file
    os.write(fd, b"half a checkpoint")
    os.close(fd)
    others = [tmp_path / f".{path.name}.notmine", tmp_path / ".other.npz.abcdefgh", tmp_path / "run.ckpt.npz.abcdefgh"]
    for other in others:
        other.write_bytes(b"not a temporary of this checkpoint")
    resumed = simulate(NoisyMean(), sites, n_rounds=4, random_state=5, checkpoint=path)
    full = simulate(NoisyMean(), sites, n_rounds=4, random_state=5)
    assert resumed.broadcast["mean"].tobytes() == full.broadcast["mean"].tobytes()
    assert not Path(left).exists() and all(other.exists() for other in others)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, *(o.name for o in others)])
