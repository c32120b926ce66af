"""HM2 math (spec §3): site factors, tilted moments and EP updates against brute force."""

import numpy as np
import pytest
from scipy import stats as sps
from scipy.special import logsumexp

from fedhier.models.fedlin.ep import converged, damped_update, site_update
from fedhier.models.fedlin.hierarchy import BayesianRidge, GaussianHierarchy
from fedhier.models.fedlin.lasso import BayesianLasso, split_rhat
from fedhier.models.fedlin.natural import to_moments, unbiased_precision
from fedhier.models.fedlin.stats import SiteStats
from fedhier.models.fedlin.tilted import TiltedFailure, device_posterior, reweight, tilted_moments


def _data(rng, n, theta, noise_sd):
    X = rng.standard_normal((n, len(theta)))
    return X, X @ theta + noise_sd * rng.standard_normal(n)


def test_log_lik_matches_multivariate_normal_on_raw_data():
    rng = np.random.default_rng(0)
    X, y = _data(rng, 12, np.array([1.0, -0.5, 2.0]), 0.3)
    model = GaussianHierarchy(3, random=[True, False, True], noise="shared")
    phi = np.array([[0.2, -0.1, 0.4, np.log(0.5), np.log(2.0), np.log(0.2)]])
    mu, tau = phi[0, :3], np.exp(phi[0, 3:5])
    Xr = X[:, [0, 2]]
    cov = Xr @ np.diag(tau) @ Xr.T + 0.2 * np.eye(12)
    expected = sps.multivariate_normal(X @ mu, cov).logpdf(y)
    got = model.log_lik(SiteStats.from_data(X, y), phi, np.zeros((1, 0)))
    np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_log_lik_of_a_random_intercept_matches_multivariate_normal_at_many_points():
    # one random coordinate takes the scalar path of log_marginal; many points at once
    rng = np.random.default_rng(3)
    X, y = _data(rng, 9, np.array([0.5, 1.0, -1.0]), 0.4)
    model = GaussianHierarchy(3, random=[True, False, False], noise="shared")
    phi = np.column_stack([rng.normal(size=(20, 3)), rng.normal(-1.0, 0.5, size=20), rng.normal(-1.0, 0.5, size=20)])
    got = model.log_lik(SiteStats.from_data(X, y), phi, np.zeros((20, 0)))
    for i, row in enumerate(phi):
        cov = np.exp(row[3]) * np.outer(X[:, 0], X[:, 0]) + np.exp(row[4]) * np.eye(9)
        assert got[i] == pytest.approx(sps.multivariate_normal(X @ row[:3], cov).logpdf(y), rel=1e-10)


@pytest.mark.parametrize("random", [[True, True], [True, False], [False, True]])
def test_conditional_theta_matches_gaussian_conditioning(random):
    rng = np.random.default_rng(1)
    X, y = _data(rng, 10, np.array([1.0, 2.0]), 0.5)
    tau = np.array([0.7, 1.3])[random]
    model = GaussianHierarchy(2, covariance="fixed", random=random, tau=tau, noise=0.25)
    mu = np.array([0.3, -0.2])
    mean, cov = model.theta_conditional(SiteStats.from_data(X, y), mu[None], np.zeros((1, 0)))
    # joint (theta, y): theta ~ N(mu, D) (variance 0 on a coordinate that does not vary), y = X theta + e
    D = np.diag(np.where(random, [0.7, 1.3], 0.0))
    S_ty = D @ X.T
    S_yy = X @ D @ X.T + 0.25 * np.eye(10)
    np.testing.assert_allclose(mean[0], mu + S_ty @ np.linalg.solve(S_yy, y - X @ mu), atol=1e-10)
    np.testing.assert_allclose(cov[0], D - S_ty @ np.linalg.solve(S_yy, S_ty.T), atol=1e-10)


def _grid_moments(logp, axes):
    mesh = np.meshgrid(*axes, indexing="ij")
    pts = np.stack([m.ravel() for m in mesh], axis=1)
    lw = logp(pts)
    w = np.exp(lw - logsumexp(lw))
    mean = w @ pts
    c = pts - mean
    return mean, (c * w[:, None]).T @ c


