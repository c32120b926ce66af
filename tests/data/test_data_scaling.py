import numpy as np
import pytest
from sklearn.preprocessing import MinMaxScaler

from fedhier.data import MinMaxScaling, combine_ranges, per_dataset_minmax, site_ranges


def _sites(seed=0):
    rng = np.random.default_rng(seed)
    sites = []
    for c, n in enumerate((20, 30, 25)):
        site = {"a": rng.normal(loc=c, scale=c + 1, size=(n, 4)), "b": rng.uniform(-5, 5 + c, size=(n, 2))}
        site["a"][:, 3] = 7.0  # constant feature
        site["a"][[1, 4]] = np.nan  # subjects lacking view a
        sites.append(site)
    del sites[1]["b"]  # site 1 does not measure view b
    return sites


def _pooled(sites, view):
    return np.vstack([s[view] for s in sites if view in s])


def test_federated_ranges_equal_pooled_min_max_scaler():
    sites = _sites()
    scaling = MinMaxScaling(combine_ranges([site_ranges(s) for s in sites]))
    for view in ("a", "b"):
        pooled = _pooled(sites, view)
        ref = MinMaxScaler().fit(pooled)
        ours = np.vstack([scaling.transform({view: s[view]})[view] for s in sites if view in s])
        np.testing.assert_allclose(ours, ref.transform(pooled), atol=1e-12)
        observed = ours[~np.isnan(ours).all(axis=1)]
        assert observed.min() >= 0 and observed.max() <= 1
        varying = np.ptp(observed, axis=0) > 0
        np.testing.assert_allclose(observed.min(axis=0)[varying], 0)
        np.testing.assert_allclose(observed.max(axis=0)[varying], 1)
    assert np.all(scaling.transform({"a": sites[0]["a"]})["a"][[0, 2], 3] == 0)  # constant -> 0


def test_test_set_subset_of_views_and_nan_rows():
    sites = _sites()
    scaling = MinMaxScaling.from_sites(sites)
    test = np.random.default_rng(5).normal(size=(6, 2)) * 10
    test[2] = np.nan
    out = scaling.transform({"b": test})
    assert list(out) == ["b"]
    ref = MinMaxScaler().fit(_pooled(sites, "b")).transform(test)
    np.testing.assert_allclose(out["b"], ref)
    assert np.isnan(out["b"][2]).all()


def test_inverse_transform_round_trip():
    sites = _sites()
    scaling = MinMaxScaling.from_sites(sites)
    back = scaling.inverse_transform(scaling.transform(sites[0]))
    for view in sites[0]:
        np.testing.assert_allclose(back[view], sites[0][view], equal_nan=True)


def test_per_dataset_variant_matches_min_max_scaler_on_that_data():
    site = _sites()[2]
    out = per_dataset_minmax({"b": site["b"]})
    np.testing.assert_allclose(out["b"], MinMaxScaler().fit_transform(site["b"]))


def test_errors():
    scaling = MinMaxScaling.from_sites(_sites())
    with pytest.raises(ValueError, match="view 'z' was not fitted"):
        scaling.transform({"z": np.ones((2, 2))})
    with pytest.raises(ValueError, match=r"view 'b': expected shape \(n, 2\)"):
        scaling.transform({"b": np.ones((2, 3))})
    with pytest.raises(ValueError, match="site 1, view 'a': range of dimension 2"):
        combine_ranges([{"a": (np.zeros(3), np.ones(3))}, {"a": (np.zeros(2), np.ones(2))}])
