"""Atomic file output: a reader never sees a half-written file (issue "Bad input")."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["atomic_write_bytes", "atomic_write_text", "remove_stale_temporaries", "write_csv", "write_json", "json_text",
           "markdown_table"]


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    An OSError of the writing itself (a full disk: ``ENOSPC``) names ``path``; the temporary file is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path)) from exc
        raise
    return path


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files an interrupted :func:`atomic_write_bytes` of ``path`` left (a process killed
    between its write and its rename): ``.NAME.XXXXXXXX`` beside ``path``.  Call it where one process alone
    writes ``path`` (a fit's own checkpoint).  Returns the files removed."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}")
    removed = []
    for entry in path.parent.glob(f".{path.name}.*"):
        if pattern.fullmatch(entry.name) and entry.is_file() and not entry.is_symlink():
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def _numpy_scalar(value: Any) -> Any:
    """``json`` fallback: a numpy scalar (``np.int64(3)``, ``np.float32(0.5)``) as the Python number it holds."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_text(obj: Any, **options: Any) -> str:
    """``json.dumps`` that also writes numpy scalars, e.g. hyper-parameters a user passed as ``np.int64``."""
    return json.dumps(obj, default=_numpy_scalar, **options)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json_text(obj, indent=2, sort_keys=True) + "\n")


def write_csv(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> Path:
    """Write a list of dict rows as CSV (columns: given order, else first-seen order)."""
    if columns is None:
        columns = list(dict.fromkeys(k for row in rows for k in row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="raise", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return atomic_write_text(path, buf.getvalue())


def _fmt(value: Any, digits: int) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def markdown_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None, digits: int = 4) -> str:
    """Render dict rows as a GitHub markdown table."""
    rows = list(rows)
    if columns is None:
        columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c, ""), digits) for c in columns) + " |")
    return "\n".join(lines) + "\n"
