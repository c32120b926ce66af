"""Private Fed-mv-PPCA against the training mean, paired over seeds, with the utility forecast beside each cell.

    PYTHONPATH=src python benchmarks/private_utility.py [--seeds 10] [--data demo,sd,mfeat,synthetic3000,...]
                                                         [--epsilons 0.5,1,2,5,10,100] [--units site,record]
                                                         [--rounds 100] [--plain-rounds 100]

For every data set, unit of protection (site-level: ``DPConfig.total(eps, 1e-5, n_rounds=100, n_views=3,
spread=True)``, the demo's ``--dp``; record-level: ``RecordDP(eps, 1e-5)``) and total epsilon: the test MAE
of the private fit, of the training mean (:class:`fedhier.baselines.mean.TrainingMean`) and of the
non-private fit, averaged over the seeds; the paired difference private - mean with its 95 % t interval;
the forecast's kept fraction (:func:`fedhier.models.mvppca.forecast.mvppca_forecast`, public quantities
only) and whether its verdict falls on the same side of the mean as the measured mean difference.  The
last line counts the cells where it does (the forecast's calibration check).

``--rounds R1,R2,...`` compares schedules of a site-level fit under the same total budget: the budget is split
over R rounds (the noise calibrated for R rounds, every round run), and each R after the first gets the paired
difference of its test MAE against the first's.

Data sets (a third of the subjects held out per seed; min-max scaling from the training sites' ranges, as
the demo does):

* ``demo``: the demo's split of the bundled Alzheimer data (3 sites, G/K, views 124 / 3 / 4, q = 5);
* ``sd``, ``mfeat``: the experiments' SD data (400 subjects drawn from the multi-view model with ``seed``, views
  15 / 8 / 10) and the bundled UCI digits (2,000 subjects, 6 views, 649 features), a third held out as one fold of
  the experiments' cross-validation, the rest over 3 sites in scenario G/K;
* ``syntheticN``: N subjects drawn from the hierarchical model (``make_federated_ppca``; 3 sites of N/3
  subjects, views of 20 / 20 / 20, q = 5, prior sds 1, noise variance IG(3, 2)), 2N/3 for training.

Private fits draw their noise as the library does; the intervals are over the seeds' splits and draws.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np
from scipy import stats as sps

DELTA = 1e-5
COMMAND = "PYTHONPATH=src python benchmarks/private_utility.py"


def _demo(seed: int):
    from fedhier.demo import demo_data

    d = demo_data(seed=seed)
    return d.sites, d.test_masked


def _synthetic(n: int, seed: int):
    from fedhier.data import MinMaxScaling, combine_ranges, site_ranges
    from fedhier.data.synthetic import make_federated_ppca

    fed = make_federated_ppca(3, n // 3, (20, 20, 20), 5, sd_mu=1.0, sd_W=1.0, sigma2_alpha=3.0, sigma2_beta=2.0,
                              random_state=seed)
    cut = 2 * (n // 3) // 3
    train = [{v: X[:cut] for v, X in s.items()} for s in fed.sites]
    test = {v: np.vstack([s[v][cut:] for s in fed.sites]) for v in fed.sites[0]}
    scaling = MinMaxScaling(combine_ranges([site_ranges(s) for s in train]))
    return [scaling.transform(s) for s in train], scaling.transform(test)


def _experiment(name: str, seed: int):
    from fedhier.experiments.mvppca import load_dataset, make_fold

    fold = make_fold(load_dataset(name, seed), seed=seed, n_repeats=1, n_splits=3, repeat=0, fold=0, scenario="GK",
                     n_sites=3)
    return fold.sites, fold.test


def _data(name: str, seed: int):
    if name == "demo":
        return _demo(seed)
    if name in ("sd", "mfeat"):
        return _experiment(name, seed)
    return _synthetic(int(name.removeprefix("synthetic")), seed)


def _interval(values) -> tuple[float, float, float]:
    values = np.asarray(values, dtype=float)
    m = float(values.mean())
    if len(values) < 2:
        return m, math.nan, math.nan
    half = float(sps.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values)))
    return m, m - half, m + half


def _cells(units, schedules):
    """(unit, rounds) of every private fit: each schedule for site-level DP, one release for record-level."""
    return [(unit, rounds) for unit in units for rounds in (schedules if unit == "site" else [1])]


def _privacy(unit: str, epsilon: float, rounds: int, n_views: int):
    from fedhier.models.mvppca.dp import DPConfig
    from fedhier.privacy.analyze_gauss import RecordDP

    if unit == "site":
        return DPConfig.total(epsilon, DELTA, n_rounds=rounds, n_views=n_views, spread=True)
    return RecordDP(epsilon, DELTA)


def main() -> None:
    from fedhier.baselines.mean import TrainingMean
    from fedhier.estimators.mvppca import FedMVPPCA
    from fedhier.metrics import reconstruction_mae
    from fedhier.models.mvppca.forecast import mvppca_forecast

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--data", default="demo,synthetic3000,synthetic30000")
    parser.add_argument("--epsilons", default="0.5,1,2,5,10,100")
    parser.add_argument("--units", default="site,record")
    parser.add_argument("--rounds", default="100", help="rounds of a site-level fit; several compare schedules")
    parser.add_argument("--plain-rounds", type=int, default=100, help="rounds of the non-private fit")
    args = parser.parse_args()
    schedules = [int(r) for r in args.rounds.split(",")]
    epsilons = [float(e) for e in args.epsilons.split(",")]
    units = args.units.split(",")
    t0 = time.perf_counter()
    print(f"`{COMMAND} --seeds {args.seeds} --data {args.data} --epsilons {args.epsilons} --units {args.units} "
          f"--rounds {args.rounds} --plain-rounds {args.plain_rounds}`\n")
    print("| data | unit | rounds | ε | test MAE, private | training mean | non-private | private − mean (95 % interval) "
          f"| against {schedules[0]} rounds (95 % interval) | forecast: signal kept | forecast | right side |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    right = cells = 0
    for name in args.data.split(","):
        mae: dict = {}
        shapes = None
        for seed in range(args.seeds):
            sites, test = _data(name, seed)
            dims = {v: X.shape[1] for v, X in test.items()}
            shapes = (dims, sum(len(next(iter(s.values()))) for s in sites), len(sites))

            def fit(privacy, rounds=100):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a view left at its prior etc.: counted in the MAE
                    model = FedMVPPCA(n_components=5, n_rounds=rounds, random_state=seed, privacy=privacy).fit(sites)
                return reconstruction_mae(test, model.reconstruct(test))

            mae.setdefault("mean", []).append(reconstruction_mae(test, TrainingMean().fit(sites).reconstruct(test)))
            mae.setdefault("non-private", []).append(fit(None, args.plain_rounds))
            for unit, rounds in _cells(units, schedules):
                for eps in epsilons:
                    mae.setdefault((unit, rounds, eps), []).append(fit(_privacy(unit, eps, rounds, len(dims)), rounds))
        dims, n_subjects, n_sites = shapes
        mean, plain = float(np.mean(mae["mean"])), float(np.mean(mae["non-private"]))
        for unit, rounds in _cells(units, schedules):
            for eps in epsilons:
                outlook = mvppca_forecast(dims, 5, n_sites, _privacy(unit, eps, rounds, len(dims)), n_subjects=n_subjects)
                private = mae[(unit, rounds, eps)]
                diff, low, high = _interval(np.subtract(private, mae["mean"]))
                against = "—"
                if unit == "site" and rounds != schedules[0]:
                    d, lo, hi = _interval(np.subtract(private, mae[(unit, schedules[0], eps)]))
                    against = f"{d:+.4f} ({lo:+.4f}, {hi:+.4f})"
                ok = (diff < 0) == outlook.beats_mean
                right, cells = right + ok, cells + 1
                print(f"| {name} | {unit} | {rounds if unit == 'site' else 1} | {eps:g} | {np.mean(private):.4f} | {mean:.4f} | "
                      f"{plain:.4f} | {diff:+.4f} ({low:+.4f}, {high:+.4f}) | {against} | {outlook.kept:.3f} | "
                      f"{'beats' if outlook.beats_mean else 'no better than'} the mean | {'yes' if ok else 'no'} |")
    print(f"\nforecast on the right side of the training mean in {right} of {cells} cells "
          f"({args.seeds} seeds each; {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
