"""The command line: demo report, `fedhier fit` on user CSV files, and clear errors."""

import csv
import json
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from fedhier import FedMVPPCA
from fedhier.cli import main
from fedhier.data import load_alzheimer


def test_demo_writes_a_report_with_its_figures(tmp_path):
    import contextlib
    import io

    out = tmp_path / "report"
    with contextlib.redirect_stdout(io.StringIO()) as stdout:  # a file, as when the output is redirected
        assert main(["demo", "--out", str(out), "--rounds", "5", "--quiet"]) == 0
    printed = stdout.getvalue()
    assert "test MAE" in printed and "latent LDA accuracy" in printed and "mean imputation" in printed
    imputed = [line for line in printed.splitlines() if line.startswith("imputing ")]
    assert len(imputed) == 2 and all(re.search(r"vs mean imputation \d\.\d{4}$", line) for line in imputed), printed  # unwrapped
    for name in ("report.html", "report.md", "summary.json", "model.npz", "figures/convergence.png",
                 "figures/latent_pairs.png", "figures/imputation_csf.png", "figures/sites_vs_global.png"):
        assert (out / name).is_file(), name
        assert (out / name).stat().st_mode & 0o777 == 0o600, name  # per-subject results: the user's only (docs/cli.md)
    md = (out / "report.md").read_text()
    assert "![convergence](figures/convergence.png)" in md and "fedhier demo --rounds 5" in md
    summary = json.loads((out / "summary.json").read_text())
    assert summary["site_sizes"] == [74, 41, 107] or sum(summary["site_sizes"]) == 222
    assert summary["missing_views"] == [[], ["csf"], ["demographics"]]
    assert 0.0 < summary["test_mae"] < 1.0 and 0.5 < summary["latent_lda_accuracy"] <= 1.0


def _write_site(path, columns, rows):
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(columns)
        w.writerows(rows)


@pytest.fixture
def user_files(tmp_path):
    data = load_alzheimer()
    csf, demo = data.views["csf"], data.views["demographics"]
    cols_csf, cols_demo = list(data.feature_names["csf"]), list(data.feature_names["demographics"])
    halves = np.array_split(np.arange(data.n_samples), 2)
    _write_site(tmp_path / "a.csv", cols_csf + cols_demo, np.hstack([csf, demo])[halves[0]].tolist())
    _write_site(tmp_path / "b.csv", cols_csf, csf[halves[1]].tolist())  # site b does not measure demographics
    toml = tmp_path / "fit.toml"
    toml.write_text(
        "n_components = 2\nn_rounds = 3\nn_local_iter = 3\nn_first_iter = 5\n"
        f"[views]\ncsf = {json.dumps(cols_csf)}\ndemographics = {json.dumps(cols_demo)}\n"
        '[[sites]]\nname = "a"\npath = "a.csv"\n[[sites]]\nname = "b"\npath = "b.csv"\n'
    )
    return toml


