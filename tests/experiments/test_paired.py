"""Paired comparisons against scipy.stats on known data."""

import math

import numpy as np
import pytest
from scipy import stats

from fedhier.experiments.paired import compare, find_blocks, paired, paired_block, paired_table


def test_interval_is_scipy_ttest_rel():
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 0.3, 25)
    b = a + rng.normal(0.05, 0.1, 25)
    mean, low, high = paired(a, b, level=0.9)
    ci = stats.ttest_rel(a, b).confidence_interval(0.9)
    assert mean == pytest.approx(np.mean(a - b), rel=1e-12)
    assert (low, high) == pytest.approx((ci.low, ci.high), rel=1e-12)


def test_interval_by_hand_with_t_quantile():
    # d = 1, 2, 3, 4: mean 2.5, s = sqrt(5/3), t_{0.975, 3} = 3.182446...
    a, b = np.array([2.0, 4.0, 6.0, 8.0]), np.array([1.0, 2.0, 3.0, 4.0])
    mean, low, high = paired(a, b)
    half = stats.t.ppf(0.975, 3) * math.sqrt(5 / 3) / 2
    assert mean == 2.5
    assert (low, high) == pytest.approx((2.5 - half, 2.5 + half), rel=1e-14)


def test_verdicts_follow_the_interval():
    rows = []
    rng = np.random.default_rng(1)
    for run in range(30):
        base = rng.normal(1, 0.2)
        rows += [
            {"run": run, "method": "A", "err": base},
            {"run": run, "method": "B", "err": base + 0.1 + rng.normal(0, 0.01)},  # B clearly worse
            {"run": run, "method": "C", "err": base + rng.normal(0, 0.01)},  # C the same as A
        ]
    ab = compare(rows, "A", "B", "err", pair_on=["run"])
    assert ab.verdict == "lower" and ab.sentence() == "A lower than B" and ab.a_lower == 30 and ab.n == 30
    assert compare(rows, "B", "A", "err", pair_on=["run"]).sentence() == "B higher than A"
    ac = compare(rows, "A", "C", "err", pair_on=["run"])
    ci = stats.ttest_rel([r["err"] for r in rows if r["method"] == "A"], [r["err"] for r in rows if r["method"] == "C"]).confidence_interval()
    assert (ac.ci_low, ac.ci_high) == pytest.approx((ci.low, ci.high), rel=1e-10)
    assert (ci.low < 0 < ci.high) == (ac.sentence() == "no difference detected between A and C")


def test_rows_of_one_pair_are_averaged_diverged_pairs_counted_undefined_ones_absent():
    rows = [
        {"repeat": 0, "fold": 0, "method": "A", "m": 1.0}, {"repeat": 0, "fold": 1, "method": "A", "m": 3.0},
        {"repeat": 0, "fold": 0, "method": "B", "m": 1.0}, {"repeat": 0, "fold": 1, "method": "B", "m": 1.0},
        {"repeat": 1, "fold": 0, "method": "A", "m": 1.0}, {"repeat": 1, "fold": 0, "method": "B", "m": 0.5},
        {"repeat": 2, "fold": 0, "method": "A", "m": "inf"}, {"repeat": 2, "fold": 0, "method": "B", "m": 1.0},  # diverged
        {"repeat": 3, "fold": 0, "method": "A", "m": 2.0},  # no partner: not a pair
        {"repeat": 4, "fold": 0, "method": "A", "m": ""}, {"repeat": 4, "fold": 0, "method": "B", "m": 1.0},  # n/a: not a pair
    ]
    c = compare(rows, "A", "B", "m", pair_on=["repeat"])
    assert c.n == 2 and c.dropped == 1
    assert c.mean_diff == pytest.approx(np.mean([2.0 - 1.0, 1.0 - 0.5]))
    assert c.a_lower == 0


def test_too_few_pairs_claim_nothing():
    c = compare([{"run": 0, "method": "A", "m": 1}, {"run": 0, "method": "B", "m": 2}], "A", "B", "m", pair_on=["run"])
    assert math.isnan(c.ci_low) and c.verdict == "none"


def test_block_round_trip():
    rows = [{"run": str(r), "method": m, "m": str(v)} for r in range(5) for m, v in (("A", r), ("B", r + 1 + 0.01 * r))]
    spec = {"csv": "data/x.csv", "metric": "m", "pair_on": ["run"], "pairs": [["A", "B"]]}
    text = "intro\n" + paired_block(spec, rows) + "outro\n"
    [(found, body)] = find_blocks(text)
    assert found == spec
    assert "A lower than B" in body and "5 of 5" in body
    assert paired_table([]) == ""
