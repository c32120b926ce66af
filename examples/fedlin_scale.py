"""FedHM2Regressor's Gaussian hierarchy assumes a response on a unit scale, so by default it scales the columns
itself (docs/fedlin.md, "Scale").

Run:  python examples/fedlin_scale.py   (about 10 seconds)

Six sites of 40 rows, three standard normal features; site coefficients
theta_k ~ N(mu, (0.3 s)^2) around mu = s (1, -0.8, 0.5), noise sd 0.5 s.  Every quantity is
multiplied by the scale s, so the problem is the same at every s, up to units.  For each s it
prints the root mean square error of the site coefficients against the truth, divided by s, for
``FedHM2Regressor(fit_intercept=False, mu_scale=1.0, scale="none")`` (priors mu ~ N(0, 1), log tau_j ~ N(-1, 1),
log sigma_k ~ N(0, 1.5^2), on the data as given), for the default ``scale`` (every column divided by its
sd across the sites before the fit, the coefficients reported back in the data's units) and for per-site
least squares, and how many FedLinWarnings the unscaled fit raised (a site whose y has a standard deviation above 90 warns about the scale; low effective
sample sizes of the posterior draws warn too).  A scale-free method gives the same numbers in
every row.  tests/test_fedlin_estimators.py reuses ``make_sites`` for its scale test.
"""

from __future__ import annotations

import warnings

import numpy as np

from fedhier.estimators.fedlin import FedHM2Regressor, FedLinWarning


def make_sites(scale: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    mu = scale * np.array([1.0, -0.8, 0.5])
    sites, thetas = [], []
    for _ in range(6):
        theta = mu + 0.3 * scale * rng.normal(size=3)
        X = rng.normal(size=(40, 3))
        sites.append((X, X @ theta + 0.5 * scale * rng.normal(size=40)))
        thetas.append(theta)
    return sites, np.array(thetas)


def main() -> None:
    print("scale   HM2 unscaled rmse / scale   HM2 scaled rmse / scale   least squares rmse / scale   FedLinWarnings")
    for scale in (0.0001, 0.001, 0.01, 1.0, 10.0, 30.0, 100.0, 1000.0):
        sites, truth = make_sites(scale)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FedLinWarning)
            hm2 = FedHM2Regressor(fit_intercept=False, mu_scale=1.0, scale="none", n_posterior_draws=1000, random_state=0).fit(sites)
        n_warnings = sum(issubclass(w.category, FedLinWarning) for w in caught)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FedLinWarning)
            scaled = FedHM2Regressor(fit_intercept=False, mu_scale=1.0, n_posterior_draws=1000, random_state=0).fit(sites)
        ols = np.array([np.linalg.lstsq(X, y, rcond=None)[0] for X, y in sites])
        rmse = [float(np.sqrt(np.mean((coef - truth) ** 2))) / scale for coef in (hm2.coef_, scaled.coef_, ols)]
        print(f"{scale:7g}   {rmse[0]:25.3f}   {rmse[1]:23.3f}   {rmse[2]:26.3f}   {n_warnings:14d}")


if __name__ == "__main__":
    main()
