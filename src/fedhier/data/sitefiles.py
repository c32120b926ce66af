"""Reading a site's data file as a user has it: one reader for every command line and deployment.

A site's file is a comma-separated CSV (optionally gzip-compressed, ``.csv.gz``) or Parquet table
with a header row and at least one data row, every row with one field per column (empty fields
after the last column aside).  A file saved with ';' or tabs, a first line that looks like data
and a row with a field missing or extra are refused, by file and line.  A cell is read as

* a number (``12``, ``-0.5``, ``1e3``);
* a boolean, as 0/1: ``True``/``False``/``true``/``false``/``yes``/``no`` (any capitalisation);
* missing: an empty cell, ``NA``, ``N/A``, ``NaN``, ``nan``, ``null``;

anything else is a problem, reported by site, column and 1-based data row, never by the
cell's text (a message may reach the coordinator of a federated fit).  A column that a
site's file lacks, or whose every cell is empty, is *not measured* at that site.

Rows of a view (a group of columns that a subject has together) with some but not all
cells empty are *partly observed*: with ``partial="missing"`` (default) the subject lacks
the view; with ``partial="refuse"`` they are an error naming the first such row.
"""

from __future__ import annotations

import csv
import difflib
import gzip
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, Mapping, Sequence

import numpy as np

from ..protocol.base import SiteError

__all__ = ["SiteDataError", "SiteTable", "read_table", "list_names", "read_site_table", "parse_column", "check_within_ranges", "close_matches",
           "PARTIAL", "MISSING_CELLS", "BOOLEAN_CELLS"]

#: cells read as missing (compared case-insensitively after stripping spaces)
MISSING_CELLS = frozenset({"", "na", "n/a", "nan", "null"})
#: cells read as booleans, 1.0 or 0.0 (case-insensitive)
BOOLEAN_CELLS = {"true": 1.0, "false": 0.0, "yes": 1.0, "no": 0.0}
#: what to do with a partly observed view: treat the subject's view as missing, or refuse the file
PARTIAL = ("missing", "refuse")
#: problems listed in one message before "and N more"
_MAX_LISTED = 6
#: column names listed in one message before "… and N more"
_MAX_NAMES = 20
#: data rows searched for a first line's fields when telling a header from a first row of data (a category recurs early)
_ROWS_COMPARED = 100


class SiteDataError(SiteError, ValueError):
    """A problem in a site's data file.  Its text names the site, view, column and 1-based row, never a
    cell's value, so a site may send it to the coordinator."""


def _at(site: str | None) -> str:
    """A message's opening naming the site, if the file is a site's."""
    return f"site {site!r}: " if site is not None else ""


def join_problems(problems: Sequence[str]) -> str:
    """Several problems as one line: ``p1; p2; ... (and N more)``."""
    shown = "; ".join(problems[:_MAX_LISTED])
    return shown + (f" (and {len(problems) - _MAX_LISTED} more)" if len(problems) > _MAX_LISTED else "")


def list_names(names: Sequence[str]) -> str:
    """``['a', 'b', ...]`` with at most 20 names, then ``… and N more`` (a file may have thousands of columns)."""
    shown = repr(list(names[:_MAX_NAMES]))
    return shown + (f" … and {len(names) - _MAX_NAMES} more" if len(names) > _MAX_NAMES else "")


def close_matches(name: str, available: Sequence[str]) -> str:
    """``; did you mean 'x'?`` for the closest of ``available`` (case-insensitive), or ``""``."""
    lowered = {a.lower(): a for a in available}
    low = name.lower()
    hits = difflib.get_close_matches(low, list(lowered), n=3, cutoff=0.6)
    hits += [a for a in lowered if a not in hits and min(len(a), len(low)) >= 3 and (low.startswith(a) or a.startswith(low))]
    hits = hits[:3]
    return f"; did you mean {', '.join(repr(lowered[h]) for h in hits)}?" if hits else ""


