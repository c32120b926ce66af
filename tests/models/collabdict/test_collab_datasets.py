"""Bundled anomaly data equal the shared originals read independently with pandas."""

from pathlib import Path

import numpy as np
import pytest

from fedhier.models.collabdict.datasets import CTG_COLUMNS, load_ctg, load_sensor_networks, split_sites

SHARED = Path("/work/shared/data/anomaly")
pd = pytest.importorskip("pandas")


@pytest.mark.skipif(not SHARED.exists(), reason="shared data folder not present on this machine")
def test_sensor_sites_match_the_original_csv():
    sites = load_sensor_networks("both")
    assert len(sites) == 8
    for net, offset in (("multi_hop", 0), ("single_hop", 4)):
        frame = pd.read_csv(SHARED / f"suthaharan_{net}.csv")
        for mote in range(1, 5):
            sub = frame[frame.mote_id == mote]
            site = sites[offset + mote - 1]
            assert site.name == f"{net}-mote{mote}"
            assert np.array_equal(site.X, sub[["humidity", "temperature"]].to_numpy())
            assert np.array_equal(site.y, sub["label"].to_numpy())
    assert [int(s.y.sum()) for s in sites[:4]] == [58, 0, 100, 0]  # data README: multi-hop 58/0/100/0


@pytest.mark.skipif(not SHARED.exists(), reason="shared data folder not present on this machine")
def test_ctg_is_the_odds_cardio_table():
    X, y, names = load_ctg()
    frame = pd.read_csv(SHARED / "uci_ctg.csv")
    frame = frame[frame.NSP.isin([1, 3])]
    assert X.shape == (1831, 21) and int(y.sum()) == 176
    assert np.array_equal(X, frame[list(CTG_COLUMNS)].to_numpy(dtype=float))
    assert names == CTG_COLUMNS


def test_split_sites_is_a_partition():
    X, y, _ = load_ctg()
    for conc in (None, 0.5):
        sites = split_sites(X, y, 5, seed=1, concentration=conc)
        assert sum(s.X.shape[0] for s in sites) == X.shape[0]
        assert sum(int(s.y.sum()) for s in sites) == int(y.sum())
        pooled = np.vstack([s.X for s in sites])
        assert np.array_equal(np.sort(pooled, axis=0), np.sort(X, axis=0))
