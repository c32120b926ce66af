"""Shared experiment runner: deterministic cells, resumable results, summaries (spec fed-mv-ppca §12.3).

An experiment is a list of :class:`Task` s.  A task is one setting of the *key* columns
(e.g. repetition, fold, scenario, number of sites) and the methods still to run there; a
*cell* is one (key, method) pair and produces one row of ``results.csv``.

:class:`Runner` writes into one output folder:

* ``run.json`` -- experiment name, seed, quick flag, the design, cells done / planned and
  the accumulated wall time (over resumed sessions);
* ``results.csv`` -- one row per finished cell, rewritten atomically after every task;
* whatever the experiment writes next (summary tables, ``report.md``, figures).

Resuming: a run in a folder that already holds ``results.csv`` skips the cells present
there, so an interrupted run continues where it stopped.  A folder written with another
seed, quick flag or design is refused (``ValueError``) instead of being mixed.

Determinism: every random choice of a cell derives from :func:`cell_seed` of the run
seed and the cell's key, never from the order in which cells run, so results do not
depend on resuming nor on the number of processes.

Parallel cells: at most ``n_processes`` worker processes (each limited to one BLAS /
torch thread); the parent alone writes files.

Progress: the time left is the measured ``seconds`` of finished cells carried over to the
cells still to run -- the median over finished cells of the same method and the same key
apart from its repetition and fold, else of the same method -- summed and divided by
``n_processes``.  Cells differ in cost by orders of magnitude (a training mean against a
VAE), so extrapolating from the count of cells done would be far off in a resumed run whose
cheap cells are done.  While some method to run has no finished cell yet, the count is
extrapolated.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
import zlib
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..utils.io import write_csv, write_json
from ..utils.progress import StepProgress

__all__ = [
    "Task",
    "Runner",
    "cell_seed",
    "read_results",
    "summarise",
    "format_mean_std",
    "limit_threads",
]

RESULTS = "results.csv"
RUN = "run.json"
#: key columns over which a cell repeats the same work (its cost does not depend on them)
REPLICATE_COLUMNS = ("repeat", "fold")


def cell_seed(seed: int, *key: Any) -> int:
    """A 63-bit seed from the run seed and a key (ints and strings), stable across runs.

    Strings enter through CRC-32, so the seed of a cell does not depend on Python's
    per-process hash randomisation.
    """
    words = [int(seed)]
    for k in key:
        if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            words.append(int(k))
        else:
            words.append(zlib.crc32(str(k).encode("utf-8")))
    return int(np.random.SeedSequence(words).generate_state(2, np.uint64)[0] >> np.uint64(1))


@dataclass(frozen=True)
class Task:
    """One setting of the key columns and the methods to run there.

    Attributes
    ----------
    key : dict ``column -> value``
        Values of the runner's key columns except ``"method"``.
    methods : tuple of str
        Methods to run for this key; the runner drops those already in the results.
    """

    key: Mapping[str, Any]
    methods: tuple[str, ...] = field(default_factory=tuple)


def limit_threads() -> None:
    """One BLAS / OpenMP / torch thread in this process (2 shared cores, at most 2 processes)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        import torch
    except ModuleNotFoundError:
        return
    torch.set_num_threads(1)


def _cell_id(row: Mapping[str, Any], columns: Sequence[str]) -> tuple[str, ...]:
    return tuple(str(row[c]) for c in columns)


def _parse(value: str) -> Any:
    """CSV cell back to int / float / str ('' stays '')."""
    if value == "":
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def read_results(out_dir: str | Path) -> list[dict[str, Any]]:
    """Rows of ``out_dir/results.csv`` with numbers parsed (empty list if absent)."""
    path = Path(out_dir) / RESULTS
    if not path.exists():
        return []
    with path.open(newline="", encoding="utf-8") as fh:
        return [{k: _parse(v) for k, v in row.items()} for row in csv.DictReader(fh)]


