"""Master ML step (spec §5) and the inverse-gamma ML1 estimator (§5.2)."""

from dataclasses import replace

import numpy as np
import pytest
from scipy import optimize, special, stats

from fedhier.models.mvppca import (
    ViewParams,
    data_independent_prior,
    global_step,
    global_step_from_params,
    invgamma_mle,
    invgamma_mle_from_statistics,
    relative_change,
    site_statistics,
    statistic_shapes,
)


def random_sites(rng, dims, q, n_sites, missing=()):
    """Local parameters of n_sites sites; (site, view) pairs in `missing` are left out."""
    sites = []
    for c in range(n_sites):
        sites.append({
            v: ViewParams(mu=1.0 + 0.3 * rng.normal(size=d), W=2.0 + 0.5 * rng.normal(size=(d, q)),
                          sigma2=float(rng.uniform(0.2, 0.6)))
            for v, d in dims.items() if (c, v) not in missing
        })
    return sites


def summed(site_stats):
    total = {}
    for stats_c in site_stats:
        for view, fields in stats_c.items():
            acc = total.setdefault(view, {k: np.zeros_like(a) for k, a in fields.items()})
            for k, a in fields.items():
                acc[k] = acc[k] + a
    return total


def assert_same_global(a, b, rtol):
    assert list(a) == list(b)
    for view in a:
        for field, value in a[view].to_dict().items():
            np.testing.assert_allclose(value, getattr(b[view], field), rtol=rtol, err_msg=f"{view}.{field}")


def numerical_ig_mle(x):
    """Brute-force MLE of IG(alpha, beta): maximise the exact log-likelihood over (ln alpha, ln beta)."""
    nll = lambda t: -stats.invgamma(a=np.exp(t[0]), scale=np.exp(t[1])).logpdf(x).sum()
    res = optimize.minimize(nll, [np.log(3.0), np.log(np.mean(x))], method="Nelder-Mead",
                            options={"xatol": 1e-12, "fatol": 1e-14, "maxiter": 20000})
    return np.exp(res.x)


@pytest.mark.parametrize("solver", ["newton", "fixed_point"])
def test_global_step_from_sums_equals_direct_form(rng, solver):
    dims, q = {"a": 6, "b": 4}, 3
    sites = random_sites(rng, dims, q, 5, missing={(1, "b"), (3, "b")})
    anchor, _ = global_step_from_params(random_sites(rng, dims, q, 3), n_components=q)
    for anc in (anchor, None):
        direct, notes_direct = global_step_from_params(sites, n_components=q, ig_solver=solver)
        from_sums, notes_sums = global_step(summed(site_statistics(p, anc) for p in sites), anchor=anc,
                                            n_components=q, ig_solver=solver)
        assert_same_global(from_sums, direct, rtol=1e-12)
        assert notes_direct == notes_sums


def test_direct_form_is_the_maximum_likelihood_of_section_3(rng):
    dims, q = {"a": 5, "b": 3}, 2
    sites = random_sites(rng, dims, q, 6, missing={(0, "a")})
    g, notes = global_step_from_params(sites, n_components=q)
    assert notes == ()
    for view, d in dims.items():
        blocks = [s[view] for s in sites if view in s]
        mus = np.array([b.mu for b in blocks])
        Ws = np.array([b.W for b in blocks])
        s2 = np.array([b.sigma2 for b in blocks])
        # 1/C_k; the ML variance of an isotropic Gaussian is the mean of the per-coordinate ML variances
        np.testing.assert_allclose(g[view].mu, mus.mean(axis=0), rtol=1e-13)
        assert g[view].sigma2_mu == pytest.approx(np.var(mus, axis=0).mean(), rel=1e-12)
        assert g[view].sigma2_W == pytest.approx(np.var(Ws, axis=0).mean(), rel=1e-12)
        assert g[view].noise_var == pytest.approx(s2.mean(), rel=1e-13)
        alpha, beta = numerical_ig_mle(s2)
        assert g[view].alpha == pytest.approx(alpha, rel=1e-6)
        assert g[view].beta == pytest.approx(beta, rel=1e-6)
        assert g[view].var_sigma == pytest.approx(stats.invgamma(a=g[view].alpha, scale=g[view].beta).var(), rel=1e-10)


