"""BLAS threads on a busy machine: one fit timed with one OpenBLAS thread and with one per core, idle and loaded.

Run:  python benchmarks/bench_blas_threads.py [--repeats 3]

The fit: record-level DP Fed-mv-PPCA (epsilon = 10) on the bundled Alzheimer data split IID over 3 sites,
min-max scaled, q = 3 -- the coordinator's post-processing is 4 EM fits of 200 iterations on 131 x 131
covariances, many small BLAS calls.  Each setting runs in a fresh process (OpenBLAS reads
``OPENBLAS_NUM_THREADS`` when it loads), which times ``--repeats`` fits after one warm-up and prints
the min and median.  "as found": the machine as it is; "loaded": as many pure-Python busy loops as the machine has cores run beside it
(other work on the machine, e.g. an experiment), stopped by PID afterwards.  The ratio compares the two
thread settings in the same condition, measured in this run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys

_FIT = """
import json, sys, time
import numpy as np
from fedhier import FedMVPPCA
from fedhier.data import MinMaxScaling, combine_ranges, load_alzheimer, partition, site_ranges
from fedhier.privacy.analyze_gauss import RecordDP

data = load_alzheimer()
part = partition(data.views, data.labels, 3, "iid", random_state=3)
scaling = MinMaxScaling(combine_ranges([site_ranges(s) for s in part.sites]))
sites = [scaling.transform(s) for s in part.sites]
seconds = []
for _ in range(int(sys.argv[1]) + 1):
    start = time.perf_counter()
    FedMVPPCA(n_components=3, privacy=RecordDP(10.0, 1e-5), random_state=0).fit(sites)
    seconds.append(time.perf_counter() - start)
print(json.dumps(seconds[1:]))
"""


def _busy() -> None:
    while True:
        pass


def _timed(threads: int, repeats: int) -> list[float]:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", _FIT, str(repeats)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    rows = []
    for condition in ("as found", "loaded"):
        loops = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(cores if condition == "loaded" else 0)]
        try:
            for p in loops:
                p.start()
            timings = {threads: sorted(_timed(threads, args.repeats)) for threads in (1, cores)}
        finally:
            for p in loops:
                p.kill()
                p.join()
        rows.append((condition, timings))
    print(f"record-level DP Fed-mv-PPCA, Alzheimer, 3 sites; {cores} cores; min / median of {args.repeats} fits (s)")
    print(f"{'machine':<10}{'1 thread':>18}{f'{cores} threads':>18}{'ratio (median)':>16}")
    for condition, timings in rows:
        one, many = timings[1], timings[cores]
        median = lambda xs: xs[len(xs) // 2]  # noqa: E731
        print(f"{condition:<10}{f'{one[0]:.2f} / {median(one):.2f}':>18}{f'{many[0]:.2f} / {median(many):.2f}':>18}"
              f"{median(many) / median(one):>15.1f}x")


if __name__ == "__main__":
    main()
