"""FedHM1Regressor / FedHM2Regressor against independent computations (issue 7 "Done when")."""

import csv
import warnings
from pathlib import Path

import numpy as np
import pytest

from fedhier.estimators.fedlin import FedHM1Regressor, FedHM2Regressor, FedLinWarning, load
from fedhier.models.fedlin.baselines import ditto_personalise, mixedlm_pooled
from fedhier.models.fedlin.inference import a_rmse, credible_interval, inclusion_rates

RADON = Path("/work/shared/data/grouped/radon.csv")


def _conjugate_data(rng, K, d, tau, s2, n=12, mu=None):
    mu = rng.standard_normal(d) if mu is None else mu
    sites, thetas = [], []
    for _ in range(K):
        theta = mu + np.sqrt(tau) * rng.standard_normal(d)
        X = rng.standard_normal((n, d))
        sites.append((X, X @ theta + np.sqrt(s2) * rng.standard_normal(n)))
        thetas.append(theta)
    return sites, np.array(thetas), mu


def _exact_joint_posterior(sites, tau, s2, prior_var=1.0):
    """Brute force: the posterior of (mu, theta_1..theta_K) of the conjugate hierarchy as one Gaussian."""
    K, d = len(sites), sites[0][0].shape[1]
    P = np.zeros(((K + 1) * d, (K + 1) * d))
    h = np.zeros((K + 1) * d)
    P[:d, :d] = np.eye(d) / prior_var
    Dinv = np.diag(1.0 / np.broadcast_to(tau, (d,)))
    for k, (X, y) in enumerate(sites, start=1):
        sl = slice(k * d, (k + 1) * d)
        P[:d, :d] += Dinv
        P[sl, sl] += Dinv + X.T @ X / s2
        P[:d, sl] -= Dinv
        P[sl, :d] -= Dinv
        h[sl] = X.T @ y / s2
    cov = np.linalg.inv(P)
    return cov @ h, cov


def test_hm2_ep_matches_exact_posterior_on_conjugate_hierarchy():
    rng = np.random.default_rng(0)
    tau, s2, d, K = np.array([0.4, 0.9]), 0.25, 2, 5
    sites, _, _ = _conjugate_data(rng, K, d, tau, s2)
    est = FedHM2Regressor(fit_intercept=False, mu_scale=1.0, covariance="fixed", tau=tau, noise=s2, damping=0.5, n_rounds=40, tol=None, n_posterior_draws=20000, random_state=1).fit(sites)
    mean, cov = _exact_joint_posterior(sites, tau, s2)
    # phi = mu: EP is exact for a Gaussian site factor (tolerance: damping residual 0.5^40)
    np.testing.assert_allclose(est.phi_mean_, mean[:d], atol=1e-8)
    np.testing.assert_allclose(est.phi_cov_, cov[:d, :d], atol=1e-8)
    # theta_k from 20000 draws: mean within 5 Monte-Carlo standard errors, sd within 3%
    for k in range(K):
        sl = slice((k + 1) * d, (k + 2) * d)
        sd = np.sqrt(np.diag(cov[sl, sl]))
        assert np.all(np.abs(est.coef_[k] - mean[sl]) < 5 * sd / np.sqrt(20000))
        np.testing.assert_allclose(est.coef_draws_[k].std(axis=0), sd, rtol=0.03)


def test_hm2_ep_is_exact_on_the_conjugate_hierarchy_after_two_rounds():
    """With Gaussian site factors every site's delta is exact: the damped first round is followed by a step
    within one posterior sd, taken whole, which lands on the exact posterior (a damped one would leave half
    the first round's remainder)."""
    rng = np.random.default_rng(0)
    tau, s2, d, K = np.array([0.4, 0.9]), 0.25, 2, 5
    sites, _, _ = _conjugate_data(rng, K, d, tau, s2)
    est = FedHM2Regressor(fit_intercept=False, mu_scale=1.0, covariance="fixed", tau=tau, noise=s2, damping=0.5, n_rounds=2,
                          tol=None, n_posterior_draws=20, random_state=1).fit(sites)
    mean, cov = _exact_joint_posterior(sites, tau, s2)
    assert [row["damping"] for row in est.history_] == [0.5, 1.0]
    np.testing.assert_allclose(est.phi_mean_, mean[:d], atol=1e-10)
    np.testing.assert_allclose(est.phi_cov_, cov[:d, :d], atol=1e-10)


