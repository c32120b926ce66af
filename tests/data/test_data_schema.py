import json

import numpy as np
import pytest

from fedhier.data import ViewSchema


def test_from_sites_union_in_first_seen_order():
    sites = [
        {"b": np.zeros((3, 2)), "a": np.zeros((3, 4))},
        {"c": np.zeros((5, 1)), "a": np.zeros((5, 4))},
    ]
    schema = ViewSchema.from_sites(sites)
    assert schema.names == ("b", "a", "c")
    assert schema.dims == (2, 4, 1)
    assert schema.total_dim == 7
    assert schema.dim("a") == 4 and schema.index("c") == 2
    assert "a" in schema and "z" not in schema and len(schema) == 3


def test_from_sites_refuses_dimension_mismatch_naming_both_sites():
    sites = [{"a": np.zeros((3, 2))}, {"x": np.zeros((3, 1))}, {"a": np.zeros((3, 5))}]
    with pytest.raises(ValueError, match=r"view 'a' has dimension 2 at site 0 \('h0'\) but dimension 5 at site 2 \('h2'\)"):
        ViewSchema.from_sites(sites, site_names=["h0", "h1", "h2"])


def test_dict_round_trip_is_json_safe():
    schema = ViewSchema(("a", "b"), (3, np.int64(2)))
    data = json.loads(json.dumps(schema.to_dict()))
    assert ViewSchema.from_dict(data) == schema


def test_unknown_view_and_bad_construction():
    schema = ViewSchema(("a",), (3,))
    with pytest.raises(ValueError, match="unknown view 'b'"):
        schema.dim("b")
    with pytest.raises(ValueError, match="duplicate"):
        ViewSchema(("a", "a"), (1, 2))
    with pytest.raises(ValueError, match="positive integer"):
        ViewSchema(("a",), (0,))
    with pytest.raises(ValueError, match="2 view names but 1"):
        ViewSchema(("a", "b"), (1,))
