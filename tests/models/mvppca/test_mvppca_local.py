"""Local EM / MAP-EM of multi-view PPCA (spec §3, §4) against independent computations."""

import numpy as np
import pytest
from scipy import optimize, stats

from fedhier.models.mvppca import (
    GlobalView,
    ViewParams,
    e_step,
    fit_local,
    local_objective,
    marginal_loglik,
    sample,
)
from fedhier.models.mvppca.mstep import (
    effective_columns,
    mean_step,
    residual_dof,
    scatter_first_form,
    scatter_second_form,
    sigma2_step,
)


def with_missing_rows(X, rng, frac=0.25, keep_first=None):
    """Copy of X where each view loses a random fraction of rows (entire rows set to NaN)."""
    out = {}
    for k, v in X.items():
        v = v.copy()
        if k != keep_first:
            v[rng.random(v.shape[0]) < frac] = np.nan
        out[k] = v
    return out


def test_single_view_em_reaches_tipping_bishop_closed_form(rng, make_model):
    # (a) one site, one view, no priors: ML of Tipping & Bishop from the eigen-decomposition
    d, q, n = 7, 2, 400
    model = make_model([d], q, [0.5], rng)
    X, _ = sample(model, n, rng)
    fit = fit_local(X, q, n_iter=2000, rng=1, sigma2_prior=None)

    S = np.cov(X["v0"].T, bias=True)
    lam = np.linalg.eigvalsh(S)[::-1]
    s2_ml = lam[q:].mean()
    ll_ml = -0.5 * n * (d * np.log(2 * np.pi) + np.log(lam[:q]).sum() + (d - q) * np.log(s2_ml) + d)

    ll_fit = marginal_loglik(fit.params, X).sum()
    assert ll_fit == pytest.approx(ll_ml, rel=1e-6)
    assert ll_fit <= ll_ml + 1e-8 * abs(ll_ml)
    assert fit.params["v0"].sigma2 == pytest.approx(s2_ml, rel=1e-4)
    np.testing.assert_allclose(fit.params["v0"].mu, X["v0"].mean(axis=0), rtol=1e-12)
    assert fit.expected_ll.shape == (2000,) and np.all(np.isfinite(fit.expected_ll))


def _multiview_negloglik(theta, T, dims, q):
    """-ln L and its gradient for stacked views, dense d x d algebra (independent of the package)."""
    n, d = T.shape
    W = theta[: d * q].reshape(d, q)
    mu = theta[d * q : d * q + d]
    log_s2 = theta[d * q + d :]
    psi = np.concatenate([np.full(dk, np.exp(ls)) for dk, ls in zip(dims, log_s2)])
    C = W @ W.T + np.diag(psi)
    Ci = np.linalg.inv(C)
    R = T - mu
    S = R.T @ R / n
    _, logdet = np.linalg.slogdet(C)
    nll = 0.5 * n * (d * np.log(2 * np.pi) + logdet + np.sum(Ci * S))
    G = n * (Ci - Ci @ S @ Ci)  # d(-lnL)/dC * 2
    gW = G @ W
    gmu = -n * Ci @ R.mean(axis=0)
    diagG = 0.5 * np.diag(G)
    edges = np.cumsum([0] + list(dims))
    gls = np.array([diagG[a:b].sum() * np.exp(ls) for a, b, ls in zip(edges[:-1], edges[1:], log_s2)])
    return nll, np.concatenate([gW.ravel(), gmu, gls])


