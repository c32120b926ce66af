"""The round-1 start of Fed-mv-PPCA on the demo: PCA of each site's views vs the paper's U(-2, 2).

Run:  python examples/mvppca_start.py   (about 3 minutes on one core)

The demo's setting (Alzheimer data, 3 sites in scenario G/K, q = 5, 100 rounds) over seeds 0-4
(each seed its own split and fit), without DP, with a site-level total budget (epsilon 1, delta 1e-5
per site for the whole fit) and with the paper's per-release budget of ``fedhier demo --paper-dp``
(site-level, epsilon 10, delta 0.01 per block per round).  Each seed fits
twice: the defaults (``init="pca"``, ``local_tol=1e-8``) and the paper's start and iteration
counts (``init="random", local_tol=None``), both with the paper's prior update and all 100 rounds
(``prior_update="paper", tol=None``, and the paper's 15 local iterations per round, ``n_local_iter=15``: the
defaults when this was measured).  Printed: test MAE of each beside that of predicting each feature's
training mean on the same split, and the paired difference (defaults minus paper) with its mean and a
95 % t interval over the seeds.

First, the round-1 local fit of each site of seed 0 (30 EM iterations, what a site releases
after round 1): its log-likelihood and the Frobenius norm of each view's W from either start.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy import stats

from fedhier import FedMVPPCA
from fedhier.baselines.mean import TrainingMean
from fedhier.demo import demo_data
from fedhier.metrics import reconstruction_mae
from fedhier.models.mvppca import fit_local, marginal_loglik
from fedhier.models.mvppca.dp import DPConfig

SEEDS = range(5)
N_ROUNDS = 100


def privacy(setting: str, sites):
    if setting == "site-level total budget":
        return DPConfig.total(1.0, 1e-5, n_rounds=N_ROUNDS, n_views=max(len(s) for s in sites))
    if setting == "per release (demo --paper-dp)":
        return DPConfig.per_release(10.0, 0.01)
    return None


def round_one() -> None:
    prepared = demo_data(n_sites=3, scenario="GK", seed=0)
    print("round-1 local fit, seed 0 (30 EM iterations): log-likelihood and ||W||_F per view")
    for site, views in enumerate(prepared.sites):
        for init in ("pca", "random"):
            fit = fit_local(views, 5, n_iter=30, rng=0, init=init)
            loglik = marginal_loglik(fit.params, views).sum()
            norms = ", ".join(f"{v} {np.linalg.norm(p.W):.2f}" for v, p in fit.params.items())
            print(f"  site {site}, {init:>6} start: log-likelihood {loglik:9.1f}; ||W||_F {norms}")


def main() -> None:
    warnings.filterwarnings("ignore")  # DP warnings about the budget are part of the setting
    round_one()
    for setting in ("no DP", "site-level total budget", "per release (demo --paper-dp)"):
        rows = []
        for seed in SEEDS:
            prepared = demo_data(n_sites=3, scenario="GK", seed=seed)
            maes = []
            for options in ({}, {"init": "random", "local_tol": None}):
                model = FedMVPPCA(
                    n_components=5, n_rounds=N_ROUNDS, n_local_iter=15, random_state=seed, prior_update="paper", tol=None,
                    privacy=privacy(setting, prepared.sites), **options,
                ).fit(prepared.sites)
                maes.append(reconstruction_mae(prepared.test_masked, model.reconstruct(prepared.test_masked)))
            mean_model = TrainingMean().fit(prepared.sites)
            maes.append(reconstruction_mae(prepared.test_masked, mean_model.reconstruct(prepared.test_masked)))
            rows.append(maes)
        r = np.array(rows)
        diff = r[:, 0] - r[:, 1]
        half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / np.sqrt(len(diff))
        print(f"{setting}: test MAE over seeds {list(SEEDS)}")
        print("  seed   PCA start   paper start   training mean")
        for seed, (a, b, m) in zip(SEEDS, r):
            print(f"  {seed:4d}   {a:9.4f}   {b:11.4f}   {m:13.4f}")
        print(f"  mean   {r[:, 0].mean():9.4f}   {r[:, 1].mean():11.4f}   {r[:, 2].mean():13.4f}   "
              f"paired difference {diff.mean():+.4f} (95 % interval {diff.mean() - half:+.4f} to {diff.mean() + half:+.4f})")


if __name__ == "__main__":
    main()
