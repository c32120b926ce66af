"""Federated against pooled, and heterogeneous against IID sites: the EM prior update beside the paper's.

Run:  python examples/mvppca_parity.py            (about 25 minutes on one core)
      python examples/mvppca_parity.py --quick    (2 seeds / 3 folds, about 3 minutes)
      python examples/mvppca_parity.py --heterogeneity --n-local-iter 15   (part 2 with the paper's 15
                                                  local iterations per round, about 5 minutes)
      python examples/mvppca_parity.py --quick --noise-dof   (the federated fits with noise_dof=True; the
                                                  pooled reference stays the maximum-likelihood fit)

1. Pooled parity.  Four IID sites of 150 subjects drawn from one 3-view model (views of 12, 8 and 6
   features, q = 3), the fourth lacking view 2; 1000 test subjects from the same model.  Mean test
   log-likelihood per subject (``FedMVPPCA.score``) of the federated fit (``n_rounds=100``, default
   stopping) against the pooled fit of the same model (all training rows at one site, one round of
   800 EM iterations, the missing view as empty rows).  Relative gap (pooled - federated) / |pooled|
   per seed, mean and worst over the seeds.
2. Heterogeneity.  SD (the experiments' synthetic data) and the cells of ``fedhier experiment
   mvppca-sd``: the 10 x 3-fold CV of the experiment (``make_fold`` with its seed 0: training thirds
   over C = 3 or 6 sites, federated min-max scaling, the pooled held-out third as test set),
   scenarios IID and G (sites holding different groups), each fit seeded as the experiment seeds
   its cell.  Test MAE per scenario, mean +- sd over the repetitions of fold averages (as the
   experiment's page reports), and the ratio G / IID of the means.
"""

from __future__ import annotations

import argparse

import numpy as np

from fedhier import FedMVPPCA
from fedhier.experiments.mvppca import FED_MVPPCA, load_dataset, make_fold
from fedhier.experiments.runner import cell_seed
from fedhier.metrics import reconstruction_mae

UPDATES = ("em", "paper")


def draw(rng, n, W, mu, s2):
    x = rng.normal(size=(n, W["v1"].shape[1]))
    return {v: x @ W[v].T + mu[v] + np.sqrt(s2[v]) * rng.normal(size=(n, len(mu[v]))) for v in W}


def parity(seed: int, **options) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    dims = {"v1": 12, "v2": 8, "v3": 6}
    W = {v: rng.normal(size=(d, 3)) for v, d in dims.items()}
    mu = {v: rng.normal(size=d) for v, d in dims.items()}
    s2 = {v: rng.uniform(0.3, 1.0) for v in dims}
    sites = [draw(rng, 150, W, mu, s2) for _ in range(4)]
    del sites[3]["v2"]
    test = draw(rng, 1000, W, mu, s2)
    pooled = {v: np.vstack([s[v] if v in s else np.full((150, d), np.nan) for s in sites]) for v, d in dims.items()}
    central = FedMVPPCA(3, n_rounds=1, n_first_iter=800, sigma2_prior=None, random_state=seed).fit([pooled]).score(test)
    out = {"pooled": central}
    for update in UPDATES:
        out[update] = FedMVPPCA(3, random_state=seed, prior_update=update, **options).fit(sites).score(test)
    return out


def heterogeneity(n_sites: int, scenario: str, repeat: int, fold: int, update: str, **options) -> float:
    data = load_dataset("sd", 0)
    f = make_fold(data, seed=0, n_repeats=10, n_splits=3, repeat=repeat, fold=fold, scenario=scenario, n_sites=n_sites)
    seed = cell_seed(0, "fit", repeat, fold, scenario, n_sites, FED_MVPPCA.name)  # the experiment's seed of this cell
    model = FedMVPPCA(5, random_state=seed, prior_update=update, **options).fit(f.sites)
    return reconstruction_mae(f.test, model.reconstruct(f.test))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--heterogeneity", action="store_true", help="part 2 only")
    parser.add_argument("--n-local-iter", type=int, default=None, help="MAP-EM iterations per round in part 2 (default: the estimator's)")
    parser.add_argument("--noise-dof", action="store_true",
                        help="the federated fits' noise variances with the residual's degrees of freedom (noise_dof=True)")
    args = parser.parse_args()
    fed = {"noise_dof": True} if args.noise_dof else {}
    options = fed | ({} if args.n_local_iter is None else {"n_local_iter": args.n_local_iter})
    seeds = range(0 if args.heterogeneity else 2 if args.quick else 5)
    runs = [parity(seed, **fed) for seed in seeds]
    if runs:
        print(f"1. Pooled parity, seeds {seeds.start}-{seeds.stop - 1}: mean test log-likelihood per subject")
    for update in UPDATES if runs else ():
        gaps = np.array([(r["pooled"] - r[update]) / abs(r["pooled"]) for r in runs])
        print(f"   prior_update={update!r}: federated {np.mean([r[update] for r in runs]):.4f} vs pooled "
              f"{np.mean([r['pooled'] for r in runs]):.4f}; gap {100 * gaps.mean():.2f} % (worst {100 * gaps.max():.2f} %)")
    repeats = range(1 if args.quick else 10)
    print(f"2. SD test MAE over {len(repeats)} x 3 folds (mean ± sd over repetitions of fold averages), scenario G against IID"
          + ("" if args.n_local_iter is None else f", {args.n_local_iter} local iterations per round"))
    for n_sites in (3, 6):
        for update in UPDATES:
            mae = {s: np.array([[heterogeneity(n_sites, s, r, f, update, **options) for f in range(3)] for r in repeats])
                   for s in ("iid", "G")}
            per_repeat = {s: m.mean(axis=1) for s, m in mae.items()}
            sd = {s: v.std(ddof=1) if v.size > 1 else float("nan") for s, v in per_repeat.items()}
            print(f"   C = {n_sites}, prior_update={update!r}: IID {per_repeat['iid'].mean():.4f} ± {sd['iid']:.4f}, "
                  f"G {per_repeat['G'].mean():.4f} ± {sd['G']:.4f} (worst fold {mae['G'].max():.4f}), "
                  f"G / IID = {per_repeat['G'].mean() / per_repeat['iid'].mean():.2f}", flush=True)


if __name__ == "__main__":
    main()
