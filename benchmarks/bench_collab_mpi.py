"""CollabDict over MPI against the in-process peer simulator: the MPI test's fit (7 peers, 6 iterations).

The data are the MPI integration test's: 7 sites of 30-60 rows in 3 columns.  Each repeat times, in alternation,
the in-process fit ``CollabDict(n_components=3, max_iter=6, aggregation=..., random_state=5, mitigate=False)``
(the peer simulator) and the same fit by ``mpiexec -n 7 fedhier-collab fit --runtime mpi`` (wall seconds, MPI
start-up included) and the start-up alone (the same imports and a barrier), and prints the medians and the
ratios with and without the start-up for each aggregation.

Run:  OPENBLAS_NUM_THREADS=1 python benchmarks/bench_collab_mpi.py [--repeats 5] [--aggregation chunked,shamir]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from fedhier.estimators.collab import CollabDict

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


START_UP = "import fedhier.cli.collab, fedhier.estimators.collab; from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"


def mpi_seconds(workdir: Path, aggregation: str | None) -> float:
    """Wall seconds of the fit under ``mpiexec -n 7`` (every rank stopped by its process group);
    ``aggregation=None``: of the start-up alone (the same imports and one barrier, no fit)."""
    here = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(here) if here.exists() else shutil.which("mpiexec")
    command = ["-c", START_UP] if aggregation is None else [
        "-m", "fedhier.cli.collab", "fit", "--runtime", "mpi", "--csv", "data.csv", "--site-column", "site",
        "--components", "3", "--max-iter", "6", "--aggregation", aggregation, "--seed", "5", "--site-seed", "5",
        "--no-mitigate", "--out", "model_{site}.npz"]
    args = [mpiexec, "-n", str(N_SITES), sys.executable, *command]
    start = time.perf_counter()
    proc = subprocess.Popen(args, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode:
        raise RuntimeError(f"mpiexec failed: {err.strip().splitlines()[-1] if err.strip() else proc.returncode}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--aggregation", default="chunked,shamir")
    args = parser.parse_args()
    frame = test_frame()
    sites = [frame.loc[frame.site == s, ["a", "b", "c"]].to_numpy() for s in range(N_SITES)]
    with tempfile.TemporaryDirectory() as tmp:
        frame.to_csv(Path(tmp) / "data.csv", index=False)
        for aggregation in args.aggregation.split(","):
            local, mpi, start_up = [], [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                CollabDict(n_components=3, max_iter=6, aggregation=aggregation, random_state=5,
                           mitigate=False).fit(sites)
                local.append(time.perf_counter() - start)
                mpi.append(mpi_seconds(Path(tmp), aggregation))
                start_up.append(mpi_seconds(Path(tmp), None))
            local_s, mpi_s, start_up_s = np.median(local), np.median(mpi), np.median(start_up)
            print(f"{aggregation:8s} in-process {local_s:6.2f} s   MPI {mpi_s:6.2f} s (start-up alone "
                  f"{start_up_s:5.2f} s)   ratio {mpi_s / local_s:5.2f}, without start-up "
                  f"{(mpi_s - start_up_s) / local_s:5.2f} (medians of {args.repeats}; done when <= 3)")


if __name__ == "__main__":
    main()
