"""``fedhier fit linear``: FedLin (HM1 / HM2) on the sites' rows, from a TOML file or from flags.

``fedhier fit linear --config fit.toml`` reads the data model of ``docs/cli.md`` (``[sites]`` or
``file`` + ``site_column``; ``id``, ``scale``, ``partial``) with ``target``, ``features`` and the
options; the flag form ``fedhier fit linear data.csv --site COL --target Y --features A,B`` builds
the same configuration.  Flags given with ``--config`` override its keys.
"""

from __future__ import annotations

import argparse
import inspect
import shlex
from pathlib import Path
from typing import Any

import numpy as np

from ..data.sitefiles import SiteDataError, join_problems
from ..deploy._toml import FEDLIN_OPTIONS, refuse_privacy_keys
from ..utils.io import write_csv, write_json
from ..utils.results import check_inputs_outside, check_output_folder, result_folder
from ..utils.untrusted import check_outputs_spare_inputs
from .console import rounds_shown, run, site_timeout_flag
from .sitedata import check_columns, complete_rows, load_config, scale_sites, site_data, site_warnings, write_summary

_INTERCEPT = "(intercept)"
#: the ``site`` of coefficients.csv's rows of the population coefficients (HM2's Gaussian hierarchy)
_POPULATION = "(population)"
_DEFAULT_OUT = "fedhier-fit-linear"
#: option -> default, as the flags and a TOML file set them
_DEFAULTS = {"model": "hm2", "prior": "gaussian", "intercept": False, "random": None, "noise": "local", "mu_scale": 10.0,
             "n_rounds": 20, "level": 0.9, "eta": None, "seed": 0, "scale": "none", "partial": "missing", "id": None}


def add_fit_linear_arguments(parser) -> None:
    """Arguments of ``fedhier fit linear``."""
    parser.add_argument("csv", type=Path, nargs="?", default=None,
                        help="one CSV file holding every site's rows (with --site); or use --config")
    parser.add_argument("--config", type=Path, default=None,
                        help="TOML file: [sites] or file + site_column, target, features, options (docs/cli.md)")
    parser.add_argument("--site", default=None, help="the CSV's column naming the site of each row")
    parser.add_argument("--target", default=None, help="response column")
    parser.add_argument("--features", default=None, help="comma-separated predictor columns")
    parser.add_argument("--model", choices=["hm2", "hm1"], default=None, help="HM2 (EP, intervals; default) or HM1 (MAP)")
    parser.add_argument("--prior", choices=["gaussian", "lasso", "ridge"], default=None, help="HM2 prior (default gaussian)")
    parser.add_argument("--intercept", action="store_true", default=None, help="add a column of ones (coefficient '(intercept)')")
    parser.add_argument("--random", default=None, help="comma-separated columns with site-varying coefficients (gaussian prior; default all)")
    parser.add_argument("--noise", choices=["local", "shared"], default=None, help="gaussian prior: site-local log sigma_k or one shared log sigma^2 in phi")
    parser.add_argument("--mu-scale", type=float, default=None, help="gaussian prior: mu ~ N(0, mu_scale^2 I) (default 10, vague)")
    parser.add_argument("--rounds", type=int, default=None, help="most rounds (default 20)")
    parser.add_argument("--level", type=float, default=None, help="level of the credible intervals (default 0.9)")
    parser.add_argument("--eta", type=float, default=None, help="HM1 step size (default: chosen from the data, half the largest stable step)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the run (default 0)")
    parser.add_argument("--scale", choices=["standard", "minmax", "none"], default=None,
                        help="scale every column across the sites before the fit (default none)")
    parser.add_argument("--id", default=None, help="column identifying each row (checked and never used as a feature; FedLin writes no per-row output)")
    parser.add_argument("--out", type=Path, default=None, help="result folder (default fedhier-fit-linear)")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    site_timeout_flag(parser)


def cli_fit_linear(argv) -> int:
    """``fedhier fit linear``: fit HM1 or HM2; write the result folder.

    ``argv`` is the list of arguments after ``fit linear`` (or an ``argparse.Namespace`` built with
    :func:`add_fit_linear_arguments`, whose errors are raised). Writes ``coefficients.csv`` (site,
    feature, estimate, and for HM2 the interval and inclusion; with a scaling also in the files'
    units), ``phi.csv`` (HM2), ``history.json``, ``model.npz``, ``summary.json``, ``summary.md``
    and the report (``report.html``, ``report.md``, ``figures/``). Returns 0, or 2 after printing
    ``fedhier: error: ...`` for bad input.
    """
    if isinstance(argv, argparse.Namespace):
        return _fit_linear(_config_of(argv), command=None)
    parser = argparse.ArgumentParser(prog="fedhier fit linear", description="FedLin: federated hierarchical linear regression (HM1 / HM2).")
    add_fit_linear_arguments(parser)
    args = parser.parse_args(list(argv))

    def fit() -> int:
        check_output_folder(args.out or _DEFAULT_OUT)  # before anything is read
        return _fit_linear(_config_of(args), command="fedhier fit linear " + shlex.join(str(a) for a in argv))

    return run(fit, "fedhier fit linear")