def test_ridge_tilted_quadrature_matches_brute_force_grid():
    rng = np.random.default_rng(2)
    X, y = _data(rng, 15, np.array([0.8, -0.4]), 0.4)
    stats = SiteStats.from_data(X, y)
    model = BayesianRidge(2)
    cav_mean, cav_cov = np.array([0.2, -1.0]), np.array([[0.6, 0.1], [0.1, 0.5]])
    Q = np.linalg.inv(cav_cov)
    res = tilted_moments(model, stats, Q @ cav_mean, Q, rng, method="quadrature", n_nodes=14)

    # independent: y ~ N(0, s2 (X X^T / lam + I)) on the raw data, in the eigenbasis of X X^T
    e, U = np.linalg.eigh(X @ X.T)
    z2 = (U.T @ y) ** 2
    ll0, ls20 = 0.3, -1.2
    check = sps.multivariate_normal(np.zeros(15), np.exp(ls20) * (X @ X.T / np.exp(ll0) + np.eye(15))).logpdf(y)

    def logp(pts):
        ll, ls2 = pts[:, :1], pts[:, 1:]
        v = np.exp(ls2) * (e / np.exp(ll) + 1.0)
        return sps.multivariate_normal(cav_mean, cav_cov).logpdf(pts) - 0.5 * (np.log(2 * np.pi * v) + z2 / v).sum(1)

    assert np.isclose(logp(np.array([[ll0, ls20]]))[0] - sps.multivariate_normal(cav_mean, cav_cov).logpdf([ll0, ls20]), check)

    mean, cov = _grid_moments(logp, [np.linspace(-4, 5, 120), np.linspace(-4.5, 1.0, 120)])
    np.testing.assert_allclose(res.mean, mean, atol=2e-3)
    np.testing.assert_allclose(res.cov, cov, atol=2e-3)


def test_local_noise_importance_sampling_matches_brute_force_grid():
    """Diagonal instance, d=1: phi = (mu, log tau), local log sigma_k integrated inside the site."""
    rng = np.random.default_rng(3)
    X, y = _data(rng, 25, np.array([1.5]), 0.6)
    stats = SiteStats.from_data(X, y)
    model = GaussianHierarchy(1, covariance="diagonal", noise="local")
    cav_mean, cav_cov = np.array([0.5, 0.0]), np.diag([1.0, 1.0])
    res = tilted_moments(model, stats, cav_mean, np.eye(2), rng, method="importance", n_draws=20000)
    assert res.diagnostics["ess"] > 5000

    x = X[:, 0]

    def logp(pts):
        mu, ltau, lsig = pts.T
        out = sps.norm(0.5, 1).logpdf(mu) + sps.norm(0, 1).logpdf(ltau) + sps.norm(0, 1.5).logpdf(lsig)
        # y ~ N(x mu, tau x x^T + s2 I), by Sherman-Morrison on the raw vectors
        tau, s2 = np.exp(ltau), np.exp(2 * lsig)
        res = y[None, :] - mu[:, None] * x[None, :]
        c = 1 + tau * (x @ x) / s2
        quad = (res**2).sum(1) / s2 - tau * (res @ x) ** 2 / (s2**2 * c)
        return out - 0.5 * (25 * np.log(2 * np.pi * s2) + np.log(c) + quad)

    # moments of the (mu, log tau) marginal from a 3-D grid
    axes = [np.linspace(-4.0, 6.0, 150), np.linspace(-7, 4, 120), np.linspace(-1.5, 0.3, 80)]
    mesh = np.meshgrid(*axes, indexing="ij")
    pts = np.stack([m.ravel() for m in mesh], axis=1)
    lw = logp(pts)
    w = np.exp(lw - logsumexp(lw))
    mean = w @ pts[:, :2]
    c = pts[:, :2] - mean
    cov = (c * w[:, None]).T @ c
    np.testing.assert_allclose(res.mean, mean, atol=0.03)
    np.testing.assert_allclose(res.cov, cov, atol=0.03, rtol=0.1)


