"""``fedhier collab {fit,score}``: CollabDict anomaly detection from a CSV whose rows belong to sites."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from ..estimators.collab import CollabDict
from ..utils.io import write_csv
from ..utils.untrusted import check_outputs_spare_inputs
from .console import rounds_shown


def _numeric(frame, columns: list[str], csv_path: str) -> np.ndarray:
    """``frame[columns]`` as floats; a non-numeric cell is named by its column and data row, never quoted."""
    import pandas as pd

    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{csv_path}: unknown column(s) {missing}")
    for column in columns:
        numeric = pd.to_numeric(frame[column], errors="coerce")
        bad = np.flatnonzero(numeric.isna().to_numpy() & frame[column].notna().to_numpy())
        if bad.size:
            raise ValueError(f"{csv_path}: non-numeric value in column {column!r}, row {int(bad[0]) + 1}")
    return frame[columns].apply(pd.to_numeric).to_numpy(dtype=float)


def _read_sites(csv_path: str, site_column: str, columns: list[str] | None, drop: list[str]):
    import pandas as pd

    frame = pd.read_csv(csv_path)
    if site_column not in frame.columns:
        raise ValueError(f"{csv_path}: no site column {site_column!r}; columns are {list(frame.columns)}")
    names = columns or [c for c in frame.columns if c != site_column and c not in drop]
    values = _numeric(frame, names, csv_path)
    labels = sorted(frame[site_column].unique().tolist())
    sites = [values[(frame[site_column] == lab).to_numpy()] for lab in labels]
    return labels, names, sites


def _read_labels(csv_path: str, site_column: str, label_column: str, site_labels) -> list[np.ndarray]:
    """Known anomaly labels (0/1) per site, in the order of :func:`_read_sites`."""
    import pandas as pd

    frame = pd.read_csv(csv_path)
    if label_column not in frame.columns:
        raise ValueError(f"{csv_path}: no label column {label_column!r}; columns are {list(frame.columns)}")
    values = frame[label_column].to_numpy(dtype=float)
    if not np.isin(values, (0.0, 1.0)).all():
        raise ValueError(f"{csv_path}: label column {label_column!r} must hold 0 (normal) or 1 (anomaly)")
    return [values[(frame[site_column] == lab).to_numpy()].astype(np.int64) for lab in site_labels]


def cli_collab(argv: Sequence[str] | None = None) -> int:
    """``fedhier collab {fit,score}``: fit CollabDict on a CSV split by a site column, or score.

    ``fit`` with ``--runtime mpi`` must run under ``mpiexec -n S`` (one process per site);
    each process then writes its own model file ``OUT`` with ``{site}`` replaced by its
    index (or ``.site<k>`` inserted before the suffix).
    """
    parser = argparse.ArgumentParser(prog="fedhier collab", description="Serverless collaborative anomaly detection")
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="fit on a CSV whose rows belong to sites")
    fit.add_argument("--csv", required=True, help="CSV file with a header row; each row belongs to the site named in --site-column")
    fit.add_argument("--site-column", required=True, help="column naming the site of each row")
    fit.add_argument("--columns", help="comma-separated variables (default: all but site/drop columns)")
    fit.add_argument("--drop-columns", default="", help="comma-separated columns to ignore (e.g. labels)")
    fit.add_argument("--out", required=True, help="model .npz path")
    fit.add_argument("--runtime", choices=["peer", "star", "mpi"], default="peer",
                     help="peer: serverless, in this process (default); star: exact sums, the centralised reference; "
                          "mpi: one process per site under mpiexec")
    fit.add_argument("--peer-timeout", type=float, default=None,
                     help="with --runtime mpi: seconds without a message before a peer is reported lost "
                          "(default 300; must exceed the longest site step)")
    fit.add_argument("--aggregation", choices=["consensus", "chunked", "shamir"], default="consensus",
                     help="how the peers compute sums without a centre (default consensus)")
    fit.add_argument("--components", type=int, default=7, help="initial number of patterns (default 7; unused ones are pruned)")
    fit.add_argument("--rho", type=float, default=0.8, help="sparsity (l1 strength) of the patterns' precision matrices, on standardised data (default 0.8)")
    fit.add_argument("--weights", choices=["local", "shared"], default="local", help="private pattern weights per site (default) or one shared set")
    fit.add_argument("--max-iter", type=int, default=100, help="most rounds (default 100; stops earlier once converged)")
    fit.add_argument("--seed", type=int, default=0,
                     help="the run's seed (with --runtime mpi: public, every site knows it)")
    fit.add_argument("--site-seed", type=int, default=None,
                     help="with --runtime mpi: each site's secret seed, for reproducible tests only "
                          "(default: each site's own entropy, as a deployment needs)")
    fit.add_argument("--label-column", default=None,
                     help="column marking known anomalies (1) and normal samples (0); not used in the fit, only to "
                          "evaluate it in the report")
    fit.add_argument("--report", default=None,
                     help="folder of the report (report.html, report.md, figures/); default: the model file's folder")
    fit.add_argument("--quiet", action="store_true", help="no progress display")
    score = sub.add_parser("score", help="score a CSV with a fitted model")
    score.add_argument("--model", required=True, help="model file written by `fedhier collab fit`")
    score.add_argument("--csv", required=True, help="CSV file of the samples to score")
    score.add_argument("--site", type=int, required=True, help="site index (sorted order of the site column)")
    score.add_argument("--columns", required=True, help="comma-separated variables, in the model's order")
    score.add_argument("--out", required=True, help="CSV of scores")
    score.add_argument("--variable", action="store_true", help="also write variable-wise scores")
    args = parser.parse_args(list(argv) if argv is not None else None)

    if args.command == "fit":
        cols = args.columns.split(",") if args.columns else None
        drop = [c for c in args.drop_columns.split(",") if c]
        if args.label_column:
            drop.append(args.label_column)
        labels, names, sites = _read_sites(args.csv, args.site_column, cols, drop)
        check_outputs_spare_inputs([args.out], [args.csv])
        known = _read_labels(args.csv, args.site_column, args.label_column, labels) if args.label_column else None
        model = CollabDict(n_components=args.components, rho=args.rho, weights=args.weights,
                           aggregation=args.aggregation, max_iter=args.max_iter, random_state=args.seed,
                           runtime="peer" if args.runtime == "mpi" else args.runtime)
        if args.runtime == "mpi":
            from ..runtime.mpi import world
            from ..runtime.peer import PeerGraphSplit

            comm = world()
            if comm.Get_size() != len(sites):
                raise ValueError(f"{len(sites)} sites in {args.csv} but {comm.Get_size()} MPI processes")
            rank = comm.Get_rank()
            out = Path(args.out)
            out = Path(str(out).format(site=rank)) if "{site}" in str(out) else out.with_name(
                f"{out.stem}.site{rank}{out.suffix}")
            state = out.with_name(f"{out.stem}.state{out.suffix}")
            check_outputs_spare_inputs([out, state], [args.csv])
            try:
                model.fit_mpi(sites[rank], comm, site_seed=args.site_seed, timeout=args.peer_timeout, state_path=state)
            except PeerGraphSplit as exc:
                where = (f" This site's model and state after the last completed round are in {state}."
                         if state.exists() else " No round had completed; nothing was saved.")
                print(f"site {rank}: {exc}.{where}", file=sys.stderr, flush=True)
                os._exit(3)  # MPI_Finalize would wait for the lost peers
        else:
            with rounds_shown(args.max_iter + 1, "CollabDict rounds", quiet=args.quiet):  # + the round of moments
                model.fit(sites)
            out = Path(args.out)
        check_outputs_spare_inputs([out], [args.csv])
        model.save(out)
        lost = getattr(model, "lost_sites_", [])
        print(f"fitted CollabDict on {len(sites)} sites ({', '.join(map(str, labels))}); variables {names}; "
              f"{int(model.active_.sum())} patterns; {model.n_iter_} rounds; wrote {out}"
              + (f"; sites {lost} stopped answering and were left out from then on" if lost else ""), flush=True)
        if args.runtime != "mpi":  # under MPI each process holds only its own site's weights
            from ..report.collab import write_collab_report

            intro = (f"Collaborative anomaly detection on {len(sites)} sites ({sum(len(x) for x in sites)} samples of "
                     f"{len(names)} variables: {', '.join(names)}) from {Path(args.csv).name}. The sites learned a shared "
                     "dictionary of patterns without a centre; each scores its own samples with its private weights.")
            report = write_collab_report(
                Path(args.report) if args.report else out.parent, model, sites, site_names=[f"{args.site_column} {x}" if isinstance(x, (int, float)) else str(x) for x in labels],
                variables=names, title="CollabDict fit", intro=intro, labels=known,
                command="fedhier collab " + shlex.join(str(a) for a in (argv if argv is not None else sys.argv[1:])))
            print(f"report: {report}")
        if lost:
            model._transport.commit()  # every survivor has written its model
            sys.stderr.flush()
            os._exit(0)  # MPI_Finalize would wait for the lost peers
        return 0

    check_outputs_spare_inputs([args.out], [args.csv, args.model])
    model = CollabDict.load(args.model)
    import pandas as pd

    frame = pd.read_csv(args.csv)
    X = _numeric(frame, args.columns.split(","), args.csv)
    rows = [{"row": i, "score": float(v)} for i, v in enumerate(model.anomaly_score(X, site=args.site))]
    if args.variable:
        for row, vs in zip(rows, model.variable_scores(X, site=args.site)):
            row.update({f"score_{c}": float(v) for c, v in zip(args.columns.split(","), vs)})
    write_csv(args.out, rows)
    print(f"wrote {len(rows)} scores to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(cli_collab(sys.argv[1:]))
