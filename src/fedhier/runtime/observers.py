"""Observers of a fit's rounds, registered around a block of code (e.g. the command line's progress display).

Every runtime that runs rounds in this process (:func:`~fedhier.runtime.simulate.simulate`,
:func:`~fedhier.runtime.peer.run_peer_rounds`) calls :func:`round_done` after each round, so a
caller that does not make the runtime call itself -- it calls an estimator's ``fit`` -- can still
watch the rounds::

    with observe_rounds(RoundProgress(20, "FedHM2")):
        FedHM2Regressor(n_rounds=20).fit(sites)

An observer is a callable ``(record, broadcast) -> None``, as a ``simulate`` callback, where
``record`` is a :class:`~fedhier.runtime.simulate.RoundRecord`.  It only reads: it runs after the
round's history entry and checkpoint are written, and what it changes is not saved.  The
registration is a context variable: it holds in this thread (and in tasks started from it) only.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Any, Callable, Iterator

__all__ = ["observe_rounds", "round_done", "unobserved"]

_OBSERVERS: ContextVar[tuple[Callable[[Any, Any], None], ...]] = ContextVar("fedhier_round_observers", default=())


@contextlib.contextmanager
def observe_rounds(*observers: Callable[[Any, Any], None]) -> Iterator[None]:
    """Within the block, every completed round of every fit is passed to ``observers`` (in order)."""
    token = _OBSERVERS.set(_OBSERVERS.get() + observers)
    try:
        yield
    finally:
        _OBSERVERS.reset(token)


@contextlib.contextmanager
def unobserved() -> Iterator[None]:
    """Within the block, rounds are not passed to the observers (a fit's preliminary round, e.g. the one that
    finds the columns' scales, is not one of the rounds a progress display counts)."""
    token = _OBSERVERS.set(())
    try:
        yield
    finally:
        _OBSERVERS.reset(token)


def round_done(record: Any, broadcast: Any) -> None:
    """Tell the registered observers that a round is complete (called by the runtimes)."""
    for observer in _OBSERVERS.get():
        observer(record, broadcast)