def test_lasso_mcmc_tilted_matches_brute_force_grid():
    rng = np.random.default_rng(4)
    X, y = _data(rng, 20, np.array([0.7]), 0.5)
    stats = SiteStats.from_data(X, y)
    cav_mean, cav_cov = np.array([0.0, -1.0]), np.diag([1.0, 0.5])
    Q = np.linalg.inv(cav_cov)
    res = tilted_moments(BayesianLasso(1), stats, Q @ cav_mean, Q, rng, method="mcmc", mcmc=dict(n_chains=4, n_warmup=500, n_draws=2000))
    assert res.diagnostics["rhat"] < 1.05

    def logp(pts):
        ll, ls2, th = pts.T
        s = np.exp(0.5 * ls2)
        lam = np.exp(ll)
        out = sps.multivariate_normal(cav_mean, cav_cov).logpdf(pts[:, :2])
        out += sps.laplace(0, s / lam).logpdf(th)
        out += -0.5 * 20 * ls2 - ((y[:, None] - X[:, :1] * th) ** 2).sum(0) / (2 * s**2)
        return out

    axes = [np.linspace(-4, 3, 60), np.linspace(-3, 0.5, 60), np.linspace(-0.2, 1.6, 60)]
    mesh = np.meshgrid(*axes, indexing="ij")
    pts = np.stack([m.ravel() for m in mesh], axis=1)
    lw = logp(pts)
    w = np.exp(lw - logsumexp(lw))
    mean = w @ pts
    sd = np.sqrt(w @ (pts - mean) ** 2)
    # Monte-Carlo tolerance: a few effective-sample standard errors
    assert np.all(np.abs(res.mean - mean[:2]) < 4 * sd[:2] / np.sqrt(800))
    np.testing.assert_allclose(np.sqrt(np.diag(res.cov)), sd[:2], rtol=0.1)
    post = device_posterior(BayesianLasso(1), stats, res, rng)
    assert abs(post.mean[0] - mean[2]) < 4 * sd[2] / np.sqrt(800)


def test_conjugate_site_update_is_exact_and_device_posterior_moments_exact():
    rng = np.random.default_rng(5)
    X, y = _data(rng, 8, np.array([1.0, -1.0]), 0.3)
    stats = SiteStats.from_data(X, y)
    model = GaussianHierarchy(2, covariance="fixed", tau=[0.5, 0.2], noise=0.09)
    r, Q = np.array([0.1, 0.2]), np.diag([2.0, 3.0])
    upd = site_update(model, stats, r, Q, np.zeros(2), np.zeros((2, 2)), rng)
    # exact: f_k(mu) = N(y; X mu, X D X^T + s2 I)  ->  natural parameters X^T V^-1 X, X^T V^-1 y
    V = X @ np.diag([0.5, 0.2]) @ X.T + 0.09 * np.eye(8)
    np.testing.assert_allclose(upd.dQ, X.T @ np.linalg.solve(V, X), atol=1e-9)
    np.testing.assert_allclose(upd.dr, X.T @ np.linalg.solve(V, y), atol=1e-9)
    # device posterior: mu ~ tilted, theta | mu Gaussian; joint Gaussian brute force
    m_t, S_t = to_moments(r + upd.dr, Q + upd.dQ)
    post = device_posterior(model, stats, upd.tilted, rng, n_draws=10)
    D = np.diag([0.5, 0.2])
    # prior on (mu, theta): mu ~ N(Q^-1 r, Q^-1), theta = mu + b; condition on y = X theta + e
    m_mu, S_mu = to_moments(r, Q)
    S_th = S_mu + D
    S_ty = S_th @ X.T
    S_yy = X @ S_th @ X.T + 0.09 * np.eye(8)
    exact_mean = m_mu + S_ty @ np.linalg.solve(S_yy, y - X @ m_mu)
    exact_cov = S_th - S_ty @ np.linalg.solve(S_yy, S_ty.T)
    np.testing.assert_allclose(post.mean, exact_mean, atol=1e-9)
    np.testing.assert_allclose(post.cov, exact_cov, atol=1e-9)


