"""CollabDict over MPI against the in-process peer simulator: the MPI test's fit (7 peers, 6 iterations).

The data are the MPI integration test's: 7 sites of 30-60 rows in 3 columns.  Each repeat times, in alternation,
the in-process fit ``CollabDict(n_components=3, max_iter=6, aggregation=..., random_state=5, mitigate=False)``
(the peer simulator) and the same fit under ``mpiexec -n 7`` (``CollabDict.fit_mpi``, which ``fedhier collab fit
--runtime mpi`` calls).  The fit is timed inside the job, between two barriers (rank 0's wall seconds); start-up is
the job's wall time minus the fit (process launch, imports, MPI_Init, the data, finalisation).  It prints the
medians and each one's ratio to the in-process fit, for each aggregation (one untimed in-process fit first, so
that neither side's fit includes importing modules on first use), the neighbour exchanges of one chunked sum with
the default consensus steps and with the constant step, the mean CPU seconds of a rank in the MPI fit
(7 ranks share the machine's cores, so 7 times this over the number of cores bounds the fit's wall time from
below), and the machine's 1-minute load average before and after.

Run:  OPENBLAS_NUM_THREADS=1 python benchmarks/bench_collab_mpi.py [--repeats 5] [--aggregation chunked,shamir]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

N_SITES = 7


def test_frame() -> pd.DataFrame:
    """The MPI integration test's data: site s has 30 + 5 s rows, shifted by +-1.5 by parity."""
    rng = np.random.default_rng(11)
    parts = []
    for s in range(N_SITES):
        shift = 1.5 if s % 2 else -1.5
        x = rng.multivariate_normal([shift, -shift, 0], [[1, 0.7, 0], [0.7, 1, 0], [0, 0, 0.5]], size=30 + 5 * s)
        parts.append(pd.DataFrame(x, columns=["a", "b", "c"]).assign(site=s))
    return pd.concat(parts, ignore_index=True)


def _sites() -> list[np.ndarray]:
    frame = test_frame()
    return [frame.loc[frame.site == s, ["a", "b", "c"]].to_numpy() for s in range(N_SITES)]


def _model(aggregation: str):
    """The fit's estimator, with the modules the fit imports on first use already imported (a start-up cost)."""
    import fedhier.privacy.ledger  # noqa: F401
    import fedhier.runtime.checkpoint  # noqa: F401
    import fedhier.runtime.mpi  # noqa: F401
    from fedhier.estimators.collab import CollabDict

    return CollabDict(n_components=3, max_iter=6, aggregation=aggregation, random_state=5, mitigate=False)


def rank_main(aggregation: str) -> None:
    """One rank of the MPI job: the fit between two barriers; rank 0 prints its wall seconds and the ranks' mean
    CPU seconds of the fit."""
    from fedhier.runtime.mpi import world

    comm = world()
    X, model = _sites()[comm.Get_rank()], _model(aggregation)  # imported before the fit, as the command line does
    comm.Barrier()
    start, cpu = time.perf_counter(), time.process_time()
    model.fit_mpi(X, comm, site_seed=5, timeout=600)
    cpu = time.process_time() - cpu
    comm.Barrier()
    wall = time.perf_counter() - start
    cpus = comm.gather(cpu, root=0)
    if comm.Get_rank() == 0:
        print(f"fit {wall:.6f} {np.mean(cpus):.6f}", flush=True)


def mpi_seconds(aggregation: str) -> tuple[float, float, float]:
    """(job wall seconds, fit seconds, a rank's mean CPU seconds in the fit) of the fit under ``mpiexec -n 7``
    (every rank stopped by its process group)."""
    here = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(here) if here.exists() else shutil.which("mpiexec")
    args = [mpiexec, "-n", str(N_SITES), sys.executable, os.path.abspath(__file__), "--rank", aggregation]
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"mpiexec failed: {err.strip().splitlines()[-1] if err.strip() else proc.returncode}")
    fit, cpu = map(float, next(line for line in out.splitlines() if line.startswith("fit ")).split()[1:])
    return wall, fit, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--aggregation", default="chunked,shamir")
    parser.add_argument("--rank", help=argparse.SUPPRESS)  # internal: run as one rank of the MPI job
    args = parser.parse_args()
    if args.rank:
        return rank_main(args.rank)
    import warnings

    warnings.simplefilter("ignore")  # 6 iterations do not converge; that is the test's fit
    sites = _sites()
    _model("chunked").fit(sites)  # warm-up, not timed: first-use imports and caches
    exchanges = {step: _model("chunked").set_params(step=step).fit(sites).history_[0]["exchanges"]
                 for step in ("finite-time", "max-degree")}
    print(f"neighbour exchanges of one chunked sum (3 sessions x consensus steps + the agreement's steps): "
          f"{exchanges['finite-time']} with the default finite-time steps, {exchanges['max-degree']} with the "
          f"constant max-degree step")
    for aggregation in args.aggregation.split(","):
        local, fit, cpu, start_up = [], [], [], []
        load = os.getloadavg()[0]
        for _ in range(args.repeats):
            start = time.perf_counter()
            _model(aggregation).fit(sites)
            local.append(time.perf_counter() - start)
            wall, fit_s, cpu_s = mpi_seconds(aggregation)
            fit.append(fit_s)
            cpu.append(cpu_s)
            start_up.append(wall - fit_s)
        local_s, fit_s, cpu_s, start_up_s = np.median(local), np.median(fit), np.median(cpu), np.median(start_up)
        print(f"{aggregation:8s} in-process {local_s:6.2f} s   MPI fit {fit_s:6.2f} s (ratio {fit_s / local_s:5.2f}, "
              f"done when <= 3; CPU {cpu_s:5.3f} s per rank)   MPI start-up {start_up_s:5.2f} s "
              f"(ratio {start_up_s / local_s:5.2f})   medians of {args.repeats} alternating repeats; "
              f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
