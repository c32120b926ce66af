"""A command's result folder appears all at once or not at all.

A command writes its results into a *staging folder* beside the target (same parent,
``.<name>.partial-<pid>``), created before any work so that a bad ``--out`` (a file, a folder
that cannot be created or written) is refused at once.  Only when every file is written is the
staging folder *published*:

* the target does not exist: the staging folder is renamed into place;
* the target is an empty folder, or a ``merge`` target (a folder the user shares with other files,
  e.g. the folder of ``collab fit --out dir/model.npz``): each staged entry replaces the entry of
  the same name, nothing else in the folder is touched;
* the target is a previous result folder (it holds ``summary.json`` -- or ``report.html`` for a report
  folder -- and nothing but the files fedhier writes): the old folder is renamed aside, the new one
  renamed in, then the old one removed, so no file of the previous run survives beside the new ones;
* any other existing folder (your data, ``--out .``) is refused before any work: fedhier never deletes
  a file it did not write.

On any failure or interrupt (``KeyboardInterrupt`` included) the staging folder, and any parent
folder created for it, is removed and the target is left as it was.  A disk that fills up (or a
quota reached) while the results are written ends in :class:`ResultsNotWritten`, which names the
folder and the cause in one line.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import shutil
from pathlib import Path
from typing import Iterator

__all__ = ["RESULT_FILES", "REPORT_FILES", "ResultsNotWritten", "check_output_folder", "check_inputs_outside",
           "result_folder"]

#: errors of a disk that cannot take the results: full, or the user's quota reached
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class ResultsNotWritten(OSError):
    """The result folder could not be written (the disk is full, a quota is reached); nothing of it was kept.

    ``filename`` is the result folder, ``strerror`` the cause, as the command line prints them."""

#: what a report folder holds (:meth:`fedhier.report.document.Report.write`)
REPORT_FILES = ("report.html", "report.md", "figures")
#: what a result folder of ``fedhier demo | fit | fit linear | collab fit`` holds (patterns)
RESULT_FILES = (*REPORT_FILES, "summary.json", "summary.md", "model.npz", "privacy-report.json", "latent_*.csv",
                "scores_*.csv", "coefficients.csv", "phi.csv", "history.json")


def _foreign(folder: Path, names: tuple[str, ...]) -> list[str]:
    """The entries of ``folder`` that no pattern of ``names`` matches."""
    return sorted(e.name for e in folder.iterdir() if not any(fnmatch.fnmatchcase(e.name, p) for p in names))


def check_output_folder(target: str | os.PathLike, *, what: str = "--out", key: str = "summary.json",
                        names: tuple[str, ...] = RESULT_FILES, merge: bool = False) -> None:
    """ValueError, in one line, when ``target`` cannot become a result folder; nothing is written.

    Refused: a file; a path under a file; an existing folder that is not empty and is not a previous
    result folder (it lacks ``key`` or holds an entry matching none of ``names``), unless ``merge``.
    """
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise ValueError(f"{what} {target} is a file, not a folder; choose a folder name")
    ancestor = target.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{what} {target}: {ancestor} is a file, not a folder")
    if target.is_dir() and not merge and any(target.iterdir()):
        foreign = _foreign(target, names)
        if foreign or not (target / key).is_file():
            shown = f" (it holds {', '.join(repr(n) for n in foreign[:3])}{' ...' if len(foreign) > 3 else ''})" if foreign else ""
            raise ValueError(f"{what} {target} is a folder that is not a fedhier result{shown}; fedhier replaces only "
                             "its own result folders: choose a new or empty folder")
        here = Path.cwd().resolve()
        if here == target.resolve() or target.resolve() in here.parents:  # replacing it would pull the folder from under you
            raise ValueError(f"{what} {target} is the current folder (or holds it), which this run would replace: "
                             "run from another folder, or choose another output folder")


def check_inputs_outside(target: str | os.PathLike, inputs, *, what: str = "--out") -> None:
    """ValueError if an input file lies inside ``target``, a folder that publishing replaces whole
    (e.g. ``fit linear`` on a previous run's ``latent_a.csv`` with the same ``--out``)."""
    root = Path(target).resolve()
    for given in inputs:
        if given is not None and root in Path(given).resolve().parents:
            raise ValueError(f"the input file {given} is inside the output folder {target}, which this run replaces; "
                             f"choose another {what} folder")


def _make_parents(folder: Path, what: str, target: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; the folders created, outermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    created: list[Path] = []
    try:
        for path in reversed(missing):
            path.mkdir()
            created.append(path)
    except OSError as exc:
        _remove_empty(created)
        raise ValueError(f"{what} {target}: cannot create the folder {exc.filename or path} "
                         f"({(exc.strerror or type(exc).__name__).lower()})") from None
    return created


def _remove_empty(folders: list[Path]) -> None:
    for path in reversed(folders):
        with contextlib.suppress(OSError):
            path.rmdir()


def _merge(staging: Path, target: Path) -> None:
    """Move every entry of ``staging`` into ``target``, replacing files of the same name (folders merged)."""
    for entry in staging.iterdir():
        there = target / entry.name
        if entry.is_dir() and there.is_dir():
            _merge(entry, there)
        else:
            os.replace(entry, there)


@contextlib.contextmanager
def result_folder(target: str | os.PathLike, *, what: str = "--out", key: str = "summary.json",
                  names: tuple[str, ...] = RESULT_FILES, merge: bool = False) -> Iterator[Path]:
    """Within the block, write the results into the yielded staging folder; published to ``target`` at the end.

    ``target`` is checked (:func:`check_output_folder`) and the staging folder created on entry, before
    any work; see the module docstring for what publishing does to an existing folder.
    """
    given = Path(target)
    check_output_folder(given, what=what, key=key, names=names, merge=merge)
    target = Path(os.path.realpath(given))  # a link to a folder: its folder
    created = _make_parents(target.parent, what, given)
    staging = (target / f".fedhier.partial-{os.getpid()}" if merge and target.is_dir()  # inside the user's folder
               else target.parent / f".{target.name}.partial-{os.getpid()}")
    try:
        shutil.rmtree(staging, ignore_errors=True)  # left by a killed process of the same id
        staging.mkdir()
    except OSError as exc:
        _remove_empty(created)
        raise ValueError(f"{what} {given}: cannot write in {staging.parent} "
                         f"({(exc.strerror or type(exc).__name__).lower()})") from None
    try:
        yield staging
        if not target.exists():
            os.rename(staging, target)
        elif merge or not any(target.iterdir()):
            _merge(staging, target)
            staging.rmdir()
        else:
            check_output_folder(given, what=what, key=key, names=names)  # still a previous result: replace it
            aside = target.parent / f".{target.name}.old-{os.getpid()}"
            os.rename(target, aside)
            try:
                os.rename(staging, target)
            except BaseException:
                os.rename(aside, target)
                raise
            shutil.rmtree(aside, ignore_errors=True)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(created)
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            raise ResultsNotWritten(exc.errno, f"{os.strerror(exc.errno)} while writing the results; nothing was written "
                                    f"(free some space, or choose another {what} folder)", str(given)) from None
        raise
