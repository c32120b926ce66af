"""Seconds per round of fedhier over Flower against Flower's own floor and against simulate().

Run:  python benchmarks/bench_flower.py [--rounds 5] [--repeats 5] [--busy 3] [--tls] [--secure] [--start-only [--model fedlin-hm1]]   (about 2 minutes per repeat)

The bundled Alzheimer data (333 subjects, views of 124 + 3 + 4 features) is split into three
hospitals (iid, ``fedhier flower demo-data``); on one federation of a real ``flower-superlink``
and three ``flower-supernode`` processes on 127.0.0.1 (:class:`fedhier.cli.flower.LoopbackFederation`),
in this run:

* fedhier's Fed-mv-PPCA fit, submitted with ``fedhier flower run`` (and, with ``--secure``, the
  same fit with secure summation, two rounds);
* the Flower floor: ``benchmarks/flower_floor/``, a minimal Flower Message-API app (no fedhier,
  its ClientApp imports only Flower) that sends each round the same bytes down and up as the
  fedhier fit's rounds, with the same poll interval;
* both ``--repeats`` times (default 5), alternating which runs first (fedhier then floor, floor
  then fedhier, ...), since a round's time on a shared machine varies by seconds from one round
  to the next and a federation's first run pays for warming it;
* with ``--busy N``, all of it on a machine held busy by N busy processes per core
  (``benchmarks/cpu_burner.py``), as a loaded host;
* the same fit in-process with :func:`fedhier.runtime.simulate`.

Printed: the ClientApp's start (a new process per message, in Flower) of fedhier against Flower's
bare one, in CPU seconds and wall seconds (``--start-only``: only that); seconds per round of each (push of the round to its last reply / global step done),
the median over the rounds after round 1 of every repeat and the ratio fedhier / floor, with the
ratio of each repeat and their median (the target of issue "runtimes" is at
most 1.1 for plain rounds); with ``--secure``, what each of a secure round's four extra
exchanges costs in floor rounds; and the largest difference between the Flower and the
in-process fit's global parameters (0 expected).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from cpu_burner import CpuBurner  # noqa: E402

from fedhier.data import load_alzheimer, partition
from fedhier.deploy import read_fit
from fedhier.deploy.mvppca import FlowerFitConfig
from fedhier.cli.flower import (LoopbackFederation, _connection_home, _run_streaming, flwr_run_command, submit,
                                 write_demo_sites, write_fleet_sites)
from fedhier.runtime.flower import read_result
from fedhier.runtime.simulate import simulate

SITES = ("hospital-a", "hospital-b", "hospital-c")
FLOOR_APP = Path(__file__).parent / "flower_floor"


def floor_rounds(federation: LoopbackFederation, tmp: Path, *, rounds: int, down: int, up: int, poll: float) -> list[float]:
    """Seconds per round of the Flower floor app on ``federation``: ``down`` bytes to each SuperNode, ``up`` back."""
    tmp.mkdir(parents=True, exist_ok=True)
    app = tmp / "floor-app"
    shutil.copytree(FLOOR_APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp / "floor.json"
    overrides = tmp / "floor-config.toml"
    overrides.write_text(f'floor-rounds = {rounds}\nfloor-down = {down}\nfloor-up = {up}\nfloor-nodes = {len(SITES)}\n'
                         f'floor-poll = {poll}\nfloor-out = "{out}"\n')
    tls = federation.tls_options().get("root_certificates")
    env = {**os.environ, "FLWR_HOME": str(_connection_home(tmp / "floor-home", federation.address, tls))}
    code, output = _run_streaming(flwr_run_command(app, "fedhier", overrides), env, timeout=1800)
    if code != 0 or not out.is_file():
        raise SystemExit(f"the floor app failed (exit code {code}): {output[-2000:]}")
    return json.loads(out.read_text())


#: what a ClientApp process does before it handles its first message: the floor's imports only Flower; fedhier's
#: its app module and, on its first round message, the fit's site step (resolving the run config builds the protocol)
CLIENT_START = {
    "Flower's bare ClientApp": f"import sys; sys.path.insert(0, {str(FLOOR_APP)!r}); import floor_app",
    "fedhier's ClientApp": "import fedhier.runtime.flower_app.client_app; from fedhier.deploy import fit_from_json; "
                           "fit_from_json(sys.argv[1]).protocol()",
}


def client_start(fit_json: str, repeats: int) -> dict[str, list[tuple[float, float]]]:
    """(CPU seconds, wall seconds) of ``repeats`` fresh ClientApp starts of each kind, alternating the kinds.

    CPU seconds (user + system, of the process) do not depend on how busy the host is; on a host
    whose cores are shared by ``k`` busy processes each, wall seconds are about ``k + 1`` times as many.
    """
    probe = ("import resource, sys, time; t0 = time.perf_counter(); {start}; r = resource.getrusage(resource.RUSAGE_SELF); "
             "print(r.ru_utime + r.ru_stime, time.perf_counter() - t0)")
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in CLIENT_START}
    for repeat in range(repeats):
        for name in (list(CLIENT_START) if repeat % 2 == 0 else list(CLIENT_START)[::-1]):
            out = subprocess.run([sys.executable, "-c", probe.format(start=CLIENT_START[name]), fit_json],
                                 capture_output=True, text=True, check=True).stdout.split()
            times[name].append((float(out[0]), float(out[1])))
    return times


def bytecode_cached() -> bool:
    """Whether fedhier's modules have compiled bytecode beside them; without it every ClientApp process compiles them."""
    import fedhier.runtime.flower as module

    return Path(importlib.util.cache_from_source(module.__file__)).is_file()


