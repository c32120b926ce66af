"""Result folders: --out checked before any work; a run's files appear all at once or not at all.

(`fedhier.utils.results.result_folder`; docs/cli.md, "Result folder".)
"""

import json
from pathlib import Path

import numpy as np
import pytest

from fedhier.cli import main

_COMMANDS = {  # the commands writing a result folder, on the same configuration file
    "fit": ["fit", "--config", "{config}", "--quiet"],
    "fit linear": ["fit", "linear", "--config", "{config}", "--quiet"],
    "collab fit": ["collab", "fit", "--config", "{config}", "--quiet"],
}


def _write_sites(folder: Path, sites=("a", "b", "c")) -> Path:
    """Three small sites with two views, a target and CollabDict's variables, in one fit.toml."""
    rng = np.random.default_rng(0)
    header = ["pid", "g1", "g2", "g3", "age", "bmi", "y"]
    for k, site in enumerate(sites):
        X = rng.normal(size=(30, 5))  # g1, g2, g3, age, bmi
        y = X[:, 0] - 0.5 * X[:, 3] + 0.1 * rng.normal(size=30)
        rows = [",".join([f"{site}{i}", *(f"{v:.4f}" for v in x), f"{t:.4f}"]) for i, (x, t) in enumerate(zip(X, y))]
        (folder / f"site_{site}.csv").write_text(",".join(header) + "\n" + "\n".join(rows) + "\n")
    config = folder / "fit.toml"
    config.write_text(
        'id = "pid"\nn_components = 2\nn_rounds = 3\nn_first_iter = 3\ntarget = "y"\nfeatures = ["g1", "age"]\n'
        'variables = ["g1", "g2", "age"]\nmax_iter = 3\n'
        '[views]\ngenes = ["g1", "g2", "g3"]\nclin = ["age", "bmi"]\n'
        "[sites]\n" + "".join(f'{s} = "site_{s}.csv"\n' for s in sites)
    )
    return config


def _argv(command: str, config: Path, out, *extra: str) -> list[str]:
    return [a.format(config=config) for a in _COMMANDS[command]] + ["--out", str(out), *extra]


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _staging_left(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob(".*") if ".partial-" in p.name or ".old-" in p.name]


@pytest.fixture
def no_reading(monkeypatch):
    """Reading the sites' files fails the test: a check that must come first did not."""
    def read(*args, **kwargs):
        raise AssertionError("the sites' files were read")

    for module in ("fedhier.userdata", "fedhier.cli.linear", "fedhier.cli.collab"):
        monkeypatch.setattr(f"{module}.site_data", read)
    monkeypatch.setattr("fedhier.demo.demo_data", read)


@pytest.mark.parametrize("command", [*_COMMANDS, "demo"])
@pytest.mark.parametrize("out, message", [("afile.txt", "--out {out} is a file, not a folder; choose a folder name"),
                                          ("afile.txt/sub", "--out {out}: {parent} is a file, not a folder")])
def test_an_out_that_is_or_lies_under_a_file_is_refused_before_anything_is_read(tmp_path, capsys, no_reading, command,
                                                                                   out, message):
    config = _write_sites(tmp_path)
    (tmp_path / "afile.txt").write_text("mine\n")
    before = _snapshot(tmp_path)
    out = tmp_path / out
    argv = ["demo", "--out", str(out), "--quiet"] if command == "demo" else _argv(command, config, out)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == "fedhier: error: " + message.format(out=out, parent=tmp_path / "afile.txt")
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("command", _COMMANDS)
def test_a_folder_that_is_not_a_fedhier_result_is_refused_and_left_alone(tmp_path, capsys, no_reading, command):
    config = _write_sites(tmp_path)
    before = _snapshot(tmp_path)
    assert main(_argv(command, config, tmp_path)) == 2  # the data folder itself
    err = capsys.readouterr().err
    assert err.startswith(f"fedhier: error: --out {tmp_path} is a folder that is not a fedhier result (it holds ")
    assert _snapshot(tmp_path) == before and not _staging_left(tmp_path)


def test_a_previous_result_with_a_file_of_the_user_s_is_refused(tmp_path, capsys):
    config = _write_sites(tmp_path)
    out = tmp_path / "result"
    assert main(_argv("fit", config, out)) == 0
    (out / "my notes.txt").write_text("keep me\n")
    before = _snapshot(out)
    capsys.readouterr()
    assert main(_argv("fit linear", config, out)) == 2
    assert "(it holds 'my notes.txt')" in capsys.readouterr().err
    assert _snapshot(out) == before


def test_a_rerun_replaces_the_previous_result_folder_whole(tmp_path):
    config = _write_sites(tmp_path)
    out = tmp_path / "result"
    assert main(_argv("fit", config, out)) == 0
    assert (out / "latent_c.csv").is_file()
    (tmp_path / "fewer").mkdir()
    fewer = _write_sites(tmp_path / "fewer", sites=("a", "b"))
    assert main(_argv("fit", fewer, out)) == 0
    assert sorted(p.name for p in out.glob("latent_*.csv")) == ["latent_a.csv", "latent_b.csv"]
    assert json.loads((out / "summary.json").read_text())["sites"] == ["a", "b"]
    # another family into the same folder: nothing of the Fed-mv-PPCA fit is left beside the FedLin files
    assert main(_argv("fit linear", config, out)) == 0
    fresh = tmp_path / "fresh"
    assert main(_argv("fit linear", config, fresh)) == 0
    assert sorted(_snapshot(out)) == sorted(_snapshot(fresh))
    assert not _staging_left(tmp_path)


