"""BLAS threads on a busy machine: fits timed with one OpenBLAS thread and with one per core, idle and loaded.

Run:  python benchmarks/bench_blas_threads.py [--repeats 3] [--workload floor] [--as-found-only]

Two fits, each in a fresh process per setting (OpenBLAS reads ``OPENBLAS_NUM_THREADS`` when it loads), which
times ``--repeats`` fits after one warm-up and prints the min and median:

* record-level DP Fed-mv-PPCA (epsilon = 10) on the bundled Alzheimer data split IID over 3 sites, min-max
  scaled, q = 3 -- the coordinator's post-processing is 4 EM fits of 200 iterations on 131 x 131
  covariances, many small BLAS calls;
* the floor workload: 4 sites x 4,000 subjects x views of (300, 500, 200) features drawn from a PPCA model,
  q = 10, 3 rounds of the plain EM; in the same process, alternating with the fits, the numpy floor of the same
  iterations (``bench_mvppca.floor_em`` on every site step the fit ran), so that fit / floor is printed for each
  thread setting.

``FedMVPPCA.fit`` runs with one BLAS thread whatever the process was given (threadpoolctl), except its products
with the data of a million multiply-adds or more, which use the process's threads as far as the machine has cores
free when the fit starts (``fedhier.models.mvppca._linalg``); before the fit limited its threads, they made the
floor workload 2.4x slower on the idle machine.  "as found":
the machine as it is; "loaded": as many pure-Python busy loops as the machine has cores run beside it (other
work on the machine, e.g. an experiment), stopped by PID afterwards.  The ratio compares the two thread
settings in the same condition, measured in this run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
from pathlib import Path

_RECORD_DP = """
import json, sys, time
import numpy as np
from fedhier import FedMVPPCA
from fedhier.data import MinMaxScaling, combine_ranges, load_alzheimer, partition, site_ranges
from fedhier.privacy.analyze_gauss import RecordDP

data = load_alzheimer()
part = partition(data.views, data.labels, 3, "iid", random_state=3)
scaling = MinMaxScaling(combine_ranges([site_ranges(s) for s in part.sites]))
sites = [scaling.transform(s) for s in part.sites]
fit = lambda: FedMVPPCA(n_components=3, privacy=RecordDP(10.0, 1e-5), random_state=0).fit(sites)
"""

_FLOOR = """
import json, sys, time
import numpy as np
from fedhier import FedMVPPCA
sys.path.insert(0, BENCHMARKS)
from bench_mvppca import recorded_floor

rng = np.random.default_rng(0)
loadings = {f"v{k}": rng.normal(size=(d, 10)) for k, d in enumerate((300, 500, 200))}
sites = []
for _ in range(4):
    z = rng.normal(size=(4000, 10))
    sites.append({v: z @ w.T + rng.normal(size=(4000, w.shape[0])) for v, w in loadings.items()})
fit = lambda: FedMVPPCA(n_components=10, n_rounds=3, tol=None, acceleration=None, random_state=0).fit(sites)
floor = recorded_floor(fit)[1]
"""

_TIMED = """
seconds = {"fit": [], "floor": []}
arms = {"fit": fit, "floor": globals().get("floor")}
for repeat in range(int(sys.argv[1]) + 1):
    for name in ("fit", "floor") if repeat % 2 == 0 else ("floor", "fit"):
        if arms[name] is not None:
            start = time.perf_counter()
            arms[name]()
            seconds[name].append(time.perf_counter() - start)
print(json.dumps({name: times[1:] for name, times in seconds.items()}))
"""

WORKLOADS = {"record-level DP Fed-mv-PPCA, Alzheimer, 3 sites": _RECORD_DP,
             "floor workload: 4 sites x 4,000 x (300, 500, 200), q = 10, 3 rounds": _FLOOR}


def _busy() -> None:
    while True:
        pass


def _timed(code: str, threads: int, repeats: int) -> dict[str, list[float]]:
    """Seconds of ``repeats`` fits (and floor runs, if the workload has a floor) after one warm-up, in a fresh process."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads)}
    code = f"BENCHMARKS = {str(Path(__file__).resolve().parent)!r}\n" + code + _TIMED
    out = subprocess.run([sys.executable, "-c", code, str(repeats)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workload", choices=("all", "record-dp", "floor"), default="all")
    parser.add_argument("--as-found-only", action="store_true", help="skip the loaded machine (no busy loops)")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    median = statistics.median
    workloads = [w for key, w in zip(("record-dp", "floor"), WORKLOADS.items()) if args.workload in ("all", key)]
    conditions = ("as found",) if args.as_found_only else ("as found", "loaded")
    for name, code in workloads:
        rows = []
        for condition in conditions:
            loops = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(cores if condition == "loaded" else 0)]
            try:
                for p in loops:
                    p.start()
                timings = {}
                for threads in ((1, cores) if len(rows) % 2 == 0 else (cores, 1)):  # alternating order
                    timings[threads] = _timed(code, threads, args.repeats)
            finally:
                for p in loops:
                    p.kill()
                    p.join()
            rows.append((condition, timings))
        print(f"{name}; {cores} cores; min / median of {args.repeats} fits (s)")
        print(f"{'machine':<10}{'1 thread':>18}{f'{cores} threads':>18}{'ratio (median)':>16}")
        for condition, timings in rows:
            one, many = timings[1]["fit"], timings[cores]["fit"]
            print(f"{condition:<10}{f'{min(one):.2f} / {median(one):.2f}':>18}{f'{min(many):.2f} / {median(many):.2f}':>18}"
                  f"{median(many) / median(one):>15.2f}x")
        for condition, timings in rows:
            for threads in (1, cores):
                fit, floor = timings[threads]["fit"], timings[threads]["floor"]
                if floor:
                    ratios = [a / b for a, b in zip(fit, floor)]
                    print(f"{condition}, {threads} thread{'s' if threads > 1 else ''}: fit / numpy floor of the same "
                          f"iterations (floor {min(floor):.2f} / {median(floor):.2f} s): min {min(ratios):.2f}, "
                          f"median {median(ratios):.2f} (target <= 1.2)")
        print()

if __name__ == "__main__":
    main()
