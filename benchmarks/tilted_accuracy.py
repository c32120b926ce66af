"""Accuracy of FedHM2's importance-sampled tilted moments on the radon fit's own tilted problems.

Run:  OPENBLAS_NUM_THREADS=1 python benchmarks/tilted_accuracy.py   (a few minutes; --replicates N)

The tilted problems are captured from the fit of ``benchmarks/bench_fedlin.py`` (random
intercept per county, shared noise, p = 5): the cavities of four counties (the smallest, two
middle-sized and the largest) in EP rounds 1, 2, 3, 5 and 8, 20 problems.  The reference
moments of each come from a tensor Gauss-Hermite rule of 14 nodes per dimension (14^5 =
537,824 nodes) centred at the Laplace approximation; its distance to the 12-node rule is
printed as a check that the reference is converged well below the errors compared.

Every estimator is run ``--replicates`` times per problem with independent generators.  For
each problem the errors are the root mean square over replicates and components of
``(mean - reference mean) / reference sd`` and of ``variance / reference variance - 1``, and
of the whitened covariance error ``||L^-1 (C - C_ref) L^-T||_F / p`` (L the reference's
Cholesky factor; off-diagonal terms included); the table prints their median and largest
value over the 20 problems, and the time of one call.  The last column is the share of the
85 round-1 site steps (10 runs each) that fail -- effective sample size below 100, the
default threshold, or no valid covariance -- so that the site sits the round out: round 1's tilted laws, under the vague prior
as cavity, are far from Gaussian (so the Gauss-Hermite reference does not converge there and
these problems are left out of the error columns).  Last, whole EP fits with each sampler over
``--fits`` seeds: the mean of EP's estimate of phi, its scatter over the seeds in posterior sd,
and the difference of the two samplers' means.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import fedhier.models.fedlin.ep as ep
import fedhier.protocol.fedlin as protocol_module
from fedhier.estimators.fedlin import FedHM2Regressor
from fedhier.models.fedlin.datasets import load_radon
from fedhier.models.fedlin.natural import to_moments
import fedhier.models.fedlin.tilted as tilted_module
from fedhier.models.fedlin.tilted import TiltedFailure, tilted_moments

ROUNDS = (2, 3, 4, 6, 9)


def capture(sites) -> list[dict]:
    """The (model, stats, cavity, start of the Laplace search) of every site step of the benchmark's fit,
    with its round and site."""
    seen: list[dict] = []
    current: dict = {}
    original_step, original_tilted = protocol_module.EPProtocol.site_step, ep.tilted_moments

    def site_step(self, ctx, broadcast):
        current.update(round=ctx.round, site=ctx.site)
        return original_step(self, ctx, broadcast)

    def tilted(model, stats, cavity_r, cavity_Q, rng, **options):
        seen.append(dict(current, model=model, stats=stats, r=cavity_r.copy(), Q=cavity_Q.copy(), start=options.get("start")))
        return original_tilted(model, stats, cavity_r, cavity_Q, rng, **options)

    protocol_module.EPProtocol.site_step, ep.tilted_moments = site_step, tilted
    try:
        fit_radon(sites, FedHM2Regressor, 1024, seed=0)
    finally:
        protocol_module.EPProtocol.site_step, ep.tilted_moments = original_step, original_tilted
    return seen


def errors(mean, cov, ref_mean, ref_cov) -> tuple[float, float, float]:
    """Squared errors (mean in sd, relative variance, whitened covariance) summed over components."""
    sd = np.sqrt(np.diag(ref_cov))
    L = np.linalg.cholesky(ref_cov)
    W = np.linalg.solve(L, np.linalg.solve(L, cov - ref_cov).T)
    return (float((((mean - ref_mean) / sd) ** 2).sum()), float(((np.diag(cov) / np.diag(ref_cov) - 1.0) ** 2).sum()),
            float((W**2).sum()))


class IndependentDraws(FedHM2Regressor):
    """FedHM2 whose importance sampler draws independent normal offsets (``sampler="random"``)."""

    def _tilted_options(self):
        return {**super()._tilted_options(), "sampler": "random"}


def fit_radon(sites, cls, n_draws: int, seed: int):
    """The benchmark's FedHM2 fit of the radon data with ``n_draws`` importance draws."""
    return cls(fit_intercept=False, random=[True, False, False], noise="shared", mu_scale=10.0, damping=0.7, n_rounds=20,
               n_posterior_draws=1000, random_state=seed, n_draws=n_draws).fit(sites)


