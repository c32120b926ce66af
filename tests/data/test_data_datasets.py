"""Loaders against the raw CSV files read independently with pandas."""

import gzip
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedhier.data import load_alzheimer, load_heart_disease, load_mfeat

SHARED = Path("/work/shared/data")
BUNDLED = resources.files("fedhier.data").joinpath("bundled")


def _raw(relative):
    path = SHARED / relative
    if not path.exists():
        pytest.skip(f"{path} not available on this machine")
    return path


@pytest.mark.parametrize(
    "bundled, relative",
    [("ad_data.csv.gz", "multiview/ad_data.csv"), ("heart_disease_uci.csv.gz", "grouped/heart_disease_uci.csv")]
    + [(f"mfeat-{v}.csv.gz", f"multiview/mfeat/mfeat-{v}.csv") for v in ("fou", "fac", "kar", "pix", "zer", "mor")],
)
def test_bundled_files_are_unmodified_copies(bundled, relative):
    assert gzip.decompress(BUNDLED.joinpath(bundled).read_bytes()) == _raw(relative).read_bytes()


def test_attribution_names_every_bundled_file():
    text = BUNDLED.joinpath("ATTRIBUTION.md").read_text()
    for f in BUNDLED.iterdir():
        if f.name.endswith(".gz"):
            assert f"`{f.name}`" in text
    for licence in ("MIT", "CC BY 4.0", "Craig-Schapiro"):
        assert licence in text


def test_alzheimer_against_pandas():
    raw = pd.read_csv(_raw("multiview/ad_data.csv"))
    ds = load_alzheimer()
    assert ds.n_samples == 333
    assert ds.schema.names == ("proteins", "csf", "demographics")
    assert ds.schema.dims == (124, 3, 4)
    np.testing.assert_array_equal(ds.labels, (raw["Class"] == "Impaired").astype(int))
    assert ds.labels.sum() == 91 and ds.label_names[1] == "Impaired"
    np.testing.assert_array_equal(ds.views["csf"], raw[["tau", "p_tau", "Ab_42"]].to_numpy())
    proteins = raw.drop(columns=["rownames", "age", "tau", "p_tau", "Ab_42", "male", "Genotype", "Class"])
    assert ds.feature_names["proteins"] == tuple(proteins.columns)
    np.testing.assert_array_equal(ds.views["proteins"], proteins.to_numpy(dtype=float))
    demo = ds.views["demographics"]
    np.testing.assert_array_equal(demo[:, :2], raw[["age", "male"]].to_numpy(dtype=float))
    np.testing.assert_array_equal(demo[:, 2], raw["Genotype"].str.count("4"))
    np.testing.assert_array_equal(demo[:, 3], raw["Genotype"].str.count("2"))
    e2e4 = (raw["Genotype"] == "E2E4").to_numpy()
    assert e2e4.any() and np.all(demo[e2e4, 2:] == 1)
    assert all(X.dtype == np.float64 and np.isfinite(X).all() for X in ds.views.values())


def test_mfeat_against_pandas():
    ds = load_mfeat()
    dims = {"fou": 76, "fac": 216, "kar": 64, "pix": 240, "zer": 47, "mor": 6}
    assert dict(zip(ds.schema.names, ds.schema.dims)) == dims
    for view, d in dims.items():
        raw = pd.read_csv(_raw(f"multiview/mfeat/mfeat-{view}.csv"))
        assert raw.shape == (2000, d + 1)
        np.testing.assert_array_equal(ds.views[view], raw.iloc[:, :-1].to_numpy(dtype=float))
        np.testing.assert_array_equal(ds.labels, raw.iloc[:, -1].to_numpy())
    assert np.bincount(ds.labels).tolist() == [200] * 10


def test_subset():
    ds = load_alzheimer()
    sub = ds.subset(np.array([5, 0, 7]))
    assert sub.n_samples == 3
    np.testing.assert_array_equal(sub.views["csf"], ds.views["csf"][[5, 0, 7]])
    np.testing.assert_array_equal(sub.labels, ds.labels[[5, 0, 7]])
    mask = ds.labels == 1
    assert ds.subset(mask).n_samples == 91
    with pytest.raises(ValueError, match="boolean mask"):
        ds.subset(mask[:10])


def test_heart_disease_against_pandas():
    raw = pd.read_csv(_raw("grouped/heart_disease_uci.csv"))
    hd = load_heart_disease()
    X = pd.DataFrame(hd.features, columns=hd.feature_names)
    assert hd.features.shape == (920, 18)
    np.testing.assert_array_equal(hd.target, raw["num"])
    np.testing.assert_array_equal(hd.site_labels, raw["dataset"])
    assert hd.site_names == ("Cleveland", "Hungary", "Switzerland", "VA Long Beach")
    assert {k: v.size for k, v in hd.site_indices().items()} == {
        "Cleveland": 304, "Hungary": 293, "Switzerland": 123, "VA Long Beach": 200
    }
    np.testing.assert_array_equal(X["age"], raw["age"])
    np.testing.assert_array_equal(X["sex"], (raw["sex"] == "Male").astype(float))
    chol = raw["chol"].where(raw["chol"] != 0)
    np.testing.assert_array_equal(X["chol"], chol)
    assert X["chol"][hd.site_labels == "Switzerland"].isna().all()
    np.testing.assert_array_equal(X["oldpeak"], raw["oldpeak"])
    np.testing.assert_array_equal(X["ca"], raw["ca"])
    np.testing.assert_array_equal(X["fbs"], raw["fbs"].map({True: 1.0, False: 0.0}).astype(float))
    for level in ("typical angina", "atypical angina", "non-anginal"):
        np.testing.assert_array_equal(X["cp_" + level.replace(" ", "_").replace("-", "_")], (raw["cp"] == level))
    thal_missing = raw["thal"].isna().to_numpy()
    assert X.loc[thal_missing, ["thal_fixed_defect", "thal_reversable_defect"]].isna().all().all()
    np.testing.assert_array_equal(
        X.loc[~thal_missing, "thal_reversable_defect"], raw.loc[~thal_missing, "thal"] == "reversable defect"
    )


def test_package_import_is_light():
    """Importing fedhier.data loads neither pandas nor scikit-learn."""
    import subprocess
    import sys

    code = "import sys, fedhier.data; print(sorted(m for m in ('pandas', 'sklearn') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