def test_adaptation_equals_refit_with_the_new_site_factor():
    rng = np.random.default_rng(2)
    tau, s2, d = np.array([0.5, 0.5]), 0.2, 2
    sites, _, _ = _conjugate_data(rng, 5, d, tau, s2)
    est = FedHM2Regressor(fit_intercept=False, mu_scale=1.0, covariance="fixed", tau=tau, noise=s2, damping=1.0, n_rounds=3, tol=None, n_posterior_draws=20000, random_state=0).fit(sites[:4])
    k = est.adapt(*sites[4])
    assert k == 4
    mean, cov = _exact_joint_posterior(sites, tau, s2)  # all five sites, i.e. the new site's factor added
    sl = slice(5 * d, 6 * d)
    sd = np.sqrt(np.diag(cov[sl, sl]))
    assert np.all(np.abs(est.coef_[4] - mean[sl]) < 5 * sd / np.sqrt(20000))
    np.testing.assert_allclose(est.coef_draws_[4].std(axis=0), sd, rtol=0.03)


@pytest.mark.parametrize("shape", [(1000, 30, 3), (4000, 2), (7,), (1001, 4)])
@pytest.mark.parametrize("level", [0.9, 0.95, 0.5, 0.99])
def test_credible_interval_ends_are_numpys_quantiles(shape, level):
    rng = np.random.default_rng(len(shape) + int(100 * level))
    draws = rng.standard_normal(shape) * 3.0 + 1.0
    a = 1.0 - level
    expected = np.stack(np.quantile(draws, [a / 2, 1 - a / 2], axis=0), axis=-1)
    np.testing.assert_array_equal(credible_interval(draws, level), expected)
    # the same for draws of each coefficient adjacent in memory (the fit's layout)
    strided = np.moveaxis(np.ascontiguousarray(np.moveaxis(draws, 0, -1)), -1, 0)
    np.testing.assert_array_equal(credible_interval(strided, level), expected)


def test_credible_interval_coverage_is_nominal_on_data_drawn_from_the_prior():
    rng = np.random.default_rng(3)
    tau, s2, d, K = np.array([0.3, 0.3]), 0.5, 2, 4
    hits, total = 0, 0
    for rep in range(50):
        mu = rng.standard_normal(d)  # prior N(0, I) of the model
        sites, thetas, _ = _conjugate_data(rng, K, d, tau, s2, n=6, mu=mu)
        est = FedHM2Regressor(fit_intercept=False, mu_scale=1.0, covariance="fixed", tau=tau, noise=s2, damping=1.0, n_rounds=2, tol=None, n_posterior_draws=2000, random_state=rep).fit(sites)
        ci = est.coef_interval(0.9)
        hits += int(np.sum((ci[..., 0] <= thetas) & (thetas <= ci[..., 1])))
        total += thetas.size
    rate = hits / total
    assert abs(rate - 0.9) < 3 * np.sqrt(0.9 * 0.1 / total), rate


def _radon_sites():
    with open(RADON, newline="") as fh:
        rows = list(csv.DictReader(fh))
    sites = []
    for c in dict.fromkeys(r["county"] for r in rows):
        part = [r for r in rows if r["county"] == c]
        X = np.array([[1.0, float(r["basement"]), float(r["uranium"])] for r in part])
        sites.append((X, np.array([float(r["log.radon"]) for r in part])))
    return sites


