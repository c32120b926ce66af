"""The utility forecast of a private fit: its kept fraction, its Fed-mv-PPCA blocks, and its warning before any data is read."""

import math

import numpy as np
import pytest

from fedhier.models.mvppca.dp import DPConfig
from fedhier.models.mvppca.forecast import SIGNAL_EIGENVALUE, mvppca_forecast, subjects_needed
from fedhier.privacy.analyze_gauss import RecordDP
from fedhier.privacy.forecast import THRESHOLD, Block, forecast


@pytest.mark.parametrize("dim, signal, noise_sd", [(20, 1.0, 0.1), (50, 2.0, 0.5), (5, 0.3, 1.0)])
def test_kept_fraction_is_what_the_best_shrinkage_of_the_noisy_block_keeps(dim, signal, noise_sd):
    # brute force: draw signals of norm `signal` plus noise, fit the best scalar shrinkage c by least
    # squares, and measure 1 - its relative error; the closed form s^2 / (s^2 + D tau^2) must match
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20_000, dim))
    x *= signal / np.linalg.norm(x, axis=1, keepdims=True)
    y = x + noise_sd * rng.standard_normal(x.shape)
    c = np.sum(x * y) / np.sum(y * y)
    kept = 1 - np.sum((c * y - x) ** 2) / np.sum(x * x)
    assert Block("b", dim, signal, noise_sd).kept == pytest.approx(kept, abs=0.01)


def test_forecast_is_the_weighted_mean_and_refuses_nothing_to_forecast():
    blocks = [Block("a", 4, 1.0, 0.5, weight=3.0), Block("b", 1, 1.0, 0.0, weight=1.0)]
    f = forecast(blocks)
    assert f.kept == pytest.approx((3 * 1 / (1 + 4 * 0.25) + 1) / 4)
    assert f.beats_mean and "least in a: about 50%" in f.line() and "expected to beat" in f.line()
    assert not forecast(blocks, threshold=0.7).beats_mean
    with pytest.raises(ValueError, match="at least one"):
        forecast([])


def test_site_level_forecast_pools_the_noise_over_sites_and_rounds():
    # the loadings of a 124-feature view with 5 components: D = 620, g = 1, noise sd 2 z per coordinate
    config = DPConfig.total(100.0, 1e-5, n_rounds=100, n_views=1, spread=True)
    z = config.noise_multipliers()["W"][1]
    f = mvppca_forecast({"v": 124}, 5, 3, config)
    assert f.kept == pytest.approx(1 / (1 + 4 * 620 * z ** 2 / 300))
    # a larger budget or more sites keep more; every forecast lies in (0, 1)
    more = [mvppca_forecast({"v": 124}, 5, c, DPConfig.total(e, 1e-5, n_rounds=100, n_views=1)).kept
            for e, c in ((1.0, 3), (1e3, 3), (1e3, 30), (1e5, 30))]
    assert all(0 < k < 1 for k in more) and more == sorted(more)


def test_record_level_forecast_and_the_subjects_it_needs():
    views = {"a": 20, "b": 20, "c": 20}
    config = RecordDP(1.0, 1e-5)
    sigma = config.noise_sd(math.sqrt(60) / 6)  # the default clip of 60 columns in [0, 1]
    tau = sigma * math.sqrt(3) / 30_000
    # a leading eigenvalue lambda_0 against the noise of the 60 x 60 covariance, tau sqrt(60)
    expected = 1 / (1 + 60 * tau ** 2 / SIGNAL_EIGENVALUE ** 2)
    assert mvppca_forecast(views, 5, 3, config, n_subjects=30_000).kept == pytest.approx(expected)
    n = subjects_needed(views, 5, 3, config)
    assert mvppca_forecast(views, 5, 3, config, n_subjects=n).kept >= THRESHOLD > mvppca_forecast(views, 5, 3, config, n_subjects=n - 1).kept
    # the verdict turns where the noise's edge tau sqrt(D) reaches lambda_0: n = sigma sqrt(C D) / lambda_0
    assert n == math.ceil(sigma * math.sqrt(3 * 60) / SIGNAL_EIGENVALUE)
    with pytest.raises(ValueError, match="number of subjects"):
        mvppca_forecast(views, 5, 3, config)


@pytest.mark.parametrize("dims, n_subjects, epsilon, beats", [
    ({"a": 15, "b": 8, "c": 10}, 267, 0.5, True),  # SD: 33 features, the fit beat the mean at every epsilon
    ({f"v{k}": d for k, d in enumerate((76, 216, 64, 240, 47, 6))}, 1333, 5.0, False),  # mfeat: level with the mean
    ({f"v{k}": d for k, d in enumerate((76, 216, 64, 240, 47, 6))}, 1333, 10.0, True),
])
def test_record_level_verdict_counts_the_total_width_not_a_share_of_the_signal(dims, n_subjects, epsilon, beats):
    # the sides measured over 10 seeds (benchmarks/private_utility.py), where the earlier per-view forecast
    # was wrong: SD at epsilon 0.5 (called hopeless, 6 % kept; SD was not used to fit lambda_0) and mfeat at
    # epsilon 5 (called a win, 76 % kept; mfeat's two cells bracket lambda_0)
    assert mvppca_forecast(dims, 5, 3, RecordDP(epsilon, 1e-5), n_subjects=n_subjects).beats_mean is beats


