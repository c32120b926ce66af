"""``fedhier fit``: Fed-mv-PPCA on user files described by a small TOML file.

Example ``fit.toml`` (paths relative to the TOML file)::

    n_components = 5          # optional, default 5
    n_rounds = 100            # optional, default 100
    n_init = 1                # optional: random starts, the best kept (FedMVPPCA n_init)
    seed = 0                  # optional
    # also optional: n_local_iter, n_first_iter, tol, init, local_tol (FedMVPPCA's parameters of those names)

    [views]                   # view name -> list of column names
    proteins = ["ACE", "AXL", "Adiponectin"]
    csf = ["tau", "p_tau", "Ab_42"]

    [[sites]]
    name = "hospital-a"
    path = "hospital_a.csv"   # .csv, or .parquet (needs pandas + pyarrow)

    [[sites]]
    name = "hospital-b"
    path = "hospital_b.csv"

A site file that has none of a view's columns does not measure that view; a file that
has only some of them is an error, and so is a column named twice.  Empty cells are
missing values: a subject whose view is entirely empty lacks that view.  Blank lines, a
UTF-8 byte-order mark and spaces around column names are ignored.  Everything is checked
before any work.  Error messages name the site, view, column and row of a problem, never
a cell's content (a message may reach the coordinator of a federated fit).  Site names
name output files: no path separators, no leading ``.``, no control characters.  No
output may replace an input file.
"""

from __future__ import annotations

import csv
import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from .protocol.base import SiteError
from .utils.io import write_csv, write_json
from .utils.untrusted import check_outputs_spare_inputs, check_site_name

__all__ = ["load_config", "read_site_table", "fit_from_config"]

_ALLOWED_KEYS = {"n_components", "n_rounds", "n_local_iter", "n_first_iter", "n_init", "tol", "init", "local_tol", "seed", "views", "sites"}