def sits_out(prob: dict, rng, n_draws: int, sampler: str) -> bool:
    """True when the site's importance estimate fails (ESS below the default 100, or no valid covariance)."""
    try:
        tilted_moments(prob["model"], prob["stats"], prob["r"], prob["Q"], rng, method="importance", n_draws=n_draws,
                       sampler=sampler, start=prob["start"])
    except TiltedFailure:
        return True
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicates", type=int, default=40, help="independent runs of each estimator per problem (default 40)")
    parser.add_argument("--fits", type=int, default=8, help="EP fits per sampler, one seed each (default 8)")
    parser.add_argument("--final-decrement", type=float, default=None,
                        help="Newton decrement at which the Laplace search takes its last step, first and resumed "
                             "searches alike (default: the library's, 1e-2 and 0.5)")
    args = parser.parse_args()
    if args.final_decrement is not None:
        tilted_module._FINAL_DECREMENT = tilted_module._RESUMED_DECREMENT = args.final_decrement
    sites, _, _ = load_radon()
    steps = capture(sites)
    sizes = np.array([len(y) for _, y in sites])
    order = np.argsort(sizes, kind="stable")
    chosen = [int(order[i]) for i in (0, len(order) // 3, 2 * len(order) // 3, len(order) - 1)]
    problems = [s for s in steps if s["round"] in ROUNDS and s["site"] in chosen]
    print(f"{len(problems)} tilted problems: counties of {sorted(int(sizes[k]) for k in chosen)} homes, EP rounds {ROUNDS}")
    refs, gaps = [], []
    for prob in problems:
        args_ = (prob["model"], prob["stats"], prob["r"], prob["Q"], np.random.default_rng(0))
        ref = tilted_moments(*args_, method="quadrature", n_nodes=14)
        coarse = tilted_moments(*args_, method="quadrature", n_nodes=12)
        refs.append((ref.mean, ref.cov))
        gaps.append(errors(coarse.mean, coarse.cov, ref.mean, ref.cov))
    p = problems[0]["model"].p
    gaps = np.sqrt(np.array(gaps) / np.array([p, p, p * p])).max(axis=0)
    print(f"reference check, 12 vs 14 Gauss-Hermite nodes per dimension (largest over the problems): mean {gaps[0]:.1e} sd, "
          f"variance {gaps[1]:.1e}, whitened covariance {gaps[2]:.1e}")
    configs = [("random", 2000), ("random", 1000), ("random", 512), ("qmc", 2048), ("qmc", 1024), ("qmc", 512), ("qmc", 256)]
    first = [s for s in steps if s["round"] == 1]
    print(f"{'sampler':<8} {'draws':>6}  {'mean err (sd)':>22}  {'variance err (rel.)':>22}  {'whitened cov err':>22}  {'ms/call':>7}"
          f"  {'round 1':>9}")
    print(f"{'':<8} {'':>6}  {'median':>10} {'max':>11}  {'median':>10} {'max':>11}  {'median':>10} {'max':>11}  {'':>7}"
          f"  {'sits out':>9}")
    for sampler, n_draws in configs:
        per_problem, elapsed = [], 0.0
        for j, (prob, (ref_mean, ref_cov)) in enumerate(zip(problems, refs)):
            total = np.zeros(3)
            for rep in range(args.replicates):
                rng = np.random.default_rng([rep, j, 7])
                t0 = time.perf_counter()
                res = tilted_moments(prob["model"], prob["stats"], prob["r"], prob["Q"], rng, method="importance",
                                     n_draws=n_draws, sampler=sampler, min_ess=0.0, start=prob["start"])
                elapsed += time.perf_counter() - t0
                total += errors(res.mean, res.cov, ref_mean, ref_cov)
            per_problem.append(np.sqrt(total / (args.replicates * np.array([p, p, p * p]))))
        e = np.array(per_problem)
        cells = "  ".join(f"{np.median(e[:, i]):10.1e} {e[:, i].max():11.1e}" for i in range(3))
        low = [sits_out(prob, np.random.default_rng([rep, j, 11]), n_draws, sampler) for j, prob in enumerate(first) for rep in range(10)]
        print(f"{sampler:<8} {n_draws:>6}  {cells}  {1e3 * elapsed / (len(problems) * args.replicates):7.2f}  {np.mean(low):9.1%}")
    print(f"EP's estimate of phi (posterior mean) over {args.fits} fits with seeds 0..{args.fits - 1}:")
    fits = {}
    for label, cls, n_draws in (("random 2000", IndependentDraws, 2000), ("qmc 1024", FedHM2Regressor, 1024)):
        models = [fit_radon(sites, cls, n_draws, seed) for seed in range(args.fits)]
        fits[label] = np.array([m.phi_mean_ for m in models])
        sd = np.mean([np.sqrt(np.diag(m.phi_cov_)) for m in models], axis=0)
        rounds = sorted({m.n_rounds_ for m in models})
        print(f"  {label:<12} mean {np.array2string(fits[label].mean(0), precision=4)}   scatter over seeds / posterior sd "
              f"{np.array2string(fits[label].std(0, ddof=1) / sd, precision=4)}   EP rounds {rounds}")
    gap = (fits["qmc 1024"].mean(0) - fits["random 2000"].mean(0)) / sd
    print(f"  difference of the two means / posterior sd {np.array2string(gap, precision=4)}")


if __name__ == "__main__":
    main()
