"""§11 metrics against scikit-learn on hand-made inputs, and the experiments' evaluation of a fold."""

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.metrics import accuracy_score, mean_absolute_error

from fedhier.baselines import PooledPCA
from fedhier.experiments.mvppca import evaluate, load_dataset, make_fold
from fedhier.metrics import latent_accuracy, reconstruction_mae


def test_mae_is_sklearn_mae_on_the_stacked_observed_matrix():
    T = {"a": np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]), "b": np.array([[1.0], [1.0], [1.0]])}
    H = {"a": np.array([[0.5, 1.0], [2.0, 2.0], [4.0, 7.0]]), "b": np.array([[0.0], [1.5], [1.0]])}
    expected = mean_absolute_error(np.hstack([T["a"], T["b"]]), np.hstack([H["a"], H["b"]]))
    assert reconstruction_mae(T, H) == pytest.approx(expected)
    assert expected == pytest.approx((0.5 + 1.0 + 2.0 + 1.0 + 0.5) / 9)


def test_mae_ignores_subjects_lacking_a_view():
    T = {"a": np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]), "b": np.array([[1.0], [np.nan], [1.0]])}
    H = {"a": np.array([[0.5, 1.0], [2.0, 2.0], [4.0, 7.0]]), "b": np.array([[0.0], [9.0], [1.0]])}
    observed_true = np.concatenate([T["a"].ravel(), T["b"][[0, 2]].ravel()])
    observed_hat = np.concatenate([H["a"].ravel(), H["b"][[0, 2]].ravel()])
    assert reconstruction_mae(T, H) == pytest.approx(mean_absolute_error(observed_true, observed_hat))


def test_lda_accuracy_on_a_hand_made_latent_space():
    # 1-D latents, equal class sizes and spreads: LDA's boundary is the midpoint 0 of the class means
    z_train = np.array([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0])[:, None]
    y_train = np.array([0, 0, 0, 1, 1, 1])
    z_test = np.array([-2.5, -0.2, 0.3, 2.0, -1.0])[:, None]
    y_test = np.array([0, 1, 1, 1, 1])  # the 2nd and 5th lie on the wrong side
    by_hand = accuracy_score(y_test, (z_test[:, 0] > 0).astype(int))
    assert by_hand == pytest.approx(3 / 5)
    assert latent_accuracy(z_train, y_train, z_test, y_test) == pytest.approx(by_hand)
    sk = LinearDiscriminantAnalysis().fit(z_train, y_train).score(z_test, y_test)
    assert latent_accuracy(z_train, y_train, z_test, y_test) == pytest.approx(sk)


def test_evaluate_a_fold_against_direct_sklearn_computations():
    data = load_dataset("sd", 3)
    fold = make_fold(data, seed=3, n_repeats=1, n_splits=3, repeat=0, fold=1, scenario="iid", n_sites=3)
    model = PooledPCA(5).fit(fold.sites)
    got = evaluate(model, fold)

    pooled = np.vstack([np.hstack([s[v] for v in data.views]) for s in fold.sites])
    pca = PCA(5).fit(pooled)
    rebuild = lambda X: pca.inverse_transform(pca.transform(X))  # noqa: E731
    per_site = [mean_absolute_error(M, rebuild(M)) for M in (np.hstack([s[v] for v in data.views]) for s in fold.sites)]
    test = np.hstack([fold.test[v] for v in data.views])
    lda = LinearDiscriminantAnalysis().fit(pca.transform(pooled), np.concatenate(fold.site_labels))
    assert got["mae_train"] == pytest.approx(np.mean(per_site))
    assert got["mae_train_sites_sd"] == pytest.approx(np.std(per_site))
    assert got["mae_test"] == pytest.approx(mean_absolute_error(test, rebuild(test)))
    assert got["accuracy"] == pytest.approx(lda.score(pca.transform(test), fold.test_labels))


def test_fold_sites_follow_the_scenario_and_share_one_scaling():
    data = load_dataset("sd", 0)
    fold = make_fold(data, seed=0, n_repeats=2, n_splits=3, repeat=1, fold=2, scenario="GK", n_sites=3)
    assert [sorted(s) for s in fold.sites] == [["view1", "view2", "view3"], ["view1", "view3"], ["view1", "view2"]]
    # site B holds group 1 only, site C group 2 only (§12.2)
    assert set(fold.site_labels[1]) == {1} and set(fold.site_labels[2]) == {0}
    # federated min-max: the training sites together span exactly [0, 1] per feature
    for view in data.views:
        stacked = np.vstack([s[view] for s in fold.sites if view in s])
        np.testing.assert_allclose(stacked.min(0), 0.0, atol=1e-12)
        np.testing.assert_allclose(stacked.max(0), 1.0, atol=1e-12)
    # test thirds: some subjects lack view 2, others view 3, never both
    lack2 = np.isnan(fold.test["view2"]).all(1)
    lack3 = np.isnan(fold.test["view3"]).all(1)
    assert lack2.any() and lack3.any() and not (lack2 & lack3).any()
    # the same key gives the same fold
    again = make_fold(data, seed=0, n_repeats=2, n_splits=3, repeat=1, fold=2, scenario="GK", n_sites=3)
    np.testing.assert_array_equal(again.sites[0]["view1"], fold.sites[0]["view1"])
