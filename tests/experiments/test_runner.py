"""The shared experiment runner: resume, refusal of mixed runs, determinism, summaries."""

import json

import numpy as np
import pytest

from fedhier.experiments.runner import Runner, Task, cell_seed, format_mean_std, read_results, summarise

KEY = ("repeat", "fold")


def _tasks(n_repeats=2, n_folds=3, methods=("a", "b")):
    return [Task({"repeat": r, "fold": f}, methods) for r in range(n_repeats) for f in range(n_folds)]


def noisy_work(task):
    """Module level (picklable): one value per method drawn from the cell's own seed."""
    rows = []
    for m in task.methods:
        rng = np.random.default_rng(cell_seed(7, task.key["repeat"], task.key["fold"], m))
        rows.append({**task.key, "method": m, "value": float(rng.normal())})
    return rows


def _runner(path, **kw):
    args = dict(name="toy", seed=7, quick=False, design={"n": 1}, key_columns=KEY, progress=False)
    args.update(kw)
    return Runner(path, **args)


def test_resume_runs_only_missing_cells(tmp_path):
    calls = []

    def interrupted(task):
        if len(calls) == 3:
            raise KeyboardInterrupt  # the run stops half-way
        calls.append(dict(task.key))
        return noisy_work(task)

    with pytest.raises(KeyboardInterrupt):
        _runner(tmp_path).run(_tasks(), interrupted)
    assert len(read_results(tmp_path)) == 6  # 3 tasks x 2 methods written before the stop

    seen = []

    def resumed(task):
        seen.append((dict(task.key), task.methods))
        return noisy_work(task)

    rows = _runner(tmp_path).run(_tasks(), resumed)
    assert [k for k, _ in seen] == [{"repeat": 1, "fold": f} for f in range(3)]
    assert len(rows) == 12 and len(read_results(tmp_path)) == 12
    # an uninterrupted run gives the same numbers
    fresh = _runner(tmp_path / "fresh").run(_tasks(), noisy_work)
    key = lambda r: (r["repeat"], r["fold"], r["method"])  # noqa: E731
    assert sorted(map(key, rows)) == sorted(map(key, fresh))
    assert {key(r): r["value"] for r in rows} == pytest.approx({key(r): r["value"] for r in fresh})
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["cells_done"] == 12 and meta["cells_planned"] == 12 and meta["sessions"] == 2


def test_new_method_adds_only_its_cells(tmp_path):
    _runner(tmp_path).run(_tasks(methods=("a",)), noisy_work)
    seen = []

    def work(task):
        seen.append(task.methods)
        return noisy_work(task)

    _runner(tmp_path).run(_tasks(methods=("a", "b")), work)
    assert seen == [("b",)] * 6


def test_execute_false_runs_nothing(tmp_path):
    _runner(tmp_path).run(_tasks()[:2], noisy_work)

    def boom(task):
        raise AssertionError("must not run")

    rows = _runner(tmp_path).run(_tasks(), boom, execute=False)
    assert len(rows) == 4
    assert json.loads((tmp_path / "run.json").read_text())["cells_planned"] == 12


@pytest.mark.parametrize("change", [{"seed": 8}, {"quick": True}, {"design": {"n": 2}}])
def test_refuses_a_folder_of_another_run(tmp_path, change):
    _runner(tmp_path).run(_tasks()[:1], noisy_work)
    with pytest.raises(ValueError, match="another"):
        _runner(tmp_path, **change)


def test_results_without_metadata_are_refused(tmp_path):
    (tmp_path / "results.csv").write_text("repeat,fold,method\n0,0,a\n")
    with pytest.raises(ValueError, match="run.json"):
        _runner(tmp_path)


def test_two_processes_give_the_same_rows(tmp_path):
    one = _runner(tmp_path / "one").run(_tasks(), noisy_work)
    two = _runner(tmp_path / "two", n_processes=2).run(_tasks(), noisy_work)
    by_key = lambda rows: {(r["repeat"], r["fold"], r["method"]): r["value"] for r in rows}  # noqa: E731
    assert by_key(one) == by_key(two)


def test_cell_seed_is_stable_and_distinct():
    assert cell_seed(0, "partition", 1, 2, "GK", 3) == cell_seed(0, "partition", 1, 2, "GK", 3)
    seeds = {cell_seed(s, r, f, m) for s in (0, 1) for r in range(3) for f in range(3) for m in ("a", "b")}
    assert len(seeds) == 36
    assert all(0 <= s < 2**63 for s in seeds)


