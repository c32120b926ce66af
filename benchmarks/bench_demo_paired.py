"""The demo's results over seeds, paired: the default fit against the same fit with one option changed.

Run:  python benchmarks/bench_demo_paired.py --option loading_uncertainty=False        (seeds 0-9, about a minute)
      python benchmarks/bench_demo_paired.py --option acceleration=None --seeds 5

For every seed the demo's data are split, partitioned, scaled and masked as ``fedhier demo --seed SEED`` does
(:func:`fedhier.demo.demo_data`), and two fits are made on them with that seed: ``FedMVPPCA(n_components=5,
n_rounds=100, random_state=SEED)`` with its defaults, and the same with ``--option``.  Each is summarised as the
demo summarises its fit (:func:`fedhier.demo.demo_metrics`): rounds run, test MAE, latent LDA accuracy and, per
hidden test view, the imputation MAE and its ratio to mean imputation.  Printed are each seed's pair and, over the
seeds, the mean of the paired differences (option minus default) with a 95% t-interval and the number of seeds on
which the option was lower.
"""

from __future__ import annotations

import argparse
import ast
import warnings

import numpy as np
from scipy import stats

from fedhier import FedMVPPCA
from fedhier.demo import demo_data, demo_metrics


def summary(model: FedMVPPCA, prepared) -> dict[str, float]:
    """The numbers compared: rounds, test MAE, LDA accuracy, each hidden view's imputation MAE and ratio to the mean's."""
    metrics = demo_metrics(model, prepared)
    out = {"rounds": float(model.n_rounds_), "test MAE": metrics["test_mae"], "LDA accuracy": metrics["latent_lda_accuracy"]}
    for row in metrics["imputation"]:
        out[f"imputing {row['view']}: MAE"] = row["Fed-mv-PPCA MAE"]
        out[f"imputing {row['view']}: / mean's"] = row["Fed-mv-PPCA MAE"] / row["mean-imputation MAE"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--option", required=True, metavar="NAME=VALUE",
                        help="a FedMVPPCA keyword argument and its value (a Python literal), e.g. loading_uncertainty=False")
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0..SEEDS-1 (default 10)")
    args = parser.parse_args()
    name, value = args.option.split("=", 1)
    option = {name: ast.literal_eval(value)}
    rows = []
    for seed in range(args.seeds):
        prepared = demo_data(seed=seed)
        pair = []
        for options in ({}, option):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a seed that runs all its rounds warns; the rounds are printed
                model = FedMVPPCA(n_components=5, n_rounds=100, random_state=seed, **options).fit(prepared.sites)
            pair.append(summary(model, prepared))
        rows.append(pair)
        print(f"seed {seed}: " + "; ".join(f"{k} {pair[0][k]:.4g} -> {pair[1][k]:.4g}" for k in pair[0]), flush=True)
    print(f"\nover seeds 0-{args.seeds - 1}: default -> {args.option}, mean of the paired differences [95% interval], "
          "seeds where the option is lower")
    for key in rows[0][0]:
        diff = np.array([b[key] - a[key] for a, b in rows])
        half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else np.nan
        default = np.median([a[key] for a, _ in rows])
        print(f"  {key:<34} median {default:8.4f} -> {np.median([b[key] for _, b in rows]):8.4f}   "
              f"difference {diff.mean():+.4f} [{diff.mean() - half:+.4f}, {diff.mean() + half:+.4f}]   "
              f"lower on {int(np.sum(diff < 0))} of {len(diff)}")


if __name__ == "__main__":
    main()
