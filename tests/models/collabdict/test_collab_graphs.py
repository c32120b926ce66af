"""Peer graphs, spectra, step sizes and the stopping rule (spec §3.2-3.4, O1-O3)."""

import numpy as np
import pytest

from fedhier.runtime import graphs
from fedhier.runtime.consensus import average_consensus, consensus_matrix
from fedhier.runtime.graphs import (check_adjacency, consensus_steps, contraction_factor, cycle_graph,
                                              default_graph, diameter, graph_from_edges, inverse_chord_graph,
                                              laplacian, laplacian_spectrum, random_regular_graph, relabel,
                                              step_size)


@pytest.mark.parametrize("p", [7, 11, 31])
def test_inverse_chord_edges_by_brute_force(p):
    a = inverse_chord_graph(p)
    for x in range(p):
        inv = 0 if x == 0 else next(y for y in range(1, p) if (x * y) % p == 1)
        expected = {(x + 1) % p, (x - 1) % p, inv} - {x}
        assert set(np.flatnonzero(a[x])) == expected
    assert np.array_equal(a, a.T)
    assert a.sum(axis=1).max() == 3


@pytest.mark.parametrize("p, lam2", [(11, 0.593), (31, 0.226), (61, 0.188), (101, 0.132)])
def test_inverse_chord_gap_matches_spec_table(p, lam2):
    spec = laplacian_spectrum(inverse_chord_graph(p))
    assert spec.lambda_2 == pytest.approx(lam2, abs=6e-4)
    assert spec.lambda_max < 6.0


def test_inverse_chord_needs_prime():
    with pytest.raises(ValueError, match="prime"):
        inverse_chord_graph(15)


def test_random_regular_graph_is_simple_regular_and_well_connected():
    a = random_regular_graph(40, 4, rng=3)
    assert np.all(a.sum(axis=1) == 4)
    assert a.max() == 1 and np.all(np.diag(a) == 0)
    assert laplacian_spectrum(a).lambda_2 > 0.3
    assert np.array_equal(a, random_regular_graph(40, 4, rng=3))  # common seed -> same graph everywhere
    with pytest.raises(ValueError, match="degree"):
        random_regular_graph(5, 5)


def test_spectrum_against_numpy_eigenvalues():
    a = random_regular_graph(24, 4, rng=0)
    ev = np.sort(np.linalg.eigvalsh(np.diag(a.sum(1)) - a))
    spec = laplacian_spectrum(a)
    assert spec.lambda_2 == pytest.approx(ev[1]) and spec.lambda_max == pytest.approx(ev[-1])


@pytest.mark.parametrize("rule", ["max-degree", "optimal", "paper"])
def test_step_rule_gives_contraction_equal_to_second_eigenvalue_of_w(rule):
    a = inverse_chord_graph(31)
    spec = laplacian_spectrum(a)
    eps = step_size(spec, rule)
    assert 0 < eps < 2 / spec.lambda_max
    w_ev = np.sort(np.abs(np.linalg.eigvalsh(consensus_matrix(a, eps))))
    assert w_ev[-1] == pytest.approx(1.0)
    assert contraction_factor(spec, eps) == pytest.approx(w_ev[-2])  # rho = second largest |eig(W)|


def test_optimal_step_minimises_rho():
    spec = laplacian_spectrum(random_regular_graph(30, 4, rng=1))
    best = contraction_factor(spec, step_size(spec, "optimal"))
    grid = np.linspace(1e-3, 2 / spec.lambda_max - 1e-3, 400)
    assert best <= min(contraction_factor(spec, e) for e in grid) + 1e-12


def test_bipartite_regular_graph_fails_at_one_over_dmax():
    # even cycle: lambda_S = 2 d = 4, so epsilon = 1/d_max = 1/2 = 2/lambda_S is not allowed (§3.2)
    spec = laplacian_spectrum(cycle_graph(10))
    with pytest.raises(ValueError, match="violates"):
        step_size(spec, 0.5)
    x = np.zeros((10, 1))
    x[::2] = 1.0  # the alternating eigenvector of eigenvalue -1 of W: never converges
    out = average_consensus(x, cycle_graph(10), 0.5, 101)
    assert np.abs(out - 0.5).max() == pytest.approx(0.5)


