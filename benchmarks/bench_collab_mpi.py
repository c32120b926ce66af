"""CollabDict over MPI against the in-process peer simulator: the MPI test's fit (7 peers, 6 iterations).

The data are the MPI integration test's: 7 sites of 30-60 rows in 3 columns.  Each repeat times, in alternation,
the in-process fit ``CollabDict(n_components=3, max_iter=6, aggregation=..., random_state=5, mitigate=False)``
(the peer simulator) and the same fit under ``mpiexec -n 7`` (``CollabDict.fit_mpi``, which ``fedhier collab fit
--runtime mpi`` calls).  The fit is timed inside the job, between two barriers (rank 0's wall seconds); start-up is
the job's wall time minus the fit (process launch, imports, MPI_Init, the data, finalisation).  It prints the
medians and each one's ratio to the in-process fit (and the range of the repeats' own ratios, each MPI fit over the
in-process fit timed just before it), for each aggregation (one untimed in-process fit first, so
that neither side's fit includes importing modules on first use), the neighbour exchanges of one chunked sum with
the default consensus steps and with the constant step, the mean CPU seconds of a rank in the MPI fit
(7 ranks share the machine's cores, so 7 times this over the number of cores bounds the fit's wall time from
below), and the machine's 1-minute load average before and after.

``--warm`` times, on both sides, the second of two fits: in-process after one untimed fit (as by default), and
under ``mpiexec`` after one untimed MPI fit in the same job, so that neither side's timed fit pays what a process
pays on its first fit (first calls, caches, the first messages between two ranks); by default the MPI fit is the
job's first, as the MPI test's is.

``--phases`` prints instead, for one MPI fit of each aggregation, the median over the ranks of the CPU seconds a
rank spends in each part of the fit: the global update and the site step of the mixture's rounds (the protocol's
``global_step`` and ``site_step``), the transport's sends and polls (``MPITransport._round_trip``), its agreements
(``all_true`` and ``commit``), and the rest (the standardising moments, the peer graph, encoding, the scores and
the release at the end).

Run:  OPENBLAS_NUM_THREADS=1 python benchmarks/bench_collab_mpi.py [--repeats 5] [--aggregation chunked,shamir]
      OPENBLAS_NUM_THREADS=1 python benchmarks/bench_collab_mpi.py --phases
      OPENBLAS_NUM_THREADS=1 python benchmarks/bench_collab_mpi.py --warm     (both sides' second fit)
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


#: --phases: (class, method, part of the fit) whose CPU seconds a rank adds up
PHASES = (
    ("fedhier.protocol.collab:GGMMixtureProtocol", "global_step", "global update"),
    ("fedhier.protocol.collab:GGMMixtureProtocol", "site_step", "site step"),
    ("fedhier.runtime.mpi:MPITransport", "_round_trip", "transport sends and polls"),
    ("fedhier.runtime.mpi:MPITransport", "all_true", "transport agreements"),
    ("fedhier.runtime.mpi:MPITransport", "commit", "transport agreements"),
)


def _count_phases() -> dict[str, float]:
    """Wrap the methods of :data:`PHASES` so that each adds its CPU seconds to the returned dict."""
    import importlib

    spent: dict[str, float] = {}

    def timed(method, part):
        def wrapper(*args, **kwargs):
            start = time.process_time()
            try:
                return method(*args, **kwargs)
            finally:
                spent[part] = spent.get(part, 0.0) + time.process_time() - start
        return wrapper

    for where, name, part in PHASES:
        module, cls = where.split(":")
        owner = getattr(importlib.import_module(module), cls)
        setattr(owner, name, timed(getattr(owner, name), part))
    return spent


def rank_main(aggregation: str, phases: bool = False, warm: bool = False) -> None:
    """One rank of the MPI job: the fit between two barriers; rank 0 prints its wall seconds and the ranks' mean
    CPU seconds of the fit (with ``phases``, the median over the ranks of each part's CPU seconds; with ``warm``,
    after one untimed fit)."""
    from fedhier.runtime.mpi import world

    comm = world()
    X, model = _sites()[comm.Get_rank()], _model(aggregation)  # imported before the fit, as the command line does
    if warm:
        _model(aggregation).fit_mpi(X, comm, site_seed=5, timeout=600)
    spent = _count_phases() if phases else {}
    comm.Barrier()
    start, cpu = time.perf_counter(), time.process_time()
    model.fit_mpi(X, comm, site_seed=5, timeout=600)
    cpu = time.process_time() - cpu
    comm.Barrier()
    wall = time.perf_counter() - start
    cpus = comm.gather(cpu, root=0)
    parts = comm.gather(spent, root=0)
    if comm.Get_rank() == 0:
        print(f"fit {wall:.6f} {np.mean(cpus):.6f}", flush=True)
        if phases:
            names = list(dict.fromkeys(part for _, _, part in PHASES))
            for name in names:
                print(f"phase {name}: {np.median([p.get(name, 0.0) for p in parts]):.4f}", flush=True)
            rest = [c - sum(p.values()) for c, p in zip(cpus, parts)]
            print(f"phase the rest: {np.median(rest):.4f}", flush=True)
            print(f"phase the whole fit: {np.median(cpus):.4f}", flush=True)


def mpi_seconds(aggregation: str, phases: bool = False, warm: bool = False) -> tuple[float, float, float]:
    """(job wall seconds, fit seconds, a rank's mean CPU seconds in the fit) of the fit under ``mpiexec -n 7``
    (every rank stopped by its process group); with ``phases`` rank 0's lines on the parts of the fit are printed."""
    here = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(here) if here.exists() else shutil.which("mpiexec")
    args = [mpiexec, "-n", str(N_SITES), sys.executable, os.path.abspath(__file__), "--rank", aggregation]
    args += (["--phases"] if phases else []) + (["--warm"] if warm else [])
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
    for line in out.splitlines():
        if line.startswith("phase "):
            name, seconds = line[len("phase "):].rsplit(": ", 1)
            print(f"{aggregation:8s} a rank's CPU in {name}: {float(seconds):.3f} s")
    return wall, fit, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--aggregation", default="chunked,shamir")
    parser.add_argument("--phases", action="store_true", help="a rank's CPU seconds in each part of one MPI fit")
    parser.add_argument("--warm", action="store_true", help="time the MPI job's second fit, after one untimed fit")
    parser.add_argument("--rank", help=argparse.SUPPRESS)  # internal: run as one rank of the MPI job
    args = parser.parse_args()
    if args.rank:
        return rank_main(args.rank, args.phases, args.warm)
    if args.phases:
        for aggregation in args.aggregation.split(","):
            mpi_seconds(aggregation, phases=True)
        return None
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
            wall, fit_s, cpu_s = mpi_seconds(aggregation, warm=args.warm)
            fit.append(fit_s)
            cpu.append(cpu_s)
            start_up.append(wall - fit_s)
        local_s, fit_s, cpu_s, start_up_s = np.median(local), np.median(fit), np.median(cpu), np.median(start_up)
        paired = np.divide(fit, local)  # each repeat's MPI fit over the in-process fit timed just before it
        print(f"{aggregation:8s} in-process {local_s:6.2f} s   MPI {'second' if args.warm else 'first'} fit {fit_s:6.2f} s (ratio {fit_s / local_s:5.2f}, "
              f"done when <= 3; repeat by repeat {np.min(paired):.2f}-{np.max(paired):.2f}; CPU {cpu_s:5.3f} s per rank)   "
              f"MPI start-up{' and first fit' if args.warm else ''} "
              f"{start_up_s:5.2f} s "
              f"(ratio {start_up_s / local_s:5.2f})   medians of {args.repeats} alternating repeats; "
              f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")


if __name__ == "__main__":
    main()