@pytest.mark.skipif(not RADON.exists(), reason="shared radon data not present")
def test_radon_fixed_effects_match_mixedlm_within_standard_errors():
    sites = _radon_sites()
    mixed = mixedlm_pooled(sites, random=[0])
    fe, se = mixed.fe, mixed.se
    np.testing.assert_allclose(fe, [1.466, -0.668, 0.72], atol=0.01)  # the reference fit in the data README
    est = FedHM2Regressor(fit_intercept=False, random=[True, False, False], noise="shared", mu_scale=10.0, damping=0.7, n_rounds=6, n_draws=1000, n_posterior_draws=200, random_state=0).fit(sites)
    assert np.all(np.abs(est.population_coef_ - fe) < se)  # the column of ones holds the intercept


def test_hm2_stops_where_more_rounds_would_not_move_the_global_posterior():
    # y = X beta + b_k + e with known parameters; the fit that stops by its rule is compared with the
    # same fit run for 20 rounds (no stopping), in posterior sds of q(phi), and with MixedLM on the pooled data
    rng = np.random.default_rng(3)
    sites = []
    for b_k in 0.5 * rng.standard_normal(30):
        X = np.column_stack([np.ones(40), rng.standard_normal((40, 2))])
        sites.append((X, X @ [1.0, 0.5, -0.3] + b_k + 0.7 * rng.standard_normal(40)))
    options = dict(fit_intercept=False, random=[True, False, False], noise="shared", mu_scale=10.0, damping=0.7,
                   n_rounds=20, n_posterior_draws=200, random_state=0)
    stopped = FedHM2Regressor(**options).fit(sites)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tol=None: no stopping rule to meet
        long = FedHM2Regressor(**{**options, "tol": None}).fit(sites)
    assert stopped.n_rounds_ < long.n_rounds_ == 20
    sd = np.sqrt(np.diag(long.phi_cov_))
    assert np.all(np.abs(stopped.phi_mean_ - long.phi_mean_) / sd < 0.05)  # tol: 0.05 posterior sds
    mixed = mixedlm_pooled(sites, random=[0])
    assert np.all(np.abs(stopped.population_coef_ - mixed.fe) < 0.2 * mixed.se)


def test_lasso_selects_the_true_support_and_ridge_runs():
    rng = np.random.default_rng(4)
    theta = np.array([2.0, 0.0, -1.5, 0.0])
    sites = []
    for _ in range(3):
        X = rng.standard_normal((60, 4))
        sites.append((X, X @ theta + 0.3 * rng.standard_normal(60)))
    lasso = FedHM2Regressor(prior="lasso", n_rounds=4, mcmc=dict(n_warmup=200, n_draws=300), n_posterior_draws=1000, random_state=0).fit(sites)
    cir, fir = inclusion_rates(lasso.selected_features_, theta)
    assert cir == 1.0 and fir <= 1 / 3  # each null coefficient is wrongly included with prob. about 0.1 or less
    ridge = FedHM2Regressor(prior="ridge", n_rounds=4, n_posterior_draws=1000, random_state=0).fit(sites)
    ols = np.linalg.lstsq(sites[0][0], sites[0][1], rcond=None)[0]
    np.testing.assert_allclose(ridge.coef_[0], ols, atol=0.1)
    reject, tail = ridge.coef_test(0.0, 0.9)
    np.testing.assert_array_equal(reject[0], theta != 0)
    assert np.all(tail[0][theta != 0] < 0.01)


