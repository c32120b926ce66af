"""FedLin experiments (the paper's simulations and data sets, and two grouped real data sets),
run by ``fedhier experiment <name> [--quick]``.

Each ``run_<name>(out_dir, *, quick, seed)`` writes ``<name>.csv`` (one row per run and method),
``<name>-summary.csv``, ``<name>.md`` (the tables, with the command that produced them and its
wall time, and the paired comparisons every stated difference rests on, see
:mod:`.paired`) and, where the paper has a figure, a PNG. Every utility table has the trivial
baseline "Training mean" (each site predicts its own training mean of y). ``quick=True`` shrinks
runs, rounds and sampler sizes so that every experiment finishes in well under a minute.
"""

from __future__ import annotations

import inspect
import io
import re
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
from scipy import stats as sps

from ..estimators.fedlin import FedHM1Regressor, FedHM2Regressor
from ..models.fedlin.baselines import ditto_personalise, fit_centralised_ols, fit_separate, mixedlm_pooled
from ..models.fedlin.datasets import load_cmapss, load_heart, load_radon, load_student
from ..models.fedlin.inference import a_rmse, inclusion_rates
from ..protocol.fedlin import FedAvgProtocol
from ..runtime.simulate import simulate
from ..utils.io import atomic_write_bytes, atomic_write_text, markdown_table, write_csv
from .paired import paired_block, read_csv

__all__ = [
    "EXPERIMENTS",
    "run_sim_hm1",
    "run_sim_hm2",
    "run_uq",
    "run_student",
    "run_cmapss",
    "run_heart",
    "run_radon",
]


# ---------------------------------------------------------------------- helpers
def _summary(rows: list[dict], keys: list[str], metrics: list[str]) -> list[dict]:
    """Mean, sd and standard error over runs of each metric, grouped by ``keys``."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for g, part in groups.items():
        row = dict(zip(keys, g))
        row["runs"] = len(part)
        for m in metrics:
            v = np.array([p.get(m, np.nan) for p in part], dtype=float)
            v = v[np.isfinite(v)]  # a method without the metric (e.g. the training mean has no FIR)
            row[m] = float(v.mean()) if v.size else float("nan")
            row[f"{m}_sd"] = float(v.std(ddof=1)) if v.size > 1 else 0.0
            row[f"{m}_se"] = row[f"{m}_sd"] / np.sqrt(max(v.size, 1))
        out.append(row)
    return out


def _fmt_mean_sd(rows: list[dict], keys: list[str], metrics: list[str]) -> list[dict]:
    return [{**{k: r[k] for k in keys}, "runs": r["runs"], **{m: f"{r[m]:.3f} ({r[m + '_sd']:.3f})" if np.isfinite(r[m]) else "" for m in metrics}} for r in rows]


def _doc_markdown(func: Callable) -> str:
    """The body of a run function's docstring as markdown (settings stated once, in the code)."""
    body = inspect.cleandoc(func.__doc__).split("\n\n", 1)[1]
    return re.sub(r":math:`([^`]*)`", r"$\1$", body).replace("``", "`")


TRAINING_MEAN = "Training mean"


def _training_mean_rmse(train, tests) -> float:
    """A-RMSE of the trivial baseline: each site predicts its own training mean of y."""
    return a_rmse([np.full(len(y), ytr.mean()) for (_, ytr), (_, y) in zip(train, tests)], [y for _, y in tests])


def _claims(out_dir: Path, name: str, specs: list[dict]) -> list[str]:
    """Paired blocks (:func:`.paired.paired_block`) from ``<name>.csv`` as written, read back."""
    rows = read_csv(out_dir / f"{name}.csv")
    return [paired_block({"csv": f"{name}.csv", "unit": "run", **spec}, rows) for spec in specs]


def _write_report(
    out_dir: Path, name: str, title: str, quick: bool, seed: int, notes: str, tables: list[tuple[str, str]], seconds: float,
    claims: list[dict] | None = None,
) -> None:
    """``<name>.md``: command and wall time, settings, tables, then the paired comparisons ``claims``."""
    cmd = f"fedhier experiment {name}" + (" --quick" if quick else "") + f" --seed {seed}"
    parts = [f"# {title}\n", f"Produced by `{cmd}` in {seconds:.0f} s (wall time, `OPENBLAS_NUM_THREADS=1`).\n", notes.strip() + "\n"]
    for heading, table in tables:
        parts.append(f"## {heading}\n\n{table}")
    if claims:
        parts.append("## Paired comparisons\n\n" + "\n".join(_claims(out_dir, name, claims)))
    atomic_write_text(out_dir / f"{name}.md", "\n".join(parts))


