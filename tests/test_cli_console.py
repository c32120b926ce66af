"""The command line's shared parts: one-line errors and warnings (cli/console.py), round observers of the
runtimes (runtime/observers.py) and the progress they feed (utils/progress.py, the Flower history follower)."""

from __future__ import annotations

import json
import tomllib
import warnings

import numpy as np
import pytest

from fedhier.cli import main
from fedhier.cli.console import one_line_warnings, run, user_error
from fedhier.runtime.observers import observe_rounds
from fedhier.runtime.simulate import RoundRecord


# --------------------------------------------------------------------------- errors


def _raised(exc_type, *args, **kw):
    try:
        raise exc_type(*args, **kw)
    except exc_type as exc:
        return exc


def test_user_errors_are_one_line_and_internal_errors_are_not_caught(tmp_path):
    from fedhier.privacy.policy import PolicyRefusal
    from fedhier.userdata import SiteDataError

    try:
        open(tmp_path / "nope.csv")
    except FileNotFoundError as exc:
        missing = exc
    assert user_error(missing) == f"{tmp_path / 'nope.csv'}: no such file or directory"
    assert user_error(ValueError("column 'age' is not numeric")) == "column 'age' is not numeric"
    assert user_error(SiteDataError("site 'north', column 'age', row 3: empty")) == "site 'north', column 'age', row 3: empty"
    assert user_error(PolicyRefusal("views ['csf'] are not allowed")) == "views ['csf'] are not allowed"
    try:
        tomllib.loads("n_rounds = = 3")
    except tomllib.TOMLDecodeError as exc:
        assert user_error(exc).startswith("Invalid value")
    for internal in (KeyError("x"), TypeError("bad"), ZeroDivisionError(), AttributeError("a"), RuntimeError("bug")):
        assert user_error(internal) is None
    assert user_error(RuntimeError("flwr run failed"), also=(RuntimeError,)) == "flwr run failed"


def test_a_missing_extra_is_named_also_behind_a_module_s_own_import_error():
    missing = ModuleNotFoundError("No module named 'flwr'", name="flwr")
    try:
        try:
            raise missing
        except ImportError as exc:
            raise ImportError("the Flower runtime needs the optional extra") from exc
    except ImportError as wrapped:
        text = user_error(wrapped, "fedhier flower run")
    assert text.startswith("`fedhier flower run` needs the optional package flwr") and 'pip install -e ".[flower]"' in text
    assert "[stats]" in user_error(ModuleNotFoundError("x", name="statsmodels.api"), "fedhier experiment fedlin-radon")
    assert user_error(ModuleNotFoundError("No module named 'nosuch'", name="nosuch")) is None  # not an extra: a bug


def test_run_gives_2_and_one_line_for_a_user_error_and_a_traceback_otherwise(capsys, monkeypatch):
    monkeypatch.delenv("FEDHIER_DEBUG", raising=False)

    def bad_value():
        raise ValueError("site 'south': column 'bp' not found")

    assert run(bad_value) == 2
    assert capsys.readouterr().err == "fedhier: error: site 'south': column 'bp' not found\n"
    with pytest.raises(KeyError):
        run(lambda: {}["missing"])

    def interrupted():
        raise KeyboardInterrupt

    assert run(interrupted) == 130 and capsys.readouterr().err == "fedhier: interrupted\n"
    monkeypatch.setenv("FEDHIER_DEBUG", "1")
    with pytest.raises(ValueError):
        run(bad_value)


