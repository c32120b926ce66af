"""A site that never answers does not hang an estimator or a command: ``site_timeout`` / ``--site-timeout``.

One site's step blocks forever (on an event nobody sets) in one round, in the worker process
that runs it; the deadline is generous against the work (a site step here takes well under a
second) and nothing asserts how long anything took.  The fit completes without that site in
that round, as the same fit with the site absent in that round does.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from fedhier.runtime.simulate import SiteFailedWarning

HEART = Path(__file__).parents[1] / "cli_data" / "heart" / "fit.toml"
DEADLINE = 20.0  # seconds; each test of a blocking site waits this long once (marked slow)


def _block(monkeypatch, protocol_class, round: int, site: int) -> None:
    """``protocol_class.site_step`` blocks forever for ``site`` in ``round`` when run in a worker process.

    The workers are forked from this process, so they run the patched class; the test's own process
    never blocks (a step run here would hang the test instead of showing the deadline)."""
    original, parent = protocol_class.site_step, os.getpid()
    never = threading.Event()

    def site_step(self, ctx, broadcast):
        if os.getpid() != parent and (ctx.round, ctx.site) == (round, site):
            never.wait()
        return original(self, ctx, broadcast)

    monkeypatch.setattr(protocol_class, "site_step", site_step)


def _mvppca_sites():
    from fedhier.data import load_alzheimer, partition

    data = load_alzheimer()
    return partition(data.views, data.labels, 3, "iid", random_state=3).sites


@pytest.mark.slow
def test_fed_mv_ppca_leaves_out_a_site_that_overruns_its_deadline(monkeypatch):
    from fedhier.estimators.mvppca import FedMVPPCA
    from fedhier.protocol.mvppca import MVPPCAProtocol

    sites = _mvppca_sites()
    options = dict(n_components=3, n_rounds=4, n_local_iter=4, n_first_iter=8, random_state=3, tol=None)
    reference = FedMVPPCA(**options, participation={2: [1]}).fit(sites)  # site 1 absent in round 2, in this process
    _block(monkeypatch, MVPPCAProtocol, round=2, site=1)
    with pytest.warns(SiteFailedWarning):
        model = FedMVPPCA(**options, site_timeout=DEADLINE).fit(sites)
    assert [h["sites"] for h in model.history_] == [[0, 1, 2], [0, 2], [0, 1, 2], [0, 1, 2]]
    assert "SiteTimeout" in model.history_[1]["failed"]["1"]
    for view, params in reference.global_params_.items():
        for name, value in params.items():
            np.testing.assert_array_equal(model.global_params_[view][name], value, err_msg=f"{view}/{name}")


@pytest.mark.slow
def test_fedlin_leaves_out_a_site_that_overruns_its_deadline(monkeypatch):
    from fedhier.estimators.fedlin import FedHM2Regressor
    from fedhier.protocol.fedlin import EPProtocol

    rng = np.random.default_rng(0)
    sites = []
    for k in range(4):  # y = 1 + 2 x + a site's own shift, known parameters
        X = rng.normal(size=(40, 1))
        sites.append((X, 1.0 + 2.0 * X[:, 0] + 0.3 * k + rng.normal(scale=0.5, size=40)))
    _block(monkeypatch, EPProtocol, round=2, site=1)
    with pytest.warns(SiteFailedWarning):
        model = FedHM2Regressor(n_rounds=4, tol=None, random_state=0, site_timeout=DEADLINE).fit(sites)
    rounds = [h for h in model.history_ if "sites" in h]
    assert [h["sites"] for h in rounds] == [[0, 1, 2, 3], [0, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]]
    assert "SiteTimeout" in rounds[1]["failed"]["1"]
    assert abs(model.population_coef_[0] - 2.0) < 0.3  # the slope the sites were drawn with


@pytest.mark.slow
def test_fedhier_fit_takes_a_site_timeout(monkeypatch, tmp_path, capsys):
    from fedhier.cli import main
    from fedhier.protocol.mvppca import MVPPCAProtocol

    _block(monkeypatch, MVPPCAProtocol, round=2, site=1)
    out = tmp_path / "fit"
    assert main(["fit", "--config", str(HEART), "--out", str(out), "--quiet", "--site-timeout", str(DEADLINE)]) == 0
    model_history = _saved_history(out / "model.npz")
    assert model_history[1]["sites"] == [0, 2, 3] and "SiteTimeout" in model_history[1]["failed"]["1"]
    assert all(h["sites"] == [0, 1, 2, 3] for h in model_history[2:])
    assert "fedhier: warning: round 2: site 'hungary' failed and is left out of the round (SiteTimeout" in capsys.readouterr().err


@pytest.mark.slow
def test_fedhier_demo_takes_a_site_timeout(monkeypatch, tmp_path, capsys):
    from fedhier.cli import main
    from fedhier.protocol.mvppca import MVPPCAProtocol

    _block(monkeypatch, MVPPCAProtocol, round=2, site=1)
    out = tmp_path / "demo"
    assert main(["demo", "--rounds", "3", "--out", str(out), "--quiet", "--site-timeout", str(DEADLINE)]) == 0
    assert "round 2: site 1 failed and is left out of the round (SiteTimeout" in capsys.readouterr().err
    assert (out / "report.html").is_file()


@pytest.mark.slow
def test_fedhier_fit_linear_takes_a_site_timeout(monkeypatch, tmp_path):
    from fedhier.cli import main
    from fedhier.protocol.fedlin import EPProtocol

    _block(monkeypatch, EPProtocol, round=2, site=1)
    out = tmp_path / "linear"
    assert main(["fit", "linear", "--config", str(HEART), "--out", str(out), "--quiet", "--site-timeout", str(DEADLINE)]) == 0
    rounds = [h for h in json.loads((out / "history.json").read_text()) if "sites" in h]
    assert rounds[1]["sites"] == [0, 2, 3] and "SiteTimeout" in rounds[1]["failed"]["1"]


def _saved_history(path: Path) -> list[dict]:
    from fedhier.estimators.mvppca import FedMVPPCA

    return FedMVPPCA.load(path).history_


def test_a_bad_site_timeout_is_one_line(tmp_path, capsys):
    from fedhier.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--config", str(HEART), "--out", str(tmp_path / "x"), "--site-timeout", "0"])
    assert "--site-timeout: must be a positive number of seconds, got '0'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["peer", "star"])
def test_collabdict_leaves_out_a_site_that_overruns_its_deadline(monkeypatch, runtime):
    from fedhier.estimators.collab import CollabDict
    from fedhier.protocol.collab import GGMMixtureProtocol

    rng = np.random.default_rng(1)
    cov = np.array([[1.0, 0.6, 0.0], [0.6, 1.0, -0.4], [0.0, -0.4, 1.0]])
    sites = [rng.multivariate_normal(np.zeros(3), cov, size=150) for _ in range(4)]
    _block(monkeypatch, GGMMixtureProtocol, round=2, site=1)
    with pytest.warns(SiteFailedWarning):
        model = CollabDict(n_components=2, max_iter=4, runtime=runtime, site_timeout=DEADLINE).fit(sites)
    if runtime == "peer":  # a peer that stops answering is lost for the rest of the fit
        assert [h["sites"] for h in model.history_] == [[0, 1, 2, 3]] + [[0, 2, 3]] * (len(model.history_) - 1)
        assert model.history_[1]["lost"] == [1]
    else:  # the star runtime asks it again in the next round
        assert model.history_[1]["sites"] == [0, 2, 3] and "SiteTimeout" in model.history_[1]["failed"]["1"]
        assert all(h["sites"] == [0, 1, 2, 3] for h in model.history_[2:])
    assert np.isfinite(model.score_samples(sites[0], site=0)).all()


@pytest.mark.slow
def test_fedhier_collab_fit_takes_a_site_timeout(monkeypatch, tmp_path, capsys):
    from fedhier.cli import main
    from fedhier.protocol.collab import GGMMixtureProtocol

    _block(monkeypatch, GGMMixtureProtocol, round=2, site=1)
    out = tmp_path / "collab"
    args = ["collab", "fit", "--config", str(HEART), "--out", str(out), "--quiet", "--site-timeout", str(DEADLINE)]
    assert main([*args, "--runtime", "star"]) == 0
    history = json.loads((out / "summary.json").read_text())
    assert (out / "scores_hungary.csv").is_file() and history["rounds_run"] >= 2
    # serverless, a late peer is lost with its private weights: one line, nothing written
    assert main([*args[:5], str(tmp_path / "peer"), *args[6:]]) == 2
    assert "site(s) ['hungary'] did not answer within --site-timeout" in capsys.readouterr().err
    assert not (tmp_path / "peer").exists()