def _save_figure(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _fedavg(sites, *, eta, T, C, batch_size, seed) -> np.ndarray:
    """FedAvg through the runtime (spec §6); returns the global :math:`\\bar\\theta` (d,)."""
    d = sites[0][0].shape[1]
    res = simulate(FedAvgProtocol(d, eta=eta, n_local_steps=T, batch_size=batch_size), sites, n_rounds=C, random_state=seed)
    return res.broadcast["theta"]


def _rmse_rows(thetas: np.ndarray, tests) -> float:
    """A-RMSE (spec §7) of per-site coefficients ``thetas (K, d)`` on test pairs."""
    return a_rmse([X @ th for th, (X, _) in zip(thetas, tests)], [y for _, y in tests])


# ---------------------------------------------------------------------- §8.1 HM1 simulations
def _random_pd(K: int, rng: np.random.Generator) -> np.ndarray:
    """clusterGeneration::genPositiveDefMat "eigen": eigenvalues ~ U[1, 10], random orthogonal vectors."""
    Q = sps.ortho_group.rvs(K, random_state=rng)
    return (Q * rng.uniform(1, 10, K)) @ Q.T


def _hm1_case(case: str, rng: np.random.Generator, noise_is_variance: bool, n_test: int):
    if case == "I":
        K, d, omega, noise, ns, evaluated = 2, 5, np.array([[1.0, 0.7], [0.7, 1.0]]), 0.05, [20, 200], [0]
    else:
        K, d, noise = 100, 8, 0.1
        omega = _random_pd(K, rng)
        ns = {"II": [40] * 30 + [275] * 70, "III": [20] * 100, "IV": [200] * 100}[case]
        evaluated = list(range(30)) if case == "II" else list(range(K))
    sd = np.sqrt(noise) if noise_is_variance else noise
    theta = rng.multivariate_normal(np.zeros(K), omega, size=d)  # d rows ~ N(0, Omega): (d, K)
    train, test = [], []
    for k in range(K):
        X = rng.standard_normal((ns[k], d))
        train.append((X, X @ theta[:, k] + sd * rng.standard_normal(ns[k])))
        Xt = rng.standard_normal((n_test, d))
        test.append((Xt, Xt @ theta[:, k]))  # noise-free test targets (spec §9 #10)
    return train, test, theta, omega, evaluated


def run_sim_hm1(out_dir: Path, *, quick: bool, seed: int) -> None:
    """The paper's Table 1 (HM1 vs Separate, FedAvg, Ditto; Cases I-IV) and Figure 3.

    Optimiser (our stated choice; the paper does not give one that works): full-batch sum
    gradients, :math:`\\eta=10^{-3}`
    (the paper's 0.01 diverges with full-batch sums), :math:`T=20`, :math:`C=30`, :math:`\\alpha=0.1`,
    learned :math:`\\Omega`, :math:`\\Theta^{(0)}=0`; Separate takes :math:`C\\cdot T` steps with the same
    :math:`\\eta`; Ditto: closed form with :math:`\\lambda=1` after FedAvg. Full run: 30 runs per case;
    quick: Cases I and III, 2 runs, 200 test points.
    """
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    cases = ["I", "III"] if quick else ["I", "II", "III", "IV"]
    n_runs, n_test = (2, 200) if quick else (30, 1000)
    eta, T, C, alpha = 1e-3, 20, 30, 0.1
    rows = []
    curves: dict[str, list[np.ndarray]] = {"II": [], "III": []}
    for case in cases:
        for run in range(n_runs):
            rng = np.random.default_rng([seed, run, ord(case[-1]), len(case)])
            train, test, theta_true, _, ev = _hm1_case(case, rng, False, n_test)
            fig_rounds = 60 if (case in curves and not quick) else C
            hm1 = FedHM1Regressor(fit_intercept=False, n_rounds=fig_rounds, n_local_steps=T, eta=eta, alpha=alpha, record_theta=True, random_state=seed + run).fit(train)
            if case in curves:
                curves[case].append(np.linalg.norm(hm1.theta_path_ - theta_true.T[None], axis=(1, 2)) / np.sqrt(len(train)))
            coef_hm1 = hm1.theta_path_[C - 1]
            sep = fit_separate(train, eta=eta, n_steps=C * T).T
            avg = _fedavg(train, eta=eta, T=T, C=C, batch_size=None, seed=seed + run)
            ditto = np.array([ditto_personalise(X, y, avg, 1.0) for X, y in train])
            tests_ev = [test[k] for k in ev]
            for method, coef in [("HM1", coef_hm1), ("Separate", sep), ("FedAvg", np.tile(avg, (len(train), 1))), ("Ditto", ditto)]:
                rows.append({"case": case, "run": run, "method": method, "a_rmse": _rmse_rows(coef[ev], tests_ev)})
            rows.append({"case": case, "run": run, "method": TRAINING_MEAN, "a_rmse": _training_mean_rmse([train[k] for k in ev], tests_ev)})
    write_csv(out_dir / "fedlin-sim-hm1.csv", rows)
    summ = _summary(rows, ["case", "method"], ["a_rmse"])
    write_csv(out_dir / "fedlin-sim-hm1-summary.csv", summ)
    plt = _pyplot()
    shown = [c for c in curves if curves[c]]
    if shown:
        fig, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 3.5), squeeze=False)
        for ax, c in zip(axes[0], shown):
            for curve in curves[c]:
                ax.plot(np.arange(1, len(curve) + 1), curve, color="C0", alpha=0.4, lw=1)
            ax.set(title=f"Case {c}", xlabel="communication round", ylabel=r"$\|\hat\Theta-\Theta^*\|_F/\sqrt{K}$")
        _save_figure(fig, out_dir / "fedlin-sim-hm1-figure3.png")
        plt.close(fig)
    _write_report(
        out_dir, "fedlin-sim-hm1", "FedLin HM1 simulations (paper Table 1, Figure 3)", quick, seed,
        _doc_markdown(run_sim_hm1), [("A-RMSE, mean (sd) over runs", markdown_table(_fmt_mean_sd(summ, ["case", "method"], ["a_rmse"])))],
        time.perf_counter() - t0,
        claims=[{"metric": "a_rmse", "what": "A-RMSE", "pair_on": ["run"], "groups": [{"case": c} for c in cases],
                 "pairs": [["HM1", "Separate"], ["HM1", "Ditto"], ["HM1", "FedAvg"], ["Separate", TRAINING_MEAN]]}],
    )


