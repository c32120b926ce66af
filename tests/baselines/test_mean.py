"""The training-mean baseline against the pooled column means."""

import numpy as np
import pytest

from fedhier.baselines import TrainingMean
from fedhier.metrics import reconstruction_mae


def test_means_are_the_pooled_column_means_over_observed_subjects():
    rng = np.random.default_rng(0)
    a = {"x": rng.normal(size=(5, 3)), "y": rng.normal(size=(5, 2))}
    b = {"x": rng.normal(size=(4, 3)), "y": rng.normal(size=(4, 2))}
    b["y"][1] = np.nan  # a subject lacking view y
    model = TrainingMean().fit([a, b])
    pooled_y = np.vstack([a["y"], b["y"]])
    np.testing.assert_allclose(model.means_["x"], np.vstack([a["x"], b["x"]]).mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(model.means_["y"], np.nanmean(pooled_y, axis=0), rtol=1e-14)
    test = {"x": rng.normal(size=(6, 3)), "y": rng.normal(size=(6, 2))}
    rec = model.reconstruct(test)
    assert rec["x"].shape == (6, 3) and np.all(rec["y"] == model.means_["y"])
    expected = np.abs(np.hstack([test["x"] - model.means_["x"], test["y"] - model.means_["y"]])).mean()
    assert reconstruction_mae(test, rec) == pytest.approx(expected, rel=1e-12)
    assert not TrainingMean.has_latent


def test_refuses_an_unfitted_call_and_an_unseen_view():
    with pytest.raises(RuntimeError, match="not fitted"):
        TrainingMean().reconstruct({"x": np.zeros((1, 2))})
    model = TrainingMean().fit([{"x": np.ones((3, 2))}])
    with pytest.raises(ValueError, match="not seen"):
        model.reconstruct({"z": np.zeros((1, 2))})
