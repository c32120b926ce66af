"""The consensus-scaling experiment writes its table and figure, and its numbers are consistent."""

import csv

import numpy as np
import pytest

from fedhier.experiments.collab import EXPERIMENTS, MEAN_OVER_SITES
from fedhier.runtime.graphs import inverse_chord_graph, laplacian_spectrum


def test_scaling_experiment_quick(tmp_path):
    EXPERIMENTS["collab-scaling"](tmp_path, quick=True, seed=0)
    rows = list(csv.DictReader(open(tmp_path / "collab-scaling.csv")))
    assert (tmp_path / "collab-scaling.png").stat().st_size > 1000
    assert "collab-scaling --quick" in (tmp_path / "collab-scaling.md").read_text()
    chord = [r for r in rows if r["family"] == "inverse-chord" and r["step_rule"] == "max-degree"]
    assert [int(r["S"]) for r in chord] == [11, 37, 101]  # primes at least 8, 32, 100
    assert float(chord[-1]["lambda_2"]) == np.float64(laplacian_spectrum(inverse_chord_graph(101)).lambda_2)
    for r in rows:
        # the fixed T of the stopping rule is a worst-case bound: never below what a random start needs
        assert int(r["steps_measured"]) == -1 or int(r["steps_measured"]) <= int(r["T_rule"])
    paper = {int(r["S"]): int(r["steps_measured"]) for r in rows
             if r["family"] == "random 4-regular" and r["step_rule"] == "paper"}
    const = {int(r["S"]): int(r["steps_measured"]) for r in rows
             if r["family"] == "random 4-regular" and r["step_rule"] == "max-degree"}
    assert paper[100] / paper[8] > 3 * const[100] / const[8]  # slip S1: 1/S scales much worse


@pytest.mark.slow
@pytest.mark.parametrize("name", ["collab-heart", "collab-sensors", "collab-ctg"])
def test_anomaly_experiments_quick(tmp_path, name):
    EXPERIMENTS[name](tmp_path, quick=True, seed=0)
    rows = list(csv.DictReader(open(tmp_path / f"{name}.csv")))
    assert {r["method"] for r in rows} == {"collabdict", "local-only", "pooled-ggm", "pooled-gmm", "pooled-iforest"}
    per_site = [r for r in rows if r["site"] != MEAN_OVER_SITES]  # the mean rows carry no test counts
    scored = [float(r["roc_auc"]) for r in per_site if r["method"] == "collabdict" and int(r["anomalies_test"]) > 0]
    assert scored and np.mean(scored) > 0.6  # far better than chance on every data set
    assert f"{name} --quick" in (tmp_path / f"{name}.md").read_text()
