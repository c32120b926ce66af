"""Per-round overhead of the Flower runtime against simulate() on the same Fed-mv-PPCA fit.

Run:  python benchmarks/bench_flower.py [--rounds 5] [--tls]      (about two minutes; needs fedhier[flower])

The bundled Alzheimer data (333 subjects, views of 124 + 3 + 4 features) is split into three
hospitals (iid, ``fedhier flower demo-data``) and fitted twice in this run with the same seed:

* in-process with :func:`fedhier.runtime.simulate`;
* over a real ``flower-superlink`` and three ``flower-supernode`` processes on 127.0.0.1
  (:class:`fedhier.flower_cli.LoopbackFederation`), submitted with ``fedhier flower run``.

Printed: seconds per round of each (the runtimes' own round records: broadcast sent to the
global step done), Flower's overhead per round and the ratio, the wall time of the whole fit,
and the largest difference between the two fits' global parameters (0 expected).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from fedhier.data import load_alzheimer, partition
from fedhier.flower_cli import LoopbackFederation, submit, write_demo_sites
from fedhier.deploy.mvppca import FlowerFitConfig
from fedhier.runtime.flower import read_result
from fedhier.runtime.simulate import simulate

SITES = ("hospital-a", "hospital-b", "hospital-c")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tls", action="store_true", help="TLS between the SuperNodes and the SuperLink")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-flower-") as tmp:
        tmp = Path(tmp)
        fit_toml = write_demo_sites(tmp / "sites", n_sites=3, seed=0, n_components=5, n_rounds=args.rounds)
        config = FlowerFitConfig.read(fit_toml)
        data = load_alzheimer()
        sites = partition(data.views, data.labels, 3, "iid", random_state=0).sites

        t0 = time.perf_counter()
        reference = simulate(config.protocol(), sites, n_rounds=config.n_rounds, random_state=config.seed)
        simulate_wall = time.perf_counter() - t0

        with LoopbackFederation(tmp / "federation", {s: tmp / "sites" / f"{s}.csv" for s in SITES}, tls=args.tls) as federation:
            t0 = time.perf_counter()
            summary = submit(fit_toml, superlink=federation.address, timeout=600, out=tmp / "out", **federation.tls_options())
            flower_wall = time.perf_counter() - t0
        if summary.get("status") != "completed":
            raise SystemExit(f"the Flower fit did not complete: {summary}")
        broadcast, history, _ = read_result(tmp / "out", config)

    diff = max(float(np.max(np.abs(broadcast[k] - reference.broadcast[k]))) for k in broadcast)
    print(f"Fed-mv-PPCA, Alzheimer data, 3 hospitals, {config.n_rounds} rounds, q={config.n_components}, "
          f"transport {'TLS' if args.tls else 'plain HTTP'} on 127.0.0.1")
    print(f"{'round':>5} {'simulate s':>11} {'Flower s':>9} {'overhead s':>11} {'ratio':>7}")
    for sim, fl in zip(reference.history, history):
        print(f"{sim.round:>5} {sim.seconds:>11.3f} {fl['seconds']:>9.2f} {fl['seconds'] - sim.seconds:>11.2f} {fl['seconds'] / sim.seconds:>7.0f}")
    later_sim = statistics.median(r.seconds for r in reference.history[1:]) if len(history) > 1 else reference.history[0].seconds
    later_fl = statistics.median(r["seconds"] for r in history[1:]) if len(history) > 1 else history[0]["seconds"]
    print(f"median round after round 1: simulate {later_sim:.3f} s, Flower {later_fl:.2f} s, "
          f"overhead {later_fl - later_sim:.2f} s per round, ratio {later_fl / later_sim:.0f}x")
    print(f"whole fit (wall): simulate {simulate_wall:.2f} s, Flower {flower_wall:.1f} s (with submission and app start), "
          f"ratio {flower_wall / simulate_wall:.0f}x")
    print(f"largest |difference| of the global parameters: {diff:.3g}")


if __name__ == "__main__":
    main()