class Runner:
    """Run the cells of one experiment into ``out_dir``, resuming a half-finished run.

    Parameters
    ----------
    out_dir : path
    name : str
        Experiment name (``fedhier experiment NAME``).
    seed : int
    quick : bool
    design : dict
        JSON-serialisable description of everything that determines the results; a folder
        holding a run with another design, seed or quick flag is refused.
    key_columns : sequence of str
        Columns that identify a cell besides ``"method"``.
    n_processes : int, default 1
        Worker processes for the cells (at most 2 on this project's machines).
    progress : bool, default True
        Show progress over cells (:class:`~fedhier.utils.progress.StepProgress`: a bar on a
        terminal, a line a minute in a log).
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        name: str,
        seed: int,
        quick: bool,
        design: Mapping[str, Any],
        key_columns: Sequence[str],
        n_processes: int = 1,
        progress: bool = True,
    ):
        if isinstance(n_processes, bool) or not isinstance(n_processes, int) or n_processes < 1:
            raise ValueError(f"n_processes must be a positive integer, got {n_processes!r}")
        if "method" in key_columns:
            raise ValueError("key_columns must not contain 'method'; it is always part of a cell's key")
        self.out_dir = Path(out_dir)
        self.name = name
        self.seed = int(seed)
        self.quick = bool(quick)
        self.design = json.loads(json.dumps(design))
        self.key_columns = tuple(key_columns)
        self.columns = self.key_columns + ("method",)
        self.n_processes = n_processes
        self.progress = progress
        self._meta = self._load_meta()

    # ------------------------------------------------------------------ metadata
    def _identity(self) -> dict[str, Any]:
        return {"experiment": self.name, "seed": self.seed, "quick": self.quick, "design": self.design}

    def _load_meta(self) -> dict[str, Any]:
        path = self.out_dir / RUN
        if not path.exists():
            if (self.out_dir / RESULTS).exists():
                raise ValueError(f"{self.out_dir}: results.csv without run.json; refusing to guess its settings")
            return {**self._identity(), "seconds": 0.0, "sessions": 0}
        meta = json.loads(path.read_text(encoding="utf-8"))
        mine = self._identity()
        for k, v in mine.items():
            if meta.get(k) != v:
                raise ValueError(
                    f"{self.out_dir} holds a run of {meta.get('experiment')!r} with another {k} "
                    f"({meta.get(k)!r} != {v!r}); use another output folder"
                )
        return meta

    @property
    def wall_seconds(self) -> float:
        """Wall time spent on cells so far, summed over (resumed) sessions."""
        return float(self._meta["seconds"])

    # ------------------------------------------------------------------ running
    def pending(self, tasks: Iterable[Task]) -> list[Task]:
        """Tasks restricted to the methods whose cells are not in ``results.csv``."""
        done = {_cell_id(r, self.columns) for r in read_results(self.out_dir)}
        out = []
        for task in tasks:
            missing = set(self.key_columns) - set(task.key)
            if missing:
                raise ValueError(f"task {dict(task.key)} lacks key columns {sorted(missing)}")
            todo = tuple(m for m in task.methods if _cell_id({**task.key, "method": m}, self.columns) not in done)
            if todo:
                out.append(Task(dict(task.key), todo))
        return out

    def run(
        self, tasks: Sequence[Task], work: Callable[[Task], list[dict[str, Any]]], *, execute: bool = True
    ) -> list[dict[str, Any]]:
        """Run ``work(task)`` for every pending task; return all result rows (old and new).

        ``work`` must be a module-level function (it may run in a worker process) and
        return one row per method of the task, each holding the task's key, ``"method"``
        and the metrics.  ``execute=False`` only records the plan and returns the rows
        already there (to report on a half-finished run).
        """
        tasks = list(tasks)
        planned = sum(len(t.methods) for t in tasks)
        rows = read_results(self.out_dir)
        todo = self.pending(tasks)
        self._meta["cells_planned"] = planned
        if execute and todo:
            self._meta["sessions"] = int(self._meta.get("sessions", 0)) + 1
        self._write_meta(rows)
        if not todo or not execute:
            return rows
        bar = StepProgress(sum(len(t.methods) for t in todo), f"{self.name} cells") if self.progress else None
        to_run = Counter(self._cost_key({**t.key, "method": m}) for t in todo for m in t.methods)
        started = time.perf_counter()
        try:
            for new in self._results(todo, work):
                self._check_rows(new)
                rows.extend(new)
                to_run.subtract(self._cost_key(row) for row in new)
                write_csv(self.out_dir / RESULTS, rows, self._csv_columns(rows))
                self._meta["seconds"] = float(self._meta["seconds"]) + (time.perf_counter() - started)
                started = time.perf_counter()
                self._write_meta(rows)
                if bar is not None:
                    bar.advance(len(new), left=self.seconds_left(rows, to_run))
        finally:
            if bar is not None:
                bar.close()
        return rows

    def _results(self, todo: list[Task], work):
        if self.n_processes == 1:
            limit_threads()
            for task in todo:
                yield work(task)
            return
        with ProcessPoolExecutor(max_workers=self.n_processes, initializer=limit_threads) as pool:
            queue = list(reversed(todo))
            running = set()
            while queue or running:
                while queue and len(running) < self.n_processes:
                    running.add(pool.submit(work, queue.pop()))
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    yield fut.result()

    def _cost_key(self, row: Mapping[str, Any]) -> tuple[str, ...]:
        return _cell_id(row, [c for c in self.columns if c not in REPLICATE_COLUMNS])

    def seconds_left(self, rows: Sequence[Mapping[str, Any]], to_run: Mapping[tuple[str, ...], int]) -> float | None:
        """Estimated wall time of the cells ``to_run`` (``{cost key: count}``) from the finished ``rows``
        (module docstring); None while a method to run has no finished cell.  A row without ``seconds``
        (a cell reported n/a) costs nothing."""
        by_key: dict[tuple[str, ...], list[float]] = {}
        by_method: dict[str, list[float]] = {}
        for row in rows:
            seconds = _number(row.get("seconds"))
            seconds = 0.0 if math.isnan(seconds) else seconds
            by_key.setdefault(self._cost_key(row), []).append(seconds)
            by_method.setdefault(str(row["method"]), []).append(seconds)
        total = 0.0
        for key, count in to_run.items():
            if count <= 0:
                continue
            measured = by_key.get(key) or by_method.get(key[-1])
            if measured is None:
                return None
            total += count * float(np.median(measured))
        return total / self.n_processes

    def _check_rows(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            missing = [c for c in self.columns if c not in row]
            if missing:
                raise ValueError(f"{self.name}: a result row lacks the key columns {missing}: {row}")

    def _csv_columns(self, rows: list[dict[str, Any]]) -> list[str]:
        rest = dict.fromkeys(k for row in rows for k in row if k not in self.columns)
        return list(self.columns) + list(rest)

    def _write_meta(self, rows: list[dict[str, Any]]) -> None:
        self._meta["cells_done"] = len(rows)
        write_json(self.out_dir / RUN, self._meta)


# ---------------------------------------------------------------------- summaries
def _number(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.nan


def summarise(
    rows: Sequence[Mapping[str, Any]],
    group_by: Sequence[str],
    metrics: Sequence[str],
    *,
    repeat: str = "repeat",
    n_folds: int | None = None,
) -> list[dict[str, Any]]:
    """Mean and std over repetitions of fold averages (spec §12.3 [R], §14 row 25).

    For every group and metric: average the metric over the folds of each repetition
    (ignoring non-numeric entries), then take the mean and the sample standard deviation
    (ddof 1) of these averages over the repetitions.  With ``n_folds``, a repetition with
    fewer cells than that (a half-finished run) is left out.

    Returns
    -------
    list of dict
        One per group with at least one (complete) repetition, in first-seen order: the
        ``group_by`` values, ``"<metric>"`` (mean), ``"<metric> sd"`` (NaN with fewer than
        two repetitions), ``"repetitions"`` and ``"runs"`` (cells used).  A metric with no
        numeric entry has mean NaN.
    """
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[g] for g in group_by), []).append(row)
    out = []
    for values, members in groups.items():
        entry: dict[str, Any] = dict(zip(group_by, values))
        by_rep: dict[Any, list[Mapping[str, Any]]] = {}
        for row in members:
            by_rep.setdefault(row[repeat], []).append(row)
        if n_folds is not None:
            by_rep = {r: rep_rows for r, rep_rows in by_rep.items() if len(rep_rows) >= n_folds}
            if not by_rep:
                continue
            members = [row for rep_rows in by_rep.values() for row in rep_rows]
        for metric in metrics:
            averages = []
            for rep_rows in by_rep.values():
                x = np.array([_number(r.get(metric)) for r in rep_rows])
                x = x[np.isfinite(x)]
                if x.size:
                    averages.append(float(x.mean()))
            entry[metric] = float(np.mean(averages)) if averages else math.nan
            entry[f"{metric} sd"] = float(np.std(averages, ddof=1)) if len(averages) > 1 else math.nan
        entry["repetitions"] = len(by_rep)
        entry["runs"] = len(members)
        out.append(entry)
    return out


def format_mean_std(mean: float, sd: float, digits: int = 4) -> str:
    """``"0.1073 ± 0.0004"``; ``"n/a"`` for a NaN mean; the mean alone for a NaN sd."""
    if not np.isfinite(mean):
        return "n/a"
    if abs(mean) >= 1e4:  # e.g. a DP fit that diverged: keep the table readable
        return f"{mean:.3e}" if not np.isfinite(sd) else f"{mean:.3e} ± {sd:.1e}"
    if not np.isfinite(sd):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"
