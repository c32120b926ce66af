"""The SuperExec of a fedhier SuperNode: Flower's own, launching one ClientApp process at a time.

A Flower SuperNode runs every message it receives in a new ``flwr-clientapp`` process, launched by
its SuperExec (``flower-superexec``).  Flower 1.41 gives that process one heartbeat period
(30 s) from its launch to claim its message; a process that takes longer, as on a host whose
cores are busy, loses its task token, the task goes back to pending, and the SuperExec launches
another process for it at once while the first is still starting (and will be refused:
"Runtime task-token authentication failed").  Each launch adds to the load that made the start
slow, so the processes pile up: a process storm that outlives the run, since the SuperNode
keeps the task (``flwr/supercore/corestate/in_memory_corestate.py``,
``_cleanup_expired_task_tokens_locked``: "Expired starting tasks are moved back to pending";
``flwr/supercore/superexec/run_superexec.py``: the loop claims any pending task;
``SubprocessExecutor``: "subprocess launches have no capacity gate").

:func:`main` runs Flower's ``flower-superexec`` with an executor that keeps at most one ClientApp
process: a SuperNode of a fedhier fit handles one message at a time, so when it is given a task while
the process it launched before still runs, that process is of no further use (Flower re-issued a start
it refused, whose token has expired; or the coordinator moved on, to a round after a timeout or to a
new run after an interrupted one).  The process before is stopped and the new one launched.  A refused
start then costs one process, not a growing number, and a process left from a run that ended (a
SuperLink killed mid-round) cannot keep the next run's ClientApp from starting.
:func:`superexec_folder` writes the ``flower-superexec`` a SuperNode finds first on its ``PATH``
(``fedhier flower site`` and :class:`fedhier.cli.flower.LoopbackFederation` put it there).

With a Flower whose SuperExec is built otherwise (a later release), Flower's own runs unchanged.
"""

from __future__ import annotations

import importlib
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Sequence

log = logging.getLogger(__name__)

#: the name under which a SuperNode starts its SuperExec (looked up on its PATH)
SUPEREXEC = "flower-superexec"
#: seconds a ClientApp process is given to exit on SIGTERM before it is killed
STOP_GRACE = 10.0


def _one_at_a_time_executor():
    """Flower's subprocess executor, keeping one task process at a time (None: Flower's is built otherwise)."""
    try:
        from flwr.supercore.constant import TASK_TYPE_TO_APPIO_API_ADDRESS_ARG, TASK_TYPE_TO_COMMAND
        from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor
        from flwr.supercore.superexec.executor.types import LaunchResult
    except ImportError:
        return None

    class OneAtATime(SubprocessExecutor):
        """Flower's launch, keeping its process; a new launch first stops the process before (module docstring)."""

        def __init__(self) -> None:
            self.process: subprocess.Popen | None = None

        def _stop_previous(self) -> None:
            if self.process is None or self.process.poll() is not None:
                return
            log.info("a new task for this SuperNode: stopping the ClientApp process %d launched before", self.process.pid)
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

        def launch(self, spec) -> "LaunchResult":
            self._stop_previous()
            args = [TASK_TYPE_TO_COMMAND[spec.task_type], TASK_TYPE_TO_APPIO_API_ADDRESS_ARG[spec.task_type],
                    spec.runtime_api_address, "--token", spec.token]
            if spec.insecure:
                args.append("--insecure")
            elif spec.root_certificates_path is not None:
                args.extend(["--root-certificates", spec.root_certificates_path])
            if spec.parent_pid is not None:
                args.extend(["--parent-pid", str(spec.parent_pid)])
            if spec.runtime_dependency_install:
                args.append("--allow-runtime-dependency-installation")
            output = subprocess.DEVNULL if spec.suppress_output else None
            self.process = subprocess.Popen(args, stdout=output, stderr=output)
            return LaunchResult.accepted()

    return OneAtATime


def main(argv: Sequence[str] | None = None) -> None:
    """``flower-superexec`` (same arguments) keeping at most one ClientApp process at a time."""
    if argv is not None:
        sys.argv = [SUPEREXEC, *argv]
    from flwr.supercore.cli.flower_superexec import flower_superexec

    executor = _one_at_a_time_executor()
    try:
        runner = importlib.import_module("flwr.supercore.superexec.run_superexec")
    except ImportError:
        runner = None
    if executor is None or runner is None or not hasattr(runner, "get_executor"):
        log.warning("this Flower's SuperExec is not the one fedhier knows: its own runs, launching ClientApps unbounded")
    else:
        flower_get_executor = runner.get_executor

        def get_executor(executor_type, *args, **kwargs):
            if str(executor_type) == "subprocess":
                return executor()
            return flower_get_executor(executor_type, *args, **kwargs)

        runner.get_executor = get_executor
    flower_superexec()


def superexec_folder(folder: str | Path) -> Path:
    """Write ``folder/flower-superexec``, which runs :func:`main` with this Python; put ``folder`` first on a
    SuperNode's ``PATH`` so that the SuperNode starts it.  Returns ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / SUPEREXEC
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fedhier.runtime.flower_exec "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def supernode_path(folder: str | Path, path: str | None = None) -> str:
    """A SuperNode's ``PATH``: ``folder`` (:func:`superexec_folder`), this Python's bin, then ``path`` (default ``$PATH``)."""
    rest = os.environ.get("PATH", "") if path is None else path
    return os.pathsep.join([str(folder), str(Path(sys.executable).parent), rest])


if __name__ == "__main__":
    main()
