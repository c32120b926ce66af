"""Fed-mv-PPCA's dependence on its random start when the sites hold different groups.

Run:  python examples/mvppca_restarts.py   (about 5 minutes on one core)

The SD data of ``fedhier experiment mvppca-sd`` (spec §12.1: 400 subjects, q = 5, 250 of
them shifted in latent space), scenario G with 3 sites: site A holds both groups, site B
only the shifted group, site C only the other (§12.2); the paper's schedule (100 rounds).

1. One cross-validation fold: ``FedMVPPCA(n_init=4)``, and each of its four starts refitted
   alone.  Per start: the final expected log-likelihood (the sum over sites of Q_c, the
   quantity ``n_init`` compares) and the test MAE on the pooled held-out fold.
2. All 30 folds (10 x 3-fold CV): test MAE with one start and with ``n_init=4`` (whose
   first start is that one start), mean +- std over repetitions of fold averages as on the
   experiment's page.
"""

from __future__ import annotations

import numpy as np

from fedhier import FedMVPPCA
from fedhier.experiments.mvppca import load_dataset, make_fold
from fedhier.metrics import reconstruction_mae

SETTINGS = dict(n_components=5, n_rounds=100, n_local_iter=15, n_first_iter=30)
N_REPEATS, N_SPLITS = 10, 3


def g_fold(data, repeat: int, fold: int):
    return make_fold(data, seed=0, n_repeats=N_REPEATS, n_splits=N_SPLITS, repeat=repeat, fold=fold, scenario="G", n_sites=3)


def test_mae(model: FedMVPPCA, fold) -> float:
    return reconstruction_mae(fold.test, model.reconstruct(fold.test))


def main() -> None:
    data = load_dataset("sd", seed=0)
    fold = g_fold(data, 0, 0)
    kept = FedMVPPCA(n_init=4, random_state=1, **SETTINGS).fit(fold.sites)
    print("SD, scenario G, 3 sites, repetition 0, fold 0:")
    for start, seed in enumerate(kept.init_seeds_):
        alone = FedMVPPCA(random_state=seed, **SETTINGS).fit(fold.sites)
        print(f"  start {start} (seed {seed:>10}): final expected log-likelihood {alone.history_[-1]['expected_ll']:9.1f}, "
              f"test MAE {test_mae(alone, fold):.4f}")
    print(f"  n_init=4 keeps the start with seed {kept.seed_}: test MAE {test_mae(kept, fold):.4f}\n")

    mae = {1: np.empty((N_REPEATS, N_SPLITS)), 4: np.empty((N_REPEATS, N_SPLITS))}
    for repeat in range(N_REPEATS):
        for f in range(N_SPLITS):
            fold = g_fold(data, repeat, f)
            for n_init in mae:
                model = FedMVPPCA(n_init=n_init, random_state=100 * repeat + f, **SETTINGS).fit(fold.sites)
                mae[n_init][repeat, f] = test_mae(model, fold)
    print("SD, scenario G, 3 sites, all 30 folds (mean +- std over repetitions of fold averages):")
    for n_init, values in mae.items():
        per_repeat = values.mean(axis=1)
        print(f"  n_init={n_init}: test MAE {per_repeat.mean():.4f} +- {per_repeat.std(ddof=1):.4f} "
              f"(folds {values.min():.4f} to {values.max():.4f})")


if __name__ == "__main__":
    main()
