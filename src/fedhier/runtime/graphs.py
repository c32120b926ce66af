"""Peer graphs and their spectra (spec §3.2, §3.3, §4.1, open points O1-O3).

A peer graph on ``S`` sites is a symmetric adjacency matrix ``A`` of shape ``(S, S)``
with non-negative integer edge multiplicities and a zero diagonal (self-loops cancel in
the Laplacian ``L = D - A``).  Everything a site needs to run consensus is public and
computed offline from ``A``: the Laplacian spectrum ``lambda_2``, ``lambda_S``, a safe
step size, the contraction factor ``rho`` and the fixed number of steps ``T`` of the
stopping rule (§3.4), or, where the whole spectrum is known, the finite-time schedule
that reaches the average exactly in one step per distinct eigenvalue.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

__all__ = [
    "GraphSpectrum",
    "check_adjacency",
    "inverse_chord_graph",
    "random_regular_graph",
    "cycle_graph",
    "graph_from_edges",
    "default_graph",
    "laplacian",
    "laplacian_spectrum",
    "step_size",
    "contraction_factor",
    "consensus_steps",
    "finite_time_steps",
    "consensus_schedule",
    "diameter",
    "relabel",
    "is_prime",
]

StepRule = Literal["finite-time", "max-degree", "optimal", "paper"]


def is_prime(n: int) -> bool:
    """Trial-division primality test (graph sizes are small)."""
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def check_adjacency(adjacency: np.ndarray) -> np.ndarray:
    """Validate a peer graph and return it as an int64 array of shape ``(S, S)``.

    Raises
    ------
    ValueError
        If the matrix is not square, not symmetric, has negative or non-integer entries,
        or fewer than 3 sites (spec §1 requires ``S > 2``).
    """
    a = np.asarray(adjacency)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"peer graph: adjacency must be a square matrix, got shape {a.shape}")
    if a.shape[0] < 3:
        raise ValueError(f"peer graph: CollabDict needs more than 2 sites, got {a.shape[0]}")
    if not np.all(np.isfinite(a)) or np.any(a < 0) or np.any(a != np.round(a)):
        raise ValueError("peer graph: adjacency entries must be non-negative integers (edge multiplicities)")
    a = a.astype(np.int64)
    if not np.array_equal(a, a.T):
        raise ValueError("peer graph: adjacency must be symmetric (edges are undirected)")
    a = a.copy()
    np.fill_diagonal(a, 0)  # self-loops cancel in L = D - A
    return a


def inverse_chord_graph(p: int, simple: bool = False) -> np.ndarray:
    """Cycle with inverse chord on ``Z_p`` (spec §3.3).

    Vertex ``x`` is joined to ``x + 1``, ``x - 1`` and ``x^{-1} (mod p)``; ``0`` is its
    own inverse.  Self-loops are dropped; double edges are kept as multiplicity 2
    (3-regular multigraph convention) unless ``simple`` is true.

    Parameters
    ----------
    p : int
        Number of sites; must be a prime > 2.
    simple : bool
        Collapse multiple edges to single edges.

    Returns
    -------
    ndarray of shape (p, p), int64
    """
    if not is_prime(int(p)) or p < 3:
        raise ValueError(f"inverse-chord graph: the number of sites must be a prime > 2, got {p}")
    p = int(p)
    a = np.zeros((p, p), dtype=np.int64)
    x = np.arange(p)
    inv = np.array([0] + [pow(int(v), p - 2, p) for v in range(1, p)])
    for nbr in ((x + 1) % p, (x - 1) % p):
        np.add.at(a, (x, nbr), 1)
    # each chord {x, x^-1} is listed from both ends; count it once per unordered pair
    chord = np.zeros((p, p), dtype=np.int64)
    np.add.at(chord, (x, inv), 1)
    a += np.maximum(chord, chord.T)
    np.fill_diagonal(a, 0)
    if simple:
        a = (a > 0).astype(np.int64)
    return check_adjacency(a)


def cycle_graph(n_sites: int) -> np.ndarray:
    """Plain cycle ``s -- s+1 (mod S)``: the slow baseline of §3.3's table."""
    x = np.arange(n_sites)
    a = np.zeros((n_sites, n_sites), dtype=np.int64)
    a[x, (x + 1) % n_sites] = 1
    a[(x + 1) % n_sites, x] = 1
    return check_adjacency(a)


