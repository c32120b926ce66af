"""Average consensus, random chunking and agreement (spec §3.1, §3.5, §4.1, O5, O7).

Two views of the same iteration:

* :func:`consensus_update` is what one site computes from its own value and the values
  its neighbours sent (Eq. (3)); the runtimes (:mod:`fedhier.runtime.peer`,
  :mod:`fedhier.runtime.mpi`) call it, so in-process and MPI runs do the same floating
  point operations in the same order;
* :func:`average_consensus` is the matrix form ``xi(t+1) = W xi(t)`` with
  ``W = I - eps L`` (Eq. (4)) on all sites at once, used for analysis and scaling
  studies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .graphs import check_adjacency, laplacian

if TYPE_CHECKING:
    from ..privacy.sampling import NoiseSource

__all__ = [
    "consensus_update",
    "max_update",
    "average_consensus",
    "consensus_matrix",
    "random_chunks",
    "session_placement",
    "sums_from_averages",
    "exposure_probability",
]


def consensus_update(own: np.ndarray, neighbour_values: Sequence[np.ndarray], multiplicities: Sequence[int],
                     eps: float) -> np.ndarray:
    """One step of Eq. (3) at one site.

    ``xi^s(t+1) = xi^s(t) + eps * sum_j A_sj (xi^j(t) - xi^s(t))``, summed over the
    neighbours in the order given (the runtimes pass them in increasing site order).

    Parameters
    ----------
    own : ndarray of shape (m,)
    neighbour_values : sequence of ndarray of shape (m,)
    multiplicities : sequence of int
        ``A_sj`` for each neighbour, same order.
    eps : float
    """
    acc = np.zeros_like(own)
    for value, mult in zip(neighbour_values, multiplicities):
        acc += mult * (value - own)
    return own + eps * acc


def max_update(own: np.ndarray, neighbour_values: Sequence[np.ndarray]) -> np.ndarray:
    """One step of max-consensus: elementwise maximum over the site and its neighbours.

    After ``diameter`` steps every site holds exactly the same vector (the elementwise
    maximum of the consensus estimates), which is within the consensus tolerance of the
    average: the decentralised realisation of O7's "canonical value".
    """
    out = own.copy()
    for value in neighbour_values:
        np.maximum(out, value, out=out)
    return out


def consensus_matrix(adjacency: np.ndarray, eps: float) -> np.ndarray:
    """``W = I - eps L`` of Eq. (4), shape ``(S, S)``."""
    lap = laplacian(adjacency)
    return np.eye(lap.shape[0]) - eps * lap


def average_consensus(values: np.ndarray, adjacency: np.ndarray, eps: float, n_steps: int) -> np.ndarray:
    """Run ``n_steps`` of Eq. (4) on all sites at once.

    Parameters
    ----------
    values : ndarray of shape (S, m)
        Row ``s`` is ``xi^s(0)``.
    adjacency : ndarray of shape (S, S)
    eps : float
    n_steps : int

    Returns
    -------
    ndarray of shape (S, m)
        Row ``s`` is site ``s``'s estimate of the average after ``n_steps``.
    """
    x = np.asarray(values, dtype=float)
    a = check_adjacency(adjacency)
    if x.ndim != 2 or x.shape[0] != a.shape[0]:
        raise ValueError(f"consensus: values must have shape (S={a.shape[0]}, m), got {x.shape}")
    w = consensus_matrix(a, eps)
    for _ in range(int(n_steps)):
        x = w @ x
    return x


def random_chunks(value: np.ndarray, n_chunks: int, mask_scale: float, noise: "NoiseSource") -> np.ndarray:
    """Split ``xi^s`` into ``C`` chunks that sum to it (spec §4.1, recommended generator).

    ``zeta^[l] ~ N(0, sigma_c^2)`` for ``l < C``, ``zeta^[C] = -sum_{l<C} zeta^[l]``,
    chunks ``xi/C + zeta^[l]``.

    Parameters
    ----------
    value : ndarray of shape (m,)
    n_chunks : int
        ``C >= 1``.
    mask_scale : float
        ``sigma_c``: public and independent of ``value``.
    noise : NoiseSource
        The site's source of secrets (:class:`fedhier.privacy.sampling.NoiseSource`).

    Returns
    -------
    ndarray of shape (C, m)
    """
    if n_chunks < 1:
        raise ValueError(f"chunking: n_chunks must be >= 1, got {n_chunks}")
    if mask_scale < 0:
        raise ValueError(f"chunking: mask_scale must be >= 0, got {mask_scale}")
    value = np.asarray(value, dtype=float)
    masks = mask_scale * noise.standard_normal((n_chunks - 1,) + value.shape)
    masks = np.concatenate([masks, -masks.sum(axis=0, keepdims=True)])
    return value / n_chunks + masks


def session_placement(seed: int, round: int, session: int, n_sites: int) -> np.ndarray:
    """Vertex occupied by each site in one aggregation session (spec §4.1, O4).

    A permutation drawn from a seed every site knows (in a ledger deployment: a hash of
    the latest block and the session id), refreshed at every session.
    """
    ss = np.random.SeedSequence(seed, spawn_key=(3, round, session))
    return np.random.Generator(np.random.PCG64(ss)).permutation(n_sites)


def sums_from_averages(averages: np.ndarray, n_sites: int) -> np.ndarray:
    """Sums are ``S`` times the consensus average (spec §3.5, slip S4)."""
    return n_sites * np.asarray(averages)


def exposure_probability(n_sites: int, degree: int, coalition: int, n_chunks: int) -> float:
    """Heuristic exposure of one site under random chunking with relabelling (spec §4.1 [R]).

    On a ``d``-regular simple graph with a uniformly random placement per session, a
    coalition of ``q`` other sites is adjacent to site ``s`` in all ``C`` sessions (and so
    reads every first-step chunk, hence ``xi^s``) with probability
    ``[1 - binom(S-1-q, d) / binom(S-1, d)]^C``.  Not a proof of privacy.
    """
    from math import comb

    if not 0 <= coalition <= n_sites - 1 or not 1 <= degree <= n_sites - 1:
        raise ValueError(f"need 0 <= q <= S-1 and 1 <= d <= S-1, got S={n_sites}, d={degree}, q={coalition}")
    return (1.0 - comb(n_sites - 1 - coalition, degree) / comb(n_sites - 1, degree)) ** n_chunks
