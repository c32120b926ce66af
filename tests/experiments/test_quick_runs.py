"""Every experiment end to end in --quick mode (what CI runs), plus resuming a finished run."""

import csv
import json
import re

import pytest

from fedhier.baselines import torch_available
from fedhier.cli import main
from fedhier.experiments.docs import write_docs_page, write_index
from fedhier.experiments.mvppca import EXPERIMENTS


def _rows(path):
    with (path / "results.csv").open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _check_report(out):
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "| " in report and "Command: `fedhier experiment" in report
    figures = re.findall(r"\]\((figures/[^)]+\.png)\)", report)
    assert figures, "the report shows no figure"
    for fig in figures:
        assert (out / fig).stat().st_size > 1000
    assert (out / "summary.csv").exists()
    return report


def test_registry_names():
    assert set(EXPERIMENTS) == {"mvppca-sd", "mvppca-waic", "mvppca-alzheimer", "mvppca-mfeat", "mvppca-dp"}


def test_sd_quick_through_the_cli_then_resume_and_docs(tmp_path, capsys):
    out = tmp_path / "sd"
    assert main(["experiment", "mvppca-sd", "--quick", "--out", str(out), "--seed", "3"]) == 0
    rows = _rows(out)
    report = _check_report(out)
    methods = {r["method"] for r in rows}
    assert {"Fed-mv-PPCA", "PCA (pooled data)", "FactorAnalysis (pooled data)"} <= methods
    assert any(m.startswith("DP-Fed-mv-PPCA") for m in methods)
    if torch_available():
        vae_gk = [r for r in rows if r["method"].startswith(("VAE", "mc-VAE")) and r["scenario"] == "GK"]
        assert vae_gk and all(r["status"].startswith("n/a") for r in vae_gk)
        assert re.search(r"\| G/K \| 3 \| VAE \(linear\) FedAvg \| n/a \| n/a \| n/a \|", report)
        # the baselines' mini-batch size and learning rate: the grid point with the lowest mean validation MAE
        tuning = _rows(out / "tuning")
        for method in {r["method"] for r in tuning}:
            scores = {}
            for r in tuning:
                if r["method"] == method:
                    scores.setdefault(r["setting"], []).append(float(r["mae_validation"]))
            best = min(scores, key=lambda k: sum(scores[k]) / len(scores[k]))
            assert re.search(rf"\| {re.escape(method)} \| {re.escape(best)} \| [0-9.]+ \| yes \|", report)
    assert "Training mean (each feature)" in report and "## Paired comparisons" in report
    # resuming a finished run runs no cell and keeps the numbers
    before = (out / "results.csv").read_text()
    assert main(["experiment", "mvppca-sd", "--quick", "--out", str(out), "--seed", "3"]) == 0
    assert (out / "results.csv").read_text() == before
    assert json.loads((out / "run.json").read_text())["sessions"] == 1  # a session with nothing to run is not counted
    # a different seed in the same folder is refused
    assert main(["experiment", "mvppca-sd", "--quick", "--out", str(out), "--seed", "4"]) == 2
    # docs page: numbers from the results, figures copied and relinked
    page = write_docs_page(out, tmp_path / "docs")
    text = page.read_text()
    assert "do not edit by hand" in text and "figures/mvppca-sd-" in text
    for fig in re.findall(r"\]\((figures/[^)]+\.png)\)", text):
        assert (tmp_path / "docs" / fig).exists()
    index = write_index(tmp_path / "docs").read_text()
    assert "[Fed-mv-PPCA on synthetic data (SD)](mvppca-sd.md) | quick run; Cells:" in index


@pytest.mark.parametrize("name", ["mvppca-waic", "mvppca-alzheimer", "mvppca-mfeat", "mvppca-dp"])
def test_quick_run(tmp_path, name):
    EXPERIMENTS[name](tmp_path, quick=True, seed=1)
    rows = _rows(tmp_path)
    assert rows and all(r["status"] == "ok" or r["status"].startswith("n/a") for r in rows)
    report = _check_report(tmp_path)
    if name == "mvppca-waic":
        assert {r["dataset"] for r in rows} == {"sd", "alzheimer"}
        assert "Figure-4 statistic" in report and "Lowest mean WAIC" in report
    if name in ("mvppca-alzheimer", "mvppca-mfeat"):
        fedprox = any("FedProx" in r["method"] for r in rows)
        from fedhier.baselines import torch_available

        assert fedprox == (name == "mvppca-alzheimer" and torch_available())  # the mfeat extension has no FedProx sweep
        # the protocol describes the baselines this design runs (quick runs: linear only), and the tuning's time
        assert ("FedProx uses the setting of its FedAvg baseline" in report) == fedprox
        assert "width 64" not in report
        assert ("Wall time of the tuning fits" in report) == torch_available()
    if name == "mvppca-dp":
        sweeps = {r["sweep"] for r in rows}
        assert sweeps == {"none", "epsilon per release", "kappa", "epsilon total", "UNSAFE round 1 in the clear"}
        unsafe = [r for r in rows if r["sweep"] == "UNSAFE round 1 in the clear"]
        assert unsafe and all(float(r["epsilon_spent"]) == float("inf") for r in unsafe)  # the ledger voids the guarantee
        assert all(float(r["epsilon_spent"]) < float("inf") for r in rows if r["sweep"] == "epsilon per release")
        assert "Training mean (each feature)" in report and "no guarantee" in report and "## Paired comparisons" in report
        spent = [float(r["epsilon_spent"]) for r in rows if r["sweep"] == "epsilon total"]
        assert all(e <= 10.0 + 1e-6 for e in spent)  # the total budget holds


def test_without_torch_the_baselines_are_skipped_and_said_so(tmp_path, monkeypatch):
    import fedhier.baselines

    monkeypatch.setattr(fedhier.baselines, "torch_available", lambda: False)
    EXPERIMENTS["mvppca-alzheimer"](tmp_path, quick=True, seed=2)
    assert not [r for r in _rows(tmp_path) if "VAE" in r["method"]]
    assert "PyTorch is not installed" in (tmp_path / "report.md").read_text()
