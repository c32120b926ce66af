"""GGM mixture local/global updates (spec §5) against independent computations."""

import itertools

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from fedhier.models.collabdict.ggm import (global_update, l0_weights, local_update, log_gaussian, mean_update,
                                           pack_symmetric, responsibilities, scatter_matrix, solve_precision,
                                           sufficient_statistics, unpack_symmetric)


def _random_precision(rng, m):
    a = rng.normal(size=(m, m))
    return a @ a.T + m * np.eye(m)


def test_log_gaussian_matches_scipy():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 4))
    mu = rng.normal(size=(3, 4))
    prec = np.stack([_random_precision(rng, 4) for _ in range(3)])
    got = log_gaussian(X, mu, prec)
    for k in range(3):
        assert np.allclose(got[:, k], multivariate_normal(mu[k], np.linalg.inv(prec[k])).logpdf(X))


def test_responsibilities_eq12_and_pruned_components():
    rng = np.random.default_rng(1)
    log_dens = rng.normal(size=(10, 4)) * 3
    w = np.array([0.1, 0.2, 0.3, 0.4])
    active = np.array([True, False, True, True])
    r = responsibilities(log_dens, w, active)
    num = np.exp(log_dens) * w * active
    assert np.allclose(r, num / num.sum(axis=1, keepdims=True))
    assert np.all(r[:, 1] == 0)


def test_sufficient_statistics_eq13_by_loops():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(7, 3))
    r = rng.dirichlet(np.ones(2), size=7)
    n, m, c = sufficient_statistics(X, r)
    for k in range(2):
        assert n[k] == pytest.approx(sum(r[i, k] for i in range(7)))
        assert np.allclose(m[k], sum(r[i, k] * X[i] for i in range(7)))
        assert np.allclose(c[k], sum(r[i, k] * np.outer(X[i], X[i]) for i in range(7)))


def test_local_update_weights_are_normalised_counts():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 2))
    mu = rng.normal(size=(3, 2))
    prec = np.tile(np.eye(2), (3, 1, 1))
    resp, w, (n, m, c) = local_update(X, mu, prec, np.full(3, 1 / 3), np.ones(3, bool))
    assert np.allclose(w, n / 30) and w.sum() == pytest.approx(1.0)


def test_scatter_matrix_is_the_profiled_map_scatter():
    # Sigma_k of §5.4 equals (1/Nbar)[sum r (x-mu)(x-mu)^T + lambda0 (mu-m0)(mu-m0)^T] at mu = Eq. (15)
    rng = np.random.default_rng(4)
    X = rng.normal(size=(50, 3)) + 1.0
    r = rng.dirichlet(np.ones(2), size=50)
    lambda0, m0 = 2.5, np.array([0.3, -0.2, 0.1])
    n, m, c = sufficient_statistics(X, r)
    m_bar, c_bar = m / n[:, None], c / n[:, None, None]
    mu = mean_update(n, m_bar, lambda0, m0)
    sigma = scatter_matrix(n, m_bar, c_bar, lambda0, m0)
    for k in range(2):
        d = X - mu[k]
        brute = (np.einsum("n,ni,nj->ij", r[:, k], d, d) + lambda0 * np.outer(mu[k] - m0, mu[k] - m0)) / n[k]
        assert np.allclose(sigma[k], brute)
        assert np.allclose(mu[k], (lambda0 * m0 + (r[:, k:k + 1] * X).sum(0)) / (lambda0 + n[k]))


@pytest.mark.parametrize("rho", [0.3, 2.0, 8.0])
def test_glasso_step_satisfies_kkt_of_eq16_with_penalised_diagonal(rho):
    rng = np.random.default_rng(5)
    Z = rng.normal(size=(40, 5)) @ rng.normal(size=(5, 5))
    sigma = np.cov(Z.T, bias=True)
    n_bar = 40.0
    lam = solve_precision(sigma, n_bar, rho, tol=1e-10, max_iter=300)
    b, pen = (n_bar + 1) / n_bar, rho / n_bar
    grad = b * np.linalg.inv(lam) - sigma  # stationarity: grad = pen * subgradient of ||Lambda||_1
    nz = np.abs(lam) > 1e-10
    assert np.allclose(grad[nz], pen * np.sign(lam[nz]), atol=5e-5)
    assert np.all(np.abs(grad[~nz]) <= pen + 5e-5)
    assert np.all(np.diag(grad) == pytest.approx(pen, abs=5e-5))  # the diagonal is penalised (O19)


def test_glasso_without_penalty_is_scaled_inverse():
    rng = np.random.default_rng(6)
    sigma = np.cov(rng.normal(size=(30, 3)).T)
    assert np.allclose(solve_precision(sigma, 30.0, 0.0), (31 / 30) * np.linalg.inv(sigma))


def test_global_update_keeps_inactive_placeholders():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(60, 3))
    r = rng.dirichlet(np.ones(3), size=60)
    n, m, c = sufficient_statistics(X, r)
    active = np.array([True, False, True])
    mu, prec, sigma = global_update(n, m / n[:, None], c / n[:, None, None], rho=0.5, lambda0=1.0, m0=np.zeros(3),
                                   active=active)
    assert np.all(mu[1] == 0) and np.array_equal(prec[1], np.eye(3))
    assert np.all(np.linalg.eigvalsh(prec[0]) > 0)


def test_pack_unpack_roundtrip():
    rng = np.random.default_rng(8)
    a = rng.normal(size=(2, 4, 4))
    a = a + np.swapaxes(a, 1, 2)
    packed = pack_symmetric(a)
    assert packed.shape == (2, 10)
    assert np.array_equal(unpack_symmetric(packed, 4), a)


def test_l0_weights_match_exhaustive_enumeration():
    rng = np.random.default_rng(9)
    K, floor, tau = 5, 1 / 500, 3.0
    for _ in range(20):
        counts = rng.gamma(0.5, 20, size=K)
        best, best_val = None, -np.inf
        for j in range(1, K + 1):
            for T in itertools.combinations(range(K), j):
                T = list(T)
                pi = np.full(K, floor)
                pi[T] = (1 - (K - j) * floor) * counts[T] / counts[T].sum()
                if np.any(pi[T] < floor):
                    continue
                val = np.sum(counts * np.log(pi)) - tau * j
                if val > best_val:
                    best, best_val = pi, val
        assert np.allclose(l0_weights(counts, tau, floor), best)


def test_admm_fallback_solves_the_same_problem_as_sklearn():
    from sklearn.covariance import graphical_lasso

    from fedhier.models.collabdict.ggm import glasso_admm

    rng = np.random.default_rng(10)
    s = np.cov((rng.normal(size=(50, 6)) @ rng.normal(size=(6, 6))).T)
    alpha = 0.2
    _, ref = graphical_lasso(s + alpha * np.eye(6), alpha, tol=1e-12, enet_tol=1e-12, max_iter=5000)
    assert np.allclose(glasso_admm(s, alpha, tol=1e-11, max_iter=50000), ref, atol=1e-7)
