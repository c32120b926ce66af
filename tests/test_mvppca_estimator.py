"""FedMVPPCA end to end: federated vs centralised, determinism, missing views, persistence."""

import warnings

import numpy as np
import pytest

from fedhier import FedMVPPCA
from fedhier.estimators.mvppca import DataScaleWarning, NotFittedError


def draw_model(dims, q, rng):
    return {
        f"v{k}": (rng.normal(size=d) * 2, rng.normal(size=(d, q)), float(s2))
        for k, (d, s2) in enumerate(zip(dims, [0.3, 0.8, 0.5, 1.0][: len(dims)]))
    }


def draw_views(model, n, rng):
    q = next(iter(model.values()))[1].shape[1]
    x = rng.normal(size=(n, q))
    return {v: x @ W.T + mu + np.sqrt(s2) * rng.normal(size=(n, len(mu))) for v, (mu, W, s2) in model.items()}


@pytest.fixture(scope="module")
def iid_problem():
    rng = np.random.default_rng(42)
    model = draw_model((12, 8, 6), 3, rng)
    sites = [draw_views(model, 150, rng) for _ in range(3)]
    test = draw_views(model, 400, rng)
    return sites, test


def test_federated_held_out_likelihood_within_one_percent_of_centralised(iid_problem):
    sites, test = iid_problem
    pooled = {v: np.vstack([s[v] for s in sites]) for v in sites[0]}
    central = FedMVPPCA(n_components=3, n_rounds=1, n_first_iter=800, sigma2_prior=None, random_state=0).fit([pooled])
    fed = FedMVPPCA(n_components=3, n_rounds=30, random_state=0).fit(sites)
    ll_central, ll_fed = central.score(test), fed.score(test)
    assert abs(ll_fed - ll_central) <= 0.01 * abs(ll_central), (ll_fed, ll_central)


def test_same_seed_bit_identical_with_and_without_process_pool(iid_problem):
    sites, _ = iid_problem
    kw = dict(n_components=3, n_rounds=4, n_local_iter=5, n_first_iter=10, random_state=3)
    a = FedMVPPCA(**kw).fit(sites).global_params_
    b = FedMVPPCA(**kw).fit(sites).global_params_
    c = FedMVPPCA(n_jobs=2, **kw).fit(sites).global_params_
    for view in a:
        for name in ("mu", "W", "sigma2_mu", "sigma2_W", "alpha", "beta", "noise_var"):
            va, vb, vc = (np.asarray(p[view][name]) for p in (a, b, c))
            assert va.tobytes() == vb.tobytes() == vc.tobytes(), (view, name)
    d = FedMVPPCA(**{**kw, "random_state": 4}).fit(sites).global_params_
    assert np.asarray(a["v0"]["W"]).tobytes() != np.asarray(d["v0"]["W"]).tobytes()


def test_missing_views_history_and_per_view_participation(iid_problem):
    sites, test = iid_problem
    sites = [sites[0], {k: v for k, v in sites[1].items() if k != "v1"}, {k: v for k, v in sites[2].items() if k != "v2"}]
    m = FedMVPPCA(n_components=3, n_rounds=5, n_local_iter=5, n_first_iter=10, random_state=0).fit(sites)
    assert len(m.history_) == 5
    h = m.history_[-1]
    assert h["sites"] == [0, 1, 2]
    assert h["metrics"]["v0/sites"] == 3 and h["metrics"]["v1/sites"] == 2 and h["metrics"]["v2/sites"] == 2
    # site 1 lacks a view: it sends fewer bytes
    assert h["bytes_up"]["1"] < h["bytes_up"]["0"]
    assert set(m.global_params_) == {"v0", "v1", "v2"}
    # any subset of views can be projected, imputed and scored
    only_v0 = {"v0": test["v0"]}
    assert m.transform(only_v0).shape == (400, 3)
    imputed = m.impute(only_v0)
    assert set(imputed) == {"v0", "v1", "v2"} and imputed["v2"].shape == (400, 6)
    assert m.score_samples(test).shape == (400,)