def test_cavity_not_positive_definite_skips_the_site():
    rng = np.random.default_rng(6)
    X, y = _data(rng, 8, np.array([1.0]), 0.3)
    model = GaussianHierarchy(1, covariance="fixed", tau=[0.5], noise=0.09)
    upd = site_update(model, SiteStats.from_data(X, y), np.zeros(1), np.eye(1), np.zeros(1), 2 * np.eye(1), rng)
    assert upd.tilted is None and "cavity" in upd.reason
    assert np.all(upd.dr == 0) and np.all(upd.dQ == 0)


def test_damped_update_backs_off_until_positive_definite():
    Q = np.eye(2)
    dQ = np.diag([-2.0, 0.0])  # delta = 1 gives -1; need delta < 0.5
    r_new, Q_new, delta = damped_update(np.zeros(2), Q, np.ones(2), dQ, 1.0)
    assert np.isclose(delta, 0.8**4)  # 1, .8, .64, .512 fail; .4096 passes
    np.testing.assert_allclose(Q_new, Q + delta * dQ)
    np.testing.assert_allclose(r_new, delta * np.ones(2))
    with pytest.raises(ValueError, match="positive definite"):
        damped_update(np.zeros(2), Q, np.zeros(2), np.diag([-1e9, 0.0]), 1.0, min_damping=1e-3)


def test_damped_update_takes_a_step_of_at_most_one_sd_whole_and_damps_a_larger_one():
    r, Q = np.zeros(2), np.eye(2)  # q = N(0, I)
    dQ = np.diag([0.2, 0.0])
    # whole step: precision 1.2, mean 0.3 / 1.2 = 0.25 = 0.27 sd, log variance -0.18: within one sd, taken whole
    r_new, Q_new, delta = damped_update(r, Q, np.array([0.3, 0.0]), dQ, 0.5)
    assert delta == 1.0
    np.testing.assert_allclose(r_new, [0.3, 0.0])
    np.testing.assert_allclose(Q_new, Q + dQ)
    # whole step: mean 3 / 1.2 = 2.5 = 2.7 sd: damped
    r_new, Q_new, delta = damped_update(r, Q, np.array([3.0, 0.0]), dQ, 0.5)
    assert delta == 0.5
    np.testing.assert_allclose(r_new, [1.5, 0.0])
    np.testing.assert_allclose(Q_new, Q + 0.5 * dQ)
    # a step whose whole precision is not positive definite is damped (and backed off as before)
    assert damped_update(r, Q, np.zeros(2), np.diag([-1.5, 0.0]), 0.5)[2] == 0.5
    assert damped_update(r, Q, np.array([0.3, 0.0]), dQ, 0.5, whole_step=None)[2] == 0.5


def test_unbiased_precision_and_rhat():
    rng = np.random.default_rng(7)
    draws = rng.multivariate_normal([1.0, 2.0], [[1.0, 0.3], [0.3, 0.5]], size=50)
    r, Q = unbiased_precision(draws)
    M = (draws - draws.mean(0)).T @ (draws - draws.mean(0))
    np.testing.assert_allclose(Q, (50 - 2 - 2) * np.linalg.inv(M))
    np.testing.assert_allclose(r, Q @ draws.mean(0))
    chains = rng.standard_normal((4, 400, 1))
    assert split_rhat(chains)[0] < 1.02
    chains[0] += 3.0
    assert split_rhat(chains)[0] > 1.2


def test_stopping_rule():
    means = [np.zeros(2)] * 5
    variances = [np.ones(2)] * 5
    assert converged(means, variances)
    assert not converged(means[:2], variances[:2])  # one round: no rate to judge by
    assert not converged(means[:-1] + [np.array([0.2, 0.0])], variances)


def _geometric_history(first_change: float, rate: float, n_rounds: int):
    """Means of a 1-D EP history that moves by first_change * rate^c (in posterior sds) in round c + 1."""
    steps = first_change * rate ** np.arange(n_rounds)
    return [np.array([x]) for x in np.concatenate([[0.0], np.cumsum(steps)])], [np.ones(1)] * (n_rounds + 1)


