"""Serverless in-process runtime: consensus, chunking, Shamir sums on a peer graph (spec §3-§4, O7)."""

import itertools

import numpy as np
import pytest

from fedhier.privacy.sampling import NoiseSource
from fedhier.runtime.consensus import consensus_matrix, consensus_update, random_chunks, session_placement
from fedhier.runtime.graphs import inverse_chord_graph, random_regular_graph
from fedhier.protocol.base import RoundProtocol
from fedhier.protocol.messages import Field, MessageSpec, encode
from fedhier.runtime.peer import ConsensusPlan, InProcessTransport, PeerAggregation, simulate_peers


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


def test_a_graph_and_a_step_rule_give_one_plan_built_once_and_read_only():
    graph, agg = inverse_chord_graph(7), PeerAggregation(method="chunked")
    runs = [simulate_peers(SumProtocol(3), _data(7, 3), n_rounds=1, graph=graph, random_state=r, aggregation=agg)
            for r in (2, 3)]
    assert runs[0].plan is runs[1].plan  # kept from the first run
    fresh = ConsensusPlan.build(graph, agg)
    assert runs[0].plan.steps == fresh.steps and runs[0].plan.steps_chunked == fresh.steps_chunked
    assert np.array_equal(runs[0].plan.adjacency, fresh.adjacency) and runs[0].plan.diameter == fresh.diameter
    with pytest.raises(ValueError, match="read-only"):
        runs[0].plan.adjacency[0, 1] = 0
    other = simulate_peers(SumProtocol(3), _data(7, 3), n_rounds=1, graph=graph, random_state=2,
                           aggregation=PeerAggregation(method="chunked", step="max-degree"))
    assert other.plan.steps != fresh.steps  # another rule, another plan


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


class RecordingTransport(InProcessTransport):
    """An in-process transport that records every private exchange: receivers, what was sent, what arrived."""

    def __init__(self, n_sites):
        super().__init__(n_sites)
        self.private = []

    def all_to_all(self, spec, messages, receivers=None):
        out = super().all_to_all(spec, messages, receivers)
        self.private.append((receivers, {s: [m["x"].copy() for m in msgs] for s, msgs in messages.items()},
                             {j: [m["x"].copy() for m in msgs] for j, msgs in out.items()}))
        return out


def test_shamir_committee_sum_is_exact_and_only_the_public_committee_receives_shares():
    from fedhier.runtime.peer import aggregate_sums, shamir_committee
    from fedhier.secure.fixedpoint import PRIME

    n_sites, k, seed = 20, 7, 11
    aggregation = PeerAggregation(method="shamir", committee_size=k)
    vectors = {s: v for s, v in enumerate(_data(n_sites, size=5, seed=3))}
    transport = RecordingTransport(n_sites)
    sums, _ = aggregate_sums(transport, vectors, round=1, seed=seed, plan=None, aggregation=aggregation)
    exact = np.sum(list(vectors.values()), axis=0)
    for s in range(n_sites):  # fixed point with 24 fractional bits: each of the 20 encodings rounds by <= 2^-25
        assert np.max(np.abs(sums[s] - exact)) <= n_sites * 2.0 ** -25
        assert np.array_equal(sums[s], sums[0])
    committee = shamir_committee(seed, n_sites, range(n_sites), k)
    assert committee == shamir_committee(seed, n_sites, list(range(n_sites)), k)  # what every peer derives
    assert len(set(committee)) == k and committee != list(range(k))  # drawn from the seed, not the first sites
    [(receivers, sent, received)] = transport.private
    assert receivers == committee and sorted(received) == sorted(committee)
    # a member sees shares, not replies: its share from each site is a field element, not the site's encoding
    codec_scale = 2.0 ** 24
    for j in committee:
        for s, share_row in enumerate(received[j]):
            assert share_row.min() >= 0 and share_row.max() < PRIME
            assert not np.array_equal(share_row, np.round(vectors[s] * codec_scale).astype(np.int64) % PRIME)
    # bytes: the t = 4 publishers send their sums to each other, then the sum goes down a tree in one step: each
    # publisher to its 4 children (the next 16 sites of the public order, which are all the others), each child back
    # to its parent; so an outsider sends k shares and one vector, the first publisher k - 1 + t - 1 + 4
    msg = len(encode(MessageSpec("collab-aggregate", {"x": Field((5,), "int64")}), {"x": np.zeros(5, np.int64)}))
    outsider = next(s for s in range(n_sites) if s not in committee)
    assert transport.bytes_sent[outsider] == (k + 1) * msg
    t = k // 2 + 1
    assert transport.bytes_sent[committee[0]] == (k - 1 + t - 1 + 4) * msg
    assert transport.bytes_sent[committee[t]] == (k - 1 + 1) * msg  # not among the first t members: does not publish


