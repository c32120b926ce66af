"""The EM update of the between-site variances (prior_update="em") against independent computations,
and its recovery of known between-site sds on data drawn from the hierarchical model
(the fast version of benchmarks/mvppca_hierarchy.py)."""

import numpy as np
import pytest
from scipy import optimize

from fedhier import FedMVPPCA
from fedhier.data.synthetic import make_federated_ppca
from fedhier.models.mvppca import global_step, site_statistics
from fedhier.models.mvppca.master import _em_variance, column_groups, latent_scale, rotation_shares
from fedhier.models.mvppca.mstep import loading_step
from fedhier.models.mvppca.params import GlobalView, ViewParams
from fedhier.models.mvppca.spread import latent_moment, loading_spread, mean_spread, posterior_spread


def test_mean_spread_is_the_trace_of_the_posterior_covariance_of_mu():
    rng = np.random.default_rng(0)
    for d, q in ((6, 2), (3, 5)):
        W, s2, N, v = rng.normal(size=(d, q)), 0.7, 40, 0.3
        C = W @ W.T + s2 * np.eye(d)
        direct = np.trace(np.linalg.inv(N * np.linalg.inv(C) + np.eye(d) / v))
        assert mean_spread(W, s2, N, v) == pytest.approx(direct, rel=1e-10)
        assert mean_spread(W, s2, N, None) == pytest.approx(np.trace(C) / N, rel=1e-10)  # flat prior


def test_loading_spread_is_the_trace_of_the_conditional_posterior_covariance_of_W():
    rng = np.random.default_rng(1)
    d, q, s2, lam = 5, 3, 0.4, 2.5
    A = rng.normal(size=(50, q))
    Sxx = A.T @ A
    # vec W | x-moments ~ N(., s2 (Sxx + lam I)^{-1} kron I_d): the Hessian of Q + ln p(W) in vec W
    hessian = np.kron(np.eye(d), (Sxx + lam * np.eye(q)) / s2)
    assert loading_spread(Sxx, s2, d, lam).sum() == pytest.approx(np.trace(np.linalg.inv(hessian)), rel=1e-10)


def test_em_step_converges_to_the_reml_estimate_of_a_balanced_random_effects_model():
    """y_c = m + u_c + e_c (per coordinate), u ~ N(0, s), e ~ N(0, a), a known: REML gives
    s = sum (y_c - y-bar)^2 / ((C - 1) D) - a.  Iterate the master's EM step with the sites'
    exact posterior means (given m~ = y-bar) and variances: it ends at the mode of the REML
    likelihood times the prior on the sd (a numerical search), within 2 % of the REML estimate (C D = 200)."""
    rng = np.random.default_rng(2)
    C, D, a = 5, 40, 0.2
    y = 1.0 + rng.normal(scale=np.sqrt(0.5), size=(C, D)) + rng.normal(scale=np.sqrt(a), size=(C, D))
    ybar = y.mean(axis=0)
    reml = np.sum((y - ybar) ** 2) / ((C - 1) * D) - a
    v = 5.0
    for _ in range(2000):
        m = ybar + v / (v + a) * (y - ybar)
        spread = np.sum((m - m.mean(axis=0)) ** 2)
        v = _em_variance(spread, C * D * v * a / (v + a), v, C, D)
    assert v == pytest.approx(_penalised_reml(y, a), rel=1e-6)
    assert v == pytest.approx(reml, rel=2e-2)


def test_newton_step_reaches_the_reml_estimate_where_em_crawls():
    """A spread small against the sites' sampling error (fraction of missing information 0.8):
    in 10 rounds the Newton step on the EM map reaches the REML estimate of the balanced model,
    plain EM is still far from it."""
    rng = np.random.default_rng(8)
    C, D, a = 6, 40, 0.05
    y = rng.normal(scale=np.sqrt(0.0125), size=(C, D)) + rng.normal(scale=np.sqrt(a), size=(C, D))
    ybar = y.mean(axis=0)
    reml = np.sum((y - ybar) ** 2) / ((C - 1) * D) - a
    assert reml > 0
    ends = {}
    for newton in (True, False):
        v = np.sum((y - ybar) ** 2) / ((C - 1) * D)  # the round-1 start: the spread of the ML estimates
        for _ in range(10):
            m = ybar + v / (v + a) * (y - ybar)
            v = _em_variance(np.sum((m - m.mean(axis=0)) ** 2), C * D * v * a / (v + a), v, C, D, newton=newton)
        ends[newton] = v
    assert ends[True] == pytest.approx(_penalised_reml(y, a), rel=1e-3)
    assert ends[False] > 1.5 * reml


