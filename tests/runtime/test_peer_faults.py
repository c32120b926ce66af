"""The serverless runtime goes on without lost peers, or stops with their state saved when the graph splits."""

import sys
from pathlib import Path

import numpy as np
import pytest

from fedhier.runtime.graphs import cycle_graph, random_regular_graph
from fedhier.runtime.peer import PeerAggregation, PeerGraphSplit, simulate_peers

sys.path.insert(0, str(Path(__file__).parent))
from test_peer import SumProtocol, _data  # noqa: E402


@pytest.mark.parametrize("method, tol", [("consensus", 1e-9), ("chunked", 1e-8), ("shamir", 2e-6)])
def test_a_lost_peer_is_left_out_and_the_rest_go_on(method, tol):
    graph = random_regular_graph(12, 4, rng=0)
    sites = _data(12)
    res = simulate_peers(SumProtocol(4), sites, n_rounds=3, graph=graph, random_state=5,
                         aggregation=PeerAggregation(method=method), lose={2: [5]})
    survivors = [s for s in range(12) if s != 5]
    # round r's total is r times the sum of the data of the sites that took part (closed form)
    expected = 3 * sum(sites[s] for s in survivors)
    assert sorted(res.broadcasts) == survivors
    for s in survivors:
        np.testing.assert_allclose(res.broadcasts[s]["total"], expected, rtol=tol, atol=tol)
    assert [h["lost"] for h in res.history] == [[], [5], []]
    assert res.history[-1]["sites"] == survivors and res.history[-1]["absent"] == [5]


def test_losing_a_cut_makes_every_survivor_stop_with_its_last_completed_round():
    sites = _data(8)
    with pytest.raises(PeerGraphSplit, match="no longer form a connected graph") as info:
        simulate_peers(SumProtocol(4), sites, n_rounds=3, graph=cycle_graph(8), random_state=1, lose={2: [1, 5]})
    err = info.value
    assert err.round == 2 and err.lost == [1, 5]
    saved = err.result
    assert sorted(saved.broadcasts) == [0, 2, 3, 4, 6, 7] and len(saved.history) == 1
    for s, b in saved.broadcasts.items():  # the model after round 1, from every site
        np.testing.assert_allclose(b["total"], sum(sites), rtol=1e-9)
    assert set(saved.site_states) == set(saved.broadcasts)


def test_too_few_peers_for_the_shamir_threshold_stop_the_fit():
    with pytest.raises(PeerGraphSplit, match="fewer than the Shamir threshold 6"):
        simulate_peers(SumProtocol(2), _data(10, size=2), n_rounds=2, random_state=2,
                       aggregation=PeerAggregation(method="shamir"), lose={1: [0, 1, 2, 3, 4]})


def test_a_site_passes_a_barrier_only_one_behind_the_survivors():
    from fedhier.runtime.peer import Agreement, InProcessTransport, PeerLost

    transport = InProcessTransport(4)
    assert not transport.pass_barrier(Agreement(frozenset({3}), 0))  # where it stands: redo what it was doing
    assert transport.pass_barrier(Agreement(frozenset({3}), 1, True))  # a survivor passed it: so does this site
    assert (transport.barriers_passed, transport.last_outcome) == (1, True)
    with pytest.raises(PeerLost, match="passed 3 barriers, this site 1"):  # no correct peer is two ahead
        transport.pass_barrier(Agreement(frozenset({3}), 3))


def test_shamir_committee_sum_survives_losing_outsiders_and_k_minus_t_members():
    from fedhier.runtime.peer import shamir_committee

    n_sites, k, seed = 20, 7, 4
    committee = shamir_committee(seed, n_sites, range(n_sites), k)
    outsider = next(s for s in range(n_sites) if s not in committee)
    lost = [outsider] + committee[:k - (k // 2 + 1)]  # 3 = k - t members, among them publishers
    sites = _data(n_sites)
    res = simulate_peers(SumProtocol(4), sites, n_rounds=2, random_state=seed,
                         aggregation=PeerAggregation(method="shamir", committee_size=k), lose={2: lost})
    survivors = [s for s in range(n_sites) if s not in lost]
    expected = 2 * sum(sites[s] for s in survivors)
    for s in survivors:
        np.testing.assert_allclose(res.broadcasts[s]["total"], expected, rtol=0, atol=2 * n_sites * 2.0 ** -25)
    assert res.history[1]["lost"] == sorted(lost)
