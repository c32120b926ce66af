"""FedMVPPCA with secure summation: same global model as plain sums, dropout recovery, clean failure."""

import numpy as np
import pytest

from fedhier import FedMVPPCA
from fedhier.secure.secure_round import SecureAggregator
from fedhier.runtime import RoundFailed

KW = dict(n_components=2, n_rounds=3, n_local_iter=4, n_first_iter=8, random_state=11)


@pytest.fixture(scope="module")
def sites():
    rng = np.random.default_rng(5)
    W = {"a": rng.normal(size=(6, 2)), "b": rng.normal(size=(4, 2))}
    out = []
    for s in range(5):
        x = rng.normal(size=(40, 2))
        site = {v: x @ W[v].T + 0.3 * s + 0.5 * rng.normal(size=(40, W[v].shape[0])) for v in W}
        if s == 4:
            del site["b"]  # a site without a view: its zero-padded block must not count
        out.append(site)
    return out


def assert_same_model(a, b, precision, n_sites=5):
    # Fixed-point rounding (precision / 2 per summand) is the only difference.  The
    # Gaussian blocks are smooth functions of the sums.  The inverse-gamma shape is not:
    # alpha ~ 1 / (2 s) with s = ln(mean 1/sigma2) + mean ln sigma2, so a sum error e moves
    # s by about e and alpha by a relative 2 alpha e; alpha, beta and v_sigma are compared
    # with that bound (times 10).
    for view in a.global_params_:
        alpha = a.global_params_[view]["alpha"]
        for name, value in a.global_params_[view].items():
            rtol = 10 * n_sites * precision * 2 * alpha if name in ("alpha", "beta", "var_sigma") else 1e-6
            np.testing.assert_allclose(b.global_params_[view][name], value, rtol=rtol, atol=1e3 * precision, err_msg=f"{view}/{name}")


def test_secure_equals_plain_within_fixed_point_precision(sites):
    plain = FedMVPPCA(**KW).fit(sites)
    agg = SecureAggregator(5)
    secure = FedMVPPCA(aggregation=agg, **KW).fit(sites)
    assert_same_model(plain, secure, agg.precision)
    # the secure exchange costs more bytes than the plain replies, and the history shows it
    assert secure.history_[0]["bytes_sent"] > plain.history_[0]["bytes_sent"]
    assert FedMVPPCA(aggregation="secure", **KW).fit(sites).history_[-1]["sites"] == [0, 1, 2, 3, 4]


def test_one_of_five_sites_dropping_after_masking_is_recovered(sites):
    plain = FedMVPPCA(**KW).fit(sites)
    agg = SecureAggregator(5, drop_after_masking={2: [3]})
    secure = FedMVPPCA(aggregation=agg, **KW).fit(sites)
    assert_same_model(plain, secure, agg.precision)  # site 3's masked input is still in the sum
    assert secure.history_[1]["sites"] == [0, 1, 2, 3, 4]


def test_a_site_dropping_before_masking_is_left_out_like_an_absent_site(sites):
    absent = FedMVPPCA(participation={2: [1]}, **KW).fit(sites)
    agg = SecureAggregator(5, drop_before_masking={2: [1]})
    secure = FedMVPPCA(aggregation=agg, **KW).fit(sites)
    assert_same_model(absent, secure, agg.precision)
    assert secure.history_[1]["sites"] == [0, 2, 3, 4]


def test_more_drops_than_the_threshold_allows_fail_the_round_cleanly(sites):
    agg = SecureAggregator(5, threshold=3, drop_after_masking={2: [0, 1, 2]})
    model = FedMVPPCA(aggregation=agg, **KW)
    with pytest.raises(RoundFailed, match="round 2: secure aggregation failed"):
        model.fit(sites)
    assert not hasattr(model, "history_")  # nothing half-written


@pytest.mark.parametrize("n_sites", [2, 4, 8])
def test_secure_aggregator_sums_every_site_for_powers_of_two(n_sites):
    from fedhier.protocol.messages import Field, MessageSpec

    spec = MessageSpec("toy", {"x": Field((3,))})
    rng = np.random.default_rng(n_sites)
    replies = {s: {"x": rng.normal(size=3)} for s in range(n_sites)}
    agg = SecureAggregator(n_sites)
    total, _, contributors = agg.sum(spec, replies, 1, rng)
    np.testing.assert_allclose(total["x"], sum(r["x"] for r in replies.values()), atol=n_sites * agg.precision)
    assert contributors == list(range(n_sites))