def test_shamir_bytes_of_every_peer_stay_bounded_as_the_peers_grow():
    # k = 31, t = 16: at 50 peers the sum reaches everyone in one tree step (16 + 64 >= 50), at 800 in three
    # (16 + 64 + 256 + 1024 >= 800); no peer sends more than its k shares, t - 1 vectors to the other publishers
    # and, per step, one to its parent and one to each of its 4 children: the largest is the same sum at any S
    from fedhier.runtime.peer import aggregate_sums

    aggregation = PeerAggregation(method="shamir")
    msg = len(encode(MessageSpec("collab-aggregate", {"x": Field((3,), "int64")}), {"x": np.zeros(3, np.int64)}))
    largest = {}
    for n_sites, depth in ((50, 1), (800, 3)):
        vectors = {s: v for s, v in enumerate(_data(n_sites, size=3, seed=4))}
        transport = InProcessTransport(n_sites)
        sums, exchanges = aggregate_sums(transport, vectors, round=1, seed=2, plan=None, aggregation=aggregation)
        exact = np.sum(list(vectors.values()), axis=0)
        assert exchanges == depth
        assert all(np.max(np.abs(sums[s] - exact)) <= n_sites * 2.0 ** -25 for s in range(n_sites))
        largest[n_sites] = max(transport.bytes_sent.values())
        assert largest[n_sites] <= (31 + 15 + depth * 5) * msg
    assert largest[800] <= 2 * largest[50]  # was 800 / 50 times as many for a publisher sending to every peer


def test_default_committee_is_every_peer_when_few_and_logarithmic_when_many():
    from fedhier.runtime.peer import shamir_committee_size, shamir_threshold

    shamir = PeerAggregation(method="shamir")
    assert [shamir_committee_size(shamir, s) for s in (11, 31, 100, 1_000, 100_000)] == [11, 31, 31, 31, 35]
    assert [shamir_threshold(shamir, s) for s in (11, 31, 1_000)] == [6, 16, 16]
    assert shamir_committee_size(PeerAggregation(method="shamir", threshold=40), 1_000) == 40
    with pytest.raises(ValueError, match="committee size"):
        shamir_threshold(PeerAggregation(method="shamir", committee_size=5, threshold=6), 100)


def test_fewer_than_t_committee_shares_have_the_same_distribution_whatever_the_secret():
    # An adversary holding t - 1 = 3 of the k = 7 shares tabulates them over 40,000 independent sharings
    # (cryptographic coefficients, GF(11)) of secret 0 and of secret 5: the two tables agree (chi-square,
    # two samples), while the t = 4 shares of the same sharings tell the secrets apart (disjoint supports).
    from scipy.stats import chi2_contingency

    from fedhier.secure.shamir import share

    q, k, t, n = 11, 7, 4, 40_000
    tables, supports = [], []
    for secret in (0, 5):
        rows = share(np.full(n, secret), k, t, modulus=q)
        seen = rows[[1, 3, 6]]  # colluders at z = 2, 4, 7
        tables.append(np.bincount((seen[0] * q + seen[1]) * q + seen[2], minlength=q ** 3))
        supports.append(set(map(tuple, rows[:t].T)))
    assert chi2_contingency(np.array(tables) + 1)[1] > 1e-4
    assert not supports[0] & supports[1]