def _penalised_reml(y: np.ndarray, a: float) -> float:
    """The mode over v of the REML likelihood of y_c = m + u_c + e_c (u ~ N(0, v), e ~ N(0, a) per coordinate)
    times a Gamma(2, 0) prior on sqrt(v), found numerically."""
    C, D = y.shape
    ss = np.sum((y - y.mean(axis=0)) ** 2)
    objective = lambda log_v: (C - 1) * D / 2 * np.log(np.exp(log_v) + a) + ss / (2 * (np.exp(log_v) + a)) - log_v / 2
    return float(np.exp(optimize.minimize_scalar(objective, bounds=(-30, 5), method="bounded",
                                                 options={"xatol": 1e-12}).x))


@pytest.mark.parametrize("sd, D, newton, rounds", [(0.1, 60, False, 3000), (0.1, 60, True, 10), (0.03, 300, True, 10),
                                                   (0.0, 60, True, 10)])
def test_the_variance_step_ends_at_the_penalised_reml_estimate_over_the_coordinates_the_likelihood_sees(
        sd, D, newton, rounds):
    """r of the D coordinates are rotations (the site's estimate sits at the global mean, its exact posterior is
    the prior) while the traces the sites send count a coordinate's posterior variance there as everywhere.  EM
    and the Newton step end at the mode of the REML likelihood over the D - r coordinates the likelihood sees
    times the prior on the sd, found by a numerical search; the Newton step also where the spread is far below
    the sampling error (sd 0.03 against 0.2) and where there is none (sd 0, REML 0, the mode positive)."""
    rng = np.random.default_rng(21)
    C, r, a = 8, 3, 0.04
    y = rng.normal(scale=sd, size=(C, D - r)) + rng.normal(scale=np.sqrt(a), size=(C, D - r))
    ybar = y.mean(axis=0)
    expected = _penalised_reml(y, a)
    assert expected > 0
    v = np.sum((y - ybar) ** 2) / ((C - 1) * (D - r))
    for _ in range(rounds):
        m = ybar + v / (v + a) * (y - ybar)  # the flat coordinates' estimates are the mean: no spread
        v = _em_variance(np.sum((m - m.mean(axis=0)) ** 2), C * D * v * a / (v + a), v, C, D, r, newton=newton)
    assert v == pytest.approx(expected, rel=1e-3)


def test_latent_moment_is_the_summed_posterior_second_moment_of_the_latents():
    rng = np.random.default_rng(9)
    q = 2
    params = {"a": ViewParams(mu=rng.normal(size=4), W=rng.normal(size=(4, q)), sigma2=0.6),
              "b": ViewParams(mu=rng.normal(size=3), W=rng.normal(size=(3, q)), sigma2=1.3)}
    data = {"a": rng.normal(size=(7, 4)), "b": rng.normal(size=(7, 3))}
    data["b"][[1, 4]] = np.nan  # two subjects lack view b
    moment, n = latent_moment(data, params)
    expected = np.zeros((q, q))
    for i in range(7):  # x | t ~ N(M b, M), M^-1 = I + sum_k W_k^T W_k / s2_k over the subject's views
        views = [v for v in data if not np.isnan(data[v][i]).any()]
        M = np.linalg.inv(np.eye(q) + sum(params[v].W.T @ params[v].W / params[v].sigma2 for v in views))
        mean = M @ sum(params[v].W.T @ (data[v][i] - params[v].mu) / params[v].sigma2 for v in views)
        expected += M + np.outer(mean, mean)
    assert n == 7
    np.testing.assert_allclose(moment, expected, rtol=1e-10)


