"""Cost of Fed-mv-PPCA's local EM iteration against its floor, and its peak memory.

Run:  python benchmarks/bench_mvppca.py            (about a minute; --small for a smoke run)

1. One local EM/MAP iteration on a site of N = 20,000 subjects x d = 2,000 features in
   3 views, q = 10, against two plain numpy GEMMs of the same shapes -- T (N x d) times
   B^T (d x q) for the E-step and T^T (d x N) times X (N x q) for the W update -- which
   is the floor for this algorithm (every iteration must touch all N d entries twice).
   Printed as a ratio measured in this run.
2. Peak traced memory (tracemalloc; numpy reports its buffers to it) of a whole local
   fit with ONE view of d features, for d = 10,000 and 20,000: it must grow like d
   (the data), not d^2 (a d x d covariance would be 1.6 / 3.2 GB).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from fedhier.models.mvppca.local import fit_local


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def iteration_cost(n: int, dims: tuple[int, ...], q: int, repeat: int) -> None:
    rng = np.random.default_rng(0)
    views = {f"view{k}": rng.normal(size=(n, d)) for k, d in enumerate(dims)}
    T = np.hstack(list(views.values()))
    B = rng.normal(size=(q, T.shape[1]))
    X = rng.normal(size=(n, q))

    def gemms():
        T @ B.T
        T.T @ X

    floor = best_of(gemms, repeat)
    # one iteration = fit with k+1 iterations minus fit with 1 (removes the initialisation)
    one = best_of(lambda: fit_local(views, q, None, n_iter=1, rng=np.random.default_rng(1)), repeat)
    k = 4
    many = best_of(lambda: fit_local(views, q, None, n_iter=k + 1, rng=np.random.default_rng(1)), repeat)
    per_iter = (many - one) / k
    print(f"site: N = {n:,} subjects, d = {sum(dims):,} features in views {dims}, q = {q}")
    print(f"  two plain GEMMs (floor)     {floor * 1e3:8.1f} ms")
    print(f"  one local EM iteration      {per_iter * 1e3:8.1f} ms")
    print(f"  ratio iteration / floor     {per_iter / floor:8.2f}")


def peak_memory(n: int, dims: list[int], q: int) -> None:
    print(f"peak traced memory of a local fit (N = {n}, one view, q = {q}, 3 iterations):")
    rows = []
    for d in dims:
        data = {"omics": np.random.default_rng(0).normal(size=(n, d))}
        tracemalloc.start()
        tracemalloc.reset_peak()
        fit_local(data, q, None, n_iter=3, rng=np.random.default_rng(0))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rows.append((d, peak))
        print(f"  d = {d:6,}: peak {peak / 2**20:8.1f} MiB   (data {data['omics'].nbytes / 2**20:.1f} MiB; a d x d matrix would be {d * d * 8 / 2**20:,.0f} MiB)")
    (d1, p1), (d2, p2) = rows[0], rows[-1]
    print(f"  peak ratio for d x{d2 / d1:.0f}: {p2 / p1:.2f}  (linear in d: {d2 / d1:.0f}; quadratic: {(d2 / d1) ** 2:.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    if args.small:
        iteration_cost(2_000, (100, 60, 40), 10, repeat=2)
        peak_memory(200, [1_000, 2_000], 10)
    else:
        iteration_cost(20_000, (1_000, 600, 400), 10, repeat=3)
        peak_memory(500, [10_000, 20_000], 10)


if __name__ == "__main__":
    main()
