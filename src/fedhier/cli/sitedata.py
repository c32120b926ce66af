"""The one data model of every ``fedhier`` command: where the sites' rows are, how they are read and scaled.

A configuration (TOML, ``docs/cli.md``) names the sites' data in one of two layouts::

    [sites]                       # one file per site: site name -> file
    cleveland = "cleveland.csv"
    hungary = "hungary.csv"

    file = "heart.csv"            # or one file whose column `site_column` names each row's site
    site_column = "dataset"

and, for every family, ``id`` (a column carried to every per-subject output), ``scale``
(``"standard"``, ``"minmax"`` or ``"none"``: fitted across the sites by one round of sums or
ranges, :class:`fedhier.protocol.scaling.ColumnScalingProtocol`, or, for min-max, built at each site
from public bounds declared in a ``[ranges]`` table, with no round at all; :func:`scale_sites`) and
``partial`` (``"missing"`` or ``"refuse"``).  What is modelled is the family's own key: ``[views]`` (Fed-mv-PPCA),
``target``/``features`` (FedLin), ``variables`` (CollabDict); one file may hold all three, and
the Flower deployment reads the same file plus a ``[flower]`` table.  Every problem is a
one-line ``ValueError``/:class:`~fedhier.data.sitefiles.SiteDataError` naming the site, column
and row; every problem found in one pass is listed.
"""

from __future__ import annotations

import re
import sys
import tomllib
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..data.scaling import ColumnScaling
from ..deploy._toml import CONFIG_KEYS, DATA_KEYS, FAMILY_OPTIONS, MODEL_KEYS, check_key_types, check_missing_values, check_ranges
from ..data.sitefiles import (PARTIAL, SiteDataError, SiteTable, check_within_ranges, close_matches, join_problems,
                              list_names, read_rows, read_table, repeated_ids)
from ..protocol.scaling import SCALES
from ..utils.io import atomic_write_text, markdown_table, write_json
from ..utils.untrusted import check_site_name

__all__ = ["DATA_KEYS", "MODEL_KEYS", "FAMILY_OPTIONS", "SiteData", "load_config", "site_data", "check_columns",
           "complete_rows", "fit_scaling", "scale_sites", "site_warnings", "write_summary", "read_saved_data"]

_ALL_KEYS = CONFIG_KEYS


def load_config(path: str | Path) -> dict[str, Any]:
    """The parsed TOML; an unknown key is refused with the closest allowed one, a key of the wrong TOML type
    (``intercept = "false"``) in one line naming the key and the type it takes."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"configuration file {path} does not exist")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    unknown = sorted(set(raw) - _ALL_KEYS)
    if unknown:
        hints = "".join(close_matches(k, sorted(_ALL_KEYS)) for k in unknown)
        raise ValueError(f"{path}: unknown key(s) {unknown}{hints}; allowed: {sorted(_ALL_KEYS)}")
    check_key_types(raw, str(path))
    return raw


@dataclass
class SiteData:
    """The sites' tables and how to read them (the data keys of a configuration).

    Attributes
    ----------
    tables : list of SiteTable, one per site, in the configuration's order (a site column: order of first appearance)
    id : str or None
    scale : "standard", "minmax" or "none"
    partial : "missing" or "refuse"
    inputs : list of Path, the files read (never overwritten by an output)
    layout : str, for summaries ("one file per site" or "site column 'x' of file")
    site_column : str or None, the column naming each row's site (never a variable)
    ranges : dict column -> (low, high), public bounds declared in ``[ranges]`` (min-max scaling only)
    scaling_outside_privacy : bool, a private fit may fit its scaling on the sites' data, outside the guarantee
    """

    tables: list[SiteTable]
    id: str | None = None
    scale: str = "none"
    partial: str = "missing"
    inputs: list[Path] = field(default_factory=list)
    layout: str = ""
    site_column: str | None = None
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    scaling_outside_privacy: bool = False

    @property
    def names(self) -> list[str]:
        return [t.site for t in self.tables]

    def ids(self, table: SiteTable, keep: Sequence[int] | None = None) -> list[str]:
        """The id of each row (its 1-based row number in the file without an ``id`` column)."""
        values = table.text(self.id) if self.id else [str(r) for r in table.row_numbers]
        return values if keep is None else [values[i] for i in keep]

    def columns(self) -> list[str]:
        """Every column some site's file has, in first-seen order (the site column left out)."""
        seen: dict[str, None] = {}
        for t in self.tables:
            seen.update(dict.fromkeys(t.header))
        return [c for c in seen if c != self.site_column]