def test_partial_participation_round_uses_only_replying_sites(iid_problem):
    sites, _ = iid_problem
    m = FedMVPPCA(n_components=3, n_rounds=3, n_local_iter=3, n_first_iter=5, random_state=0, participation={2: [0]}).fit(sites)
    assert m.history_[1]["sites"] == [1, 2] and m.history_[1]["absent"] == [0]
    assert m.history_[1]["metrics"]["v0/sites"] == 2


def test_save_load_round_trip(tmp_path, iid_problem):
    sites, test = iid_problem
    m = FedMVPPCA(n_components=3, n_rounds=3, n_local_iter=3, n_first_iter=5, random_state=0).fit(sites)
    path = m.save(tmp_path / "model.npz")
    back = FedMVPPCA.load(path)
    np.testing.assert_array_equal(back.transform(test), m.transform(test))
    assert back.history_ == m.history_
    with np.load(path, allow_pickle=False) as data:  # no pickled object inside
        assert all(data[k].dtype != object for k in data.files)


def test_errors_before_any_work(iid_problem):
    sites, test = iid_problem
    with pytest.raises(NotFittedError):
        FedMVPPCA().transform(test)
    with pytest.raises(ValueError, match="n_components"):
        FedMVPPCA(n_components=0).fit(sites)
    with pytest.raises(ValueError, match="v0"):
        FedMVPPCA(n_components=12, n_rounds=1).fit(sites)  # the largest view, v0, has 12 features
    bad = [dict(sites[0]), sites[1]]
    bad[0]["v1"] = bad[0]["v1"][:, :5]
    with pytest.raises(ValueError, match="v1"):
        FedMVPPCA(n_components=3, n_rounds=1).fit(bad)
    m = FedMVPPCA(n_components=3, n_rounds=1, n_first_iter=3, random_state=0).fit(sites)
    with pytest.raises(ValueError, match="unknown"):
        m.transform({"nope": test["v0"]})
    for seed in (-1, 1.5, np.random.default_rng(0)):
        with pytest.raises(ValueError, match="random_state must be None or a non-negative integer seed"):
            FedMVPPCA(n_components=3, random_state=seed).fit(sites)
    with pytest.raises(ValueError, match="n_samples must be a positive integer"):
        m.sample(2.5)


def test_score_averages_over_the_subjects_that_have_a_view(iid_problem, tmp_path):
    sites, test = iid_problem
    m = FedMVPPCA(n_components=np.int64(3), n_rounds=np.int64(2), n_first_iter=3, random_state=np.int64(0)).fit(sites)
    half = {v: np.where(np.arange(len(X))[:, None] % 2 == 0, X, np.nan) for v, X in test.items()}  # odd rows: no view
    assert m.score(half) == pytest.approx(m.score({v: X[::2] for v, X in test.items()}), rel=1e-12)
    assert np.all(m.score_samples(half)[1::2] == 0.0)
    # hyper-parameters given as numpy scalars are saved as the numbers they hold
    back = FedMVPPCA.load(m.save(tmp_path / "m.npz"))
    assert (back.n_components, back.random_state) == (3, 0) and type(back.n_components) is int


def test_interrupted_fit_resumes_from_its_checkpoint(tmp_path, iid_problem):
    sites, _ = iid_problem
    kw = dict(n_components=3, n_local_iter=3, n_first_iter=5, random_state=1)
    full = FedMVPPCA(n_rounds=4, **kw).fit(sites)
    path = tmp_path / "fit.ckpt.npz"
    FedMVPPCA(n_rounds=2, **kw).fit(sites, checkpoint=path)
    resumed = FedMVPPCA(n_rounds=4, **kw).fit(sites, checkpoint=path)
    assert np.asarray(resumed.global_params_["v1"]["W"]).tobytes() == np.asarray(full.global_params_["v1"]["W"]).tobytes()
    assert [h["round"] for h in resumed.history_] == [1, 2, 3, 4]
    # the history too, with the metrics the estimator adds after each round (global sds, rel_change)
    timeless = [[{k: v for k, v in h.items() if k != "seconds"} for h in m.history_] for m in (resumed, full)]
    assert timeless[0] == timeless[1]
    assert "v1/sd_W" in resumed.history_[1]["metrics"] and "rel_change" in resumed.history_[2]["metrics"]


