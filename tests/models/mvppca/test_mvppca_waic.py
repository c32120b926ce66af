"""WAIC (spec §10) against a brute-force computation on a tiny model."""

import numpy as np
import pytest
from scipy import special, stats

from fedhier.models.mvppca import GlobalView, waic, waic_site_terms


def tiny_global():
    return {
        "b": GlobalView(mu=np.array([0.3]), W=np.array([[0.8]]), sigma2_mu=0.02, sigma2_W=0.05, alpha=6.0,
                        beta=1.0, noise_var=0.2, var_sigma=0.01),
        "a": GlobalView(mu=np.array([0.0, 1.0]), W=np.array([[1.0], [-0.5]]), sigma2_mu=0.1, sigma2_W=0.04,
                        alpha=4.0, beta=1.2, noise_var=0.4, var_sigma=0.05),
    }


def brute_force_pointwise(global_params, X, S, seed):
    """(S, n) matrix of ln p(t_i^{O_i} | theta^(s)), draws in sorted view order: mu, W, sigma2."""
    gen = np.random.default_rng(seed)
    n = next(iter(X.values())).shape[0]
    ll = np.zeros((S, n))
    for s in range(S):
        theta = {}
        for view in sorted(global_params):
            g = global_params[view]
            mu = g.mu + np.sqrt(g.sigma2_mu) * gen.standard_normal(g.mu.shape)
            W = g.W + np.sqrt(g.sigma2_W) * gen.standard_normal(g.W.shape)
            theta[view] = (mu, W, g.beta / gen.gamma(g.alpha))
        for i in range(n):
            views = [k for k in X if not np.isnan(X[k][i, 0])]
            if not views:
                continue
            mu = np.concatenate([theta[k][0] for k in views])
            W = np.vstack([theta[k][1] for k in views])
            C = W @ W.T + np.diag(np.concatenate([np.full(len(theta[k][0]), theta[k][2]) for k in views]))
            ll[s, i] = stats.multivariate_normal(mu, C).logpdf(np.concatenate([X[k][i] for k in views]))
    return ll


def test_waic_equals_brute_force(rng):
    g = tiny_global()
    site1 = {"a": rng.normal(size=(6, 2)), "b": rng.normal(size=(6, 1))}
    site1["b"][[1, 4]] = np.nan
    site1["a"][4] = np.nan  # subject 4: no view, not a point
    site2 = {"a": rng.normal(size=(4, 2)) + 1.0}  # this site never measures "b"
    S, seed = 300, 11
    lppd_total = p_total = 0.0
    for X, n_expected in ((site1, 5), (site2, 4)):
        ll = brute_force_pointwise(g, X, S, seed)
        keep = np.array([any(not np.isnan(X[k][i, 0]) for k in X) for i in range(ll.shape[1])])
        lppd = (special.logsumexp(ll, axis=0) - np.log(S))[keep].sum()
        p_waic = ll.var(axis=0, ddof=1)[keep].sum()
        got = waic_site_terms(g, X, n_draws=S, seed=seed)
        assert got[0] == pytest.approx(lppd, rel=1e-10)
        assert got[1] == pytest.approx(p_waic, rel=1e-9)
        assert got[2] == n_expected
        lppd_total += lppd
        p_total += p_waic
    assert waic(g, [site1, site2], n_draws=S, seed=seed) == pytest.approx(-2 * (lppd_total - p_total), rel=1e-10)


def test_waic_draws_depend_on_seed_only(rng):
    g = tiny_global()
    X = {"a": rng.normal(size=(5, 2))}
    a = waic_site_terms(g, X, n_draws=50, seed=1)
    assert waic_site_terms(g, X, n_draws=50, seed=1) == a
    assert waic_site_terms(g, X, n_draws=50, seed=2) != a
    with pytest.raises(ValueError, match="n_draws"):
        waic_site_terms(g, X, n_draws=1, seed=1)
