"""CollabDict's consensus plan at 1,000 peers: steps of the default peer graph at S = 1,000 and S = 1,009.

The default graph is a random 4-regular graph drawn from the public seed at every S; 1,009 is prime, where the
default used to be the inverse-chord graph.  For each S the script prints the spectral gap ``lambda_2``, the
largest Laplacian eigenvalue ``lambda_S``, the fixed step count ``T`` of the stopping rule (step
``eps = 1/(d_max + 1)``, relative tolerance 1e-6), the same count for the inverse-chord graph where S is prime,
and the CPU seconds to draw the graph and compute its plan; then the ratio of the step counts at 1,009 and 1,000.

Run:  OPENBLAS_NUM_THREADS=1 python benchmarks/bench_collab_scale.py [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import time

from fedhier.runtime.graphs import (consensus_steps, default_graph, inverse_chord_graph, is_prime,
                                    laplacian_spectrum, step_size)

REL_TOL = 1e-6


def plan_steps(adjacency) -> tuple[float, float, int]:
    """``(lambda_2, lambda_S, T)`` of a peer graph with the default step ``1/(d_max + 1)``."""
    spectrum = laplacian_spectrum(adjacency)
    return spectrum.lambda_2, spectrum.lambda_max, consensus_steps(spectrum, step_size(spectrum), REL_TOL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="public seeds of the default graph, comma-separated")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
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


if __name__ == "__main__":
    main()
