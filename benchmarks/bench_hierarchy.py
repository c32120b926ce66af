"""Is the between-site spread of Fed-mv-PPCA recovered on designs drawn at random?  EM prior update vs the paper's.

Run:  python benchmarks/bench_hierarchy.py                  (60 designs, about 25 minutes on a shared machine)
      python benchmarks/bench_hierarchy.py --designs 12 --drift 3     (a quick look)
      python benchmarks/bench_hierarchy.py --shared-variance --updates em   (one variance shared by all columns)
      python benchmarks/bench_hierarchy.py --noise-dof --updates em   (the sites' noise variances with degrees of freedom)
      python benchmarks/bench_hierarchy.py --map-em --updates em   (the sites' MAP-EM, their loadings taken as known)
      python benchmarks/bench_hierarchy.py --redraw 59 10   (design 59 with 10 fresh draws of its data)
      python benchmarks/bench_hierarchy.py --trace 28        (design 28 round by round, 100 rounds, tol=None)
      python benchmarks/bench_hierarchy.py --trace 12 --rounds 300   (past 100 rounds)

Each design is drawn (seed = the design's index) from one family, then its data from the hierarchical
model of the spec (``make_federated_ppca``): 3 views of d_k features, d_k log-uniform on 5..500; C sites,
C from {3, 6, 12, 30}; n_c subjects per site, log-uniform on 20..1,000, the same at every site (balanced)
or drawn per site (unbalanced), one or the other with probability 1/2; true q from {2, 3, 4}; global
loadings N(0, 1) (unit scale) and means N(0, 2^2); between-site sd sd(W~) log-uniform on 0.02..0.5 and
sd(mu~) on 0.1..1; site noise variances from IG(3, 2) (mean 1).  A design with more than
``--max-values`` data values (subjects x features over all sites) is drawn again, to keep each fit short.

Every design is fitted with q right and over-specified by 2, with ``prior_update="em"`` (default) and
``"paper"``, ``n_rounds=100`` and the default stopping rule.  For every view the ratio of the fitted sd
(square root of sigma2_W~, sigma2_mu~) to the true one is taken, and to the realised spread of the drawn
site parameters (sum_c ||W_c - mean||^2 / ((C - 1) d_k q), the same for mu).  The tables print the
distribution of the ratios over all (design, view) pairs, per group of designs, and the rounds used;
and apart the pairs whose sd the design's data fix to 10 % (``relative_error``): where the spread is
small against the sites' sampling error no estimator can recover it.

Redraw: ``--redraw I K`` fits design I (q right, EM update) on K fresh draws of its data (seeds 10,000 + k), to tell
an estimator's bias on a design from its spread: the ratios to the realised spread, per view, their median and sd.

Trace: ``--trace I`` fits design I (q right, EM update) for 100 rounds (``--rounds``) without the stopping rule and
prints, after rounds 1-5, 10, 20, 50, 100, 200, ... and the last, the eigenvalues of the latents' pooled second
moment the sites sent (``history_``'s ``latent_moment_min`` / ``_max``), the squared norms of each view's columns of
W~ (largest first), sd(W~) / true and the sites' summed expected complete-data log-likelihood (``expected_ll``).

Drift: for the first ``--drift`` designs with q right and C >= 6, the EM fit is re-run with ``tol=None``
for 100 rounds; printed is the ratio at round 100 over the ratio where the default rule stops.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from fedhier import FedMVPPCA
from fedhier.data.synthetic import make_federated_ppca

SITES = (3, 6, 12, 30)
N_VIEWS = 3
#: the pairs whose sd the data fix to this relative standard error are summarised apart
SE_LIMIT = 0.1


def draw_design(index: int, max_values: float) -> dict:
    """The design with this index (seeded by it), redrawn until it has at most ``max_values`` values."""
    rng = np.random.default_rng(index)
    while True:
        n_sites = int(rng.choice(SITES))
        dims = tuple(int(round(np.exp(rng.uniform(np.log(5), np.log(500))))) for _ in range(N_VIEWS))
        balanced = bool(rng.random() < 0.5)
        draw_n = lambda size: np.round(np.exp(rng.uniform(np.log(20), np.log(1000), size))).astype(int)  # noqa: E731
        n = np.repeat(draw_n(1), n_sites) if balanced else draw_n(n_sites)
        design = dict(
            index=index, n_sites=n_sites, dims=dims, n=n, balanced=balanced, q=int(rng.integers(2, 5)),
            sd_W=float(np.exp(rng.uniform(np.log(0.02), np.log(0.5)))),
            sd_mu=float(np.exp(rng.uniform(np.log(0.1), np.log(1.0)))),
        )
        if n.sum() * sum(dims) <= max_values:
            return design


def realised_sds(data, names) -> np.ndarray:
    """(2, K): the spread of the drawn site means and loadings about their average, per view."""
    out = np.empty((2, len(names)))
    for k, view in enumerate(names):
        for b, field in enumerate(("mu", "W")):
            values = np.stack([getattr(p[view], field) for p in data.site_params])
            out[b, k] = np.sqrt(np.sum((values - values.mean(axis=0)) ** 2) / ((len(values) - 1) * values[0].size))
    return out


def relative_error(data, design) -> np.ndarray:
    """(2, K): the relative standard error of the best estimate of each sd from the design's data.

    For a variance v of D coordinates per site, each seen through sampling noise of variance a_c at
    site c, the REML estimate has variance about 2 (v + a)^2 / ((C - 1) D), a the sites' mean; the sd's
    relative standard error is half the variance's, sqrt(2 / ((C - 1) D)) (v + a) / (2 v).  Sampling
    variances: a_c = sigma2_c / n_c per loading (D = d_k q), (||W_c||_F^2 / d_k + sigma2_c) / n_c per
    mean (D = d_k).
    """
    C, q = design["n_sites"], design["q"]
    out = np.empty((2, len(data.global_params)))
    for k, view in enumerate(data.global_params):
        params = [p[view] for p in data.site_params]
        d = params[0].mu.size
        a_W = np.mean([p.sigma2 / n for p, n in zip(params, design["n"])])
        a_mu = np.mean([(np.sum(p.W**2) / d + p.sigma2) / n for p, n in zip(params, design["n"])])
        for b, (v, a, D) in enumerate(((design["sd_mu"] ** 2, a_mu, d), (design["sd_W"] ** 2, a_W, d * q))):
            out[b, k] = np.sqrt(2.0 / ((C - 1) * D)) * (v + a) / (2.0 * v)
    return out


def draw_data(design: dict, seed: int):
    """The design's data drawn from the hierarchical model with this seed."""
    return make_federated_ppca(
        design["n_sites"], [int(v) for v in design["n"]], design["dims"], design["q"], sd_mu=design["sd_mu"],
        sd_W=design["sd_W"], sigma2_alpha=3.0, sigma2_beta=2.0, global_sd=(2.0, 1.0), random_state=seed,
    )


