"""Progress off a terminal: plain lines on stderr (utils/progress.py)."""

from types import SimpleNamespace

from fedhier.utils.progress import RoundProgress, StepProgress


def test_plain_lines_off_a_terminal_at_most_once_per_interval_and_at_the_end(capsys):
    bar = StepProgress(10, "toy cells", log_every=3600.0)  # pytest's captured stderr is not a terminal
    for _ in range(9):
        bar.advance()
    assert capsys.readouterr().err == ""  # the interval has not passed
    bar.advance()
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("toy cells: 10/10 (100%), ") and "left" not in lines[0]


def test_every_step_logged_with_zero_interval_and_remaining_time_extrapolated(capsys):
    bar = StepProgress(4, "toy", log_every=0.0)
    bar.advance(1)
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert bar.line(60.0) == "toy: 1/4 (25%), 1.0 min elapsed, about 3.0 min left"


def test_the_callers_estimate_of_the_time_left_replaces_the_extrapolation(capsys):
    from fedhier.utils.progress import _TimeLeft

    bar = StepProgress(4, "toy", log_every=3600.0)
    bar.advance(1, left=600.0)  # the steps still to run are slower than the one done
    assert bar.line(60.0) == "toy: 1/4 (25%), 1.0 min elapsed, about 10.0 min left"
    bar.advance(1)  # no estimate: extrapolated again
    assert bar.line(60.0) == "toy: 2/4 (50%), 1.0 min elapsed, about 1.0 min left"
    # on a terminal, the bar's remaining-time column shows the estimate the same way
    task = SimpleNamespace(fields={"left": 3725.0}, finished=False)
    assert _TimeLeft().render(task).plain == "1:02:05"


def test_round_progress_reports_the_expected_log_likelihood_and_site_count(capsys):
    bar = RoundProgress(1, "fit")
    bar(SimpleNamespace(metrics={"expected_ll": -12.5}, failed=[1], absent=[], sites=[0, 2]), None)
    assert capsys.readouterr().err.strip().endswith("expected log-lik -12.5  sites 2")


def test_a_repeated_safeguard_is_logged_once_at_its_level_then_at_debug(caplog):
    import logging

    from fedhier.utils.logs import OnceLog

    once = OnceLog(logging.getLogger("fedhier.test.once"))
    with caplog.at_level(logging.DEBUG, logger="fedhier.test.once"):
        for rnd in range(1, 31):
            for site in range(2):
                once(f"iteration {rnd}: view 'csf': zero spread of W, sigma2_W set to 1e-20",
                     "site %d, round %d: %s", site, rnd, "zero spread of W")
        once("view 'csf': alpha 0.5 floored at 1.0", "round %d: %s", 3, "alpha floored")
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [m for lvl, m in levels if lvl == logging.INFO] == [
        "site 0, round 1: zero spread of W (repeats at DEBUG)", "round 3: alpha floored (repeats at DEBUG)"]
    assert sum(lvl == logging.DEBUG for lvl, _ in levels) == 59