def test_disconnected_graph_refused():
    a = graph_from_edges(6, [(0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3)])
    with pytest.raises(ValueError, match="disconnected"):
        step_size(laplacian_spectrum(a))
    with pytest.raises(ValueError, match="disconnected"):
        diameter(a)


@pytest.mark.parametrize("graph", [
    inverse_chord_graph(31), inverse_chord_graph(31, simple=True), random_regular_graph(30, 4, rng=2), cycle_graph(12),
    graph_from_edges(8, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 0), (0, 4), (2, 6)]),
])
def test_stopping_rule_reaches_tolerance_on_every_family(graph):
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=(graph.shape[0], 3)) * 5.0
    spec = laplacian_spectrum(graph)
    eps = step_size(spec)
    rel_tol = 1e-9
    T = consensus_steps(spec, eps, rel_tol)
    delta = np.abs(x0 - x0.mean(axis=0)).max()
    out = average_consensus(x0, graph, eps, T)
    assert np.abs(out - x0.mean(axis=0)).max() <= rel_tol * delta * 1.0001
    assert np.allclose(out.sum(axis=0), x0.sum(axis=0))  # 1^T xi(t) conserved


def test_expander_steps_grow_like_log_s_while_paper_step_grows_linearly():
    small, large = inverse_chord_graph(31), inverse_chord_graph(401)
    ts = {p: (consensus_steps(laplacian_spectrum(g), 0.25, 1e-6), consensus_steps(
        laplacian_spectrum(g), 1.0 / g.shape[0], 1e-6)) for p, g in ((31, small), (401, large))}
    assert ts[401][0] / ts[31][0] < 4  # constant step: slow growth
    assert ts[401][1] / ts[31][1] > 10  # 1/S (slip S1): at least linear


def test_relabel_and_diameter():
    a = inverse_chord_graph(11)
    perm = np.random.default_rng(0).permutation(11)
    b = relabel(a, perm)
    assert b[3, 5] == a[perm[3], perm[5]]
    assert np.allclose(np.linalg.eigvalsh(laplacian(b)), np.linalg.eigvalsh(laplacian(a)))
    assert diameter(cycle_graph(10)) == 5


def test_check_adjacency_errors():
    with pytest.raises(ValueError, match="symmetric"):
        check_adjacency(np.triu(np.ones((4, 4)), 1))
    with pytest.raises(ValueError, match="more than 2"):
        check_adjacency(np.ones((2, 2)))
    assert np.all(default_graph(12, 0).sum(axis=1) == 4)


@pytest.mark.parametrize("n_sites", [7, 13, 1009])
def test_default_graph_is_regular_and_connected_at_prime_sizes(n_sites):
    a = default_graph(n_sites, 3)
    assert np.array_equal(a, a.T) and np.all(np.diag(a) == 0) and a.max() == 1  # simple
    assert np.all(a.sum(axis=1) == 4)
    reached = np.zeros(n_sites, dtype=bool)  # breadth-first search from site 0
    frontier = reached.copy()
    frontier[0] = reached[0] = True
    while frontier.any():
        frontier = (a[frontier] > 0).any(axis=0) & ~reached
        reached |= frontier
    assert reached.all()
    assert np.array_equal(default_graph(n_sites, 3), a)  # the same public seed gives the same graph
    assert np.array_equal(a, random_regular_graph(n_sites, 4, rng=3))  # the kept graph is the sampler's
    a[0, 1] = a[1, 0] = 7  # a caller's copy: changing it does not change the next caller's graph
    assert default_graph(n_sites, 3).max() == 1


@pytest.mark.parametrize("graph", [random_regular_graph(40, 4, rng=1), inverse_chord_graph(31), cycle_graph(12),
                                   graph_from_edges(6, [(0, 1), (1, 2), (3, 4), (4, 5)])])
