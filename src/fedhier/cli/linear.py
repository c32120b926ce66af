"""``fedhier fit linear``: FedLin (HM1 / HM2) from a CSV whose rows belong to sites."""

from __future__ import annotations

import argparse
import csv
import shlex
from pathlib import Path

import numpy as np

from ..estimators.fedlin import FedHM1Regressor, FedHM2Regressor
from ..utils.io import atomic_write_text, markdown_table, write_csv, write_json
from ..utils.untrusted import check_outputs_spare_inputs
from .console import rounds_shown, run

def add_fit_linear_arguments(parser) -> None:
    """Arguments of ``fedhier fit linear``."""
    parser.add_argument("csv", type=Path, help="CSV file with a header row")
    parser.add_argument("--site", required=True, help="column naming the site of each row")
    parser.add_argument("--target", required=True, help="response column")
    parser.add_argument("--features", required=True, help="comma-separated predictor columns")
    parser.add_argument("--model", choices=["hm2", "hm1"], default="hm2", help="hm2: federated expectation propagation with intervals (default); hm1: federated MAP")
    parser.add_argument("--prior", choices=["gaussian", "lasso", "ridge"], default="gaussian", help="HM2 prior of the site coefficients (default gaussian)")
    parser.add_argument("--intercept", action="store_true", help="add a column of ones (prior=gaussian, hm1)")
    parser.add_argument("--random", default=None, help="comma-separated columns with site-varying coefficients (gaussian prior; default all)")
    parser.add_argument("--noise", choices=["local", "shared"], default="local", help="gaussian prior: site-local log sigma_k or one shared log sigma^2 in phi")
    parser.add_argument("--mu-scale", type=float, default=10.0, help="gaussian prior: mu ~ N(0, mu_scale^2 I) (default 10, vague)")
    parser.add_argument("--rounds", type=int, default=20, help="most communication rounds (default 20; HM2 stops earlier once converged)")
    parser.add_argument("--level", type=float, default=0.9, help="HM2 credible level of the intervals and of feature inclusion (default 0.9)")
    parser.add_argument("--eta", type=float, default=1e-4, help="HM1 step size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fit (default 0)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--quiet", action="store_true", help="no progress display")


def _read_sites(path: Path, site_col: str, target: str, features: list[str]):
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ValueError(f"{path}: no rows")
    missing = [c for c in [site_col, target, *features] if c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: column(s) {missing} not found")
    names = list(dict.fromkeys(r[site_col] for r in rows))
    sites = []
    for name in names:
        part = [(i, r) for i, r in enumerate(rows, start=1) if r[site_col] == name]
        values = np.empty((len(part), len(features) + 1))
        for k, (i, r) in enumerate(part):
            for j, c in enumerate([*features, target]):
                try:
                    values[k, j] = float(r[c])
                except (TypeError, ValueError):  # the cell's text is not quoted: error text may be shared
                    raise ValueError(f"{path}: site {name!r}: non-numeric value in column {c!r}, row {i}") from None
        sites.append((values[:, :-1], values[:, -1]))
    return names, sites


def cli_fit_linear(argv) -> int:
    """``fedhier fit linear``: fit HM1 or HM2 to a CSV with a site column; write results to ``--out``.

    ``argv`` is the list of arguments after ``fit linear`` (or an ``argparse.Namespace`` built with
    :func:`add_fit_linear_arguments`). Writes ``coefficients.csv`` (site, feature, estimate, and for
    HM2 the interval and inclusion), ``phi.csv`` (HM2), ``summary.md``, ``history.json``,
    ``model.npz`` and the report (``report.html``, ``report.md``, ``figures/``). Returns 0, or 2 after printing ``fedhier: error: ...`` for bad input.
    """
    if isinstance(argv, argparse.Namespace):
        return _fit_linear(argv)
    parser = argparse.ArgumentParser(prog="fedhier fit linear", description="FedLin: federated hierarchical linear regression (HM1 / HM2).")
    add_fit_linear_arguments(parser)
    args = parser.parse_args(list(argv))
    return run(lambda: _fit_linear(args, command="fedhier fit linear " + shlex.join(str(a) for a in argv)), "fedhier fit linear")


def _fit_linear(args: argparse.Namespace, command: str | None = None) -> int:
    features = [c.strip() for c in args.features.split(",") if c.strip()]
    names, sites = _read_sites(Path(args.csv), args.site, args.target, features)
    outputs = ["phi.csv", "coefficients.csv", "history.json", "model.npz", "summary.md"]
    check_outputs_spare_inputs([Path(args.out) / name for name in outputs], [args.csv])
    if args.intercept:
        features = ["(intercept)", *features]
        sites = [(np.column_stack([np.ones(len(y)), X]), y) for X, y in sites]
    out = Path(args.out)
    if args.model == "hm1":
        with rounds_shown(args.rounds, "FedLin HM1 rounds", quiet=getattr(args, "quiet", False)):
            est = FedHM1Regressor(fit_intercept=False, n_rounds=args.rounds, eta=args.eta, random_state=args.seed).fit(sites)
        rows = [{"site": n, "feature": f, "estimate": float(est.coef_[k, j])} for k, n in enumerate(names) for j, f in enumerate(features)]
    else:
        random = None
        if args.random:
            wanted = {c.strip() for c in args.random.split(",")}
            unknown = wanted - set(features)
            if unknown:
                raise ValueError(f"--random names unknown column(s) {sorted(unknown)}")
            random = [f in wanted for f in features]
        with rounds_shown(args.rounds, "FedLin HM2 rounds", quiet=getattr(args, "quiet", False)):
            est = FedHM2Regressor(fit_intercept=False, prior=args.prior, random=random, noise=args.noise, mu_scale=args.mu_scale, n_rounds=args.rounds, level=args.level, random_state=args.seed).fit(sites)
        ci = est.coef_interval(args.level)
        rows = [
            {"site": n, "feature": f, "estimate": float(est.coef_[k, j]), "lower": float(ci[k, j, 0]), "upper": float(ci[k, j, 1]), "included": bool(est.selected_features_[k, j])}
            for k, n in enumerate(names) for j, f in enumerate(features)
        ]
        phi_ci = est.phi_interval(args.level)
        write_csv(out / "phi.csv", [{"component": nm, "mean": float(est.phi_mean_[i]), "lower": float(phi_ci[i, 0]), "upper": float(phi_ci[i, 1])} for i, nm in enumerate(est.phi_names_)])
    write_csv(out / "coefficients.csv", rows)
    write_json(out / "history.json", est.history_)
    est.save(out / "model.npz")
    atomic_write_text(out / "summary.md", f"# fedhier fit linear ({args.model})\n\n" + markdown_table(rows))
    from ..report.fedlin import write_fedlin_report

    model = "HM2 (federated expectation propagation)" if args.model == "hm2" else "HM1 (federated MAP)"
    intro = (
        f"Hierarchical linear regression of {args.target} on {', '.join(features)} across {len(sites)} sites "
        f"({sum(len(y) for _, y in sites)} rows from {Path(args.csv).name}), fitted with {model}"
        + (f" and the {args.prior} prior" if args.model == "hm2" else "") + ". Each site keeps its rows; "
        "the sites share one population model and each gets its own coefficients."
    )
    write_fedlin_report(out, est, sites, site_names=[str(n) for n in names], features=features, target=args.target,
                        title=f"FedLin fit ({args.model.upper()})", intro=intro, command=command, level=args.level)
    return 0
