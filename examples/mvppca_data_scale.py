"""Fed-mv-PPCA on data far from unit scale, and ``DataScaleWarning``.

Run:  python examples/mvppca_data_scale.py   (about 10 seconds)

Three sites, three views (5, 4 and 3 features) on a 2-d latent space with the same loadings at
every site and noise of 10% of the loadings' size; every entry multiplied by ``scale``.  For
each scale it fits ``FedMVPPCA(n_components=2, n_rounds=20)`` with the default round-1 weak
prior on sigma2 ([RC] IG(2.25, 0.625)) and with ``sigma2_prior=None``, and prints how many
``DataScaleWarning``s the fit raised and the error of imputing view v0 from v1 and v2 at site 0,
relative to imputing v0 by its mean (1 = no better than the mean).  Far below unit scale the
round-1 prior on sigma2 sets the noise; far above it the [RC] cap sigma2_W~ <= ||W~||_F / 5 holds the
sites' loadings tighter, which the last table shows on noisier views (noise 30 %) over seeds 0-5.
tests/test_mvppca_estimator.py reuses ``make_sites`` and ``relative_imputation_error`` and
asserts the behaviour at scale 0.02: above 0.9 with the weak prior and a warning, below 0.3
without the prior or on a unit scale, and no warning then.
"""

from __future__ import annotations

import warnings

import numpy as np

from fedhier import FedMVPPCA
from fedhier.estimators.mvppca import DataScaleWarning


def make_sites(scale: float, seed: int = 0, noise: float = 0.1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    loadings = {f"v{i}": rng.normal(size=(2, d)) for i, d in enumerate((5, 4, 3))}
    sites = []
    for n in (50, 60, 40):
        Z = rng.normal(size=(n, 2))
        sites.append({v: scale * (Z @ W + noise * rng.normal(size=(n, W.shape[1]))) for v, W in loadings.items()})
    return sites


def relative_imputation_error(model: FedMVPPCA, site: dict[str, np.ndarray]) -> float:
    imputed = model.impute({"v1": site["v1"], "v2": site["v2"]})["v0"]
    return float(np.mean(np.abs(imputed - site["v0"])) / np.mean(np.abs(site["v0"] - site["v0"].mean(axis=0))))


def fit(sites: list[dict[str, np.ndarray]], prior: str | None) -> tuple[FedMVPPCA, int]:
    """The example's fit and the number of ``DataScaleWarning``s it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DataScaleWarning)
        model = FedMVPPCA(n_components=2, n_rounds=20, sigma2_prior=prior, random_state=0).fit(sites)
    return model, sum(issubclass(w.category, DataScaleWarning) for w in caught)


def main() -> None:
    print("noise  scale   sigma2_prior  warnings  relative imputation error of v0")
    for scale in (0.02, 0.05, 0.1, 1.0, 100.0, 1000.0):
        sites = make_sites(scale)
        for prior in ("weak", None):
            model, n_warnings = fit(sites, prior)
            print(f"0.1  {scale:7g}   {str(prior):12s}  {n_warnings:8d}  {relative_imputation_error(model, sites[0]):.3f}")
    print("\nnoise 0.3, seeds 0-5 (data and fit), weak prior: relative imputation error of v0 per seed")
    for scale in (1.0, 100.0, 1000.0):  # far above unit scale the cap on sigma2_W~ holds the loadings tighter
        errors = []
        for seed in range(6):
            sites = make_sites(scale, seed=seed, noise=0.3)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DataScaleWarning)
                model = FedMVPPCA(n_components=2, n_rounds=20, random_state=seed).fit(sites)
            errors.append(relative_imputation_error(model, sites[0]))
        print(f"scale {scale:6g}: " + " ".join(f"{e:.3f}" for e in errors) + f"   mean {np.mean(errors):.3f}")


if __name__ == "__main__":
    main()