def test_multiview_em_matches_direct_maximisation(rng, make_model):
    # (b) one site, three views with different noise levels: EM vs L-BFGS on the joint marginal likelihood
    dims, q, n = [4, 3, 5], 2, 300
    model = make_model(dims, q, [0.1, 0.6, 2.0], rng)
    X, _ = sample(model, n, rng)
    fit = fit_local(X, q, n_iter=3000, rng=2, sigma2_prior=None)
    ll_em = marginal_loglik(fit.params, X).sum()

    T = np.hstack([X[k] for k in model])
    d = T.shape[1]
    start = np.concatenate([rng.normal(size=d * q), np.zeros(d), np.zeros(len(dims))])
    res = optimize.minimize(
        _multiview_negloglik, start, args=(T, dims, q), jac=True, method="L-BFGS-B",
        options={"maxiter": 20000, "ftol": 1e-15, "gtol": 1e-9},
    )
    ll_direct = -res.fun
    # both are maxima of the same function: agree to 1e-7 relative, and EM is not worse
    assert ll_em == pytest.approx(ll_direct, rel=1e-7)
    assert ll_em >= ll_direct - 1e-7 * abs(ll_direct)
    s2_direct = np.exp(res.x[-len(dims):])
    np.testing.assert_allclose([fit.params[k].sigma2 for k in model], s2_direct, rtol=1e-3)