# ---------------------------------------------------------------------- §8.2 HM2 variable selection
def _hm2_case(case: str, rng, n_test_override=None):
    if case == "III":
        K, theta, ns, n_test = 20, np.r_[np.full(10, 3.0), np.zeros(10), np.full(10, 3.0)], [40] * 20, 400
    else:
        K, theta, n_test = 10, np.array([3, 1.5, 0, 0, 2, 0, 0, 0], float), 1000
        ns = [100] * 10 if case == "I" else [20, 20] + [200] * 8
    n_test = n_test_override or n_test
    train, test = [], []
    for k in range(K):
        X = rng.standard_normal((ns[k], len(theta)))
        train.append((X, X @ theta + 0.05 * rng.standard_normal(ns[k])))
        Xt = rng.standard_normal((n_test, len(theta)))
        test.append((Xt, Xt @ theta))
    return train, test, theta


def run_sim_hm2(out_dir: Path, *, quick: bool, seed: int) -> None:
    """The paper's Table 2: federated Bayesian lasso by EP, 90% credible-interval selection.

    Settings: :math:`\\phi=(\\log\\lambda,\\log\\sigma^2)\\sim\\mathcal N(0,I)`, per-site centring and
    standardisation, damping 0.5, at most 10 EP rounds (stopping earlier once the standardised
    change of the global parameters stays small for 3 rounds), tilted
    moments by the Gibbs/Metropolis sampler with 4 chains x (500 + 500); noise sd 0.05 and noise-free
    test targets. Baseline: Separate least squares per site with the same 90% rule (t intervals).
    ``coverage_90`` is the share of true coefficients inside their 90% credible intervals.
    Full run: 30 runs per case; quick: Cases I-II, 1 run, 2 chains x (150 + 150),
    4 rounds.
    """
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    cases = ["I", "II"] if quick else ["I", "II", "III"]
    n_runs = 1 if quick else 30
    mcmc = dict(n_chains=2, n_warmup=150, n_draws=150) if quick else dict(n_chains=4, n_warmup=500, n_draws=500)
    rows = []
    for case in cases:
        for run in range(n_runs):
            rng = np.random.default_rng([seed, run, len(case)])
            train, test, theta = _hm2_case(case, rng, 200 if quick else None)
            est = FedHM2Regressor(prior="lasso", n_rounds=4 if quick else 10, damping=0.5, mcmc=mcmc, n_posterior_draws=1000, random_state=seed + run).fit(train)
            preds = [est.predict(X, site=k) for k, (X, _) in enumerate(test)]
            cir, fir = inclusion_rates(est.selected_features_, theta)
            zeroed = [X @ (est.coef_[k] * est.selected_features_[k]) + est.intercept_[k] for k, (X, _) in enumerate(test)]
            ci = est.coef_interval(0.9)
            coverage = float(np.mean((ci[..., 0] <= theta) & (theta <= ci[..., 1])))
            rows.append({"case": case, "run": run, "method": "HM2-Lasso (EP)", "a_rmse": a_rmse(preds, [y for _, y in test]), "a_rmse_zeroed": a_rmse(zeroed, [y for _, y in test]), "cir": cir, "fir": fir, "coverage_90": coverage, "ep_rounds": est.n_rounds_})
            sel, coefs, covered = [], [], []
            for X, y in train:
                n, d = X.shape
                beta, *_ = np.linalg.lstsq(X, y, rcond=None)
                resid = y - X @ beta
                se = np.sqrt(np.diag(np.linalg.pinv(X.T @ X)) * (resid @ resid) / max(n - d, 1))
                half = sps.t.ppf(0.95, max(n - d, 1)) * se
                sel.append(np.abs(beta) > half)
                covered.append(np.abs(beta - theta) <= half)
                coefs.append(beta)
            cir, fir = inclusion_rates(np.array(sel), theta)
            a = _rmse_rows(np.array(coefs), test)
            rows.append({"case": case, "run": run, "method": "Separate OLS", "a_rmse": a, "a_rmse_zeroed": _rmse_rows(np.array(coefs) * np.array(sel), test), "cir": cir, "fir": fir, "coverage_90": float(np.mean(covered)), "ep_rounds": 0})
            rows.append({"case": case, "run": run, "method": TRAINING_MEAN, "a_rmse": _training_mean_rmse(train, test)})
    write_csv(out_dir / "fedlin-sim-hm2.csv", rows)
    metrics = ["a_rmse", "a_rmse_zeroed", "cir", "fir", "coverage_90"]
    summ = _summary(rows, ["case", "method"], metrics)
    write_csv(out_dir / "fedlin-sim-hm2-summary.csv", summ)
    _write_report(
        out_dir, "fedlin-sim-hm2", "FedLin HM2 variable selection (paper Table 2)", quick, seed, _doc_markdown(run_sim_hm2),
        [("A-RMSE, CIR, FIR, coverage: mean (sd) over runs", markdown_table(_fmt_mean_sd(summ, ["case", "method"], metrics)))], time.perf_counter() - t0,
        claims=[{"metric": m, "what": w, "pair_on": ["run"], "groups": [{"case": c} for c in cases], "pairs": [["HM2-Lasso (EP)", "Separate OLS"]]}
                for m, w in (("a_rmse", "A-RMSE"), ("fir", "the false inclusion rate"))],
    )