def print_client_start(times: dict[str, list[tuple[float, float]]]) -> None:
    (floor_name, floor), (ours_name, ours) = times.items()
    cpu = {name: statistics.median(c for c, _ in t) for name, t in times.items()}
    wall = {name: statistics.median(w for _, w in t) for name, t in times.items()}
    print(f"ClientApp start, median of {len(ours)} fresh processes: {ours_name} {cpu[ours_name]:.2f} CPU s "
          f"({wall[ours_name]:.2f} s wall), {floor_name} {cpu[floor_name]:.2f} CPU s ({wall[floor_name]:.2f} s wall): "
          f"{cpu[ours_name] - cpu[floor_name]:.2f} CPU s more per site per round")
    if not bytecode_cached():
        print("  fedhier's modules have no compiled bytecode here (PYTHONDONTWRITEBYTECODE set, or a read-only folder): "
              "each ClientApp process compiles them from source; `python -m compileall -q` on the fedhier folder "
              "compiles them once")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tls", action="store_true", help="TLS between the SuperNodes and the SuperLink")
    parser.add_argument("--secure", action="store_true", help="also a 2-round fit with secure summation")
    parser.add_argument("--repeats", type=int, default=5, help="fedhier fits and floor runs, alternating which is first")
    parser.add_argument("--busy", type=int, default=0, help="busy processes per core while it runs (0: none)")
    parser.add_argument("--start-only", action="store_true", help="only the ClientApp start of fedhier against Flower's")
    parser.add_argument("--model", choices=["fed-mv-ppca", "fedlin-hm1", "fedlin-hm2"], default="fed-mv-ppca",
                        help="with --start-only: the family whose ClientApp starts (FedLin: the bundled fleet's fit)")
    args = parser.parse_args()
    burner = CpuBurner(per_core=args.busy) if args.busy else contextlib.nullcontext()
    with burner:
        if args.start_only:
            with tempfile.TemporaryDirectory(prefix="bench-flower-") as tmp:
                if args.model == "fed-mv-ppca":
                    fit_toml = write_demo_sites(Path(tmp) / "sites", n_sites=3, seed=0, n_components=5, n_rounds=args.rounds)
                else:
                    fit_toml = write_fleet_sites(Path(tmp) / "sites", model=args.model, n_rounds=args.rounds)
                print_client_start(client_start(read_fit(fit_toml).to_json(), args.repeats))
        else:
            run(args)


