"""The PCA start of the round-1 EM against the Tipping & Bishop closed form of ML PPCA."""

import numpy as np
import pytest

from fedhier import FedMVPPCA
from fedhier.models.mvppca import fit_local
from fedhier.models.mvppca._data import check_views
from fedhier.models.mvppca.start import pca_start


def _ppca_data(n, d, q, seed):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(d, q)) * np.linspace(3.0, 0.8, q)
    return rng.normal(size=(n, q)) @ W.T + 5.0 * rng.normal(size=d) + 1.3 * rng.normal(size=(n, d))


def _closed_form(X, q):
    """ML PPCA (Tipping & Bishop 1999) from the eigen-decomposition of the sample covariance."""
    n, d = X.shape
    lam, U = np.linalg.eigh(np.cov(X.T, bias=True))
    lam, U = lam[::-1], U[:, ::-1]
    s2 = lam[q:].mean()
    ll = -0.5 * n * (d * np.log(2 * np.pi) + np.log(lam[:q]).sum() + (d - q) * np.log(s2) + d)
    return ll, s2, U[:, :q]


def _subspace_gap(W, U):
    """sin of the largest principal angle between span(W) and span(U) (U orthonormal)."""
    Q, _ = np.linalg.qr(W)
    return np.linalg.norm(U - Q @ (Q.T @ U), 2)


def test_single_site_fit_reaches_tipping_bishop_within_the_default_budget():
    n, d, q = 5_000, 200, 10
    X = _ppca_data(n, d, q, seed=0)
    ll_ml, s2_ml, U = _closed_form(X, q)

    # the pooled special case: one site, one view, one round, default start and iteration budget
    model = FedMVPPCA(n_components=q, n_rounds=1, sigma2_prior=None, random_state=0).fit([{"v": X}])
    g = model.global_params_["v"]
    ll = model.score({"v": X}) * n
    assert ll == pytest.approx(ll_ml, rel=1e-6)
    assert g["noise_var"] == pytest.approx(s2_ml, rel=1e-6)
    assert _subspace_gap(np.asarray(g["W"]), U) < 1e-6
    np.testing.assert_allclose(g["mu"], X.mean(axis=0), rtol=1e-12)

    # the paper's start U(-2, 2), same budget, is still far from it: the check above can fail
    paper = FedMVPPCA(n_components=q, n_rounds=1, sigma2_prior=None, random_state=0, init="random", local_tol=None)
    gp = paper.fit([{"v": X}]).global_params_["v"]
    assert abs(gp["noise_var"] - s2_ml) / s2_ml > 1e-4


def test_pca_start_of_one_view_is_the_closed_form_and_ignores_missing_subjects():
    n, d, q = 400, 12, 3
    X = _ppca_data(n, d, q, seed=1)
    ll_ml, s2_ml, U = _closed_form(X, q)
    site = check_views({"v": X})
    mean = X.mean(axis=0)
    W, s2 = pca_start(site, {"v": mean}, {"v": float(((X - mean) ** 2).sum())}, q, np.random.default_rng(0))
    assert s2["v"] == pytest.approx(s2_ml, rel=1e-10)
    assert _subspace_gap(W["v"], U) < 1e-10
    # W^T W = Lambda_q - sigma2 I (columns orthogonal, scaled by the closed form)
    lam = np.linalg.eigvalsh(np.cov(X.T, bias=True))[::-1][:q]
    np.testing.assert_allclose(np.sort(np.linalg.eigvalsh(W["v"].T @ W["v"]))[::-1], lam - s2_ml, rtol=1e-10)

    # subjects lacking the view (NaN rows) do not enter the start
    Xm = np.vstack([X, np.full((50, d), np.nan)])
    other = np.random.default_rng(2).normal(size=(n + 50, 4))
    site = check_views({"v": Xm, "w": other})
    Wm, s2m = pca_start(
        site, {"v": mean, "w": other.mean(axis=0)},
        {"v": float(((X - mean) ** 2).sum()), "w": float(((other - other.mean(axis=0)) ** 2).sum())},
        q, np.random.default_rng(0),
    )
    assert Wm["v"].shape == (d, q) and Wm["w"].shape == (4, q)
    assert np.isfinite(s2m["v"]) and s2m["v"] > 0 and s2m["w"] > 0


def test_init_and_local_tol_are_checked_and_local_tol_stops_early():
    X = {"v": _ppca_data(300, 8, 2, seed=3)}
    with pytest.raises(ValueError, match="init must be"):
        fit_local(X, 2, n_iter=3, rng=0, init="svd")
    with pytest.raises(ValueError, match="tol must be"):
        fit_local(X, 2, n_iter=3, rng=0, tol=-1.0)
    with pytest.raises(ValueError, match="init must be"):
        FedMVPPCA(2, n_rounds=1, init="svd").fit([X, X])
    full = fit_local(X, 2, n_iter=200, rng=0, sigma2_prior=None)
    early = fit_local(X, 2, n_iter=200, rng=0, sigma2_prior=None, tol=1e-10)
    assert 1 < early.expected_ll.size < 200
    np.testing.assert_allclose(early.params["v"].W, full.params["v"].W, rtol=1e-6, atol=1e-8)