def test_latent_scale_folds_the_latent_variance_into_the_loadings():
    rng = np.random.default_rng(10)
    W = rng.normal(size=(5, 3))
    prior = {"v": GlobalView(mu=np.zeros(5), W=W, sigma2_mu=0.3, sigma2_W=0.04, alpha=3.0, beta=2.0,
                             noise_var=1.0, var_sigma=1.0)}
    out = latent_scale(prior, 1.7)["v"]
    # x ~ N(0, s I) with loadings W is x' ~ N(0, I) with loadings sqrt(s) W: the same s W W^T
    np.testing.assert_allclose(out.W @ out.W.T, 1.7 * W @ W.T, rtol=1e-12)
    assert out.sigma2_W == pytest.approx(0.04 * 1.7)
    assert out.sigma2_mu == 0.3 and np.array_equal(out.mu, prior["v"].mu)
    with pytest.raises(ValueError, match="positive"):
        latent_scale(prior, 0.0)


def test_latent_scale_folds_the_whole_second_moment_when_asked():
    rng = np.random.default_rng(11)
    W = rng.normal(size=(6, 3))
    prior = {"v": GlobalView(mu=np.zeros(6), W=W, sigma2_mu=0.3, sigma2_W=0.04, alpha=3.0, beta=2.0,
                             noise_var=1.0, var_sigma=1.0)}
    A = rng.normal(size=(3, 3))
    S = A @ A.T + 0.5 * np.eye(3)
    scaled = latent_scale(prior, S)["v"]
    # by default only the scale tr S / q
    np.testing.assert_allclose(scaled.W, np.sqrt(np.trace(S) / 3) * W, rtol=1e-12)
    out = latent_scale(prior, S, shape=True)["v"]
    # x ~ N(0, S) with loadings W is x' ~ N(0, I) with loadings W S^{1/2}: the same W S W^T
    np.testing.assert_allclose(out.W @ out.W.T, W @ S @ W.T, rtol=1e-10)
    # by the symmetric root R (R = R^T, R R = S), which turns the latent space as little as possible
    R = np.linalg.lstsq(W, out.W, rcond=None)[0]
    np.testing.assert_allclose(R, R.T, atol=1e-10)
    np.testing.assert_allclose(R @ R, S, rtol=1e-10)
    assert out.sigma2_W == pytest.approx(0.04 * np.trace(S) / 3)
    with pytest.raises(ValueError, match="positive definite"):
        latent_scale(prior, np.diag([1.0, 0.0, 1.0]), shape=True)


def test_rotation_shares_sum_to_the_number_of_rotations_and_follow_the_whitened_weights():
    rng = np.random.default_rng(3)
    q = 4
    prior = {
        name: GlobalView(mu=np.zeros(d), W=scale * rng.normal(size=(d, q)), sigma2_mu=1.0, sigma2_W=var,
                         alpha=3.0, beta=2.0, noise_var=1.0, var_sigma=1.0)
        for name, d, scale, var in (("a", 6, 1.0, 0.1), ("b", 4, 3.0, 0.1), ("c", 5, 1.0, 10.0))
    }
    shares = rotation_shares(prior)
    assert all(s.shape == (q,) for s in shares.values())
    assert sum(s.sum() for s in shares.values()) == pytest.approx(q * (q - 1) / 2)
    # larger loadings / tighter prior: more of the rotation
    assert shares["b"].sum() > shares["a"].sum() > shares["c"].sum()


def test_paper_mode_statistics_are_unchanged_and_em_needs_the_spread_fields():
    rng = np.random.default_rng(4)
    sites = [{"v": ViewParams(mu=rng.normal(size=3), W=rng.normal(size=(3, 2)), sigma2=0.5 + rng.random())} for _ in range(3)]
    stats = [site_statistics(p, None) for p in sites]
    assert set(stats[0]["v"]) == {"count", "sum_mu", "sum_sq_mu", "sum_W", "sum_sq_W", "sum_inv_sigma2", "sum_log_sigma2", "sum_sigma2", "sum_sq_sigma2"}
    summed = {"v": {k: sum(s["v"][k] for s in stats) for k in stats[0]["v"]}}
    with pytest.raises(ValueError, match="sum_post_var_mu"):
        global_step(summed, anchor=None, n_components=2, prior_update="em")
    with pytest.raises(ValueError, match="prior_update"):
        global_step(summed, anchor=None, n_components=2, prior_update="pooled")


