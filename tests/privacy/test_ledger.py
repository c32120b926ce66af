"""Per-site privacy ledger (spec fed-mv-ppca §8.4) against independent computations."""

import json
import math

import dp_accounting
import pytest
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant
from scipy import optimize
from scipy.stats import norm

from fedhier.privacy.ledger import PrivacyLedger, epsilon_of_events, event_from_dict, event_to_dict

G = dp_accounting.GaussianDpEvent
L = dp_accounting.LaplaceDpEvent


def gdp_epsilon(mu, delta):
    """epsilon of mu-GDP at delta from delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (§8.4)."""

    def gap(eps):
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta

    return optimize.brentq(gap, 0.0, 10 * mu * mu + 10 * mu + 10, xtol=1e-12)


@pytest.mark.parametrize("z,n", [(0.385, 8), (5.0, 30), (14.0, 800)])
def test_composed_gaussian_releases_match_mu_gdp(z, n):
    ledger = PrivacyLedger()
    for i in range(n):
        ledger.record("s", 1 + i // 4, f"block{i % 4}", G(z))
    mu = math.sqrt(n) / z  # Dong, Roth & Su: n releases compose to sqrt(n)/z - GDP
    expected = gdp_epsilon(mu, 1e-5)
    # the ledger evaluates a Gaussian composition exactly: no discretisation error
    assert ledger.epsilon("s", 1e-5) == pytest.approx(expected, rel=1e-8)


def test_gaussian_releases_of_different_noise_are_exact_and_below_the_pld_bound():
    multipliers = [0.7, 2.0, 2.0, 5.0, 0.9, 11.0]
    ledger = PrivacyLedger()
    for i, z in enumerate(multipliers):
        ledger.record("s", 1 + i, "W", G(z))
    mu = math.sqrt(sum(1.0 / z**2 for z in multipliers))
    exact = ledger.epsilon("s", 1e-6)
    assert exact == pytest.approx(gdp_epsilon(mu, 1e-6), rel=1e-8)
    pld = PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4)
    pld.compose(dp_accounting.ComposedDpEvent([G(z) for z in multipliers]))
    pessimistic = pld.get_epsilon(1e-6)
    assert exact <= pessimistic <= exact * (1 + 1e-3)
    # a release without noise voids the guarantee; a site with none spends nothing
    ledger.record("t", 1, "W", G(0.0))
    assert ledger.epsilon("t", 1e-6) == math.inf


def test_one_round_of_the_paper_is_about_57():
    # §8.4: 2K = 8 Gaussian releases with z = 0.385 -> mu = 7.35, eps(1e-5) ~ 57
    ledger = PrivacyLedger()
    for i in range(8):
        ledger.record(0, 1, f"b{i}", G(0.385))
    assert ledger.epsilon(0, 1e-5) == pytest.approx(57, abs=1)


def _mixed_ledger(interval):
    ledger = PrivacyLedger(value_discretization_interval=interval)
    events = []
    for round_ in (1, 2, 3):
        for view in ("a", "b"):
            for block, event in (("mu", G(2.0)), ("W", G(2.0)), ("sigma2", L(1.0))):
                ledger.record(0, round_, f"{view}.{block}", event)
                events.append(event)
    ledger.record(0, 4, "a.mu", G(3.0))
    events.append(G(3.0))
    return ledger, events


def test_mixed_gaussian_laplace_equals_direct_dp_accounting():
    ledger, events = _mixed_ledger(1e-3)
    direct = PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-3)
    for event in events:  # one at a time, no grouping
        direct.compose(event)
    assert ledger.epsilon(0, 1e-5) == pytest.approx(direct.get_epsilon(1e-5), rel=1e-3)
    rdp = RdpAccountant()
    for event in events:
        rdp.compose(event)
    assert ledger.epsilon(0, 1e-5, "rdp") == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-9)
    # RDP is the looser of the two
    assert ledger.epsilon(0, 1e-5) <= ledger.epsilon(0, 1e-5, "rdp")


