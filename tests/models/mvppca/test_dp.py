"""DP-Fed-mv-PPCA site procedure (spec fed-mv-ppca §8.2) with hand-made global parameters."""

import math
from dataclasses import replace

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from fedhier.models.mvppca.dp import SPREAD_BLOCKS, DPConfig, privatize_site_params, privatize_spread, round_events
from fedhier.models.mvppca.params import GlobalView, ViewParams
from fedhier.privacy import PerReleaseBudget, PrivacyBudgetExhausted, PrivacyLedger, gaussian_noise_multiplier

ALPHA = 1e-3  # false-alarm rate of each statistical test (fixed seeds)
Q = 2


def make_prior(dim, seed, *, sigma2_mu=0.04, sigma2_W=0.01, alpha=5.0, beta=2.0, noise_var=0.6, var_sigma=None):
    rng = np.random.default_rng(seed)
    if var_sigma is None:
        var_sigma = beta**2 / ((alpha - 1) ** 2 * (alpha - 2))
    return GlobalView(
        mu=rng.normal(size=dim), W=rng.normal(size=(dim, Q)), sigma2_mu=sigma2_mu, sigma2_W=sigma2_W,
        alpha=alpha, beta=beta, noise_var=noise_var, var_sigma=var_sigma,
    )


@pytest.fixture
def prior():
    return {"clinic": make_prior(4, 1), "mri": make_prior(3, 2)}


@pytest.fixture
def local(prior):
    """Site parameters: mu far outside the clipping ball, W inside it, sigma2 above the anchor."""
    return {
        view: ViewParams(mu=g.mu + 3.0, W=g.W + 0.01, sigma2=g.noise_var + 0.2) for view, g in prior.items()
    }


def expected_clipped(value, anchor, bound):
    difference = np.asarray(value, float) - np.asarray(anchor, float)
    return difference / max(1.0, np.sqrt(np.sum(difference**2)) / bound)


def test_released_blocks_have_the_calibrated_noise(prior, local):
    config = DPConfig.per_release(10.0, 0.01)  # the paper's setting: Zhao + Laplace on sigma2
    z = gaussian_noise_multiplier(10.0, 0.01, "zhao")
    ledger = PrivacyLedger()
    rng = np.random.default_rng(11)
    n = 1500
    residuals = {"mu": [], "W": [], "sigma2": []}
    for r in range(n):
        out = privatize_site_params(local, prior, config, rng, site=0, round=r + 2, ledger=ledger)
        g = prior["clinic"]
        bounds = {"mu": math.sqrt(g.sigma2_mu), "W": math.sqrt(g.sigma2_W), "sigma2": math.sqrt(g.var_sigma)}
        released = out["clinic"]
        residuals["mu"].append(
            (released.mu - g.mu - expected_clipped(local["clinic"].mu, g.mu, bounds["mu"])) / (z * 2 * bounds["mu"])
        )
        residuals["W"].append(
            ((released.W - g.W - expected_clipped(local["clinic"].W, g.W, bounds["W"])) / (z * 2 * bounds["W"])).ravel()
        )
        residuals["sigma2"].append(
            (released.sigma2 - g.noise_var - expected_clipped(local["clinic"].sigma2, g.noise_var, bounds["sigma2"]))
            / (2 * bounds["sigma2"] / 10.0)
        )
    assert stats.kstest(np.concatenate(residuals["mu"]), "norm").pvalue > ALPHA
    assert stats.kstest(np.concatenate(residuals["W"]), "norm").pvalue > ALPHA
    assert stats.kstest(np.array(residuals["sigma2"]), "laplace").pvalue > ALPHA
    # one event per block per view per round, labelled
    first = ledger.releases(0, up_to_round=2)
    assert [r.block for r in first] == ["clinic.mu", "clinic.W", "clinic.sigma2", "mri.mu", "mri.W", "mri.sigma2"]
    assert [r.event for r in first] == [
        dp_accounting.GaussianDpEvent(z), dp_accounting.GaussianDpEvent(z), dp_accounting.LaplaceDpEvent(0.1)
    ] * 2


def almost_noiseless(**options):
    """Tiny noise (epsilon = 1e12 per release) exposes anchors, bounds and floors deterministically."""
    return DPConfig(PerReleaseBudget(1e12, 0.01, "analytic"), **options)


def test_anchors_and_bounds(prior, local):
    out = privatize_site_params(local, prior, almost_noiseless(kappa=2.0), np.random.default_rng(0), site=0, round=3,
                                ledger=PrivacyLedger())
    for view, g in prior.items():
        bound = 2 * math.sqrt(g.sigma2_mu)
        np.testing.assert_allclose(out[view].mu, g.mu + expected_clipped(local[view].mu, g.mu, bound), atol=1e-5)
        np.testing.assert_allclose(out[view].W, local[view].W, atol=1e-5)  # inside the ball: unchanged
        assert np.linalg.norm(out[view].mu - g.mu) == pytest.approx(2 * math.sqrt(g.sigma2_mu), abs=1e-5)
        assert out[view].sigma2 == pytest.approx(local[view].sigma2, abs=1e-5)