# ---------------------------------------------------------------------- §8.3 UQ demonstrations
def run_uq(out_dir: Path, *, quick: bool, seed: int) -> None:
    """The paper's Figure 4: credible intervals of :math:`\\theta_1` (lasso, Case I) and of :math:`\\phi`.

    Right panel: :math:`K=100`, :math:`d=4`, :math:`\\theta_k\\sim\\mathcal N(\\mu^*,\\Sigma^*)`, 100
    observations per site, noise sd 0.1 with :math:`\\log\\sigma_k\\sim\\mathcal N(0,1.5^2)` local,
    :math:`\\mu\\sim\\mathcal N(0,I)`, :math:`\\log\\tau_i\\sim\\mathcal N(0,1)`; EP with damping 0.5, at most
    20 rounds, tilted moments by importance sampling (2000 draws);
    quick: :math:`K=30`, 50 observations, 6 rounds, small lasso sampler.
    """
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    rng = np.random.default_rng(seed)
    # left panel
    train, _, theta = _hm2_case("I", rng, 10)
    mcmc = dict(n_chains=2, n_warmup=150, n_draws=150) if quick else dict(n_chains=4, n_warmup=500, n_draws=500)
    lasso = FedHM2Regressor(prior="lasso", n_rounds=4 if quick else 10, mcmc=mcmc, random_state=seed).fit(train)
    ci_theta = lasso.coef_interval(0.9)[0]
    rows_theta = [{"coefficient": f"theta_1[{j + 1}]", "true": float(theta[j]), "mean": float(lasso.coef_[0, j]), "lower": float(ci_theta[j, 0]), "upper": float(ci_theta[j, 1]), "covered": bool(ci_theta[j, 0] <= theta[j] <= ci_theta[j, 1])} for j in range(len(theta))]
    # right panel
    K, n = (30, 50) if quick else (100, 100)
    mu_true = np.array([1.0, 3.0, 0.5, 2.0])
    tau_true = np.array([1.17, 2.35, 2.52, 0.67])
    sites = []
    for _ in range(K):
        th = mu_true + np.sqrt(tau_true) * rng.standard_normal(4)
        X = rng.standard_normal((n, 4))
        sites.append((X, X @ th + 0.1 * rng.standard_normal(n)))
    est = FedHM2Regressor(scale="none", fit_intercept=False, mu_scale=1.0, log_tau_prior=(0.0, 1.0), prior="gaussian", covariance="diagonal", noise="local", damping=0.5, n_rounds=6 if quick else 20, n_posterior_draws=500, random_state=seed).fit(sites)
    truth = np.r_[mu_true, np.log(tau_true)]
    ci_phi = est.phi_interval(0.9)
    rows_phi = [{"component": nm, "true": float(truth[i]), "mean": float(est.phi_mean_[i]), "lower": float(ci_phi[i, 0]), "upper": float(ci_phi[i, 1]), "covered": bool(ci_phi[i, 0] <= truth[i] <= ci_phi[i, 1])} for i, nm in enumerate(est.phi_names_)]
    write_csv(out_dir / "fedlin-uq-theta.csv", rows_theta)
    write_csv(out_dir / "fedlin-uq-phi.csv", rows_phi)
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, rows, label in [(axes[0], rows_theta, "coefficient"), (axes[1], rows_phi, "component")]:
        x = np.arange(len(rows))
        mean = np.array([r["mean"] for r in rows])
        err = np.array([[r["mean"] - r["lower"], r["upper"] - r["mean"]] for r in rows]).T
        ax.errorbar(x, mean, yerr=err, fmt="o", capsize=3, label="posterior mean, 90% CI")
        ax.plot(x, [r["true"] for r in rows], "rx", label="truth")
        ax.set_xticks(x, [r[label] for r in rows], rotation=45, ha="right")
    axes[0].set_title(r"site 1, Bayesian lasso ($\theta_1$)")
    axes[1].set_title(r"global $\phi=(\mu,\log\tau)$")
    axes[0].legend(fontsize=8)
    _save_figure(fig, out_dir / "fedlin-uq-figure4.png")
    plt.close(fig)
    _write_report(
        out_dir, "fedlin-uq", "FedLin HM2 uncertainty quantification (paper Figure 4)", quick, seed, _doc_markdown(run_uq),
        [("Left panel: theta_1, 90% credible intervals", markdown_table(rows_theta)), ("Right panel: phi, 90% credible intervals", markdown_table(rows_phi))],
        time.perf_counter() - t0,
    )


# ---------------------------------------------------------------------- §8.4 Student Performance
def _split(n: int, frac: float, rng) -> tuple[np.ndarray, np.ndarray]:
    idx = rng.permutation(n)
    m = int(np.floor(frac * n + 0.5))
    return idx[:m], idx[m:]


