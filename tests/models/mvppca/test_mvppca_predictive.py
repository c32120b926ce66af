"""Projection, imputation, likelihood and sampling with a fitted model (spec §9, §10)."""

import numpy as np
import pytest
from scipy import stats

from fedhier.models.mvppca import (
    GlobalView,
    fit_local,
    hierarchical_predictive_variance,
    impute,
    impute_covariance,
    impute_variance,
    latent_posterior,
    marginal_loglik,
    model_change,
    point_model,
    reconstruct,
    sample,
    sample_hierarchical,
)


def drop_rows(X, rng, frac):
    out = {k: v.copy() for k, v in X.items()}
    for v in out.values():
        v[rng.random(v.shape[0]) < frac] = np.nan
    return out


def observed_views(X, i):
    return [k for k in X if not np.isnan(X[k][i, 0])]


def test_marginal_loglik_equals_multivariate_normal_on_stacked_views(rng, make_model, stack):
    model = make_model([4, 2, 3], 2, [0.3, 0.9, 0.5], rng)
    X, _ = sample(model, 50, rng)
    X = drop_rows(X, rng, 0.35)
    for k in X:
        X[k][0] = np.nan  # subject 0: no view at all
    got = marginal_loglik(model, X)
    assert got.shape == (50,) and got[0] == 0.0
    for i in range(1, 50):
        views = observed_views(X, i)
        if not views:
            assert got[i] == 0.0
            continue
        mu, _, C = stack(model, views)
        t = np.concatenate([X[k][i] for k in views])
        assert got[i] == pytest.approx(stats.multivariate_normal(mu, C).logpdf(t), rel=1e-11)


