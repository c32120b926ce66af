"""Command line: ``fedhier demo | fit | experiment | collab | flower``.

* ``fedhier demo`` -- the main job: Fed-mv-PPCA on the bundled Alzheimer data (G/K, 3 sites).
* ``fedhier fit --config fit.toml`` -- Fed-mv-PPCA on user data: one CSV file per site and a
  TOML file mapping columns to views (see ``docs/cli.md``).
* ``fedhier fit linear ...`` -- FedLin (hierarchical linear regression).
* ``fedhier experiment NAME [--quick]`` -- re-run an experiment of the docs
  (``fedhier experiment list`` names them).
* ``fedhier collab ...`` -- CollabDict anomaly detection.
* ``fedhier flower ...`` -- run a fit on real machines with Flower (``docs/flower.md``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import warnings
from pathlib import Path
from typing import Sequence

from .console import rounds_shown, run, site_timeout_flag

__all__ = ["main"]


def _total_budget(args, default_epsilon: float = 1.0) -> tuple[float, float] | None:
    """(epsilon, delta) of a total privacy budget from --dp / --epsilon / --delta, or None."""
    if getattr(args, "epsilon", None) is None and not getattr(args, "dp", False):
        return None
    return (default_epsilon if args.epsilon is None else args.epsilon, args.delta)


def _cmd_demo(args) -> int:
    from rich.console import Console

    from ..demo import DEFAULT_EPSILON, RECORD_LEVEL_FIT, demo_forecast, demo_privacy, run_demo

    console = Console(soft_wrap=True)  # one line per result, also when stdout is a file
    if args.unit is not None and _total_budget(args) is None:
        raise ValueError(f"--unit {args.unit} says what --dp protects: add --dp or --epsilon, or leave --unit out")
    unit = args.unit or "record"
    total_budget = _total_budget(args, DEFAULT_EPSILON[unit])
    per_release = (10.0, 0.01) if args.paper_dp else None
    outlook = demo_forecast(demo_privacy(total_budget, per_release, args.rounds, unit),
                            n_components=args.components, n_rounds=args.rounds)
    if outlook is not None and outlook.beats_mean:  # before any data is read; else run_demo warns with this line
        console.print(outlook.line(), markup=False)
    summary = run_demo(
        args.out,
        n_components=args.components,
        n_rounds=args.rounds,
        seed=args.seed,
        total_budget=total_budget,
        per_release=per_release,
        unit=unit,
        progress=not args.quiet,
        site_timeout=args.site_timeout,
        insecure_reproducible_noise=args.insecure_reproducible_noise,
    )
    console.print(f"[bold]Fed-mv-PPCA on {summary['data']}[/bold]")
    console.print(
        f"{summary['n_sites']} sites, scenario {summary['scenario']}, sizes {summary['site_sizes']}, "
        f"absent views {summary['missing_views']}"
    )
    if summary.get("privacy_unit") == "record":
        console.print(RECORD_LEVEL_FIT, markup=False)
    elif summary["rounds_run"] < summary["n_rounds"]:
        console.print(
            f"converged: stopped after {summary['rounds_run']} of at most {summary['n_rounds']} rounds "
            f"(the model's predictions changed by less than {summary['tol']:g} in the last round)"
        )
    elif summary["tol"] is None:
        console.print(f"ran all {summary['rounds_run']} rounds (the noise of the total privacy budget is calibrated for every round)")
    else:
        console.print(f"ran all {summary['rounds_run']} rounds (the model's predictions still changed by more than the stopping tolerance)")
    console.print(f"test MAE            {summary['test_mae']:.4f}")
    console.print(f"test MAE of each feature's training mean {summary['training_mean_test_mae']:.4f}")
    console.print(f"train MAE           {summary['train_mae_mean']:.4f} ± {summary['train_mae_std']:.4f} over sites")
    console.print(f"latent LDA accuracy {summary['latent_lda_accuracy']:.3f}")
    for row in summary["imputation"]:
        console.print(
            f"imputing '{row['view']}' ({row['hidden subjects']} hidden test subjects): MAE {row['Fed-mv-PPCA MAE']:.4f}"
            f" vs mean imputation {row['mean-imputation MAE']:.4f}"
        )
    console.print(f"bytes sent by sites {summary['bytes_sent']:,}")
    if "not_private" in summary:
        console.print(summary["not_private"], markup=False)
    elif "privacy_spent" in summary:
        if "privacy_unit" in summary:
            console.print(f"{summary['privacy_unit']}-level differential privacy, total epsilon {summary['epsilon']:g} "
                          f"at delta {summary['delta']:g} per site", markup=False)
        console.print(summary["scaling_outside_privacy"], markup=False)
        for site, spent in summary["privacy_spent"].items():
            console.print(f"privacy spent, site {site}: epsilon {spent['epsilon']:.3f} at delta {spent['delta']:g} ({spent['accountant']})")
    console.print(f"wall time           {summary['seconds']:.1f} s")
    console.print(f"report: {Path(args.out) / 'report.html'} (and report.md)")
    return 0


def _cmd_fit(args) -> int:
    from ..userdata import fit_forecast, fit_from_config
    from ..utils.results import check_output_folder
    from .sitedata import load_config

    check_output_folder(args.out)  # before anything is read
    if str(load_config(args.config).get("model", "")).startswith("fedlin"):  # the same file, a linear model
        from .linear import fit_linear_config

        if _total_budget(args) is not None:
            raise ValueError(f"{args.config}: --dp / --epsilon ask for a differentially private fit, but this file's model is "
                             "FedLin, which has no private version in fedhier (only Fed-mv-PPCA has one); run it without them")
        return fit_linear_config(args.config, out_dir=args.out, quiet=args.quiet, site_timeout=args.site_timeout)

    outlook = fit_forecast(load_config(args.config), args.config, _total_budget(args))  # before any site file is read
    if outlook is not None:
        line, hopeless = outlook
        if hopeless:
            warnings.warn(line, UserWarning, stacklevel=1)
        else:
            print(line, file=sys.stderr)  # standard output carries the summary's JSON only
    summary = fit_from_config(args.config, out_dir=args.out, total_budget=_total_budget(args), progress=not args.quiet,
                              site_timeout=args.site_timeout, insecure_reproducible_noise=args.insecure_reproducible_noise)
    shown = {k: v for k, v in summary.items() if k not in ("columns", "scaling")}  # both are in summary.json
    print(json.dumps(shown, indent=2))
    return 0


def _experiments() -> dict:
    registry: dict = {}
    for module in ("fedhier.experiments.mvppca", "fedhier.experiments.fedlin", "fedhier.experiments.collab"):
        try:
            mod = __import__(module, fromlist=["EXPERIMENTS"])
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):  # that family's experiments are not installed
                continue
            raise
        registry.update(getattr(mod, "EXPERIMENTS", {}))
    return registry


def _cmd_experiment(args) -> int:
    registry = _experiments()
    if args.name == "list":
        print("\n".join(sorted(registry)))
        return 0
    if args.name not in registry:
        raise ValueError(f"unknown experiment {args.name!r}; available: {', '.join(sorted(registry))}")
    out = Path(args.out) if args.out else Path("reports") / args.name
    with rounds_shown(None, args.name):  # the experiment's fits and rounds (those run in this process)
        registry[args.name](out, quick=args.quick, seed=args.seed)
    print(f"{args.name}: results in {out}")
    return 0


def _build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="fedhier", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"fedhier {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def privacy_flags(p, dp_help="client-level DP with a total budget (default epsilon 1)"):
        p.add_argument("--dp", action="store_true", help=dp_help)
        p.add_argument("--epsilon", type=float, default=None, help="total privacy budget epsilon per site for the whole fit")
        p.add_argument("--delta", type=float, default=1e-5, help="total delta per site (default 1e-5)")
        p.add_argument("--insecure-reproducible-noise", action="store_true",
                       help="derive the privacy noise from the seed so that a run can be repeated; the result is NOT "
                            "private (anyone with the seed can remove the noise) and claims no epsilon")

    p = sub.add_parser("demo", help="Fed-mv-PPCA on the bundled Alzheimer data (3 sites, G/K)")
    p.add_argument("--out", default="fedhier-report", help="report folder (default fedhier-report)")
    p.add_argument("--rounds", type=int, default=100, help="most communication rounds (default 100; stops earlier once converged)")
    p.add_argument("--components", type=int, default=5, help="number of latent components (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data split and the fit (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    site_timeout_flag(p)
    privacy_flags(p, "DP with a total budget per site; --unit says what it protects (default: one subject, epsilon 10)")
    p.add_argument("--unit", choices=("record", "site"), default=None,
                   help="what --dp protects: one subject (record, default epsilon 10: each site releases its noisy "
                        "moments once) or a whole site (site, default epsilon 1: noise in every round)")
    p.add_argument(
        "--paper-dp",
        action="store_true",
        help="the paper's DP semantics: epsilon 10, delta 0.01 per block per round (prints the true cumulative epsilon)",
    )
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("fit", help="Fed-mv-PPCA on your data (`fedhier fit linear -h` for FedLin)",
                       description="Fed-mv-PPCA on your sites' files (docs/cli.md); a file with model = \"fedlin-hm2\" "
                                   "runs FedLin. Subcommand: `fedhier fit linear -h` (FedLin from a TOML file or flags).")
    p.add_argument("--config", required=True, help="TOML file: [views], [sites] or file + site_column, options (docs/cli.md)")
    p.add_argument("--out", default="fedhier-fit", help="result folder (default fedhier-fit)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    site_timeout_flag(p)
    privacy_flags(p)
    p.set_defaults(func=_cmd_fit)

    p = sub.add_parser("experiment", help="re-run an experiment of the docs")
    p.add_argument("name", help="the experiment; `list` prints their names")
    p.add_argument("--quick", action="store_true", help="small version (minutes), as run by CI")
    p.add_argument("--out", default=None, help="output folder (default reports/NAME)")
    p.add_argument("--seed", type=int, default=0, help="seed of the experiment's splits and fits (default 0)")
    p.set_defaults(func=_cmd_experiment)

    # dispatched by main() before parsing; listed here so that `fedhier -h` shows them
    sub.add_parser("collab", add_help=False, help="CollabDict: serverless collaborative anomaly detection (`fedhier collab -h`)")
    sub.add_parser("flower", add_help=False, help="run a fit on real machines with Flower (`fedhier flower -h`)")
    return parser


def _command_name(argv: list[str]) -> str:
    """The command as typed, without its options (``fedhier collab fit``), for messages."""
    words = list(itertools.takewhile(lambda word: not word.startswith("-"), argv))[:2]
    if words[:1] not in (["fit"], ["collab"], ["flower"], ["experiment"]):  # commands without subcommands
        words = words[:1]
    return " ".join(["fedhier", *words])


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``fedhier ARGV``; the exit code (0, 2 after ``fedhier: error: ...`` for a user's mistake; see
    :mod:`fedhier.cli.console`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return run(lambda: _dispatch(argv), _command_name(argv))


def _dispatch(argv: list[str]) -> int:
    if argv[:2] == ["fit", "linear"]:
        from .linear import cli_fit_linear

        return int(cli_fit_linear(argv[2:]) or 0)
    if argv[:1] == ["flower"]:
        from .flower import cli_flower

        return int(cli_flower(argv[1:]) or 0)
    if argv[:1] == ["collab"]:
        from .collab import cli_collab

        return int(cli_collab(argv[1:]) or 0)
    args = _build_parser().parse_args(argv)
    return int(args.func(args) or 0)