def random_regular_graph(n_sites: int, degree: int = 4, rng: np.random.Generator | int | None = None,
                         min_gap: float = 0.3, max_tries: int = 10_000) -> np.ndarray:
    """Random simple ``degree``-regular graph from a common seed (spec O2).

    Uses the pairing (configuration) model, rejecting draws with self-loops, double
    edges, or an algebraic connectivity ``lambda_2 <= min_gap`` (O2: verify
    ``lambda_2 > 0.3`` before use).

    Raises
    ------
    ValueError
        If ``n_sites * degree`` is odd, ``degree >= n_sites``, or no acceptable graph is
        found in ``max_tries`` draws.
    """
    n_sites, degree = int(n_sites), int(degree)
    if degree < 2 or degree >= n_sites or (n_sites * degree) % 2:
        raise ValueError(
            f"random regular graph: need 2 <= degree < S and S*degree even, got S={n_sites}, degree={degree}"
        )
    rng = np.random.default_rng(rng)
    stubs = np.repeat(np.arange(n_sites), degree)
    for _ in range(max_tries):
        pairs = rng.permutation(stubs).reshape(-1, 2)
        if np.any(pairs[:, 0] == pairs[:, 1]):
            continue
        a = np.zeros((n_sites, n_sites), dtype=np.int64)
        np.add.at(a, (pairs[:, 0], pairs[:, 1]), 1)
        a = a + a.T
        if a.max() > 1:
            continue
        if laplacian_spectrum(a).lambda_2 > min_gap:
            return check_adjacency(a)
    raise ValueError(f"random regular graph: no simple {degree}-regular graph on {n_sites} sites "
                     f"with lambda_2 > {min_gap} in {max_tries} draws")


def graph_from_edges(n_sites: int, edges) -> np.ndarray:
    """Adjacency of a user-supplied undirected graph given as pairs ``(i, j)``, 0-based."""
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    if e.size and (e.min() < 0 or e.max() >= n_sites):
        raise ValueError(f"peer graph: edge endpoints must lie in 0..{n_sites - 1}")
    a = np.zeros((n_sites, n_sites), dtype=np.int64)
    np.add.at(a, (e[:, 0], e[:, 1]), 1)
    np.add.at(a, (e[:, 1], e[:, 0]), 1)
    return check_adjacency(a)


def default_graph(n_sites: int, rng: np.random.Generator | int | None = None) -> np.ndarray:
    """O2: a random simple 4-regular graph drawn from the common seed ``rng``, at every ``S``.

    The graph's structure is public, so every site draws the same graph from the same
    seed.  A random 4-regular graph has a spectral gap bounded away from zero as ``S``
    grows, so it needs fewer consensus steps than the inverse-chord graph at a prime ``S``.
    For ``S <= 5`` (too small for a simple 4-regular graph) the complete graph is used.
    """
    if n_sites < 3:
        raise ValueError(f"peer graph: CollabDict needs more than 2 sites, got {n_sites}")
    if n_sites <= 5:
        return check_adjacency(np.ones((n_sites, n_sites), dtype=np.int64))
    if isinstance(rng, (int, np.integer)):  # a seed: the same graph at every call, drawn once
        return _seeded_regular_graph(int(n_sites), int(rng)).copy()
    return random_regular_graph(n_sites, 4, rng)


@lru_cache(maxsize=4)
def _seeded_regular_graph(n_sites: int, seed: int) -> np.ndarray:
    """The default graph of a seed, kept: a fit draws it for every run of its rounds (the variables' moments,
    then the model's), and the rejection sampler costs a millisecond at 7 sites and 0.3 s at 1,000."""
    return random_regular_graph(n_sites, 4, seed)


def laplacian(adjacency: np.ndarray) -> np.ndarray:
    """Graph Laplacian ``L = D - A`` (spec §3.1), shape ``(S, S)``."""
    a = check_adjacency(adjacency).astype(float)
    return np.diag(a.sum(axis=1)) - a


@dataclass(frozen=True)
class GraphSpectrum:
    """Public spectral summary of a peer graph (spec §3.2).

    Attributes
    ----------
    lambda_2 : float
        Algebraic connectivity; the graph is connected iff ``lambda_2 > 0``.
    lambda_max : float
        Largest Laplacian eigenvalue ``lambda_S``.
    max_degree : int
        ``d_max`` (with multiplicities).
    n_sites : int
    eigenvalues : tuple of float or None
        Every eigenvalue of ``L``, ascending, where they were computed (up to 200 sites); else None.
    """

    lambda_2: float
    lambda_max: float
    max_degree: int
    n_sites: int
    eigenvalues: tuple[float, ...] | None = None


_DENSE_SPECTRUM_MAX_SITES = 200


