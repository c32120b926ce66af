"""FedLin protocols through the in-process runtime (spec §3.4 bookkeeping, §3.5 messages, §6 FedAvg)."""

import numpy as np

from fedhier.models.fedlin.hierarchy import GaussianHierarchy
from fedhier.models.fedlin.hm1 import local_steps
from fedhier.models.fedlin.natural import symmetrise
from fedhier.models.fedlin.stats import SiteStats
from fedhier.protocol.fedlin import EPProtocol, FedAvgProtocol, HM1Protocol, sample_fraction, settle_site_factor
from fedhier.runtime.simulate import simulate


def _stats(rng, K, d=2, n=30):
    out = []
    for _ in range(K):
        X = rng.standard_normal((n, d))
        theta = np.array([1.0, -0.5])[:d] + 0.5 * rng.standard_normal(d)
        out.append(SiteStats.from_data(X, X @ theta + 0.3 * rng.standard_normal(n)))
    return out


def test_ep_sites_and_server_keep_q_equal_prior_plus_site_factors_under_partial_participation():
    rng = np.random.default_rng(0)
    stats = _stats(rng, 6)
    model = GaussianHierarchy(2, covariance="diagonal", noise="local")
    proto = EPProtocol(model, max_rounds=5, damping=0.7)
    res = simulate(proto, stats, n_rounds=5, random_state=3, participation=sample_fraction(0.5))
    assert all(len(rec.sites) == 3 for rec in res.history)
    init = proto.initial_broadcast()
    total_Q, total_r = init["Q"].copy(), init["r"].copy()
    for state in res.site_states:
        if state:
            r_k, Q_k = settle_site_factor(state, res.broadcast)
            total_Q += Q_k
            total_r += r_k
    np.testing.assert_allclose(symmetrise(total_Q), res.broadcast["Q"], atol=1e-8)
    np.testing.assert_allclose(total_r, res.broadcast["r"], atol=1e-8)
    # message sizes of spec §3.5: p + p^2 (+2 counts) floats up; p + p^2 + damping log down
    p = model.p
    reply_fields = proto.reply_spec.fields
    assert sum(f.size for f in reply_fields.values()) == p + p * p + 2
    assert proto.combine == "sum"


def test_hm1_protocol_is_gather_and_round_matches_algorithm_1_by_hand():
    rng = np.random.default_rng(1)
    sites = [(rng.standard_normal((10, 2)), rng.standard_normal(10)) for _ in range(3)]
    proto = HM1Protocol(3, 2, eta=0.01, n_local_steps=2, alpha=0.1)
    assert proto.combine == "gather"
    res = simulate(proto, sites, n_rounds=2, random_state=0)
    theta, omega = np.zeros((2, 3)), np.eye(3)
    for _ in range(2):
        S = theta @ np.linalg.inv(omega)
        new = theta.copy()
        for k, (X, y) in enumerate(sites):
            u = theta[:, k].copy()
            for _ in range(2):
                u = u + 2 * 0.01 * X.T @ (y - X @ u)
            new[:, k] = u - 2 * 0.01 * S[:, k]
        theta = new
        omega = 0.9 * omega + 0.1 / 2 * theta.T @ theta
    np.testing.assert_allclose(res.broadcast["theta"], theta, atol=1e-12)
    np.testing.assert_allclose(res.broadcast["omega"], omega, atol=1e-12)
    # site k is sent theta_k and (Theta Omega^-1)_k only: 2 d floats, never another site's theta
    assert proto.site_broadcast(res.broadcast, 1).keys() == {"theta", "shrink"}
    np.testing.assert_array_equal(proto.site_broadcast(res.broadcast, 1)["theta"], res.broadcast["theta"][:, 1])
    assert sum(f.size for f in proto.site_broadcast_spec.fields.values()) == 2 * 2
    assert all(set(rec.bytes_down) == {0, 1, 2} for rec in res.history)


def test_fedavg_is_the_unweighted_mean_of_local_runs():
    rng = np.random.default_rng(2)
    sites = [(rng.standard_normal((n, 3)), rng.standard_normal(n)) for n in (5, 50)]
    res = simulate(FedAvgProtocol(3, eta=0.005, n_local_steps=4), sites, n_rounds=1, random_state=0)
    expected = np.mean([local_steps(X, y, np.zeros(3), eta=0.005, n_steps=4) for X, y in sites], axis=0)
    np.testing.assert_allclose(res.broadcast["theta"], expected)


def test_ep_with_secure_aggregation_matches_plain_sum():
    from fedhier.secure.secure_round import SecureAggregator

    rng = np.random.default_rng(4)
    stats = _stats(rng, 5)
    model = GaussianHierarchy(2, covariance="fixed", tau=[0.5, 0.5], noise=0.09)
    plain = simulate(EPProtocol(model, max_rounds=3), stats, n_rounds=3, random_state=0)
    secure = simulate(EPProtocol(model, max_rounds=3), stats, n_rounds=3, random_state=0, aggregation="secure", aggregator=SecureAggregator(5))
    np.testing.assert_allclose(secure.broadcast["Q"], plain.broadcast["Q"], atol=1e-6)
    np.testing.assert_allclose(secure.broadcast["r"], plain.broadcast["r"], atol=1e-6)
