"""FedHM2 on the Minnesota radon data against statsmodels MixedLM on the pooled data.

Run:  OPENBLAS_NUM_THREADS=1 python benchmarks/bench_fedlin.py   (about a minute; --repeat N)

Model and settings of ``fedhier experiment fedlin-radon``: ``log.radon`` on intercept, basement
and county uranium, a random intercept per county (85 sites), shared noise,
``mu_scale=10, damping=0.7, n_posterior_draws=1000`` and importance-sampled tilted moments (the
default 1,024 randomised quasi-Monte Carlo draws per county and round);
EP stops by its default rule (``tol=0.05``, at most 20 rounds).  The anchor is the project's
``mixedlm_pooled`` (REML, Powell then L-BFGS) on the pooled homes.  The two fits alternate
(A, B, B, A, ...); the ratio of their wall times is printed as min and median over the
repetitions, with the fixed effects and their distance in MixedLM standard errors.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np

from fedhier.estimators.fedlin import FedHM2Regressor
from fedhier.models.fedlin.baselines import mixedlm_pooled
from fedhier.models.fedlin.datasets import load_radon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="interleaved repetitions (default 5)")
    args = parser.parse_args()
    sites, _, features = load_radon()
    import statsmodels.api  # noqa: F401  -- its one-off import is not part of a fit's time

    fits: dict[str, object] = {}

    def hm2():
        fits["hm2"] = FedHM2Regressor(
            fit_intercept=False, random=[True, False, False], noise="shared", mu_scale=10.0, damping=0.7, n_rounds=20,
            n_posterior_draws=1000, random_state=0,
        ).fit(sites)

    def mixed():
        fits["mixed"] = mixedlm_pooled(sites, random=[0])

    def mixed_default():
        """MixedLM with statsmodels' own default optimiser chain (same model, REML)."""
        X = np.vstack([X for X, _ in sites])
        y = np.concatenate([y for _, y in sites])
        groups = np.concatenate([np.full(len(y_k), k) for k, (_, y_k) in enumerate(sites)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its convergence warnings; the outcome is printed below
            fits["default"] = statsmodels.api.MixedLM(y, X, groups=groups, exog_re=X[:, [0]]).fit(reml=True)

    fns = {"hm2": hm2, "mixed": mixed, "default": mixed_default}
    times: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(args.repeat):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t0, c0 = time.perf_counter(), time.process_time()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    model, anchor = fits["hm2"], fits["mixed"]
    converged = "converged" if fits["default"].converged else "reports that it did NOT converge (hence Powell + L-BFGS)"
    print(f"radon: {len(sites)} counties, {sum(len(y) for _, y in sites)} homes; HM2 stopped after {model.n_rounds_} EP rounds")
    for name, label in (("mixed", "MixedLM, Powell + L-BFGS (target <= 3)"), ("default", "MixedLM, statsmodels' default optimiser")):
        ratios = [a / b for a, b in zip(times["hm2"], times[name])]
        print(f"  wall time FedHM2 / {label:<42} min {min(ratios):5.2f}   median {statistics.median(ratios):5.2f}"
              f"   ({min(times['hm2']):.2f} s vs {min(times[name]):.2f} s, min; {args.repeat} interleaved repetitions)")
    print(f"  (statsmodels' default optimiser chain {converged})")
    ratios = [a / b for a, b in zip(cpu["hm2"], cpu["mixed"])]
    print(f"  CPU time FedHM2 / MixedLM, Powell + L-BFGS   min {min(ratios):5.2f}   median {statistics.median(ratios):5.2f}"
          f"   ({min(cpu['hm2']):.2f} s vs {min(cpu['mixed']):.2f} s, min)")
    sd = np.sqrt(np.diag(model.phi_cov_))
    print(f"  {'effect':<10} {'HM2 mean':>9} {'HM2 sd':>7} {'MixedLM':>9} {'se':>7} {'|diff| / se':>11}")
    worst = 0.0
    for j, name in enumerate(features):
        gap = abs(model.phi_mean_[j] - anchor.fe[j]) / anchor.se[j]
        worst = max(worst, gap)
        print(f"  {name:<10} {model.phi_mean_[j]:9.4f} {sd[j]:7.4f} {anchor.fe[j]:9.4f} {anchor.se[j]:7.4f} {gap:11.2f}")
    print(f"  largest |HM2 - MixedLM| / se: {worst:.2f} (target <= 1)")


if __name__ == "__main__":
    main()