def test_fit_on_user_csv_files(tmp_path, user_files, capsys):
    # tol above any finite change: every start stops after round 2, the first with a change of the model
    user_files.write_text("n_init = 2\ntol = 1e300\n" + user_files.read_text())
    out = tmp_path / "fit"
    assert main(["fit", "--config", str(user_files), "--out", str(out), "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["sites"] == ["a", "b"] and summary["views"] == {"csf": 3, "demographics": 4}
    assert summary["n_init"] == 2 and FedMVPPCA.load(out / "model.npz").n_init == 2
    assert (summary["n_rounds"], summary["rounds_run"]) == (3, 2)
    assert (out / "model.npz").is_file() and (out / "latent_a.csv").is_file() and (out / "latent_b.csv").is_file()
    with (out / "latent_b.csv").open() as fh:
        assert len(list(csv.reader(fh))) == 1 + 333 - 167


def test_fit_refuses_non_numeric_values_before_writing_anything(tmp_path, user_files, capsys):
    text = (tmp_path / "b.csv").read_text().splitlines()
    text[3] = "high," + text[3].split(",", 1)[1]
    (tmp_path / "b.csv").write_text("\n".join(text) + "\n")
    out = tmp_path / "fit"
    assert main(["fit", "--config", str(user_files), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "site 'b', view 'csf': non-numeric value in column 'tau', row 3" in err and "high" not in err
    assert not out.exists()


def test_fit_reads_csv_files_as_spreadsheets_write_them(tmp_path, user_files, capsys):
    # Excel's "CSV UTF-8" (byte-order mark), spaces around a column name, blank lines: read as meant
    text = (tmp_path / "b.csv").read_text().splitlines()
    header = text[0].split(",")
    header[1] = f" {header[1]} "
    (tmp_path / "b.csv").write_text("\ufeff" + ",".join(header) + "\n\n" + "\n".join(text[1:]) + "\n\n", encoding="utf-8")
    out = tmp_path / "fit"
    assert main(["fit", "--config", str(user_files), "--out", str(out), "--quiet"]) == 0
    with (out / "latent_b.csv").open() as fh:
        assert len(list(csv.reader(fh))) == 1 + 333 - 167


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda lines: [lines[0] + "," + lines[0].split(",")[0]] + [r + ",0" for r in lines[1:]], r"column\(s\) \['tau'\] appear more than once"),
        (lambda lines: lines[:3] + [lines[3].replace(lines[3].split(",")[0], "inf", 1)] + lines[4:], "infinite value in column 'tau', row 3"),
        (lambda lines: lines[:3] + ["," + lines[3].split(",", 1)[1]] + lines[4:], "some but not all of the view's cells empty, first at row 3"),
    ],
)
def test_fit_refuses_a_malformed_site_file_naming_site_and_row(tmp_path, user_files, capsys, edit, message):
    user_files.write_text('partial = "refuse"\n' + user_files.read_text())  # else a partly observed view is missing
    lines = (tmp_path / "b.csv").read_text().splitlines()
    (tmp_path / "b.csv").write_text("\n".join(edit(lines)) + "\n")
    out = tmp_path / "fit"
    assert main(["fit", "--config", str(user_files), "--out", str(out), "--quiet"]) == 2
    assert re.search("site 'b'.*" + message, capsys.readouterr().err)
    assert not out.exists()


def test_fit_refuses_a_bad_configuration(tmp_path, user_files, capsys):
    user_files.write_text(user_files.read_text().replace("n_rounds", "n_roundz"))
    assert main(["fit", "--config", str(user_files), "--out", str(tmp_path / "x")]) == 2
    assert "unknown key(s) ['n_roundz']" in capsys.readouterr().err


def test_unknown_experiment_is_refused(capsys):
    assert main(["experiment", "no-such-experiment"]) == 2
    assert "unknown experiment" in capsys.readouterr().err


def test_experiment_list_and_help_name_every_command(capsys):
    assert main(["experiment", "list"]) == 0
    names = capsys.readouterr().out.split()
    assert {"mvppca-sd", "fedlin-radon", "collab-heart"} <= set(names) and names == sorted(names)
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert all(f"    {command} " in text for command in ("demo", "fit", "experiment", "collab", "flower"))


def test_the_fit_toml_of_docs_cli_runs_as_written(tmp_path, capsys):
    # the first TOML block of docs/cli.md, with made-up CSVs holding the columns it names
    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    block = re.search(r"## `fedhier fit --config fit.toml`.*?```toml\n(.*?)```", text, re.S).group(1)
    config = tomllib.loads(block)
    (tmp_path / "fit.toml").write_text(block)
    rng = np.random.default_rng(0)
    for i, (site, path) in enumerate(config["sites"].items()):
        views = config["views"] if i == 0 else {v: c for v, c in config["views"].items() if v != "csf"}
        columns = [config["id"], *(c for cols in views.values() for c in cols)]
        rows = rng.normal(size=(40, len(columns)))
        lines = [",".join(columns)] + [",".join(f"{x:.6f}" for x in row) for row in rows]
        (tmp_path / path).write_text("\n".join(lines) + "\n")
    assert main(["fit", "--config", str(tmp_path / "fit.toml"), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert (tmp_path / "out" / "model.npz").exists()


@pytest.mark.parametrize("package, argv, extra", [
    ("statsmodels", ["experiment", "fedlin-radon", "--quick"], "stats"),
])
def test_a_missing_optional_package_gives_one_line_naming_the_extra(monkeypatch, capsys, tmp_path, package, argv, extra):
    import sys

    from fedhier.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.csv").write_text("s,a\n0,1\n")
    for name in list(sys.modules):
        if name == package or name.startswith(package + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed
    assert main(argv + (["--out", str(tmp_path / "exp")] if argv[0] == "experiment" else [])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedhier: error: `fedhier ") and f"needs the optional package {package}" in err[0]
    assert f"pip install -e \".[{extra}]\"" in err[0]


def test_collab_runs_without_pandas(monkeypatch, capsys, tmp_path):
    import sys

    for name in list(sys.modules):
        if name == "pandas" or name.startswith("pandas."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pandas", None)  # as on the core install
    rng = np.random.default_rng(0)
    lines = ["s,a,b"] + [f"{s},{x:.4f},{y:.4f}" for s in ("p", "q", "r") for x, y in rng.normal(size=(20, 2))]
    (tmp_path / "x.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "c"
    assert main(["collab", "fit", "--csv", str(tmp_path / "x.csv"), "--site-column", "s", "--components", "2",
                 "--max-iter", "3", "--out", str(out)]) == 0
    assert (out / "model.npz").is_file() and (out / "scores_p.csv").is_file() and (out / "report.html").is_file()


@pytest.mark.parametrize("module", ["fedhier", "fedhier.cli"])
def test_python_m_fedhier_is_the_fedhier_command(module):
    import subprocess
    import sys

    import fedhier

    proc = subprocess.run([sys.executable, "-m", module, "experiment", "list"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "mvppca-sd" in proc.stdout.split()
    proc = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.split() == ["fedhier", fedhier.__version__], (proc.stdout, proc.stderr)