def site_data(raw: Mapping[str, Any], source: str | Path, base: str | Path | None = None) -> SiteData:
    """Read the sites' files named by the data keys of ``raw`` (paths relative to ``base``, default ``source``'s folder)."""
    source = str(source)
    base = Path(source).parent if base is None else Path(base)
    scale = raw.get("scale", "none")
    if scale not in SCALES:
        raise ValueError(f"{source}: scale must be one of {list(SCALES)}, got {scale!r}")
    partial = raw.get("partial", "missing")
    if partial not in PARTIAL:
        raise ValueError(f"{source}: partial must be one of {list(PARTIAL)}, got {partial!r}")
    id_column = raw.get("id")
    if id_column is not None and (not isinstance(id_column, str) or not id_column):
        raise ValueError(f"{source}: id must be a column name")
    missing = check_missing_values(raw.get("missing_values", {}), source)
    ranges = check_ranges(raw.get("ranges", {}), source)
    if ranges and scale != "minmax":
        raise ValueError(f"{source}: [ranges] sets a min-max scaling from public bounds: add scale = \"minmax\" "
                         "(or remove [ranges])")
    outside = raw.get("scaling_outside_privacy", False)
    if not isinstance(outside, bool):
        raise ValueError(f"{source}: scaling_outside_privacy must be true or false, got {outside!r}")
    sites, file = raw.get("sites"), raw.get("file")
    flower_sites = raw.get("flower", {}).get("sites") if isinstance(raw.get("flower"), dict) else None
    if sites is None and file is None and isinstance(flower_sites, list) and flower_sites:
        raise ValueError(f"{source}: [flower] names the sites, but a fit on this machine needs each site's file: add a "
                         f"[sites] table, e.g. [sites] {flower_sites[0]} = \"{flower_sites[0]}.csv\"")
    if (sites is None) == (file is None):
        raise ValueError(f"{source}: name the data either with a [sites] table (site name = \"file.csv\") "
                         "or with file = \"data.csv\" and site_column = \"...\"")
    named = _named_columns(raw)
    if file is not None:
        tables, inputs, layout = _split_by_site_column(raw, source, _data_path(base, file), missing, named)
    else:
        tables, inputs, layout = _site_files(sites, source, base, missing, named)
    if id_column is not None:
        lacking = [t for t in tables if not t.has(id_column)]
        if lacking:  # the suggestion and the columns of the sites that lack it
            header = list(dict.fromkeys(name for t in lacking for name in t.header))
            raise ValueError(f"{source}: id column {id_column!r} missing at site(s) {[t.site for t in lacking]}"
                             f"{close_matches(id_column, header)}; columns there: {list_names(header)}")
        repeated = [problem for t in tables if (problem := repeated_ids(t, id_column))]
        if repeated:
            raise SiteDataError(join_problems(repeated))
    data = SiteData(tables, id_column, scale, partial, inputs, layout, raw.get("site_column") if file is not None else None,
                    ranges, outside)
    for key, named in (("[ranges]", ranges), ("missing_values", missing)):
        unknown = [f"{c!r}{close_matches(c, data.columns())}" for c in named if c not in data.columns()]
        if unknown:
            raise ValueError(f"{source}: {key} names column(s) no site's file has: {'; '.join(unknown)} "
                             f"(columns: {list_names(data.columns())})")
    return data


def _data_path(base: Path, given: Any) -> Path:
    """A data file named in a configuration: ``~`` is the user's home; a relative path is relative to ``base``."""
    return (base / Path(str(given)).expanduser()).resolve()


def _not_a_file(path: Path) -> str:
    return f"{path} is a folder, not a data file" if path.is_dir() else f"file {path} does not exist"


def _named_columns(raw: Mapping[str, Any]) -> set[str]:
    """Every column a configuration names (id, site column, views, target, features, variables, label)."""
    single = [raw.get(key) for key in ("id", "site_column", "target", "label")]
    lists = [raw.get(key) for key in ("features", "variables")]
    views = raw.get("views")
    lists += list(views.values()) if isinstance(views, dict) else []
    return {c for c in single + [c for cs in lists if isinstance(cs, list) for c in cs] if isinstance(c, str)}