def test_laplace_alone_is_pure_dp():
    # k Laplace releases of noise multiplier 1/eps: basic composition k*eps is tight at delta -> 0
    ledger = PrivacyLedger(value_discretization_interval=1e-4)
    for r in range(1, 4):
        ledger.record(0, r, "x", L(1 / 0.5))
    assert ledger.epsilon(0, 1e-12) == pytest.approx(1.5, abs=5e-3)


def test_partial_participation_costs_nothing():
    ledger = PrivacyLedger()
    reference = PrivacyLedger()
    for round_ in (1, 2, 3):
        for block in ("mu", "W"):
            ledger.record(0, round_, block, G(1.5))
            if round_ != 2:  # site 1 skips round 2
                ledger.record(1, round_, block, G(1.5))
    for round_ in (1, 2):
        for block in ("mu", "W"):
            reference.record(1, round_, block, G(1.5))
    assert ledger.epsilon(1, 1e-5) == pytest.approx(reference.epsilon(1, 1e-5), rel=1e-12)
    assert ledger.epsilon(1, 1e-5) < ledger.epsilon(0, 1e-5)
    table = ledger.round_table(1e-5)
    assert {(row["round"], row["site"]) for row in table} == {(1, 0), (1, 1), (2, 0), (3, 0), (3, 1)}
    row = next(r for r in table if r["round"] == 3 and r["site"] == 1)
    assert row["releases"] == 2
    assert row["epsilon"] == pytest.approx(ledger.epsilon(1, 1e-5))
    by_site = [r["epsilon"] for r in table if r["site"] == 0]
    assert by_site == sorted(by_site)


def test_spent_reports_pld_and_void_guarantee():
    ledger = PrivacyLedger()
    ledger.record(0, 1, "a.mu", dp_accounting.NonPrivateDpEvent())
    ledger.record(0, 2, "a.mu", G(1.0))
    ledger.record(1, 2, "a.mu", G(1.0))
    spent = ledger.spent(1e-5)
    assert spent[0]["epsilon"] == math.inf
    assert "void" in spent[0]["note"] and "[1]" in spent[0]["note"]
    assert spent[1] == {
        "epsilon": pytest.approx(epsilon_of_events([G(1.0)], 1e-5)),
        "delta": 1e-5,
        "accountant": "pld",
        "releases": 1,
        "rounds": 1,
    }
    assert ledger.epsilon(1, 1e-5) == pytest.approx(dp_accounting.get_epsilon_gaussian(1.0, 1e-5), rel=1e-3)


def test_json_round_trip():
    ledger, _ = _mixed_ledger(None)
    ledger.record(2, 1, "b.mu", dp_accounting.NonPrivateDpEvent())
    ledger.record_stop(0, 5, "budget")
    text = ledger.to_json()
    json.loads(text)  # plain JSON
    copy = PrivacyLedger.from_json(text)
    assert copy.releases() == ledger.releases()
    assert copy.stops == ledger.stops
    assert copy.spent(1e-5) == ledger.spent(1e-5)


def test_event_dict_round_trip_nested():
    event = dp_accounting.ComposedDpEvent([G(1.0), dp_accounting.SelfComposedDpEvent(L(0.5), 3)])
    assert event_from_dict(json.loads(json.dumps(event_to_dict(event)))) == event


def test_invalid_inputs_raise():
    ledger = PrivacyLedger()
    with pytest.raises(ValueError, match="DpEvent"):
        ledger.record(0, 1, "mu", 1.0)
    with pytest.raises(ValueError, match="1-based"):
        ledger.record(0, 0, "mu", G(1.0))
    with pytest.raises(ValueError, match="delta"):
        ledger.epsilon(0, 0.0)
    with pytest.raises(ValueError, match="format"):
        PrivacyLedger.from_dict({"releases": []})
    with pytest.raises(ValueError, match="unknown"):
        event_from_dict({"class_name": "os"})
    with pytest.raises(ValueError):
        PrivacyLedger(value_discretization_interval=0.0)