def test_ig_mean_anchor_and_dimension_aware_bound(prior, local):
    far = {view: ViewParams(mu=p.mu, W=p.W + 5.0, sigma2=p.sigma2 + 50.0) for view, p in local.items()}
    config = almost_noiseless(sigma2_anchor="ig_mean", dimension_aware=True)
    out = privatize_site_params(far, prior, config, np.random.default_rng(0), site=0, round=2, ledger=PrivacyLedger())
    for view, g in prior.items():
        d = g.mu.size
        assert np.linalg.norm(out[view].mu - g.mu) == pytest.approx(math.sqrt(g.sigma2_mu * d), abs=1e-5)
        assert np.linalg.norm(out[view].W - g.W) == pytest.approx(math.sqrt(g.sigma2_W * d * Q), abs=1e-5)
        ig_mean = g.beta / (g.alpha - 1)
        assert out[view].sigma2 == pytest.approx(ig_mean + math.sqrt(g.var_sigma), abs=1e-5)


def test_dimension_aware_bound_counts_only_free_loading_columns():
    """A view of d <= q features has d - 1 free columns of W: the bound is sd sqrt(d (d - 1)), not sd sqrt(d q)."""
    g = make_prior(Q, 4)
    g = replace(g, W=np.column_stack([g.W[:, 0], np.zeros(Q)]))
    far = ViewParams(mu=g.mu, W=g.W + np.column_stack([np.full(Q, 5.0), np.zeros(Q)]), sigma2=g.noise_var)
    out = privatize_site_params({"hr": far}, {"hr": g}, almost_noiseless(dimension_aware=True), np.random.default_rng(0),
                                site=0, round=2, ledger=PrivacyLedger())
    assert np.linalg.norm(out["hr"].W - g.W) == pytest.approx(math.sqrt(g.sigma2_W * Q * (Q - 1)), abs=1e-5)
    np.testing.assert_array_equal(out["hr"].W[:, 1:], 0.0)


def test_infinite_ig_variance_is_capped_or_refused(local):
    prior = {"clinic": make_prior(4, 1, alpha=1.8, var_sigma=np.inf), "mri": make_prior(3, 2)}
    far = dict(local, clinic=ViewParams(local["clinic"].mu, local["clinic"].W, 100.0))
    out = privatize_site_params(far, prior, almost_noiseless(sigma2_sd_cap=3.0), np.random.default_rng(0), site=0,
                                round=2, ledger=PrivacyLedger())
    assert out["clinic"].sigma2 == pytest.approx(0.6 + 3.0 * 0.6, abs=1e-5)
    ledger = PrivacyLedger()
    with pytest.raises(ValueError, match="'clinic'.*sigma2_sd_cap"):
        privatize_site_params(far, prior, almost_noiseless(sigma2_sd_cap=None), np.random.default_rng(0), site=0,
                              round=2, ledger=ledger)
    assert ledger.releases() == []  # nothing released on error


def test_sigma2_floor_is_applied(prior, local):
    small = {view: ViewParams(p.mu, p.W, 1e-3) for view, p in local.items()}
    config = DPConfig.per_release(0.5, 0.01, sigma2_floor=1e-4)
    rng = np.random.default_rng(5)
    values = [
        privatize_site_params(small, prior, config, rng, site=0, round=2, ledger=PrivacyLedger())["mri"].sigma2
        for _ in range(200)
    ]
    assert min(values) == 1e-4
    assert sum(v == 1e-4 for v in values) > 20


def test_gaussian_sigma2_option(prior, local):
    ledger = PrivacyLedger()
    config = DPConfig.per_release(1.0, 1e-3, calibration="analytic", sigma2_mechanism="gaussian")
    privatize_site_params(local, prior, config, np.random.default_rng(0), site="A", round=2, ledger=ledger)
    z = gaussian_noise_multiplier(1.0, 1e-3, "analytic")
    assert all(r.event == dp_accounting.GaussianDpEvent(z) for r in ledger.releases("A"))


@pytest.mark.parametrize("config", [DPConfig.per_release(10.0, 0.01), DPConfig.total(1.0, 1e-5, n_rounds=5, n_views=2)])
def test_round_events_mirror_the_site_ledger(prior, local, config):
    ledger = PrivacyLedger()
    privatize_site_params(local, prior, config, np.random.default_rng(0), site=0, round=2, ledger=ledger)
    assert [(r.block, r.event) for r in ledger.releases(0)] == round_events(local, config)


def test_non_private_first_round_is_recorded_as_void(prior, local):
    ledger = PrivacyLedger()
    config = DPConfig.per_release(10.0, 0.01, first_round="non_private")
    out = privatize_site_params(local, None, config, np.random.default_rng(0), site=0, round=1, ledger=ledger)
    assert out == local
    privatize_site_params(local, prior, config, np.random.default_rng(0), site=0, round=2, ledger=ledger)
    spent = ledger.spent(1e-5)[0]
    assert spent["epsilon"] == math.inf and "void" in spent["note"]


