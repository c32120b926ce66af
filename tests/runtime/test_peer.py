"""Serverless in-process runtime: consensus, chunking, Shamir sums on a peer graph (spec §3-§4, O7)."""

import itertools

import numpy as np
import pytest

from fedhier.privacy.sampling import NoiseSource
from fedhier.runtime.consensus import consensus_matrix, consensus_update, random_chunks, session_placement
from fedhier.runtime.graphs import inverse_chord_graph, random_regular_graph
from fedhier.protocol.base import RoundProtocol
from fedhier.protocol.messages import Field, MessageSpec, encode
from fedhier.runtime.peer import PeerAggregation, simulate_peers


class SumProtocol(RoundProtocol):
    """Each site replies its private vector plus the round number; the global step keeps the sum."""

    name = "test-sum"
    combine = "sum"

    def __init__(self, size):
        self.size = size

    @property
    def reply_spec(self):
        return MessageSpec("test-sum-reply", {"x": Field((self.size,))})

    @property
    def broadcast_spec(self):
        return MessageSpec("test-sum-total", {"total": Field((self.size,))})

    def initial_broadcast(self):
        return {"total": np.zeros(self.size)}

    def site_step(self, ctx, broadcast):
        return {"x": np.asarray(ctx.data, dtype=float) * ctx.round}

    def global_step(self, combined, round, previous):
        return {"total": combined["x"]}


class GatherProtocol(SumProtocol):
    combine = "gather"


def _data(n_sites, size=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=size) * 30 for _ in range(n_sites)]


@pytest.mark.parametrize("method, graph, tol", [
    ("consensus", inverse_chord_graph(11), 1e-9),
    ("consensus", random_regular_graph(12, 4, rng=0), 1e-9),
    ("chunked", inverse_chord_graph(11), 1e-8),
    ("shamir", None, 2e-6),
])
def test_peer_sum_equals_exact_sum_and_every_site_agrees(method, graph, tol):
    n_sites = 11 if graph is None else graph.shape[0]
    sites = _data(n_sites)
    res = simulate_peers(SumProtocol(4), sites, n_rounds=2, graph=graph, random_state=5,
                         aggregation=PeerAggregation(method=method))
    exact = 2 * np.sum(sites, axis=0)
    for s in range(n_sites):
        assert np.allclose(res.broadcasts[s]["total"], exact, rtol=0, atol=tol * np.abs(exact).max())
        assert np.array_equal(res.broadcasts[s]["total"], res.broadcasts[0]["total"])  # O7: identical copies
    assert all(h["disagreement"] == 0.0 for h in res.history)


def test_without_agreement_copies_differ_only_by_consensus_error():
    sites = _data(11)
    res = simulate_peers(SumProtocol(4), sites, n_rounds=1, graph=inverse_chord_graph(11), random_state=1,
                         aggregation=PeerAggregation(agree=False, rel_tol=1e-6))
    exact = np.sum(sites, axis=0)
    assert 0 < res.history[0]["disagreement"] < 1e-4 * np.abs(exact).max()


def test_bytes_counted_along_edges():
    graph = inverse_chord_graph(7)
    res = simulate_peers(SumProtocol(3), _data(7, 3), n_rounds=1, graph=graph, random_state=2,
                         aggregation=PeerAggregation(relabel=False))
    plan = res.plan
    msg = len(encode(MessageSpec("collab-aggregate", {"x": Field((3,))}), {"x": np.zeros(3)}))
    degree = (graph > 0).sum(axis=1)
    for s in range(7):
        assert res.history[0]["bytes_sent"][s] == msg * degree[s] * (plan.n_steps + plan.diameter)


def test_chunked_run_gives_the_sum_whatever_the_masks_and_relabels_each_session():
    sites = _data(11)
    agg = PeerAggregation(method="chunked")
    a = simulate_peers(SumProtocol(4), sites, n_rounds=1, random_state=3, aggregation=agg)
    b = simulate_peers(SumProtocol(4), sites, n_rounds=1, random_state=3, aggregation=agg)
    # the masks are fresh secrets every run; they cancel up to the consensus tolerance
    assert np.allclose(a.broadcast["total"], np.sum(sites, axis=0), rtol=1e-9)
    assert np.allclose(a.broadcast["total"], b.broadcast["total"], rtol=1e-9)
    perms = [session_placement(3, 1, s, 11) for s in range(3)]
    assert not np.array_equal(perms[0], perms[1]) and sorted(perms[0]) == list(range(11))