@pytest.mark.parametrize("interrupted_after", [5, 6])
def test_a_resumed_fit_extrapolates_as_the_uninterrupted_one(tmp_path, iid_problem, interrupted_after):
    """The coordinator's extrapolation across rounds is part of the checkpoint: a fit interrupted in the middle of
    an extrapolation cycle resumes to the bytes of the uninterrupted fit."""
    from fedhier.runtime.checkpoint import read_checkpoint

    sites, _ = iid_problem
    kw = dict(n_components=3, n_local_iter=3, n_first_iter=5, random_state=1, tol=None)
    full = FedMVPPCA(n_rounds=12, **kw).fit(sites)
    path = tmp_path / "fit.ckpt.npz"
    FedMVPPCA(n_rounds=interrupted_after, **kw).fit(sites, checkpoint=path)
    assert any(k.startswith("first/") for k in read_checkpoint(path).coordinator)  # a cycle was under way
    resumed = FedMVPPCA(n_rounds=12, **kw).fit(sites, checkpoint=path)
    for view in ("v1", "v2"):
        assert np.asarray(resumed.global_params_[view]["W"]).tobytes() == np.asarray(full.global_params_[view]["W"]).tobytes()
    with pytest.raises(ValueError, match="setting acceleration"):
        FedMVPPCA(n_rounds=12, acceleration=None, **kw).fit(sites, checkpoint=path)
    # the file is untrusted: an extrapolation state of the wrong shape is refused, not used
    FedMVPPCA(n_rounds=interrupted_after, **kw).fit(sites, checkpoint=(damaged := tmp_path / "damaged.npz"))
    with np.load(damaged, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["coordinator/first/v1/W"] = arrays["coordinator/first/v1/W"][:, :2]
    np.savez(damaged, **arrays)
    with pytest.raises(ValueError, match="extrapolation state does not fit"):
        FedMVPPCA(n_rounds=12, **kw).fit(sites, checkpoint=damaged)


def _theta_change(old, new):
    """max over views and blocks of ||new - old|| / ||old||, straight from two broadcasts."""
    keys = [k for k in new if k.rpartition("/")[2] in ("mu", "W", "sigma2_mu", "sigma2_W", "alpha", "beta")]
    return max(np.linalg.norm(new[k] - old[k]) / np.linalg.norm(old[k]) for k in keys)


def _model_change(old, new, views, q):
    """sqrt of the symmetrised KL between the new-site predictive N(m, W W^T + D) of two broadcasts, d x d matrices formed;
    D = s-bar + sigma2_mu~ + q sigma2_W~ per view (every view here has d_k > q)."""
    def moments(b):
        W = np.vstack([b[f"{v}/W"] for v in views])
        diag = np.concatenate([
            np.full(b[f"{v}/mu"].size, float(b[f"{v}/noise_var"] + b[f"{v}/sigma2_mu"] + q * b[f"{v}/sigma2_W"])) for v in views
        ])
        return np.concatenate([b[f"{v}/mu"] for v in views]), W @ W.T + np.diag(diag)

    def kl(a, b):
        (m0, C0), (m1, C1) = a, b
        inv = np.linalg.inv(C1)
        return 0.5 * (np.trace(inv @ C0) - m0.size + (m1 - m0) @ inv @ (m1 - m0) + np.linalg.slogdet(C1)[1] - np.linalg.slogdet(C0)[1])

    a, b = moments(old), moments(new)
    return np.sqrt(kl(a, b) + kl(b, a))


def test_tol_stops_after_the_first_round_whose_change_of_the_model_is_below_it(tmp_path):
    rng = np.random.default_rng(3)
    model = draw_model((6, 5), 2, rng)
    sites = [draw_views(model, 80, rng)]  # one site: the spreads are fixed, theta~ settles
    kw = dict(n_components=2, n_local_iter=2, n_first_iter=3, random_state=5)
    broadcasts = []
    full = FedMVPPCA(n_rounds=12, tol=None, **kw).fit(sites, callbacks=[lambda rec, b: broadcasts.append(dict(b))])
    theta = [_theta_change(a, b) for a, b in zip(broadcasts, broadcasts[1:])]  # rounds 2..12
    np.testing.assert_allclose([h["metrics"]["rel_change"] for h in full.history_[1:]], theta, rtol=1e-12)
    change = [_model_change(a, b, ("v0", "v1"), 2) for a, b in zip(broadcasts, broadcasts[1:])]
    np.testing.assert_allclose([h["metrics"]["model_change"] for h in full.history_[1:]], change, rtol=1e-5)
    assert "model_change" not in full.history_[0]["metrics"] and full.n_rounds_ == 12
    change = [h["metrics"]["model_change"] for h in full.history_[1:]]
    tol = float(np.median(change))
    stop = 2 + int(np.flatnonzero(np.array(change) < tol)[0])
    assert 2 < stop < 12
    early = FedMVPPCA(n_rounds=12, tol=tol, **kw).fit(sites)
    assert early.n_rounds_ == stop == len(early.history_)
    same = FedMVPPCA(n_rounds=stop, tol=None, **kw).fit(sites)
    assert np.asarray(early.global_params_["v0"]["W"]).tobytes() == np.asarray(same.global_params_["v0"]["W"]).tobytes()
    # interrupted before the stop and resumed: the same stop; resuming the stopped fit runs no round
    path = tmp_path / "fit.ckpt.npz"
    FedMVPPCA(n_rounds=stop - 1, tol=tol, **kw).fit(sites, checkpoint=path)
    resumed = FedMVPPCA(n_rounds=12, tol=tol, **kw).fit(sites, checkpoint=path)
    again = FedMVPPCA(n_rounds=12, tol=tol, **kw).fit(sites, checkpoint=path)
    for m in (resumed, again):
        assert m.n_rounds_ == stop
        assert np.asarray(m.global_params_["v0"]["W"]).tobytes() == np.asarray(early.global_params_["v0"]["W"]).tobytes()
    back = FedMVPPCA.load(early.save(tmp_path / "model.npz"))
    assert (back.tol, back.n_rounds_) == (tol, stop)


@pytest.mark.parametrize("tol", [0, -1e-6, float("inf"), float("nan"), True, "1e-6"])
def test_tol_must_be_a_positive_number(iid_problem, tol):
    with pytest.raises(ValueError, match="tol must be None or a positive number"):
        FedMVPPCA(n_components=3, tol=tol).fit(iid_problem[0])


@pytest.mark.parametrize("name", ["noise_dof", "loading_uncertainty"])
@pytest.mark.parametrize("flag", [1, "yes", None])
def test_switches_must_be_true_or_false(iid_problem, name, flag):
    with pytest.raises(ValueError, match=f"{name} must be True or False"):
        FedMVPPCA(n_components=3, **{name: flag}).fit(iid_problem[0])


def test_the_paper_site_step_survives_save_and_load(tmp_path, iid_problem):
    sites, test = iid_problem
    paper = FedMVPPCA(n_components=3, n_rounds=3, random_state=0, loading_uncertainty=False).fit(sites)
    back = FedMVPPCA.load(paper.save(tmp_path / "model.npz"))
    assert back.loading_uncertainty is False
    np.testing.assert_array_equal(back.transform(test), paper.transform(test))


def test_noise_dof_raises_the_sites_noise_variances_and_survives_save_and_load(tmp_path, iid_problem):
    sites, test = iid_problem
    kw = dict(n_components=3, n_rounds=3, random_state=0)
    paper, dof = FedMVPPCA(**kw).fit(sites), FedMVPPCA(noise_dof=True, **kw).fit(sites)
    # the sites' mean noise variance, per view: the residual divided by fewer degrees of freedom
    for view in paper.global_params_:
        assert dof.global_params_[view]["noise_var"] > paper.global_params_[view]["noise_var"]
    back = FedMVPPCA.load(dof.save(tmp_path / "model.npz"))
    assert back.noise_dof is True
    np.testing.assert_array_equal(back.transform(test), dof.transform(test))


def test_n_init_keeps_the_start_with_the_highest_final_expected_log_likelihood():
    # sites holding different groups (latent means apart), where the fit depends on the start
    rng = np.random.default_rng(7)
    model = draw_model((10, 6, 8), 3, rng)
    shift = 4.0 * rng.normal(size=3)
    sites = []
    for offset in (0.0, 1.0, -1.0):
        views = draw_views({v: (mu + W @ (offset * shift), W, s2) for v, (mu, W, s2) in model.items()}, 60, rng)
        sites.append(views)
    kw = dict(n_components=3, n_rounds=5, n_local_iter=4, n_first_iter=8)
    best = FedMVPPCA(n_init=3, random_state=12, **kw).fit(sites)
    assert best.init_seeds_[0] == 12 and len(set(best.init_seeds_)) == 3
    # each start refitted on its own (n_init=1) gives the recorded score; the kept model is the best one
    singles = [FedMVPPCA(random_state=seed, **kw).fit(sites) for seed in best.init_seeds_]
    scores = [s.history_[-1]["expected_ll"] for s in singles]
    np.testing.assert_array_equal(best.init_scores_, scores)
    assert len(set(scores)) == 3
    assert int(np.argmax(scores)) == 1  # neither the first nor the last start
    kept = singles[1]
    assert best.seed_ == kept.seed_
    timeless = [[{k: v for k, v in h.items() if k != "seconds"} for h in m.history_] for m in (best, kept)]
    assert timeless[0] == timeless[1]
    for view in kept.global_params_:
        assert np.asarray(best.global_params_[view]["W"]).tobytes() == np.asarray(kept.global_params_[view]["W"]).tobytes()


def test_n_init_errors_before_any_work(tmp_path, iid_problem):
    from fedhier.models.mvppca.dp import DPConfig

    sites, _ = iid_problem
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="n_init"):
            FedMVPPCA(n_init=bad).fit(sites)
    dp = DPConfig.per_release(10.0, 0.01)
    for kw, fit_kw in (({"privacy": dp}, {}), ({"participation": {2: [0]}}, {}), ({}, {"checkpoint": tmp_path / "c.npz"})):
        with pytest.raises(ValueError, match="n_init > 1 cannot be combined"):
            FedMVPPCA(n_components=3, n_init=2, **kw).fit(sites, **fit_kw)
    assert not (tmp_path / "c.npz").exists()