def _config_of(args: argparse.Namespace) -> dict[str, Any]:
    """The configuration the flags (and ``--config``) describe: one dict in the TOML's shape."""
    if args.config is not None:
        config = load_config(args.config)
        config["_source"], config["_base"] = str(args.config), Path(args.config).parent
    elif args.csv is not None:
        if args.site is None or args.target is None or args.features is None:
            raise ValueError("fedhier fit linear CSV needs --site, --target and --features (or use --config fit.toml)")
        config = {"file": str(args.csv), "_source": str(args.csv), "_base": Path(".")}
    else:
        raise ValueError("fedhier fit linear needs a CSV file with --site, --target, --features, or --config fit.toml")
    flags = {"site_column": args.site, "target": args.target, "model": args.model, "prior": args.prior,
             "intercept": args.intercept, "noise": args.noise, "mu_scale": args.mu_scale, "n_rounds": args.rounds,
             "level": args.level, "eta": args.eta, "seed": args.seed, "scale": args.scale, "id": args.id,
             "features": None if args.features is None else [c.strip() for c in args.features.split(",") if c.strip()],
             "random": None if args.random is None else [c.strip() for c in args.random.split(",") if c.strip()]}
    config.update({k: v for k, v in flags.items() if v is not None})
    config["_out"] = Path(args.out) if args.out is not None else Path(_DEFAULT_OUT)
    config["_quiet"] = bool(getattr(args, "quiet", False))
    config["_site_timeout"] = getattr(args, "site_timeout", None)
    return config


def _model_name(config: dict[str, Any]) -> str:
    model = str(config.get("model", "hm2")).removeprefix("fedlin-")
    if model not in ("hm1", "hm2"):
        raise ValueError(f"{config['_source']}: model must be 'hm2' or 'hm1' (or 'fedlin-hm2', 'fedlin-hm1') for a linear fit, got {config.get('model')!r}")
    return model


def fit_linear_config(config_path: str | Path, *, out_dir: str | Path, quiet: bool = False,
                      site_timeout: float | None = None) -> int:
    """``fedhier fit --config`` with ``model = "fedlin-hm2"`` (or hm1): the same fit as ``fit linear --config``."""
    config = load_config(config_path)
    config.update(_source=str(config_path), _base=Path(config_path).parent, _out=Path(out_dir), _quiet=quiet,
                  _site_timeout=site_timeout)
    return _fit_linear(config, command=f"fedhier fit --config {Path(config_path).name}")


def _fit_linear(config: dict[str, Any], command: str | None) -> int:
    """The fit of ``config``; its result folder ``config["_out"]`` appears with all its files or not at all."""
    out = Path(config["_out"])
    with result_folder(out) as staging:
        summary = _fit_and_write(config, command, out, staging)
    print(f"fitted FedLin {summary['model_family'].removeprefix('fedlin-').upper()} on {len(summary['sites'])} sites "
          f"({', '.join(summary['sites'])}); {summary['rounds_run']} rounds; wrote {out}\nreport: {summary['report']}", flush=True)
    return 0


