"""``fedhier fit``: Fed-mv-PPCA on the sites' files described by a TOML file (``docs/cli.md``).

Example ``fit.toml`` (paths relative to the TOML file)::

    n_components = 2          # optional, default 5
    n_rounds = 100            # optional, default 100
    seed = 0                  # optional
    # also optional: n_init, n_local_iter, n_first_iter, tol, init, local_tol, ig_solver, sigma2_prior,
    # epsilon, delta (a total DP budget per site), privacy_unit ("site", the default, or "record"),
    # aggregation ("plain" or "secure")
    id = "id"                 # optional: a column carried to the latent CSVs
    scale = "standard"        # "standard", "minmax" or "none" (default), fitted across the sites
    # [ranges] age = [18, 100] ... : public bounds; scale = "minmax" with a range per column sends nothing
    # (a private fit refuses a scaling fitted on the sites' data unless scaling_outside_privacy = true)
    partial = "missing"       # a subject with part of a view lacks the view ("refuse": an error)

    [views]                   # view name -> list of column names
    clinical = ["age", "trestbps", "chol"]
    exercise = ["thalch", "oldpeak", "exang"]

    [sites]                   # site name -> its file; or: file = "all.csv" and site_column = "hospital"
    cleveland = "cleveland.csv"
    hungary = "hungary.csv"

A site file that lacks (or leaves empty) a view's column does not measure that view; a view
that no site measures, and a configured column that no file has, are errors.  Empty cells,
``NA`` and ``NaN`` are missing; ``True``/``False``/``yes``/``no`` are 1/0.  Everything is
checked before any work, and every problem found is listed.  Error messages name the site,
view, column and row of a problem, never a cell's content (a message may reach the
coordinator of a federated fit).  No output may replace an input file.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from .cli.sitedata import SiteData, check_columns, load_config, scale_sites, site_data, site_warnings, write_summary
from .data.sitefiles import SiteDataError, join_problems, read_site_table
from .deploy._toml import check_privacy_unit
from .utils.io import write_csv, write_json
from .privacy.sampling import NOT_PRIVATE
from .utils.results import check_inputs_outside, result_folder
from .utils.untrusted import check_outputs_spare_inputs

__all__ = ["read_views", "read_site_table", "fit_from_config", "fit_forecast", "SiteDataError"]

_OPTIONS = {"n_components": 5, "n_rounds": 100, "n_first_iter": 30, "n_init": 1, "init": "pca",
            "ig_solver": "newton", "aggregation": "plain"}


def check_views(views: Any, source: str) -> dict[str, list[str]]:
    """The ``[views]`` table: view name -> non-empty list of distinct column names, no column in two views."""
    if not isinstance(views, dict) or not views:
        raise ValueError(f"{source}: a [views] table mapping view names to column lists is required")
    seen: dict[str, str] = {}
    for view, columns in views.items():
        if not isinstance(columns, list) or not columns or not all(isinstance(c, str) and c for c in columns):
            raise ValueError(f"{source}: view {view!r} must list its columns as a non-empty list of strings")
        if len(set(columns)) != len(columns):
            raise ValueError(f"{source}: view {view!r} lists a column twice")
        for c in columns:
            if c in seen:
                raise ValueError(f"{source}: column {c!r} is in both view {seen[c]!r} and view {view!r}")
            seen[c] = view
    return views


def read_views(data: SiteData, views: dict[str, list[str]], notes: list[str]) -> list[dict[str, np.ndarray]]:
    """Every site's views (``read_site_table``), all sites' problems in one error; a view no site measures is refused."""
    check_columns(data, {f"view {v!r}": c for v, c in views.items()}, exclude=[data.id or ""])
    sites, problems = [], []
    for table in data.tables:
        try:
            sites.append(read_site_table(table, views, table.site, partial=data.partial, notes=notes))
        except SiteDataError as exc:
            problems.append(str(exc))
    if problems:
        raise SiteDataError(join_problems(problems))
    nowhere = [v for v in views if not any(v in s for s in sites)]
    if nowhere:
        raise ValueError(f"view(s) {nowhere} measured at no site: at every site a column is absent or empty "
                         f"({', '.join(f'{v}: {views[v]}' for v in nowhere)})")
    return sites


def fit_from_config(
    config_path: str | Path, *, out_dir: str | Path, total_budget: tuple[float, float] | None = None, progress: bool = True,
    site_timeout: float | None = None,
    insecure_reproducible_noise: bool = False,
) -> dict[str, Any]:
    """Fit Fed-mv-PPCA on the sites of a configuration; write model, latents, summary and report.

    ``site_timeout``: seconds a site's step may take before the site is left out of that round
    (``FedMVPPCA(site_timeout=...)``); None waits for every site.

    The configuration's ``seed`` seeds what is not secret (starts); each site's privacy noise
    comes from its operating system, so two private fits differ.  ``insecure_reproducible_noise``
    derives the noise from the seed instead: the result then says it is not private.

    ``out_dir`` is checked before anything is read, and appears with all its files or not at all
    (:func:`fedhier.utils.results.result_folder`)."""
    with result_folder(out_dir) as staging:
        return _fit_and_write(Path(config_path), Path(out_dir), staging, total_budget, progress, site_timeout,
                              insecure_reproducible_noise)


def _fit_and_write(config_path: Path, out: Path, staging: Path, total_budget: tuple[float, float] | None,
                   progress: bool, site_timeout: float | None, insecure_reproducible_noise: bool) -> dict[str, Any]:
    """:func:`fit_from_config`, writing into ``staging`` the files that will be ``out``'s."""
    from .data.validation import check_sites
    from .estimators.mvppca import FedMVPPCA
    from .models.mvppca.dp import DPConfig
    from .models.mvppca.forecast import mvppca_forecast
    from .privacy.analyze_gauss import RecordDP

    config = load_config(config_path)
    source = str(config_path)
    views = check_views(config.get("views"), source)
    data = site_data(config, config_path)
    notes: list[str] = []
    sites = read_views(data, views, notes)
    names = data.names
    columns = [c for cols in views.values() for c in cols]
    if total_budget is None and config.get("epsilon") is not None:
        total_budget = (float(config["epsilon"]), float(config.get("delta", 1e-5)))
    private = total_budget is not None
    unit = _privacy_unit(config, source, private=private, scale=data.scale)
    all_declared = set(columns) <= set(data.ranges)  # public bounds for every column: nothing sent to scale
    scaling, disclosure = scale_sites(data, columns, [_all_columns(s, views) for s in sites], private=private,
                                      source=source, seed=config.get("seed", 0), aggregation=config.get("aggregation", "plain"))
    sites = [{v: scaling.transform(views[v], X) for v, X in s.items()} for s in sites]
    options = {k: config.get(k, d) for k, d in _OPTIONS.items()}
    with site_warnings(names, data.scale):
        sites, _ = check_sites(sites, n_components=options["n_components"], site_names=names)  # errors name the sites
    privacy = None
    if unit == "record":  # one release of noisy moments per site; the fit is post-processing
        privacy = RecordDP(*total_budget)
        outlook = mvppca_forecast({v: len(c) for v, c in views.items()}, options["n_components"], len(sites), privacy,
                                  n_subjects=sum(len(next(iter(s.values()))) for s in sites))
        if not outlook.beats_mean:  # the subjects can only be counted once the files are read
            warnings.warn(outlook.line(), UserWarning, stacklevel=2)
    elif private:
        # the default EM prior update also releases two posterior-spread scalars per view and round
        privacy = DPConfig.total(*total_budget, n_rounds=options["n_rounds"], n_views=len({v for s in sites for v in s}), spread=True)
    model = FedMVPPCA(
        **options,
        **({"n_local_iter": config["n_local_iter"]} if "n_local_iter" in config else {}),  # else FedMVPPCA's default
        random_state=config.get("seed", 0),
        **({"tol": None if config["tol"] == "none" else config["tol"]} if "tol" in config else {}),  # else FedMVPPCA's default
        local_tol=None if config.get("local_tol") == "none" else config.get("local_tol", 1e-8),
        sigma2_prior=None if config.get("sigma2_prior") == "none" else config.get("sigma2_prior", "weak"),
        privacy=privacy,
        progress=progress,
        site_timeout=site_timeout,
        insecure_reproducible_noise=insecure_reproducible_noise,
    )
    outputs = [out / "model.npz", out / "summary.json", out / "summary.md", *(out / f"latent_{name}.csv" for name in names)]
    check_outputs_spare_inputs(outputs, [config_path, *data.inputs])
    check_inputs_outside(out, [config_path, *data.inputs])
    with site_warnings(names, data.scale):
        model.fit(sites)
    contributed = {int(s) for row in model.history_ for s in row["sites"]}
    silent = [name for s, name in enumerate(names) if s not in contributed]
    if silent:
        raise ValueError(f"site(s) {silent} failed in every round, so the model holds nothing of their data and nothing "
                         "was written; the warnings above give each failure")
    latents = []
    for table, site in zip(data.tables, sites):
        latent = model.transform(site)
        unseen = np.all([np.isnan(X).all(axis=1) for X in site.values()], axis=0)
        latent[unseen] = np.nan  # a subject with no observed view has no latent position
        latents.append(latent)
        if unseen.any():
            notes.append(f"site {table.site!r}: {int(unseen.sum())} subject(s) with no observed view get latent NaN")
    model.save(staging / "model.npz")
    key = data.id or "row"
    for table, latent in zip(data.tables, latents):
        write_csv(staging / f"latent_{table.site}.csv",
                  [{key: i, **{f"x{j + 1}": float(v) for j, v in enumerate(row)}} for i, row in zip(data.ids(table), latent)])
    ell = model.history_[-1]["expected_ll"]
    summary = {
        "model_family": "fed-mv-ppca",
        "sites": names,
        "subjects": {n: len(t) for n, t in zip(names, data.tables)},
        "data": data.layout,
        "views": {v: len(c) for v, c in views.items()},
        "columns": views,
        "id": data.id,
        "scale": data.scale,
        "scaling": scaling.to_dict(),
        **({"ranges": "public bounds declared in [ranges]: nothing was sent for the scaling" if all_declared
            else f"public bounds declared in [ranges] for {[c for c in columns if c in data.ranges]}; the other "
                 "columns' ranges fitted across the sites"} if data.ranges else {}),
        **({"scaling_outside_privacy": disclosure} if disclosure else {}),
        "partial": data.partial,
        "n_components": model.n_components_,
        "n_rounds": model.n_rounds,
        "rounds_run": model.n_rounds_,
        "n_init": model.n_init,
        # sent by the sites without privacy only (it is computed from their raw data)
        "final_expected_ll": ell if np.isfinite(ell) else None,
        "bytes_sent": int(sum(h["bytes_sent"] for h in model.history_)),
        "model": str(out / "model.npz"),
    }
    if privacy is not None and insecure_reproducible_noise:
        summary["not_private"] = NOT_PRIVATE
        write_json(staging / "privacy-report.json", model.privacy_report())
    elif privacy is not None:
        summary["privacy_unit"] = unit
        summary["privacy_spent"] = {names[s]: spent for s, spent in model.privacy_spent_.items()}
        write_json(staging / "privacy-report.json", model.privacy_report(site_names=dict(enumerate(names))))
    from .report.mvppca import write_mvppca_report

    units = ("Values are in the units of the sites' files." if data.scale == "none" else
             "Every column was min-max scaled with the public ranges declared in the configuration (nothing was sent "
             "for it); values are in scaled units." if all_declared else
             f"Every column was scaled ({data.scale}) across the sites before the fit; values are in scaled units.")
    if disclosure:
        units += " " + disclosure
    if privacy is not None and insecure_reproducible_noise:
        units += f" This result is {NOT_PRIVATE}."
    elif unit == "record":
        units += (" Record-level differential privacy: each site released its noisy moments once, and the model was fitted "
                  "from these releases; the privacy spent protects each subject of a site.")
    intro = (
        f"Fed-mv-PPCA on {len(sites)} sites ({', '.join(f'{n}: {len(next(iter(s.values())))} subjects' for n, s in zip(names, sites))}) "
        f"and {len(views)} views ({', '.join(f'{v}: {len(c)} features' for v, c in views.items())}), "
        f"{model.n_components_} latent factors, {model.n_rounds_} rounds run. {units}"
    )
    write_mvppca_report(
        staging, model, title="Fed-mv-PPCA fit", intro=intro, command=f"fedhier fit --config {config_path.name}",
        summary_rows=[{"quantity": k, "value": summary[k]} for k in ("rounds_run", "final_expected_ll", "bytes_sent")],
        tables=[("Privacy spent per site for the whole fit", [{"site": names[s], **v} for s, v in model.privacy_spent_.items()])]
        if privacy is not None and not insecure_reproducible_noise else (),
        sites=sites, site_names=names, feature_names=views,
    )
    summary["report"] = str(out / "report.html")
    write_summary(staging, summary, title="fedhier fit (Fed-mv-PPCA)", notes=notes)
    summary["notes"] = notes
    return summary


