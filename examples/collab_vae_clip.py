"""Why ``CollabVAE`` clips its gradients by default (docs/collabdict.md, "Gradient clip (ours)").

Run:  python examples/collab_vae_clip.py   (about 30 seconds on one core)

Fits the multi-task VAE (spec §8) from ten random starts, with the paper's plain gradient
ascent (``max_grad_norm=None``) and with the default clip (``max_grad_norm=10``), at two
learning rates, on two data sets:

* ``near-plane``: the tests' data (tests/models/collabdict/test_collab_vae.py), 5 sites of
  40-60 samples of 4 features lying near a random plane;
* ``ctg``: the bundled cardiotocography table (2,126 samples x 21 features), split at random
  over 5 sites.

Per setting it prints how many starts diverge (non-finite ELBO, reported as a
``FloatingPointError``) and the median ELBO per sample of the last round over the others,
next to ``-M/2 (ln 2 pi + 1)``: the log-likelihood per sample of the standardised data under
an independent standard normal, which a VAE whose decoder ignores ``z`` can reach.
The in-process star runtime is used; the serverless one gives the same numbers up to the
consensus tolerance (tested).
"""

from __future__ import annotations

import numpy as np

from fedhier.estimators.collab import CollabVAE
from fedhier.models.collabdict.datasets import load_ctg, split_sites
from fedhier.runtime import RoundFailed


def near_plane_sites(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    basis = rng.normal(size=(2, 4))
    return [rng.normal(size=(40 + 5 * s, 2)) @ basis + 0.1 * rng.normal(size=(40 + 5 * s, 4)) for s in range(5)]


def ctg_sites() -> list[np.ndarray]:
    X, y, names = load_ctg()
    return [site.X for site in split_sites(X, y, 5, seed=0, names=names)]


def main() -> None:
    data = {"near-plane": (near_plane_sites(), 2, 8, 40), "ctg": (ctg_sites(), 3, 32, 100)}
    print("data        learning_rate  max_grad_norm  diverged  median final ELBO per sample")
    for name, (sites, n_latent, width, rounds) in data.items():
        n_features = sites[0].shape[1]
        independent = -n_features / 2 * (np.log(2 * np.pi) + 1)
        print(f"{name}: {n_features} features, independent standard normal {independent:.2f}")
        for learning_rate in (0.05, 0.01):
            for max_grad_norm in (None, 10.0):
                final, diverged = [], 0
                for seed in range(10):
                    model = CollabVAE(n_latent, width=width, learning_rate=learning_rate, max_grad_norm=max_grad_norm,
                                      max_iter=rounds, runtime="star", random_state=seed)
                    try:
                        model.fit(sites)
                    except RoundFailed:
                        diverged += 1
                        continue
                    final.append(model.history_[-1]["metrics"]["elbo_per_sample"])
                median = f"{np.median(final):.2f}" if final else "-"
                print(f"{name:11s} {learning_rate:13.2f}  {str(max_grad_norm):13s}  {diverged:4d}/10   {median}")


if __name__ == "__main__":
    main()
