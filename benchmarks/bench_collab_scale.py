"""CollabDict's consensus plan at 1,000 peers: steps of the default peer graph at S = 1,000 and S = 1,009.

The default graph is a random 4-regular graph drawn from the public seed at every S; 1,009 is prime, where the
default used to be the inverse-chord graph.  For each S the script prints the spectral gap ``lambda_2``, the
largest Laplacian eigenvalue ``lambda_S``, the fixed step count ``T`` of the stopping rule (step
``eps = 1/(d_max + 1)``, relative tolerance 1e-6), the same count for the inverse-chord graph where S is prime,
and the CPU seconds to draw the graph and compute its plan; then the ratio of the step counts at 1,009 and 1,000.

Then CollabDict's Shamir aggregation of one round's replies at S = 100 and S = 1,000 peers, simulated in this
process (every message encoded to bytes and decoded): each reply is the vector a Gaussian-mixture round sums for
K = 5 components of m = 20 features, ``K (1 + m + m (m + 1) / 2) = 1,155`` numbers.  For the default committee
and, at S = 100, for shares sent to every peer, it prints the committee size k, threshold t, CPU seconds of the
whole aggregation (median of ``--repeats``), the mean and largest bytes sent per peer, the largest error against
the plain sum, and the ratios of the mean and of the largest bytes per peer at 1,000 and 100 peers.  Last, the CPU seconds of a whole
CollabDict fit with Shamir aggregation at 1,000 simulated peers (30 rows of m = 20 features each, K = 5, 5 rounds).

``--finite-time`` prints instead, for the default graph at S = 6 to 200 (each seed): the steps of the default
finite-time schedule (one per distinct Laplacian eigenvalue) against the constant step ``1/(d_max + 1)`` at the
tolerances of plain sums (1e-12) and of chunks (1e-16, i.e. 1e-12 over the masks' scale 1e4), the largest growth of
an intermediate value (from the eigenvalues), and the largest error of each schedule on chunk-sized values
(Gaussian, sd 1e4) against their mean, computed with the matrix ``L``.

Run:  OPENBLAS_NUM_THREADS=1 python benchmarks/bench_collab_scale.py [--seeds 0,1,2] [--repeats 3] [--finite-time]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fedhier.runtime.graphs import (consensus_steps, default_graph, finite_time_steps, inverse_chord_graph, is_prime,
                                    laplacian, laplacian_spectrum, step_size)
from fedhier.runtime.peer import (InProcessTransport, PeerAggregation, aggregate_sums, shamir_committee_size,
                                  shamir_threshold)

REL_TOL = 1e-6
N_COMPONENTS, N_FEATURES = 5, 20
REPLY_SIZE = N_COMPONENTS * (1 + N_FEATURES + N_FEATURES * (N_FEATURES + 1) // 2)  # a Gaussian-mixture round


def plan_steps(adjacency) -> tuple[float, float, int]:
    """``(lambda_2, lambda_S, T)`` of a peer graph with the default step ``1/(d_max + 1)``."""
    spectrum = laplacian_spectrum(adjacency)
    return spectrum.lambda_2, spectrum.lambda_max, consensus_steps(spectrum, step_size(spectrum), REL_TOL)


def shamir_round(n_sites: int, aggregation: PeerAggregation, seed: int) -> tuple[float, float, int, float]:
    """One Shamir aggregation of ``n_sites`` replies of REPLY_SIZE numbers, all peers in this process.

    Returns CPU seconds, mean and largest bytes sent per peer, and the largest absolute error of the
    (identical) copies of the sum against the plain sum.
    """
    rng = np.random.default_rng(seed)
    replies = {s: rng.normal(size=REPLY_SIZE) for s in range(n_sites)}
    transport = InProcessTransport(n_sites)
    start = time.process_time()
    sums, _ = aggregate_sums(transport, replies, round=1, seed=seed, plan=None, aggregation=aggregation)
    cpu = time.process_time() - start
    sent = [transport.bytes_sent.get(s, 0) for s in range(n_sites)]
    error = float(np.max(np.abs(sums[0] - np.sum(list(replies.values()), axis=0))))
    return cpu, float(np.mean(sent)), int(max(sent)), error


def shamir_scale(repeats: int) -> None:
    print(f"\nShamir aggregation of one round, replies of {REPLY_SIZE} numbers "
          f"(K = {N_COMPONENTS}, m = {N_FEATURES}), CPU s median of {repeats}")
    print("S      shares to     k    t   CPU s    mean bytes/peer  max bytes/peer  max |error|")
    mean_bytes, max_bytes = {}, {}
    runs = [(100, "committee", PeerAggregation(method="shamir")),
            (100, "every peer", PeerAggregation(method="shamir", committee_size=100)),
            (1_000, "committee", PeerAggregation(method="shamir"))]
    for n_sites, label, aggregation in runs:
        results = [shamir_round(n_sites, aggregation, seed) for seed in range(repeats)]
        cpu = statistics.median(r[0] for r in results)
        _, mean_sent, max_sent, error = results[0]
        if label == "committee":
            mean_bytes[n_sites], max_bytes[n_sites] = mean_sent, max_sent
        print(f"{n_sites:<6d} {label:<11s} {shamir_committee_size(aggregation, n_sites):4d} "
              f"{shamir_threshold(aggregation, n_sites):4d}  {cpu:7.2f}  {mean_sent:15,.0f}  {max_sent:14,d}  "
              f"{error:.1e}")
    print(f"bytes per peer at S = 1,000 / at S = 100 (committee): mean {mean_bytes[1_000] / mean_bytes[100]:.2f}, "
          f"largest {max_bytes[1_000] / max_bytes[100]:.2f} (done when both <= 3)")


def shamir_fit(n_sites: int = 1_000, n_rows: int = 30, max_iter: int = 5) -> None:
    import warnings

    from fedhier.estimators.collab import CollabDict

    rng = np.random.default_rng(0)
    sites = [rng.normal(size=(n_rows, N_FEATURES)) + s % 2 for s in range(n_sites)]
    start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it stops at max_iter, by design
        CollabDict(n_components=N_COMPONENTS, max_iter=max_iter, aggregation="shamir", random_state=0,
                   mitigate=False).fit(sites)
    print(f"CollabDict fit, Shamir, S = {n_sites:,}, {n_rows} rows x {N_FEATURES} features per site, "
          f"K = {N_COMPONENTS}, {max_iter} rounds: {time.process_time() - start:.1f} CPU s")


def finite_time_table(seeds: list[int]) -> None:
    print("S      seed  finite-time steps  constant steps (1e-12 / 1e-16)  largest growth  "
          "max |error| finite-time / constant (values of sd 1e4)")
    for n_sites in (6, 7, 8, 11, 16, 31, 64, 101, 200):
        for seed in seeds:
            adjacency = default_graph(n_sites, seed)
            spectrum, lap = laplacian_spectrum(adjacency), laplacian(adjacency)
            exact, eps = finite_time_steps(spectrum), step_size(spectrum)
            ev = np.linalg.eigvalsh(lap)[1:]
            factor, growth = np.ones_like(ev), 1.0
            for step in exact:
                factor *= 1.0 - step * ev
                growth = max(growth, float(np.abs(factor).max()))
            values = np.random.default_rng(seed).normal(size=(n_sites, 20)) * 1e4
            errors = []
            for schedule in (exact, (eps,) * consensus_steps(spectrum, eps, 1e-16)):
                x = values.copy()
                for step in schedule:
                    x -= step * (lap @ x)
                errors.append(float(np.abs(x - values.mean(axis=0)).max()))
            print(f"{n_sites:<6d} {seed:<5d} {len(exact):17d}  {consensus_steps(spectrum, eps, 1e-12):14d} / "
                  f"{consensus_steps(spectrum, eps, 1e-16):<14d}  {growth:14.2f}  {errors[0]:.1e} / {errors[1]:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="public seeds of the default graph, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="Shamir aggregations per size (CPU s is their median)")
    parser.add_argument("--finite-time", action="store_true", help="the finite-time schedule against the constant step")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.finite_time:
        return finite_time_table(seeds)
    steps: dict[int, list[int]] = {}
    print("S      seed  lambda_2  lambda_S  T(default)  T(inverse-chord)  CPU s (graph + plan)")
    for n_sites in (1_000, 1_009):
        chord = plan_steps(inverse_chord_graph(n_sites))[2] if is_prime(n_sites) else None
        for seed in seeds:
            start = time.process_time()
            lambda_2, lambda_max, n_steps = plan_steps(default_graph(n_sites, seed))
            cpu = time.process_time() - start
            steps.setdefault(n_sites, []).append(n_steps)
            print(f"{n_sites:<6d} {seed:<5d} {lambda_2:8.3f}  {lambda_max:8.3f}  {n_steps:10d}  "
                  f"{'-' if chord is None else chord:>16}  {cpu:8.2f}")
    worst = max(steps[1_009]) / min(steps[1_000])
    print(f"steps at S = 1,009 / steps at S = 1,000: worst pair {worst:.3f} (done when <= 1.2)")
    shamir_scale(args.repeats)
    shamir_fit()


if __name__ == "__main__":
    main()