def test_predict_save_load_and_errors(tmp_path):
    rng = np.random.default_rng(5)
    sites, _, _ = _conjugate_data(rng, 3, 2, np.array([0.5, 0.5]), 0.2)
    est = FedHM2Regressor(fit_intercept=False, mu_scale=1.0, covariance="fixed", tau=[0.5, 0.5], noise=0.2, n_rounds=2, tol=None, n_posterior_draws=500, random_state=0).fit(sites)
    np.testing.assert_allclose(est.predict(sites[1][0], site=1), sites[1][0] @ est.coef_[1])
    back = load(est.save(tmp_path / "hm2.npz"))
    np.testing.assert_allclose(back.coef_, est.coef_)
    np.testing.assert_allclose(back.phi_cov_, est.phi_cov_)
    np.testing.assert_allclose(back.coef_interval(0.8), est.coef_interval(0.8))
    hm1 = FedHM1Regressor(fit_intercept=False, n_rounds=3, eta=0.01, random_state=0).fit(sites)
    back1 = load(hm1.save(tmp_path / "hm1.npz"))
    np.testing.assert_allclose(back1.predict(sites[0][0], site=0), hm1.predict(sites[0][0], site=0))
    with pytest.raises(ValueError, match="site must be an integer"):
        est.predict(sites[0][0], site=3)
    with pytest.raises(ValueError, match="X has 3 features, but FedHM2Regressor is expecting 2 features"):
        est.predict(np.ones((2, 3)), site=0)
    with pytest.raises(ValueError, match="prior must be"):
        FedHM2Regressor(prior="horseshoe").fit(sites)
    with pytest.raises(ValueError, match="tilted_method must be one of"):
        FedHM2Regressor(tilted_method="laplace").fit(sites)
    with pytest.raises(ValueError, match="n_posterior_draws must be an integer >= 2"):
        FedHM2Regressor(n_posterior_draws=1).fit(sites)
    (tmp_path / "bad.npz").write_bytes(b"not a model")
    with pytest.raises(Exception):
        load(tmp_path / "bad.npz")
    for unfitted in (FedHM1Regressor(), FedHM2Regressor()):
        with pytest.raises(ValueError, match=f"this {type(unfitted).__name__} is not fitted yet"):
            unfitted.predict(sites[0][0], site=0)
    with pytest.raises(ValueError, match=r"value must be a number or one per feature \(2,\), got shape \(3,\)"):
        est.coef_test(np.zeros(3))
    # hyper-parameters given as numpy scalars are saved as the numbers they hold
    numpy_params = FedHM2Regressor(n_rounds=np.int64(2), random_state=np.int64(0), n_posterior_draws=np.int64(50)).fit(sites)
    assert load(numpy_params.save(tmp_path / "np.npz")).n_rounds == 2


def test_ditto_closed_form_is_the_minimiser():
    rng = np.random.default_rng(6)
    X, y, g = rng.standard_normal((20, 3)), rng.standard_normal(20), rng.standard_normal(3)
    v = ditto_personalise(X, y, g, lam=0.7)
    grad = -2 * X.T @ (y - X @ v) / 20 + 0.7 * (v - g)
    np.testing.assert_allclose(grad, 0, atol=1e-10)


def test_metrics():
    assert np.isclose(a_rmse([np.zeros(2), np.ones(3)], [np.ones(2), np.ones(3)]), 0.5)
    sel = np.array([[True, True, False], [True, False, False]])
    assert inclusion_rates(sel, np.array([1.0, 0.0, 0.0])) == (1.0, 0.25)


def test_quick_heart_experiment_writes_csv_markdown_and_command(tmp_path):
    from fedhier.experiments.fedlin import EXPERIMENTS

    assert set(EXPERIMENTS) == {"fedlin-sim-hm1", "fedlin-sim-hm2", "fedlin-uq", "fedlin-student", "fedlin-cmapss", "fedlin-heart", "fedlin-radon"}
    EXPERIMENTS["fedlin-heart"](tmp_path, quick=True, seed=1)
    text = (tmp_path / "fedlin-heart.md").read_text()
    assert "`fedhier experiment fedlin-heart --quick --seed 1`" in text
    with open(tmp_path / "fedlin-heart-summary.csv", newline="") as fh:
        summary = {r["method"]: float(r["a_rmse"]) for r in csv.DictReader(fh)}
    assert set(summary) >= {"HM2 (EP)", "HM1", "Separate OLS", "Centralised OLS"}
    assert all(np.isfinite(v) and v > 0 for v in summary.values())