@dataclass
class SiteTable:
    """One site's rows as text.

    Attributes
    ----------
    site : str or None
        The site's name (used in every message); None for a file that is no site's (e.g. rows to score), whose
        messages then name the file.
    path : Path
        The file the rows come from (a pooled file for a site column).
    header : list of str
        Column names, spaces around them removed.
    rows : list of list of str
        The site's data rows, cells as text.
    row_numbers : list of int
        1-based data row number of each row in ``path`` (header not counted).
    missing : mapping column -> set of str
        Cells that also mean "missing" in a column (lower case), besides :data:`MISSING_CELLS`
        (e.g. ``{"chol": {"0", "0.0"}}`` where a zero cholesterol is a missing measurement).
    """

    site: str | None
    path: Path
    header: list[str]
    rows: list[list[str]]
    row_numbers: list[int] = field(default_factory=list)
    missing: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.row_numbers:
            self.row_numbers = list(range(1, len(self.rows) + 1))
        self._position = {name: j for j, name in enumerate(self.header)}

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def label(self) -> str:
        """How messages name the rows: the site, or the file when it is no site's."""
        return f"site {self.site!r}" if self.site is not None else self.path.name

    def has(self, column: str) -> bool:
        return column in self._position

    def text(self, column: str) -> list[str]:
        """The cells of ``column`` as stripped text ("" for a short row)."""
        j = self._position[column]
        return [row[j].strip() if j < len(row) else "" for row in self.rows]

    def is_missing(self, column: str, cell: str) -> bool:
        """True for an empty cell, a missing marker, or one of the column's own missing markers."""
        low = cell.lower()
        return low in MISSING_CELLS or low in self.missing.get(column, ())

    def measures(self, column: str) -> bool:
        """True when the file has ``column`` and at least one of its cells is not missing."""
        return self.has(column) and any(not self.is_missing(column, c) for c in self.text(column))

    def subset(self, site: str, keep: Sequence[int]) -> "SiteTable":
        """The rows at positions ``keep`` as the table of ``site`` (splitting a pooled file by its site column)."""
        return SiteTable(site, self.path, self.header, [self.rows[i] for i in keep], [self.row_numbers[i] for i in keep],
                         self.missing)


#: the first bytes of a spreadsheet program's own formats: .xlsx/.ods (a zip archive), .xls (an OLE2 file)
_SPREADSHEET_MAGIC = (b"PK\x03\x04", b"\xd0\xcf\x11\xe0")
SAVE_AS_CSV = "in Excel or LibreOffice, save it with File > Save As > \"CSV UTF-8 (Comma delimited) (*.csv)\""