def test_data_far_below_unit_scale_warn_where_the_weak_prior_makes_the_fit_useless(example):
    data_scale = example("mvppca_data_scale")  # the data and error measure of examples/mvppca_data_scale.py
    sites = data_scale.make_sites(0.02)
    with pytest.warns(DataScaleWarning, match=r"site \d, view 'v\d': the round-1 IG\(2.25, 0.625\) prior") as caught:
        weak = FedMVPPCA(n_components=2, n_rounds=20, random_state=0).fit(sites)
    assert sum(issubclass(w.category, DataScaleWarning) for w in caught) == 9  # every view at every site
    assert data_scale.relative_imputation_error(weak, sites[0]) > 0.9  # no better than the mean
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataScaleWarning)
        plain = FedMVPPCA(n_components=2, n_rounds=20, sigma2_prior=None, random_state=0).fit(sites)
        assert data_scale.relative_imputation_error(plain, sites[0]) < 0.3
        unit = [{v: X / 0.02 for v, X in site.items()} for site in sites]  # the same data on a unit scale
        scaled = FedMVPPCA(n_components=2, n_rounds=20, random_state=0).fit(unit)
        assert data_scale.relative_imputation_error(scaled, unit[0]) < 0.3


def test_dataframe_columns_are_remembered_and_checked_at_prediction(iid_problem, tmp_path):
    pd = pytest.importorskip("pandas")
    sites, test = iid_problem
    frame = lambda X, prefix: pd.DataFrame(X, columns=[f"{prefix}{j}" for j in range(X.shape[1])])  # noqa: E731
    framed = [{v: frame(X, v) for v, X in site.items()} for site in sites]
    m = FedMVPPCA(n_components=3, n_rounds=2, n_first_iter=3, random_state=0).fit(framed)
    assert m.feature_names_in_["v1"] == tuple(f"v1{j}" for j in range(8))
    same = {v: frame(X, v) for v, X in test.items()}
    np.testing.assert_array_equal(m.transform(same), m.transform(test))  # arrays carry no names: accepted
    swapped = dict(same, v1=same["v1"][same["v1"].columns[::-1]])
    with pytest.raises(ValueError, match=r"X, view 'v1': columns \['v17', .* differ from those seen in fit"):
        m.transform(swapped)
    back = FedMVPPCA.load(m.save(tmp_path / "m.npz"))
    with pytest.raises(ValueError, match="differ from those seen in fit"):
        back.impute(swapped)
    # two sites naming a view's columns differently are refused before any work
    framed[1]["v2"] = framed[1]["v2"][framed[1]["v2"].columns[::-1]]
    with pytest.raises(ValueError, match=r"site 1, view 'v2': columns .* differ from those of site 0"):
        FedMVPPCA(n_components=3, n_rounds=1).fit(framed)