def run_student(out_dir: Path, *, quick: bool, seed: int) -> None:
    """The paper's Table 3: HM2-Lasso and HM2-Ridge per school vs centralised Bayesian lasso/ridge.

    ``student-por.csv`` (and ``student-mat.csv`` in the full run), random 60/40 split per school,
    38 predictors, numeric columns standardised with training statistics; G3 standardised with each
    school's training mean and sd (pooled statistics for the centralised fits).
    Centralised = the same Bayesian model on the pooled data (one site), RMSE on the pooled test
    set, so HM2 and centralised RMSEs are on different scales and are not compared pairwise.
    90% intervals decide inclusion. The training-mean baseline predicts 0 in each school's standardised units. Full run: 30 splits per course; quick:
    one split, Portuguese course, lasso sampler 2 chains x (100 + 100), 2 EP rounds.
    """
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    courses = ["por"] if quick else ["por", "mat"]
    n_runs = 1 if quick else 30
    mcmc = dict(n_chains=2, n_warmup=100, n_draws=100) if quick else dict(n_chains=4, n_warmup=500, n_draws=500)
    rows = []
    for course in courses:
        sites, names, features = load_student(course)
        for run in range(n_runs):
            rng = np.random.default_rng([seed, run, len(course)])
            splits = [_split(len(y), 0.6, rng) for _, y in sites]
            tr = [(X[a], y[a]) for (X, y), (a, _) in zip(sites, splits)]
            te = [(X[b], y[b]) for (X, y), (_, b) in zip(sites, splits)]
            Xpool = np.vstack([X for X, _ in tr])
            num = slice(0, 13)
            m, s = Xpool[:, num].mean(0), Xpool[:, num].std(0)

            def scale_x(X):
                X = X.copy()
                X[:, num] = (X[:, num] - m) / s
                return X

            site_y = [(y.mean(), y.std()) for _, y in tr]
            tr_s = [(scale_x(X), (y - a) / b) for (X, y), (a, b) in zip(tr, site_y)]
            te_s = [(scale_x(X), (y - a) / b) for (X, y), (a, b) in zip(te, site_y)]
            ypool = np.concatenate([y for _, y in tr])
            pa, pb = ypool.mean(), ypool.std()
            pooled_tr = [(np.vstack([scale_x(X) for X, _ in tr]), (ypool - pa) / pb)]
            pooled_te_X = np.vstack([scale_x(X) for X, _ in te])
            pooled_te_y = (np.concatenate([y for _, y in te]) - pa) / pb
            for prior in ("lasso", "ridge"):
                opts = dict(prior=prior, n_rounds=2 if quick else 10, mcmc=mcmc, n_posterior_draws=1000, random_state=seed + run)
                fed = FedHM2Regressor(**opts).fit(tr_s)
                preds = [fed.predict(X, site=k) for k, (X, _) in enumerate(te_s)]
                row = {"course": course, "run": run, "method": f"HM2-{prior.title()}", "rmse": a_rmse(preds, [y for _, y in te_s])}
                for k, nm in enumerate(names):
                    row[f"included_{nm}"] = int(fed.selected_features_[k].sum())
                rows.append(row)
                cen = FedHM2Regressor(**opts).fit(pooled_tr)
                rmse = float(np.sqrt(np.mean((cen.predict(pooled_te_X, site=0) - pooled_te_y) ** 2)))
                row = {"course": course, "run": run, "method": f"Centralised {prior.title()}", "rmse": rmse}
                for nm in names:
                    row[f"included_{nm}"] = int(cen.selected_features_[0].sum())
                rows.append(row)
            rows.append({"course": course, "run": run, "method": TRAINING_MEAN, "rmse": _training_mean_rmse(tr_s, te_s)})
    write_csv(out_dir / "fedlin-student.csv", rows)
    metrics = ["rmse"] + [k for k in rows[0] if k.startswith("included_")]
    summ = _summary(rows, ["course", "method"], metrics)
    write_csv(out_dir / "fedlin-student-summary.csv", summ)
    _write_report(
        out_dir, "fedlin-student", "FedLin Student Performance (paper Table 3)", quick, seed, _doc_markdown(run_student)
        + "\nHM2 rows report the A-RMSE over the two schools; centralised rows the pooled RMSE and the same count for both schools.",
        [("RMSE (standardised G3) and included predictors: mean (sd) over splits", markdown_table(_fmt_mean_sd(summ, ["course", "method"], metrics)))],
        time.perf_counter() - t0,
        claims=[{"metric": "rmse", "what": "RMSE (standardised G3)", "unit": "split", "pair_on": ["run"], "groups": [{"course": c} for c in courses],
                 "pairs": [["HM2-Lasso", "HM2-Ridge"], ["Centralised Lasso", "Centralised Ridge"], ["HM2-Lasso", TRAINING_MEAN]]}],
    )


# ---------------------------------------------------------------------- §8.5 C-MAPSS
def _cmapss_sites(engines, q: int, test_scaling: str):
    """Per-engine polynomial design and 60/40 time split (spec §8.5)."""
    train, test = [], []
    for cycle, value in engines:
        t = (cycle - 1) / 299.0
        X = np.vander(t, q + 1, increasing=True)
        m = int(np.floor(0.6 * len(t) + 0.5))
        lo, hi = value[:m].min(), value[:m].max()
        span = hi - lo if hi > lo else 1.0
        train.append((X[:m], (value[:m] - lo) / span))
        if test_scaling == "train":
            yt = (value[m:] - lo) / span
        else:  # the R code: the test segment's own min/max
            tlo, thi = value[m:].min(), value[m:].max()
            yt = (value[m:] - tlo) / (thi - tlo if thi > tlo else 1.0)
        test.append((X[m:], yt))
    return train, test