def _not_utf8(site: str | None, path: Path) -> SiteDataError:
    """The error for a file that is not UTF-8 text: a spreadsheet workbook, or text in another encoding (the line
    of the first byte that is not UTF-8; never the bytes, which may be a subject's data)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if raw.startswith(_SPREADSHEET_MAGIC):
        return SiteDataError(f"{_at(site)}{path.name} is a spreadsheet workbook, not a CSV file; {SAVE_AS_CSV}")
    try:
        raw.decode("utf-8")
        line = 1
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
    return SiteDataError(f"{_at(site)}{path.name} is not UTF-8 text (first at line {line}; likely Latin-1 or Windows-1252, "
                         f"as older Excel saves CSV files); {SAVE_AS_CSV}, or convert it with iconv -f latin1 -t utf-8")


def _read_csv(path: Path, site: str | None = None) -> tuple[list[str], list[list[str]], list[int], list[int]]:
    """Header, rows, their 1-based data row numbers and the file line each ends on; a UTF-8 byte-order mark is
    dropped, blank lines (also lines of only commas) skipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    reader = None
    rows, lines = [], []
    try:
        with opener(path, "rt", newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            for row in reader:
                if any(cell.strip() for cell in row):
                    rows.append(row)
                    lines.append(reader.line_num)
    except UnicodeDecodeError:  # its own text quotes the file's bytes: not repeated
        raise _not_utf8(site, path) from None
    except (csv.Error, gzip.BadGzipFile, EOFError) as exc:
        line = f"line {reader.line_num}: " if reader is not None else ""
        raise SiteDataError(f"{path}: not a readable CSV file ({line}{type(exc).__name__})") from None
    if not rows:
        raise SiteDataError(f"{path}: empty file")
    return rows[0], rows[1:], list(range(1, len(rows))), lines[1:]


def _check_header(site: str | None, path: Path, header: list[str], body: list[list[str]],
                  expected: Collection[str] = ()) -> None:
    """Refuse a first line that is not a comma-separated header: one field holding ';' or a tab (a file saved with
    another separator), or cells (a file without a header, whose first subject would be read as the column names).
    A first line reads as cells when none of its fields is a column the configuration names in ``expected`` (so
    that numbers as column names, e.g. gene ids, are read when configured) and either more than half its fields
    are numbers or booleans, or more than half are values of their own column further down (a file of mostly text,
    e.g. ``Male`` under a column of ``Male``/``Female``; a real column name is not among its own column's cells).
    The message never quotes the line: it may be a subject's data."""
    if len(header) == 1:
        for mark, name in ((";", "';'"), ("\t", "a tab")):
            if mark in header[0]:
                raise SiteDataError(f"{_at(site)}{path.name} seems to use {name} as separator; fedhier reads "
                                    "comma-separated files (save as CSV UTF-8 with commas)")
    named = [(j, name.strip()) for j, name in enumerate(header) if name.strip()]
    if not named or {name for _, name in named} & set(expected):
        return
    half = len(named) / 2
    numbers = sum(1 for _, name in named if _is_number(name) or name.lower() in BOOLEAN_CELLS)
    first = body[:_ROWS_COMPARED]
    recurring = 0 if numbers > half else sum(
        1 for j, name in named if any(j < len(row) and row[j].strip() == name for row in first))
    if numbers > half or recurring > half:
        raise SiteDataError(f"{_at(site)}the first line of {path.name} looks like data, not a header naming the "
                            "columns; add a first line with the column names")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _check_widths(site: str | None, path: Path, header: list[str], body: list[list[str]], lines: list[int]) -> None:
    """Refuse a row with fewer or more fields than the header (its values would land in the wrong columns), naming
    the file's line and the counts, never a value.  Tolerated: fields beyond the header that are empty (a trailing
    comma) and, under header fields that are themselves empty (a trailing comma in the header), absent fields."""
    width = len(header)
    named = width
    while named and not header[named - 1].strip():
        named -= 1
    wrong = [i for i, row in enumerate(body)
             if len(row) < named or any(cell.strip() for cell in row[width:])]
    if wrong:
        first = body[wrong[0]]
        count = len(first)
        while count > width and not first[count - 1].strip():  # trailing empty fields are not counted
            count -= 1
        more = f" (and {len(wrong) - 1} more line(s))" if len(wrong) > 1 else ""
        raise SiteDataError(f"{_at(site)}{path.name}, line {lines[wrong[0]]}: {count} fields, the header has {named}"
                            f"{more}; every row needs one field per column")


def _read_parquet(path: Path, site: str | None) -> tuple[list[str], list[list[str]], list[int]]:
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - depends on the installation
        raise SiteDataError(f'{_at(site)}reading Parquet needs pandas and pyarrow: pip install -e ".[stats]" pyarrow') from None
    frame = pd.read_parquet(path)
    header = [str(c) for c in frame.columns]
    body = [["" if (isinstance(v, float) and math.isnan(v)) or v is None else str(v) for v in row]
            for row in frame.itertuples(index=False)]
    return header, body, list(range(1, len(body) + 1))


def read_table(path: str | Path, site: str | None, missing: Mapping[str, Sequence[str]] | None = None,
               expected: Collection[str] = ()) -> SiteTable:
    """Read a whole file as text; a column named twice in the header is an error.

    ``missing``: column -> cells that also mean missing there (see :attr:`SiteTable.missing`); ``expected``: the
    columns the configuration names (a first line naming one of them is a header, however numeric).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{_at(site)}data file {path} does not exist")
    if path.suffix.lower() in (".xlsx", ".xlsm", ".xls", ".ods"):
        raise SiteDataError(f"{_at(site)}{path.name} is a spreadsheet workbook, not a CSV file; {SAVE_AS_CSV}")
    if path.suffix == ".parquet":
        header, body, numbers = _read_parquet(path, site)
    else:
        header, body, numbers, lines = _read_csv(path, site)
        _check_header(site, path, header, body, expected)
        _check_widths(site, path, header, body, lines)
    header = [name.strip() for name in header]
    if not body:
        raise SiteDataError(f"{_at(site)}{path.name} has a header but no data rows")
    repeated = sorted({name for name in header if name and header.count(name) > 1})  # unnamed: trailing commas
    if repeated:
        raise SiteDataError(f"{_at(site)}column(s) {repeated} appear more than once in the header of {path.name}")
    marks = {c: frozenset(str(v).strip().lower() for v in values) for c, values in (missing or {}).items()}
    return SiteTable(site, path, header, body, numbers, marks)


def parse_column(table: SiteTable, column: str, problems: list[str], where: str = "") -> np.ndarray:
    """The cells of ``column`` as floats (missing -> NaN, booleans -> 0/1).

    A cell that is neither is appended to ``problems`` (site, column, first row and how many
    more, never the text) and read as NaN; a column the file lacks is all NaN.
    """
    if not table.has(column):
        return np.full(len(table), np.nan)
    cells = table.text(column)
    if not table.missing.get(column):
        # every cell a finite number (no missing marker or boolean parses as one): the cells' floats, read at once
        try:
            values = np.fromiter(map(float, cells), dtype=float, count=len(cells))
        except ValueError:
            values = None
        if values is not None and np.isfinite(values).all():
            return values
    out = np.empty(len(table))
    bad: list[int] = []
    infinite: list[int] = []
    for i, cell in enumerate(cells):
        low = cell.lower()
        if table.is_missing(column, cell):
            out[i] = np.nan
        elif low in BOOLEAN_CELLS:
            out[i] = BOOLEAN_CELLS[low]
        else:
            try:
                out[i] = float(cell)
            except ValueError:
                out[i] = np.nan
                bad.append(i)
                continue
            if not math.isfinite(out[i]):
                out[i] = np.nan
                infinite.append(i)
    prefix = f"{table.label}{where}: "
    key = column if re.fullmatch(r"[A-Za-z0-9_-]+", column) else json.dumps(column)  # as a TOML key
    for rows, what, hint in ((bad, "non-numeric value", f" (if it marks a missing value, add it to the configuration: "
                                                         f"missing_values = {{ {key} = [...] }})"),
                             (infinite, "infinite value", "")):
        if rows:
            more = f" and {len(rows) - 1} more row(s)" if len(rows) > 1 else ""
            problems.append(f"{prefix}{what} in column {column!r}, row {table.row_numbers[rows[0]]}{more}{hint}")
    return out


def repeated_ids(table: SiteTable, column: str) -> str | None:
    """The problem of ids in ``column`` that appear on more than one row of ``table`` (a subject counted twice), or
    None.  An id is data: the message counts them, never shows one."""
    counts = Counter(v for v in table.text(column) if v)
    twice = sum(1 for n in counts.values() if n > 1)
    if not twice:
        return None
    return (f"{table.label}: {twice} id(s) in column {column!r} appear on more than one row of {table.path.name}; "
            "each subject needs its own id")


def check_id_column(table: SiteTable, column: str | None) -> None:
    """Refuse a site's file that lacks the configured id column or repeats an id (a deployed site's own check; the
    command line checks every site's file at once)."""
    if column is None:
        return
    if not table.has(column):
        raise SiteDataError(f"{table.label}: id column {column!r} missing in {table.path.name}"
                            f"{close_matches(column, table.header)}; columns: {list_names(table.header)}")
    problem = repeated_ids(table, column)
    if problem:
        raise SiteDataError(problem)


def check_within_ranges(tables: Sequence[SiteTable], ranges: Mapping[str, tuple[float, float]]) -> None:
    """Refuse values outside public bounds ``column -> (low, high)``: one :class:`SiteDataError` listing, per site and
    column holding such a value, the site, the column, how many rows and the first (never the value).  Columns a
    file lacks and cells that are not numbers are left to the reader's own checks."""
    problems: list[str] = []
    for table in tables:
        for column, (low, high) in ranges.items():
            values = parse_column(table, column, [])
            outside = np.flatnonzero((values < low) | (values > high))
            if outside.size:
                problems.append(f"{table.label}: column {column!r}: {outside.size} value(s) outside its declared "
                                f"range in [ranges], first at row {table.row_numbers[outside[0]]}")
    if problems:
        raise SiteDataError(join_problems(problems))


def read_site_table(path: str | Path | SiteTable, views: dict[str, list[str]], site_name: str, *,
                    partial: str = "missing", notes: list[str] | None = None,
                    missing: Mapping[str, Sequence[str]] | None = None) -> dict[str, np.ndarray]:
    """Read one site's views into ``{view: (n, d) float array}``; views the site does not measure are omitted.

    A view is not measured at a site when the file lacks, or has only empty cells in, any of its
    columns (with ``partial="refuse"``, only when it lacks all of them).  A subject whose view
    is partly observed lacks that view (its row is all NaN) unless ``partial="refuse"``.  Every
    problem of the file is listed in one :class:`SiteDataError`.  ``notes`` receives one line
    per view left out or per partly observed view.  ``missing``: a column's own missing markers.
    """
    if partial not in PARTIAL:
        raise ValueError(f"partial must be one of {list(PARTIAL)}, got {partial!r}")
    table = path if isinstance(path, SiteTable) else read_table(path, site_name, missing)
    notes = [] if notes is None else notes
    problems: list[str] = []
    out: dict[str, np.ndarray] = {}
    for view, columns in views.items():
        unmeasured = [c for c in columns if not table.measures(c)]
        if len(unmeasured) == len(columns):
            empty = [c for c in columns if table.has(c)]
            if empty:
                notes.append(f"site {site_name!r}, view {view!r}: column(s) {empty} empty or missing at every row, so "
                             "the view is not measured there")
            else:
                notes.append(f"site {site_name!r}, view {view!r}: column(s) {list(columns)} not in {table.path.name}, "
                             "so the view is not measured there")
            continue
        where = f", view {view!r}"
        values = np.column_stack([parse_column(table, c, problems, where) for c in columns])
        if unmeasured:
            if partial == "refuse":
                lacking = [c for c in unmeasured if not table.has(c)]
                problems.append(f"site {site_name!r}{where}: column(s) {lacking or unmeasured} "
                                f"{'missing from ' + table.path.name if lacking else 'empty at every row'}; "
                                "with partial = \"refuse\" a site measures all of a view's columns or none")
                continue
            notes.append(f"site {site_name!r}{where}: column(s) {unmeasured} not measured there, so the view is "
                         "left out at this site")
            continue
        empty = np.isnan(values)
        some = np.flatnonzero(empty.any(axis=1) & ~empty.all(axis=1))
        if some.size:
            if partial == "refuse":
                problems.append(f"site {site_name!r}{where}: {some.size} row(s) with some but not all of the view's "
                                f"cells empty, first at row {table.row_numbers[some[0]]}; with partial = \"refuse\" "
                                "a subject has all of a view's columns or none")
                continue
            values[some] = np.nan
            notes.append(f"site {site_name!r}{where}: {some.size} subject(s) observed in only part of the view "
                         "are treated as lacking it")
        out[view] = values
    if problems:
        raise SiteDataError(join_problems(problems))
    if not out:
        wanted = [c for cols in views.values() for c in cols]
        raise SiteDataError(f"site {site_name!r}: {table.path.name} measures none of the configured columns {wanted}")
    return out


def read_rows(table: SiteTable, columns: Sequence[str], *, partial: str = "missing", what: str = "columns",
              notes: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Complete rows of ``columns``: ``(values (n_kept, m), kept row positions (n_kept,))``.

    For models that need every cell (FedLin, CollabDict).  A column the site does not measure is an
    error; a row with an empty cell is left out (``partial="missing"``, noted) or an error naming
    its row (``"refuse"``).  Every problem of the site is listed in one :class:`SiteDataError`.
    """
    problems: list[str] = []
    unmeasured = [c for c in columns if not table.measures(c)]
    if unmeasured:
        raise SiteDataError(
            f"{table.label}: column(s) {unmeasured} not measured there (absent or empty at every row); "
            f"every site needs all the {what}: remove them from {what} or leave the site out")
    values = np.column_stack([parse_column(table, c, problems) for c in columns])
    if problems:
        raise SiteDataError(join_problems(problems))
    empty = np.isnan(values).any(axis=1)
    if empty.any():
        first = int(np.flatnonzero(empty)[0])
        column = columns[int(np.flatnonzero(np.isnan(values[first]))[0])]
        if partial == "refuse":
            raise SiteDataError(f"{table.label}: {int(empty.sum())} row(s) with an empty cell, first in column "
                                f"{column!r}, row {table.row_numbers[first]}; with partial = \"refuse\" every cell is needed")
        if notes is not None:
            notes.append(f"{table.label}: {int(empty.sum())} row(s) with an empty cell left out (first: column "
                         f"{column!r}, row {table.row_numbers[first]})")
    kept = np.flatnonzero(~empty)
    return values[kept], kept