def test_total_budget_run_meets_target_and_stops(prior, local):
    config = DPConfig.total(1.0, 1e-5, n_rounds=4, n_views=2)
    assert config.sigma2_mechanism == "gaussian"
    ledger = PrivacyLedger()
    rng = np.random.default_rng(3)
    one_view = {"mri": local["mri"]}
    for r in range(1, 7):
        try:
            privatize_site_params(local, prior, config, rng, site=0, round=r, ledger=ledger)
        except PrivacyBudgetExhausted:
            assert r > 4
        if r != 3:  # site 1 observes one view and skips round 3
            privatize_site_params(one_view, prior, config, rng, site=1, round=r, ledger=ledger)
    spent = ledger.spent(1e-5)
    assert 0.99 <= spent[0]["epsilon"] <= 1.0
    assert spent[0]["rounds"] == 4 and spent[0]["stopped_at_round"] == 5
    # site 1: 3 releases per round, 5 rounds = 15 releases < the 24 planned: no stop, less spent
    assert spent[1]["releases"] == 15 and "stopped_at_round" not in spent[1]
    assert spent[1]["epsilon"] < spent[0]["epsilon"]


@pytest.mark.parametrize(
    "call",
    [
        lambda: DPConfig.total(1.0, 1e-5, n_rounds=3, n_views=2, first_round="non_private"),
        lambda: DPConfig.total(1.0, 1e-5, n_rounds=3, n_views=2, sigma2_mechanism="laplace"),
        lambda: DPConfig.per_release(10.0, 0.01, kappa=0.0),
        lambda: DPConfig.per_release(10.0, 0.01, sigma2_anchor="median"),
        lambda: DPConfig.per_release(10.0, 0.01, sigma2_floor=0.0),
        lambda: DPConfig(budget=(10.0, 0.01)),
    ],
)
def test_invalid_configs_refused(call):
    with pytest.raises(ValueError):
        call()


def test_invalid_inputs_refused(prior, local):
    config = DPConfig.per_release(10.0, 0.01)
    rng = np.random.default_rng(0)
    ledger = PrivacyLedger()
    with pytest.raises(ValueError, match="'mri'.*no global prior"):
        privatize_site_params(local, {"clinic": prior["clinic"]}, config, rng, site=0, round=2, ledger=ledger)
    bad = dict(local, mri=ViewParams(np.zeros(5), np.zeros((5, Q)), 1.0))
    with pytest.raises(ValueError, match="'mri'.*do not match"):
        privatize_site_params(bad, prior, config, rng, site=0, round=2, ledger=ledger)
    with pytest.raises(ValueError, match="anchor"):
        privatize_site_params(local, None, config, rng, site=0, round=2, ledger=ledger)
    assert ledger.releases() == []


def test_columns_of_W_that_are_zero_in_every_model_are_released_as_zero():
    """A view of d <= q features has q_k = d - 1 free columns of W; the others carry no data.

    Only the free columns are perturbed (with the calibrated noise); the rest come out exactly 0,
    and a view of one feature (q_k = 0) releases a W of zeros.  Each W release is still one event.
    """
    prior = {"pair": make_prior(2, 3), "one": make_prior(1, 4)}
    prior = {v: replace(g, W=np.where(np.arange(Q) < max(g.mu.size - 1, 0), g.W, 0.0))
             for v, g in prior.items()}
    local = {v: ViewParams(mu=g.mu, W=g.W, sigma2=g.noise_var) for v, g in prior.items()}  # zero differences
    config = DPConfig.per_release(10.0, 0.01)
    z = gaussian_noise_multiplier(10.0, 0.01, "zhao")
    ledger, rng = PrivacyLedger(), np.random.default_rng(5)
    free = []
    for r in range(600):
        out = privatize_site_params(local, prior, config, rng, site=0, round=r + 2, ledger=ledger)
        assert np.all(out["pair"].W[:, 1] == 0.0) and np.all(out["one"].W == 0.0)
        free.append((out["pair"].W[:, 0] - prior["pair"].W[:, 0]) / (z * 2 * math.sqrt(prior["pair"].sigma2_W)))
    assert stats.kstest(np.ravel(free), "norm").pvalue > ALPHA  # the free column has the calibrated noise
    assert [(r.block, r.event) for r in ledger.releases(0)][:6] == round_events(local, config)


def test_a_one_feature_views_W_spread_is_released_as_zero_and_counted():
    prior = {"one": make_prior(1, 4), "clinic": make_prior(4, 1)}
    config = DPConfig.total(1.0, 1e-5, n_rounds=3, n_views=2, spread=True)
    ledger = PrivacyLedger()
    spread = {"one": (0.01, 0.0), "clinic": (0.02, 0.01)}
    out = privatize_spread(spread, prior, config, np.random.default_rng(0), site=0, round=2, ledger=ledger)
    assert out["one"][1] == 0.0 and out["one"][0] != 0.01 and out["clinic"][1] != 0.01  # the others are perturbed
    labels = [r.block for r in ledger.releases(0)]
    assert labels == [f"{v}.{b}" for v in spread for b in SPREAD_BLOCKS]
