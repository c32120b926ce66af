"""Total-budget DP-Fed-mv-PPCA on the mvppca-dp experiment's setting, fold by fold.

Run:  python examples/mvppca_dp_total_budget.py --epsilons 1,10,100,1000,7000 --folds 0:0,0:1
      (about 10 s per fit on one core)

The fits of ``fedhier experiment mvppca-dp`` (SD data, IID, 3 sites, q = 5, 100 rounds, the same
folds and seeds as its cells), for the total budgets given (delta = 1e-5) and, for comparison, the
paper's per-release budget of (10, 0.01), whose end-to-end epsilon is about 7000.  Printed per fold
and budget: the rounds run, the largest epsilon a site spent (privacy-loss-distribution accountant,
delta = 1e-5), the test MAE and that of the training mean (the trivial model).
"""

from __future__ import annotations

import argparse
import time
import warnings

from fedhier.experiments.mvppca import (
    TRAINING_MEAN, _dp_design, _dp_method, cell_seed, evaluate, fit_method, load_dataset, make_fold,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", default="1,10,100,1000,7000", help="total epsilons per site, comma-separated")
    parser.add_argument("--folds", default="0:0,0:1", help="repetition:fold pairs of the experiment's CV, comma-separated")
    parser.add_argument("--seed", type=int, default=0, help="the experiment's seed")
    args = parser.parse_args()
    design = _dp_design(False)
    data = load_dataset(design.dataset, args.seed)
    methods = [("epsilon total", float(e), _dp_method(float(e), design.total_delta, 1.0, "total")) for e in args.epsilons.split(",")]
    methods.append(("epsilon per release", 10.0, _dp_method(10.0, design.delta)))
    for pair in args.folds.split(","):
        repeat, fold_index = (int(x) for x in pair.split(":"))
        fold = make_fold(data, seed=args.seed, n_repeats=design.n_repeats, n_splits=design.n_splits, repeat=repeat,
                         fold=fold_index, scenario=design.scenario, n_sites=design.n_sites)
        mean_mae = evaluate(fit_method(TRAINING_MEAN, fold.sites, n_components=design.n_components, schedule=design.schedule,
                                       seed=0), fold)["mae_test"]
        for sweep, value, method in methods:
            key = {"sweep": sweep, "value": value, "repeat": repeat, "fold": fold_index}  # as the experiment's cells
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = fit_method(method, fold.sites, n_components=design.n_components, schedule=design.schedule,
                                   seed=cell_seed(args.seed, "fit", *key.values(), method.name))
            spent = max(s["epsilon"] for s in model.privacy_spent_.values())
            print(f"repetition {repeat} fold {fold_index}  {method.name:45s} rounds {model.n_rounds_:3d}  "
                  f"spent ε {spent:9.4g}  test MAE {evaluate(model, fold)['mae_test']:.4f}  "
                  f"training mean {mean_mae:.4f}  ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