def test_an_mpi_neighbour_whose_step_message_does_not_hold_its_parts_exactly_is_refused():
    """Over MPI one message per neighbour carries its parts of every consensus session of the step.  An honest
    message is split into the sessions it belongs to; a lying neighbour's message with a part cut short or with
    bytes after its last part is refused, not read up to what fits."""
    from fedhier.protocol.messages import MessageError
    from fedhier.runtime.mpi import MPITransport

    spec = MessageSpec("collab-aggregate", {"x": Field((2,), "float64")})

    class Comm:  # rank 0 of 3; nothing is sent: the neighbours' replies are given below
        def Get_rank(self):
            return 0

        def Get_size(self):
            return 3

    class Transport(MPITransport):
        def __init__(self, replies):
            super().__init__(Comm())
            self.replies = replies

        def _round_trip(self, payloads, sources):
            assert sorted(payloads) == sorted(sources) == [1, 2]
            return {j: self.replies[j] for j in sources}

    part = {s: {k: encode(spec, {"x": np.array([10.0 * s + k, -1.0])}) for k in range(2)} for s in (1, 2)}
    topologies = [[1, 2], [1]]  # session 0: neighbours 1 and 2; session 1: neighbour 1 only
    honest = {1: part[1][0] + part[1][1], 2: part[2][0]}
    mine = {0: [{"x": np.zeros(2)}, {"x": np.ones(2)}]}
    got = Transport(honest).exchange_sessions(topologies, spec, mine)
    assert [[m["x"][0] for m in session] for session in got[0]] == [[10.0, 20.0], [11.0]]
    for lie in (honest[1][:-8], honest[1] + bytes(8), honest[1] + part[1][0]):
        with pytest.raises(MessageError, match="does not hold 2 parts"):
            Transport({1: lie, 2: honest[2]}).exchange_sessions(topologies, spec, mine)


def test_a_peer_outside_the_publishers_never_receives_a_committee_members_sum():
    """A curious peer outside the first t committee members: the members' sums (shares of the total) go to the
    publishers only, and what passes down the publishing tree is the total itself or the 'not known yet' marker."""
    from fedhier.runtime.peer import aggregate_sums, shamir_committee, shamir_threshold
    from fedhier.secure.fixedpoint import PRIME

    class Recording(InProcessTransport):
        def __init__(self, n_sites):
            super().__init__(n_sites)
            self.gathers, self.inboxes = [], []

        def all_gather(self, spec, messages, senders, receivers=None):
            self.gathers.append((list(senders), None if receivers is None else list(receivers)))
            return super().all_gather(spec, messages, senders, receivers)

        def exchange(self, topology, spec, messages):
            out = super().exchange(topology, spec, messages)
            self.inboxes.append({s: [m["x"].copy() for m in msgs] for s, msgs in out.items()})
            return out

    n_sites, k, seed = 40, 9, 5
    aggregation = PeerAggregation(method="shamir", committee_size=k)
    vectors = {s: v for s, v in enumerate(_data(n_sites, size=4, seed=6))}
    transport = Recording(n_sites)
    aggregate_sums(transport, vectors, round=1, seed=seed, plan=None, aggregation=aggregation)
    publishers = shamir_committee(seed, n_sites, range(n_sites), k)[:shamir_threshold(aggregation, n_sites)]
    assert transport.gathers == [(publishers, publishers)]  # members' sums: publishers to publishers only
    totals = {tuple(x) for inbox in transport.inboxes for s, msgs in inbox.items() for x in msgs}
    unknown = (-1,) * 4
    assert len(totals - {unknown}) == 1  # down the tree: only the total, which every peer learns anyway
    total = np.array(next(iter(totals - {unknown})))
    assert total.min() >= 0 and total.max() < PRIME
    assert any(s not in publishers and any(tuple(x) != unknown for x in msgs)
               for inbox in transport.inboxes for s, msgs in inbox.items())  # outsiders did receive it


@pytest.mark.parametrize("method", ["consensus", "chunked"])
def test_finite_time_and_constant_steps_give_the_same_sum(method):
    graph = random_regular_graph(9, 4, rng=4)
    sites = _data(9)
    runs = {step: simulate_peers(SumProtocol(4), sites, n_rounds=1, graph=graph, random_state=6,
                                 aggregation=PeerAggregation(method=method, step=step))
            for step in ("finite-time", "max-degree")}
    exact = np.sum(sites, axis=0)
    for res in runs.values():
        assert np.allclose(res.broadcast["total"], exact, rtol=0, atol=1e-9 * np.abs(exact).max())
    assert runs["finite-time"].plan.n_steps < runs["max-degree"].plan.n_steps / 4


def test_an_unknown_step_rule_is_refused_when_the_aggregation_is_made():
    with pytest.raises(ValueError, match="finite-time"):
        PeerAggregation(step="fastest")