def run(args: argparse.Namespace) -> None:

    with tempfile.TemporaryDirectory(prefix="bench-flower-") as tmp:
        tmp = Path(tmp)
        fit_toml = write_demo_sites(tmp / "sites", n_sites=3, seed=0, n_components=5, n_rounds=args.rounds)
        config = FlowerFitConfig.read(fit_toml)
        starts = client_start(config.to_json(), args.repeats)
        data = load_alzheimer()
        sites = partition(data.views, data.labels, 3, "iid", random_state=0).sites

        t0 = time.perf_counter()
        reference = simulate(config.protocol(), sites, n_rounds=config.n_rounds, random_state=config.seed)
        simulate_wall = time.perf_counter() - t0

        with LoopbackFederation(tmp / "federation", {s: tmp / "sites" / f"{s}.csv" for s in SITES}, tls=args.tls,
                                site_seed=config.seed) as federation:
            ours, floors, walls = [], [], []
            down = up = None  # bytes per site per round of the fit, which the floor then sends: known after the first fit
            for repeat in range(args.repeats):
                if repeat % 2 and up is not None:  # odd repeats: the floor first
                    floors.append(floor_rounds(federation, tmp / f"floor-{repeat}", rounds=args.rounds, down=down, up=up,
                                               poll=config.poll_interval))
                t0 = time.perf_counter()
                out = tmp / f"out-{repeat}"
                summary = submit(fit_toml, superlink=federation.address, timeout=1800, out=out, **federation.tls_options())
                walls.append(time.perf_counter() - t0)
                if summary.get("status") != "completed":
                    raise SystemExit(f"the Flower fit did not complete: {summary}")
                broadcast, history, _ = read_result(out, config)
                ours.append([r["seconds"] for r in history])
                down = int(statistics.median(v for r in history for v in r["bytes_down"].values()))
                up = int(statistics.median(v for r in history for v in r["bytes_up"].values()))
                if len(floors) < len(ours):
                    floors.append(floor_rounds(federation, tmp / f"floor-{repeat}", rounds=args.rounds, down=down, up=up,
                                               poll=config.poll_interval))
            secure = None
            if args.secure:
                secure_toml = tmp / "sites" / "fit-secure.toml"
                secure_toml.write_text('aggregation = "secure"\n' + fit_toml.read_text().replace(f"n_rounds = {args.rounds}", "n_rounds = 2"))
                summary = submit(secure_toml, superlink=federation.address, timeout=1800, out=tmp / "out-secure",
                                 **federation.tls_options())
                if summary.get("status") != "completed":
                    raise SystemExit(f"the secure Flower fit did not complete: {summary}")
                secure = [r["seconds"] for r in json.loads((tmp / "out-secure" / "history.json").read_text())]

    diff = max(float(np.max(np.abs(broadcast[k] - reference.broadcast[k]))) for k in broadcast)
    print(f"Fed-mv-PPCA, Alzheimer data, 3 hospitals, {config.n_rounds} rounds, q={config.n_components}, "
          f"transport {'TLS' if args.tls else 'plain HTTP'} on 127.0.0.1; {down} bytes down and {up} bytes up per site per round")
    print(f"{'repeat':>6} {'round':>5} {'simulate s':>11} {'fedhier/Flower s':>17} {'Flower floor s':>15}")
    for repeat, (mine, bare) in enumerate(zip(ours, floors)):
        for sim, a, b in zip(reference.history, mine, bare):
            print(f"{repeat + 1:>6} {sim.round:>5} {sim.seconds:>11.3f} {a:>17.2f} {b:>15.2f}")
    later = slice(1, None) if args.rounds > 1 else slice(None)
    ours_med = statistics.median(x for mine in ours for x in mine[later])
    floor_med = statistics.median(x for bare in floors for x in bare[later])
    per_repeat = [statistics.median(mine[later]) / statistics.median(bare[later]) for mine, bare in zip(ours, floors)]
    sim_med = statistics.median(r.seconds for r in reference.history[later])
    busy = f", {args.busy} busy processes per core" if args.busy else ""
    print(f"median round after round 1 over {args.repeats} repeat(s){busy}: fedhier over Flower {ours_med:.2f} s, Flower "
          f"floor {floor_med:.2f} s, ratio {ours_med / floor_med:.2f} (target <= 1.1; per repeat "
          f"{', '.join(f'{r:.2f}' for r in per_repeat)}, their median {statistics.median(per_repeat):.2f}); "
          f"simulate() {sim_med:.3f} s")
    if secure is not None:
        per_exchange = (statistics.median(secure) - ours_med) / 4
        print(f"secure round (median of {len(secure)}): {statistics.median(secure):.2f} s; each of its 4 extra exchanges "
              f"costs {per_exchange:.2f} s = {per_exchange / floor_med:.2f} floor rounds (target <= 1)")
    print_client_start(starts)
    print(f"whole fit (wall, median): simulate {simulate_wall:.2f} s, Flower {statistics.median(walls):.1f} s "
          "(with submission and app start)")
    print(f"largest |difference| of the global parameters, Flower against simulate(): {diff:.3g}")


if __name__ == "__main__":
    sys.exit(main())