def load_config(path: str | Path) -> dict[str, Any]:
    """Read and check the TOML configuration; raise ValueError naming the problem."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"configuration file {path} does not exist")
    try:
        config = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: invalid TOML: {exc}") from exc
    unknown = sorted(set(config) - _ALLOWED_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; allowed: {sorted(_ALLOWED_KEYS)}")
    views = config.get("views")
    if not isinstance(views, dict) or not views:
        raise ValueError(f"{path}: a [views] table mapping view names to column lists is required")
    seen: dict[str, str] = {}
    for view, columns in views.items():
        if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns):
            raise ValueError(f"{path}: view {view!r} must list its columns as a non-empty list of strings")
        for c in columns:
            if c in seen:
                raise ValueError(f"{path}: column {c!r} is in both view {seen[c]!r} and view {view!r}")
            seen[c] = view
        if len(set(columns)) != len(columns):
            raise ValueError(f"{path}: view {view!r} lists a column twice")
    sites = config.get("sites")
    if not isinstance(sites, list) or not sites:
        raise ValueError(f"{path}: at least one [[sites]] entry with a path is required")
    names = []
    for i, site in enumerate(sites):
        if not isinstance(site, dict) or "path" not in site:
            raise ValueError(f"{path}: site {i} needs a 'path'")
        site.setdefault("name", f"site{i}")
        names.append(check_site_name(site["name"], f"{path}: site {i}"))  # it names an output file
        site["path"] = str((path.parent / site["path"]).resolve())
        if not Path(site["path"]).is_file():
            raise FileNotFoundError(f"{path}: site {site['name']!r}: file {site['path']} does not exist")
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: site names must be unique, got {names}")
    return config


class SiteDataError(SiteError, ValueError):
    """A problem in a site's data file.  Its text names the site, view, column and 1-based row, never a
    cell's value, so a site may send it to the coordinator."""


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and rows; a UTF-8 byte-order mark (Excel's "CSV UTF-8") is dropped, blank lines skipped."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            rows = [row for row in reader if any(cell.strip() for cell in row)]
    except UnicodeDecodeError as exc:  # its own text quotes the file's bytes: not repeated
        raise ValueError(f"{path}: not UTF-8 text (undecodable byte at offset {exc.start})") from None
    except csv.Error as exc:
        raise ValueError(f"{path}: not a readable CSV file (line {reader.line_num}: {exc})") from None
    if not rows:
        raise ValueError(f"{path}: empty file")
    return rows[0], rows[1:]


def read_site_table(path: str | Path, views: dict[str, list[str]], site_name: str) -> dict[str, np.ndarray]:
    """Read one site's file into ``{view: (n, d) float array}`` (absent views omitted)."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            import pandas as pd
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise SiteDataError(f"site {site_name!r}: reading Parquet needs pandas and pyarrow") from exc
        frame = pd.read_parquet(path)
        header = [str(c) for c in frame.columns]
        body = [["" if (isinstance(v, float) and math.isnan(v)) else str(v) for v in row] for row in frame.itertuples(index=False)]
    else:
        header, body = _read_csv(path)
    header = [name.strip() for name in header]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise SiteDataError(f"site {site_name!r}: column(s) {repeated} appear more than once in the header of {path.name}")
    position = {name: j for j, name in enumerate(header)}
    out: dict[str, np.ndarray] = {}
    for view, columns in views.items():
        present = [c for c in columns if c in position]
        if not present:
            continue
        if len(present) != len(columns):
            missing = [c for c in columns if c not in position]
            raise SiteDataError(f"site {site_name!r}, view {view!r}: column(s) {missing} missing from {path.name}")
        values = np.empty((len(body), len(columns)))
        for i, row in enumerate(body):
            for j, c in enumerate(columns):
                cell = row[position[c]].strip() if position[c] < len(row) else ""
                if cell in ("", "NA", "NaN", "nan"):
                    values[i, j] = np.nan
                    continue
                # the message may reach the coordinator: it names the place, never the cell's text
                try:
                    values[i, j] = float(cell)
                except ValueError:
                    raise SiteDataError(
                        f"site {site_name!r}, view {view!r}: non-numeric value in column {c!r}, row {i + 1}"
                    ) from None
                if not math.isfinite(values[i, j]):
                    raise SiteDataError(f"site {site_name!r}, view {view!r}: infinite value in column {c!r}, row {i + 1}")
        empty = np.isnan(values)
        partial = np.flatnonzero(empty.any(axis=1) & ~empty.all(axis=1))
        if partial.size:
            raise SiteDataError(
                f"site {site_name!r}, view {view!r}: {partial.size} row(s) with some but not all of the view's cells "
                f"empty, first at row {partial[0] + 1}; a subject has all of a view's columns or none"
            )
        out[view] = values
    if not out:
        raise SiteDataError(f"site {site_name!r}: {path.name} has none of the configured view columns")
    return out


def fit_from_config(
    config_path: str | Path, *, out_dir: str | Path, total_budget: tuple[float, float] | None = None, progress: bool = True
) -> dict[str, Any]:
    """Fit Fed-mv-PPCA on the sites of a configuration; write model, latents, summary and report."""
    from .data.validation import check_sites
    from .models.mvppca.dp import DPConfig
    from .mvppca import FedMVPPCA

    config = load_config(config_path)
    names = [s["name"] for s in config["sites"]]
    sites = [read_site_table(s["path"], config["views"], s["name"]) for s in config["sites"]]
    check_sites(sites, n_components=config.get("n_components", 5), site_names=names)  # errors name the sites
    n_rounds = config.get("n_rounds", 100)
    privacy = None
    if total_budget is not None:
        # the default EM prior update also releases two posterior-spread scalars per view and round
        privacy = DPConfig.total(*total_budget, n_rounds=n_rounds, n_views=max(len(s) for s in sites), spread=True)
    model = FedMVPPCA(
        n_components=config.get("n_components", 5),
        n_rounds=n_rounds,
        **({"n_local_iter": config["n_local_iter"]} if "n_local_iter" in config else {}),  # else FedMVPPCA's default
        n_first_iter=config.get("n_first_iter", 30),
        random_state=config.get("seed", 0),
        n_init=config.get("n_init", 1),
        **({"tol": config["tol"]} if "tol" in config else {}),  # else FedMVPPCA's default
        init=config.get("init", "pca"),
        local_tol=None if config.get("local_tol") == "none" else config.get("local_tol", 1e-8),
        privacy=privacy,
        progress=progress,
    )
    out = Path(out_dir)
    outputs = [out / "model.npz", out / "summary.json", *(out / f"latent_{name}.csv" for name in names)]
    check_outputs_spare_inputs(outputs, [config_path, *(s["path"] for s in config["sites"])])
    model.fit(sites)
    model.save(out / "model.npz")
    for site, data in zip(config["sites"], sites):
        latent = model.transform(data)
        write_csv(out / f"latent_{site['name']}.csv", [{f"x{j + 1}": float(v) for j, v in enumerate(row)} for row in latent])
    summary = {
        "sites": [s["name"] for s in config["sites"]],
        "views": {v: len(c) for v, c in config["views"].items()},
        "n_components": model.n_components,
        "n_rounds": model.n_rounds,
        "rounds_run": model.n_rounds_,
        "n_init": model.n_init,
        # sent by the sites without privacy only (it is computed from their raw data)
        "final_expected_ll": ell if np.isfinite(ell := model.history_[-1]["expected_ll"]) else None,
        "bytes_sent": int(sum(h["bytes_sent"] for h in model.history_)),
        "model": str(out / "model.npz"),
    }
    if privacy is not None:
        summary["privacy_spent"] = model.privacy_spent_
        names = {s: site["name"] for s, site in enumerate(config["sites"])}
        write_json(out / "privacy-report.json", model.privacy_report(site_names=names))
    write_json(out / "summary.json", summary)
    from .report.mvppca import write_mvppca_report

    names = summary["sites"]
    intro = (
        f"Fed-mv-PPCA on {len(sites)} sites ({', '.join(f'{n}: {len(next(iter(s.values())))} subjects' for n, s in zip(names, sites))}) "
        f"and {len(config['views'])} views ({', '.join(f'{v}: {len(c)} features' for v, c in config['views'].items())}), "
        f"{model.n_components} latent factors, {model.n_rounds_} rounds run. Values are in the units of the sites' files."
    )
    write_mvppca_report(
        out, model, title="Fed-mv-PPCA fit", intro=intro, command=f"fedhier fit --config {Path(config_path).name}",
        summary_rows=[{"quantity": k, "value": summary[k]} for k in ("rounds_run", "final_expected_ll", "bytes_sent")],
        tables=[("Privacy spent per site for the whole fit", [{"site": names[s], **v} for s, v in model.privacy_spent_.items()])]
        if privacy is not None else (),
        sites=sites, site_names=names, feature_names=config["views"],
    )
    summary["report"] = str(out / "report.html")
    return summary