def test_posterior_spread_shrinks_with_a_tighter_prior():
    rng = np.random.default_rng(5)
    data = {"v": rng.normal(size=(30, 4))}
    params = {"v": ViewParams(mu=np.zeros(4), W=rng.normal(size=(4, 2)), sigma2=0.5)}
    flat = posterior_spread(data, params, None)["v"]
    prior = lambda var: {"v": GlobalView(mu=np.zeros(4), W=np.zeros((4, 2)), sigma2_mu=var, sigma2_W=var,  # noqa: E731
                                        alpha=3.0, beta=1.0, noise_var=0.5, var_sigma=1.0)}
    wide, tight = posterior_spread(data, params, prior(10.0))["v"], posterior_spread(data, params, prior(1e-4))["v"]
    assert tight[0] < wide[0] < flat[0] and tight[1] < wide[1] < flat[1]
    assert tight[0] <= 4 * 1e-4 and tight[1] <= 8 * 1e-4  # never above the prior's own variance


def _fitted_sds(sd_mu, sd_W, prior_update, seed=0, n_rounds=40, **options):
    data = make_federated_ppca(
        6, 150, (15, 8, 10), 5, sd_mu=sd_mu, sd_W=sd_W, sigma2_alpha=3.0, sigma2_beta=2.0, random_state=seed
    )
    model = FedMVPPCA(n_components=5, n_rounds=n_rounds, random_state=seed, prior_update=prior_update, **options).fit(data.sites)
    g = model.global_params_
    return np.array([np.sqrt(g[v]["sigma2_mu"]) for v in g]), np.array([np.sqrt(g[v]["sigma2_W"]) for v in g])


def test_em_update_recovers_the_between_site_sds_where_the_paper_update_shrinks_them():
    sd_mu, sd_W = _fitted_sds(0.5, 0.2, "em")
    np.testing.assert_allclose(sd_mu, 0.5, rtol=0.25)
    np.testing.assert_allclose(sd_W, 0.2, rtol=0.25)
    paper_mu, paper_W = _fitted_sds(0.5, 0.2, "paper", n_rounds=25, tol=None)  # the paper's fixed rounds
    assert np.all(paper_mu < 0.8 * 0.5) and np.min(paper_W) < 0.5 * 0.2


def test_em_update_recovers_the_spread_of_unit_scale_loadings_on_a_drawn_design():
    """A design of the benchmark's family (benchmarks/bench_hierarchy.py): unit-scale global loadings,
    views of 5, 40 and 100 features, 6 sites of 20 to 300 subjects.  Without the latent scale step and
    the Newton step the fitted sd(W~) was 0.79-0.82 of the truth here."""
    rng = np.random.default_rng(0)
    n = [int(v) for v in rng.integers(20, 301, 6)]
    data = make_federated_ppca(
        6, n, (5, 40, 100), 3, sd_mu=0.5, sd_W=0.2, sigma2_alpha=3.0, sigma2_beta=2.0, global_sd=(2.0, 1.0),
        random_state=0,
    )
    g = FedMVPPCA(n_components=3, n_rounds=100, random_state=0).fit(data.sites).global_params_
    np.testing.assert_allclose([np.sqrt(g[v]["sigma2_W"]) for v in g], 0.2, rtol=0.1)
    np.testing.assert_allclose([np.sqrt(g[v]["sigma2_mu"]) for v in g], 0.5, rtol=0.15)
    # the loadings' scale: W~ W~^T against the truth's (rotation-free), stacked over views
    fitted = np.vstack([g[v]["W"] for v in g])
    true = np.vstack([data.global_params[v].W for v in g])
    ratio = np.linalg.eigvalsh(fitted.T @ fitted) / np.linalg.eigvalsh(true.T @ true)
    np.testing.assert_allclose(ratio, 1.0, rtol=0.15)


