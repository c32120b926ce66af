"""Choosing the latent dimension q federatedly: ``FedMVPPCA.score_n_components`` on SD.

Run:  python examples/mvppca_choose_q.py            (10 repetitions, about 20 minutes on one core)
      python examples/mvppca_choose_q.py --reps 3   (about 6 minutes)

SD is the synthetic data set of the experiments (spec §12.1: 400 subjects, views of 15, 8 and 10
features, true q = 5, 250 subjects shifted in latent space).  Repetition r draws SD with seed r,
splits it into 3 IID sites, min-max scales it with the sites' pooled range (as the experiments
do) and scores q = 2..8 by the default criterion: 3-fold federated held-out cross-view
log-likelihood, the smallest q within one standard error or 2 % of the score range of the best.
``--waic`` also prints the q that WAIC picks.  Each line also gives, as independent anchors on the pooled scaled data, the q that 3-fold
cross-validated log-likelihood picks for scikit-learn's ``PCA`` (isotropic noise) and
``FactorAnalysis`` (per-feature noise).
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.decomposition import PCA, FactorAnalysis
from sklearn.model_selection import cross_val_score

from fedhier import FedMVPPCA
from fedhier.data.partition import partition
from fedhier.data.scaling import MinMaxScaling
from fedhier.data.synthetic import make_multiview_ppca

CANDIDATES = range(2, 9)


def sd_sites(seed: int) -> list[dict[str, np.ndarray]]:
    sd = make_multiview_ppca(400, (15, 8, 10), 5, 250, random_state=seed)
    part = partition(sd.views, sd.labels, 3, "iid", random_state=seed)
    scaling = MinMaxScaling.from_sites(part.sites)
    return [scaling.transform(site) for site in part.sites]


def sklearn_choice(sites: list[dict[str, np.ndarray]], estimator) -> int:
    pooled = np.vstack([np.hstack(list(site.values())) for site in sites])
    scores = [np.mean(cross_val_score(estimator(q), pooled, cv=3)) for q in CANDIDATES]
    return CANDIDATES[int(np.argmax(scores))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--waic", action="store_true", help="also choose q by WAIC (300 draws)")
    args = parser.parse_args()
    chosen = []
    for rep in range(args.reps):
        sites = sd_sites(rep)
        result = FedMVPPCA.score_n_components(sites, CANDIDATES, random_state=rep)
        chosen.append(result.best)
        line = f"repetition {rep}: q = {result.best}; held-out cross-view log-likelihood per subject " + " ".join(
            f"{q}:{s:.2f}" for q, s in zip(result.candidates, result.scores)
        )
        line += f"; pooled PCA picks {sklearn_choice(sites, PCA)}, FactorAnalysis {sklearn_choice(sites, FactorAnalysis)}"
        if args.waic:
            waic = FedMVPPCA.score_n_components(sites, CANDIDATES, criterion="waic", n_draws=300, random_state=rep)
            line += f"; WAIC picks q = {waic.best}"
        print(line, flush=True)
    print(f"q = 5 chosen in {chosen.count(5)} of {len(chosen)} repetitions (chosen: {chosen})")


if __name__ == "__main__":
    main()