def test_stopping_rule_stops_once_the_change_still_to_come_is_below_tol():
    # rate 0.3: round changes 1, 0.3, 0.09, 0.027, ...; after round 4 the rounds to come add
    # 0.027 * 0.3 / 0.7 = 0.012 in total: stop there (three quiet rounds would wait to round 6)
    means, variances = _geometric_history(1.0, 0.3, 8)
    stops = [c for c in range(2, 9) if converged(means[: c + 1], variances[: c + 1], tol=0.05)]
    assert stops[0] == 4
    remaining = abs(means[-1][0] - means[4][0])  # brute force: where eight rounds take it
    assert remaining < 0.05


def test_stopping_rule_waits_while_the_rounds_contract_slowly():
    # rate 0.9: a change of 0.04 < tol still has 0.04 * 9 = 0.36 to come; stop only when that is below tol
    means, variances = _geometric_history(0.1, 0.9, 40)
    first = next(c for c in range(2, 41) if converged(means[: c + 1], variances[: c + 1], tol=0.05))
    change = 0.1 * 0.9 ** (first - 1)
    assert change * 0.9 / 0.1 < 0.05 <= 0.1 * 0.9 ** (first - 2) * 9
    assert abs(means[-1][0] - means[first][0]) < 0.05  # brute force: the rest of the 40 rounds


def _random_intercept_site(seed):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(30), rng.standard_normal(30)])
    y = X @ np.array([1.0, -0.5]) + 0.4 * rng.standard_normal(30) + 0.3
    model = GaussianHierarchy(2, random=[True, False], noise="shared", mu_scale=10.0)
    return model, SiteStats.from_data(X, y)


def test_importance_control_variate_is_the_weighted_minus_the_plain_moments_of_its_draws():
    """mean = E_w[phi] - mean(phi) + Laplace mean, cov = Cov_w - Cov + Laplace cov, from the returned draws;
    the Laplace moments implied by two independent runs agree (they do not depend on the draws)."""
    from fedhier.models.fedlin.natural import moments_from_draws

    model, stats = _random_intercept_site(0)
    cav_Q = np.eye(model.p) * 2.0
    implied = []
    for seed in (1, 2):
        res = tilted_moments(model, stats, cav_Q @ np.full(model.p, 0.2), cav_Q, np.random.default_rng(seed), method="importance")
        w_mean, w_cov = moments_from_draws(res.phi, res.weights)
        p_mean, p_cov = moments_from_draws(res.phi)
        implied.append((res.mean - w_mean + p_mean, res.cov - w_cov + p_cov))
        np.testing.assert_allclose(implied[-1][0], res.diagnostics["mode"][: model.p], atol=1e-12)
    np.testing.assert_allclose(implied[0][1], implied[1][1], rtol=1e-9, atol=1e-12)


