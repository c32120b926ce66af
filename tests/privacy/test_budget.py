"""Per-release and total budgets, and the budget stop (spec fed-mv-ppca §8.4 [R])."""

import math

import dp_accounting
import pytest
from scipy import optimize
from scipy.stats import norm

from fedhier.privacy.budget import PerReleaseBudget, PrivacyBudgetExhausted, TotalBudget, check_budget
from fedhier.privacy.calibration import gaussian_noise_multiplier
from fedhier.privacy.ledger import PrivacyLedger


def gdp_delta(mu, eps):
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


def gdp_noise_multiplier(eps, delta, n):
    """Independent closed form: n releases with multiplier z are sqrt(n)/z - GDP; solve for z."""
    mu = optimize.brentq(lambda m: gdp_delta(m, eps) - delta, 1e-6, 50.0, xtol=1e-14)
    return math.sqrt(n) / mu


@pytest.mark.parametrize("eps,delta,rounds,per_round", [(1.0, 1e-5, 20, 9), (10.0, 1e-5, 30, 12), (0.5, 1e-6, 3, 2)])
def test_total_budget_calibration_meets_target_closely(eps, delta, rounds, per_round):
    budget = TotalBudget(eps, delta, rounds, per_round)
    z = budget.gaussian_multiplier
    assert z == pytest.approx(gdp_noise_multiplier(eps, delta, rounds * per_round), rel=2e-3)
    ledger = PrivacyLedger()
    for r in range(1, rounds + 1):
        events = [dp_accounting.GaussianDpEvent(budget.noise_multiplier("gaussian"))] * per_round
        check_budget(ledger, budget, "site", r, events)
        for i, event in enumerate(events):
            ledger.record("site", r, f"b{i}", event)
    spent = ledger.spent(delta)["site"]["epsilon"]
    assert spent <= eps
    assert spent >= 0.99 * eps
    assert ledger.stops == []


def test_paper_sized_calibration_matches_spec_figures():
    # §8.4: 800 Gaussian releases (K=4, R=100) need z ~ 14 for (10, 1e-5) and z ~ 105 for (1, 1e-5)
    assert TotalBudget(10.0, 1e-5, 100, 8).gaussian_multiplier == pytest.approx(14, rel=0.05)
    assert TotalBudget(1.0, 1e-5, 100, 8).gaussian_multiplier == pytest.approx(105, rel=0.05)


def test_budget_stop_prevents_exceeding():
    budget = TotalBudget(1.0, 1e-5, 4, 3)
    event = dp_accounting.GaussianDpEvent(budget.gaussian_multiplier)
    ledger = PrivacyLedger()
    completed = 0
    for r in range(1, 8):  # more rounds than planned
        try:
            check_budget(ledger, budget, 0, r, [event] * 3)
        except PrivacyBudgetExhausted as stop:
            assert stop.site == 0 and stop.round == r and stop.epsilon_after > 1.0
            continue
        for b in range(3):
            ledger.record(0, r, f"b{b}", event)
        completed += 1
    assert completed == 4
    assert ledger.epsilon(0, 1e-5) <= 1.0
    assert [s["round"] for s in ledger.stops] == [5, 6, 7]
    assert ledger.spent(1e-5)[0]["stopped_at_round"] == 5


def test_per_release_budget_never_stops_and_uses_paper_multipliers():
    budget = PerReleaseBudget(10.0, 0.01)
    assert budget.target is None
    assert budget.noise_multiplier("gaussian") == pytest.approx(gaussian_noise_multiplier(10.0, 0.01, "zhao"))
    assert budget.noise_multiplier("laplace") == pytest.approx(0.1)
    ledger = PrivacyLedger()
    for r in range(1, 50):
        check_budget(ledger, budget, 0, r, [dp_accounting.GaussianDpEvent(0.01)])
    assert PerReleaseBudget(1.0, 0.01, "analytic").noise_multiplier("gaussian") == pytest.approx(
        gaussian_noise_multiplier(1.0, 0.01, "analytic")
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: TotalBudget(0.0, 1e-5, 10, 3),
        lambda: TotalBudget(1.0, 1.0, 10, 3),
        lambda: TotalBudget(1.0, 1e-5, 0, 3),
        lambda: TotalBudget(1.0, 1e-5, 10, 0),
        lambda: TotalBudget(1.0, 1e-5, 10, True),
        lambda: TotalBudget(1.0, 1e-5, 10, 3).noise_multiplier("laplace"),
        lambda: PerReleaseBudget(10.0, 0.01, "classical"),
        lambda: PerReleaseBudget(1.0, 0.01).noise_multiplier("exponential"),
    ],
)
def test_refuses_invalid_or_impossible_settings(call):
    with pytest.raises(ValueError):
        call()


def test_an_epsilon_beyond_the_accountant_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="cannot calibrate Gaussian noise for a total budget of \\(epsilon=100000000.0"):
        TotalBudget(1e8, 1e-5, 100, 9)
