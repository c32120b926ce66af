"""How many rounds does Fed-mv-PPCA need on the demo?  The plain round loop against EM acceleration.

Run:  python benchmarks/bench_rounds.py                    (seeds 0-9, about a minute)
      python benchmarks/bench_rounds.py --long 400         (also against 400 plain rounds, about two minutes)
      python benchmarks/bench_rounds.py --seeds 3           (a quick look)
      python benchmarks/bench_rounds.py --shape 0 --long 400   (what moves on the slow path: seed 0's plain rounds)
      python benchmarks/bench_rounds.py --long 400 --map-em   (every fit with the sites' MAP-EM, as before their
                                                               loadings' uncertainty was counted)

For every seed the demo's data are split as ``fedhier demo --seed SEED`` splits them
(:func:`fedhier.demo.demo_data`), and the fit of the plain round loop (``FedMVPPCA(n_components=5, random_state=SEED, acceleration=None)``,
the default before the acceleration, stopped by its own ``tol`` rule) is the reference: its global model's predictions and its test
MAE (the demo's masked test third).  Each candidate is then fitted on the same split with the same seed and
printed are, over the seeds,

* ``reach``: the first round whose broadcast predicts within ``tol`` of the reference's, the quantity the
  stopping rule uses (:func:`fedhier.models.mvppca.model_change` between the two global models, below the
  default ``tol``); a round is one broadcast and the sites' replies, whatever the coordinator does with them;
* ``stop``: the rounds the candidate ran until its own stopping rule ended it;
* ``apart``: how far its final predictions are from the reference's (the same quantity; ``tol`` is 0.02);
* ``MAE ratio``: its final test MAE over the reference's, paired by seed.

``--long R`` also fits the plain loop for R rounds without the stopping rule and prints how far each
candidate's final predictions, and the reference's, are from that fit's (``to long``): the demo's fit
keeps moving slowly long after the rule stops it, so the reference is one point on a long path.

Each column gives the median and the range [min, max] over the seeds.

``--shape SEED`` prints instead, for seed SEED's plain rounds (``--long`` of them, without the stopping rule), the
eigenvalues of the latents' pooled second moment that the sites sent (``history_``'s ``latent_moment_min`` and
``latent_moment_max``; I at the fixed point of the latents' prior) and the squared norms of the two largest
columns of each view's W~ (the next round's broadcast).
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np

from fedhier import FedMVPPCA
from fedhier.demo import demo_data
from fedhier.metrics import reconstruction_mae
from fedhier.models.mvppca.predictive import model_change
from fedhier.protocol.defaults import MVPPCA_TOL
from fedhier.protocol.mvppca import global_from_message

#: the candidates: FedMVPPCA's keyword arguments beside the demo's n_components and random_state
CANDIDATES = {
    "plain (the paper's loop)": {"acceleration": None},
    "squarem (default)": {"acceleration": "squarem"},
}


class Broadcasts:
    """Round callback keeping every round's broadcast (a copy of its arrays)."""

    def __init__(self):
        self.rounds: list[dict[str, np.ndarray]] = []

    def __call__(self, record, broadcast) -> None:
        self.rounds.append({k: np.array(v) for k, v in broadcast.items()})


#: options every fit of the run takes (``--map-em``)
COMMON: dict = {}


def fit(sites, seed: int, **options) -> tuple[FedMVPPCA, list[dict[str, np.ndarray]]]:
    kept = Broadcasts()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a candidate that does not settle warns; the table says so
        model = FedMVPPCA(n_components=5, random_state=seed, progress=False, **COMMON, **options).fit(sites, callbacks=[kept])
    return model, kept.rounds


def first_round_within(reference, broadcasts, schema, tol: float) -> float:
    """The first round (1-based) whose global model predicts within ``tol`` of ``reference``; inf if none."""
    for r, broadcast in enumerate(broadcasts, start=1):
        current = global_from_message(broadcast, schema)
        if current is not None and model_change(reference, current) < tol:
            return float(r)
    return float("inf")


def summary(values) -> str:
    values = np.asarray(values, dtype=float)
    return f"{np.median(values):7.3g} [{values.min():.3g}, {values.max():.3g}]"