def test_laplace_search_from_another_start_gives_the_same_tilted_moments():
    """The site's previous mode as the start (what EP rounds pass) changes the moments by far less than their sd.

    A first search stops within about 1e-2 of the mode (in the metric of the Hessian), so the two
    proposals differ slightly and so do the estimates from the same points: by a few thousandths
    of an sd here (covariances by under 1 % in the reference's own scale), about a tenth of
    the estimator's own Monte-Carlo error on this site.
    """

    def whitened_gap(cov, ref):
        L = np.linalg.cholesky(ref)
        return np.abs(np.linalg.solve(L, np.linalg.solve(L, cov - ref).T)).max()

    model, stats = _random_intercept_site(4)
    cav_Q = np.eye(model.p)
    cav_r = cav_Q @ np.array([0.5, 0.0, -1.0, -0.5])
    cold = tilted_moments(model, stats, cav_r, cav_Q, np.random.default_rng(7), method="importance")
    warm = tilted_moments(model, stats, cav_r, cav_Q, np.random.default_rng(7), method="importance",
                          start=cold.diagnostics["mode"] + 0.3)
    sd = np.sqrt(np.diag(cold.cov))
    assert np.max(np.abs(warm.mean - cold.mean) / sd) < 1e-2
    assert whitened_gap(warm.cov, cold.cov) < 1e-2
    # the next round: another cavity, the search starting from the site's derivatives of this one.  It stops
    # within about 0.5 (no derivatives evaluated after its first step), so the proposal differs more from a
    # fresh search's: over 100 seeds the estimates agree on average (within 4 standard errors) and their
    # Monte-Carlo scatter stays within 1.5 times the fresh search's (this small site's tilted law is far
    # from Gaussian: a few seeds have an ESS below 100, kept here)
    cav_Q2 = 1.5 * cav_Q
    cav_r2 = cav_Q2 @ np.array([0.4, 0.1, -1.2, -0.4])
    fresh, reused = [], []
    for seed in range(100):
        rng_fresh, rng_reused = np.random.default_rng(seed), np.random.default_rng(seed)
        fresh.append(tilted_moments(model, stats, cav_r2, cav_Q2, rng_fresh, method="importance", min_ess=0.0).mean)
        reused.append(tilted_moments(model, stats, cav_r2, cav_Q2, rng_reused, method="importance", min_ess=0.0,
                                     start=cold.diagnostics["laplace"]).mean)
    fresh, reused = np.array(fresh), np.array(reused)
    se = np.sqrt((fresh.var(0) + reused.var(0)) / 100)
    assert np.all(np.abs(reused.mean(0) - fresh.mean(0)) < 4 * se)
    assert np.all(reused.std(0) < 1.5 * fresh.std(0))


def test_first_laplace_search_starts_at_the_sites_least_squares_and_finds_the_same_mode(monkeypatch):
    """Under the prior as cavity (EP's first round) the search starts at the site's least-squares fit
    (numpy's lstsq on the raw rows) and its residual mean square; it reaches the mode found from the prior
    mean, in fewer evaluations of the derivatives."""
    import fedhier.models.fedlin.tilted as tilted

    rng = np.random.default_rng(5)
    X = np.column_stack([np.ones(50), rng.standard_normal((50, 2))])
    y = X @ np.array([1.0, 0.5, -0.3]) + 0.6 + 0.7 * rng.standard_normal(50)
    model = GaussianHierarchy(3, random=[True, False, False], noise="shared", mu_scale=10.0)
    stats = SiteStats.from_data(X, y)
    m0, S0 = model.prior()
    beta, rss, *_ = np.linalg.lstsq(X, y, rcond=None)
    start = model.phi_start(stats, m0)
    np.testing.assert_allclose(start[:3], beta, rtol=1e-10)
    assert start[3] == m0[3] and start[4] == pytest.approx(np.log(rss[0] / 50), rel=1e-10)

    evaluations = []
    derivatives = tilted._derivatives
    monkeypatch.setattr(tilted, "_derivatives", lambda *a: evaluations.append(1) or derivatives(*a))
    Q0 = np.linalg.inv(S0)
    from_data = tilted_moments(model, stats, Q0 @ m0, Q0, np.random.default_rng(1), method="importance")
    n_from_data, evaluations[:] = len(evaluations), []
    from_prior = tilted_moments(model, stats, Q0 @ m0, Q0, np.random.default_rng(1), method="importance", start=m0)
    assert n_from_data < len(evaluations)
    # both searches stop close to the mode in the metric of the tilted density's negative Hessian
    neg_hess = Q0 - from_prior.diagnostics["laplace"]["hess"]  # the site's part plus the cavity's
    gap = from_data.diagnostics["mode"] - from_prior.diagnostics["mode"]
    assert np.sqrt(gap @ neg_hess @ gap) < 0.02


