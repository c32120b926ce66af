"""Data layer: the site data convention, input checks, bundled real data, site partitions,
federated min–max scaling and synthetic multi-view PPCA data.

A site is a mapping ``view name -> float64 array (n, d_view)``; a view absent from the mapping
is not measured by the site; an entirely-NaN row within a view means that subject lacks the view.
"""

from importlib import import_module

#: name -> submodule; imported on first use, so that importing one submodule (e.g. the site-data
#: checks a Flower site step needs) does not import the data sets, partitions and synthetic data
_LAZY = {
    **dict.fromkeys(["HeartDisease", "MultiViewDataset", "load_alzheimer", "load_heart_disease", "load_mfeat"], "datasets"),
    **dict.fromkeys(["SCENARIOS", "Partition", "mask_test_views", "partition", "repeated_stratified_folds",
                     "split_by_column"], "partition"),
    **dict.fromkeys(["MinMaxScaling", "combine_ranges", "per_dataset_minmax", "site_ranges"], "scaling"),
    "ViewSchema": "schema",
    **dict.fromkeys(["FederatedSynthetic", "SyntheticData", "make_federated_ppca", "make_multiview_ppca"], "synthetic"),
    **dict.fromkeys(["check_sites", "check_views"], "validation"),
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"fedhier.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'fedhier.data' has no attribute {name!r}")


__all__ = [
    "ViewSchema",
    "check_sites",
    "check_views",
    "MultiViewDataset",
    "HeartDisease",
    "load_alzheimer",
    "load_mfeat",
    "load_heart_disease",
    "SCENARIOS",
    "Partition",
    "partition",
    "split_by_column",
    "mask_test_views",
    "repeated_stratified_folds",
    "site_ranges",
    "combine_ranges",
    "MinMaxScaling",
    "per_dataset_minmax",
    "SyntheticData",
    "FederatedSynthetic",
    "make_multiview_ppca",
    "make_federated_ppca",
]
