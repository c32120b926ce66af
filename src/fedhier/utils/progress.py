"""Progress bar over rounds (rich), usable as a runtime callback."""

from __future__ import annotations

from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["RoundProgress"]


class RoundProgress:
    """Callback ``(record, broadcast)`` that advances a progress bar by one round.

    Shows the round count, elapsed/remaining time and the last round's expected
    log-likelihood when the protocol reports one.
    """

    def __init__(self, n_rounds: int, description: str = "rounds", transient: bool = False):
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            transient=transient,
        )
        self._task = self._progress.add_task(description, total=n_rounds, info="")
        self._progress.start()

    def __call__(self, record: Any, broadcast: Any) -> None:
        info = ""
        if "expected_ll" in record.metrics:
            info = f"expected log-lik {record.metrics['expected_ll']:.4g}"
        if record.failed or record.absent:
            info += f"  sites {len(record.sites)}"
        self._progress.update(self._task, advance=1, info=info)

    def close(self) -> None:
        self._progress.stop()