def run_cmapss(out_dir: Path, *, quick: bool, seed: int) -> None:
    """The paper's Table 4: HM1 vs Separate, FedAvg, Ditto on C-MAPSS FD001, one sensor at a time.

    Design :math:`(1,\\tilde t,\\dots,\\tilde t^4)`, :math:`\\tilde t=(\\text{cycle}-1)/299`; first 60% of
    each engine's cycles for training; targets min-max scaled with the training min/max (primary,
    "train" scaling) and, as in the R code, the test segment's own min/max ("test" scaling). All
    methods: :math:`T=20`, :math:`C=100`, :math:`\\Theta^{(0)}=0`, :math:`\\Omega^{(0)}=I`, mini-batch SGD with
    batch 10 and sum gradients. HM1 variants: :math:`\\alpha=0.1`, the paper's
    :math:`\\alpha=0.9` (with a small jitter added before the Cholesky factorisation of :math:`\\Omega`,
    since the literal update becomes near-singular), and the R code's 0.8/0.8 rule. Step sizes from
    :math:`\\{10^{-4},2\\cdot10^{-4},5\\cdot10^{-4},10^{-3},2\\cdot10^{-3}\\}` and :math:`\\lambda_{\\rm Ditto}\\in\\{0.01,0.1,1,10\\}`
    are chosen on a random 20% validation subsample of the training cycles in the first run, then
    refitted on the full training data; the runs differ by the mini-batches and the validation draw.
    Full run: sensors 2, 3, 7, 8, 30 runs; quick: sensor 2, one run, 20 rounds,
    fixed step size :math:`2\\cdot10^{-4}`, no grid.
    """
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    sensors = [2] if quick else [2, 3, 7, 8]
    n_runs, C, T, b = (1, 20, 20, 10) if quick else (30, 100, 20, 10)
    grid = [2e-4] if quick else [1e-4, 2e-4, 5e-4, 1e-3, 2e-3]
    lam_grid = [1.0] if quick else [0.01, 0.1, 1.0, 10.0]
    hm1_variants = {"HM1 (alpha=0.1)": dict(alpha=0.1), "HM1 (alpha=0.9, jitter)": dict(alpha=0.9, jitter=True), "HM1 (R code 0.8/0.8)": dict(alpha=0.8, omega_rule="rcode")}
    rows = []

    def fit_all(train, eta, run_seed, lam):
        coefs = {}
        for name, kw in hm1_variants.items():
            coefs[name] = FedHM1Regressor(fit_intercept=False, n_rounds=C, n_local_steps=T, eta=eta[name], batch_size=b, random_state=run_seed, **kw).fit(train).coef_
        rng = np.random.default_rng(run_seed)
        coefs["Separate"] = fit_separate(train, eta=eta["Separate"], n_steps=C * T, batch_size=b, rng=rng).T
        avg = _fedavg(train, eta=eta["FedAvg"], T=T, C=C, batch_size=b, seed=run_seed)
        coefs["FedAvg"] = np.tile(avg, (len(train), 1))
        coefs["Ditto"] = np.array([ditto_personalise(X, y, avg, lam) for X, y in train])
        return coefs

    methods = [*hm1_variants, "Separate", "FedAvg", "Ditto"]
    for sensor in sensors:
        engines = load_cmapss(sensor)
        tuned: dict[str, float] | None = None
        lam = lam_grid[0]
        for run in range(n_runs):
            run_seed = seed + 1000 * sensor + run
            rng = np.random.default_rng(run_seed)
            train, test_tr = _cmapss_sites(engines, 4, "train")
            _, test_own = _cmapss_sites(engines, 4, "test")
            if tuned is None:
                if len(grid) == 1:
                    tuned = {m: grid[0] for m in methods}
                else:
                    fit_part, val = [], []
                    for X, y in train:
                        a, v = _split(len(y), 0.8, rng)
                        fit_part.append((X[a], y[a]))
                        val.append((X[v], y[v]))
                    scores: dict[str, dict[float, float]] = {m: {} for m in methods}
                    ditto_scores = {}
                    for eta in grid:
                        coefs = fit_all(fit_part, {m: eta for m in methods}, run_seed, lam_grid[0])
                        for m in methods:
                            err = _rmse_rows(coefs[m], val)
                            scores[m][eta] = err if np.isfinite(err) else np.inf
                    tuned = {m: min(scores[m], key=scores[m].get) for m in methods}
                    avg = _fedavg(fit_part, eta=tuned["FedAvg"], T=T, C=C, batch_size=b, seed=run_seed)
                    for lam_c in lam_grid:
                        ditto_scores[lam_c] = _rmse_rows(np.array([ditto_personalise(X, y, avg, lam_c) for X, y in fit_part]), val)
                    lam = min(ditto_scores, key=ditto_scores.get)
            coefs = fit_all(train, tuned, run_seed, lam)
            for m in methods:
                with np.errstate(over="ignore", invalid="ignore"):
                    rows.append({"sensor": sensor, "run": run, "method": m, "eta": tuned[m], "a_rmse": _rmse_rows(coefs[m], test_tr), "a_rmse_rcode_scaling": _rmse_rows(coefs[m], test_own)})
            rows.append({"sensor": sensor, "run": run, "method": TRAINING_MEAN, "eta": "", "a_rmse": _training_mean_rmse(train, test_tr), "a_rmse_rcode_scaling": _training_mean_rmse(train, test_own)})
    write_csv(out_dir / "fedlin-cmapss.csv", rows)
    metrics = ["a_rmse", "a_rmse_rcode_scaling"]
    summ = _summary(rows, ["sensor", "method"], metrics)
    for r in summ:
        r["eta"] = next(x.get("eta", "") for x in rows if x["sensor"] == r["sensor"] and x["method"] == r["method"])
    write_csv(out_dir / "fedlin-cmapss-summary.csv", summ)
    table = [{**t, "eta": r["eta"]} for t, r in zip(_fmt_mean_sd(summ, ["sensor", "method"], metrics), summ)]
    _write_report(
        out_dir, "fedlin-cmapss", "FedLin NASA C-MAPSS FD001 (paper Table 4)", quick, seed, _doc_markdown(run_cmapss),
        [("A-RMSE over the 100 engines' test segments: mean (sd) over runs", markdown_table(table))], time.perf_counter() - t0,
        claims=[{"metric": m, "what": w, "pair_on": ["run"], "groups": [{"sensor": s} for s in sensors],
                 "pairs": [["HM1 (alpha=0.1)", "Separate"], ["HM1 (alpha=0.1)", "FedAvg"], ["HM1 (alpha=0.1)", "Ditto"],
                           ["FedAvg", "Separate"], ["HM1 (alpha=0.9, jitter)", "Separate"], ["Separate", TRAINING_MEAN],
                           ["HM1 (alpha=0.1)", TRAINING_MEAN]]}
                for m, w in (("a_rmse", "A-RMSE, test targets scaled with the training min/max"),
                             ("a_rmse_rcode_scaling", "A-RMSE, test targets scaled with their own min/max (R code)"))],
    )