def test_em_update_gives_small_sds_for_identical_sites():
    # the EM approaches 0 slowly (a variance at its boundary); the default stopping rule, which watches the
    # predictions, ends it well below the 0.2 of the heterogeneous sites above
    sd_mu, sd_W = _fitted_sds(0.0, 0.0, "em")
    assert np.all(sd_mu < 0.15) and np.all(sd_W < 0.1)


def test_protocol_declares_and_sends_the_spread_only_with_the_em_update():
    from fedhier.data.schema import ViewSchema
    from fedhier.protocol.base import SiteContext
    from fedhier.protocol.mvppca import MVPPCAProtocol

    rng = np.random.default_rng(6)
    schema = ViewSchema(("a", "b"), (5, 4))
    data = {"a": rng.normal(size=(40, 5)), "b": rng.normal(size=(40, 4))}
    em, paper = MVPPCAProtocol(schema, 2, column_variances=True), MVPPCAProtocol(schema, 2, prior_update="paper")
    added = set(em.reply_spec.fields) - set(paper.reply_spec.fields)
    per_view = {f"{v}/{f}" for v in ("a", "b") for f in ("sum_post_var_mu", "sum_post_var_W")}
    per_column = {f"{v}/{f}" for v in ("a", "b") for f in ("sum_sq_W_columns", "sum_post_var_W_columns")}
    assert added == per_view | per_column | {"latent_moment", "latent_count"}
    assert all(em.reply_spec.fields[name].shape == () and em.reply_spec.fields[name].optional for name in per_view)
    assert all(em.reply_spec.fields[name].shape == (2,) and em.reply_spec.fields[name].optional for name in per_column)
    assert em.reply_spec.fields["latent_moment"].shape == (2, 2) and em.reply_spec.fields["latent_count"].shape == ()
    reply = em.site_step(SiteContext(site=0, round=1, rng=np.random.default_rng(0), data=data, state={}), em.initial_broadcast())
    em.reply_spec.validate(reply)
    # round 1: the sampling variance of the maximum-likelihood estimates, the site's own fit re-run
    fit_params = {v: ViewParams(mu=data[v].mean(axis=0), W=np.zeros((data[v].shape[1], 2)), sigma2=1.0) for v in data}
    flat = posterior_spread(data, fit_params, None)
    assert flat["a"][0] == pytest.approx(5 * 1.0 / 40)  # tr(C) / N with W = 0, sigma2 = 1
    assert reply["a/sum_post_var_mu"] > 0 and reply["b/sum_post_var_W"] > 0
    with pytest.raises(ValueError, match="prior_update"):
        MVPPCAProtocol(schema, 2, prior_update="reml")


def test_score_n_components_finds_the_latent_dimension_of_data_from_the_model():
    data = make_federated_ppca(3, 90, (7, 6, 5), 2, sd_mu=0.1, sd_W=0.05, sigma2_alpha=5.0, sigma2_beta=1.0, random_state=7)
    kw = dict(n_rounds=8, n_local_iter=5, n_first_iter=20)
    result = FedMVPPCA.score_n_components(data.sites, [1, 2, 3, 4], random_state=0, **kw)
    assert result.best == 2 and result.criterion == "heldout"
    assert result.scores[1] > result.scores[0] + 1.0  # the second component predicts the other views
    assert np.all(np.abs(result.scores[2:] - result.scores[1]) < 0.2 * (result.scores[1] - result.scores[0]))
    with pytest.raises(ValueError, match="criterion"):
        FedMVPPCA.score_n_components(data.sites, [1, 2], criterion="bic")


def _kron_posterior(second_moment, sigma2, column_vars, d):
    """Brute force: the Hessian of -ln p(vec W | latent moments) over all d q loadings at once,
    (S_xx kron I_d) / sigma2 + diag(1 / sigma2_Wi) kron I_d (vec stacks the columns)."""
    return np.kron(second_moment, np.eye(d)) / sigma2 + np.kron(np.diag(1.0 / column_vars), np.eye(d))


