"""What every ``fedhier`` command prints besides its results: one-line errors and warnings.

* A user's mistake (a bad file, column, option or configuration; a missing optional package; a
  site's policy refusing the analysis) ends the command with one line on standard error,
  ``fedhier: error: ...``, and exit code 2.  No traceback: the message names what is wrong.
* Anything else is a bug or an environment problem: Python's traceback, as usual.
* A warning prints as ``fedhier: warning: ...``, without Python's source line; so does a record that
  fedhier logs at WARNING or above (its first line: a failed site's traceback stays in the log).
* A long fit shows its rounds (:func:`rounds_shown`): a bar on a terminal, a line a minute otherwise.
* ``FEDHIER_DEBUG=1`` in the environment: tracebacks for user errors too, and Python's own
  warning format (file and line), and fedhier's log at INFO in full.

One place decides (:func:`run`), so every command -- ``demo``, ``fit``, ``fit linear``,
``collab``, ``experiment``, ``flower`` -- behaves the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import math
import os
import signal
import sys
import warnings
from typing import Callable, Iterator

__all__ = ["EXTRAS", "run", "user_error", "debugging", "one_line_warnings", "rounds_shown", "site_timeout_flag"]

#: optional packages -> the extra of pyproject.toml that installs them
EXTRAS = {"pandas": "stats", "statsmodels": "stats", "flwr": "flower", "mpi4py": "mpi", "torch": "torch"}

#: exit code of a command stopped by a user's mistake (argparse's own code for bad options)
USER_ERROR = 2


def debugging() -> bool:
    """Whether ``FEDHIER_DEBUG`` asks for tracebacks and Python's warning format."""
    return os.environ.get("FEDHIER_DEBUG", "").strip().lower() not in ("", "0", "no", "false")


def _missing_extra(exc: ModuleNotFoundError, command: str) -> str | None:
    package = (exc.name or "").split(".")[0]
    if package not in EXTRAS:
        return None
    extra = EXTRAS[package]
    return (f"`{command}` needs the optional package {package}, which this installation lacks: "
            f'pip install -e ".[{extra}]" in the fedhier folder (the "{extra}" extra)')


def user_error(exc: BaseException, command: str = "fedhier", also: tuple[type[BaseException], ...] = ()) -> str | None:
    """The one-line message of a user's mistake ``exc``, or None for an internal error.

    User errors: ValueError (bad values, files that cannot be parsed, TOML syntax, a site's
    data error), FileNotFoundError and other refusals to open a file, a full disk or quota
    (named with the file or result folder it stopped), a site's
    :class:`~fedhier.protocol.base.SiteError` or policy refusal, a round that too few sites
    answered, a missing optional package (named with the extra that installs it), and the
    classes in ``also``.
    """
    if isinstance(exc, ImportError):  # also a module's own "needs the extra" ImportError raised from the missing one
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, ModuleNotFoundError):
            cause = cause.__cause__ or cause.__context__
        return None if cause is None else _missing_extra(cause, command)
    kinds: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
                                               PermissionError, *also)
    if "fedhier.protocol.base" in sys.modules:
        kinds += (sys.modules["fedhier.protocol.base"].SiteError,)
    if "fedhier.privacy.policy" in sys.modules:
        kinds += (sys.modules["fedhier.privacy.policy"].PolicyRefusal,)
    if "fedhier.runtime.simulate" in sys.modules:
        kinds += (sys.modules["fedhier.runtime.simulate"].RoundFailed,)
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT) and exc.filename is not None:
        return f"{exc.filename}: {(exc.strerror or os.strerror(exc.errno)).lower()}"  # a full disk: where, and why
    if not isinstance(exc, kinds):
        return None
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:  # "[Errno 2] ..." -> "path: reason"
        return f"{exc.filename}: {exc.strerror.lower()}"
    text = str(exc).strip()
    return text or type(exc).__name__


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).strip()
    if not issubclass(category, UserWarning):  # e.g. RuntimeWarning from numpy: say what kind it is
        text += f" ({category.__name__})"
    print(f"fedhier: warning: {text}", file=sys.stderr if file is None else file, flush=True)