def redraw(index: int, draws: int, max_values: float, columns: dict) -> None:
    """Design ``index`` fitted on ``draws`` fresh draws of its data: fitted / realised sd(W~) per view."""
    d = draw_design(index, max_values)
    ratios = []
    for k in range(draws):
        data = draw_data(d, 10_000 + k)
        names = list(data.global_params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = fit(data, d["q"], "em", k, **columns)
        ratios.append((fitted_sds(model, names) / realised_sds(data, names))[1])
        print(f"design {index}, draw {k}: sd(W~) / realised {np.round(ratios[-1], 3)}, {model.n_rounds_} rounds", flush=True)
    ratios = np.array(ratios)
    print(f"design {index} over {draws} draws: median {np.round(np.median(ratios, axis=0), 3)}, "
          f"sd {np.round(ratios.std(axis=0, ddof=1), 3)} per view")


def trace(index: int, max_values: float, columns: dict, rounds: int = 100) -> None:
    """Design ``index`` round by round (module docstring)."""
    d = draw_design(index, max_values)
    data = draw_data(d, index)
    names = list(data.global_params)
    loadings = []  # W~ of every view after each round, from the broadcasts
    keep = lambda record, broadcast: loadings.append({v: np.array(broadcast[f"{v}/W"]) for v in names})  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = FedMVPPCA(n_components=d["q"], n_rounds=rounds, random_state=index, tol=None, **columns).fit(
            data.sites, callbacks=[keep])
    true = {v: np.round(np.sort(np.sum(data.global_params[v].W ** 2, axis=0))[::-1], 1) for v in names}
    print(f"design {index}: true squared norms of W~'s columns {true}")
    for r in sorted({r for r in (1, 2, 3, 4, 5, 10, 20, 50) if r < rounds} | set(range(100, rounds, 100)) | {rounds}):
        metrics = model.history_[r - 1]["metrics"]
        norms = {v: np.round(np.sort(np.sum(loadings[r - 1][v] ** 2, axis=0))[::-1], 1) for v in names}
        print(f"round {r:>3}: latent second moment's eigenvalues {metrics['latent_moment_min']:.3f}.."
              f"{metrics['latent_moment_max']:.3f}; ||w~_i||^2 {norms}; sd(W~) / true "
              f"{np.round(fitted_sds(model, names, row=r - 1)[1] / d['sd_W'], 3)}; expected_ll "
              f"{metrics['expected_ll']:.1f}", flush=True)


def fit(data, q: int, mode: str, seed: int, **options) -> FedMVPPCA:
    return FedMVPPCA(n_components=q, n_rounds=100, random_state=seed, prior_update=mode, **options).fit(data.sites)


def fitted_sds(model: FedMVPPCA, names, row: int | None = None) -> np.ndarray:
    """(2, K): fitted sd(mu~), sd(W~) per view, after the last round or after round ``row`` + 1."""
    if row is None:
        g = model.global_params_
        return np.array([[np.sqrt(g[v]["sigma2_mu"]) for v in names], [np.sqrt(g[v]["sigma2_W"]) for v in names]])
    metrics = model.history_[row]["metrics"]
    return np.array([[metrics[f"{v}/sd_mu"] for v in names], [metrics[f"{v}/sd_W"] for v in names]])


def summary(values) -> str:
    v = np.asarray(values, dtype=float).ravel()
    q1, med, q3 = np.quantile(v, [0.25, 0.5, 0.75])
    return f"{med:6.3f} [{q1:5.3f}, {q3:5.3f}] {v.min():6.3f}..{v.max():6.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--designs", type=int, default=60, help="number of designs drawn (default 60)")
    parser.add_argument("--drift", type=int, default=8, help="designs re-run for 100 rounds with tol=None (default 8)")
    parser.add_argument("--max-values", type=float, default=4e5, help="largest data size of a design (default 4e5)")
    parser.add_argument("--shared-variance", action="store_true",
                        help="fit the EM update with one variance shared by all columns of the loadings (column_variances=False)")
    parser.add_argument("--noise-dof", action="store_true",
                        help="the sites' noise variances with the residual's degrees of freedom (noise_dof=True)")
    parser.add_argument("--map-em", action="store_true",
                        help="the sites' paper MAP-EM, their loadings taken as known (loading_uncertainty=False)")
    parser.add_argument("--updates", nargs="+", default=["em", "paper"], choices=["em", "paper"],
                        help="the prior updates fitted (default both)")
    parser.add_argument("--redraw", nargs=2, type=int, metavar=("DESIGN", "DRAWS"),
                        help="only fit design DESIGN on DRAWS fresh draws of its data")
    parser.add_argument("--trace", type=int, metavar="DESIGN", help="only trace design DESIGN round by round")
    parser.add_argument("--rounds", type=int, default=100, help="rounds of the trace (default 100)")
    args = parser.parse_args()
    columns = ({"column_variances": False} if args.shared_variance else {}) | ({"noise_dof": True} if args.noise_dof else {})
    columns |= {"loading_uncertainty": False} if args.map_em else {}
    if args.redraw:
        redraw(*args.redraw, args.max_values, columns)
        return
    if args.trace is not None:
        trace(args.trace, args.max_values, columns, args.rounds)
        return

    rows = []  # (design, q_offset, mode, ratio to truth (2, K), ratio to realised (2, K), rounds)
    start = time.perf_counter()
    for i in range(args.designs):
        d = draw_design(i, args.max_values)
        data = draw_data(d, i)
        names = list(data.global_params)
        truth = np.array([[d["sd_mu"]], [d["sd_W"]]])
        realised = realised_sds(data, names)
        error = relative_error(data, d)
        for offset in (0, 2):
            for mode in args.updates:
                model = fit(data, d["q"] + offset, mode, i, **(columns if mode == "em" else {}))
                sds = fitted_sds(model, names)
                rows.append((d, offset, mode, sds / truth, sds / realised, model.n_rounds_, error))
        em = rows[-2 * len(args.updates)]
        print(f"design {i:>3}: C = {d['n_sites']:>2}, d = {d['dims']}, n = {d['n'].min()}..{d['n'].max()}"
              f"{' (balanced)' if d['balanced'] else ''}, q = {d['q']}, sd(W~) = {d['sd_W']:.3f}, "
              f"sd(mu~) = {d['sd_mu']:.3f} | {em[2]}, q right: sd(W~) / true {np.round(em[3][1], 2)}, "
              f"sd(mu~) / true {np.round(em[3][0], 2)}, {em[5]} rounds  [{time.perf_counter() - start:.0f} s]",
              flush=True)

    groups = (
        ("q right, C >= 6", lambda d, o: o == 0 and d["n_sites"] >= 6),
        ("q right, C = 3", lambda d, o: o == 0 and d["n_sites"] == 3),
        ("q + 2, C >= 6", lambda d, o: o == 2 and d["n_sites"] >= 6),
        ("q + 2, C = 3", lambda d, o: o == 2 and d["n_sites"] == 3),
    )
    print("\nfitted / true and fitted / realised sd, over (design, view): median [quartiles] min..max;")
    print(f"'se <= {SE_LIMIT}': only the (design, view) pairs whose data fix the sd to {SE_LIMIT:.0%} (relative_error)")
    for b, what in ((1, "sd(W~)"), (0, "sd(mu~)")):
        print(f"\n{what}")
        print(f"{'designs':<16} {'update':>6} {'n':>3} | {'fitted / true':^34} | {'fitted / realised':^34} | rounds (median, max)"
              f" | pairs outside 0.75..1.33 of the truth")
        for label, keep in groups:
            for mode in args.updates:
                sel = [r for r in rows if keep(r[0], r[1]) and r[2] == mode]
                if not sel:
                    continue
                true_ratio = np.concatenate([r[3][b] for r in sel])
                real_ratio = np.concatenate([r[4][b] for r in sel])
                rounds = [r[5] for r in sel]
                outside = int(np.sum((true_ratio < 0.75) | (true_ratio > 1.33)))
                print(f"{label:<16} {mode:>6} {len(sel):>3} | {summary(true_ratio)} | {summary(real_ratio)} | "
                      f"{np.median(rounds):.0f}, {max(rounds)} | {outside} of {true_ratio.size}")
                fixed = np.concatenate([r[6][b] for r in sel]) <= SE_LIMIT
                if mode == "em" and 0 < fixed.sum() < fixed.size:
                    print(f"{'  se <= ' + str(SE_LIMIT):<16} {mode:>6} {fixed.sum():>3} | {summary(true_ratio[fixed])} | "
                          f"{summary(real_ratio[fixed])} | (design, view) pairs")

    drift = []
    for i in range(args.designs):
        if len(drift) >= args.drift:
            break
        d = draw_design(i, args.max_values)
        if d["n_sites"] < 6:
            continue
        data = draw_data(d, i)
        names = list(data.global_params)
        stopped = fit(data, d["q"], "em", i, **columns).n_rounds_
        model = fit(data, d["q"], "em", i, tol=None, **columns)
        ratio = fitted_sds(model, names) / fitted_sds(model, names, row=stopped - 1)
        drift.append(ratio)
        print(f"drift, design {i:>3}: stops at round {stopped}; round 100 / stop: sd(W~) {np.round(ratio[1], 3)}, "
              f"sd(mu~) {np.round(ratio[0], 3)}", flush=True)
    if drift:
        ratios = np.stack(drift)
        print(f"drift over {len(drift)} designs (EM, q right, C >= 6): round 100 / default stop, "
              f"sd(W~) {summary(ratios[:, 1])}, sd(mu~) {summary(ratios[:, 0])}")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
