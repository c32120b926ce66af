"""Data layer: the site data convention, input checks, bundled real data, site partitions,
federated min–max scaling and synthetic multi-view PPCA data.

A site is a mapping ``view name -> float64 array (n, d_view)``; a view absent from the mapping
is not measured by the site; an entirely-NaN row within a view means that subject lacks the view.
"""

from importlib import import_module

from fedhier.data.datasets import HeartDisease, MultiViewDataset, load_alzheimer, load_heart_disease, load_mfeat
from fedhier.data.partition import (
    SCENARIOS,
    Partition,
    mask_test_views,
    partition,
    repeated_stratified_folds,
    split_by_column,
)
from fedhier.data.scaling import MinMaxScaling, combine_ranges, per_dataset_minmax, site_ranges
from fedhier.data.schema import ViewSchema
from fedhier.data.validation import check_sites, check_views

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

#: the synthetic multi-view PPCA data import the model's parameters (and scipy): imported on first use, so
#: that the site-data checks a Flower site step needs stay light
_SYNTHETIC = ("FederatedSynthetic", "SyntheticData", "make_federated_ppca", "make_multiview_ppca")


def __getattr__(name: str):
    if name in _SYNTHETIC:
        return getattr(import_module("fedhier.data.synthetic"), name)
    raise AttributeError(f"module 'fedhier.data' has no attribute {name!r}")
