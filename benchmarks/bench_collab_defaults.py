"""CollabDict's defaults against central baselines on ordinary tabular anomaly data, paired over splits.

Data shipped with scikit-learn (nothing downloaded):

* breast cancer: the benign tumours plus 12 % as many malignant ones (the anomalies), over 4 sites;
* wine: the three cultivars with cultivar 3 thinned to 20 % (the anomalies), over 3 sites.

Each split draws the anomalies, assigns every row to a random site and holds out a third of each site's rows.
CollabDict is fitted on the sites' training rows (``groups=``) and scores each held-out row at its site;
IsolationForest and a 2-component Gaussian mixture are fitted centrally on the pooled, standardised training
rows.  The figure of merit is the AUROC of the held-out rows; differences are paired over the splits.

Run:  OPENBLAS_NUM_THREADS=1 python benchmarks/bench_collab_defaults.py [--splits 5] [--settings default,...]
      [--data breast_cancer,wine]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.datasets import load_breast_cancer, load_wine
from sklearn.ensemble import IsolationForest
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import roc_auc_score
from sklearn.mixture import GaussianMixture
from sklearn.preprocessing import StandardScaler

from fedhier.estimators.collab import CollabDict

#: CollabDict settings compared (constructor arguments); "default" is CollabDict() as constructed.
SETTINGS = {
    "default": {},
    "rho=0.1": {"rho": 0.1},
    "rho=0.1+logloss": {"rho": 0.1, "score_rule": "logloss"},
    "K=3+n_min=5": {"n_components": 3, "n_min": 5.0},
}


def dataset(name: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    """(X, is_anomaly, n_sites) with a fresh draw of the anomalies."""
    if name == "breast_cancer":
        X, y = load_breast_cancer(return_X_y=True)
        normal, rare = np.flatnonzero(y == 1), np.flatnonzero(y == 0)  # 1 = benign
        keep = rng.choice(rare, int(round(0.12 * normal.size)), replace=False)
        n_sites = 4
    else:
        X, y = load_wine(return_X_y=True)
        normal, rare = np.flatnonzero(y != 2), np.flatnonzero(y == 2)
        keep = rng.choice(rare, int(round(0.2 * rare.size)), replace=False)
        n_sites = 3
    rows = np.concatenate([normal, keep])
    return X[rows], np.isin(rows, keep), n_sites


def one_split(name: str, seed: int, settings: dict[str, dict]) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    X, anomaly, n_sites = dataset(name, rng)
    site = rng.integers(0, n_sites, X.shape[0])
    test = rng.random(X.shape[0]) < 1 / 3
    train = ~test
    out = {}
    scaler = StandardScaler().fit(X[train])
    Ztr, Zte = scaler.transform(X[train]), scaler.transform(X[test])
    out["IsolationForest"] = roc_auc_score(anomaly[test], -IsolationForest(random_state=seed).fit(Ztr).score_samples(Zte))
    gmm = GaussianMixture(2, covariance_type="full", reg_covar=1e-3, random_state=seed).fit(Ztr)
    out["GMM(2)"] = roc_auc_score(anomaly[test], -gmm.score_samples(Zte))
    for label, params in settings.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = CollabDict(random_state=seed, **params).fit(X[train], groups=site[train])
        out[label] = roc_auc_score(anomaly[test], model.anomaly_score(X[test], groups=site[test]))
        out[label + " patterns"] = float(model.active_.sum())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--data", default="breast_cancer,wine")
    args = parser.parse_args()
    chosen = {k: SETTINGS[k] for k in args.settings.split(",")}
    for name in args.data.split(","):
        t0 = time.perf_counter()
        rows = []
        for seed in range(args.splits):
            rows.append(one_split(name, seed, chosen))
            print(f"  {name} split {seed}: " + ", ".join(f"{k} {v:.3f}" for k, v in rows[-1].items()), flush=True)
        print(f"\n{name}: AUROC of held-out rows over {args.splits} splits ({time.perf_counter() - t0:.0f} s)")
        base = np.array([r["IsolationForest"] for r in rows])
        for method in ["IsolationForest", "GMM(2)", *chosen]:
            auc = np.array([r[method] for r in rows])
            diff = auc - base
            extra = ""
            if method in chosen:
                extra = f"  patterns kept {np.mean([r[method + ' patterns'] for r in rows]):.1f}"
            print(f"  {method:<22} {auc.mean():.3f}  minus IsolationForest {diff.mean():+.3f} "
                  f"(paired sd {diff.std(ddof=1):.3f}, range {diff.min():+.3f}..{diff.max():+.3f}){extra}")


if __name__ == "__main__":
    main()
