"""FedHM2 against statsmodels MixedLM on the pooled data: Minnesota radon and a 100-group synthetic set.

Run:  OPENBLAS_NUM_THREADS=1 python benchmarks/bench_fedlin.py   (about half a minute; --repeat N)

Both data sets have an intercept and two covariates with a random intercept per group, and the
settings of ``fedhier experiment fedlin-radon``: shared noise, ``mu_scale=10, damping=0.7,
n_posterior_draws=1000``, importance-sampled tilted moments (the default 1,024 randomised
quasi-Monte Carlo draws per site and round, a quarter of them in round 1 and when their weights are
nearly equal); a round whose whole step moves q(phi) by at most one posterior sd is not damped; EP
stops by its default rule (``tol=0.05``, at most 20 rounds).

* radon: ``log.radon`` on intercept, basement and county uranium, 85 counties, 919 homes.
* synthetic: K = 100 groups x 50 rows, covariates N(0, 1), coefficients (1, 0.5, -0.3), random
  intercept sd 0.5, noise sd 0.7 (drawn once, seed 1).

The anchors are statsmodels MixedLM (REML) with its default optimiser chain and with the project's
``mixedlm_pooled`` (Powell then L-BFGS; the default does not converge on radon).  The three fits
alternate (A, B, C, C, B, A, ...); the ratios of HM2's CPU time (``process_time``) and wall time to
each anchor's are taken per repetition and printed as median and min.  The fixed effects are
compared, in MixedLM standard errors, with the default's fit where it converged and with Powell +
L-BFGS's otherwise.
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


def synthetic_sites(n_groups: int = 100, n_rows: int = 50, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """Sites ``(X_k (n_rows, 3), y_k (n_rows,))`` of :math:`y=X\\beta+b_k+e`, :math:`\\beta=(1,0.5,-0.3)`,
    :math:`b_k\\sim\\mathcal N(0,0.5^2)`, :math:`e\\sim\\mathcal N(0,0.7^2)`; column 0 of X is the intercept."""
    rng = np.random.default_rng(seed)
    sites = []
    for b_k in 0.5 * rng.standard_normal(n_groups):
        X = np.column_stack([np.ones(n_rows), rng.standard_normal((n_rows, 2))])
        sites.append((X, X @ [1.0, 0.5, -0.3] + b_k + 0.7 * rng.standard_normal(n_rows)))
    return sites


def run(name: str, sites, repeat: int) -> None:
    import statsmodels.api as sm

    X = np.vstack([X for X, _ in sites])
    y = np.concatenate([y for _, y in sites])
    groups = np.concatenate([np.full(len(y_k), k) for k, (_, y_k) in enumerate(sites)])
    fits: dict[str, object] = {}

    def hm2():
        fits["hm2"] = FedHM2Regressor(
            fit_intercept=False, random=[True, False, False], noise="shared", mu_scale=10.0, damping=0.7, n_rounds=20,
            n_posterior_draws=1000, random_state=0,
        ).fit(sites)

    def powell():
        fits["powell"] = mixedlm_pooled(sites, random=[0])

    def default():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its convergence warnings; the outcome is printed below
            fits["default"] = sm.MixedLM(y, X, groups=groups, exog_re=X[:, [0]]).fit(reml=True)

    fns = {"hm2": hm2, "default": default, "powell": powell}
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeat):
        for key in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t0, c0 = time.perf_counter(), time.process_time()
            fns[key]()
            wall[key].append(time.perf_counter() - t0)
            cpu[key].append(time.process_time() - c0)
    model, dflt, anchor = fits["hm2"], fits["default"], fits["powell"]
    print(f"{name}: {len(sites)} groups, {len(y)} rows; HM2 stopped after {model.n_rounds_} EP rounds; "
          f"statsmodels' default optimiser {'converged' if dflt.converged else 'did NOT converge'}")
    for key, label in (("default", "MixedLM, statsmodels' default"), ("powell", "MixedLM, Powell + L-BFGS")):
        for what, t in (("CPU", cpu), ("wall", wall)):
            ratios = [a / b for a, b in zip(t["hm2"], t[key])]
            print(f"  {what:<4} FedHM2 / {label:<31} median {statistics.median(ratios):5.2f}   min {min(ratios):5.2f}"
                  f"   (medians {statistics.median(t['hm2']):.3f} s vs {statistics.median(t[key]):.3f} s)")
    hm2_fe = model.population_coef_  # in the data's units; the intercept is column 0 of the design
    ref_fe, ref_se, ref = ((np.asarray(dflt.fe_params), np.asarray(dflt.bse_fe)[:3], "default") if dflt.converged
                           else (anchor.fe, anchor.se, "Powell + L-BFGS"))
    gaps = np.abs(hm2_fe - ref_fe) / ref_se
    print(f"  fixed effects: HM2 {np.round(hm2_fe, 4)}, MixedLM ({ref}) {np.round(ref_fe, 4)}, se {np.round(ref_se, 4)}")
    print(f"  largest |HM2 - MixedLM| / se: {gaps.max():.3f} (target <= 0.2)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="alternating repetitions (default 5)")
    args = parser.parse_args()
    import statsmodels.api  # noqa: F401  -- its one-off import is not part of a fit's time

    run("radon", load_radon()[0], args.repeat)
    run("synthetic", synthetic_sites(), args.repeat)


if __name__ == "__main__":
    main()
