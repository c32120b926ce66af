"""The estimators are scikit-learn estimators (issue 18): scikit-learn's own estimator checks on the
single-site form, clone, GridSearchCV over sites with GroupKFold, a Pipeline with a scaler, and the
pooled ``groups=`` form against the list-of-sites form."""

import warnings

import numpy as np
import pytest
import sklearn
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.model_selection import GridSearchCV, GroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from fedhier.baselines.vae import FederatedVAE, torch_available
from fedhier.estimators.collab import CollabDict, CollabVAE
from fedhier.estimators.fedlin import FedHM1Regressor, FedHM2Regressor
from fedhier.estimators.mvppca import FedMVPPCA

# Small settings keep each check to a fraction of a second; the defaults are unchanged.
ESTIMATORS = [
    FedMVPPCA(),  # as constructed: n_components=None fits the data's width
    FedMVPPCA(n_components=1, n_rounds=3, random_state=0),
    FedHM1Regressor(n_rounds=20, random_state=0),
    FedHM2Regressor(n_rounds=3, n_draws=500, n_posterior_draws=200, random_state=0),
    CollabDict(n_components=2, max_iter=5, random_state=0),
    CollabVAE(max_iter=5, random_state=0),
]
if torch_available():  # the VAE baselines need PyTorch (an optional extra)
    ESTIMATORS.append(FederatedVAE(n_components=1, n_rounds=2, n_epochs=1, random_state=0))


def _expected_failed_checks(estimator):
    """scikit-learn checks that do not hold, each with the reason (the estimator's data model)."""
    failed = {}
    if isinstance(estimator, FedHM2Regressor):
        # y = X[:, 0] exactly: no noise, so the noise variance's posterior mode sits at 0 and the Laplace
        # approximation of the site's tilted distribution has no positive definite Hessian there.
        failed["check_regressors_no_decision_function"] = "noise-free y = X[:, 0]: the Laplace step needs noise"
    return failed


# Skipped, by scikit-learn itself: its array-API checks (one per estimator) run only when SCIPY_ARRAY_API=1
# is set and an estimator declares array-API support. Ours compute with NumPy (and PyTorch for the VAEs)
# and do not declare it, so those checks do not apply.
@parametrize_with_checks(ESTIMATORS, expected_failed_checks=_expected_failed_checks)
def test_sklearn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # the checks' few rounds
        check(estimator)


def _grouped_regression(rng, n_sites=6, n=40):
    """Rows of ``n_sites`` sites with site intercepts 3 + N(0, 0.5^2), common slopes (1, -0.5), noise sd 0.3."""
    groups = np.repeat(np.arange(n_sites), n)
    X = rng.standard_normal((n_sites * n, 2))
    y = 3.0 + rng.normal(0.0, 0.5, n_sites)[groups] + X @ np.array([1.0, -0.5]) + 0.3 * rng.standard_normal(groups.size)
    return X, y, groups


def test_groups_form_equals_the_list_of_sites_and_predicts_unseen_sites_at_population_level():
    X, y, groups = _grouped_regression(np.random.default_rng(0))
    order = np.random.default_rng(1).permutation(groups.size)  # rows of the sites interleaved
    X, y, groups = X[order], y[order], np.array(list("abcdef"))[groups[order]]
    est = FedHM2Regressor(n_posterior_draws=500, random_state=0)
    pooled = clone(est).fit(X, y, groups=groups)
    listed = clone(est).fit([(X[groups == g], y[groups == g]) for g in "abcdef"])
    np.testing.assert_allclose(pooled.phi_mean_, listed.phi_mean_)
    np.testing.assert_allclose(pooled.coef_, listed.coef_)
    assert list(pooled.sites_) == list("abcdef")
    # predict(X, groups=) uses each row's site; a site not in the fit gets X @ mu (the population level)
    rows = groups == "c"
    np.testing.assert_allclose(pooled.predict(X[rows], groups=groups[rows]), pooled.predict(X[rows], site=2))
    unseen = pooled.predict(X[:5], groups=np.array(["z"] * 5))
    np.testing.assert_allclose(unseen, X[:5] @ pooled.population_coef_ + pooled.population_intercept_)
    # the intercept is a site-varying coordinate: the population intercept near 3, the slopes near (1, -0.5)
    assert pooled.phi_names_[:3] == ["mu[(intercept)]", "mu[0]", "mu[1]"]
    assert abs(pooled.population_intercept_ - 3.0) < 0.6
    np.testing.assert_allclose(pooled.population_coef_, [1.0, -0.5], atol=0.1)
    assert np.ptp(pooled.intercept_) > 0.3  # the sites' intercepts differ
    # R^2 against scikit-learn's r2_score
    from sklearn.metrics import r2_score

    assert pooled.score(X, y, groups=groups) == pytest.approx(r2_score(y, pooled.predict(X, groups=groups)))


