"""Speed and memory of Fed-mv-PPCA against scikit-learn's PCA and against two plain GEMMs.

Run:  OPENBLAS_NUM_THREADS=1 python benchmarks/bench_mvppca.py   (a few minutes; --small for a smoke run,
      --pooled for item 1 alone, --routes K for the start's choice of route on K drawn shapes)

Every timing is a ratio of runs interleaved in this process (A, B, A, B, ...); the minimum and
the median over the repetitions are printed.  On a shared machine set OPENBLAS_NUM_THREADS=1.

1. The pooled special case: one site, one view of N = 20,000 subjects x d = 300 and 1,000 features,
   q = 10, drawn from a PPCA model.  ``FedMVPPCA(n_rounds=1)`` with its defaults against
   ``sklearn.decomposition.PCA(q)`` (whose ``score`` is the PPCA log-likelihood of Tipping &
   Bishop's ML fit): held-out mean log-likelihood, wall and CPU time; the paper's start
   (``init="random", local_tol=None``) beside it.  Narrow (d = 300), the site forms its covariance
   as PCA does and runs its EM on it; wide (d = 1,000), the randomized subspace iteration.
2. Peak traced memory (tracemalloc; numpy reports its buffers to it) of that whole fit,
   beyond the training data (allocated before), as a multiple of the data's size.
3. One local EM iteration on a site of N = 20,000 subjects x d = 2,000 features in 3 views,
   q = 10, against two plain numpy GEMMs per view of the same shapes -- T_k (N x d_k) times
   B_k (d_k x q) for the E-step and T_k^T times X (N x q) for the W update -- the floor of
   the algorithm (every iteration must touch all N d entries twice).
4. Peak memory of a local fit with one wide view (d = 10,000 and 20,000): linear in d.
5. The master step on 2 sites x 1,000 subjects x views of (300, 500, 200) features, q = 10, in
   round 2 (the sites fitted under the round-1 prior), against the authors' formulation of the
   same update (:func:`authors_master_step`: the site parameters W_c, mu_c, sigma2_c themselves,
   eqs. 13, 14, 17, 18, the [RC] safeguards and the 10-step ML1 fixed point).  Ours is what
   the coordinator runs on the sites' replies: the field-wise sum of the replies (the sites'
   sufficient statistics) and ``MVPPCAProtocol.global_step`` with ``prior_update="paper",
   ig_solver="fixed_point"`` (the same update), its broadcast read back as global parameters;
   the sites' own computation of their statistics is timed beside it.  Both results must agree
   to 1e-10 (relative, every block).
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np

from fedhier import FedMVPPCA
from fedhier.models.mvppca.local import fit_local
from scipy.special import digamma, polygamma


def interleaved(fns: dict, repeat: int, clock=time.perf_counter) -> dict[str, list[float]]:
    """Seconds (wall, or ``clock``'s) of every function over ``repeat`` rounds, in alternating order."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeat):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = clock()
            fns[name]()
            times[name].append(clock() - t0)
    return times


def ratio_line(label: str, num: list[float], den: list[float]) -> str:
    ratios = [a / b for a, b in zip(num, den)]
    return (f"  {label:<44} min {min(ratios):6.2f}   median {statistics.median(ratios):6.2f}"
            f"   ({min(num):.3f} s vs {min(den):.3f} s, min)")


def ppca_sampler(d: int, q: int, rng: np.random.Generator):
    """A function m -> (m, d) rows drawn from one PPCA model: t = W x + mu + N(0, I), x ~ N(0, I_q)."""
    W = rng.normal(size=(d, q)) * np.linspace(3.0, 0.5, q)
    mu = rng.normal(size=d)
    return lambda m: rng.normal(size=(m, q)) @ W.T + mu + rng.normal(size=(m, d))


def versus_pca(n: int, d: int, q: int, repeat: int) -> None:
    from sklearn.decomposition import PCA

    draw = ppca_sampler(d, q, np.random.default_rng(0))
    train, test = draw(n), draw(n // 4)
    fits: dict[str, object] = {}

    def ours():
        fits["ours"] = FedMVPPCA(q, n_rounds=1, random_state=0).fit([{"v": train}])

    def pca():
        fits["pca"] = PCA(q).fit(train)

    def paper():
        fits["paper"] = FedMVPPCA(q, n_rounds=1, random_state=0, init="random", local_tol=None).fit([{"v": train}])

    times = interleaved({"ours": ours, "pca": pca}, repeat)
    cpu = interleaved({"ours": ours, "pca": pca}, repeat, clock=time.process_time)
    paper_times = interleaved({"paper": paper, "pca": pca}, max(1, repeat // 2))
    ll_pca = fits["pca"].score(test)
    ll_ours = fits["ours"].score({"v": test})
    ll_paper = fits["paper"].score({"v": test})
    print(f"1. one site, one view: N = {n:,} x d = {d:,}, q = {q}; held-out {test.shape[0]:,} subjects")
    print(f"  held-out mean log-likelihood: PCA {ll_pca:.6f}, FedMVPPCA {ll_ours:.6f}, paper start {ll_paper:.6f}")
    print(f"  relative gap to PCA: FedMVPPCA {abs(ll_ours - ll_pca) / abs(ll_pca):.2e} (target <= 1e-6), "
          f"paper start {abs(ll_paper - ll_pca) / abs(ll_pca):.2e}")
    print(ratio_line("wall time FedMVPPCA / PCA (target <= 1.5)", times["ours"], times["pca"]))
    print(ratio_line("CPU time FedMVPPCA / PCA (target <= 1.5)", cpu["ours"], cpu["pca"]))
    print(ratio_line("wall time paper start / PCA", paper_times["paper"], paper_times["pca"]))

    def peak(fn) -> int:
        tracemalloc.start()
        tracemalloc.reset_peak()
        fn()
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    ours_peak, pca_peak = peak(ours), peak(pca)
    size = train.nbytes
    print(f"2. peak traced memory beyond the data ({size / 2**20:.0f} MiB): FedMVPPCA {ours_peak / 2**20:.1f} MiB, "
          f"PCA {pca_peak / 2**20:.1f} MiB")
    print(f"  peak / data, the data included: FedMVPPCA {(size + ours_peak) / size:.2f} (target <= 1.5), "
          f"PCA {(size + pca_peak) / size:.2f}")


def iteration_cost(n: int, dims: tuple[int, ...], q: int, repeat: int) -> None:
    rng = np.random.default_rng(0)
    views = {f"view{k}": rng.normal(size=(n, d)) for k, d in enumerate(dims)}
    B = {k: rng.normal(size=(v.shape[1], q)) for k, v in views.items()}
    X = rng.normal(size=(n, q))

    def gemms():
        for k, v in views.items():
            v @ B[k]
            v.T @ X

    k_iter = 8
    # one iteration = a fit of k + 1 iterations minus a fit of 1 (removes the start and the one-off passes)
    times = interleaved({
        "floor": gemms,
        "one": lambda: fit_local(views, q, None, n_iter=1, rng=1, init="random"),
        "many": lambda: fit_local(views, q, None, n_iter=k_iter + 1, rng=1, init="random"),
    }, repeat)
    per_iter = [(m - o) / k_iter for m, o in zip(times["many"], times["one"])]
    print(f"3. one local EM iteration: N = {n:,} subjects, d = {sum(dims):,} features in views {dims}, q = {q}")
    print(ratio_line("iteration / two plain GEMMs per view (<= 1.2)", per_iter, times["floor"]))


def peak_memory(n: int, dims: list[int], q: int) -> None:
    print(f"4. peak traced memory of a local fit (N = {n}, one view, q = {q}, 3 iterations, PCA start):")
    rows = []
    for d in dims:
        data = {"omics": np.random.default_rng(0).normal(size=(n, d))}
        tracemalloc.start()
        tracemalloc.reset_peak()
        fit_local(data, q, None, n_iter=3, rng=np.random.default_rng(0))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rows.append((d, peak))
        print(f"  d = {d:6,}: peak {peak / 2**20:8.1f} MiB   (data {data['omics'].nbytes / 2**20:.1f} MiB; "
              f"a d x d matrix would be {d * d * 8 / 2**20:,.0f} MiB)")
    (d1, p1), (d2, p2) = rows[0], rows[-1]
    print(f"  peak ratio for d x{d2 / d1:.0f}: {p2 / p1:.2f}  (linear in d: {d2 / d1:.0f}; quadratic: {(d2 / d1) ** 2:.0f})")


def _inverse_digamma(y: float) -> float:
    """psi^{-1}(y) by Newton, the authors' start and tolerance (spec §5.2)."""
    x = np.exp(y) + 0.5 if y >= -2.22 else -1.0 / (y - digamma(1.0))
    for _ in range(100):
        step = (digamma(x) - y) / polygamma(1, x)
        x -= step
        if abs(step) < 1e-8:
            break
    return x


def authors_master_step(site_params: list, q: int) -> dict:
    """The master's ML update of the global prior as the paper states it, from the site parameters.

    Per view k over the C_k sites that sent it: mu~ = mean mu_c, sigma2_mu~ = sum ||mu_c - mu~||^2
    / (C_k d_k) (eqs. 13, 14); W~ = mean W_c, sigma2_W~ = sum ||W_c - W~||_F^2 / (C_k d_k q)
    (eqs. 17, 18) with the authors' safeguards (C_k = 1: 1e-4; zero spread: 1e-20; cap
    ||W~||_F / 5); (alpha, beta) by 10 steps of alpha <- psi^{-1}(ln(m alpha) - ln sum 1/x -
    mean ln x) from the moment start, floored at 2 + 1e-5; s-bar = mean sigma2_c and
    v_sigma = beta^2 / ((alpha - 1)^2 (alpha - 2)).
    """
    out = {}
    for view in site_params[0]:
        blocks = [p[view] for p in site_params if view in p]
        C, (d, _) = len(blocks), blocks[0].W.shape
        mu = sum(b.mu for b in blocks) / C
        W = sum(b.W for b in blocks) / C
        var_mu = sum(np.sum((b.mu - mu) ** 2) for b in blocks) / (C * d)
        var_W = sum(np.linalg.norm(b.W - W, "fro") ** 2 for b in blocks) / (C * d * q)
        if C == 1:
            var_mu = var_W = 1e-4
        var_mu = var_mu if var_mu > 0 else 1e-20
        var_W = var_W if var_W > 0 else 1e-20
        var_W = min(var_W, np.linalg.norm(W, "fro") / 5)
        x = np.array([b.sigma2 for b in blocks])
        spread = np.var(x, ddof=1) if C > 1 else 0.0
        alpha = x.mean() ** 2 / (spread if spread > 0 else 1e-20) + 2
        for _ in range(10):
            alpha = _inverse_digamma(np.log(C * alpha) - np.log(np.sum(1 / x)) - np.mean(np.log(x)))
        alpha = max(alpha, 2 + 1e-5)
        beta = C * alpha / np.sum(1 / x)
        out[view] = {"mu": mu, "W": W, "sigma2_mu": var_mu, "sigma2_W": var_W, "alpha": alpha, "beta": beta,
                     "noise_var": x.mean(), "var_sigma": beta**2 / ((alpha - 1) ** 2 * (alpha - 2))}
    return out


def master_step(n: int, dims: tuple[int, ...], q: int, repeat: int) -> None:
    from fedhier.data.schema import ViewSchema
    from fedhier.protocol.base import sum_messages
    from fedhier.protocol.mvppca import MVPPCAProtocol, global_from_message, global_to_message
    from fedhier.models.mvppca import master

    rng = np.random.default_rng(5)
    names = tuple(f"view{k}" for k in range(len(dims)))
    sites = []
    for _ in range(2):  # each site its own PPCA model (different mu, W, noise)
        sites.append({v: ppca_sampler(d, q, rng)(n) * rng.uniform(0.8, 1.2) for v, d in zip(names, dims)})
    round1 = [fit_local(data, q, None, n_iter=30, rng=rng).params for data in sites]
    prior, _ = master.global_step_from_params(round1, n_components=q, ig_solver="fixed_point")
    params = [fit_local(data, q, prior, n_iter=15, rng=rng).params for data in sites]
    protocol = MVPPCAProtocol(ViewSchema(names, dims), q, prior_update="paper", ig_solver="fixed_point")
    previous = global_to_message(prior)

    def statistics():
        return {c: {f"{v}/{k}": a for v, fields in master.site_statistics(p, prior).items() for k, a in fields.items()}
                for c, p in enumerate(params)}

    replies = statistics()
    out: dict[str, object] = {}

    def ours():
        out["ours"] = global_from_message(protocol.global_step(sum_messages(protocol.reply_spec, replies), 2, previous),
                                          protocol.schema)

    def authors():
        out["authors"] = authors_master_step(params, q)

    k = 20  # master steps per timing (one takes about a millisecond)
    times = interleaved({
        "ours": lambda: [ours() for _ in range(k)],
        "authors": lambda: [authors() for _ in range(k)],
        "sites": lambda: [statistics() for _ in range(k)],
    }, repeat)
    worst = max(
        float(np.max(np.abs(np.asarray(getattr(out["ours"][v], name)) - ref) / np.maximum(np.abs(ref), 1e-300)))
        for v in names for name, ref in out["authors"][v].items()
    )
    print(f"5. master step (round 2): 2 sites x {n:,} subjects, views {dims}, q = {q}; {k} steps per timing")
    print(f"  largest relative difference of the global parameters, ours vs the authors' formulation: {worst:.1e}")
    assert worst <= 1e-10, worst
    print(ratio_line("master step / authors' formulation (<= 1.2)", times["ours"], times["authors"]))
    both = [a + b for a, b in zip(times["ours"], times["sites"])]
    print(ratio_line("with the sites' statistics / authors'", both, times["authors"]))


def floor_em(views: dict, q: int, n_iter: int, prior) -> dict:
    """The numpy floor of ``n_iter`` iterations of a site's (MAP-)EM on complete rows: the necessary products only.

    Per iteration: the mean step under the prior (a q x q solve), the E-step (one q x q inverse, one
    (N, d_k) x (d_k, q) product per view), and per view T_k^T <X> with the W and sigma2 updates (another
    q x q inverse).  Plain EM with mu = t-bar when ``prior`` is None.  Under a prior the E-step and the sigma2
    update count the loadings' posterior covariance Sigma_k = sigma2_k (S_xx + Lambda)^{-1}, as the fit's default
    does (``loading_uncertainty``): q x q work only.
    """
    rng = np.random.default_rng(0)
    n = next(iter(views.values())).shape[0]
    eye = np.eye(q)
    t_bar = {k: v.mean(axis=0) for k, v in views.items()}
    scatter = {k: float(np.vdot(v - t_bar[k], v - t_bar[k])) for k, v in views.items()}
    W = {k: rng.uniform(-2.0, 2.0, (v.shape[1], q)) for k, v in views.items()}
    sigma2 = dict.fromkeys(views, 0.3)
    mu = dict(t_bar)
    row_cov = {k: np.zeros((q, q)) for k in views}
    for _ in range(n_iter):
        if prior is not None:
            for k in views:
                g = prior[k]
                a = n * g.sigma2_mu + sigma2[k]
                u = t_bar[k] - g.mu
                inner = np.linalg.solve(W[k].T @ W[k] + a * eye, W[k].T @ u)
                mu[k] = g.mu + (n * g.sigma2_mu / a) * (u - W[k] @ inner)
        M = np.linalg.inv(eye + sum((W[k].T @ W[k] + v.shape[1] * row_cov[k]) / sigma2[k] for k, v in views.items()))
        X = sum(views[k] @ (W[k] / sigma2[k]) - mu[k] @ (W[k] / sigma2[k]) for k in views) @ M
        xx = n * M + X.T @ X
        for k, T in views.items():
            cross = T.T @ X - np.outer(mu[k], X.sum(axis=0))
            ridge = 0.0 if prior is None else sigma2[k] / prior[k].sigma2_W_columns
            rhs = cross if prior is None else cross + prior[k].W * ridge
            inverse = np.linalg.inv(xx + ridge * eye)
            W[k] = rhs @ inverse
            shift = t_bar[k] - mu[k]
            S = scatter[k] + n * (shift @ shift) - 2.0 * np.vdot(W[k], cross) + np.vdot(W[k].T @ W[k], xx)
            if prior is not None:
                row_cov[k] = sigma2[k] * inverse
                S += T.shape[1] * np.vdot(row_cov[k], xx)
            alpha, beta = (2.25, 0.625) if prior is None else (prior[k].alpha, prior[k].beta)
            sigma2[k] = (S + 2.0 * beta) / (T.size + 2.0 * (alpha + 1.0))
    return W


def recorded_floor(fit) -> tuple[list, object]:
    """Run ``fit`` once, recording every site step (views, q, prior, iterations run); return them and the floor.

    The floor runs :func:`floor_em` for each recorded step: the same iterations on the same blocks.
    """
    from fedhier.models.mvppca import local

    calls = []
    recorded = local.fit_local

    def recording(data, n_components, prior=None, **kwargs):
        result = recorded(data, n_components, prior, **kwargs)
        calls.append((dict(data), n_components, prior, len(result.expected_ll)))
        return result

    local.fit_local = recording
    try:
        fit()
    finally:
        local.fit_local = recorded
    assert all(not np.isnan(v).any() for views, *_ in calls for v in views.values()), "the floor needs complete rows"

    def floor():
        for views, q, prior, n_iter in calls:
            floor_em(views, q, n_iter, prior)

    return calls, floor


def demo_versus_floor(repeat: int) -> None:
    """The demo's fit against :func:`floor_em` run for the same iterations on the same sites' blocks."""
    from fedhier.demo import demo_data

    sites = demo_data().sites
    fit = lambda: FedMVPPCA(5, n_rounds=100, random_state=0).fit(sites)  # noqa: E731  (the demo's fit)
    calls, floor = recorded_floor(fit)
    times = interleaved({"fit": fit, "floor": floor}, repeat, clock=time.process_time)
    blocks = sorted({v.shape for views, *_ in calls for v in views.values()}, reverse=True)
    print(f"6. the demo's fit (3 sites, blocks up to {blocks[0][0]} x {blocks[0][1]}, q = 5): "
          f"{len(calls)} site steps, {sum(c[-1] for c in calls):,} EM iterations")
    print(ratio_line("demo fit / numpy floor, CPU time (<= 2)", times["fit"], times["floor"]))


def start_routes(n_shapes: int, repeat: int, seed: int = 1) -> None:
    """``--routes``: on one site of one complete view, shapes drawn at random (N log-uniform in 2,000-50,000,
    d log-uniform in 200-3,000, q = 10, at most 2^28 entries), the fit ``FedMVPPCA(10, n_rounds=1)`` timed with
    the start from the covariance and with the subspace iteration (each forced; min over ``repeat`` alternating
    runs), and which one the start's rule picks."""
    import fedhier.models.mvppca.start as start

    rule = start._covariance_is_cheaper
    rng = np.random.default_rng(seed)
    right = 0
    for _ in range(n_shapes):
        while True:
            n, d = (int(round(np.exp(rng.uniform(np.log(lo), np.log(hi))))) for lo, hi in ((2_000, 50_000), (200, 3_000)))
            if n * d <= 2**28:
                break
        X = ppca_sampler(d, 10, rng)(n)
        fits = {}
        for route in ("covariance", "subspace"):
            def fit(force=route == "covariance"):
                start._covariance_is_cheaper = lambda n, d, k: force
                try:
                    FedMVPPCA(10, n_rounds=1).fit(X)
                finally:
                    start._covariance_is_cheaper = rule
            fits[route] = fit
        times = {route: min(t) for route, t in interleaved(fits, repeat).items()}
        picked = "covariance" if rule(n, d, min(10 + start.N_OVERSAMPLES, d, n)) else "subspace"
        faster = min(times, key=times.get)
        right += picked == faster
        print(f"  N = {n:6d}, d = {d:5d}: covariance {times['covariance']:.3f} s, subspace {times['subspace']:.3f} s "
              f"(ratio {times['covariance'] / times['subspace']:.2f}); the rule picks {picked}, "
              f"{'the faster' if picked == faster else f'{times[picked] / times[faster]:.2f} x the faster'}", flush=True)
    print(f"the rule picked the faster start on {right} of {n_shapes} drawn shapes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved repetitions (default 5)")
    parser.add_argument("--demo", action="store_true", help="only item 6, the demo's fit against the numpy floor")
    parser.add_argument("--pooled", action="store_true", help="only item 1, the pooled fit against PCA at d = 300 and 1,000")
    parser.add_argument("--routes", type=int, metavar="K", help="only the start's two routes on K drawn shapes")
    args = parser.parse_args()
    if args.routes:
        start_routes(args.routes, repeat=args.repeat)
        return
    if args.demo:
        demo_versus_floor(repeat=args.repeat)
        return
    if args.pooled:
        versus_pca(20_000, 300, 10, repeat=args.repeat)
        versus_pca(20_000, 1_000, 10, repeat=args.repeat)
        return
    if args.small:
        versus_pca(2_000, 100, 10, repeat=2)
        iteration_cost(2_000, (100, 60, 40), 10, repeat=2)
        peak_memory(200, [1_000, 2_000], 10)
        master_step(200, (30, 50, 20), 10, repeat=2)
    else:
        versus_pca(20_000, 300, 10, repeat=args.repeat)  # narrow: the start from the d x d covariance
        versus_pca(20_000, 1_000, 10, repeat=args.repeat)  # wide: the randomized subspace iteration
        iteration_cost(20_000, (1_000, 600, 400), 10, repeat=args.repeat)
        peak_memory(500, [10_000, 20_000], 10)
        master_step(1_000, (300, 500, 200), 10, repeat=max(args.repeat, 5))
    demo_versus_floor(repeat=max(args.repeat, 5))


if __name__ == "__main__":
    main()