def test_pca_start_with_fewer_subjects_than_components_gives_q_columns():
    rng = np.random.default_rng(4)
    X = {"a": rng.normal(size=(4, 8)), "b": rng.normal(size=(4, 3))}
    fit = fit_local(X, 5, n_iter=3, rng=0)
    assert fit.params["a"].W.shape == (8, 5) and fit.params["b"].W.shape == (3, 5)
    assert np.all(np.isfinite(fit.params["a"].W)) and fit.params["a"].sigma2 > 0


def test_pca_start_of_complete_views_is_the_joint_closed_form():
    # two views, every subject has both: the start is the ML PPCA of the views side by side
    n, q = 500, 3
    X = _ppca_data(n, 10, q, seed=5)
    views = {"a": X[:, :6], "b": X[:, 6:]}
    site = check_views(views)
    means = {k: v.mean(axis=0) for k, v in views.items()}
    scatter = {k: float(((v - means[k]) ** 2).sum()) for k, v in views.items()}
    W, s2 = pca_start(site, means, scatter, q, np.random.default_rng(0))

    _, s2_ml, U = _closed_form(X, q)
    W_joint = np.vstack([W["a"], W["b"]])
    assert _subspace_gap(W_joint, U) < 1e-10
    lam = np.linalg.eigvalsh(np.cov(X.T, bias=True))[::-1][:q]
    np.testing.assert_allclose(np.sort(np.linalg.eigvalsh(W_joint.T @ W_joint))[::-1], lam - s2_ml, rtol=1e-10)
    # each view's noise: its residual variance per entry beyond W_k W_k^T
    for k, v in views.items():
        expected = np.trace(np.cov(v.T, bias=True)) / v.shape[1] - np.vdot(W[k], W[k]) / v.shape[1]
        assert s2[k] == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("offset", [0.0, 1e5])
def test_round_one_em_on_the_covariance_is_em_on_the_data(monkeypatch, offset):
    # two complete narrow views: the start forms their joint covariance C; round 1's EM then takes its
    # moments from C (no pass over the data), unless the means dwarf the spread (offset 1e5), where C has
    # lost digits to rounding and the EM passes over the data as before
    from fedhier.models.mvppca import local

    n, q = 2_000, 4
    X = _ppca_data(n, 30, q, seed=7) + offset
    views = {"a": X[:, :18], "b": X[:, 18:]}
    passes = []
    counted = local.posterior
    monkeypatch.setattr(local, "posterior", lambda *args, **kwargs: passes.append(1) or counted(*args, **kwargs))
    on_covariance = fit_local(views, q, n_iter=6, rng=0)
    assert len(passes) == (6 if offset else 0)

    # the reference: the same fit with every E-step from the data (the start still forms C itself)
    from fedhier.models.mvppca import start

    formed = start.joint_covariance
    calls = []  # the fit's own call (first) gets no covariance; the start's call inside pca_start forms it

    def not_for_the_fit(*args):
        calls.append(1)
        return None if len(calls) == 1 else formed(*args)

    monkeypatch.setattr(start, "joint_covariance", not_for_the_fit)
    on_data = fit_local(views, q, n_iter=6, rng=0)
    assert len(passes) == (12 if offset else 6)
    for k in views:
        a, b = on_covariance.params[k], on_data.params[k]
        np.testing.assert_allclose(a.W, b.W, rtol=1e-9, atol=1e-9 * np.abs(b.W).max())
        assert a.sigma2 == pytest.approx(b.sigma2, rel=1e-10)
        np.testing.assert_array_equal(a.mu, b.mu)
    np.testing.assert_allclose(on_covariance.expected_ll, on_data.expected_ll, rtol=1e-11)

    # the site's latent second moments at the fitted parameters (for its spread), from C as from the data
    from fedhier.models.mvppca.spread import latent_second_moments

    assert on_data.covariance is None and (on_covariance.covariance is None) == bool(offset)
    if not offset:
        _, from_covariance = latent_second_moments(views, on_covariance.params, on_covariance.covariance)
        _, from_data = latent_second_moments(views, on_covariance.params)
        np.testing.assert_allclose(from_covariance, from_data, rtol=1e-10, atol=1e-12 * np.abs(from_data).max())


def test_pooled_fit_with_the_weak_prior_is_the_closed_form_map():
    # one site, one view, the defaults (weak IG(2.25, 0.625) prior on sigma2): with W = U_q (Lambda_q - s I)^{1/2}
    # for any s, the log posterior in s alone is maximised at s = (N sum_{i>q} lambda_i + 2 beta) / (N (d - q) + 2 (alpha + 1))
    from scipy.stats import multivariate_normal

    n, d, q = 3_000, 60, 5
    X = _ppca_data(n, d, q, seed=11)
    alpha, beta = 2.25, 0.625
    lam, U = np.linalg.eigh(np.cov(X.T, bias=True))
    lam, U = lam[::-1], U[:, ::-1]
    s2 = (n * lam[q:].sum() + 2 * beta) / (n * (d - q) + 2 * (alpha + 1))
    W = U[:, :q] * np.sqrt(lam[:q] - s2)
    test = _ppca_data(500, d, q, seed=11)  # the same model (seed), other subjects
    expected = multivariate_normal(X.mean(axis=0), W @ W.T + s2 * np.eye(d)).logpdf(test).mean()

    model = FedMVPPCA(n_components=q, n_rounds=1, random_state=0).fit(X)
    assert model.global_params_["X"]["noise_var"] == pytest.approx(s2, rel=1e-6)
    assert model.score(test) == pytest.approx(expected, rel=1e-6)
