"""Worker processes for :func:`fedhier.runtime.simulate.simulate`: site steps under a deadline.

A :class:`SiteWorkers` pool runs one site step at a time in each of ``n_workers`` processes.
Unlike :class:`concurrent.futures.ProcessPoolExecutor` it treats each step on its own:

* a step that runs longer than ``timeout`` seconds (counted from the moment it is handed
  to a worker) is a failed site: its worker is killed and replaced, the other steps go on;
* a worker that dies during a step (killed, crashed) is a failed site, not a failed pool:
  it is replaced and the round continues;
* no worker outlives the pool: :meth:`SiteWorkers.close` ends them (also on an exception
  or ``KeyboardInterrupt``), and a worker whose parent dies exits by itself (on Linux the
  kernel sends it SIGKILL, ``prctl(PR_SET_PDEATHSIG)``; everywhere a watcher thread checks
  the parent every half second).

Workers receive the protocol and the site data once, when they start (inherited under
``fork``); each task carries the bytes of one site step (:func:`~fedhier.runtime.simulate.run_site_step`)
and each answer its encoded reply and state.  All of it stays inside the one simulating
party: nothing here crosses a site boundary.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import wait
from typing import Any, Callable, Mapping

__all__ = ["SiteWorkers", "Outcome"]

#: what one site step gives back: ("ok", reply bytes, state bytes) or ("error", one line, None)
Outcome = tuple[str, Any, Any]

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """End this worker when ``parent_pid`` ends (kernel signal on Linux; a watcher thread everywhere)."""
    if sys.platform.startswith("linux") and os.getppid() == parent_pid:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - a libc without prctl: the thread below suffices
            pass
    start_ppid = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != start_ppid or not _alive(parent_pid):
                os._exit(1)
            time.sleep(0.5)

    if start_ppid != parent_pid or not _alive(parent_pid):  # the parent died before prctl took effect
        os._exit(1)
    threading.Thread(target=watch, name="fedhier-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - exists, owned by someone else
        return True
    return True


def _worker_main(conn, step: Callable[..., Outcome], init: Callable[..., None], init_args: tuple, parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then closes the pool
    init(*init_args)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        conn.send(step(*task))


class _Worker:
    def __init__(self, ctx, target_args: tuple) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child, *target_args), daemon=True,
                                   name="fedhier-site-worker")
        self.process.start()
        child.close()

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


class SiteWorkers:
    """``n_workers`` processes that run site steps, each under ``timeout`` seconds (None: no deadline).

    Parameters
    ----------
    n_workers : int
    step : callable ``(*task) -> Outcome``
        Run in a worker for each task (module-level, e.g. ``_site_step_in_worker``).
    init, init_args : callable and its arguments
        Run once in every new worker before its first task (e.g. to keep the protocol and
        the site data).
    timeout : float or None
        Deadline of one step, in seconds.
    """

    def __init__(self, n_workers: int, step: Callable[..., Outcome], init: Callable[..., None], init_args: tuple,
                 timeout: float | None = None) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"the deadline of a site step must be a positive number of seconds, got {timeout!r}")
        self.timeout = timeout
        self._ctx = multiprocessing.get_context()
        self._args = (step, init, init_args, os.getpid())
        self._workers = [_Worker(self._ctx, self._args) for _ in range(int(n_workers))]

    @property
    def pids(self) -> list[int]:
        """Process ids of the current workers."""
        return [w.process.pid for w in self._workers]

    def _replace(self, i: int) -> None:
        self._workers[i].stop()
        self._workers[i] = _Worker(self._ctx, self._args)

    def run(self, tasks: Mapping[int, tuple], describe_lost: Callable[[str], str] = str) -> dict[int, Outcome]:
        """Run every task (key: site) and return its outcome; a step that overran or lost
        its worker gives ``("error", describe_lost(reason), None)``."""
        pending: list[int] = list(tasks)
        busy: dict[int, tuple[int, float]] = {}  # worker index -> (site, start time)
        out: dict[int, Outcome] = {}
        while pending or busy:
            for i in range(len(self._workers)):
                if i in busy or not pending:
                    continue
                site = pending.pop(0)
                try:
                    self._workers[i].conn.send(tasks[site])
                except OSError:  # the worker died while idle: replace it, hand the task to the new one
                    self._replace(i)
                    self._workers[i].conn.send(tasks[site])
                busy[i] = (site, time.monotonic())
            if self.timeout is None:
                wait_for = None
            else:
                wait_for = max(0.0, min(start for _, start in busy.values()) + self.timeout - time.monotonic())
            handles = [self._workers[i].conn for i in busy] + [self._workers[i].process.sentinel for i in busy]
            wait(handles, timeout=wait_for)
            now = time.monotonic()
            for i, (site, start) in list(busy.items()):
                worker = self._workers[i]
                outcome = None
                try:
                    if worker.conn.poll():
                        outcome = worker.conn.recv()
                    elif not worker.process.is_alive():
                        raise EOFError
                except (EOFError, OSError):
                    outcome = ("error", describe_lost("lost"), None)
                    self._replace(i)
                if outcome is None and self.timeout is not None and now - start >= self.timeout:
                    outcome = ("error", describe_lost("timeout"), None)
                    self._replace(i)
                if outcome is not None:
                    out[site] = outcome
                    del busy[i]
        return out

    def close(self) -> None:
        """End every worker and wait for it; idempotent.  Workers hold nothing that must be
        saved (a site's state comes back with each answer), so they are killed outright."""
        for w in self._workers:
            w.stop()
        self._workers = []

    def __enter__(self) -> "SiteWorkers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