def test_fit_intercept_matches_a_hand_made_column_of_ones():
    X, y, groups = _grouped_regression(np.random.default_rng(2))
    auto = FedHM2Regressor(n_posterior_draws=300, random_state=0).fit(X, y, groups=groups)
    ones = np.column_stack([np.ones(len(y)), X])
    hand = FedHM2Regressor(fit_intercept=False, n_posterior_draws=300, random_state=0).fit(ones, y, groups=groups)
    np.testing.assert_allclose(auto.phi_mean_, hand.phi_mean_)
    np.testing.assert_allclose(auto.intercept_, hand.coef_[:, 0])
    np.testing.assert_allclose(auto.coef_, hand.coef_[:, 1:])
    hm1 = FedHM1Regressor(n_rounds=30, eta=1e-3, random_state=0)
    auto1, hand1 = clone(hm1).fit(X, y, groups=groups), clone(hm1).set_params(fit_intercept=False).fit(ones, y, groups=groups)
    np.testing.assert_allclose(auto1.intercept_, hand1.coef_[:, 0])


def test_phi_names_use_the_dataframe_columns():
    pd = pytest.importorskip("pandas")
    X, y, groups = _grouped_regression(np.random.default_rng(3), n_sites=3)
    frame = pd.DataFrame(X, columns=["age", "bp"])
    est = FedHM2Regressor(n_rounds=2, n_posterior_draws=100, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(frame, y, groups=groups)
    assert est.phi_names_ == ["mu[(intercept)]", "mu[age]", "mu[bp]", "log_tau[(intercept)]", "log_tau[age]", "log_tau[bp]"]
    assert list(est.feature_names_in_) == ["age", "bp"]


def test_convergence_warning_when_the_rounds_run_out():
    X, y, groups = _grouped_regression(np.random.default_rng(4), n_sites=3)
    with pytest.warns(ConvergenceWarning, match="n_rounds=1"):
        FedHM2Regressor(n_rounds=1, n_posterior_draws=100, random_state=0).fit(X, y, groups=groups)
    views = {"a": np.column_stack([X, y]), "b": X + 0.1 * y[:, None]}
    with pytest.warns(ConvergenceWarning, match="n_rounds=2 rounds and its predictions still changed by"):
        FedMVPPCA(n_components=1, n_rounds=2, init="random", random_state=0).fit(views, groups=groups)
    with warnings.catch_warnings():  # one round, the centralised fit: nothing to settle, no warning
        warnings.simplefilter("error", ConvergenceWarning)
        FedMVPPCA(n_components=1, n_rounds=1, random_state=0).fit(views["a"])


def test_wrong_forms_get_plain_errors():
    X, y, groups = _grouped_regression(np.random.default_rng(5), n_sites=3)
    with pytest.raises(ValueError, match="requires y to be passed"):
        FedHM2Regressor().fit(X)
    with pytest.raises(ValueError, match="not both"):
        FedHM1Regressor().fit([(X, y)], y)
    with pytest.raises(ValueError, match="one site label per row"):
        FedHM2Regressor().fit(X, y, groups=groups[:-1])
    with pytest.raises(ValueError, match="list of sites"):
        FedMVPPCA().fit([X, X])
    assert CollabDict(n_components=2, max_iter=3).fit(X).n_sites_ == 1  # one array: one site, not its rows as sites
    model = CollabDict(n_components=2, max_iter=3, random_state=0).fit(X, groups=groups)  # one array + groups: 3 sites
    assert model.n_sites_ == 3
    with pytest.raises(ValueError, match="pass site= .* or groups="):
        model.predict(X)
    with pytest.raises(ValueError, match=r"label\(s\) \['9'\] not in the fit"):
        model.predict(X[:2], groups=[9, 9])
    labels = CollabDict(n_components=2, max_iter=3, random_state=0).fit_predict(X, groups=groups)  # the same seed
    np.testing.assert_array_equal(labels, model.predict(X, groups=groups))
    for unfitted in (FedMVPPCA(), FedHM1Regressor(), FedHM2Regressor(), CollabDict(), CollabVAE()):
        with pytest.raises(NotFittedError):
            unfitted.predict(X) if not isinstance(unfitted, FedMVPPCA) else unfitted.transform(X)


def test_grid_search_over_sites_with_group_kfold():
    """GroupKFold holds out whole sites; scikit-learn's metadata routing passes ``groups`` to fit as well,
    so each candidate is a federated fit over the training sites, scored at population level on the
    held-out ones."""
    X, y, groups = _grouped_regression(np.random.default_rng(6))
    with sklearn.config_context(enable_metadata_routing=True):
        est = FedHM2Regressor(n_posterior_draws=200, random_state=0).set_fit_request(groups=True).set_score_request(groups=True)
        search = GridSearchCV(est, {"damping": [0.5, 0.8]}, cv=GroupKFold(n_splits=3))
        search.fit(X, y, groups=groups)
    assert set(search.cv_results_["param_damping"]) == {0.5, 0.8}
    assert search.best_estimator_.n_sites_ == 6
    assert np.all(search.cv_results_["mean_test_score"] > 0.5)  # R^2 of held-out sites from X @ mu


def test_pipeline_with_a_scaler():
    X, y, groups = _grouped_regression(np.random.default_rng(7))
    X = X * [100.0, 0.01] + [50.0, 3.0]  # raw units
    with sklearn.config_context(enable_metadata_routing=True):
        pipe = make_pipeline(StandardScaler(), FedHM2Regressor(n_posterior_draws=300, random_state=0).set_fit_request(groups=True)
                             .set_score_request(groups=True))
        pipe.fit(X, y, groups=groups)
        assert pipe.score(X, y, groups=groups) > 0.8
    mv = make_pipeline(StandardScaler(), FedMVPPCA(n_components=1, n_rounds=20, random_state=0)).fit(X)
    assert mv.transform(X).shape == (X.shape[0], 1)
    detector = make_pipeline(StandardScaler(), CollabDict(n_components=2, max_iter=5)).fit(X)
    assert set(np.unique(detector.predict(X))) <= {-1, 1}


def test_views_with_groups_equal_the_list_of_sites():
    rng = np.random.default_rng(8)
    groups = np.repeat([0, 1, 2], 30)
    views = {"a": rng.standard_normal((90, 3)), "b": rng.standard_normal((90, 2))}
    est = FedMVPPCA(n_components=1, n_rounds=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        pooled = clone(est).fit(views, groups=groups)
        listed = clone(est).fit([{v: V[groups == g] for v, V in views.items()} for g in range(3)])
    np.testing.assert_allclose(pooled.transform(views), listed.transform(views))
    assert pooled.score(views) == pytest.approx(listed.score(views))


def test_radon_without_a_column_of_ones_agrees_with_mixedlm(example):
    """fit_intercept on the pooled radon rows with groups=county: the fixed effects within one MixedLM
    standard error of statsmodels' REML fit on the same rows (examples/fedlin_radon_groups.py)."""
    pytest.importorskip("statsmodels")
    hm2, anchor, features = example("fedlin_radon_groups").fit()
    assert hm2.phi_names_[:3] == ["mu[(intercept)]", "mu[0]", "mu[1]"]
    gaps = np.abs(np.concatenate([[hm2.population_intercept_], hm2.population_coef_]) - anchor.fe) / anchor.se
    assert np.all(gaps < 1.0), dict(zip(features, gaps))


def test_a_safeguard_repeated_every_round_is_logged_once_at_info(caplog):
    """One site: no spread between sites, the master's zero-spread safeguard fires every round; an INFO log
    shows it once (later rounds at DEBUG)."""
    import logging

    X = np.random.default_rng(9).standard_normal((60, 4))
    with caplog.at_level(logging.DEBUG, logger="fedhier"):
        FedMVPPCA(n_components=1, n_rounds=6, tol=None, random_state=0).fit(X)
    master = [r for r in caplog.records if "master" in r.getMessage()]
    info = [r.getMessage() for r in master if r.levelno == logging.INFO]
    assert len(master) > len(info) >= 1  # it did repeat
    assert len(info) == len({m.split(": ", 1)[1] for m in info})  # each note once at INFO


def test_collabdict_as_constructed_passes_the_estimator_checks():
    """The default CollabDict on scikit-learn's small check data: every check passes (about 40 s on a quiet
    machine, so marked slow)."""
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        results = check_estimator(CollabDict(), on_fail=None)
    failed = [r["check_name"] for r in results if r["status"] == "failed"]
    assert not failed, failed


test_collabdict_as_constructed_passes_the_estimator_checks = pytest.mark.slow(
    test_collabdict_as_constructed_passes_the_estimator_checks)


@pytest.mark.slow
@pytest.mark.skipif(not torch_available(), reason="needs the torch extra")
def test_federated_vae_as_constructed_passes_the_estimator_checks():
    """The default FederatedVAE (100 rounds of 15 epochs) on scikit-learn's small check data: every check passes
    (about 35 s, its sites training on one torch thread, so marked slow)."""
    from sklearn.utils.estimator_checks import check_estimator

    results = check_estimator(FederatedVAE(), on_fail=None)
    failed = [r["check_name"] for r in results if r["status"] == "failed"]
    assert not failed, failed

@pytest.mark.slow
def test_collabvae_as_constructed_passes_the_estimator_checks():
    """The default CollabVAE (200 rounds of its serverless protocol) on scikit-learn's small check data: every
    check passes (25 s alone, 60 s beside a running test suite, so marked slow)."""
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        results = check_estimator(CollabVAE(), on_fail=None)
    failed = [r["check_name"] for r in results if r["status"] == "failed"]
    assert not failed, failed


def _sites_frame(rng, n_sites=4, n=30):
    """A DataFrame of rows of ``n_sites`` sites (column "site"), 6 features on 2 latent factors, and a response."""
    pd = pytest.importorskip("pandas")
    Z = rng.standard_normal((n_sites * n, 2))
    X = Z @ rng.standard_normal((2, 6)) + 0.3 * rng.standard_normal((n_sites * n, 6))
    frame = pd.DataFrame(X, columns=[f"x{j}" for j in range(6)])
    frame.insert(2, "site", np.repeat([f"s{k}" for k in range(n_sites)], n))
    y = 3.0 + rng.normal(0.0, 0.5, n_sites)[np.repeat(np.arange(n_sites), n)] + X[:, 0] - 0.5 * X[:, 1] \
        + 0.3 * rng.standard_normal(n_sites * n)
    return frame, y


def test_site_column_carries_the_sites_through_group_kfold_without_routing():
    """Without metadata routing GridSearchCV gives ``groups`` to GroupKFold only; ``site_column`` keeps each
    fold's fit federated over its training sites, and its scores are those of the routed search."""
    from sklearn.model_selection import cross_validate

    frame, y = _sites_frame(np.random.default_rng(10))
    cv = GroupKFold(n_splits=4)
    warnings.simplefilter("ignore", ConvergenceWarning)  # EP's few rounds on these small folds
    for est in (FedMVPPCA(site_column="site", random_state=0), FedHM2Regressor(n_posterior_draws=200, random_state=0,
                                                                               site_column="site")):
        out = cross_validate(est, frame, y, groups=frame["site"], cv=cv, return_estimator=True, return_indices=True)
        for fitted, train in zip(out["estimator"], out["indices"]["train"]):
            assert list(fitted.sites_) == sorted(set(frame["site"].iloc[train]))  # 3 training sites, not 1
            assert "site" not in list(fitted.feature_names_in_)
    hm2 = FedHM2Regressor(n_posterior_draws=200, random_state=0)
    search = GridSearchCV(clone(hm2).set_params(site_column="site"), {"damping": [0.5, 0.8]}, cv=cv)
    search.fit(frame, y, groups=frame["site"])
    assert search.best_estimator_.n_sites_ == 4
    with sklearn.config_context(enable_metadata_routing=True):
        routed = GridSearchCV(clone(hm2).set_fit_request(groups=True).set_score_request(groups=True),
                              {"damping": [0.5, 0.8]}, cv=cv)
        routed.fit(frame.drop(columns="site"), y, groups=frame["site"])
    np.testing.assert_allclose(search.cv_results_["mean_test_score"], routed.cv_results_["mean_test_score"])
    mv = GridSearchCV(FedMVPPCA(site_column="site", random_state=0), {"n_components": [1, 2]}, cv=cv)
    assert mv.fit(frame, groups=frame["site"]).best_estimator_.n_sites_ == 4
    with pytest.raises(ValueError, match="X has no column 'site'"):
        FedMVPPCA(site_column="site").fit(frame.drop(columns="site"))
    with pytest.raises(ValueError, match="DataFrame"):
        FedHM2Regressor(site_column="site").fit(frame.drop(columns="site").to_numpy(), y)


def test_set_output_pandas_in_a_pipeline():
    frame, _ = _sites_frame(np.random.default_rng(11))
    X = frame.drop(columns="site").set_axis(np.arange(100, 100 + len(frame)))
    pipe = make_pipeline(StandardScaler(), FedMVPPCA(n_components=2, random_state=0)).set_output(transform="pandas")
    out = pipe.fit(X).transform(X)
    assert list(out.columns) == ["fedmvppca0", "fedmvppca1"] and list(out.index) == list(X.index)
    plain = make_pipeline(StandardScaler(), FedMVPPCA(n_components=2, random_state=0)).fit(X)
    np.testing.assert_allclose(out.to_numpy(), plain.transform(X))
    assert list(pipe[-1].get_feature_names_out()) == ["fedmvppca0", "fedmvppca1"]