def test_safeguards_are_applied_and_reported(rng):
    q = 2
    single = random_sites(rng, {"a": 3}, q, 1)
    g, notes = global_step_from_params(single, n_components=q)
    assert g["a"].sigma2_mu == 1e-4 and g["a"].sigma2_W == 1e-4
    assert g["a"].alpha == 1e8  # m = 1: s = 0, alpha at its cap
    assert any("single site" in n for n in notes) and any("capped at 1e+08" in n for n in notes)

    same = [single[0], single[0], single[0]]
    g, notes = global_step_from_params(same, n_components=q)
    assert g["a"].sigma2_mu == 1e-20 and g["a"].sigma2_W == 1e-20
    assert sum("zero spread" in n for n in notes) == 2

    B = rng.normal(size=(3, q))  # W_c = +-B: spread ~ 1, mean W~ small, so ||W~||_F / 5 binds
    small_W = [{"a": ViewParams(s["a"].mu, sign * B + 0.01 * c, s["a"].sigma2)}
               for c, (s, sign) in enumerate(zip(random_sites(rng, {"a": 3}, q, 4), [1, -1, 1, -1]))]
    g, notes = global_step_from_params(small_W, n_components=q)
    assert g["a"].sigma2_W == pytest.approx(np.linalg.norm(g["a"].W) / 5)
    assert any("capped at ||W~||_F / 5" in n for n in notes)


def test_view_without_sites_keeps_previous(rng):
    q = 2
    sites = random_sites(rng, {"a": 3}, q, 3)
    previous = data_independent_prior({"a": 3, "b": 4}, q)
    g, _ = global_step(summed(site_statistics(p, previous) for p in sites), anchor=previous, n_components=q, previous=previous)
    assert g["b"] is previous["b"] and g["a"] is not previous["a"]
    stats_b0 = {"b": {k: np.zeros(s) for k, s in statistic_shapes(4, q).items()}}
    g, _ = global_step(stats_b0, anchor=None, n_components=q)
    assert g == {}


def test_statistics_are_checked(rng):
    q = 2
    stats_ = summed(site_statistics(p, None) for p in random_sites(rng, {"a": 3}, q, 2))
    del stats_["a"]["sum_log_sigma2"]
    with pytest.raises(ValueError, match="'a'.*sum_log_sigma2"):
        global_step(stats_, anchor=None, n_components=q)
    stats_ = summed(site_statistics(p, None) for p in random_sites(rng, {"a": 3}, q, 2))
    with pytest.raises(ValueError, match="'a'.*sum_W.*shape"):
        global_step(stats_, anchor=None, n_components=q + 1)
    assert set(stats_["a"]) == set(statistic_shapes(3, q))


def test_data_independent_prior_round_one():
    g = data_independent_prior({"x": 3}, 2)["x"]
    np.testing.assert_array_equal(g.mu, 0.5)
    np.testing.assert_array_equal(g.W, np.zeros((3, 2)))
    dist = stats.invgamma(a=g.alpha, scale=g.beta)
    assert (g.alpha, g.beta, g.sigma2_mu, g.sigma2_W) == (2.25, 0.625, 1.0, 1.0)
    assert g.noise_var == pytest.approx(dist.mean()) and g.var_sigma == pytest.approx(dist.var())