def test_qmc_offsets_are_a_balanced_net_with_standard_normal_points():
    """The 256 shifted Sobol' points fill every 1/256 slice of each coordinate once (the net's
    balance, which independent draws lack), and one point over many shifts is N(0, I) (so the
    importance estimates stay unbiased)."""
    from fedhier.models.fedlin.tilted import normal_offsets

    rng = np.random.default_rng(3)
    cells = np.floor(sps.norm.cdf(normal_offsets(rng, 256, 5)) * 256).astype(int)
    for j in range(5):
        assert sorted(cells[:, j]) == list(range(256))
    point = np.array([normal_offsets(rng, 256, 5)[7] for _ in range(2000)])
    for j in range(5):
        assert sps.kstest(point[:, j], "norm").pvalue > 1e-3
    assert np.abs(np.corrcoef(point.T) - np.eye(5)).max() < 0.1
    with pytest.raises(ValueError, match="sampler"):
        tilted_moments(*_random_intercept_site(0), np.zeros(4), np.eye(4), rng, method="importance", sampler="sobol")


@pytest.mark.parametrize("random", [[True, False], [True, True]])
def test_device_posterior_draws_have_its_moments(random):
    """Draws of theta_k (one or two varying coordinates) match the Rao-Blackwellised mean and covariance."""
    rng = np.random.default_rng(5)
    X = np.column_stack([np.ones(12), rng.standard_normal(12)])
    y = X @ np.array([1.0, -0.5]) + 0.5 * rng.standard_normal(12)
    model = GaussianHierarchy(2, random=random, noise="shared", mu_scale=10.0)
    stats = SiteStats.from_data(X, y)
    cav_Q = 4.0 * np.eye(model.p)
    tilted = tilted_moments(model, stats, cav_Q @ np.r_[1.0, -0.5, np.full(model.p - 2, -1.5)], cav_Q, rng, method="importance")
    post = device_posterior(model, stats, tilted, rng, n_draws=40000)
    se = np.sqrt(np.diag(post.cov) / 40000)
    assert np.all(np.abs(post.draws.mean(0) - post.mean) < 4 * se)
    np.testing.assert_allclose(np.cov(post.draws.T), post.cov, atol=0.03 * np.diag(post.cov).max())


def test_draws_reweighted_for_a_new_cavity_give_its_tilted_moments():
    """Importance draws made under one cavity, reweighted for another (a shift of half a cavity sd and a
    20 % narrower spread), give the brute-force grid's moments under the new cavity; a cavity far from
    the draws leaves too few effective draws and is refused."""
    rng = np.random.default_rng(11)
    X, y = _data(rng, 60, np.array([0.8, -0.4]), 0.4)
    model, stats = BayesianRidge(2), SiteStats.from_data(X, y)
    old_mean, old_sd = np.array([-0.5, np.log(0.16)]), 0.3
    Q_old = np.eye(2) / old_sd**2
    drawn = tilted_moments(model, stats, Q_old @ old_mean, Q_old, rng, method="importance", n_draws=1024)
    points = np.column_stack([drawn.phi, drawn.local])
    new_mean, new_sd = old_mean + 0.5 * old_sd, 0.8 * old_sd
    Q_new = np.eye(2) / new_sd**2
    res = reweight(model, points, drawn.diagnostics["log_ratio"], Q_new @ new_mean, Q_new, min_ess=100.0)

    # independent: y ~ N(0, s2 (X X^T / lam + I)) on the raw data, in the eigenbasis of X X^T
    e, U = np.linalg.eigh(X @ X.T)
    z2 = (U.T @ y) ** 2

    def logp(pts):
        ll, ls2 = pts[:, :1], pts[:, 1:]
        v = np.exp(ls2) * (e / np.exp(ll) + 1.0)
        return sps.multivariate_normal(new_mean, new_sd**2 * np.eye(2)).logpdf(pts) - 0.5 * (np.log(2 * np.pi * v) + z2 / v).sum(1)

    mean, cov = _grid_moments(logp, [np.linspace(m - 8 * new_sd, m + 8 * new_sd, 200) for m in new_mean])
    mean, cov = _grid_moments(logp, [np.linspace(m - 10 * s, m + 10 * s, 200) for m, s in zip(mean, np.sqrt(np.diag(cov)))])
    sd = np.sqrt(np.diag(cov))
    np.testing.assert_allclose(res.mean, mean, atol=0.05 * sd.min())
    np.testing.assert_allclose(np.sqrt(np.diag(res.cov)), sd, rtol=0.05)
    with pytest.raises(TiltedFailure, match="effective sample size"):
        reweight(model, points, drawn.diagnostics["log_ratio"], Q_new @ (old_mean + 5.0), Q_new, min_ess=100.0)