def test_latent_posterior_with_a_subset_of_views(rng, make_model, stack):
    model = make_model([4, 2, 3], 3, [0.3, 0.9, 0.5], rng)
    X, _ = sample(model, 30, rng)
    X = drop_rows({"v2": X["v2"], "v0": X["v0"]}, rng, 0.3)  # v1 not measured
    mean, cov = latent_posterior(model, X)
    for i in range(30):
        views = observed_views(X, i)
        if not views:
            np.testing.assert_allclose(mean[i], 0.0)
            np.testing.assert_allclose(cov[i], np.eye(3))
            continue
        mu, W, C = stack(model, views)
        t = np.concatenate([X[k][i] for k in views])
        np.testing.assert_allclose(mean[i], W.T @ np.linalg.solve(C, t - mu), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(cov[i], np.eye(3) - W.T @ np.linalg.solve(C, W), rtol=1e-10, atol=1e-12)


def test_imputation_equals_gaussian_conditioning(rng, make_model, stack):
    model = make_model([4, 3, 2], 2, [0.3, 0.9, 0.5], rng)
    X, _ = sample(model, 25, rng)
    X = drop_rows(X, rng, 0.4)
    means = impute(model, X)
    recon = reconstruct(model, X)
    for m in model:
        var = impute_variance(model, X, m)
        cov = impute_covariance(model, X, m)
        assert means[m].shape == (25, model[m].dim) and cov.shape == (25, model[m].dim, model[m].dim)
        np.testing.assert_array_equal(means[m], recon[m])  # observed rows: reconstruction
        np.testing.assert_allclose(var, np.diagonal(cov, axis1=1, axis2=2))
        for i in range(25):
            views = [k for k in observed_views(X, i) if k != m]
            if m in observed_views(X, i):
                continue
            order = views + [m]
            mu, _, C = stack(model, order)
            dO = sum(model[k].dim for k in views)
            if dO == 0:
                cond_mean, cond_cov = mu, C
            else:
                t = np.concatenate([X[k][i] for k in views])
                gain = np.linalg.solve(C[:dO, :dO], C[:dO, dO:]).T
                cond_mean = mu[dO:] + gain @ (t - mu[:dO])
                cond_cov = C[dO:, dO:] - gain @ C[:dO, dO:]
            np.testing.assert_allclose(means[m][i], cond_mean, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(cov[i], cond_cov, rtol=1e-10, atol=1e-12)


def test_reconstruction_of_observed_view_is_w_xhat_plus_mu(rng, make_model):
    model = make_model([5, 3], 2, [0.2, 0.4], rng)
    X, _ = sample(model, 20, rng)
    xhat, _ = latent_posterior(model, X)
    recon = reconstruct(model, {"v0": X["v0"], "v1": X["v1"]})
    for k in model:
        np.testing.assert_allclose(recon[k], xhat @ model[k].W.T + model[k].mu)
    assert list(reconstruct(model, {"v1": X["v1"]})) == ["v1"]


def test_imputing_a_missing_view_beats_mean_imputation(rng, make_model):
    # (e) real cross-view correlation through a shared latent
    model = make_model([6, 5, 4], 2, [0.2, 0.3, 0.2], rng, scale=2.0)
    train, _ = sample(model, 400, rng)
    test, _ = sample(model, 300, rng)
    fit = fit_local(train, 2, n_iter=300, rng=0)
    truth = test["v1"]
    X = {"v0": test["v0"], "v2": test["v2"]}
    pred = impute(fit.params, X)["v1"]
    mse_model = np.mean((pred - truth) ** 2)
    mse_mean = np.mean((train["v1"].mean(axis=0) - truth) ** 2)
    assert mse_model < 0.5 * mse_mean
    # and the predictive variance is calibrated: mean squared error ~ mean predicted variance
    assert mse_model == pytest.approx(impute_variance(fit.params, X, "v1").mean(), rel=0.2)


def test_sample_matches_model_moments(rng, make_model, stack):
    model = make_model([3, 2], 2, [0.5, 0.2], rng)
    views, latent = sample(model, 200_000, np.random.default_rng(1))
    assert latent.shape == (200_000, 2)
    mu, _, C = stack(model, list(model))
    T = np.hstack([views["v0"], views["v1"]])
    np.testing.assert_allclose(T.mean(axis=0), mu, atol=0.03)
    np.testing.assert_allclose(np.cov(T.T), C, atol=0.05 * np.abs(C).max())


def test_sample_hierarchical_draws_site_parameters_from_the_prior(rng):
    g = GlobalView(mu=np.array([1.0, -2.0]), W=np.array([[1.0], [0.5]]), sigma2_mu=0.04, sigma2_W=0.09,
                   alpha=5.0, beta=2.0, noise_var=0.5, var_sigma=0.1)
    gen = np.random.default_rng(2)
    draws = [sample_hierarchical({"a": g}, 3, gen)[1]["a"] for _ in range(3000)]
    s2 = np.array([d.sigma2 for d in draws])
    assert stats.kstest(s2, stats.invgamma(a=5.0, scale=2.0).cdf).pvalue > 0.01
    mus = np.array([d.mu for d in draws])
    assert stats.kstest((mus[:, 1] + 2.0) / 0.2, "norm").pvalue > 0.01
    Ws = np.array([d.W for d in draws])
    assert stats.kstest((Ws[:, 0, 0] - 1.0) / 0.3, "norm").pvalue > 0.01
    views, site = sample_hierarchical({"a": g}, 10, gen)
    assert views["a"].shape == (10, 2) and set(site) == {"a"}


def test_hierarchical_predictive_variance_by_monte_carlo(rng):
    q = 2
    g = {
        "a": GlobalView(mu=np.zeros(3), W=rng.normal(size=(3, q)), sigma2_mu=0.05, sigma2_W=0.1, alpha=5.0,
                        beta=2.0, noise_var=0.4, var_sigma=0.1),
        "b": GlobalView(mu=np.ones(2), W=rng.normal(size=(2, q)), sigma2_mu=0.02, sigma2_W=0.03, alpha=5.0,
                        beta=2.0, noise_var=0.3, var_sigma=0.1),
    }
    X = {"a": np.array([[0.5, -1.0, 2.0], [np.nan] * 3])}
    got = hierarchical_predictive_variance(g, X, "b")
    xhat, M = latent_posterior(point_model(g), X)
    gen = np.random.default_rng(3)
    S = 400_000
    for i in range(2):
        x = gen.multivariate_normal(xhat[i], M[i], size=S)
        W = g["b"].W + np.sqrt(g["b"].sigma2_W) * gen.standard_normal((S, 2, q))
        mu = g["b"].mu + np.sqrt(g["b"].sigma2_mu) * gen.standard_normal((S, 2))
        t = np.einsum("sdq,sq->sd", W, x) + mu + np.sqrt(g["b"].noise_var) * gen.standard_normal((S, 2))
        np.testing.assert_allclose(got[i], t.var(axis=0), rtol=0.02)


def test_views_must_belong_to_the_model(rng, make_model):
    model = make_model([3, 2], 1, [0.5, 0.2], rng)
    with pytest.raises(ValueError, match="'other' is not in the model"):
        marginal_loglik(model, {"other": np.zeros((2, 3))})
    with pytest.raises(ValueError, match="'v1' has 3 columns, the model has 2"):
        impute(model, {"v1": np.zeros((2, 3))})
    with pytest.raises(ValueError, match="'v9' is not in the model"):
        impute_variance(model, {"v1": np.zeros((2, 2))}, "v9")


def _global(rng, dims, q):
    return {
        f"v{k}": GlobalView(mu=rng.normal(size=d), W=rng.normal(size=(d, q)), sigma2_mu=rng.uniform(0.01, 0.1),
                            sigma2_W=rng.uniform(0.01, 0.1), alpha=5.0, beta=2.0, noise_var=rng.uniform(0.2, 1.0),
                            var_sigma=0.1)
        for k, d in enumerate(dims)
    }


def test_model_change_is_the_square_root_of_the_symmetrised_kl_of_the_new_site_predictive(rng):
    q = 2
    old, new = _global(rng, (4, 3), q), _global(rng, (4, 3), q)

    def moments(g):
        # a subject at a new site: W_c = W~ + E (entries of variance sigma2_W), mu_c ~ N(mu~, sigma2_mu), noise s-bar
        W = np.vstack([v.W for v in g.values()])
        diag = np.concatenate([np.full(v.mu.size, v.noise_var + v.sigma2_mu + q * v.sigma2_W) for v in g.values()])
        return np.concatenate([v.mu for v in g.values()]), W @ W.T + np.diag(diag)

    def kl(a, b):  # closed form with the d x d matrices formed
        (m0, C0), (m1, C1) = a, b
        inv = np.linalg.inv(C1)
        return 0.5 * (np.trace(inv @ C0) - m0.size + (m1 - m0) @ inv @ (m1 - m0) + np.linalg.slogdet(C1)[1] - np.linalg.slogdet(C0)[1])

    a, b = moments(old), moments(new)
    assert model_change(old, new) == pytest.approx(np.sqrt(kl(a, b) + kl(b, a)), rel=1e-9)
    assert model_change(old, old) == pytest.approx(0.0, abs=1e-7)
    # a turn of the latent space changes no prediction; a shift of the mean by one sd along a direction counts 1
    R = np.linalg.qr(rng.normal(size=(q, q)))[0]
    turned = {k: GlobalView(**{**v.to_dict(), "W": v.W @ R}) for k, v in old.items()}
    assert model_change(old, turned) == pytest.approx(0.0, abs=1e-7)
    m, C = moments(old)
    u = rng.normal(size=m.size)
    step = u / np.sqrt(u @ np.linalg.solve(C, u))  # Mahalanobis length 1
    moved = {k: GlobalView(**{**v.to_dict(), "mu": v.mu + step[i:i + v.mu.size]})
             for (k, v), i in zip(old.items(), (0, 4))}
    assert model_change(old, moved) == pytest.approx(1.0, rel=1e-9)
    assert model_change({"v0": old["v0"]}, old) == np.inf