def _fit_and_write(config: dict[str, Any], command: str | None, out: Path, staging: Path) -> dict[str, Any]:
    """:func:`_fit_linear`, writing into ``staging`` the files that will be ``out``'s; the summary."""
    from ..estimators.fedlin import FedHM1Regressor, FedHM2Regressor, name_components

    source = config["_source"]
    refuse_privacy_keys(config, source, "a FedLin fit")
    opt = {k: config.get(k, d) for k, d in _DEFAULTS.items()}
    model = _model_name(config)
    target, features = config.get("target"), config.get("features")
    if not isinstance(target, str) or not target:
        raise ValueError(f"{source}: target = \"column\" (the response) is required for a linear fit")
    if not isinstance(features, list) or not features or not all(isinstance(c, str) and c for c in features):
        raise ValueError(f"{source}: features = [\"column\", ...] (the predictors) is required for a linear fit")
    data = site_data(config, source, config["_base"])
    columns = [*features, target]
    check_columns(data, {"target": [target], "features": features}, exclude=[config.get("site_column") or "", data.id or ""])
    notes: list[str] = []
    sites, kept, problems = complete_rows(data, columns, "target and features", notes)
    if problems:
        raise SiteDataError(join_problems(problems))
    scaling, _ = scale_sites(data, columns, sites, source=source, seed=opt["seed"], aggregation=config.get("aggregation", "plain"))
    sites = [scaling.transform(columns, v) for v in sites]
    sites = [(v[:, :-1], v[:, -1]) for v in sites]
    names = data.names
    outputs = ["phi.csv", "coefficients.csv", "history.json", "model.npz", "summary.md", "summary.json"]
    inputs = [*data.inputs, *([source] if source.endswith(".toml") else [])]
    check_outputs_spare_inputs([out / name for name in outputs], inputs)
    check_inputs_outside(out, inputs)
    names_out = list(features)
    if opt["intercept"]:
        names_out = [_INTERCEPT, *names_out]
        sites = [(np.column_stack([np.ones(len(y)), X]), y) for X, y in sites]
    params = {k: config[k] for k in FEDLIN_OPTIONS[f"fedlin-{model}"] if k in config}  # the estimator's own options
    with site_warnings(names):
        if model == "hm1":
            est = _build(FedHM1Regressor, n_rounds=opt["n_rounds"], random_state=opt["seed"],
                         site_timeout=config.get("_site_timeout"), **params)
            with rounds_shown(opt["n_rounds"], "FedLin HM1 rounds", quiet=config.get("_quiet", False)):
                _fit(est, sites, data.scale)
            rows = [{"site": n, "feature": f, "estimate": float(est.coef_[k, j])} for k, n in enumerate(names) for j, f in enumerate(names_out)]
        else:
            for key in ("prior", "noise", "mu_scale", "level"):
                params.setdefault(key, _DEFAULTS[key])
            if "aggregation" in config:  # "secure": the EP deltas are summed securely
                params["aggregation"] = config["aggregation"]
            if data.scale != "none":  # scaled above; otherwise the estimator scales by the sds across the sites
                params["scale"] = "none"
            if params.get("random") is not None:
                wanted = params["random"] if isinstance(params["random"], list) else [params["random"]]
                unknown = [c for c in wanted if c not in names_out]
                if unknown:
                    raise ValueError(f"random names column(s) {unknown} that are not features; features: {names_out}")
                params["random"] = [f in wanted for f in names_out]
            est = _build(FedHM2Regressor, n_rounds=opt["n_rounds"], random_state=opt["seed"],
                         site_timeout=config.get("_site_timeout"), **params)
            with rounds_shown(opt["n_rounds"], "FedLin HM2 rounds", quiet=config.get("_quiet", False)):
                _fit(est, sites, data.scale)
            ci = est.coef_interval(opt["level"])
            rows = [
                {"site": n, "feature": f, "estimate": float(est.coef_[k, j]), "lower": float(ci[k, j, 0]), "upper": float(ci[k, j, 1]), "included": bool(est.selected_features_[k, j])}
                for k, n in enumerate(names) for j, f in enumerate(names_out)
            ]
            if est.prior == "gaussian" and not est._standardizes():
                rows += _population_rows(est, names_out, opt["level"])
            phi_ci = est.phi_interval(opt["level"])
            components = name_components(est.model_.phi_names, names_out)
            write_csv(staging / "phi.csv", [{"component": nm, "mean": float(est.phi_mean_[i]), "lower": float(phi_ci[i, 0]), "upper": float(phi_ci[i, 1])} for i, nm in enumerate(components)])
    if data.scale != "none":
        _add_original_units(rows, est, scaling, features, target, names)
    original = [r for r in rows if r["site"] == _POPULATION and data.scale != "none"]
    write_csv(staging / "coefficients.csv", rows)
    write_json(staging / "history.json", est.history_)
    est.save(staging / "model.npz")
    from ..report.fedlin import write_fedlin_report

    label = "HM2 (federated expectation propagation)" if model == "hm2" else "HM1 (federated MAP)"
    units = ("" if data.scale == "none" else f" Every column was scaled ({data.scale}) across the sites before the fit; the "
             "report's figures are in scaled units, the population coefficients also in the files' units, and "
             "coefficients.csv gives every coefficient in both.")
    intro = (
        f"Hierarchical linear regression of {target} on {', '.join(names_out)} across {len(sites)} sites "
        f"({sum(len(y) for _, y in sites)} rows, {data.layout}), fitted with {label}"
        + (f" and the {opt['prior']} prior" if model == "hm2" else "") + ". Each site keeps its rows; "
        "the sites share one population model and each gets its own coefficients." + units
    )
    write_fedlin_report(staging, est, sites, site_names=names, features=names_out, target=target,
                        title=f"FedLin fit ({model.upper()})", intro=intro, command=command, level=opt["level"],
                        scaling=data.scale, original=original)
    summary = {"model_family": f"fedlin-{model}", "sites": names, "rows": {n: len(y) for n, (_, y) in zip(names, sites)},
               "data": data.layout, "target": target, "features": features, "intercept": bool(opt["intercept"]),
               "id": data.id, "scale": data.scale, "scaling": scaling.to_dict(), "partial": data.partial,
               "n_rounds": opt["n_rounds"], "rounds_run": len(est.history_), "model": str(out / "model.npz"),
               "report": str(out / "report.html")}
    write_summary(staging, summary, title=f"fedhier fit linear ({model})", notes=notes, tables=[("Coefficients", rows)])
    return summary