def test_importance_draws_use_the_offsets_given_again_under_a_new_proposal():
    """A site's next round passes its normal offsets back: the new draws are the new Laplace proposal's
    mode +- L xi with the same xi (each estimate then as unbiased as with new offsets)."""
    rng = np.random.default_rng(12)
    X, y = _data(rng, 60, np.array([0.8, -0.4]), 0.4)
    model, stats = BayesianRidge(2), SiteStats.from_data(X, y)
    Q = np.eye(2) / 0.3**2
    first = tilted_moments(model, stats, Q @ np.array([-0.5, np.log(0.16)]), Q, rng, method="importance", n_draws=512)
    xi = first.diagnostics["offsets"]
    assert xi.shape == (256, 2)
    cav_mean = np.array([-0.4, np.log(0.2)])
    again = tilted_moments(model, stats, Q @ cav_mean, Q, rng, method="importance", n_draws=512, offsets=xi)
    # the proposal's covariance: the inverse of minus the Hessian (the site's part plus the cavity's) where the search ended
    L = np.linalg.cholesky(np.linalg.inv(Q - again.diagnostics["laplace"]["hess"]))
    mode = again.diagnostics["mode"]
    np.testing.assert_allclose(np.column_stack([again.phi, again.local])[:256], mode + xi @ L.T, atol=1e-6)
    # a count other than the offsets' draws new ones
    assert tilted_moments(model, stats, Q @ cav_mean, Q, rng, method="importance", n_draws=256, offsets=xi).diagnostics["offsets"].shape == (128, 2)


@pytest.mark.parametrize("n_rows, cav_sd, pilot_kept", [(400, 0.3, True), (8, 1.0, False)])
def test_importance_pilot_is_kept_only_when_the_tilted_law_is_nearly_gaussian(n_rows, cav_sd, pilot_kept):
    """With n_pilot the sampler keeps its pilot draws when their weights are nearly equal (many rows, an informative
    cavity) and draws n_draws afresh otherwise (eight rows, a wide cavity); either way the moments are the brute-force
    grid's."""
    rng = np.random.default_rng(5)
    X, y = _data(rng, n_rows, np.array([0.8, -0.4]), 0.4)
    model = BayesianRidge(2)
    cav_mean, cav_cov = np.array([-0.5, np.log(0.16)]), cav_sd**2 * np.eye(2)
    Q = np.linalg.inv(cav_cov)
    res = tilted_moments(model, SiteStats.from_data(X, y), Q @ cav_mean, Q, rng, method="importance", n_draws=1024,
                         n_pilot=256, min_ess=0.0)
    assert res.weights.size == (256 if pilot_kept else 1024)

    # independent: y ~ N(0, s2 (X X^T / lam + I)) on the raw data, in the eigenbasis of X X^T
    e, U = np.linalg.eigh(X @ X.T)
    z2 = (U.T @ y) ** 2

    def logp(pts):
        ll, ls2 = pts[:, :1], pts[:, 1:]
        v = np.exp(ls2) * (e / np.exp(ll) + 1.0)
        return sps.multivariate_normal(cav_mean, cav_cov).logpdf(pts) - 0.5 * (np.log(2 * np.pi * v) + z2 / v).sum(1)

    sd = np.sqrt(np.diag(res.cov))
    wide = [np.linspace(m - 8 * cav_sd, m + 8 * cav_sd, 200) for m in cav_mean]
    mean, cov = _grid_moments(logp, wide)  # a first pass finds the mass, a second resolves it
    sd_grid = np.sqrt(np.diag(cov))
    mean, cov = _grid_moments(logp, [np.linspace(m - 10 * s, m + 10 * s, 200) for m, s in zip(mean, sd_grid)])
    np.testing.assert_allclose(res.mean, mean, atol=0.05 * sd.min())
    np.testing.assert_allclose(np.sqrt(np.diag(res.cov)), np.sqrt(np.diag(cov)), rtol=0.05)