def test_summarise_is_mean_and_sd_over_repetitions_of_fold_averages():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(4, 3))  # 4 repetitions x 3 folds
    rows = [{"repeat": r, "fold": f, "method": "m", "x": values[r, f]} for r in range(4) for f in range(3)]
    rows.append({"repeat": 0, "fold": 0, "method": "n/a-method", "x": ""})
    out = {s["method"]: s for s in summarise(rows, ("method",), ("x",))}
    fold_means = values.mean(axis=1)
    assert out["m"]["x"] == pytest.approx(fold_means.mean())
    assert out["m"]["x sd"] == pytest.approx(np.std(fold_means, ddof=1))
    assert out["m"]["repetitions"] == 4 and out["m"]["runs"] == 12
    assert np.isnan(out["n/a-method"]["x"])


def test_format_mean_std():
    assert format_mean_std(0.10734, 0.00041) == "0.1073 ± 0.0004"
    assert format_mean_std(float("nan"), 0.1) == "n/a"
    assert format_mean_std(0.5, float("nan")) == "0.5000"


def test_summarise_leaves_out_unfinished_repetitions():
    rows = [{"repeat": r, "fold": f, "method": "m", "x": float(10 * r + f)} for r in range(3) for f in range(3)]
    rows = rows[:-1]  # repetition 2 lacks its last fold
    (out,) = summarise(rows, ("method",), ("x",), n_folds=3)
    assert out["repetitions"] == 2 and out["runs"] == 6
    assert out["x"] == pytest.approx(np.mean([1.0, 11.0]))
    assert summarise(rows[:2], ("method",), ("x",), n_folds=3) == []


def test_format_mean_std_keeps_huge_values_readable():
    assert format_mean_std(2.5e40, 1e39) == "2.500e+40 ± 1.0e+39"


def test_time_left_carries_the_measured_cost_of_each_kind_of_cell_to_the_cells_still_to_run(tmp_path):
    runner = _runner(tmp_path, key_columns=("repeat", "fold", "scenario"), n_processes=2)
    rows = (
        [{"repeat": r, "fold": 0, "scenario": "iid", "method": "mean", "seconds": 0.01} for r in range(3)]
        + [{"repeat": r, "fold": 0, "scenario": "iid", "method": "vae", "seconds": s} for r, s in enumerate((100.0, 140.0, 120.0))]
        + [{"repeat": r, "fold": 0, "scenario": "K", "method": "vae", "status": "n/a"} for r in range(2)]
    )
    to_run = {("iid", "vae"): 4, ("K", "vae"): 2, ("G", "vae"): 1, ("iid", "mean"): 10, ("G", "mean"): 0}
    # same method and scenario: median 120 s (iid) and 0 s (K, reported n/a); G falls back to the
    # median over all of the method's cells (0, 0, 100, 120, 140); two processes share the work
    assert runner.seconds_left(rows, to_run) == pytest.approx((4 * 120 + 2 * 0 + 1 * 100 + 10 * 0.01) / 2)
    assert runner.seconds_left(rows, {**to_run, ("iid", "fa"): 1}) is None  # a method not measured yet


def test_a_resumed_run_reports_the_time_left_of_its_slow_cells_not_of_the_cheap_ones_done(tmp_path, monkeypatch):
    import fedhier.experiments.runner as runner_module

    def timed_work(task):
        return [{**task.key, "method": m, "seconds": {"cheap": 0.01, "slow": 100.0, "slower": 300.0}[m]} for m in task.methods]

    lefts = []

    class Recorder:
        def __init__(self, total, description):
            pass

        def advance(self, n=1, info="", *, left=None):
            lefts.append(left)

        def close(self):
            pass

    monkeypatch.setattr(runner_module, "StepProgress", Recorder)
    tasks = lambda methods: [Task({"repeat": r, "fold": 0}, methods) for r in range(4)]  # noqa: E731
    _runner(tmp_path, progress=True).run(tasks(("cheap",)), timed_work)
    lefts.clear()
    _runner(tmp_path, progress=True).run(tasks(("cheap", "slow")), timed_work)  # the cheap cells are done
    assert lefts == pytest.approx([300.0, 200.0, 100.0, 0.0])
    lefts.clear()
    # "slower" runs after every "slow" cell: until one of its cells is done, no estimate
    later = [Task({"repeat": r, "fold": 1}, ("slow",)) for r in range(2)] + [Task({"repeat": r, "fold": 1}, ("slower",)) for r in range(2)]
    _runner(tmp_path, progress=True).run(later, timed_work)
    assert lefts[:2] == [None, None] and lefts[2:] == pytest.approx([300.0, 0.0])
