"""A bounded CPU burner: hold the machine busy while a test or a benchmark runs, as a loaded host would.

Run:  python benchmarks/cpu_burner.py [--per-core 3] [--max-seconds 3600] -- COMMAND ...

starts ``per_core`` busy processes per core (``os.cpu_count()``), runs COMMAND, then stops every
busy process by its PID and exits with COMMAND's exit code.  From Python::

    with CpuBurner(per_core=3):
        ...

``make test-integration-busy`` runs the integration suite under it (the tests' conftest starts
one for the session when ``FEDHIER_BUSY`` is set to the number of busy processes per core).

Bounded: each busy process spins in plain Python (no memory, no files), checks every few
milliseconds that the process that started it is alive, and exits when it is not or when
``max_seconds`` have passed, so a burner whose owner was killed does not outlive it by more than
that check.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

#: the busy loop of one process: spin until the parent (argv[1]) is gone or argv[2] seconds passed
_SPIN = """
import os, sys, time
parent, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while os.getppid() == parent and time.monotonic() < end:
    for _ in range(20000):
        pass
"""


class CpuBurner:
    """``per_core`` busy processes per core while the ``with`` block runs; stopped by PID on exit.

    Parameters
    ----------
    per_core : int
        Busy processes per core (3 holds a machine at a load of about 3 per core, as the busy hosts of the
        deployment trials).
    max_seconds : float
        Each busy process ends by itself after this long, even if nobody stops it.
    """

    def __init__(self, per_core: int = 3, max_seconds: float = 3600.0) -> None:
        if per_core < 1:
            raise ValueError(f"per_core must be a positive integer, got {per_core!r}")
        self.n_processes = per_core * (os.cpu_count() or 1)
        self.max_seconds = float(max_seconds)
        self.procs: list[subprocess.Popen] = []

    def start(self) -> "CpuBurner":
        for _ in range(self.n_processes):
            self.procs.append(subprocess.Popen([sys.executable, "-c", _SPIN, str(os.getpid()), str(self.max_seconds)],
                                               stdin=subprocess.DEVNULL))
        return self

    def stop(self) -> None:
        """SIGKILL every busy process by its PID and reap it."""
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait(timeout=30)
        self.procs.clear()

    def __enter__(self) -> "CpuBurner":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-core", type=int, default=3, help="busy processes per core (default 3)")
    parser.add_argument("--max-seconds", type=float, default=3600.0, help="each busy process ends after this long")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run on the busy machine (after --)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    with CpuBurner(args.per_core, args.max_seconds) as burner:
        print(f"cpu_burner: {burner.n_processes} busy processes ({args.per_core} per core) while: {' '.join(command)}",
              file=sys.stderr, flush=True)
        return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