def test_invgamma_newton_matches_scipy_fit(rng):
    # (d)
    x = stats.invgamma(a=6.0, scale=2.0).rvs(size=60, random_state=rng)
    alpha, beta = invgamma_mle(x)
    a_sp, loc, b_sp = stats.invgamma.fit(x, floc=0)
    assert loc == 0
    assert alpha == pytest.approx(a_sp, rel=1e-4) and beta == pytest.approx(b_sp, rel=1e-4)
    a_bf, b_bf = numerical_ig_mle(x)
    assert alpha == pytest.approx(a_bf, rel=1e-6) and beta == pytest.approx(b_bf, rel=1e-6)
    # stationarity: psi(alpha) = ln alpha - s and beta / alpha = harmonic mean
    s = np.log(np.mean(1 / x)) + np.mean(np.log(x))
    assert special.digamma(alpha) == pytest.approx(np.log(alpha) - s, abs=1e-12)
    assert beta / alpha == pytest.approx(1 / np.mean(1 / x), rel=1e-13)
    same = invgamma_mle_from_statistics(x.size, np.sum(1 / x), np.sum(np.log(x)), x.sum(), x @ x, "newton")
    assert same == (alpha, beta)


def test_invgamma_fixed_point_is_slow_for_large_alpha(rng):
    # (d) three close values: alpha in the hundreds, 10 fixed-point steps stop far from the MLE
    x = np.array([0.50, 0.53, 0.48])
    alpha, beta = invgamma_mle(x)
    a_bf, _ = numerical_ig_mle(x)
    assert alpha == pytest.approx(a_bf, rel=1e-6) and alpha > 100
    a10, b10 = invgamma_mle(x, solver="fixed_point")
    assert abs(a10 - alpha) / alpha > 0.05
    assert b10 / a10 == pytest.approx(beta / alpha, rel=1e-13)
    a_many, _ = invgamma_mle(x, solver="fixed_point", fixed_point_steps=30000)
    assert a_many == pytest.approx(alpha, rel=1e-6)


def test_invgamma_floor_cap_and_errors():
    alpha, beta = invgamma_mle(np.array([0.1, 5.0, 0.02, 40.0]))  # very dispersed: MLE alpha < 2
    assert alpha == pytest.approx(2 + 1e-5)
    assert beta == pytest.approx(4 * alpha / np.sum(1 / np.array([0.1, 5.0, 0.02, 40.0])))
    assert invgamma_mle(np.array([0.3]))[0] == 1e8
    assert invgamma_mle(np.array([0.3, 0.3]), solver="fixed_point")[0] > 1e8
    with pytest.raises(ValueError, match="positive"):
        invgamma_mle(np.array([0.3, -1.0]))
    with pytest.raises(ValueError, match="ig_solver"):
        invgamma_mle(np.array([0.3, 0.4]), solver="bisection")


def test_relative_change_is_the_largest_change_of_a_block_relative_to_its_size():
    old = data_independent_prior({"a": 3, "b": 2}, 2)
    assert relative_change(old, dict(old)) == 0.0
    moved = {**old, "a": replace(old["a"], mu=old["a"].mu + np.array([0.3, 0.0, 0.4]))}
    # ||(0.3, 0, 0.4)|| / ||(0.5, 0.5, 0.5)|| = 0.5 / sqrt(0.75)
    assert relative_change(old, moved) == pytest.approx(0.5 / np.sqrt(0.75))
    moved["b"] = replace(old["b"], alpha=2.25 * 1.9)
    assert relative_change(old, moved) == pytest.approx(0.9)  # the larger of the two blocks' changes
    assert relative_change(old, moved, blocks=("mu",)) == pytest.approx(0.5 / np.sqrt(0.75))
    assert relative_change(old, moved, blocks=("W", "beta")) == 0.0
    # a block leaving 0 (W~ of the data-independent prior) and a view new in this round
    moved["b"] = replace(old["b"], W=np.full((2, 2), 0.1))
    assert relative_change(old, moved, blocks=("W",)) == np.inf
    assert relative_change({"a": old["a"]}, old) == np.inf
