"""Difference clipping around a public anchor (spec fed-mv-ppca §8.2 steps 1--3).

For a parameter block ``theta_b`` and a public anchor ``a_b`` (a function of earlier
DP releases only), the released quantity is the clipped difference

    Delta_b = theta_b - a_b,     Delta-bar_b = Delta_b / max(1, ||Delta_b|| / g_b),

so ``||Delta-bar_b|| <= g_b`` whatever the site's data, and two neighbouring datasets
(indeed *any* two datasets of the site) give releases at most ``2 g_b`` apart: the
sensitivity is ``2 g_b`` (§8.2 step 3, §8.3).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

__all__ = ["ClipNorm", "clip_difference", "clipping_bound"]

ClipNorm = Literal["l2", "fro", "abs"]


def _norm(difference: np.ndarray, norm: ClipNorm) -> float:
    if norm == "l2":
        if difference.ndim != 1:
            raise ValueError(f"norm='l2' expects a vector, got an array of shape {difference.shape}")
        return float(np.linalg.norm(difference))
    if norm == "fro":
        if difference.ndim != 2:
            raise ValueError(f"norm='fro' expects a matrix, got an array of shape {difference.shape}")
        return float(np.linalg.norm(difference, "fro"))
    if norm == "abs":
        if difference.size != 1:
            raise ValueError(f"norm='abs' expects a scalar, got an array of shape {difference.shape}")
        return float(abs(difference.reshape(())))
    raise ValueError(f"unknown clipping norm {norm!r}; expected 'l2', 'fro' or 'abs'")


def clip_difference(value, anchor, bound: float, norm: ClipNorm = "l2") -> tuple[np.ndarray, bool]:
    """Clipped difference ``Delta-bar = (value - anchor) / max(1, ||value - anchor|| / g)`` (§8.2).

    Parameters
    ----------
    value, anchor : array_like of the same shape
        ``(d,)`` for ``norm="l2"``, ``(d, q)`` for ``norm="fro"``, a scalar for
        ``norm="abs"``.
    bound : float
        Clipping bound ``g > 0``; the sensitivity of the result is ``2 g``.
    norm : {"l2", "fro", "abs"}
        Euclidean norm of a vector, Frobenius norm of a matrix, absolute value of a
        scalar (spec §14 row 11).

    Returns
    -------
    clipped_difference : ndarray, shape of ``value``
    was_clipped : bool
        True when ``||value - anchor|| > g`` (the difference was shrunk).
    """
    value = np.asarray(value, dtype=float)
    anchor = np.asarray(anchor, dtype=float)
    if value.shape != anchor.shape:
        raise ValueError(f"value has shape {value.shape} but its anchor has shape {anchor.shape}")
    if not (np.isfinite(bound) and bound > 0):
        raise ValueError(f"clipping bound must be positive and finite, got {bound!r}")
    if not (np.all(np.isfinite(value)) and np.all(np.isfinite(anchor))):
        raise ValueError("value or anchor contains NaN or infinite entries")
    difference = value - anchor
    size = _norm(difference, norm)
    if size > bound:
        return difference * (bound / size), True
    return difference, False


def clipping_bound(prior_sd: float, kappa: float, dim: int | None = None) -> float:
    """Clipping bound ``g = kappa * sd`` [P], or ``kappa * sd * sqrt(dim)`` [R] (§8.2, §8.5).

    Parameters
    ----------
    prior_sd : float
        Standard deviation of the block's prior at round ``r - 1`` (public).
    kappa : float
        User's clipping constant (> 0); the paper uses 1.
    dim : int or None
        None for the paper's bound; the block's number of entries (``d_k`` for
        ``mu``, ``d_k q`` for ``W``) for the dimension-aware bound of §8.5 that avoids
        the geometric collapse of the global variances.
    """
    if not (np.isfinite(prior_sd) and prior_sd > 0):
        raise ValueError(f"prior standard deviation must be positive and finite, got {prior_sd!r}")
    if not (np.isfinite(kappa) and kappa > 0):
        raise ValueError(f"kappa must be positive and finite, got {kappa!r}")
    if dim is None:
        return float(kappa * prior_sd)
    if dim < 1:
        raise ValueError(f"dim must be a positive integer, got {dim!r}")
    return float(kappa * prior_sd * np.sqrt(dim))