def test_column_spread_and_loading_step_solve_the_per_column_prior_by_brute_force():
    rng = np.random.default_rng(11)
    d, q, s2 = 4, 3, 0.6
    X = rng.normal(size=(9, q))
    Sxx = X.T @ X + 9 * 0.1 * np.eye(q)
    column_vars = np.array([0.5, 0.02, 3.0])
    hessian = _kron_posterior(Sxx, s2, column_vars, d)
    cov = np.linalg.inv(hessian)
    per_column = [np.trace(cov[i * d:(i + 1) * d, i * d:(i + 1) * d]) for i in range(q)]
    np.testing.assert_allclose(loading_spread(Sxx, s2, d, s2 / column_vars), per_column, rtol=1e-10)
    # the MAP of step (3): the minimiser of the penalised least squares, vec W = H^{-1} vec(cross / s2 + W~ / sigma2_Wi)
    cross, prior_W = rng.normal(size=(d, q)), rng.normal(size=(d, q))
    direct = np.linalg.solve(hessian, (cross / s2 + prior_W / column_vars).ravel(order="F")).reshape((d, q), order="F")
    np.testing.assert_allclose(loading_step(cross, Sxx, s2 / column_vars, prior_W, q), direct, rtol=1e-10)


def test_signal_columns_share_the_em_update_and_a_column_without_signal_has_its_own():
    """Columns 0 and 1 carry signal and differ between sites by different amounts, column 2 carries none:
    columns 0 and 1 get the EM step of their summed spread over 2 d coordinates, column 2 that of its own
    d, each by [sum_c ||w_ci - w~_i||^2 + (1 - 1/C) sum_c tr Cov(w_ci) + d v_i] / (C D) summed over the
    group's columns, D its coordinates (no rotation: W~ = 0 before; the plain step, as under privacy, has no
    prior on the sds)."""
    rng = np.random.default_rng(12)
    C, d, q, n = 5, 6, 3, 100.0
    signal = rng.normal(scale=3.0, size=(d, 2))  # large loadings: the cap sigma2_W~ <= ||W~||_F / 5 stays far
    sites = [{"v": ViewParams(mu=rng.normal(size=d), W=np.column_stack([
        signal[:, 0] + rng.normal(size=d), signal[:, 1] + 0.1 * rng.normal(size=d), 0.01 * rng.normal(size=d)]),
        sigma2=0.5)} for _ in range(C)]
    traces = [rng.uniform(0.01, 0.05, size=q) for _ in range(C)]
    used = np.array([0.2, 0.1, 0.01])
    previous = {"v": GlobalView(mu=np.zeros(d), W=np.zeros((d, q)), sigma2_mu=1.0, sigma2_W=0.1, alpha=3.0, beta=1.0,
                                noise_var=0.5, var_sigma=1.0, sigma2_W_columns=used)}
    stats = [site_statistics(p, None, {"v": (0.1, t)}) for p, t in zip(sites, traces)]
    summed = {"v": {k: sum(s["v"][k] for s in stats) for k in stats[0]["v"]}}
    g = global_step(summed, anchor=None, n_components=q, previous=previous, prior_update="em", newton=False,
                    n_subjects=n)[0]["v"]
    Ws = np.stack([p["v"].W for p in sites])
    spread = np.sum((Ws - Ws.mean(axis=0)) ** 2, axis=(0, 1))
    terms = spread + (1 - 1 / C) * np.sum(traces, axis=0) + d * used
    shared = terms[:2].sum() / (C * 2 * d)
    np.testing.assert_allclose(g.sigma2_W_columns, [shared, shared, terms[2] / (C * d)], rtol=1e-10)
    norms = np.sum(g.W**2, axis=0)
    assert g.sigma2_W == pytest.approx(norms @ g.sigma2_W_columns / norms.sum(), rel=1e-10)


