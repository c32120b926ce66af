"""WAIC of a fitted Fed-mv-PPCA model against a direct computation (spec §10), Figure-4 statistic."""

import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import multivariate_normal, ttest_ind

from fedhier.experiments.mvppca import figure4_statistic
from fedhier.models.mvppca import GlobalView, waic
from fedhier.models.mvppca.predictive import draw_site_params
from fedhier.estimators.mvppca import FedMVPPCA


def _tiny_fit():
    rng = np.random.default_rng(5)
    W = {"a": rng.normal(size=(4, 2)), "b": rng.normal(size=(3, 2))}
    sites = []
    for c, n in enumerate((12, 10)):
        x = rng.normal(size=(n, 2))
        site = {v: x @ W[v].T + 0.3 * rng.normal(size=(n, W[v].shape[0])) + c for v in W}
        sites.append(site)
    sites[1]["b"][:3] = np.nan  # three subjects lack view b
    model = FedMVPPCA(2, n_rounds=3, n_local_iter=4, n_first_iter=6, random_state=1).fit(sites)
    return model, sites


def _direct_waic(global_params, sites, n_draws, seed):
    """-2 (lppd - p_WAIC2) with dense Gaussian marginals from scipy, draw by draw."""
    rng = np.random.default_rng(seed)
    draws = [draw_site_params(global_params, rng) for _ in range(n_draws)]
    loglik = []  # (S, subjects)
    for theta in draws:
        row = []
        for site in sites:
            n = next(iter(site.values())).shape[0]
            for i in range(n):
                views = [v for v in site if not np.isnan(site[v][i]).all()]
                mean = np.concatenate([theta[v].mu for v in views])
                Wo = np.vstack([theta[v].W for v in views])
                psi = np.concatenate([np.full(theta[v].dim, theta[v].sigma2) for v in views])
                t = np.concatenate([site[v][i] for v in views])
                row.append(multivariate_normal(mean, Wo @ Wo.T + np.diag(psi)).logpdf(t))
        loglik.append(row)
    loglik = np.array(loglik)
    lppd = np.sum(logsumexp(loglik, axis=0) - np.log(n_draws))
    p_waic = np.sum(np.var(loglik, axis=0, ddof=1))
    return -2.0 * (lppd - p_waic)


def test_waic_of_a_fitted_model_matches_a_direct_computation():
    model, sites = _tiny_fit()
    fitted = {v: GlobalView(**g) for v, g in model.global_params_.items()}
    got = waic(fitted, sites, n_draws=40, seed=11)
    assert got == pytest.approx(_direct_waic(fitted, sites, 40, 11), rel=1e-9)


def test_figure4_statistic_is_welch_t():
    rng = np.random.default_rng(0)
    a, b = rng.normal(-5, 1, size=30), rng.normal(-4, 2, size=25)
    assert figure4_statistic(a, b) == pytest.approx(ttest_ind(a, b, equal_var=False).statistic)
    assert np.isnan(figure4_statistic([1.0], b))


def test_estimator_waic_matches_a_direct_computation():
    model, sites = _tiny_fit()
    fitted = {v: GlobalView(**g) for v, g in model.global_params_.items()}
    assert model.waic(sites, n_draws=40, seed=11) == pytest.approx(_direct_waic(fitted, sites, 40, 11), rel=1e-9)