def test_data_far_above_unit_scale_warn_where_the_cap_on_the_loadings_variance_binds(example):
    data_scale = example("mvppca_data_scale")  # the data of examples/mvppca_data_scale.py
    with pytest.warns(DataScaleWarning, match=r"site \d, view 'v\d': its entries have variance .* far above unit scale") as caught:
        FedMVPPCA(n_components=2, n_rounds=2, random_state=0).fit(data_scale.make_sites(1000.0))
    assert sum(issubclass(w.category, DataScaleWarning) for w in caught) == 9  # every view at every site
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataScaleWarning)
        FedMVPPCA(n_components=2, n_rounds=2, random_state=0).fit(data_scale.make_sites(10.0))


def test_the_scale_check_variance_in_one_pass_is_numpys_over_the_observed_rows():
    from fedhier.protocol.mvppca import _variance_per_entry

    rng = np.random.default_rng(3)
    X = 1e3 + rng.normal(size=(9_000, 250)) * rng.uniform(0.5, 2.0, size=250)  # three blocks of rows, a large mean
    rows = np.flatnonzero(rng.random(9_000) < 0.6)
    assert _variance_per_entry(X, None) == pytest.approx(X.var(axis=0).mean(), rel=1e-12)
    assert _variance_per_entry(X, rows) == pytest.approx(X[rows].var(axis=0).mean(), rel=1e-12)
    centred = X - 1e3  # a mean near the spread: the block's scatter from its sum of squares, as exactly
    assert _variance_per_entry(centred, rows) == pytest.approx(centred[rows].var(axis=0).mean(), rel=1e-12)