def _site_files(sites: Any, source: str, base: Path, missing: dict[str, list[str]], named: set[str]
                ) -> tuple[list[SiteTable], list[Path], str]:
    if isinstance(sites, dict) and sites and all(isinstance(v, str) for v in sites.values()):
        entries = list(sites.items())
    elif isinstance(sites, list) and sites and all(isinstance(s, dict) and "path" in s for s in sites):  # [[sites]] name/path
        entries = [(s.get("name", f"site{i}"), s["path"]) for i, s in enumerate(sites)]
    else:
        raise ValueError(f"{source}: [sites] must map each site's name to its file, e.g. cleveland = \"cleveland.csv\"")
    names = [check_site_name(str(name), f"{source}: site {i}") for i, (name, _) in enumerate(entries)]
    if len(set(names)) != len(names):
        raise ValueError(f"{source}: site names must be unique, got {names}")
    paths = [_data_path(base, p) for _, p in entries]
    absent = [f"site {n!r}: {_not_a_file(p)}" for n, p in zip(names, paths) if not p.is_file()]
    if absent:
        raise FileNotFoundError(f"{source}: " + join_problems(absent))
    return [read_table(p, n, missing, named) for n, p in zip(names, paths)], paths, "one file per site"


def _split_by_site_column(raw: Mapping[str, Any], source: str, path: Path, missing: dict[str, list[str]],
                          named: set[str]) -> tuple[list[SiteTable], list[Path], str]:
    column = raw.get("site_column")
    if not isinstance(column, str) or not column:
        raise ValueError(f"{source}: file = \"{path.name}\" needs site_column = \"...\", the column naming each row's site")
    if not path.is_file():
        raise FileNotFoundError(f"{source}: {_not_a_file(path)}")
    pooled = read_table(path, None, missing, named)
    if not pooled.has(column):
        raise ValueError(f"{path.name}: no site column {column!r}{close_matches(column, pooled.header)}; "
                         f"columns: {list_names(pooled.header)}")
    labels = pooled.text(column)
    empty = [i for i, v in enumerate(labels) if not v]
    if empty:
        raise SiteDataError(f"{path.name}: {len(empty)} row(s) with an empty site column {column!r}, first at row "
                            f"{pooled.row_numbers[empty[0]]}")
    order = list(dict.fromkeys(labels))
    for name in order:
        check_site_name(name, f"{path.name}: site column {column!r}")
    tables = [pooled.subset(name, [i for i, v in enumerate(labels) if v == name]) for name in order]
    return tables, [path], f"site column {column!r} of {path.name}"


def check_columns(data: SiteData, groups: Mapping[str, Sequence[str]], *, exclude: Sequence[str] = ()) -> None:
    """Refuse, in one message, every configured column that no site's file has.

    ``groups``: label (e.g. ``"view 'lab'"``, ``"features"``) -> its columns.  The message names the
    closest existing column and lists the available ones.
    """
    available = [c for c in data.columns() if c not in exclude]
    problems, nowhere = [], False
    for label, columns in groups.items():
        for c in columns:
            if not any(t.has(c) for t in data.tables):
                problems.append(f"{label}: column {c!r} not found in any site's file{close_matches(c, available)}")
                nowhere = True
                continue
            for t in data.tables:  # a name differing only in case or spaces is a mistake, not an unmeasured column
                near = [] if t.has(c) else [h for h in t.header if _folded(h) == _folded(c)]
                if near:
                    problems.append(f"{label}: column {c!r} not found at site {t.site!r}; did you mean {near[0]!r}? "
                                    f"(names must match exactly, case included: rename it in {t.path.name})")
    if problems:
        raise ValueError(join_problems(problems) + (f" (columns: {list_names(available)})" if nowhere else ""))


def _folded(name: str) -> str:
    """A column name without case or spaces, to catch ``Age`` for ``age`` and ``body mass`` for ``bodymass``."""
    return "".join(name.split()).lower()


def complete_rows(data: SiteData, columns: Sequence[str], what: str, notes: list[str], min_rows: int = 1
                  ) -> tuple[list[np.ndarray], list[np.ndarray], list[str]]:
    """Every site's complete rows of ``columns`` (:func:`~fedhier.data.sitefiles.read_rows`), for models that need every cell.

    Returns ``(values per site, kept row positions per site, problems)``: the problems of all sites, each
    site needing at least ``min_rows`` complete rows, for the caller to raise in one message.
    """
    problems: list[str] = []
    sites, kept = [], []
    for table in data.tables:
        try:
            values, rows = read_rows(table, columns, partial=data.partial, what=what, notes=notes)
        except SiteDataError as exc:
            problems.append(str(exc))
            continue
        if len(rows) < min_rows:
            problems.append(f"site {table.site!r}: {len(rows)} complete row(s); a site needs at least {min_rows}")
        sites.append(values)
        kept.append(rows)
    return sites, kept, problems