# ---------------------------------------------------------------------- grouped real data
def run_heart(out_dir: Path, *, quick: bool, seed: int) -> None:
    """UCI Heart Disease across its 4 hospitals (not in the paper): maximum heart rate regression.

    Response ``(thalch - 140) / 10`` (tens of beats per minute around 140) on an intercept, age
    (decades from 50), sex, resting blood pressure (10 mmHg from 130), exercise angina and disease.
    Per hospital a random 70/30 split. Methods: HM2 (Gaussian hierarchy, diagonal :math:`\\tau`,
    local :math:`\\log\\sigma_k`, :math:`\\mu\\sim\\mathcal N(0,3^2I)`, EP with damping 0.5), HM1 (mean
    gradients, :math:`\\eta=0.05`, :math:`T=20`, :math:`C=50`), Separate and Centralised least squares,
    MixedLM on the pooled data (random intercept and slopes would be unidentifiable with 4 groups,
    so a random intercept) predicting with its BLUPs. Full run: 30 splits;
    quick: 2 splits and 8 EP rounds.
    """
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    sites, names, features = load_heart()
    sites = [(X, (y - 140.0) / 10.0) for X, y in sites]
    n_runs = 2 if quick else 30
    rows, coef_rows = [], []
    for run in range(n_runs):
        rng = np.random.default_rng([seed, run])
        splits = [_split(len(y), 0.7, rng) for _, y in sites]
        tr = [(X[a], y[a]) for (X, y), (a, _) in zip(sites, splits)]
        te = [(X[b], y[b]) for (X, y), (_, b) in zip(sites, splits)]
        hm2 = FedHM2Regressor(scale="none", fit_intercept=False, prior="gaussian", mu_scale=3.0, log_tau_prior=(0.0, 1.0), damping=0.5, n_rounds=8 if quick else 20, n_posterior_draws=1000, random_state=seed + run).fit(tr)
        hm1 = FedHM1Regressor(fit_intercept=False, n_rounds=50, n_local_steps=20, eta=0.05, gradient="mean", random_state=seed + run).fit(tr)
        sep = np.array([np.linalg.lstsq(X, y, rcond=None)[0] for X, y in tr])
        cen = fit_centralised_ols(tr)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # 4 groups: the variance component may sit on the boundary
            blup = mixedlm_pooled(tr, random=[0]).site_coef([0])
        for method, coef in [("HM2 (EP)", hm2.coef_), ("HM1", hm1.coef_), ("Separate OLS", sep), ("Centralised OLS", np.tile(cen, (len(tr), 1))), ("MixedLM (pooled, random intercept)", blup)]:
            row = {"run": run, "method": method, "a_rmse": _rmse_rows(coef, te)}
            for k, nm in enumerate(names):
                row[f"rmse_{nm}"] = _rmse_rows(coef[k : k + 1], te[k : k + 1])
            rows.append(row)
        row = {"run": run, "method": TRAINING_MEAN, "a_rmse": _training_mean_rmse(tr, te)}
        for k, nm in enumerate(names):
            row[f"rmse_{nm}"] = _training_mean_rmse(tr[k : k + 1], te[k : k + 1])
        rows.append(row)
        if run == 0:
            ci = hm2.coef_interval(0.9)
            for k, nm in enumerate(names):
                for j, f in enumerate(features):
                    coef_rows.append({"hospital": nm, "feature": f, "HM2 mean": float(hm2.coef_[k, j]), "HM2 90% CI": f"[{ci[k, j, 0]:.2f}, {ci[k, j, 1]:.2f}]", "Separate OLS": float(sep[k, j]), "included": bool(hm2.selected_features_[k, j])})
            phi_ci = hm2.phi_interval(0.9)
            phi_rows = [{"component": nm, "mean": float(hm2.phi_mean_[i]), "lower": float(phi_ci[i, 0]), "upper": float(phi_ci[i, 1])} for i, nm in enumerate(hm2.phi_names_)]
    write_csv(out_dir / "fedlin-heart.csv", rows)
    write_csv(out_dir / "fedlin-heart-coefficients.csv", coef_rows)
    metrics = ["a_rmse"] + [f"rmse_{nm}" for nm in names]
    summ = _summary(rows, ["method"], metrics)
    write_csv(out_dir / "fedlin-heart-summary.csv", summ)
    _write_report(
        out_dir, "fedlin-heart", "FedLin on UCI Heart Disease (4 hospitals)", quick, seed, _doc_markdown(run_heart) + f"\nFeatures: {', '.join(features)}.",
        [("Test RMSE (tens of bpm): mean (sd) over splits", markdown_table(_fmt_mean_sd(summ, ["method"], metrics))),
         ("HM2 site coefficients, first split", markdown_table(coef_rows)), ("HM2 posterior of phi, first split (90% intervals)", markdown_table(phi_rows))],
        time.perf_counter() - t0,
        claims=[{"metric": m, "what": w, "unit": "split", "pair_on": ["run"],
                 "pairs": [["HM2 (EP)", "Separate OLS"], ["HM2 (EP)", "Centralised OLS"], ["HM2 (EP)", "MixedLM (pooled, random intercept)"],
                           ["HM2 (EP)", "HM1"], ["Separate OLS", TRAINING_MEAN], ["HM1", TRAINING_MEAN]]}
                for m, w in (("a_rmse", "A-RMSE over the 4 hospitals"), ("rmse_Switzerland", "RMSE at Switzerland"))],
    )


