import numpy as np
import pytest
from sklearn.model_selection import RepeatedStratifiedKFold

from fedhier.data import mask_test_views, partition, repeated_stratified_folds, split_by_column


def _table(n1=62, n2=40, seed=0):
    """Three views whose first column is the row index, so every row can be traced."""
    n = n1 + n2
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.r_[np.ones(n1, int), np.zeros(n2, int)])
    rows = np.arange(n, dtype=float)[:, None]
    views = {
        "v1": np.hstack([rows, rng.normal(size=(n, 3))]),
        "v2": np.hstack([rows, rng.normal(size=(n, 1))]),
        "v3": np.hstack([rows, rng.normal(size=(n, 2))]),
    }
    return views, labels


def _even(k, m):
    """Sizes of k items split evenly over m parts, the larger parts first."""
    q, r = divmod(k, m)
    return [q + 1] * r + [q] * (m - r)


def _check_cover(p, views, n):
    all_idx = np.concatenate(p.indices)
    assert np.array_equal(np.sort(all_idx), np.arange(n))  # disjoint, every row exactly once
    for site, idx in zip(p.sites, p.indices):
        for v, X in site.items():
            np.testing.assert_array_equal(X, views[v][idx])


@pytest.mark.parametrize(
    "scenario, n_sites", [("iid", 1), ("iid", 3), ("iid", 6), ("iid", 4), ("K", 3), ("K", 6)]
)
def test_iid_and_k_are_stratified_equal_parts(scenario, n_sites):
    views, labels = _table()
    n = labels.size
    p = partition(views, labels, n_sites, scenario, random_state=1)
    _check_cover(p, views, n)
    sizes = [idx.size for idx in p.indices]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n
    for y in (0, 1):
        counts = [np.sum(labels[idx] == y) for idx in p.indices]
        n_y = np.sum(labels == y)
        assert all(np.floor(n_y / n_sites) <= c <= np.ceil(n_y / n_sites) for c in counts)


@pytest.mark.parametrize("n_sites", [3, 6])
@pytest.mark.parametrize("scenario", ["G", "GK", "G/K"])
def test_g_group_assignment(scenario, n_sites):
    n1, n2 = 62, 40
    views, labels = _table(n1, n2)
    p = partition(views, labels, n_sites, scenario, random_state=2)
    _check_cover(p, views, n1 + n2)
    m = n_sites // 3
    a1, a2 = round(n1 / 3), round(n2 / 3)  # 21 and 13: a third of each group to the A sites
    expected_g1 = _even(a1, m) + _even(n1 - a1, m) + [0] * m
    expected_g2 = _even(a2, m) + [0] * m + _even(n2 - a2, m)
    assert [int(np.sum(labels[i] == 1)) for i in p.indices] == expected_g1
    assert [int(np.sum(labels[i] == 0)) for i in p.indices] == expected_g2
    assert p.site_types == ("A",) * m + ("B",) * m + ("C",) * m


@pytest.mark.parametrize("n_sites", [3, 6])
@pytest.mark.parametrize("scenario", ["K", "GK"])
def test_k_views_deleted_per_block(scenario, n_sites):
    views, labels = _table()
    p = partition(views, labels, n_sites, scenario, random_state=3)
    m = n_sites // 3
    assert p.missing == [()] * m + [("v2",)] * m + [("v3",)] * m
    assert [list(s) for s in p.sites] == [["v1", "v2", "v3"]] * m + [["v1", "v3"]] * m + [["v1", "v2"]] * m


def test_no_views_missing_in_iid_and_g():
    views, labels = _table()
    for scenario in ("iid", "G"):
        p = partition(views, labels, 3, scenario, random_state=0)
        assert p.missing == [()] * 3 and all(list(s) == ["v1", "v2", "v3"] for s in p.sites)


def test_gk_pairs_roles_as_in_paper():
    """C=3: site 2 (B) = group 1 without view 2; site 3 (C) = group 2 without view 3."""
    views, labels = _table()
    p = partition(views, labels, 3, "GK", random_state=4)
    assert set(labels[p.indices[1]]) == {1} and "v2" not in p.sites[1]
    assert set(labels[p.indices[2]]) == {0} and "v3" not in p.sites[2]


def test_group1_and_missing_views_parameters():
    views, labels = _table()
    p = partition(views, labels, 3, "GK", random_state=0, group1=0, missing_views=("v3", "v1"))
    assert set(labels[p.indices[1]]) == {0} and set(labels[p.indices[2]]) == {1}
    assert p.missing == [(), ("v3",), ("v1",)]


def test_same_seed_same_partition():
    views, labels = _table()
    a = partition(views, labels, 6, "GK", random_state=7)
    b = partition(views, labels, 6, "GK", random_state=7)
    assert all(np.array_equal(x, y) for x, y in zip(a.indices, b.indices))


def test_partition_errors():
    views, labels = _table()
    with pytest.raises(ValueError, match="multiple of 3"):
        partition(views, labels, 4, "G", random_state=0)
    with pytest.raises(ValueError, match="unknown scenario 'X'"):
        partition(views, labels, 3, "X", random_state=0)
    with pytest.raises(ValueError, match="labels has shape"):
        partition(views, labels[:-1], 3, "iid", random_state=0)
    with pytest.raises(ValueError, match="group 2 is empty"):
        partition(views, np.ones_like(labels), 3, "G", random_state=0)
    with pytest.raises(ValueError, match="only 2 views"):
        partition({"a": views["v1"], "b": views["v2"]}, labels, 3, "K", random_state=0)
    with pytest.raises(ValueError, match="unknown view 'zz'"):
        partition(views, labels, 3, "K", random_state=0, missing_views=("v2", "zz"))


def test_mask_test_views_thirds():
    views, labels = _table(50, 50)
    masked = mask_test_views(views, "GK", random_state=5)
    lack2 = np.isnan(masked["v2"]).all(axis=1)
    lack3 = np.isnan(masked["v3"]).all(axis=1)
    assert not np.isnan(masked["v1"]).any()
    assert not (lack2 & lack3).any()
    assert sorted([int((~lack2 & ~lack3).sum()), int(lack2.sum()), int(lack3.sum())]) == [33, 33, 34]
    np.testing.assert_array_equal(masked["v2"][~lack2], views["v2"][~lack2])
    assert not np.isnan(views["v2"]).any()  # input untouched
    for scenario in ("iid", "G"):
        same = mask_test_views(views, scenario, random_state=5)
        assert all(np.array_equal(same[v], views[v]) for v in views)


def test_split_by_column():
    views, _ = _table(5, 5)
    groups = np.array(["H", "C", "H", "S", "C", "C", "H", "S", "S", "H"])
    sites, names = split_by_column(views, groups)
    assert names == ("H", "C", "S")
    for site, name in zip(sites, names):
        np.testing.assert_array_equal(site["v1"][:, 0], np.flatnonzero(groups == name))


def test_repeated_stratified_folds_matches_sklearn():
    _, labels = _table()
    folds = list(repeated_stratified_folds(labels, n_splits=3, n_repeats=2, random_state=0))
    ref = list(RepeatedStratifiedKFold(n_splits=3, n_repeats=2, random_state=0).split(np.zeros(labels.size), labels))
    assert [(r, f) for r, f, _, _ in folds] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    for (_, _, tr, te), (rtr, rte) in zip(folds, ref):
        np.testing.assert_array_equal(tr, rtr)
        np.testing.assert_array_equal(te, rte)
    for r in (0, 1):
        tests = np.concatenate([te for rr, _, _, te in folds if rr == r])
        assert np.array_equal(np.sort(tests), np.arange(labels.size))