def test_demo_shapes_declared_for_the_forecast_are_the_bundled_data_s():
    from fedhier.data import load_alzheimer
    from fedhier.demo import ALZHEIMER_SUBJECTS, ALZHEIMER_VIEWS

    data = load_alzheimer()
    assert dict(zip(data.schema.names, data.schema.dims)) == ALZHEIMER_VIEWS and data.n_samples == ALZHEIMER_SUBJECTS


class _Read(BaseException):
    """Raised by the patched reader: the test stops at the first data read (past the command line's error handling)."""


def _record_reads(monkeypatch, events):
    import fedhier.demo as demo

    def reader():
        events.append("read")
        raise _Read

    monkeypatch.setattr(demo, "warnings", _Recording(events))
    monkeypatch.setattr(demo, "load_alzheimer", reader)


@pytest.mark.parametrize("unit, epsilon, warned", [("site", 1.0, True), ("site", 1e6, False), ("record", 1.0, True),
                                                   ("record", 10.0, False)])
def test_a_hopeless_private_demo_is_warned_about_before_any_data_is_read(tmp_path, monkeypatch, unit, epsilon, warned):
    import fedhier.demo as demo

    events = []
    _record_reads(monkeypatch, events)
    with pytest.raises(_Read):
        demo.run_demo(tmp_path / "out", total_budget=(epsilon, 1e-5), unit=unit, progress=False)
    assert events == (["warning: not expected to beat the training mean", "read"] if warned else ["read"]), events


@pytest.mark.parametrize("flags, warned", [(["--dp"], False), (["--dp", "--unit", "site"], True)])
def test_the_demo_s_default_dp_is_not_warned_about_and_site_level_is(tmp_path, monkeypatch, capsys, flags, warned):
    from fedhier.cli import main

    events = []
    _record_reads(monkeypatch, events)
    with pytest.raises(_Read):
        main(["demo", *flags, "--quiet", "--out", str(tmp_path / "out")])
    assert events == (["warning: not expected to beat the training mean", "read"] if warned else ["read"]), events
    if not warned:  # the forecast is printed instead, before the data are read
        assert "expected to beat the training mean" in capsys.readouterr().out


class _Recording:
    """Stands in for the demo's ``warnings`` module: records each warning's verdict in the event list."""

    def __init__(self, events):
        self.events = events

    def warn(self, message, category=UserWarning, stacklevel=1):
        assert category is UserWarning and "utility forecast" in message
        self.events.append("warning: " + message.split("the private model is ")[1].split(" (")[0])


@pytest.mark.slow  # a whole demo with its report (about 15 s)
def test_the_demo_command_prints_the_forecast_and_the_training_mean(tmp_path, capsys):
    from fedhier.cli import main

    assert main(["demo", "--epsilon", "1000000", "--rounds", "3", "--quiet", "--out", str(tmp_path / "r")]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0].startswith("utility forecast:") and "expected to beat the training mean" in lines[0]
    assert any(line.startswith("test MAE of each feature's training mean") for line in lines)


@pytest.mark.parametrize("unit, expected", [("site", "fedhier: warning: utility forecast:"),
                                            ("record", "utility forecast: record-level DP at epsilon 1 needs about")])
def test_fedhier_fit_forecasts_before_any_site_file_is_read(tmp_path, monkeypatch, capsys, unit, expected):
    import fedhier.userdata as userdata
    from fedhier.cli import main

    config = tmp_path / "fit.toml"
    ranges = "".join(f"{c} = [0, 10]\n" for c in ("x1", "x2", "x3", "y1", "y2", "y3", "y4"))
    config.write_text(f'epsilon = 1.0\nprivacy_unit = "{unit}"\nscale = "minmax"\n[views]\na = ["x1", "x2", "x3"]\n'
                      f'b = ["y1", "y2", "y3", "y4"]\n[sites]\none = "one.csv"\ntwo = "two.csv"\n[ranges]\n{ranges}')
    shown_before_read = []

    def reader(*args, **kwargs):
        shown_before_read.append(capsys.readouterr().err)
        raise _Read

    monkeypatch.setattr(userdata, "site_data", reader)
    with pytest.raises(_Read):
        main(["fit", "--config", str(config), "--out", str(tmp_path / "out"), "--quiet"])
    assert len(shown_before_read) == 1 and shown_before_read[0].startswith(expected), shown_before_read


def test_record_level_fit_warns_once_it_has_counted_too_few_subjects(tmp_path, capsys):
    import csv

    from fedhier.cli import main

    rng = np.random.default_rng(0)
    columns = ["x1", "x2", "x3", "y1", "y2", "y3", "y4"]
    for site in ("one", "two"):
        with (tmp_path / f"{site}.csv").open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(columns)
            writer.writerows(rng.uniform(0, 10, size=(20, 7)).round(3).tolist())
    ranges = "".join(f"{c} = [0, 10]\n" for c in columns)
    (tmp_path / "fit.toml").write_text('epsilon = 0.1\nprivacy_unit = "record"\nscale = "minmax"\nn_components = 2\n'
                                       '[views]\na = ["x1", "x2", "x3"]\nb = ["y1", "y2", "y3", "y4"]\n'
                                       f'[sites]\none = "one.csv"\ntwo = "two.csv"\n[ranges]\n{ranges}')
    assert main(["fit", "--config", str(tmp_path / "fit.toml"), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    err = capsys.readouterr().err
    need = err.index("utility forecast: record-level DP at epsilon 0.1 needs about")
    warned = err.index("fedhier: warning: utility forecast: the noise leaves")  # 40 subjects are too few
    assert need < warned and "not expected to beat the training mean" in err[warned:]
