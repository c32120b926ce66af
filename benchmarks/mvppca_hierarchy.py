"""Does Fed-mv-PPCA recover the between-site variability it models?  EM prior update vs the paper's.

Run:  python benchmarks/mvppca_hierarchy.py            (about 30 minutes on one core of a shared machine)
      python benchmarks/mvppca_hierarchy.py --quick    (3 seeds, about 10 minutes)

Data drawn from the hierarchical model itself (``make_federated_ppca``, spec §2-§3): 3 views of
15, 8 and 10 features, true q = 5, 150 subjects per site, sites' means and loadings drawn around
the global ones with sd(mu~) = 0.5 and sd(W~) = 0.2, noise variances from IG(3, 2).  Each fit is
``FedMVPPCA(n_components=q, n_rounds=100)`` with the default stopping rule, for C = 3, 6, 12
sites, q = 5 (right) and q = 7 (over-specified by 2), ``prior_update="em"`` (default) and
``"paper"``.  For every view the fitted sd (square root of sigma2_W~, sigma2_mu~) is taken; the
table prints, over the seeds, the median of the three views' values and the median ratio to the
truth of the view furthest from it ("worst").  The last rows use IID sites (sd 0 for both),
where a small fitted sd is the right answer.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedhier import FedMVPPCA
from fedhier.data.synthetic import make_federated_ppca

SD_MU, SD_W = 0.5, 0.2
DIMS, Q_TRUE, N_PER_SITE = (15, 8, 10), 5, 150


def fitted_sds(n_sites: int, q: int, mode: str, seed: int, sd_mu: float = SD_MU, sd_W: float = SD_W) -> np.ndarray:
    """(2, n_views): fitted sd of mu~ and of W~ per view."""
    data = make_federated_ppca(
        n_sites, N_PER_SITE, DIMS, Q_TRUE, sd_mu=sd_mu, sd_W=sd_W, sigma2_alpha=3.0, sigma2_beta=2.0,
        random_state=seed,
    )
    model = FedMVPPCA(n_components=q, n_rounds=100, random_state=seed, prior_update=mode).fit(data.sites)
    g = model.global_params_
    return np.array([[np.sqrt(g[v]["sigma2_mu"]) for v in g], [np.sqrt(g[v]["sigma2_W"]) for v in g]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds instead of 10")
    args = parser.parse_args()
    seeds = range(3 if args.quick else 10)
    print(f"true sd(mu~) = {SD_MU}, sd(W~) = {SD_W}; {len(seeds)} seeds; median over seeds")
    print(f"{'sites':>5} {'q':>2} {'update':>6} | {'sd(mu~) per view':>20} {'worst/true':>10} | "
          f"{'sd(W~) per view':>20} {'worst/true':>10} | {'s/fit':>5}")
    for n_sites in (3, 6, 12):
        for q in (Q_TRUE, Q_TRUE + 2):
            for mode in ("em", "paper"):
                start = time.perf_counter()
                sds = np.stack([fitted_sds(n_sites, q, mode, seed) for seed in seeds])  # (S, 2, K)
                per_fit = (time.perf_counter() - start) / len(seeds)
                cells = []
                for b, truth in enumerate((SD_MU, SD_W)):
                    ratio = sds[:, b, :] / truth
                    worst = np.take_along_axis(ratio, np.argmax(np.abs(np.log(ratio)), axis=1)[:, None], axis=1)
                    views = " ".join(f"{v:.3f}" for v in np.median(sds[:, b, :], axis=0))
                    cells.append(f"{views:>20} {np.median(worst):>10.2f}")
                print(f"{n_sites:>5} {q:>2} {mode:>6} | {cells[0]} | {cells[1]} | {per_fit:>5.1f}", flush=True)
    for mode in ("em", "paper"):
        sds = np.stack([fitted_sds(6, Q_TRUE, mode, seed, sd_mu=0.0, sd_W=0.0) for seed in seeds])
        print(f"IID sites (true sd 0), 6 sites, q = {Q_TRUE}, {mode}: largest median sd(mu~) "
              f"{np.median(sds[:, 0, :], axis=0).max():.3g}, sd(W~) {np.median(sds[:, 1, :], axis=0).max():.3g}")


if __name__ == "__main__":
    main()