def laplacian_spectrum(adjacency: np.ndarray) -> GraphSpectrum:
    """Eigenvalues ``lambda_2`` and ``lambda_S`` of ``L = D - A``, shape ``(S, S)``.

    Up to 200 sites by a dense symmetric eigensolver; above, by the sparse Lanczos solver
    ``scipy.sparse.linalg.eigsh``: ``lambda_S`` as the largest eigenvalue of ``L``, and
    ``lambda_2`` as the second eigenvalue nearest to ``-1`` in shift-invert mode, where
    ``L + I`` is positive definite and the smallest eigenvalue is ``lambda_1 = 0``.
    """
    a = check_adjacency(adjacency)
    n_sites, max_degree = a.shape[0], int(a.sum(axis=1).max())
    if n_sites <= _DENSE_SPECTRUM_MAX_SITES:
        ev = np.linalg.eigvalsh(laplacian(a))
        return GraphSpectrum(float(ev[1]), float(ev[-1]), max_degree, n_sites, tuple(float(v) for v in ev))
    from scipy import sparse
    from scipy.sparse.linalg import eigsh

    sparse_a = sparse.csr_matrix(a.astype(float))
    lap = (sparse.diags(np.asarray(sparse_a.sum(axis=1)).ravel()) - sparse_a).tocsc()
    start = np.cos(np.arange(n_sites) + 1.0)  # a fixed start vector: the plan is the same at every site
    lambda_max = eigsh(lap, k=1, which="LA", v0=start, return_eigenvectors=False)[0]
    smallest = np.sort(eigsh(lap, k=2, sigma=-1.0, which="LM", v0=start, return_eigenvectors=False))
    return GraphSpectrum(max(float(smallest[1]), 0.0), float(lambda_max), max_degree, n_sites)


def step_size(spectrum: GraphSpectrum, rule: StepRule | float = "max-degree") -> float:
    """Consensus step ``epsilon`` of Eq. (3) (spec O1).

    ``"max-degree"``: ``1/(d_max + 1)`` [R default, always < 2/lambda_S];
    ``"optimal"``: ``2/(lambda_2 + lambda_S)`` [R]; ``"paper"``: ``1/S`` [P];
    a float is used as given after checking ``0 < epsilon < 2/lambda_S``.

    Raises
    ------
    ValueError
        If the graph is disconnected or the step violates the convergence condition.
    """
    if spectrum.lambda_2 <= 1e-10:
        raise ValueError("peer graph is disconnected (lambda_2 = 0): consensus cannot reach the average")
    if rule == "max-degree":
        eps = 1.0 / (spectrum.max_degree + 1)
    elif rule == "optimal":
        eps = 2.0 / (spectrum.lambda_2 + spectrum.lambda_max)
    elif rule == "paper":
        eps = 1.0 / spectrum.n_sites
    elif isinstance(rule, (int, float)) and not isinstance(rule, bool):
        eps = float(rule)
    else:
        raise ValueError(f"step rule must be 'max-degree', 'optimal', 'paper' or a number, got {rule!r}")
    if not (eps > 0.0 and eps * spectrum.lambda_max < 2.0 - 1e-9):  # margin for eigenvalue round-off
        raise ValueError(
            f"consensus step {eps:g} violates 0 < epsilon < 2/lambda_S = {2.0 / spectrum.lambda_max:g}, so the consensus would not converge"
        )
    return eps


def contraction_factor(spectrum: GraphSpectrum, eps: float) -> float:
    """``rho = max(|1 - eps*lambda_2|, |1 - eps*lambda_S|)`` (spec §3.2)."""
    return max(abs(1.0 - eps * spectrum.lambda_2), abs(1.0 - eps * spectrum.lambda_max))


def consensus_steps(spectrum: GraphSpectrum, eps: float, rel_tol: float) -> int:
    """Fixed number of steps ``T`` of the stopping rule (spec §3.3-3.4, O3).

    ``T = ceil((ln(S)/2 + ln(Delta/tau_c)) / (-ln rho))`` with ``Delta/tau_c = 1/rel_tol``:
    after ``T`` steps every site is within ``rel_tol * Delta`` of the average, where
    ``Delta`` bounds ``max_s |xi^s - xi_bar|``.
    """
    if not 0.0 < rel_tol < 1.0:
        raise ValueError(f"rel_tol must lie in (0, 1), got {rel_tol}")
    rho = contraction_factor(spectrum, eps)
    if rho >= 1.0:
        raise ValueError(f"consensus does not contract (rho = {rho:g})")
    if rho == 0.0:
        return 1
    return max(1, int(np.ceil((0.5 * np.log(spectrum.n_sites) + np.log(1.0 / rel_tol)) / -np.log(rho))))


