"""``fedhier collab {fit,score}``: CollabDict anomaly detection on the sites' rows.

``fit`` reads the data model of ``docs/cli.md`` from ``--config fit.toml`` (``[sites]`` or ``file`` +
``site_column``, ``variables``, ``label``, ``id``, ``scale``, ``partial``, options) or from the flags
``--csv FILE --site-column COL [--columns ...]``, which build the same configuration.  The result
folder holds ``model.npz``, ``scores_<site>.csv``, ``summary.json`` (sites, variables, scaling:
what ``score`` needs), ``summary.md`` and the report.  ``score`` reads the model's folder and
scores a CSV's rows with a site's weights (``--site NAME``, or each row's own site from the site
column).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..data.scaling import ColumnScaling
from ..data.sitefiles import SiteDataError, close_matches, join_problems, list_names, parse_column, read_table
from ..deploy._toml import check_missing_values, refuse_privacy_keys
from ..utils.io import write_csv
from ..utils.results import REPORT_FILES, check_inputs_outside, check_output_folder, result_folder
from ..utils.untrusted import check_outputs_spare_inputs
from .console import rounds_shown, run, site_timeout_flag
from .sitedata import check_columns, complete_rows, load_config, read_saved_data, site_data, site_warnings, write_summary

_DEFAULTS = {"n_components": 7, "rho": 0.8, "weights": "local", "aggregation": "consensus", "max_iter": 100, "seed": 0}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedhier collab", description="Serverless collaborative anomaly detection (CollabDict)")
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="fit on the sites' rows (--config fit.toml, or --csv with --site-column)")
    fit.add_argument("--config", default=None, help="TOML file: [sites] or file + site_column, variables, options (docs/cli.md)")
    fit.add_argument("--csv", default=None, help="one CSV file holding every site's rows (with --site-column)")
    fit.add_argument("--site-column", default=None, help="the CSV's column naming each row's site")
    fit.add_argument("--columns", help="comma-separated variables (default: every column but the site, id, label and dropped ones)")
    fit.add_argument("--drop-columns", default="", help="comma-separated columns to ignore")
    fit.add_argument("--out", default=None,
                     help="result folder (default fedhier-collab); a path ending in .npz names the model file and its folder holds the rest")
    fit.add_argument("--runtime", choices=["peer", "star", "mpi"], default="peer", help="how the sites talk (default peer: no centre)")
    fit.add_argument("--peer-timeout", type=float, default=None,
                     help="with --runtime mpi: seconds without a message before a peer is reported lost, and the "
                          "most MPI's start-up may take (default 300; must exceed the longest site step)")
    fit.add_argument("--resume", action="store_true",
                     help="with --runtime mpi: go on from the states a killed job saved next to the model files, "
                          "with the same data and options (and the same --site-seed, if one was given)")
    site_timeout_flag(fit)
    fit.add_argument("--aggregation", choices=["consensus", "chunked", "shamir"], default=None,
                     help="how sums are formed without a centre (default consensus)")
    fit.add_argument("--components", type=int, default=None, help="most dictionary patterns (default 7)")
    fit.add_argument("--rho", type=float, default=None, help="sparsity of the patterns' precision matrices (default 0.8)")
    fit.add_argument("--weights", choices=["local", "shared"], default=None, help="mixture weights per site or shared (default local)")
    fit.add_argument("--max-iter", type=int, default=None, help="most rounds (default 100)")
    fit.add_argument("--seed", type=int, default=None,
                     help="the run's seed (with --runtime mpi: public, every site knows it)")
    fit.add_argument("--site-seed", type=int, default=None,
                     help="with --runtime mpi: seed of each site's starts, for reproducible tests only; "
                          "chunk masks come from each site's operating system whatever it is")
    fit.add_argument("--no-mitigate", action="store_true",
                     help="monitor l-diversity only: add no noise to a site's pattern statistics on a breach (that noise "
                          "comes from each site's operating system, so runs with it differ)")
    fit.add_argument("--label-column", default=None,
                     help="column marking known anomalies (1) and normal samples (0); not used in the fit, only to "
                          "evaluate it in the report")
    fit.add_argument("--scale", choices=["standard", "minmax", "none"], default=None,
                     help="scale every variable across the sites before the fit (default none)")
    fit.add_argument("--id", default=None, help="column identifying each row (kept in the score files)")
    fit.add_argument("--quiet", action="store_true", help="no progress display")
    fit.add_argument("--report", default=None,
                     help="folder of the report (report.html, report.md, figures/); default: the result folder")
    score = sub.add_parser("score", help="score a CSV's rows with a fitted model")
    score.add_argument("--model", required=True, help="model.npz of a `collab fit` result folder")
    score.add_argument("--csv", required=True, help="rows to score (the variables the model was fitted on)")
    score.add_argument("--site", default=None,
                       help="the site whose weights score every row (its name; default: each row's site column)")
    score.add_argument("--columns", default=None, help="comma-separated variables (default: the model's own)")
    score.add_argument("--out", required=True, help="CSV of scores")
    score.add_argument("--variable", action="store_true", help="also write variable-wise scores")
    return parser


def cli_collab(argv: Sequence[str] | None = None) -> int:
    """``fedhier collab {fit,score}``.

    ``fit`` with ``--runtime mpi`` must run under ``mpiexec -n S`` (one process per site);
    each process then writes its own model file ``OUT`` with ``{site}`` replaced by its
    index (or ``.site<k>`` inserted before the suffix).
    """
    argv = list(argv) if argv is not None else sys.argv[1:]
    args = _parser().parse_args(argv)
    if args.command == "fit":
        return _fit(args, "fedhier collab " + shlex.join(str(a) for a in argv))
    return _score(args)


def _config_of(args: argparse.Namespace) -> dict[str, Any]:
    if args.config is not None:
        config = load_config(args.config)
        config["_source"], config["_base"] = str(args.config), Path(args.config).parent
    elif args.csv is not None:
        if args.site_column is None:
            raise ValueError("fedhier collab fit --csv needs --site-column (or use --config fit.toml)")
        config = {"file": args.csv, "_source": args.csv, "_base": Path(".")}
    else:
        raise ValueError("fedhier collab fit needs --config fit.toml, or --csv FILE with --site-column COL")
    flags = {"site_column": args.site_column, "label": args.label_column, "scale": args.scale, "id": args.id,
             "n_components": args.components, "rho": args.rho, "weights": args.weights, "aggregation": args.aggregation,
             "max_iter": args.max_iter, "seed": args.seed,
             "variables": [c for c in args.columns.split(",") if c] if args.columns else None}
    config.update({k: v for k, v in flags.items() if v is not None})
    return config


def _fit(args: argparse.Namespace, command: str) -> int:
    """``collab fit``: the output folders are checked before anything is read; the result folder (and the
    ``--report`` folder) appear with all their files or not at all.  Under MPI each process writes its own model file."""
    out_arg = Path(args.out) if args.out else Path("fedhier-collab")
    model_file = out_arg.suffix == ".npz"  # the model file's folder is the user's: files are added to it
    folder, model_path = (out_arg.parent, out_arg) if model_file else (out_arg, out_arg / "model.npz")
    report_dir = Path(args.report) if args.report else folder
    if args.resume and args.runtime != "mpi":
        raise ValueError("--resume is for --runtime mpi: it goes on from the states a killed MPI job saved")
    if args.runtime == "mpi":
        check_output_folder(folder, merge=True)
        from ..runtime.mpi import DEFAULT_TIMEOUT, world

        # MPI's start-up first, before this site reads its data: a site that freezes while reading is then left out by
        # the others at their peer deadline, as in the round loop, instead of holding them all inside MPI's start-up
        world(DEFAULT_TIMEOUT if args.peer_timeout is None else args.peer_timeout)
        return _fit_and_write(args, command, folder, model_path, report_dir, None, None)
    with contextlib.ExitStack() as stack:
        staging = stack.enter_context(result_folder(folder, merge=model_file))
        report_staging = staging if os.path.realpath(report_dir) == os.path.realpath(folder) else stack.enter_context(
            result_folder(report_dir, what="--report", key="report.html", names=REPORT_FILES))
        replaced = [*([] if model_file else [folder]), *([] if report_staging is staging else [report_dir])]
        return _fit_and_write(args, command, folder, model_path, report_dir, staging, report_staging, replaced)


def _fit_and_write(args: argparse.Namespace, command: str, folder: Path, model_path: Path, report_dir: Path,
                   staging: Path | None, report_staging: Path | None, replaced: Sequence[Path] = ()) -> int:
    """:func:`_fit`, writing into ``staging`` (``report_staging``) the files that will be ``folder``'s (``report_dir``'s);
    ``replaced``: the folders that publishing replaces whole, which may hold no input."""
    from ..estimators.collab import CollabDict

    config = _config_of(args)
    source = config["_source"]
    refuse_privacy_keys(config, source, "a CollabDict fit",
                        spent="; its report states the privacy its published pattern means spend")
    data = site_data(config, source, config["_base"])
    label = config.get("label")
    drop = {c for c in args.drop_columns.split(",") if c} | {config.get("site_column"), data.id, label} - {None}
    variables = config.get("variables") or [c for c in data.columns() if c not in drop]
    if not isinstance(variables, list) or not variables or not all(isinstance(c, str) and c for c in variables):
        raise ValueError(f"{source}: variables = [\"column\", ...] must list the variables (or leave it out: every column)")
    check_columns(data, {"variables": variables, **({"label": [label]} if label else {})}, exclude=list(drop - {label}))
    if not config.get("variables"):
        _check_default_variables(data, variables)
    notes: list[str] = []
    sites, kept, problems = complete_rows(data, variables, "variables", notes, min_rows=2)
    known = _labels(data.tables, kept, label, problems) if label else None
    if problems:
        raise SiteDataError(join_problems(problems))
    opt = {k: config.get(k, d) for k, d in _DEFAULTS.items()}
    if data.scale != "none":  # an affine change of a variable leaves CollabDict's own standardisation unchanged
        notes.append(f"scale = {data.scale!r} has no effect on CollabDict: it standardises every variable across the "
                     "sites itself, without a centre, before its first round")
    scaling = ColumnScaling("none", variables)
    names = data.names
    inputs = [*data.inputs, *([source] if str(source).endswith(".toml") else [])]
    model = CollabDict(n_components=opt["n_components"], rho=opt["rho"], weights=opt["weights"],
                       aggregation=opt["aggregation"], max_iter=opt["max_iter"], random_state=opt["seed"],
                       mitigate=not args.no_mitigate, runtime="peer" if args.runtime == "mpi" else args.runtime,
                       site_timeout=args.site_timeout)
    if args.runtime == "mpi":
        if args.site_timeout is not None:
            raise ValueError("--site-timeout is for --runtime peer or star; under MPI a site that stops answering is "
                             "left out after --peer-timeout")
        from ..runtime.mpi import world
        from ..runtime.peer import PeerGraphSplit

        comm = world()  # started by _fit
        if comm.Get_size() != len(sites):
            raise ValueError(f"{len(sites)} sites in {source} but {comm.Get_size()} MPI processes")
        rank = comm.Get_rank()
        out = Path(str(model_path).format(site=rank)) if "{site}" in str(model_path) else model_path.with_name(
            f"{model_path.stem}.site{rank}{model_path.suffix}")
        state = out.with_name(f"{out.stem}.state{out.suffix}")
        check_outputs_spare_inputs([out, state], inputs)
        try:
            model.fit_mpi(sites[rank], comm, site_seed=args.site_seed, timeout=args.peer_timeout, state_path=state,
                          resume=args.resume)
        except PeerGraphSplit as exc:
            where = (f" This site's model and state after the last completed round are in {state}."
                     if state.exists() else " No round had completed; nothing was saved.")
            print(f"site {names[rank]!r}: {exc}.{where}", file=sys.stderr, flush=True)
            os._exit(3)  # MPI_Finalize would wait for the lost peers
    else:
        out = model_path
        check_outputs_spare_inputs([out, folder / "summary.json", *(folder / f"scores_{n}.csv" for n in names)], inputs)
        for target in replaced:
            check_inputs_outside(target, inputs, what="--report" if target == report_dir else "--out")
        with site_warnings(names), rounds_shown(opt["max_iter"] + 1, "CollabDict rounds", quiet=args.quiet):  # + the round of moments
            model.fit(sites)
        if model.lost_sites_:  # a peer that missed its deadline took its private weights with it
            raise ValueError(f"site(s) {[names[s] for s in model.lost_sites_]} did not answer within --site-timeout and "
                             "the other peers finished without them, so their scores cannot be computed and nothing "
                             "was written; run again with a longer --site-timeout, or with --runtime star, which asks a "
                             "late site again in the next round")
    model.save(out if staging is None else staging / model_path.name)
    lost = getattr(model, "lost_sites_", [])
    print(f"fitted CollabDict on {len(sites)} sites ({', '.join(names)}); variables {variables}; "
          f"{_count(int(model.active_.sum()), 'pattern')}; {model.n_iter_ + 1} rounds (one sharing the variables' means and "
          f"spreads, {model.n_iter_} learning the patterns)"
          + (f", resumed after round {model.resumed_round_}" if args.resume else "") + f"; wrote {out}"
          + (f"; sites {[names[s] for s in lost]} stopped answering and were left out from then on" if lost else ""), flush=True)
    if args.runtime != "mpi":  # under MPI each process holds only its own site's weights
        for k, (table, X, rows) in enumerate(zip(data.tables, sites, kept)):
            key = data.id or "row"
            write_csv(staging / f"scores_{table.site}.csv",
                      [{key: i, "score": float(v)} for i, v in zip(data.ids(table, rows), model.anomaly_score(X, site=k))])
        from ..report.collab import write_collab_report

        units = "" if data.scale == "none" else f" Every variable was scaled ({data.scale}) across the sites before the fit."
        intro = (f"Collaborative anomaly detection on {len(sites)} sites ({sum(len(x) for x in sites)} samples of "
                 f"{len(variables)} variables: {', '.join(variables)}; {data.layout}). The sites learned a shared "
                 "dictionary of patterns without a centre; each scores its own samples with its private weights." + units)
        written = write_collab_report(report_staging, model, sites, site_names=names, variables=variables,
                                      title="CollabDict fit", intro=intro, labels=known, command=command)
        report = report_dir / written.name  # where it is once published
        summary = {"model_family": "collab", "sites": names, "rows": {n: len(x) for n, x in zip(names, sites)},
                   "data": data.layout, "site_column": config.get("site_column"), "variables": variables, "label": label,
                   "id": data.id, "scale": data.scale, "scaling": scaling.to_dict(), "partial": data.partial,
                   "missing_values": {c: sorted(cells) for c, cells in data.tables[0].missing.items()},
                   "patterns": int(model.active_.sum()), "rounds_run": int(model.n_iter_), "model": str(out),
                   "report": str(report)}
        write_summary(staging, summary, title="fedhier collab fit", notes=notes)
        print(f"report: {report}")
    if lost:
        model._transport.commit()  # every survivor has written its model
        sys.stderr.flush()
        os._exit(0)  # MPI_Finalize would wait for the lost peers
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _check_default_variables(data, variables: list[str]) -> None:
    """Without a list of variables every column is one: name, in one line, those that cannot be (text, not measured)."""
    text, unmeasured = {}, {}
    for table in data.tables:
        for c in variables:
            if not table.measures(c):
                unmeasured.setdefault(c, table.site)
                continue
            problems: list[str] = []
            parse_column(table, c, problems)
            if problems and c not in text:
                text[c] = problems[0]
    if text or unmeasured:
        parts = ([f"column(s) {list(text)} hold text (first: {next(iter(text.values()))})"] if text else []) + (
            [f"column(s) {list(unmeasured)} not measured at site {next(iter(unmeasured.values()))!r}"] if unmeasured else [])
        raise ValueError("the variables default to every column, but " + " and ".join(parts)
                         + "; list the variables with variables = [...] (or --columns)")


def _labels(tables, kept, label: str, problems: list[str]) -> list[np.ndarray]:
    """Known anomaly labels (0/1, or booleans) of the kept rows of every site."""
    out = []
    for table, rows in zip(tables, kept):
        values = parse_column(table, label, problems)[rows]
        bad = np.flatnonzero(~np.isin(values, (0.0, 1.0)))
        if bad.size:
            problems.append(f"site {table.site!r}: label column {label!r} must hold 0 (normal) or 1 (anomaly), "
                            f"row {table.row_numbers[rows[bad[0]]]}" + (f" and {bad.size - 1} more" if bad.size > 1 else ""))
        out.append(values.astype(np.int64))
    return out


def _score(args: argparse.Namespace) -> int:
    from ..estimators.collab import CollabDict

    model_path = Path(args.model)
    check_outputs_spare_inputs([args.out], [args.csv, args.model])
    saved = read_saved_data(model_path.parent)
    family = saved.get("model_family", "collab")
    if family != "collab":
        shown = {"fed-mv-ppca": "Fed-mv-PPCA", "fedlin-hm2": "FedLin HM2", "fedlin-hm1": "FedLin HM1"}.get(family, repr(family))
        raise ValueError(f"{model_path}: a {shown} model (its folder's summary.json says so); collab score needs the "
                         "model.npz of a `fedhier collab fit` result folder")
    model = CollabDict.load(model_path)
    names = [str(n) for n in saved.get("sites", [])]
    columns = [c for c in args.columns.split(",") if c] if args.columns else saved.get("variables")
    if not columns:
        raise ValueError(f"{model_path.parent}: no summary.json with the model's variables; name them with --columns")
    site_column = saved.get("site_column")
    missing = check_missing_values(saved.get("missing_values", {}), str(model_path.parent / "summary.json"))
    table = read_table(args.csv, None, missing, expected=[*columns, *([site_column] if site_column else [])])
    if args.site is not None:
        site = _site_index(args.site, names, model_path)
        which = np.full(len(table), site)
    elif site_column and table.has(site_column):
        labels = table.text(site_column)
        unknown = sorted(set(labels) - set(names))
        if unknown:
            raise ValueError(f"{args.csv}: site column {site_column!r} names site(s) {unknown} the model was not fitted on; "
                             f"its sites: {names}")
        which = np.array([names.index(v) for v in labels], dtype=int)
    else:
        raise ValueError(f"{args.csv}: name the site whose weights score the rows with --site (the model's sites: {names})")
    problems: list[str] = []
    lacking = [c for c in columns if not table.has(c)]
    if lacking:
        raise ValueError(f"{args.csv}: column(s) {lacking} missing{close_matches(lacking[0], table.header)}; columns: {list_names(table.header)}")
    X = np.column_stack([parse_column(table, c, problems) for c in columns])
    if problems:
        raise SiteDataError(join_problems(problems))
    if "scaling" in saved:
        X = ColumnScaling.from_dict(saved["scaling"]).transform(columns, X)
    complete = ~np.isnan(X).any(axis=1)
    scores = np.full(len(table), np.nan)
    variable = np.full((len(table), len(columns)), np.nan)
    for s in np.unique(which):
        rows = np.flatnonzero((which == s) & complete)
        if rows.size:
            scores[rows] = model.anomaly_score(X[rows], site=int(s))
            if args.variable:
                variable[rows] = model.variable_scores(X[rows], site=int(s))
    id_column = saved.get("id")
    ids = table.text(id_column) if id_column and table.has(id_column) else [str(r) for r in table.row_numbers]
    out_rows = []
    for i in range(len(table)):
        row = {id_column if id_column and table.has(id_column) else "row": ids[i],
               "site": names[which[i]] if names else int(which[i]), "score": float(scores[i])}
        if args.variable:
            row.update({f"score_{c}": float(v) for c, v in zip(columns, variable[i])})
        out_rows.append(row)
    write_csv(args.out, out_rows)
    print(f"wrote {len(out_rows)} scores to {args.out}" + (f" ({int((~complete).sum())} row(s) with an empty cell scored NaN)"
                                                          if not complete.all() else ""))
    return 0


def _site_index(site: str, names: list[str], model_path: Path) -> int:
    """A site named as in the fit (or, for a model without a summary, its 0-based index)."""
    if site in names:
        return names.index(site)
    if not names and site.isdigit():
        return int(site)
    raise ValueError(f"--site {site!r} is not a site of the model {model_path.name}{close_matches(site, names)}; its sites: {names}")


if __name__ == "__main__":  # ``python -m fedhier.cli.collab ...``, e.g. under mpiexec
    sys.exit(run(lambda: cli_collab(sys.argv[1:]), "fedhier collab"))