def test_global_loadings_come_in_the_canonical_rotation_that_pca_uses():
    """Data drawn from a two-view PPCA with known loadings (factor variances 9, 4, 1) at three sites: the
    fitted global loadings are orthogonal, ordered by variance explained, each column's largest entry
    positive and within a few degrees of the pooled PCA's components, column by column; any other rotation
    of the latent space gives the same predictions and turns back to the same loadings."""
    from scipy.linalg import subspace_angles
    from scipy.stats import ortho_group
    from sklearn.decomposition import PCA

    from fedhier.models.mvppca.rotation import canonical_rotation, rotate

    rng = np.random.default_rng(12)
    q, dims = 3, {"a": 5, "b": 4}
    axes = ortho_group.rvs(sum(dims.values()), random_state=1)[:, :q] * [3.0, 2.0, 1.0]
    W = {"a": axes[:5], "b": axes[5:]}
    sites = []
    for n in (150, 200, 250):
        Z = rng.standard_normal((n, q))
        sites.append({v: Z @ W[v].T + 0.2 * rng.standard_normal((n, dims[v])) for v in dims})
    model = FedMVPPCA(n_components=q, random_state=0).fit(sites)
    glob = model.global_params_
    stacked = np.vstack([glob["a"]["W"], glob["b"]["W"]])
    gram = stacked.T @ stacked
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-10)
    assert np.all(np.diff(np.diag(gram)) < 0)
    assert np.all(stacked[np.argmax(np.abs(stacked), axis=0), range(q)] > 0)
    pooled = np.vstack([np.hstack([s["a"], s["b"]]) for s in sites])
    pca = PCA(q).fit(pooled)
    angles = [np.degrees(subspace_angles(stacked[:, [j]], pca.components_[j][:, None]))[0] for j in range(q)]
    assert max(angles) < 5.0, angles
    # another rotation: the same predictions, latents turned, and the canonical rotation undoes it
    views = {v: np.vstack([s[v] for s in sites])[:40] for v in dims}
    before = (model.score_samples(views), model.impute({"a": views["a"]})["b"], model.transform(views))
    Q = ortho_group.rvs(q, random_state=2)
    model._global = rotate(model._global, Q)
    np.testing.assert_allclose(model.score_samples(views), before[0], rtol=0, atol=1e-10)
    np.testing.assert_allclose(model.impute({"a": views["a"]})["b"], before[1], rtol=0, atol=1e-10)
    np.testing.assert_allclose(model.transform(views), before[2] @ Q, rtol=0, atol=1e-10)
    back = rotate(model._global, canonical_rotation(model._global))
    np.testing.assert_allclose(np.vstack([back["a"].W, back["b"].W]), stacked, rtol=0, atol=1e-10)