def test_e_step_equals_gaussian_conditioning(rng, make_model, stack):
    model = make_model([4, 3, 5], 3, [0.3, 0.7, 1.1], rng)
    X, _ = sample(model, 60, rng)
    X = with_missing_rows(X, rng, frac=0.3)
    X["v0"][0] = np.nan
    X["v1"][0] = np.nan
    X["v2"][0] = np.nan  # subject 0 has no view: prior
    means, covs = e_step(X, model)
    assert means.shape == (60, 3) and covs.shape == (60, 3, 3)
    for i in range(60):
        views = [k for k in model if not np.isnan(X[k][i, 0])]
        if not views:
            np.testing.assert_allclose(means[i], 0.0)
            np.testing.assert_allclose(covs[i], np.eye(3))
            continue
        mu, W, C = stack(model, views)
        t = np.concatenate([X[k][i] for k in views])
        gain = np.linalg.solve(C, W).T  # W^T C^{-1}
        np.testing.assert_allclose(means[i], gain @ (t - mu), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(covs[i], np.eye(3) - gain @ W, rtol=1e-10, atol=1e-12)


def test_woodbury_mean_step_equals_direct_solve_of_eq_11(rng):
    d, q, n = 9, 3, 40
    W = rng.normal(size=(d, q))
    sigma2, v = 0.7, 0.05
    T = rng.normal(size=(n, d)) + 2.0
    prior_mean = rng.normal(size=d)
    C = W @ W.T + sigma2 * np.eye(d)
    direct = np.linalg.solve(n * np.eye(d) + C / v, T.sum(axis=0) + C @ prior_mean / v)
    got = mean_step(T.mean(axis=0), n, W, sigma2, prior_mean, v)
    np.testing.assert_allclose(got, direct, rtol=1e-11)
    np.testing.assert_allclose(mean_step(T.mean(axis=0), n, W, sigma2), T.mean(axis=0))


def test_sigma2_second_form_equals_first_form(rng, make_model):
    model = make_model([5, 4], 2, [0.4, 0.9], rng)
    X, _ = sample(model, 80, rng)
    X = with_missing_rows(X, rng, frac=0.3)
    means, covs = e_step(X, model)
    mu_new = {k: p.mu + 0.1 for k, p in model.items()}
    W_new = {k: p.W * 1.1 for k, p in model.items()}
    for k in model:
        rows = ~np.isnan(X[k][:, 0])
        T, Xm, M = X[k][rows], means[rows], covs[rows]
        mu, W = mu_new[k], W_new[k]
        # the paper's first form, subject by subject
        first = sum(
            (t - mu) @ (t - mu) - 2 * x @ W.T @ (t - mu) + np.trace(W.T @ W @ (Mi + np.outer(x, x)))
            for t, x, Mi in zip(T, Xm, M)
        )
        cross = (T - mu).T @ Xm
        xx = Xm.T @ Xm + M.sum(axis=0)
        tbar = T.mean(axis=0)
        scatter = ((T - tbar) ** 2).sum()
        assert scatter_first_form(scatter, T.shape[0], tbar, mu, W, cross, xx) == pytest.approx(first, rel=1e-11)
        assert scatter_second_form(T, mu, W, Xm, M.sum(axis=0)) == pytest.approx(first, rel=1e-11)


def test_sigma2_step_safeguards():
    # MAP form of eq. 21
    value, notes = sigma2_step(10.0, 20, old=0.3, view="a", alpha=3.0, beta=2.0)
    assert value == pytest.approx((10.0 + 4.0) / (20 + 8.0)) and notes == []
    # weak IG(2.25, 0.625) of round 1
    value, notes = sigma2_step(10.0, 20, old=0.3, view="a", weak=True)
    assert value == pytest.approx((10.0 + 1.25) / (20 + 6.5)) and notes == []
    # halving retry: S = -1.5 needs 2 beta0 = alpha0 - 1 > 1.5, i.e. v0 = 1/4 (alpha0 = 3)
    value, notes = sigma2_step(-1.5, 20, old=0.3, view="a", weak=True)
    assert value == pytest.approx((-1.5 + 2.0) / (20 + 8.0))
    assert len(notes) == 1 and "'a'" in notes[0] and "halved" in notes[0]
    # non-positive plain-EM value rejected, old kept
    value, notes = sigma2_step(0.0, 20, old=0.3, view="b")
    assert value == 0.3 and "non-positive" in notes[0] and "'b'" in notes[0]


def test_few_dimensions_keep_extra_columns_at_zero(rng, make_model):
    q = 4
    model = make_model([6, 3, 1], q, [0.3, 0.5, 0.2], rng)
    X, _ = sample(model, 100, rng)
    assert [effective_columns(d, q) for d in (6, 4, 3, 1)] == [4, 3, 2, 0]
    fit = fit_local(X, q, n_iter=30, rng=3)
    assert np.all(fit.params["v1"].W[:, 2:] == 0) and np.any(fit.params["v1"].W[:, :2] != 0)
    assert np.all(fit.params["v2"].W == 0)
    assert np.any(fit.params["v0"].W[:, 3] != 0)
    prior = {
        k: GlobalView(mu=p.mu, W=p.W, sigma2_mu=0.1, sigma2_W=0.5, alpha=5.0, beta=2.0, noise_var=0.5, var_sigma=1.0)
        for k, p in fit.params.items()
    }
    fit2 = fit_local(X, q, prior, n_iter=5, rng=4)
    assert np.all(fit2.params["v1"].W[:, 2:] == 0) and np.all(fit2.params["v2"].W == 0)


def test_map_em_reaches_a_stationary_point_of_j_c_in_w_and_sigma2(rng, make_model):
    # MAP-EM fixed points: J_c (§3) is stationary in W and sigma2 (exact CM steps); mu follows eq. 11
    model = make_model([5, 4], 2, [0.4, 0.9], rng)
    X, _ = sample(model, 150, rng)
    X = with_missing_rows(X, rng, frac=0.2, keep_first="v0")
    prior = {
        k: GlobalView(mu=p.mu + 0.3, W=p.W + 0.2, sigma2_mu=0.05, sigma2_W=0.2, alpha=6.0, beta=3.0,
                      noise_var=0.6, var_sigma=0.1)
        for k, p in model.items()
    }
    fit = fit_local(X, 2, prior, n_iter=3000, rng=5)

    def J(k, W=None, s2=None):
        p = fit.params[k]
        params = dict(fit.params)
        params[k] = ViewParams(p.mu, p.W if W is None else W, p.sigma2 if s2 is None else s2)
        return local_objective(X, params, prior)

    h = 1e-5
    for k, p in fit.params.items():
        for _ in range(3):
            D = rng.normal(size=p.W.shape)
            D /= np.linalg.norm(D)
            slope = (J(k, W=p.W + h * D) - J(k, W=p.W - h * D)) / (2 * h)
            assert abs(slope) < 1e-3
        slope = (J(k, s2=p.sigma2 * (1 + h)) - J(k, s2=p.sigma2 * (1 - h))) / (2 * h)
        assert abs(slope) < 1e-3
    # a perturbed model is worse: the objective is really maximised
    worse = {k: ViewParams(p.mu, p.W * 1.05, p.sigma2) for k, p in fit.params.items()}
    assert local_objective(X, worse, prior) < local_objective(X, fit.params, prior)


def test_local_objective_is_loglik_plus_log_priors(rng, make_model, stack):
    model = make_model([3, 2], 1, [0.5, 0.8], rng)
    X, _ = sample(model, 20, rng)
    prior = {
        k: GlobalView(mu=np.zeros(p.dim), W=np.zeros((p.dim, 1)), sigma2_mu=2.0, sigma2_W=0.7, alpha=3.0,
                      beta=1.5, noise_var=0.7, var_sigma=1.0)
        for k, p in model.items()
    }
    mu, _, C = stack(model, list(model))
    expected = stats.multivariate_normal(mu, C).logpdf(np.hstack([X["v0"], X["v1"]])).sum()
    for k, p in model.items():
        g = prior[k]
        expected += stats.norm(g.mu, np.sqrt(g.sigma2_mu)).logpdf(p.mu).sum()
        expected += stats.norm(g.W, np.sqrt(g.sigma2_W)).logpdf(p.W).sum()
        expected += stats.invgamma(a=g.alpha, scale=g.beta).logpdf(p.sigma2)
    assert local_objective(X, model, prior) == pytest.approx(expected, rel=1e-12)


def test_prior_views_the_site_lacks_are_not_fitted(rng, make_model):
    model = make_model([4, 3], 2, [0.3, 0.5], rng)
    X, _ = sample(model, 50, rng)
    prior = {
        k: GlobalView(mu=p.mu, W=p.W, sigma2_mu=0.1, sigma2_W=0.1, alpha=5.0, beta=2.0, noise_var=0.5, var_sigma=1.0)
        for k, p in model.items()
    }
    fit = fit_local({"v0": X["v0"]}, 2, prior, n_iter=3, rng=0)
    assert list(fit.params) == ["v0"]
    with pytest.raises(ValueError, match="'extra'"):
        fit_local({"v0": X["v0"], "extra": X["v1"]}, 2, prior, n_iter=3, rng=0)


def test_fit_is_reproducible_and_depends_on_rng(rng, make_model):
    model = make_model([4, 3], 2, [0.3, 0.5], rng)
    X, _ = sample(model, 50, rng)
    a = fit_local(X, 2, n_iter=5, rng=np.random.default_rng(7), init="random")
    b = fit_local(X, 2, n_iter=5, rng=np.random.default_rng(7), init="random")
    c = fit_local(X, 2, n_iter=5, rng=np.random.default_rng(8), init="random")
    np.testing.assert_array_equal(a.params["v0"].W, b.params["v0"].W)
    assert not np.allclose(a.params["v0"].W, c.params["v0"].W)
    # the PCA start spans the whole (7-dimensional) data space here: the draw does not matter
    a = fit_local(X, 2, n_iter=5, rng=np.random.default_rng(7))
    c = fit_local(X, 2, n_iter=5, rng=np.random.default_rng(8))
    np.testing.assert_allclose(np.abs(a.params["v0"].W), np.abs(c.params["v0"].W), rtol=1e-8)


def test_partially_missing_row_raises_naming_the_view(rng):
    X = {"clinic": rng.normal(size=(10, 3)), "mri": rng.normal(size=(10, 4))}
    X["mri"][4, 1] = np.nan
    with pytest.raises(ValueError, match=r"'mri'.*partially missing rows \[4\]"):
        fit_local(X, 2, n_iter=2, rng=0)
    X["mri"][4] = np.nan  # whole row: a subject without the view, accepted
    fit_local(X, 2, n_iter=2, rng=0)
    with pytest.raises(ValueError, match="'mri' has 10 rows, other views have 5"):
        fit_local({"clinic": X["clinic"][:5], "mri": X["mri"]}, 2, n_iter=2, rng=0)
    with pytest.raises(ValueError, match="'mri'.*no observed row"):
        fit_local({"clinic": X["clinic"], "mri": np.full((10, 4), np.nan)}, 2, n_iter=2, rng=0)


def test_nearly_noise_free_data_keep_an_accurate_sigma2(rng):
    # S_k is ~1e-13 of the scatter: the sums-based first form cancels, the fit must not
    d, q, n = 6, 2, 200
    model = {"v0": ViewParams(3 * rng.normal(size=d), 1.5 * rng.normal(size=(d, q)), 1e-13)}
    X, _ = sample(model, n, rng)
    sv = np.linalg.svd(X["v0"] - X["v0"].mean(axis=0), compute_uv=False)
    s2_ml = (sv[q:] ** 2).sum() / (n * (d - q))  # Tipping & Bishop, from singular values
    fit = fit_local(X, q, n_iter=100, rng=1, sigma2_prior=None)
    assert fit.params["v0"].sigma2 == pytest.approx(s2_ml, rel=1e-6)
    assert fit.safeguards == ()


def test_residual_dof_takes_one_per_feature_for_the_mean_and_the_loadings_hat_trace(rng):
    N, d, q = 30, 12, 3
    Z = rng.normal(size=(N, q))
    sxx = Z.T @ Z
    # no prior: ordinary least squares per feature, q loadings and the mean
    assert residual_dof(N, d, sxx, 0.0, q) == pytest.approx(d * (N - 1 - q))
    # a ridge: the loadings take tr[(S + Lambda)^{-1} S] = sum_i s_i / (s_i + lambda) for a common lambda
    lam = 7.0
    s = np.linalg.eigvalsh(sxx)
    assert residual_dof(N, d, sxx, lam, q) == pytest.approx(d * (N - 1 - np.sum(s / (s + lam))))
    # columns beyond q_k take nothing; a prior that pins the loadings leaves only the mean's degree of freedom
    assert residual_dof(N, d, sxx, 0.0, 1) == pytest.approx(d * (N - 2))
    assert residual_dof(N, d, sxx, 1e12, q) == pytest.approx(d * (N - 1), rel=1e-9)
    # never below one degree of freedom per feature
    assert residual_dof(3, d, np.eye(3), 0.0, 3) == d


@pytest.mark.parametrize("n_subjects,dim,paper_below", [(15, 60, 0.8), (40, 20, 0.92)])
def test_noise_dof_removes_the_small_sample_bias_of_sigma2(n_subjects, dim, paper_below):
    # data drawn from PPCA with noise variance 1: eq. 21 divides by N d and comes out near (N - 1 - q) / N
    paper, dof = [], []
    for seed in range(12):
        r = np.random.default_rng(seed)
        W, mu = r.normal(size=(dim, 3)), r.normal(size=dim)
        X = r.normal(size=(n_subjects, 3)) @ W.T + mu + r.normal(size=(n_subjects, dim))
        for flag, out in ((False, paper), (True, dof)):
            fit = fit_local({"a": X}, 3, None, n_iter=300, rng=0, sigma2_prior=None, tol=1e-10, noise_dof=flag)
            out.append(fit.params["a"].sigma2)
    assert np.mean(paper) < paper_below
    assert 0.95 < np.mean(dof) < 1.06


def _variational_iterations(X, prior, q, n_iter, seed):
    """The iterations of fit_local(..., loading_uncertainty=True) written out subject by subject, with dense solves.

    The start is fit_local's: per view, W = W~ + sd_Wi * N(0, 1) and sigma2 = beta / Gamma(alpha), in view order.
    Per iteration: (1) mu by eq. 11 with C = W W^T + sigma2 I; (2) q(x_n) with precision
    I + sum_{k in O_n} (W_k^T W_k + d_k Sigma_k) / sigma2_k; (3) each row of W_k ~ N(w_j, Sigma_k),
    W_k = (B + W~ L)(A + L)^{-1}, Sigma_k = sigma2 (A + L)^{-1}, A = sum <x x^T>, B = sum (t - mu) <x>^T, L = sigma2 / sd_W^2;
    (4) sigma2 = (E sum ||t - mu - W x||^2 + 2 beta) / (N d + 2 (alpha + 1)), the expectation over q(x) and q(W).
    """
    rng = np.random.default_rng(seed)
    names = list(X)
    n = next(iter(X.values())).shape[0]
    W, s2, Sigma, mu = {}, {}, {}, {}
    for k in names:
        g = prior[k]
        W[k] = g.W + np.sqrt(np.asarray(g.sigma2_W_columns)) * rng.standard_normal(g.W.shape)
        s2[k] = g.beta / rng.gamma(g.alpha)
        Sigma[k] = np.zeros((q, q))
    seen = {k: ~np.isnan(X[k]).all(axis=1) for k in names}
    for _ in range(n_iter):
        for k in names:
            g, T = prior[k], X[k][seen[k]]
            N, d = T.shape
            C = W[k] @ W[k].T + s2[k] * np.eye(d)
            mu[k] = g.mu + N * g.sigma2_mu * np.linalg.solve(N * g.sigma2_mu * np.eye(d) + C, T.mean(axis=0) - g.mu)
        means, seconds = np.zeros((n, q)), np.zeros((n, q, q))
        for i in range(n):
            P, b = np.eye(q), np.zeros(q)
            for k in names:
                if seen[k][i]:
                    P += (W[k].T @ W[k] + X[k].shape[1] * Sigma[k]) / s2[k]
                    b += W[k].T @ (X[k][i] - mu[k]) / s2[k]
            M = np.linalg.inv(P)
            means[i] = M @ b
            seconds[i] = M + np.outer(means[i], means[i])
        for k in names:
            g, rows = prior[k], seen[k]
            T = X[k][rows] - mu[k]
            N, d = T.shape
            A, B = seconds[rows].sum(axis=0), T.T @ means[rows]
            L = np.diag(s2[k] / np.asarray(g.sigma2_W_columns))
            W[k] = (B + g.W @ L) @ np.linalg.inv(A + L)
            Sigma[k] = s2[k] * np.linalg.inv(A + L)
            residual = sum(np.sum((t - W[k] @ x) ** 2) + np.trace(W[k] @ (S - np.outer(x, x)) @ W[k].T)
                           for t, x, S in zip(T, means[rows], seconds[rows]))
            residual += d * np.trace(Sigma[k] @ A)
            s2[k] = (residual + 2 * g.beta) / (N * d + 2 * (g.alpha + 1))
    return {k: ViewParams(mu[k], W[k], s2[k]) for k in names}


def test_loading_uncertainty_iterations_are_variational_bayes_for_the_loadings_written_out(rng, make_model):
    model = make_model([7, 5], 2, [0.4, 0.9], rng)
    X, _ = sample(model, 40, rng)
    X = with_missing_rows(X, rng, frac=0.2, keep_first="v0")  # two observed-view patterns
    prior = {
        k: GlobalView(mu=p.mu + 0.3, W=p.W + 0.2, sigma2_mu=0.05, sigma2_W=0.1, alpha=6.0, beta=3.0,
                      noise_var=0.6, var_sigma=0.1, sigma2_W_columns=np.array([0.1, 0.03]))
        for k, p in model.items()
    }
    expected = _variational_iterations(X, prior, 2, n_iter=4, seed=3)
    fit = fit_local(X, 2, prior, n_iter=4, rng=3, loading_uncertainty=True)
    for k in X:
        np.testing.assert_allclose(fit.params[k].mu, expected[k].mu, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(fit.params[k].W, expected[k].W, rtol=1e-9, atol=1e-12)
        assert fit.params[k].sigma2 == pytest.approx(expected[k].sigma2, rel=1e-9)
    # the paper's MAP-EM is another iteration: the loadings' uncertainty changes the fit
    map_em = fit_local(X, 2, prior, n_iter=4, rng=3)
    assert any(abs(map_em.params[k].sigma2 / fit.params[k].sigma2 - 1) > 1e-3 for k in X)
    # round 1 has no prior, so nothing to take the expectation over: the option changes nothing there
    first = fit_local(X, 2, n_iter=5, rng=3, loading_uncertainty=True)
    np.testing.assert_array_equal(first.params["v1"].W, fit_local(X, 2, n_iter=5, rng=3).params["v1"].W)