def run_radon(out_dir: Path, *, quick: bool, seed: int) -> None:
    """Minnesota radon across 85 counties (not in the paper): federated HM2 vs MixedLM on pooled data.

    Model: ``log.radon`` on intercept, basement (floor) and county uranium; a random intercept per
    county (``random=[True, False, False]``), shared noise variance in :math:`\\phi`,
    :math:`\\mu\\sim\\mathcal N(0,10^2I)`, :math:`\\log\\tau\\sim\\mathcal N(0,1)`, :math:`\\log\\sigma^2\\sim\\mathcal N(0,1)`;
    EP with damping 0.7 and importance-sampled tilted moments. The anchor is statsmodels MixedLM
    (REML) on the pooled data (reference: 1.466, -0.668, 0.72). A second HM2 fit adds a random
    basement slope. Full run: 20 EP rounds; quick: 6 rounds.
    """
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    sites, counties, features = load_radon()
    mixed = mixedlm_pooled(sites, random=[0])
    fe, se = mixed.fe, mixed.se
    blup = mixed.random_effects[:, 0]
    rounds = 6 if quick else 20
    hm2 = FedHM2Regressor(scale="none", fit_intercept=False, random=[True, False, False], noise="shared", mu_scale=10.0, log_tau_prior=(0.0, 1.0), damping=0.7, n_rounds=rounds, n_posterior_draws=1000, random_state=seed).fit(sites)
    hm2s = FedHM2Regressor(scale="none", fit_intercept=False, random=[True, True, False], noise="shared", mu_scale=10.0, log_tau_prior=(0.0, 1.0), damping=0.7, n_rounds=rounds, n_posterior_draws=1000, random_state=seed).fit(sites)
    sd = np.sqrt(np.diag(hm2.phi_cov_))
    sds = np.sqrt(np.diag(hm2s.phi_cov_))
    fe_rows = [
        {"effect": f, "MixedLM (pooled)": float(fe[j]), "MixedLM se": float(se[j]), "HM2 EP mean": float(hm2.phi_mean_[j]), "HM2 EP sd": float(sd[j]),
         "abs diff / se": float(abs(hm2.phi_mean_[j] - fe[j]) / se[j]), "HM2 + random slope mean": float(hm2s.phi_mean_[j]), "HM2 + random slope sd": float(sds[j])}
        for j, f in enumerate(features)
    ]
    county_effect = hm2.coef_[:, 0] - hm2.phi_mean_[0]
    corr = float(np.corrcoef(county_effect, blup)[0, 1])
    var_rows = [
        {"quantity": "between-county sd of intercept", "MixedLM": float(np.sqrt(mixed.cov_re[0, 0])), "HM2 EP (exp(E log tau / 2))": float(np.exp(0.5 * hm2.phi_mean_[3]))},
        {"quantity": "residual sd", "MixedLM": float(np.sqrt(mixed.scale)), "HM2 EP (exp(E log tau / 2))": float(np.exp(0.5 * hm2.phi_mean_[4]))},
        {"quantity": "corr(county effects HM2, MixedLM BLUPs)", "MixedLM": 1.0, "HM2 EP (exp(E log tau / 2))": corr},
    ]
    write_csv(out_dir / "fedlin-radon.csv", fe_rows)
    write_csv(out_dir / "fedlin-radon-counties.csv", [{"county": c, "hm2_effect": float(e), "mixedlm_blup": float(b), "n_homes": len(s[1])} for c, e, b, s in zip(counties, county_effect, blup, sites)])
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.scatter(blup, county_effect, s=[4 + 2 * len(s[1]) ** 0.8 for s in sites], alpha=0.6)
    lim = [min(blup.min(), county_effect.min()), max(blup.max(), county_effect.max())]
    ax.plot(lim, lim, "k--", lw=1)
    ax.set(xlabel="MixedLM BLUP (pooled data)", ylabel="federated HM2 posterior mean", title="county intercept deviations")
    _save_figure(fig, out_dir / "fedlin-radon-counties.png")
    plt.close(fig)
    _write_report(
        out_dir, "fedlin-radon", "FedLin on Minnesota radon (85 counties)", quick, seed, _doc_markdown(run_radon),
        [("Fixed effects", markdown_table(fe_rows)), ("Variance components and county effects", markdown_table(var_rows))], time.perf_counter() - t0,
    )


EXPERIMENTS: dict[str, Callable[..., None]] = {
    "fedlin-sim-hm1": run_sim_hm1,
    "fedlin-sim-hm2": run_sim_hm2,
    "fedlin-uq": run_uq,
    "fedlin-student": run_student,
    "fedlin-cmapss": run_cmapss,
    "fedlin-heart": run_heart,
    "fedlin-radon": run_radon,
}
