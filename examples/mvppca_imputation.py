"""Imputing a hidden view on the demo's data: Fed-mv-PPCA against centralised fits and the mean.

Run:  python examples/mvppca_imputation.py   (about 2 minutes)

The data of ``fedhier demo``, for seeds 0-9 (the seed sets the test split, the partition, the test
masking and the fit): the bundled Alzheimer data, a stratified test third in which a random third
of the subjects lacks ``csf`` and another third ``demographics``, training rows over 3 sites,
min-max scaled with the demo's ranges.  For each hidden view, the MAE of imputing it from the
subject's other views (``FedMVPPCA.impute``, spec §9) on the test subjects that lack it, mean ± sd
over the seeds, for:

* Fed-mv-PPCA on the demo's sites (G/K: site 1 has all views, site 2 lacks csf, site 3
  demographics) and on the same training rows split over 3 sites with every view (IID), each with
  the default EM update of the prior's variances and with the paper's (``prior_update="paper"``);
* the centralised fit (C = 1, one round of 800 EM iterations) on the pooled training rows;
* an independent anchor: scikit-learn ``PCA(n_components=5)`` on the pooled training rows, imputing
  by the Gaussian conditional mean under its covariance W Wᵀ + σ² I (``get_covariance``);
* the mean of the view over the demo's training rows that have it (what the demo compares with).

Last, the global standard deviation of the loadings (sd of W~) after rounds 1, 5, 10 and 20 of the
demo's fit (seed 0) with either update: the paper's collapses, after which the loadings stop
changing (docs/mvppca.md, "Between-site variances").
"""

from __future__ import annotations

import numpy as np
from sklearn.decomposition import PCA

from fedhier import FedMVPPCA
from fedhier.data import partition
from fedhier.demo import demo_data
from fedhier.metrics import imputation_mae, observed_rows

VIEWS = ("csf", "demographics")


def pca_impute(pooled: dict[str, np.ndarray], given: dict[str, np.ndarray], view: str, q: int) -> np.ndarray:
    """Conditional mean of ``view`` given the ``given`` views under pooled PCA's Gaussian model."""
    names = list(pooled)
    edges = np.cumsum([0] + [pooled[v].shape[1] for v in names])
    cols = {v: np.arange(edges[i], edges[i + 1]) for i, v in enumerate(names)}
    pca = PCA(n_components=q).fit(np.hstack([pooled[v] for v in names]))
    S, mu = pca.get_covariance(), pca.mean_
    target, known = cols[view], np.concatenate([cols[v] for v in given])
    x = np.hstack([given[v] for v in given]) - mu[known]
    return mu[target] + x @ np.linalg.solve(S[np.ix_(known, known)], S[np.ix_(known, target)])


def imputation_errors(seed: int, q: int = 5) -> tuple[dict[str, list[float]], dict[str, FedMVPPCA]]:
    """{method: [MAE imputing csf, MAE imputing demographics]} for one seed, and the demo's fits."""
    demo = demo_data(seed=seed)
    train = demo.scaling.transform(demo.train_views)  # pooled training rows, the demo's scaling
    iid = partition(train, demo.y_train, 3, "iid", random_state=seed).sites
    fits = {}
    for update in ("em", "paper"):
        fits[f"Fed-mv-PPCA, G/K (the demo), prior_update={update!r}"] = FedMVPPCA(q, random_state=seed, prior_update=update).fit(demo.sites)
        fits[f"Fed-mv-PPCA, IID, prior_update={update!r}"] = FedMVPPCA(q, random_state=seed, prior_update=update).fit(iid)
    fits["Fed-mv-PPCA, centralised"] = FedMVPPCA(q, n_rounds=1, n_first_iter=800, sigma2_prior=None, random_state=seed).fit([train])
    errors: dict[str, list[float]] = {name: [] for name in [*fits, "PCA (pooled data), conditional mean", "mean of the view"]}
    for view in VIEWS:
        hidden = observed_rows(demo.test_full[view]) & ~observed_rows(demo.test_masked[view])
        given = {v: demo.test_masked[v][hidden] for v in train if v != view}
        truth = demo.test_full[view][hidden]
        every = np.ones(len(truth), dtype=bool)
        for name, model in fits.items():
            errors[name].append(imputation_mae(truth, model.impute(given)[view], every))
        errors["PCA (pooled data), conditional mean"].append(imputation_mae(truth, pca_impute(train, given, view, q), every))
        observed = np.vstack([s[view][observed_rows(s[view])] for s in demo.sites if view in s])
        errors["mean of the view"].append(imputation_mae(truth, np.broadcast_to(observed.mean(0), truth.shape), every))
    return errors, {u: fits[f"Fed-mv-PPCA, G/K (the demo), prior_update={u!r}"] for u in ("em", "paper")}


def main(seeds: range = range(10)) -> None:
    runs = [imputation_errors(seed) for seed in seeds]
    print(f"MAE of imputing a hidden view, mean ± sd over seeds {seeds.start}-{seeds.stop - 1}\n")
    print("| method | " + " | ".join(f"MAE imputing {v}" for v in VIEWS) + " |")
    print("|---|---|---|")
    for name in runs[0][0]:
        values = np.array([errors[name] for errors, _ in runs])  # (seeds, views)
        print(f"| {name} | " + " | ".join(f"{m:.4f} ± {s:.4f}" for m, s in zip(values.mean(0), values.std(0, ddof=1))) + " |")
    print()
    for update, model in runs[0][1].items():
        history = model.history_
        print(f"seed {seeds.start}, demo's fit, prior_update={update!r}: {model.n_rounds_} rounds")
        for r in sorted({min(r, len(history)) for r in (1, 5, 10, 20, len(history))}):
            sds = {k.split("/")[0]: v for k, v in history[r - 1]["metrics"].items() if k.endswith("/sd_W")}
            print(f"  after round {r}: sd of W~ " + ", ".join(f"{v} {sd:.1e}" for v, sd in sds.items()))


if __name__ == "__main__":
    main()
