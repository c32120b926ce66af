"""A disk that fills up while a command writes its results: one line naming the folder and the cause, nothing left.

The disk is simulated: every file fedhier writes goes through :func:`fedhier.utils.io.atomic_write_bytes`,
whose ``fsync`` here fails with ``ENOSPC`` from the ``after``-th file on (the earlier files were written,
as on a disk that fills up part way).
"""

from __future__ import annotations

import errno
import os
import types
from pathlib import Path

import pytest

import fedhier.utils.io
from fedhier.cli import main

HEART = Path(__file__).parent / "cli_data" / "heart" / "fit.toml"


def _disk_fills(monkeypatch, after: int) -> None:
    """From the ``after``-th file on, writing a file fails as on a full disk."""
    written = []

    def fsync(fd):
        written.append(fd)
        if len(written) >= after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.fsync(fd)

    monkeypatch.setattr(fedhier.utils.io, "os", types.SimpleNamespace(**{**vars(os), "fsync": fsync}))


@pytest.mark.parametrize("command", [
    ["fit", "--config", str(HEART)],
    ["fit", "linear", "--config", str(HEART)],
    ["collab", "fit", "--config", str(HEART), "--max-iter", "2"],
    ["demo", "--rounds", "2"],
])
def test_a_full_disk_ends_in_one_line_and_leaves_nothing(monkeypatch, tmp_path, capsys, command):
    out = tmp_path / "results"
    _disk_fills(monkeypatch, after=2)  # the first file is written, the second finds the disk full
    assert main([*command, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"fedhier: error: {out}: no space left on device while writing the results; nothing was "
                       "written (free some space, or choose another --out folder)")
    assert not any(line.startswith("Traceback") for line in err)
    assert list(tmp_path.iterdir()) == []  # no result folder, no staging folder, no temporary file


def test_a_full_disk_outside_a_result_folder_names_the_file(monkeypatch, tmp_path, capsys):
    """A file written in place (here a Flower demo's fit.toml) names itself and the cause."""
    _disk_fills(monkeypatch, after=1)
    assert main(["flower", "demo-data", "--out", str(tmp_path / "demo")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fedhier: error: {tmp_path / 'demo'}") and err[0].endswith(": no space left on device")