def fit_scaling(kind: str, columns: Sequence[str], site_arrays: Sequence[np.ndarray], seed: int | None = 0,
                aggregation: str = "plain") -> ColumnScaling:
    """Fit ``kind`` scaling of ``columns`` across the sites by one round of :func:`~fedhier.runtime.simulate.simulate`.

    ``site_arrays``: one ``(n_s, len(columns))`` array per site, NaN for a missing cell.  Only
    per-column counts and sums (standard) or counts, minima and maxima (min-max) leave a site.
    ``aggregation="secure"`` (the fit's own setting): the standard scaling's sums are formed by
    secure summation, so the coordinator learns only the totals; min-max ranges are not sums and
    are sent in the clear.
    """
    if kind == "none":
        return ColumnScaling("none", columns)
    from ..protocol.scaling import ColumnScalingProtocol
    from ..runtime.simulate import simulate

    nowhere = [c for j, c in enumerate(columns) if all(np.isnan(X[:, j]).all() for X in site_arrays)]
    if nowhere:
        raise ValueError(f"scale = {kind!r}: column(s) {nowhere} observed at no site")
    secure = aggregation == "secure" and kind == "standard"
    aggregator = None
    if secure:
        from ..secure.secure_round import SecureAggregator

        aggregator = SecureAggregator(len(site_arrays))
    result = simulate(ColumnScalingProtocol(len(columns), kind), list(site_arrays), n_rounds=1, random_state=seed,
                      aggregation="secure" if secure else "plain", aggregator=aggregator)
    return ColumnScaling(kind, columns, result.broadcast["center"], result.broadcast["scale"])


def scale_sites(data: SiteData, columns: Sequence[str], site_arrays: Sequence[np.ndarray], *, private: bool = False,
                source: str = "", seed: int | None = 0, aggregation: str = "plain") -> tuple[ColumnScaling, str | None]:
    """The scaling of ``columns`` (``data.scale``): from the declared ``[ranges]`` where given, else fitted on the sites' data.

    A column with a declared range ``(low, high)`` is scaled ``(x - low) / (high - low)`` at each site, from the
    configuration alone: no message is exchanged for it, and a value outside the range is refused (naming the
    site, column and first row).  The other columns are fitted across the sites by :func:`fit_scaling`, whose
    statistics (per-site minima and maxima, or per-column sums) are not differentially private: in a
    ``private`` fit that is refused, before anything leaves a site, unless ``data.scaling_outside_privacy``.

    Returns ``(scaling, disclosure)``: ``disclosure`` says in plain words what left the sites outside the
    privacy guarantee (a private fit that opted in), else None.
    """
    if data.scale == "none":
        return ColumnScaling("none", columns), None
    declared = {c: data.ranges[c] for c in columns if c in data.ranges}
    check_within_ranges(data.tables, declared)
    derived = [c for c in columns if c not in declared]
    if derived and private and not data.scaling_outside_privacy:
        raise ValueError(f"{source}: this fit is private (epsilon), but scale = {data.scale!r} would first send "
                         f"{_scaling_statistics(data.scale, aggregation, derived)} to the coordinator, outside the "
                         "privacy guarantee; declare public bounds in a [ranges] table (column = [low, high]) with "
                         "scale = \"minmax\", or scale the files beforehand and set scale = \"none\", or set "
                         "scaling_outside_privacy = true to send them anyway (the summary and report then say so)")
    columns = list(columns)
    center, scale = np.empty(len(columns)), np.empty(len(columns))
    if declared:  # built from the configuration alone
        j = [columns.index(c) for c in declared]
        public = ColumnScaling.from_ranges(list(declared), declared)
        center[j], scale[j] = public.center, public.scale
    if derived:  # one round across the sites
        j = [columns.index(c) for c in derived]
        fitted = fit_scaling(data.scale, derived, [np.asarray(X)[:, j] for X in site_arrays], seed=seed,
                             aggregation=aggregation)
        center[j], scale[j] = fitted.center, fitted.scale
    disclosure = None
    if derived and private:
        disclosure = (f"Outside the privacy guarantee (scaling_outside_privacy = true): before the fit, "
                      f"{_scaling_statistics(data.scale, aggregation, derived)} went to the coordinator to fit the "
                      f"{data.scale} scaling; the privacy spent reported covers the model's rounds only.")
    return ColumnScaling(data.scale, columns, center, scale), disclosure


def _scaling_statistics(kind: str, aggregation: str, columns: Sequence[str]) -> str:
    """What the scaling round sends, in plain words."""
    if kind == "minmax":
        return f"every site's exact minimum, maximum and count of column(s) {list(columns)}, in the clear"
    if aggregation == "secure":
        return (f"the exact per-column counts, sums and sums of squares of column(s) {list(columns)}, securely "
                "summed (the coordinator learns the totals over all sites, without noise)")
    return f"every site's exact per-column counts, sums and sums of squares of column(s) {list(columns)}, in the clear"