class _FirstLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        lines = record.getMessage().strip().splitlines() or [""]
        return f"fedhier: {record.levelname.lower()}: {lines[0]}"


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Within the block, warnings print as ``fedhier: warning: MESSAGE`` (one line, no source line), and so do
    fedhier's log records at WARNING or above (``FEDHIER_DEBUG``: Python's formats, and the log at INFO)."""
    previous = warnings.showwarning
    handler = logging.StreamHandler()  # the standard error of the moment (pytest's capture, a redirect)
    logger = logging.getLogger("fedhier")
    if debugging():
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler.setLevel(logging.INFO)
        level = logger.level
        logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
    else:
        warnings.showwarning = _show_warning
        handler.setFormatter(_FirstLine())
        handler.setLevel(logging.WARNING)
        level = logger.level
    logger.addHandler(handler)
    try:
        yield
    finally:
        warnings.showwarning = previous
        logger.removeHandler(handler)
        logger.setLevel(level)


def run(command: Callable[[], int | None], name: str = "fedhier", *, also: tuple[type[BaseException], ...] = ()) -> int:
    """Run ``command()`` as a command line does; its exit code.

    ``name`` is the command as typed (``"fedhier collab"``), used in the message of a missing
    optional package; ``also``: further exception classes that are user errors for this command.
    A user's mistake prints ``fedhier: error: ...`` and gives 2; Ctrl-C gives 130 without a
    traceback; a closed output pipe ends quietly with 141; any other exception propagates (a traceback).  A stop by SIGTERM passed on to a
    Flower process gives 143.  ``FEDHIER_DEBUG=1``: every
    exception propagates.
    """
    with one_line_warnings():
        try:
            return int(command() or 0)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM passed on to a Flower process (``signum``)
            if debugging():
                raise
            print("fedhier: interrupted", file=sys.stderr, flush=True)
            return 128 + getattr(exc, "signum", signal.SIGINT)
        except BrokenPipeError:  # the reader of the output went away (``fedhier experiment list | head``)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
            return 128 + signal.SIGPIPE
        except Exception as exc:
            message = user_error(exc, name, also)
            if message is None or debugging():
                raise
            print(f"fedhier: error: {message}", file=sys.stderr, flush=True)
            return USER_ERROR


@contextlib.contextmanager
def rounds_shown(n_rounds: int | None, description: str, *, quiet: bool = False) -> Iterator[None]:
    """Within the block, the rounds of the fits run in this process are shown on standard error: a bar on a
    terminal, a line a minute otherwise (:mod:`fedhier.utils.progress`; the runtimes report each round to
    :func:`fedhier.runtime.observers.observe_rounds`).

    ``n_rounds``: the most rounds the fit can run (:class:`~fedhier.utils.progress.RoundProgress`); None for
    a run of many fits (:class:`~fedhier.utils.progress.FitsProgress`).  ``quiet``: nothing is shown.
    """
    if quiet:
        yield
        return
    from ..runtime.observers import observe_rounds
    from ..utils.progress import FitsProgress, RoundProgress

    display = FitsProgress(description) if n_rounds is None else RoundProgress(n_rounds, description)
    try:
        with observe_rounds(display):
            yield
    finally:
        display.close()


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def site_timeout_flag(parser: argparse.ArgumentParser) -> None:
    """``--site-timeout SECONDS`` of a fitting command: the deadline of one site's step (the estimators' ``site_timeout``)."""
    parser.add_argument("--site-timeout", type=_seconds, default=None, metavar="SECONDS",
                        help="seconds a site's step may take; a site still working then is left out of that round "
                             "(default: wait for every site)")