def test_commands_print_user_errors_as_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FEDHIER_DEBUG", raising=False)
    (tmp_path / "d.csv").write_text("s,a,y\n0,1,2\n")
    cases = [
        ["fit", "linear", str(tmp_path / "nope.csv"), "--site", "s", "--target", "y", "--features", "a", "--out", str(tmp_path / "o")],
        ["fit", "--config", str(tmp_path / "nope.toml")],
        ["experiment", "no-such-experiment"],
        ["flower", "site", "--site", "a", "--data", str(tmp_path / "nope.csv"), "--superlink", "h:1", "--insecure", "--print-command"],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("fedhier: error: "), (argv, err)


# --------------------------------------------------------------------------- warnings


def test_warnings_print_as_one_line_without_the_source_line(capsys, monkeypatch):
    from fedhier.estimators.fedlin import FedLinWarning

    monkeypatch.delenv("FEDHIER_DEBUG", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        before = warnings.showwarning
        with one_line_warnings():
            warnings.warn("site 'north': effective sample size 1.0", FedLinWarning)
            warnings.warn("overflow encountered in exp", RuntimeWarning)
        assert warnings.showwarning is before  # Python's format again after the command
    assert capsys.readouterr().err.splitlines() == ["fedhier: warning: site 'north': effective sample size 1.0",
                                                    "fedhier: warning: overflow encountered in exp (RuntimeWarning)"]


# --------------------------------------------------------------------------- round observers and progress


def _hm2_sites(rng, n_sites=4, n=40):
    beta = np.array([1.0, -0.5])
    sites = []
    for _ in range(n_sites):
        X = rng.normal(size=(n, 2))
        sites.append((X, X @ (beta + 0.2 * rng.normal(size=2)) + 0.3 * rng.normal(size=n)))
    return sites


def test_simulate_and_the_peer_runtime_tell_the_observers_of_every_round_within_the_block():
    from fedhier.estimators.collab import CollabDict
    from fedhier.estimators.fedlin import FedHM2Regressor

    rng = np.random.default_rng(0)
    seen: list[RoundRecord] = []
    with observe_rounds(lambda record, broadcast: seen.append(record)):
        hm2 = FedHM2Regressor(n_rounds=6, random_state=0).fit(_hm2_sites(rng))
    assert [r.round for r in seen] == list(range(1, len(hm2.history_) + 1)) and all(isinstance(r, RoundRecord) for r in seen)

    seen.clear()
    with observe_rounds(lambda record, broadcast: seen.append(record)):
        collab = CollabDict(n_components=2, max_iter=4, random_state=0).fit([rng.normal(size=(30, 3)) for _ in range(3)])
    # the peer runtime: one round of moments, then the fit's rounds, every round with the sites that took part
    assert [r.round for r in seen] == [1, *range(1, collab.n_iter_ + 1)] and all(r.sites == [0, 1, 2] for r in seen)

    seen.clear()
    FedHM2Regressor(n_rounds=3, random_state=0).fit(_hm2_sites(rng))  # outside the block: nobody is told
    assert seen == []


def test_fit_linear_shows_its_rounds_and_the_last_line_says_where_it_stopped(tmp_path, capsys):
    rng = np.random.default_rng(1)
    rows = ["site,a,b,y"] + [f"{k},{x[0]:.5f},{x[1]:.5f},{y:.5f}" for k, (X, Y) in enumerate(_hm2_sites(rng)) for x, y in zip(X, Y)]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    argv = ["fit", "linear", str(tmp_path / "d.csv"), "--site", "site", "--target", "y", "--features", "a,b", "--rounds", "30"]
    assert main(argv + ["--out", str(tmp_path / "o")]) == 0
    history = json.loads((tmp_path / "o" / "history.json").read_text())
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("FedLin HM2 rounds: ")]
    assert lines and lines[-1].startswith(f"FedLin HM2 rounds: {len(history)}/30 ")
    assert main(argv + ["--out", str(tmp_path / "q"), "--quiet"]) == 0
    assert "FedLin HM2 rounds" not in capsys.readouterr().err


def test_flower_run_follows_the_coordinator_history_file(tmp_path):
    from fedhier.cli.flower import _HistoryFollower

    path = tmp_path / "history.json"

    def rows(n):
        return [RoundRecord(round=r, sites=[0, 1], absent=[], failed={}, bytes_up={0: 8, 1: 8}, bytes_down={0: 8, 1: 8},
                            metrics={"expected_ll": -float(r)}).to_dict() for r in range(1, n + 1)]

    class Display:
        rounds: list[int] = []
        closed = False

        def __call__(self, record, broadcast=None):
            self.rounds.append(record.round)

        def close(self):
            self.closed = True

    path.write_text(json.dumps(rows(5)))  # an earlier run's file: not this run's rounds
    display = Display()
    follower = _HistoryFollower(path, display)
    follower.update()
    assert display.rounds == []
    path.write_text(json.dumps(rows(1)))
    follower.update()
    path.write_text(json.dumps(rows(3)))
    follower.update()
    follower.update()
    assert display.rounds == [1, 2, 3]
    follower.start()
    follower.stop()
    assert display.closed and display.rounds == [1, 2, 3]


def test_a_bar_opened_inside_another_shares_its_live_display_on_a_terminal(monkeypatch):
    import io

    from rich.console import Console

    from fedhier.utils import progress

    class Terminal(Console):
        def __init__(self, **kw):
            super().__init__(file=io.StringIO(), force_terminal=True, **{k: v for k, v in kw.items() if k != "stderr"})

    monkeypatch.setattr(progress, "Console", Terminal)
    outer = progress.StepProgress(3, "cells")
    inner = progress.RoundProgress(5, "rounds")  # rich allows one live display: this one must join the outer's
    assert inner._progress is outer._progress and len(outer._progress.tasks) == 2
    inner(RoundRecord(round=1, sites=[0], absent=[], failed={}, bytes_up={}, bytes_down={}))
    inner.close()
    assert [t.description for t in outer._progress.tasks] == ["cells"]
    live = outer._progress
    outer.close()
    assert not live.live.is_started and progress._live == {"progress": None, "users": 0}


def test_an_experiment_s_display_counts_its_fits_and_rounds(capsys):
    from fedhier.cli.console import rounds_shown
    from fedhier.estimators.fedlin import FedHM2Regressor

    rng = np.random.default_rng(2)
    with rounds_shown(None, "toy experiment"):
        fits = [FedHM2Regressor(n_rounds=n, random_state=0).fit(_hm2_sites(rng)) for n in (2, 3)]
    lines = capsys.readouterr().err.splitlines()
    rounds = sum(len(f.history_) for f in fits)
    assert lines and lines[-1].startswith(f"toy experiment: 2 fits, {rounds} rounds, ")


def test_fedhier_log_records_print_their_first_line_only(capsys, monkeypatch):
    import logging

    monkeypatch.delenv("FEDHIER_DEBUG", raising=False)
    with one_line_warnings():
        logging.getLogger("fedhier.site").warning("site %d, round %d failed: %s\n%s", 1, 3, "LinAlgError: singular",
                                                  "Traceback (most recent call last):\n  File ...")
        logging.getLogger("fedhier.protocol.mvppca").info("round 2, master: a safeguard")  # below WARNING: not shown
    assert capsys.readouterr().err.splitlines() == ["fedhier: warning: site 1, round 3 failed: LinAlgError: singular"]
    assert logging.getLogger("fedhier").handlers == []


def test_collab_fit_shows_its_rounds(tmp_path, capsys):
    pytest.importorskip("pandas")
    rng = np.random.default_rng(3)
    rows = ["site,a,b,c"] + [f"{s},{x[0]:.4f},{x[1]:.4f},{x[2]:.4f}" for s in "pqr" for x in rng.normal(size=(40, 3))]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    assert main(["collab", "fit", "--csv", str(tmp_path / "d.csv"), "--site-column", "site", "--components", "2",
                 "--max-iter", "4", "--out", str(tmp_path / "m.npz")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("CollabDict rounds: ")]
    from fedhier.estimators.collab import CollabDict

    n_iter = CollabDict.load(tmp_path / "m.npz").n_iter_
    assert lines and lines[-1].startswith(f"CollabDict rounds: {n_iter + 1}/5 ")  # + the round of moments


def test_an_experiment_s_line_appears_with_its_first_round_only(monkeypatch):
    import io

    from rich.console import Console

    from fedhier.utils import progress

    class Terminal(Console):
        def __init__(self, **kw):
            super().__init__(file=io.StringIO(), force_terminal=True, **{k: v for k, v in kw.items() if k != "stderr"})

    monkeypatch.setattr(progress, "Console", Terminal)
    fits = progress.FitsProgress("cells elsewhere")  # e.g. every fit in a worker process: nothing to show
    assert progress._live["progress"] is None
    fits(RoundRecord(round=1, sites=[0], absent=[], failed={}, bytes_up={}, bytes_down={}))
    assert [t.description for t in progress._live["progress"].tasks] == ["cells elsewhere"]
    fits.close()
    fits.close()
    assert progress._live == {"progress": None, "users": 0}