def test_column_groups_split_off_the_columns_of_a_pure_noise_fit():
    """The maximum-likelihood PPCA of noise of variance 1 plus one planted direction (Tipping & Bishop's
    closed form, W = U_q (Lambda_q - sigma2_ML I)^{1/2}): the planted column is signal, the q - 1 columns
    the noise gives fall below the Marchenko-Pastur edge of noise variance 1, each a group of its own."""
    rng = np.random.default_rng(14)
    n, d, q = 60, 30, 4
    direction = rng.normal(size=d)
    X = rng.normal(size=(n, d)) + rng.normal(size=(n, 1)) * direction
    eig, U = np.linalg.eigh(np.cov(X.T, bias=True))
    eig, U = eig[::-1], U[:, ::-1]
    sigma2 = eig[q:].mean()
    W = U[:, :q] * np.sqrt(eig[:q] - sigma2)
    np.testing.assert_array_equal(column_groups(W, 1.0, n), np.eye(q))
    assert np.sum(W[:, 0] ** 2) > 10 * ((1 + np.sqrt(d / n)) ** 2 - 1)
    np.testing.assert_array_equal(column_groups(W, 1.0, 10 * n)[0], [1, 1, 1, 1])  # more subjects: a lower edge
    np.testing.assert_array_equal(column_groups(W, 1.0, None), np.ones((1, q)))  # no n: every column signal


def test_accelerated_step_reaches_the_reml_estimate_where_the_spread_is_far_below_the_sampling_error():
    """Fraction of missing information 0.97 (a spread of sd 0.03 seen through sampling sd 0.2, as at
    20-subject sites): within 10 rounds the step is at the REML estimate of the balanced model."""
    rng = np.random.default_rng(13)
    C, D, a = 8, 300, 0.04
    y = rng.normal(scale=0.03, size=(C, D)) + rng.normal(scale=np.sqrt(a), size=(C, D))
    ybar = y.mean(axis=0)
    reml = np.sum((y - ybar) ** 2) / ((C - 1) * D) - a
    assert 0 < reml < 0.1 * a
    v = np.sum((y - ybar) ** 2) / ((C - 1) * D)
    for _ in range(10):
        m = ybar + v / (v + a) * (y - ybar)
        v = _em_variance(np.sum((m - m.mean(axis=0)) ** 2), C * D * v * a / (v + a), v, C, D)
    assert v == pytest.approx(_penalised_reml(y, a), rel=1e-3)


def test_em_update_recovers_the_spread_of_the_loadings_with_two_components_too_many():
    """The drawn design above fitted with q = 5 for a true q = 3 (the default fit): the two extra columns
    carry no signal and their own variances fall below the signal columns'; the summary sd(W~), which
    weighs each column's variance by its squared norm, stays at the truth.  With one variance shared by
    all columns (``column_variances=False``) the two columns pull it below 0.9 of the truth."""
    rng = np.random.default_rng(0)
    n = [int(v) for v in rng.integers(20, 301, 6)]
    data = make_federated_ppca(
        6, n, (5, 40, 100), 3, sd_mu=0.5, sd_W=0.2, sigma2_alpha=3.0, sigma2_beta=2.0, global_sd=(2.0, 1.0),
        random_state=0,
    )
    g = FedMVPPCA(n_components=5, n_rounds=100, random_state=0).fit(data.sites).global_params_
    np.testing.assert_allclose([np.sqrt(g[v]["sigma2_W"]) for v in g], 0.2, rtol=0.15)
    tied = FedMVPPCA(n_components=5, n_rounds=100, random_state=0, column_variances=False).fit(data.sites).global_params_
    assert np.median([np.sqrt(tied[v]["sigma2_W"]) for v in tied]) < 0.9 * 0.2
    for v in ("view2", "view3"):  # 40 and 100 features: the signal columns are the three largest
        norms = np.sum(g[v]["W"] ** 2, axis=0)
        order = np.argsort(norms)
        assert np.sum(norms[order[:2]]) < 0.01 * np.sum(norms)
        assert np.max(g[v]["sigma2_W_columns"][order[:2]]) < 0.1 * np.min(g[v]["sigma2_W_columns"][order[2:]])


