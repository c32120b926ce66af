"""Progress over a known number of steps, on standard error.

On a terminal: a rich bar (count, elapsed, remaining).  Otherwise (a run in the
background with its output sent to a log file) a bar would print nothing until the end,
so a plain line is written instead, at most once a minute and at the last step:
``mvppca-sd cells: 1200/2070 (58%), 41.0 min elapsed, about 29.7 min left``.
The time left is extrapolated from the steps done, unless the caller knows better: steps
of very different cost (an experiment's cheap cells done first, its slow ones still to
run) pass their own estimate to :meth:`StepProgress.advance`.

Displays opened while another is shown (the rounds of a fit inside an experiment's cells) share
its live area on a terminal: one line each, as rich allows only one live display at a time.
:class:`FitsProgress` counts the fits and rounds of a run whose total is not known in advance.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

__all__ = ["FitsProgress", "RoundProgress", "StepProgress"]

#: the live rich display shared by the open bars, and how many are open
_live: dict[str, Any] = {"progress": None, "users": 0}


class _TimeLeft(TimeRemainingColumn):
    """rich's remaining time, or the caller's estimate when the task carries one (field ``left``)."""

    def render(self, task) -> Text:
        left = task.fields.get("left")
        if left is None or task.finished:
            return super().render(task)
        minutes, seconds = divmod(int(left), 60)
        hours, minutes = divmod(minutes, 60)
        return Text(f"{hours}:{minutes:02d}:{seconds:02d}", style="progress.remaining")


class StepProgress:
    """``advance(n, info)`` after each step, ``close()`` at the end (module docstring).

    Parameters
    ----------
    total : int, number of steps
    description : str, what is counted (``"Fed-mv-PPCA"``, ``"mvppca-sd cells"``)
    transient : bool, remove the bar when closed (terminal only)
    log_every : float, seconds between two plain lines when not on a terminal
    """

    #: show the line when created (False: at the first step)
    _opens_at_start = True

    def __init__(self, total: int, description: str, *, transient: bool = False, log_every: float = 60.0):
        self.total = int(total)
        self.description = description
        self.log_every = float(log_every)
        self.done = 0
        self._left: float | None = None
        self._started = self._logged = time.monotonic()
        self._logged_done = 0
        self._progress = None
        self._transient = transient
        self._terminal = Console(stderr=True).is_terminal
        if self._terminal and self._opens_at_start:
            self._open(total)

    def _open(self, total: int | None) -> None:
        """Add this display's line to the live display (started if none is shown)."""
        if self._progress is None:
            if _live["progress"] is None:
                _live["progress"] = Progress(
                    TextColumn("[bold]{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    _TimeLeft(),
                    TextColumn("{task.fields[info]}"),
                    console=Console(stderr=True),
                    transient=self._transient,
                )
                _live["progress"].start()
            _live["users"] += 1
            self._progress = _live["progress"]
            self._nested = _live["users"] > 1
            self._task = self._progress.add_task(self.description, total=total, info="", left=None)

    def advance(self, n: int = 1, info: str = "", *, left: float | None = None) -> None:
        """``n`` more steps done; ``left``: the caller's estimate of the seconds still to go (None: extrapolate)."""
        self.done += n
        self._left = left
        if self._terminal:
            if self._progress is not None:
                self._progress.update(self._task, advance=n, info=info, left=left)
            return
        now = time.monotonic()
        if now - self._logged >= self.log_every or self.done >= self.total:
            self._print(now, info)

    def _print(self, now: float, info: str = "") -> None:
        self._logged, self._logged_done = now, self.done
        print(self.line(now - self._started, info), file=sys.stderr, flush=True)

    def line(self, elapsed: float, info: str = "") -> str:
        """The plain progress line after ``elapsed`` seconds (time left: the last estimate given to
        :meth:`advance`, else extrapolated linearly from the steps done)."""
        text = f"{self.description}: {self.done}/{self.total} ({100 * self.done / max(self.total, 1):.0f}%), "
        text += f"{elapsed / 60:.1f} min elapsed"
        if 0 < self.done < self.total:
            left = elapsed / self.done * (self.total - self.done) if self._left is None else self._left
            text += f", about {left / 60:.1f} min left"
        return text + (f"  {info}" if info else "")

    def close(self) -> None:
        """End the display; off a terminal, a last line if the count moved since the last one (a fit that stopped early)."""
        if not self._terminal:
            if self.done != self._logged_done:
                self._print(time.monotonic())
            return
        if self._progress is None:  # closed already, or never shown
            return
        if self._nested:  # an inner bar (a fit's rounds within cells): its line goes, the outer one stays
            self._progress.remove_task(self._task)
        _live["users"] -= 1
        if _live["users"] == 0:
            self._progress.stop()
            _live["progress"] = None
        self._progress = None

    def __enter__(self) -> "StepProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RoundProgress(StepProgress):
    """Runtime callback ``(record, broadcast)``: one step per round.

    Shows the last round's expected log-likelihood when the protocol reports one, and
    the number of sites when some failed or were absent.
    """

    def __init__(self, n_rounds: int, description: str = "rounds", transient: bool = False):
        super().__init__(n_rounds, description, transient=transient)

    def __call__(self, record: Any, broadcast: Any = None) -> None:
        info = ""
        if "expected_ll" in record.metrics:
            info = f"expected log-lik {record.metrics['expected_ll']:.4g}"
        if record.failed or record.absent:
            info += f"  sites {len(record.sites)}"
        self.advance(1, info)


class FitsProgress(StepProgress):
    """Round observer (``(record, broadcast)``) for a run of many fits whose number is not known in advance
    (an experiment): counts rounds and fits; on a terminal a bar without a total, otherwise a line a minute
    (``fedlin-radon: 3 fits, 412 rounds, 2.1 min elapsed``).  A round numbered 1 starts a new fit."""

    #: the line appears with the first round: fits run elsewhere (in worker processes) show none
    _opens_at_start = False

    def __init__(self, description: str, *, log_every: float = 60.0):
        self.fits = 0
        super().__init__(0, description, transient=True, log_every=log_every)

    def __call__(self, record: Any, broadcast: Any = None) -> None:
        self.fits += int(record.round == 1)
        self.done += 1
        if self._terminal:
            self._open(None)
            self._progress.update(self._task, completed=self.done, info=f"{self.fits} fits, {self.done} rounds")
            return
        now = time.monotonic()
        if now - self._logged >= self.log_every:
            self._print(now)

    def line(self, elapsed: float, info: str = "") -> str:
        return f"{self.description}: {self.fits} fits, {self.done} rounds, {elapsed / 60:.1f} min elapsed"
