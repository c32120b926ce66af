"""Cost of the lattice noise sampler (discrete Gaussian on the OS CSPRNG) against numpy's floating-point Gaussian.

    python benchmarks/bench_noise_sampler.py [--rounds 100] [--repeats 5]

Records the shapes, noise multipliers and sensitivities of every Gaussian release of
``fedhier demo --dp``'s fit (``FedMVPPCA`` with ``DPConfig.total(1, 1e-5)`` on the demo's
three sites), then draws the noise of all of them with
:func:`fedhier.privacy.sampling.lattice_gaussian` on ``os.urandom`` and with
``numpy.random.Generator.normal``, and prints the best of ``--repeats`` wall times and
their ratio (docs/privacy.md, "Sampling on a lattice").
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import fedhier.models.mvppca.dp as dp
from fedhier.demo import demo_data
from fedhier.estimators.mvppca import FedMVPPCA
from fedhier.models.mvppca.dp import DPConfig
from fedhier.privacy.sampling import NoiseSource, lattice_gaussian


def _best(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    releases = []  # (shape, noise multiplier, sensitivity) of every Gaussian release of the fit
    release = dp.release_gaussian

    def recorded(value, multiplier, sensitivity, noise):
        releases.append((np.shape(value), multiplier, sensitivity))
        return release(value, multiplier, sensitivity, noise)

    dp.release_gaussian = recorded
    prepared = demo_data(n_sites=3, scenario="GK", seed=0)
    privacy = DPConfig.total(1.0, 1e-5, n_rounds=args.rounds, n_views=max(len(s) for s in prepared.sites), spread=True)
    FedMVPPCA(n_components=5, n_rounds=args.rounds, random_state=0, privacy=privacy).fit(prepared.sites)
    dp.release_gaussian = release

    source, rng = NoiseSource(), np.random.default_rng()
    lattice = _best(lambda: [lattice_gaussian(np.zeros(s), z, d, source) for s, z, d in releases], args.repeats)
    floating = _best(lambda: [np.zeros(s) + rng.normal(0.0, z * d, size=s) for s, z, d in releases], args.repeats)
    entries = sum(int(np.prod(s)) for s, _, _ in releases)
    print(f"{len(releases)} Gaussian releases, {entries} entries")
    print(f"lattice sampler (os.urandom): {lattice:.3f} s; numpy Generator.normal: {floating:.3f} s; "
          f"ratio {lattice / floating:.1f}")


if __name__ == "__main__":
    main()