def test_the_shape_of_the_loadings_is_set_after_round_two_where_round_one_cancels_a_column():
    """Two components of nearly equal size (a design of benchmarks/bench_hierarchy.py, 12 sites of 49
    subjects, views of 171, 29 and 293 features): each site's round-1 fit turns them freely within their
    plane, so the average of round 1 nearly cancels the second column.  Folding only the latents' scale
    then doubled the first column for good and the loadings grew round after round (sd(W~) 1.5 times the
    truth at round 100, W~'s squared norms 3 to 9 times the truth's); folding the whole second moment after
    round 2 gives each column its size."""
    data = make_federated_ppca(
        12, [49] * 12, (171, 29, 293), 2, sd_mu=0.873, sd_W=0.227, sigma2_alpha=3.0, sigma2_beta=2.0,
        global_sd=(2.0, 1.0), random_state=28,
    )
    model = FedMVPPCA(n_components=2, n_rounds=30, random_state=28).fit(data.sites)
    g = model.global_params_
    realised = [np.std(np.stack([p[v].W for p in data.site_params]), axis=0, ddof=1) for v in g]
    realised = np.sqrt([np.mean(r**2) for r in realised])
    np.testing.assert_allclose([np.sqrt(g[v]["sigma2_W"]) for v in g], realised, rtol=0.15)
    fitted = np.vstack([g[v]["W"] for v in g])
    true = np.vstack([data.global_params[v].W for v in g])
    ratio = np.linalg.eigvalsh(fitted.T @ fitted) / np.linalg.eigvalsh(true.T @ true)
    np.testing.assert_allclose(ratio, 1.0, rtol=0.25)


def test_history_records_the_extreme_eigenvalues_of_the_latents_pooled_second_moment():
    from fedhier.data.schema import ViewSchema
    from fedhier.protocol.mvppca import MVPPCAProtocol

    rng = np.random.default_rng(12)
    protocol = MVPPCAProtocol(ViewSchema(("a",), (4,)), 3)
    A = rng.normal(size=(3, 3))
    combined = {"expected_ll": np.asarray(-1.0), "safeguards": np.asarray(0.0),
                "latent_moment": 40.0 * (A @ A.T + np.eye(3)), "latent_count": np.asarray(40.0)}
    metrics = protocol.round_metrics(combined, 2)
    eig = np.linalg.eigvalsh(A @ A.T + np.eye(3))
    assert metrics["latent_moment_min"] == pytest.approx(eig[0]) and metrics["latent_moment_max"] == pytest.approx(eig[-1])
    paper = MVPPCAProtocol(ViewSchema(("a",), (4,)), 3, prior_update="paper")
    assert "latent_moment_min" not in paper.round_metrics({"expected_ll": np.asarray(-1.0), "safeguards": np.asarray(0.0)}, 2)


def test_the_loadings_hold_still_when_the_sites_count_their_uncertainty_and_drift_when_they_do_not():
    """A design of benchmarks/bench_hierarchy.py (design 12: 12 sites of 49 subjects, views of 391, 12 and 11
    features, q = 2) run on without the stopping rule.  A site's loadings, 391 x 2 from 49 subjects, are
    uncertain; the paper's MAP-EM takes them as known, the latents absorb what they cannot show, and round after
    round one column of W~ grows and the other shrinks.  With the expectation over the loadings' posterior the
    columns hold their sizes and the latents' pooled second moment stays near I."""
    data = make_federated_ppca(
        12, [49] * 12, (391, 12, 11), 2, sd_mu=0.130, sd_W=0.173, sigma2_alpha=3.0, sigma2_beta=2.0,
        global_sd=(2.0, 1.0), random_state=12,
    )
    true = np.sort(np.sum(data.global_params["view1"].W ** 2, axis=0))
    for uncertainty in (True, False):
        norms, eigenvalues = [], []

        def keep(record, broadcast):
            norms.append(np.sort(np.sum(np.asarray(broadcast["view1/W"]) ** 2, axis=0)))
            eigenvalues.append((record.metrics["latent_moment_min"], record.metrics["latent_moment_max"]))

        FedMVPPCA(n_components=2, n_rounds=30, tol=None, random_state=12,
                  loading_uncertainty=uncertainty).fit(data.sites, callbacks=[keep])
        growth = norms[29] / norms[9]  # the columns' squared norms, round 30 over round 10
        if uncertainty:
            np.testing.assert_allclose(growth, 1.0, atol=0.02)
            np.testing.assert_allclose(norms[29], true, rtol=0.1)
            assert 0.9 < min(eigenvalues[29]) and max(eigenvalues[29]) < 1.1
        else:  # the paper's MAP-EM: the larger column grows by a third, the smaller shrinks
            assert growth[1] > 1.3 and growth[0] < 0.9