def shape(seed: int, n_rounds: int) -> None:
    """Seed ``seed``'s plain rounds without the stopping rule: the latents' second moment and W~'s largest columns."""
    data = demo_data(seed=seed)
    model, broadcasts = fit(data.sites, seed, acceleration=None, tol=None, n_rounds=n_rounds)
    for r in sorted({2, 3, 5, 10, 20, 50, 100, 200, 300, n_rounds} & set(range(1, n_rounds + 1))):
        metrics = model.history_[r - 1]["metrics"]
        g = global_from_message(broadcasts[r - 1], model.schema_)
        norms = "; ".join(f"{v} {np.round(np.sort(np.sum(p.W**2, axis=0))[::-1][:2], 3)}" for v, p in g.items())
        print(f"round {r:>4}: latent second moment's eigenvalues {metrics['latent_moment_min']:.3f}.."
              f"{metrics['latent_moment_max']:.3f}; two largest ||w~_i||^2: {norms}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 .. SEEDS-1 (default 10)")
    parser.add_argument("--long", type=int, default=0, help="rounds of the long plain fit (default 0: none)")
    parser.add_argument("--shape", type=int, metavar="SEED", help="print the shape of the loadings round by round")
    parser.add_argument("--map-em", action="store_true",
                        help="every fit with the sites' paper MAP-EM, their loadings taken as known (loading_uncertainty=False)")
    args = parser.parse_args()
    if args.map_em:
        COMMON["loading_uncertainty"] = False
    if args.shape is not None:
        shape(args.shape, args.long or 400)
        return
    tol = MVPPCA_TOL
    rows = {name: {"reach": [], "stop": [], "apart": [], "ratio": [], "long": []} for name in CANDIDATES}
    reference_rounds, reference_long = [], []
    for seed in range(args.seeds):
        data = demo_data(seed=seed)
        reference, reference_broadcasts = fit(data.sites, seed, acceleration=None)
        schema = reference.schema_
        target = global_from_message(reference_broadcasts[-1], schema)
        reference_mae = reconstruction_mae(data.test_masked, reference.reconstruct(data.test_masked))
        reference_rounds.append(reference.n_rounds_)
        if args.long:
            _, long_broadcasts = fit(data.sites, seed, acceleration=None, tol=None, n_rounds=args.long)
            limit = global_from_message(long_broadcasts[-1], schema)
            reference_long.append(model_change(limit, target))
        line = [f"seed {seed}: reference {reference.n_rounds_} rounds, MAE {reference_mae:.4f}"]
        for name, options in CANDIDATES.items():
            model, broadcasts = fit(data.sites, seed, **options)
            mae = reconstruction_mae(data.test_masked, model.reconstruct(data.test_masked))
            rows[name]["reach"].append(first_round_within(target, broadcasts, schema, tol))
            rows[name]["stop"].append(model.n_rounds_)
            rows[name]["ratio"].append(mae / reference_mae)
            final = global_from_message(broadcasts[-1], schema)
            rows[name]["apart"].append(model_change(target, final))
            if args.long:
                rows[name]["long"].append(model_change(limit, final))
            line.append(f"{name.split()[0]} reach {rows[name]['reach'][-1]:.0f} stop {model.n_rounds_} "
                        f"MAE x{mae / reference_mae:.4f}")
        print("; ".join(line), flush=True)
    print("(each column: median [min, max] over the seeds)")
    print(f"\nseeds 0-{args.seeds - 1}, tol {tol}; the reference (the plain loop) stopped after "
          f"{summary(reference_rounds)} rounds")
    if args.long:
        print(f"the reference's predictions are {summary(reference_long)} from those of {args.long} plain rounds")
    columns = ("reach", "stop", "apart", "ratio") + (("long",) if args.long else ())
    titles = {"reach": "reach", "stop": "stop", "apart": "apart", "ratio": "MAE ratio", "long": "to long"}
    print(f"{'candidate':26s}" + "".join(f"{titles[c]:>26s}" for c in columns))
    for name, row in rows.items():
        print(f"{name:26s}" + "".join(f"{summary(row[c]):>26s}" for c in columns))


if __name__ == "__main__":
    main()