def test_consensus_update_is_one_row_of_w():
    graph = inverse_chord_graph(11)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(11, 2))
    eps = 0.25
    nxt = consensus_matrix(graph, eps) @ x
    for s in range(11):
        nb = np.flatnonzero(graph[s])
        assert np.allclose(consensus_update(x[s], [x[j] for j in nb], graph[s, nb], eps), nxt[s])


def test_random_chunks_sum_to_the_value():
    v = np.random.default_rng(1).normal(size=6)
    chunks = random_chunks(v, 3, 100.0, NoiseSource())
    assert chunks.shape == (3, 6) and np.allclose(chunks.sum(axis=0), v)
    assert np.abs(chunks).max() > 10 * np.abs(v).max()  # masks dominate what a first neighbour sees


def test_gather_protocol_refused():
    with pytest.raises(ValueError, match="sums"):
        simulate_peers(GatherProtocol(2), _data(5, 2), n_rounds=1, random_state=0)


def test_graph_size_mismatch_refused():
    with pytest.raises(ValueError, match="vertices"):
        simulate_peers(SumProtocol(2), _data(5, 2), n_rounds=1, graph=inverse_chord_graph(7), random_state=0)


def test_shamir_t_minus_one_colluding_holders_learn_nothing():
    # Field test in GF(13): for every secret, the t-1 = 2 shares seen by a coalition are uniformly
    # distributed over all polynomial coefficients, so their distribution does not depend on the secret.
    from fedhier.secure.shamir import evaluate_shares, reconstruct

    q, t, coalition = 13, 3, np.array([2, 5])
    histograms = []
    for secret in range(q):
        counts = {}
        for coeffs in itertools.product(range(q), repeat=t - 1):
            seen = evaluate_shares(np.array([secret]), np.array(coeffs).reshape(t - 1, 1), coalition, modulus=q)
            key = tuple(seen[:, 0])
            counts[key] = counts.get(key, 0) + 1
        histograms.append(counts)
    assert all(h == histograms[0] for h in histograms)
    assert len(histograms[0]) == q ** (t - 1) and set(histograms[0].values()) == {1}
    # and t shares of summed sharings reconstruct the sum of the secrets
    a = evaluate_shares(np.array([4]), np.array([[7], [1]]), np.array([1, 2, 3]), modulus=q)
    b = evaluate_shares(np.array([11]), np.array([[3], [9]]), np.array([1, 2, 3]), modulus=q)
    assert reconstruct((a + b) % q, np.array([1, 2, 3]), modulus=q)[0] == (4 + 11) % q


def test_exposure_probability_matches_monte_carlo():
    from fedhier.runtime.consensus import exposure_probability

    rng = np.random.default_rng(0)
    S, d, q, C = 12, 4, 3, 2
    coalition = set(range(1, q + 1))  # site 0 is watched by sites 1..q
    hits = 0
    trials = 20000
    for _ in range(trials):
        # neighbours of site 0 in each session: a uniformly random d-subset of the other S-1 sites
        hits += all(coalition & set(rng.choice(np.arange(1, S), size=d, replace=False)) for _ in range(C))
    assert hits / trials == pytest.approx(exposure_probability(S, d, q, C), abs=0.01)


def test_chunk_masks_from_site_entropy_change_only_rounding():
    """Without random_state the masks are the sites' own draws: the sum is unchanged up to rounding."""
    sites = _data(11)
    res = simulate_peers(SumProtocol(4), sites, n_rounds=1, graph=inverse_chord_graph(11), random_state=None,
                         aggregation=PeerAggregation(method="chunked"))
    exact = np.sum(sites, axis=0)
    assert np.allclose(res.broadcast["total"], exact, rtol=0, atol=1e-8 * np.abs(exact).max())