def test_cli_fit_linear_writes_coefficients_and_a_loadable_model(tmp_path):
    import argparse

    from fedhier.cli.linear import add_fit_linear_arguments, cli_fit_linear

    rng = np.random.default_rng(7)
    lines = ["site,x,y"]
    for s in ("a", "b", "c"):
        for _ in range(15):
            x = rng.standard_normal()
            lines.append(f"{s},{x},{1.0 + 2.0 * x + 0.1 * rng.standard_normal()}")
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    parser = argparse.ArgumentParser()
    add_fit_linear_arguments(parser)
    args = parser.parse_args([str(tmp_path / "d.csv"), "--site", "site", "--target", "y", "--features", "x", "--intercept", "--rounds", "3", "--out", str(tmp_path / "out")])
    assert cli_fit_linear(args) == 0
    with open(tmp_path / "out" / "coefficients.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["site"], r["feature"]) for r in rows[:2]] == [("a", "(intercept)"), ("a", "x")]
    slope = [float(r["estimate"]) for r in rows if r["feature"] == "x"]
    np.testing.assert_allclose(slope, 2.0, atol=0.15)
    assert load(tmp_path / "out" / "model.npz").coef_.shape == (3, 2)
    bad = parser.parse_args([str(tmp_path / "d.csv"), "--site", "site", "--target", "nope", "--features", "x", "--out", str(tmp_path / "o2")])
    with pytest.raises(ValueError, match="not found"):
        cli_fit_linear(bad)
    # the form the CLI uses: the arguments after `fit linear`; bad input gives exit status 2
    argv = [str(tmp_path / "d.csv"), "--site", "site", "--target", "y", "--features", "x", "--prior", "ridge", "--rounds", "2", "--out", str(tmp_path / "o3")]
    assert cli_fit_linear(argv) == 0 and (tmp_path / "o3" / "phi.csv").exists()
    assert cli_fit_linear(argv[:4] + ["nope"] + argv[5:]) == 2


def test_hm2_warns_where_a_response_far_beyond_unit_scale_makes_the_fit_shrink_to_zero(example):
    sites, truth = example("fedlin_scale").make_sites(1000.0)
    with pytest.warns(FedLinWarning, match=r"site \d: y has standard deviation .* beyond 90") as caught:
        far = FedHM2Regressor(fit_intercept=False, mu_scale=1.0, scale="none", n_posterior_draws=500, random_state=0).fit(sites)
    assert sorted(int(str(w.message).split(":")[0].split()[1]) for w in caught if "standard deviation" in str(w.message)) == list(range(6))  # every site
    least_squares = np.array([np.linalg.lstsq(X, y, rcond=None)[0] for X, y in sites])
    assert np.sqrt(np.mean((least_squares - truth) ** 2)) / 1000 < 0.15
    assert np.sqrt(np.mean((far.coef_ - truth) ** 2)) / 1000 > 0.5  # the failure the warning names
    unit_sites = [(X, y / 1000.0) for X, y in sites]  # the remedy: divide y by a constant
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedLinWarning)
        unit = FedHM2Regressor(fit_intercept=False, mu_scale=1.0, scale="none", n_posterior_draws=500, random_state=0).fit(unit_sites)
    assert np.sqrt(np.mean((unit.coef_ * 1000.0 - truth) ** 2)) / 1000 < 0.15
    # the default scales every column by its sd across the sites: no warning, and the coefficients in y's units
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedLinWarning)
        scaled = FedHM2Regressor(fit_intercept=False, mu_scale=1.0, n_posterior_draws=500, random_state=0).fit(sites)
    assert np.sqrt(np.mean((scaled.coef_ - truth) ** 2)) / 1000 < 0.15