#: eigenvalues closer than this, relative to ``lambda_S``, are one eigenvalue of the finite-time schedule
_SAME_EIGENVALUE = 1e-9
#: largest norm a partial product of the finite-time schedule may reach (rounding grows with it), and the largest
#: the whole product may leave of a non-consensus component; a schedule beyond either is not used
_MAX_GROWTH, _MAX_RESIDUAL = 10.0, 1e-13


def finite_time_steps(spectrum: GraphSpectrum) -> tuple[float, ...] | None:
    """Step sizes ``eps_k = 1/mu_k`` of finite-time average consensus, one per distinct non-zero Laplacian eigenvalue.

    Eq. (3) with the step ``eps_k`` at step ``k`` multiplies ``xi`` by ``I - L/mu_k``, and
    ``prod_k (I - L/mu_k) = (1/S) 1 1^T``: on the eigenvector of ``lambda_i = mu_j`` the ``j``-th factor is zero,
    on ``1`` every factor is one.  So after as many steps as ``L`` has distinct non-zero eigenvalues every site
    holds the average, up to rounding (Kokiopoulou and Frossard's polynomial filtering; Sundaram and
    Hadjicostis).  The steps come in Leja order (the largest eigenvalue first, then each time the one farthest,
    in product of distances, from those before), which keeps every partial product small, so rounding does not
    grow.

    Returns None where the whole spectrum is not known (graphs over 200 sites), the graph is disconnected, or a
    partial product's norm exceeds ``_MAX_GROWTH`` or the whole product's leaves more than ``_MAX_RESIDUAL``
    of some eigenvector (eigenvalues that are close but not equal).
    """
    if spectrum.eigenvalues is None or spectrum.lambda_2 <= 1e-10:
        return None
    ev = np.asarray(spectrum.eigenvalues[1:])
    groups: list[list[float]] = []
    for value in ev:
        if groups and value - groups[-1][-1] <= _SAME_EIGENVALUE * spectrum.lambda_max:
            groups[-1].append(value)
        else:
            groups.append([value])
    left = np.array([np.mean(g) for g in groups])
    order = [float(left[-1])]
    left = left[:-1]
    closeness = np.log(np.abs(left - order[0]))  # for each eigenvalue left, the log of its product of distances
    while left.size:
        far = int(np.argmax(closeness))
        order.append(float(left[far]))
        left, closeness = np.delete(left, far), np.delete(closeness, far)
        closeness += np.log(np.abs(left - order[-1]))
    product = np.ones_like(ev)
    for mu in order:
        product *= 1.0 - ev / mu
        if np.abs(product).max() > _MAX_GROWTH:
            return None
    if np.abs(product).max() > _MAX_RESIDUAL:
        return None
    return tuple(1.0 / mu for mu in order)


def consensus_schedule(spectrum: GraphSpectrum, rule: StepRule | float = "finite-time",
                       rel_tol: float = 1e-12) -> tuple[float, ...]:
    """The step sizes of one consensus, one per step: what every site applies in Eq. (3) at step ``t``.

    ``"finite-time"``: :func:`finite_time_steps` where it exists and takes fewer steps than the
    ``"max-degree"`` rule, else the ``"max-degree"`` rule.  Any other rule: its constant step
    :func:`step_size` for the :func:`consensus_steps` steps that reach ``rel_tol``.
    """
    if rule == "finite-time":
        exact = finite_time_steps(spectrum)
        constant = consensus_schedule(spectrum, "max-degree", rel_tol)
        return exact if exact is not None and len(exact) < len(constant) else constant
    eps = step_size(spectrum, rule)
    return (eps,) * consensus_steps(spectrum, eps, rel_tol)


def diameter(adjacency: np.ndarray) -> int:
    """Graph diameter by breadth-first search from every vertex (steps of max-consensus)."""
    a = check_adjacency(adjacency) > 0
    n = a.shape[0]
    best = 0
    for source in range(n):
        seen = np.zeros(n, dtype=bool)
        seen[source] = True
        frontier = seen.copy()
        depth = 0
        while True:
            frontier = a[frontier].any(axis=0) & ~seen
            if not frontier.any():
                break
            seen |= frontier
            depth += 1
        if not seen.all():
            raise ValueError("peer graph is disconnected: its diameter is infinite")
        best = max(best, depth)
    return best


def relabel(adjacency: np.ndarray, placement: np.ndarray) -> np.ndarray:
    """Graph seen by the sites when site ``s`` occupies vertex ``placement[s]`` (spec §4.1).

    Returns ``B`` with ``B[s, j] = A[placement[s], placement[j]]``.
    """
    placement = np.asarray(placement)
    return adjacency[np.ix_(placement, placement)]