def _build(cls, **params):
    """The estimator with ``params``; a constructor that adds its own intercept is told not to (the CLI adds a column)."""
    if "fit_intercept" in inspect.signature(cls).parameters:
        params["fit_intercept"] = False
    return cls(**params)


def _fit(est, sites, scale: str) -> None:
    try:
        est.fit(sites)
    except (ValueError, np.linalg.LinAlgError) as exc:
        hint = ("; the columns are in raw units: set scale = \"standard\" (flag --scale standard)" if scale == "none" else "")
        raise ValueError(f"the fit failed: {exc}{hint}") from None


def _population_rows(est, names_out, level) -> list[dict]:
    """coefficients.csv's rows of the population coefficients: posterior mean, ``level`` interval and between-site
    sd (the square root of the hierarchy's variance tau) of each design column, in the units the fit was given."""
    ci, _ = est.population_interval(level)
    return [{"site": _POPULATION, "feature": f, "estimate": float(est.population_coef_[j]), "lower": float(ci[j, 0]),
             "upper": float(ci[j, 1]), "between_site_sd": float(est.between_site_sd_[j])} for j, f in enumerate(names_out)]


def _add_original_units(rows, est, scaling, features, target, names) -> None:
    """Coefficients in the files' units: slope_j = s_y b_j / s_j; intercept = c_y + s_y (b_0 + a_k - sum_j b_j c_j / s_j).

    ``a_k``: the estimator's own intercept (0 without one).  Slope intervals map the same way
    (a positive rescaling); the intercept's interval depends on the joint posterior and is left empty.
    The population rows' between-site sds map as the slopes do; the intercept's, the sd of
    c_y + s_y (b_0 - sum_j b_j c_j / s_j) over sites, is s_y sqrt(sd_0^2 + sum_j sd_j^2 c_j^2 / s_j^2).
    """
    cx, sx = scaling.center[: len(features)], scaling.scale[: len(features)]
    cy, sy = scaling.center[-1], scaling.scale[-1]
    intercepts = np.asarray(getattr(est, "intercept_", np.zeros(len(names))), dtype=float).reshape(-1)
    by_site: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_site.setdefault(row["site"], {})[row["feature"]] = row
    for k, name in enumerate(names):
        site_rows = by_site[name]
        b = np.array([site_rows[f]["estimate"] for f in features])
        for j, f in enumerate(features):
            r = site_rows[f]
            r["estimate_original_units"] = float(sy * b[j] / sx[j])
            if "lower" in r:
                r["lower_original_units"] = float(sy * r["lower"] / sx[j])
                r["upper_original_units"] = float(sy * r["upper"] / sx[j])
        if _INTERCEPT in site_rows:
            b0 = site_rows[_INTERCEPT]["estimate"] + (intercepts[k] if intercepts.size == len(names) else 0.0)
            site_rows[_INTERCEPT]["estimate_original_units"] = float(cy + sy * (b0 - np.sum(b * cx / sx)))
    population = by_site.get(_POPULATION)
    if population:
        b = np.array([population[f]["estimate"] for f in features])
        sd = np.array([population[f]["between_site_sd"] for f in features])
        for j, f in enumerate(features):
            r = population[f]
            r.update(estimate_original_units=float(sy * b[j] / sx[j]), lower_original_units=float(sy * r["lower"] / sx[j]),
                     upper_original_units=float(sy * r["upper"] / sx[j]), between_site_sd_original_units=float(sy * sd[j] / sx[j]))
        if _INTERCEPT in population:
            r = population[_INTERCEPT]
            r["estimate_original_units"] = float(cy + sy * (r["estimate"] - np.sum(b * cx / sx)))
            r["between_site_sd_original_units"] = float(sy * np.sqrt(r["between_site_sd"] ** 2 + np.sum((sd * cx / sx) ** 2)))
