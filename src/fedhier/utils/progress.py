"""Progress over a known number of steps, on standard error.

On a terminal: a rich bar (count, elapsed, remaining).  Otherwise (a run in the
background with its output sent to a log file) a bar would print nothing until the end,
so a plain line is written instead, at most once a minute and at the last step:
``mvppca-sd cells: 1200/2070 (58%), 41.0 min elapsed, about 29.7 min left``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["RoundProgress", "StepProgress"]


class StepProgress:
    """``advance(n, info)`` after each step, ``close()`` at the end (module docstring).

    Parameters
    ----------
    total : int, number of steps
    description : str, what is counted (``"Fed-mv-PPCA"``, ``"mvppca-sd cells"``)
    transient : bool, remove the bar when closed (terminal only)
    log_every : float, seconds between two plain lines when not on a terminal
    """

    def __init__(self, total: int, description: str, *, transient: bool = False, log_every: float = 60.0):
        self.total = int(total)
        self.description = description
        self.log_every = float(log_every)
        self.done = 0
        self._started = self._logged = time.monotonic()
        console = Console(stderr=True)
        self._progress = None
        if console.is_terminal:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                console=console,
                transient=transient,
            )
            self._task = self._progress.add_task(description, total=self.total, info="")
            self._progress.start()

    def advance(self, n: int = 1, info: str = "") -> None:
        self.done += n
        if self._progress is not None:
            self._progress.update(self._task, advance=n, info=info)
            return
        now = time.monotonic()
        if now - self._logged >= self.log_every or self.done >= self.total:
            self._logged = now
            print(self.line(now - self._started, info), file=sys.stderr, flush=True)

    def line(self, elapsed: float, info: str = "") -> str:
        """The plain progress line after ``elapsed`` seconds (remaining time by linear extrapolation)."""
        text = f"{self.description}: {self.done}/{self.total} ({100 * self.done / max(self.total, 1):.0f}%), "
        text += f"{elapsed / 60:.1f} min elapsed"
        if 0 < self.done < self.total:
            text += f", about {elapsed / self.done * (self.total - self.done) / 60:.1f} min left"
        return text + (f"  {info}" if info else "")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


class RoundProgress(StepProgress):
    """Runtime callback ``(record, broadcast)``: one step per round.

    Shows the last round's expected log-likelihood when the protocol reports one, and
    the number of sites when some failed or were absent.
    """

    def __init__(self, n_rounds: int, description: str = "rounds", transient: bool = False):
        super().__init__(n_rounds, description, transient=transient)

    def __call__(self, record: Any, broadcast: Any) -> None:
        info = ""
        if "expected_ll" in record.metrics:
            info = f"expected log-lik {record.metrics['expected_ll']:.4g}"
        if record.failed or record.absent:
            info += f"  sites {len(record.sites)}"
        self.advance(1, info)
