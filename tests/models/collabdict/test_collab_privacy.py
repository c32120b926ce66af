"""Rényi-DP release of the pattern means (spec §10) and the l-diversity monitor (spec §11)."""

import numpy as np
import pytest
from scipy.optimize import brentq, minimize_scalar
from scipy.stats import entropy, multivariate_normal

from fedhier.models.collabdict.diversity import (diversity_level, mitigation_noise, paper_sample_weights_entropy,
                                                 sample_weights_entropy)
from fedhier.models.collabdict.ggm import solve_precision
from fedhier.models.collabdict.rdp import (dp_event, epsilon_dp, optimal_order, paper_epsilon, precision_norm_bound,
                                           release_pattern_means, tight_epsilon)


def _sigmas(rng, k=3, m=4):
    out = []
    for _ in range(k):
        z = rng.normal(size=(60, m)) @ rng.normal(size=(m, m)) * 0.5
        out.append(np.cov(z.T, bias=True))
    return np.stack(out)


def test_precision_bound_is_the_largest_root_of_g():
    rng = np.random.default_rng(0)
    sigma, n_bar = _sigmas(rng), np.array([40.0, 25.0, 60.0])
    rho, n_min, S, nmax = 0.8, 10.0, 5, 30
    got = precision_norm_bound(sigma, n_bar, rho=rho, n_min=n_min, n_sites=S, max_site_size=nmax)
    M = 4
    b, c = M * (1 + 1 / n_min), rho / (S * nmax)
    roots = []
    for sig, nk in zip(sigma, n_bar):
        F = np.trace(sig) + rho * M / nk
        h = np.abs(sig - np.eye(M)).max()
        coef = 1 + h / c
        g = lambda t: t - coef * b * np.log(t) - coef * F  # noqa: E731
        t0 = coef * b
        roots.append(1.0 if g(t0) > 0 else brentq(g, t0, 1e12))
    assert got == pytest.approx(max(1.0, max(roots)), rel=1e-9)


def test_precision_bound_holds_for_the_fitted_precisions():
    rng = np.random.default_rng(1)
    sigma, n_bar = _sigmas(rng), np.array([30.0, 30.0, 30.0])
    rho = 0.5
    B = precision_norm_bound(sigma, n_bar, rho=rho, n_min=10.0, n_sites=3, max_site_size=30)
    for sig, nk in zip(sigma, n_bar):
        assert np.linalg.norm(solve_precision(sig, nk, rho), 2) <= B


def test_epsilon_formulas_and_conversion():
    B, R, lam0, nmin, K = 12.0, 3.0, 2.0, 5.0, 4
    assert paper_epsilon(K, B, R, lam0) == pytest.approx(K * B * R**2 / (2 * lam0))
    eps1 = tight_epsilon(B, R, lam0, nmin)
    assert eps1 == pytest.approx(B * R**2 / (2 * (lam0 + nmin)))
    delta = 1e-5
    direct = minimize_scalar(lambda a: a * eps1 + np.log(1 / delta) / (a - 1), bounds=(1 + 1e-9, 1e4),
                             method="bounded", options={"xatol": 1e-12})
    assert epsilon_dp(eps1, delta) == pytest.approx(direct.fun, rel=1e-7)
    assert optimal_order(eps1, delta) == pytest.approx(direct.x, rel=1e-4)
    assert epsilon_dp(eps1, delta, n_releases=3) == pytest.approx(epsilon_dp(3 * eps1, delta))
    with pytest.raises(ValueError, match="lambda0"):
        paper_epsilon(K, B, R, 0.0)


def test_dp_event_has_the_release_rdp_curve():
    import dp_accounting

    eps1 = 0.7
    orders = [1.5, 2.0, 8.0, 32.0]
    acc = dp_accounting.rdp.RdpAccountant(orders)
    acc.compose(dp_event(eps1, n_releases=2))
    # (alpha, alpha * T_r * eps1)-RDP for every order, as §10.5 states
    assert np.allclose(acc._rdp, [a * 2 * eps1 for a in orders])


def test_posterior_draw_has_posterior_covariance():
    rng = np.random.default_rng(2)
    prec = np.array([[2.0, 0.6], [0.6, 1.0]])[None]
    w = np.array([[1.0, -1.0]])
    n_bar, lam0 = np.array([9.0]), 1.0
    draws = np.stack([release_pattern_means(w, prec, n_bar, lambda0=lam0, rng=rng)[0] for _ in range(20000)])
    assert np.allclose(draws.mean(axis=0), w[0], atol=0.01)
    assert np.allclose(np.cov(draws.T), np.linalg.inv(10.0 * prec[0]), atol=0.003)


def test_entropy_of_recommended_weights_matches_scipy():
    rng = np.random.default_rng(3)
    r = rng.dirichlet(np.ones(3), size=50)
    got = sample_weights_entropy(r)
    assert np.allclose(got, [entropy(r[:, k] / r[:, k].sum()) for k in range(3)])
    concentrated = np.zeros((50, 2))
    concentrated[:, 0] = 1.0
    concentrated[0] = [0.0, 1.0]  # component 1 rests on a single sample
    h = sample_weights_entropy(concentrated)
    assert h[0] == pytest.approx(np.log(49)) and h[1] == pytest.approx(0.0)
    assert diversity_level(h, rule="min") == pytest.approx(0.0)  # [R] min flags the breach
    assert diversity_level(h, rule="max") == pytest.approx(np.log(49))  # [P] max misses it


def test_paper_weights_entropy_eq47():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(30, 2))
    mu = np.array([[0.0, 0.0], [3.0, 3.0]])
    prec = np.tile(np.eye(2), (2, 1, 1))
    for k in range(2):
        p = multivariate_normal(mu[k], np.eye(2)).pdf(X)
        assert paper_sample_weights_entropy(X, mu, prec)[k] == pytest.approx(entropy(p / p.sum()))


def test_mitigation_noise_covariance():
    rng = np.random.default_rng(5)
    prec = np.array([[[1.5, 0.4], [0.4, 0.8]]])
    draws = np.stack([mitigation_noise(prec, np.array([4.0]), 1.0, rng)[0] for _ in range(20000)])
    assert np.allclose(np.cov(draws.T), 5.0 * np.linalg.inv(prec[0]), rtol=0.05, atol=0.05)