def _advice(scale: str) -> str:
    """The library's advice on a view whose variance is below the sigma2 prior's floor, as a configuration says it."""
    if scale == "standard":  # the data are already on a unit scale: the site's entries of the view hardly vary
        return ("The data are already standardised across the sites (scale = \"standard\"), so this site's entries of the "
                "view hardly vary (a constant column, or few observed rows): check its columns there, or set "
                "sigma2_prior = \"none\".")
    return ('The defaults assume data on a unit scale: set scale = "standard" in the configuration (a min-max scaling, '
            'above all with wide [ranges], can leave a column\'s variance far below 1), or sigma2_prior = "none".')


#: the opening of a warning about one site (and view): "site 'A': ..." or "site 'A', view 'v': ..."
_WHERE = re.compile(r"^(site '[^']*'(?:, view '[^']*')?): (.*)$", re.S)
#: most places a grouped warning lists by name
_LISTED = 5


def group_warnings(texts: Sequence[str]) -> list[str]:
    """One line per kind of warning: the warnings that differ only in the site (and view) they open with and in
    their figures become the first one's text, opened by every place it holds for (the figures are the first
    place's), e.g. ``site 'A', view 'v' (and 3 more: site 'B', view 'v'; ...): ...``.  Repeats are dropped."""
    kinds: dict[str, list[tuple[str, str]]] = {}
    for text in dict.fromkeys(texts):
        match = _WHERE.match(text)
        where, rest = match.groups() if match else ("", text)
        kinds.setdefault(re.sub(r"[-+]?\d[\d.]*(e[-+]?\d+)?", "#", rest), []).append((where, rest))
    lines = []
    for members in kinds.values():
        (where, rest), others = members[0], [w for w, _ in members[1:] if w]
        if not where or not others:
            lines.append(f"{where}: {rest}" if where else rest)
            continue
        listed = "; ".join(others[:_LISTED]) + (f"; and {len(others) - _LISTED} more" if len(others) > _LISTED else "")
        figures = "" if all(r == rest for _, r in members) else f" (the figures are {where}'s)"
        lines.append(f"{where} (and {len(others)} more alike: {listed}): {rest}{figures}")
    return lines


@contextmanager
def site_warnings(names: Sequence[str], scale: str = "none"):
    """Show the estimator's warnings as one line per kind (``fedhier: warning: ...``, :func:`group_warnings`), sites
    by name, no source line, with the library's advice in the words of a configuration file scaled by ``scale``."""
    with warnings.catch_warnings(record=True) as caught:
        yield
    if caught:
        from ..protocol.mvppca import SCALE_ADVICE  # the protocol's model math, imported only to reword its advice
    texts = [re.sub(r"\bsite (\d+)\b",
                    lambda m: f"site {names[int(m.group(1))]!r}" if int(m.group(1)) < len(names) else m.group(0),
                    str(w.message)).replace(SCALE_ADVICE, _advice(scale)) for w in caught]
    for line in group_warnings(texts):
        print(f"fedhier: warning: {line}", file=sys.stderr)


def write_summary(out: Path, summary: Mapping[str, Any], *, title: str, notes: Sequence[str] = (),
                  tables: Sequence[tuple[str, Sequence[Mapping[str, Any]]]] = ()) -> None:
    """``summary.json`` (everything) and ``summary.md`` (the scalar entries as a table, the notes, then ``tables``)."""
    write_json(out / "summary.json", {**summary, "notes": list(notes)})
    rows = [{"quantity": k, "value": v if isinstance(v, (int, float, str)) or v is None else str(v)}
            for k, v in summary.items() if not isinstance(v, (dict, list)) or k in ("sites",)]
    text = f"# {title}\n\n" + markdown_table(rows)
    if notes:
        text += "\n\n## Notes on the data\n\n" + "\n".join(f"- {n}" for n in notes)
    for caption, rows in tables:
        text += f"\n\n## {caption}\n\n" + markdown_table(rows)
    atomic_write_text(out / "summary.md", text + "\n")


def read_saved_data(folder: Path) -> dict[str, Any]:
    """The data description a result folder's ``summary.json`` records (sites, columns, scaling, id), for scoring."""
    import json

    path = folder / "summary.json"
    if not path.is_file():
        return {}
    try:
        summary = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"{path}: not a fedhier summary (invalid JSON)") from None
    return summary if isinstance(summary, dict) else {}