def fit_forecast(config: dict[str, Any], source: str, total_budget: tuple[float, float] | None) -> tuple[str, bool] | None:
    """The utility forecast of a private fit from the configuration alone, before any file is read: ``(line, hopeless)``.

    Site-level DP: the forecast of :func:`fedhier.models.mvppca.forecast.mvppca_forecast` from the views'
    widths, the number of sites in ``[sites]``, the rounds and the budget; ``hopeless`` when the private model
    is not expected to beat the training mean.  Record-level DP depends on the number of subjects, unknown
    before the files are read: the line says how many the sites need together (:func:`_fit_and_write` warns
    once it has counted them).  None without privacy, or when the sites are named by a column of one file.
    """
    from .models.mvppca.dp import DPConfig
    from .models.mvppca.forecast import mvppca_forecast, subjects_needed
    from .privacy.analyze_gauss import RecordDP

    if total_budget is None and config.get("epsilon") is not None:
        total_budget = (float(config["epsilon"]), float(config.get("delta", 1e-5)))
    sites = config.get("sites")
    if total_budget is None or not isinstance(sites, (dict, list)) or not sites:
        return None
    views = check_views(config.get("views"), source)
    scale = config.get("scale", "none")
    unit = _privacy_unit(config, source, private=True, scale=scale)
    ranges = config.get("ranges") if isinstance(config.get("ranges"), dict) else {}
    if (scale != "none" and not config.get("scaling_outside_privacy", False)
            and not {c for columns in views.values() for c in columns} <= set(ranges)):
        return None  # refused once the files are read (scale_sites): a scaling fitted on the sites' data
    dims = {view: len(columns) for view, columns in views.items()}
    options = {k: config.get(k, d) for k, d in _OPTIONS.items()}
    if unit == "record":
        need = subjects_needed(dims, options["n_components"], len(sites), RecordDP(*total_budget))
        return (f"utility forecast: record-level DP at epsilon {total_budget[0]:g} needs about {need:,} subjects over the "
                f"{len(sites)} sites for the private model to be expected to beat the training mean", False)
    privacy = DPConfig.total(*total_budget, n_rounds=options["n_rounds"], n_views=len(dims), spread=True)
    outlook = mvppca_forecast(dims, options["n_components"], len(sites), privacy)
    return outlook.line(), not outlook.beats_mean


def _privacy_unit(config: dict[str, Any], source: str, *, private: bool, scale: str) -> str | None:
    """What a private fit protects: ``"site"`` (the default: a site's whole data set, over every round) or
    ``"record"`` (one subject, by one release of noisy moments per site); None for a fit without privacy."""
    unit = config.get("privacy_unit", "site")
    if not private and "privacy_unit" in config and unit in ("site", "record"):
        raise ValueError(f"{source}: privacy_unit = {unit!r} needs a privacy budget: set epsilon (or pass --dp)")
    check_privacy_unit(unit, source, private=private, minmax=scale == "minmax",
                       aggregation=config.get("aggregation", "plain"), budget="set epsilon (or pass --dp)")
    return unit if private else None


def _all_columns(site: dict[str, np.ndarray], views: dict[str, list[str]]) -> np.ndarray:
    """A site's views side by side in configuration order, NaN for a view it does not measure."""
    n = len(next(iter(site.values())))
    return np.column_stack([site.get(v, np.full((n, len(c)), np.nan)) for v, c in views.items()])