_LAST_WRITER = {"fit": "fedhier.userdata.write_summary", "fit linear": "fedhier.cli.linear.write_summary",
                "collab fit": "fedhier.cli.collab.write_summary"}


@pytest.mark.parametrize("command", _COMMANDS)
@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError])
@pytest.mark.parametrize("previous", [False, True])
def test_a_failure_while_writing_leaves_the_target_as_it_was(tmp_path, monkeypatch, capsys, command, error, previous):
    config = _write_sites(tmp_path)
    out = tmp_path / "result"
    if previous:
        assert main(_argv(command, config, out)) == 0
        config.write_text(config.read_text().replace("n_rounds = 3", "n_rounds = 2").replace("max_iter = 3", "max_iter = 2"))
    before = _snapshot(out) if previous else None  # the second run's files would differ from the first's

    def fail(*args, **kwargs):  # the model and the per-site files are written by now
        raise error(28, "no space left on device")

    monkeypatch.setattr(_LAST_WRITER[command], fail)
    if error is KeyboardInterrupt:
        assert main(_argv(command, config, out)) == 130
        assert "fedhier: interrupted" in capsys.readouterr().err
    else:  # a full disk: one line naming the folder and the cause
        assert main(_argv(command, config, out)) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
            f"fedhier: error: {out}: no space left on device while writing the results; nothing was written")
    assert (_snapshot(out) if out.exists() else None) == before  # absent, or the previous run's files byte-identical
    assert not _staging_left(tmp_path)


def test_collab_fit_with_a_bad_report_folder_writes_nothing(tmp_path, capsys, no_reading):
    config = _write_sites(tmp_path)
    (tmp_path / "afile.txt").write_text("mine\n")
    before = _snapshot(tmp_path)
    out = tmp_path / "new" / "model.npz"
    assert main(_argv("collab fit", config, out, "--report", str(tmp_path / "afile.txt"))) == 2
    assert capsys.readouterr().err.strip() == f"fedhier: error: --report {tmp_path / 'afile.txt'} is a file, not a folder; choose a folder name"
    assert _snapshot(tmp_path) == before and not (tmp_path / "new").exists()


def test_collab_fit_with_a_model_file_adds_its_files_to_the_folder(tmp_path):
    """`--out dir/model.npz`: the folder is the user's; the run's files are added, nothing else is touched."""
    config = _write_sites(tmp_path)
    before = _snapshot(tmp_path)
    assert main(_argv("collab fit", config, tmp_path / "m.npz")) == 0
    after = _snapshot(tmp_path)
    assert {k: after[k] for k in before} == before
    assert {"m.npz", "summary.json", "report.html", "scores_a.csv", "scores_c.csv"} <= set(after)
    assert not _staging_left(tmp_path)


def test_demo_twice_into_the_same_folder_replaces_the_first_report(tmp_path):
    out = tmp_path / "fedhier-report"
    assert main(["demo", "--out", str(out), "--rounds", "2", "--quiet"]) == 0
    (out / "figures" / "stale.png").write_bytes(b"from an older version")
    assert main(["demo", "--out", str(out), "--rounds", "2", "--quiet"]) == 0
    assert (out / "report.html").is_file() and not (out / "figures" / "stale.png").exists()
    assert not _staging_left(tmp_path)


def test_an_input_inside_the_folder_a_run_replaces_is_refused(tmp_path, capsys):
    config = _write_sites(tmp_path)
    out = tmp_path / "result"
    assert main(_argv("fit", config, out)) == 0
    pooled = ["site,g1,age,y"] + [f"{s},{i * 0.1:.2f},{(i % 7) * 0.3:.2f},{i * 0.05 + (s == 'q'):.2f}" for s in "pq" for i in range(20)]
    (out / "scores_all.csv").write_text("\n".join(pooled) + "\n")  # a name a result folder may hold
    before = _snapshot(out)
    capsys.readouterr()
    argv = ["fit", "linear", str(out / "scores_all.csv"), "--site", "site", "--target", "y", "--features", "g1,age",
            "--out", str(out), "--quiet"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (f"fedhier: error: the input file {out / 'scores_all.csv'} is inside the "
                                               f"output folder {out}, which this run replaces; choose another --out folder")
    assert _snapshot(out) == before and not _staging_left(tmp_path)


def test_the_current_folder_is_never_replaced(tmp_path, monkeypatch, capsys):
    config = _write_sites(tmp_path)
    out = tmp_path / "result"
    assert main(_argv("fit", config, out)) == 0
    before = _snapshot(out)
    monkeypatch.chdir(out)
    capsys.readouterr()
    assert main(_argv("fit", config, ".")) == 2
    assert "--out . is the current folder" in capsys.readouterr().err
    assert _snapshot(out) == before and not _staging_left(tmp_path)
