"""The unsafe round-1-in-the-clear switch is loud, voids the guarantee in the ledger, and is refused with a total budget."""

import math
import warnings

import numpy as np
import pytest

from fedhier.experiments.mvppca import _dp_config, _dp_method
from fedhier.models.mvppca.dp import DPConfig


def test_default_privatises_round_one_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = DPConfig.per_release(10.0, 0.01)
    assert config.first_round == "public_prior" and not config.unsafe_public_first_round


def test_unsafe_switch_warns_and_sends_round_one_in_the_clear():
    with pytest.warns(UserWarning, match="guarantee does not hold"):
        config = DPConfig.per_release(10.0, 0.01, unsafe_public_first_round=True)
    assert config.first_round == "non_private"
    with pytest.warns(UserWarning, match="guarantee does not hold"):
        assert DPConfig.per_release(10.0, 0.01, first_round="non_private").unsafe_public_first_round
    with pytest.raises(ValueError, match="total budget"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        DPConfig.total(1.0, 1e-5, n_rounds=3, n_views=2, unsafe_public_first_round=True)


def test_the_experiment_labels_the_unsafe_rows_and_the_ledger_voids_them():
    from fedhier.estimators.mvppca import FedMVPPCA

    method = _dp_method(10.0, 0.01, unsafe=True)
    assert "UNSAFE" in method.name and "no guarantee" in method.name
    assert _dp_config(method, 2, 2).first_round == "non_private"
    assert _dp_config(_dp_method(10.0, 0.01), 2, 2).first_round == "public_prior"
    rng = np.random.default_rng(0)
    sites = [{"a": rng.random((20, 4)), "b": rng.random((20, 3))} for _ in range(2)]
    model = FedMVPPCA(2, n_rounds=2, n_local_iter=2, n_first_iter=2, random_state=0, privacy=_dp_config(method, 2, 2)).fit(sites)
    spent = model.privacy_spent_
    assert all(math.isinf(s["epsilon"]) and "void" in s["note"] for s in spent.values())
