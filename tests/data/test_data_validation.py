import numpy as np
import pandas as pd
import pytest

from fedhier.data import ViewSchema, check_sites, check_views


def _site(n=5, seed=0):
    rng = np.random.default_rng(seed)
    return {"a": rng.normal(size=(n, 3)), "b": rng.normal(size=(n, 2))}


def test_valid_sites_are_float64_in_schema_order_without_copying_float64_views():
    s0 = {"b": np.arange(10).reshape(5, 2), "a": np.ones((5, 3))}
    s1 = [("a", np.zeros((4, 3)).tolist())]
    sites, schema = check_sites([s0, s1], n_components=2)
    assert schema == ViewSchema(("b", "a"), (2, 3))
    assert list(sites[0]) == ["b", "a"] and list(sites[1]) == ["a"]
    assert sites[0]["b"].dtype == np.float64 and sites[0]["b"].flags.c_contiguous
    np.testing.assert_array_equal(sites[0]["b"], s0["b"])
    assert sites[0]["a"] is s0["a"]  # already float64 and C-contiguous: no copy of the data
    assert sites[0]["b"] is not s0["b"]  # integers: converted


def test_nan_rows_are_subject_level_missingness():
    site = _site()
    site["a"][1] = np.nan
    sites, _ = check_sites([site])
    assert np.isnan(sites[0]["a"][1]).all()


def test_dataframes_are_accepted():
    df = pd.DataFrame({"x": [1.0, 2.0, np.nan], "y": pd.array([1, 2, None], dtype="Int64")})
    sites, _ = check_sites([{"v": df}])
    assert np.isnan(sites[0]["v"][2]).all()
    np.testing.assert_array_equal(sites[0]["v"][:2], [[1, 1], [2, 2]])


@pytest.mark.parametrize("bad", [{"a": np.zeros((3, 2))}, np.zeros((3, 2)), "site"])
def test_not_a_list_of_mappings(bad):
    with pytest.raises(ValueError, match="list of mappings"):
        check_sites(bad)


def test_site_not_a_mapping_names_site():
    with pytest.raises(ValueError, match=r"site 1 \('Hungary'\): expected a mapping"):
        check_sites([_site(), [np.zeros((3, 2))]], site_names=["Cleveland", "Hungary"])


def test_empty_site():
    with pytest.raises(ValueError, match="site 1: the site has no view"):
        check_sites([_site(), {}])
    with pytest.raises(ValueError, match="site 0: the site has zero rows"):
        check_sites([{"a": np.zeros((0, 3))}])


def test_non_numeric_values():
    obj = np.array([[1.0, "x"], [2.0, 3.0]], dtype=object)
    with pytest.raises(ValueError, match=r"site 0, view 'a': non-numeric value \(of type str\) at row 0, column 1") as info:
        check_sites([{"a": obj}])
    assert "'x'" not in str(info.value)  # a cell's value is never quoted
    with pytest.raises(ValueError, match=r"site 0, view 'a': non-numeric array of dtype <U"):
        check_sites([{"a": np.array([["1", "2"], ["3", "4"]])}])
    df = pd.DataFrame({"age": [1.0, 2.0], "sex": ["M", "F"]})
    with pytest.raises(ValueError, match=r"site 1, view 'demo': non-numeric DataFrame column\(s\) \['sex'\]"):
        check_sites([{"demo": np.ones((2, 2))}, {"demo": df}])


def test_inf():
    site = _site()
    site["b"][3, 1] = -np.inf
    with pytest.raises(ValueError, match=r"site 0, view 'b': 1 infinite value\(s\), first at row 3, column 1"):
        check_sites([site])


def test_dimension_differs_between_sites():
    with pytest.raises(ValueError, match=r"view 'a' has dimension 3 at site 0 but dimension 4 at site 1"):
        check_sites([_site(), {"a": np.ones((5, 4))}])


def test_unknown_view_with_schema():
    schema = ViewSchema(("a", "b"), (3, 2))
    with pytest.raises(ValueError, match=r"site 0: unknown view 'c'"):
        check_sites([{"c": np.ones((4, 1))}], schema=schema)
    with pytest.raises(ValueError, match=r"site 0, view 'a': 2 columns, but the schema says dimension 3"):
        check_sites([{"a": np.ones((4, 2))}], schema=schema)


def test_n_components_too_large_names_largest_view():
    with pytest.raises(ValueError, match=r"n_components=3 .* view 'a' has dimension 3"):
        check_sites([_site()], n_components=3)
    check_sites([_site()], n_components=2)


def test_too_few_subjects():
    site = _site(n=3)
    site["a"][1:] = np.nan
    site["b"][1:] = np.nan
    with pytest.raises(ValueError, match=r"site 0: 1 subject\(s\) with an observed view .* at least 2 are needed"):
        check_sites([site])
    with pytest.raises(ValueError, match=r"site 1: 5 subject"):
        check_sites([_site(n=7), _site()], min_subjects=6)


def test_inconsistent_row_counts():
    with pytest.raises(ValueError, match=r"site 0: the views have different numbers of rows \{'a': 5, 'b': 4\}"):
        check_sites([{"a": np.ones((5, 3)), "b": np.ones((4, 2))}])


def test_partially_nan_rows():
    site = _site(n=8)
    site["b"][[2, 6], 0] = np.nan
    with pytest.raises(ValueError, match=r"site 0, view 'b': 2 row\(s\) partially NaN, first at row 2"):
        check_sites([site])


def test_view_with_no_observed_row():
    site = _site()
    site["b"][:] = np.nan
    with pytest.raises(ValueError, match=r"site 0, view 'b': every row is NaN"):
        check_sites([site])


def test_duplicate_view_names_in_pairs():
    with pytest.raises(ValueError, match=r"site 0: view 'a' is given twice"):
        check_sites([[("a", np.ones((3, 2))), ("a", np.ones((3, 2)))]])


def test_one_dimensional_view():
    with pytest.raises(ValueError, match=r"site 0, view 'a': expected a 2-D array"):
        check_sites([{"a": np.ones(4)}])
    with pytest.raises(ValueError, match=r"site 0, view 'a': a 1-D pandas Series"):
        check_sites([{"a": pd.Series([1.0, 2.0])}])


def test_check_views_subset_and_errors():
    schema = ViewSchema(("a", "b"), (3, 2))
    out = check_views({"b": np.ones((4, 2))}, schema)
    assert list(out) == ["b"] and out["b"].shape == (4, 2)
    with pytest.raises(ValueError, match="X: no view given"):
        check_views({}, schema)
    assert check_views({}, schema, require_any=False) == {}
    with pytest.raises(ValueError, match=r"X: unknown view 'z'"):
        check_views({"z": np.ones((4, 1))}, schema)
    bad = np.ones((4, 3))
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match=r"X, view 'a': 1 row\(s\) partially NaN, first at row 0"):
        check_views({"a": bad}, schema)
