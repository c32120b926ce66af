"""FedHM2 on the Minnesota radon data from pooled rows with a county label, without a hand-made column of
ones (``fit_intercept=True``), against statsmodels MixedLM (REML) on the same rows.

Run:  OPENBLAS_NUM_THREADS=1 python examples/fedlin_radon_groups.py   (a few seconds; needs statsmodels)

Model: ``log.radon ~ basement + uranium`` with a random intercept per county (85 sites), shared noise;
``random=[False, False]`` keeps the two slopes common (the intercept varies across sites anyway).
Prints the fixed effects of both, HM2's posterior sd beside MixedLM's standard error, and their distance
in MixedLM standard errors.
"""

from __future__ import annotations

import numpy as np

from fedhier.estimators.fedlin import FedHM2Regressor
from fedhier.models.fedlin.baselines import mixedlm_pooled
from fedhier.models.fedlin.datasets import load_radon


def fit():
    """(HM2 estimator, MixedLM anchor, feature names) on radon; the anchor fits the data's own intercept column."""
    sites, _, features = load_radon()
    X = np.vstack([X_k[:, 1:] for X_k, _ in sites])  # drop the column of ones: fit_intercept adds it
    y = np.concatenate([y_k for _, y_k in sites])
    county = np.concatenate([np.full(len(y_k), k) for k, (_, y_k) in enumerate(sites)])
    hm2 = FedHM2Regressor(random=[False, False], noise="shared", damping=0.7, n_posterior_draws=1000, random_state=0)
    hm2.fit(X, y, groups=county)
    return hm2, mixedlm_pooled(sites, random=[0]), features


def main() -> None:
    hm2, anchor, features = fit()
    # the population coefficients in the data's units, and their posterior sd (half a 68.27 % interval)
    coef_ci, intercept_ci = hm2.population_interval(0.6827)
    mean = np.concatenate([[hm2.population_intercept_], hm2.population_coef_])
    sd = np.concatenate([[np.ptp(intercept_ci)], np.ptp(coef_ci, axis=1)]) / 2
    print(f"HM2 stopped after {hm2.n_rounds_} EP rounds; components {hm2.phi_names_}")
    print(f"{'effect':<10} {'HM2 mean':>9} {'HM2 sd':>7} {'MixedLM':>9} {'se':>7} {'|diff| / se':>11}")
    for j, name in enumerate(features):
        gap = abs(mean[j] - anchor.fe[j]) / anchor.se[j]
        print(f"{name:<10} {mean[j]:9.3f} {sd[j]:7.3f} {anchor.fe[j]:9.3f} {anchor.se[j]:7.3f} {gap:11.2f}")


if __name__ == "__main__":
    main()
