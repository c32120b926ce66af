"""Speed and memory of Fed-mv-PPCA against scikit-learn's PCA and against two plain GEMMs.

Run:  OPENBLAS_NUM_THREADS=1 python benchmarks/bench_mvppca.py   (a few minutes; --small for a smoke run)

Every timing is a ratio of runs interleaved in this process (A, B, A, B, ...); the minimum and
the median over the repetitions are printed.  On a shared machine set OPENBLAS_NUM_THREADS=1.

1. The pooled special case: one site, one view of N = 20,000 subjects x d = 1,000 features,
   q = 10, drawn from a PPCA model.  ``FedMVPPCA(n_rounds=1)`` with its defaults against
   ``sklearn.decomposition.PCA(q)`` (whose ``score`` is the PPCA log-likelihood of Tipping &
   Bishop's ML fit): held-out mean log-likelihood and wall time; the paper's start
   (``init="random", local_tol=None``) beside it.
2. Peak traced memory (tracemalloc; numpy reports its buffers to it) of that whole fit,
   beyond the training data (allocated before), as a multiple of the data's size.
3. One local EM iteration on a site of N = 20,000 subjects x d = 2,000 features in 3 views,
   q = 10, against two plain numpy GEMMs per view of the same shapes -- T_k (N x d_k) times
   B_k (d_k x q) for the E-step and T_k^T times X (N x q) for the W update -- the floor of
   the algorithm (every iteration must touch all N d entries twice).
4. Peak memory of a local fit with one wide view (d = 10,000 and 20,000): linear in d.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np

from fedhier import FedMVPPCA
from fedhier.models.mvppca.local import fit_local


def interleaved(fns: dict, repeat: int) -> dict[str, list[float]]:
    """Seconds of every function over ``repeat`` rounds, in alternating order."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeat):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def ratio_line(label: str, num: list[float], den: list[float]) -> str:
    ratios = [a / b for a, b in zip(num, den)]
    return (f"  {label:<44} min {min(ratios):6.2f}   median {statistics.median(ratios):6.2f}"
            f"   ({min(num):.3f} s vs {min(den):.3f} s, min)")


def ppca_sampler(d: int, q: int, rng: np.random.Generator):
    """A function m -> (m, d) rows drawn from one PPCA model: t = W x + mu + N(0, I), x ~ N(0, I_q)."""
    W = rng.normal(size=(d, q)) * np.linspace(3.0, 0.5, q)
    mu = rng.normal(size=d)
    return lambda m: rng.normal(size=(m, q)) @ W.T + mu + rng.normal(size=(m, d))


def versus_pca(n: int, d: int, q: int, repeat: int) -> None:
    from sklearn.decomposition import PCA

    draw = ppca_sampler(d, q, np.random.default_rng(0))
    train, test = draw(n), draw(n // 4)
    fits: dict[str, object] = {}

    def ours():
        fits["ours"] = FedMVPPCA(q, n_rounds=1, random_state=0).fit([{"v": train}])

    def pca():
        fits["pca"] = PCA(q).fit(train)

    def paper():
        fits["paper"] = FedMVPPCA(q, n_rounds=1, random_state=0, init="random", local_tol=None).fit([{"v": train}])

    times = interleaved({"ours": ours, "pca": pca}, repeat)
    paper_times = interleaved({"paper": paper, "pca": pca}, max(1, repeat // 2))
    ll_pca = fits["pca"].score(test)
    ll_ours = fits["ours"].score({"v": test})
    ll_paper = fits["paper"].score({"v": test})
    print(f"1. one site, one view: N = {n:,} x d = {d:,}, q = {q}; held-out {test.shape[0]:,} subjects")
    print(f"  held-out mean log-likelihood: PCA {ll_pca:.6f}, FedMVPPCA {ll_ours:.6f}, paper start {ll_paper:.6f}")
    print(f"  relative gap to PCA: FedMVPPCA {abs(ll_ours - ll_pca) / abs(ll_pca):.2e} (target <= 1e-4), "
          f"paper start {abs(ll_paper - ll_pca) / abs(ll_pca):.2e}")
    print(ratio_line("wall time FedMVPPCA / PCA (target <= 3)", times["ours"], times["pca"]))
    print(ratio_line("wall time paper start / PCA", paper_times["paper"], paper_times["pca"]))

    def peak(fn) -> int:
        tracemalloc.start()
        tracemalloc.reset_peak()
        fn()
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    ours_peak, pca_peak = peak(ours), peak(pca)
    size = train.nbytes
    print(f"2. peak traced memory beyond the data ({size / 2**20:.0f} MiB): FedMVPPCA {ours_peak / 2**20:.1f} MiB, "
          f"PCA {pca_peak / 2**20:.1f} MiB")
    print(f"  peak / data, the data included: FedMVPPCA {(size + ours_peak) / size:.2f} (target <= 1.5), "
          f"PCA {(size + pca_peak) / size:.2f}")


def iteration_cost(n: int, dims: tuple[int, ...], q: int, repeat: int) -> None:
    rng = np.random.default_rng(0)
    views = {f"view{k}": rng.normal(size=(n, d)) for k, d in enumerate(dims)}
    B = {k: rng.normal(size=(v.shape[1], q)) for k, v in views.items()}
    X = rng.normal(size=(n, q))

    def gemms():
        for k, v in views.items():
            v @ B[k]
            v.T @ X

    k_iter = 8
    # one iteration = a fit of k + 1 iterations minus a fit of 1 (removes the start and the one-off passes)
    times = interleaved({
        "floor": gemms,
        "one": lambda: fit_local(views, q, None, n_iter=1, rng=1, init="random"),
        "many": lambda: fit_local(views, q, None, n_iter=k_iter + 1, rng=1, init="random"),
    }, repeat)
    per_iter = [(m - o) / k_iter for m, o in zip(times["many"], times["one"])]
    print(f"3. one local EM iteration: N = {n:,} subjects, d = {sum(dims):,} features in views {dims}, q = {q}")
    print(ratio_line("iteration / two plain GEMMs per view (<= 1.2)", per_iter, times["floor"]))


def peak_memory(n: int, dims: list[int], q: int) -> None:
    print(f"4. peak traced memory of a local fit (N = {n}, one view, q = {q}, 3 iterations, PCA start):")
    rows = []
    for d in dims:
        data = {"omics": np.random.default_rng(0).normal(size=(n, d))}
        tracemalloc.start()
        tracemalloc.reset_peak()
        fit_local(data, q, None, n_iter=3, rng=np.random.default_rng(0))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rows.append((d, peak))
        print(f"  d = {d:6,}: peak {peak / 2**20:8.1f} MiB   (data {data['omics'].nbytes / 2**20:.1f} MiB; "
              f"a d x d matrix would be {d * d * 8 / 2**20:,.0f} MiB)")
    (d1, p1), (d2, p2) = rows[0], rows[-1]
    print(f"  peak ratio for d x{d2 / d1:.0f}: {p2 / p1:.2f}  (linear in d: {d2 / d1:.0f}; quadratic: {(d2 / d1) ** 2:.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved repetitions (default 5)")
    args = parser.parse_args()
    if args.small:
        versus_pca(2_000, 100, 10, repeat=2)
        iteration_cost(2_000, (100, 60, 40), 10, repeat=2)
        peak_memory(200, [1_000, 2_000], 10)
    else:
        versus_pca(20_000, 1_000, 10, repeat=args.repeat)
        iteration_cost(20_000, (1_000, 600, 400), 10, repeat=args.repeat)
        peak_memory(500, [10_000, 20_000], 10)


if __name__ == "__main__":
    main()
