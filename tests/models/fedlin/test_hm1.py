"""HM1 math (spec §2) against closed forms and brute force."""

import numpy as np
import pytest

from fedhier.estimators.fedlin import FedHM1Regressor
from fedhier.models.fedlin.hm1 import (check_step_size, hm1_objective, local_steps, prior_shrinkage, shrinkage_message,
                                       update_omega)


def _sites(rng, K=3, d=2, n=20):
    return [(rng.standard_normal((n, d)), rng.standard_normal(n)) for _ in range(K)]


def test_local_steps_full_batch_matches_explicit_sum_and_mean_gradients():
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((15, 3)), rng.standard_normal(15)
    u = np.zeros(3)
    for _ in range(4):
        u = u + 2 * 0.01 * sum(X[i] * (y[i] - X[i] @ u) for i in range(15))
    np.testing.assert_allclose(local_steps(X, y, np.zeros(3), eta=0.01, n_steps=4), u)
    v = np.zeros(3)
    for _ in range(4):
        v = v + 2 * 0.1 * X.T @ (y - X @ v) / 15
    np.testing.assert_allclose(local_steps(X, y, np.zeros(3), eta=0.1, n_steps=4, gradient="mean"), v)


def test_local_steps_minibatch_uses_the_drawn_rows():
    X, y = np.eye(4), np.arange(1.0, 5.0)
    u = local_steps(X, y, np.zeros(4), eta=0.25, n_steps=1, batch_size=1, rng=np.random.default_rng(3))
    i = np.argmin(np.random.default_rng(3).random(4))  # the sampler's first index
    expected = np.zeros(4)
    expected[i] = 2 * 0.25 * y[i]
    np.testing.assert_allclose(u, expected)
    with pytest.raises(ValueError, match="random generator"):
        local_steps(X, y, np.zeros(4), eta=0.1, n_steps=1, batch_size=2)


def test_shrinkage_message_and_omega_updates():
    rng = np.random.default_rng(1)
    theta = rng.standard_normal((4, 3))
    A = rng.standard_normal((3, 3))
    omega = A @ A.T + np.eye(3)
    np.testing.assert_allclose(shrinkage_message(theta, omega), theta @ np.linalg.inv(omega), atol=1e-12)
    np.testing.assert_allclose(update_omega(omega, theta, alpha=0.1), 0.9 * omega + 0.1 / 4 * theta.T @ theta)
    np.testing.assert_allclose(update_omega(omega, theta, alpha=0.8, rule="rcode"), 0.8 * omega + 0.8 / 3 * theta.T @ theta)
    np.testing.assert_allclose(prior_shrinkage(np.ones(4), theta[:, 0], eta=0.5, shrink_scale=2.0), 1 - 2 * theta[:, 0])
    with pytest.raises(ValueError, match="not positive definite"):
        shrinkage_message(theta, -np.eye(3))


def test_hm1_fixed_omega_converges_to_closed_form_map():
    """T=1, oracle Omega: the fixed point of Algorithm 1 is the MAP of L with sigma_k^2 = 1 (spec §2.1-2.4)."""
    rng = np.random.default_rng(2)
    K, d = 3, 2
    sites = _sites(rng, K, d)
    B = rng.standard_normal((K, K))
    omega = B @ B.T / K + 0.5 * np.eye(K)
    # closed form: (blockdiag(X_k^T X_k) + Omega^{-1} kron I_d) vec(Theta) = vec(X_k^T y_k)
    A = np.kron(np.linalg.inv(omega), np.eye(d))
    rhs = np.zeros(K * d)
    for k, (X, y) in enumerate(sites):
        A[k * d : (k + 1) * d, k * d : (k + 1) * d] += X.T @ X
        rhs[k * d : (k + 1) * d] = X.T @ y
    theta_map = np.linalg.solve(A, rhs).reshape(K, d)
    est = FedHM1Regressor(fit_intercept=False, n_rounds=400, n_local_steps=1, eta=0.005, oracle_omega=omega, random_state=0).fit(sites)
    np.testing.assert_allclose(est.coef_, theta_map, atol=1e-6)
    # and the objective there is below that of nearby points
    base = hm1_objective(sites, theta_map.T, omega)
    assert base < hm1_objective(sites, theta_map.T + 1e-3 * rng.standard_normal((d, K)), omega)


def test_hm1_partial_participation_keeps_absent_columns():
    rng = np.random.default_rng(4)
    sites = _sites(rng, K=5, d=2)
    est = FedHM1Regressor(fit_intercept=False, n_rounds=1, n_local_steps=3, eta=0.01, participation=0.4, random_state=7).fit(sites)
    took_part = est.history_[0]["sites"]
    assert len(took_part) == 2
    for k in range(5):
        moved = np.any(est.coef_[k] != 0)
        assert moved == (k in took_part)


def test_hm1_rejects_bad_sites():
    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((10, 2)), rng.standard_normal(10)
    with pytest.raises(ValueError, match="site 1"):
        FedHM1Regressor(n_rounds=1).fit([(X, y), (X[:, :1], y)])
    with pytest.raises(ValueError, match="site 0: X has 10 rows but y has 9"):
        FedHM1Regressor(n_rounds=1).fit([(X, y[:9]), (X, y)])


@pytest.mark.parametrize("gradient", ["sum", "mean"])
def test_step_size_check_refuses_exactly_the_diverging_full_batch_steps(gradient):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((30, 3)) * np.array([4.0, 1.0, 0.5])
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.standard_normal(30)
    ols = np.linalg.lstsq(X, y, rcond=None)[0]
    bound = 1.0 / (np.linalg.svd(X, compute_uv=False)[0] ** 2 / (30 if gradient == "mean" else 1))
    below, above = 0.98 * bound, 1.02 * bound
    check_step_size(X, eta=below, gradient=gradient)
    u = local_steps(X, y, np.zeros(3), eta=below, n_steps=3000, gradient=gradient)
    assert np.allclose(u, ols, atol=1e-6)  # below the bound the steps reach least squares
    with pytest.raises(ValueError, match=f"site 4: eta=.* needs eta < {bound:.3g}"):
        check_step_size(X, eta=above, gradient=gradient, site=4)
    u = local_steps(X, y, np.zeros(3), eta=above, n_steps=300, gradient=gradient)
    assert np.linalg.norm(u - ols) > 1e3  # above it they diverge, as the check says
    check_step_size(X, eta=above, gradient=gradient, batch_size=10)  # mini-batches are not checked


def test_hm1_refuses_a_diverging_step_size_before_any_round():
    rng = np.random.default_rng(0)
    sites = [(10.0 * rng.standard_normal((100, 4)), rng.standard_normal(100)) for _ in range(3)]
    with pytest.raises(ValueError, match="site 0: eta=0.0001 makes the full-batch local steps diverge"):
        FedHM1Regressor(eta=1e-4).fit(sites)
    standardised = [(X / 10.0, y) for X, y in sites]
    assert np.all(np.isfinite(FedHM1Regressor(eta=1e-4).fit(standardised).coef_))