def test_default_n_components_follows_the_data_and_survives_save_and_load(tmp_path):
    """n_components=None: 5 latent factors on wide data, one less than the widest view on narrow data; a saved
    model loads with its fitted dimension and transforms the same."""
    rng = np.random.default_rng(13)
    wide, narrow = rng.standard_normal((60, 8)), rng.standard_normal((60, 3))
    assert FedMVPPCA(random_state=0).fit(wide).n_components_ == 5
    assert FedMVPPCA(random_state=0).fit({"a": narrow, "b": narrow[:, :2]}).n_components_ == 2
    model = FedMVPPCA(random_state=0).fit(narrow)
    loaded = FedMVPPCA.load(model.save(tmp_path / "m.npz"))
    assert loaded.n_components is None and loaded.n_components_ == 2
    np.testing.assert_allclose(loaded.transform(narrow), model.transform(narrow))
    with pytest.raises(ValueError, match="at least 2 features"):
        FedMVPPCA().fit(narrow[:, :1])


def test_a_fit_runs_with_one_blas_thread_and_gives_the_callers_back(iid_problem):
    """Many small products are slower with more BLAS threads (benchmarks/bench_blas_threads.py): the fit uses one,
    whatever the caller set, and restores the caller's setting afterwards."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads():
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    sites, _ = iid_problem
    seen = []
    with threadpool_limits(limits=2, user_api="blas"):
        FedMVPPCA(n_components=3, n_rounds=2, random_state=0).fit(sites, callbacks=[lambda r, b: seen.append(blas_threads())])
        after = blas_threads()
    assert seen and all(s == {1} for s in seen)
    assert after == {2}