def test_sparse_spectrum_equals_dense_spectrum(graph, monkeypatch):
    dense = laplacian_spectrum(graph)
    ev = np.linalg.eigvalsh(laplacian(graph))
    assert np.isclose(dense.lambda_2, ev[1], atol=1e-10) and np.isclose(dense.lambda_max, ev[-1])
    monkeypatch.setattr(graphs, "_DENSE_SPECTRUM_MAX_SITES", 0)
    sparse = laplacian_spectrum(graph)
    assert np.isclose(sparse.lambda_2, ev[1], atol=1e-8) and np.isclose(sparse.lambda_max, ev[-1], atol=1e-8)
    assert (sparse.max_degree, sparse.n_sites) == (dense.max_degree, dense.n_sites)
    if ev[1] > 1e-8:  # connected: the consensus plan is the same
        eps = step_size(sparse, "optimal")
        assert consensus_steps(sparse, eps, 1e-6) == consensus_steps(dense, step_size(dense, "optimal"), 1e-6)


def _complete(n):
    return np.ones((n, n), dtype=int) - np.eye(n, dtype=int)


@pytest.mark.parametrize("graph", [random_regular_graph(7, 4, rng=0), random_regular_graph(12, 4, rng=1),
                                   random_regular_graph(60, 4, rng=2), inverse_chord_graph(31), cycle_graph(10),
                                   graph_from_edges(5, [(0, 1), (1, 2), (2, 3), (3, 4)])])
def test_finite_time_schedule_gives_the_average_in_one_step_per_distinct_eigenvalue(graph):
    spec = laplacian_spectrum(graph)
    steps = graphs.finite_time_steps(spec)
    lap = laplacian(graph)
    ev = np.linalg.eigvalsh(lap)[1:]
    distinct = 1 + int(np.sum(np.diff(ev) > 1e-6))
    assert len(steps) == distinct
    product = np.eye(graph.shape[0])
    for eps in steps:
        product = (np.eye(graph.shape[0]) - eps * lap) @ product
    assert np.allclose(product, np.full_like(product, 1.0 / graph.shape[0]), rtol=0, atol=1e-12)
    # the run the plan makes: fewer steps than the constant step, and the average as exact as it gets
    assert graphs.consensus_schedule(spec, "finite-time", 1e-16) == steps
    assert len(steps) < consensus_steps(spec, step_size(spec), 1e-16)
    x = np.random.default_rng(0).normal(size=(graph.shape[0], 3)) * 1e4
    for eps in steps:
        x = x - eps * (lap @ x)
    assert np.abs(x - x.mean(axis=0)).max() < 1e-9


def test_finite_time_on_the_complete_graph_is_one_step_of_one_over_s():
    assert graphs.finite_time_steps(laplacian_spectrum(_complete(6))) == pytest.approx((1 / 6,), rel=1e-12)


def test_finite_time_falls_back_to_a_constant_step_where_it_is_not_exact():
    # eigenvalues closer than the rounding of the solver but not equal: one step cannot remove both
    close = graphs.GraphSpectrum(1.0, 3.0, 2, 4, (0.0, 1.0, 1.0 + 1e-10, 3.0))
    assert graphs.finite_time_steps(close) is None
    eps = step_size(close)
    assert graphs.consensus_schedule(close, "finite-time", 1e-8) == (eps,) * consensus_steps(close, eps, 1e-8)
    # over 200 sites only lambda_2 and lambda_S are computed: the max-degree step
    big = laplacian_spectrum(random_regular_graph(211, 4, rng=3))
    assert big.eigenvalues is None and graphs.finite_time_steps(big) is None
    assert set(graphs.consensus_schedule(big, "finite-time", 1e-12)) == {step_size(big)}
    # a loose tolerance that a constant step meets in fewer steps than the graph has eigenvalues
    spec = laplacian_spectrum(random_regular_graph(60, 4, rng=2))
    assert set(graphs.consensus_schedule(spec, "finite-time", 0.5)) == {step_size(spec)}
