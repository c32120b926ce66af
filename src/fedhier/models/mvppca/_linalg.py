"""Symmetric positive definite q x q systems of the E- and M-steps, by Cholesky.

Every iteration of a site's EM factorises a few q x q matrices (q = n_components, often 5
or 10).  These functions use numpy's LAPACK (``numpy.linalg``), not scipy's: a site step over
Flower runs in a fresh process every round, and importing ``scipy.linalg`` costs that
process about 0.1 CPU s, more than the whole site step of a small fit; at q x q the two
differ by microseconds per call.
"""

from __future__ import annotations

import numpy as np

__all__ = ["spd_inverse", "spd_solve"]


def _cholesky(matrix: np.ndarray) -> np.ndarray:
    """Lower-triangular L with A = L L^T, for a symmetric positive definite A of shape (q, q)."""
    try:
        return np.linalg.cholesky(matrix)
    except np.linalg.LinAlgError:
        raise np.linalg.LinAlgError("a q x q matrix of the EM step is not positive definite") from None


def spd_inverse(matrix: np.ndarray) -> tuple[np.ndarray, float]:
    """A^{-1} and ln|A| of a symmetric positive definite A of shape (q, q).

    A = L L^T (Cholesky), A^{-1} = L^{-T} L^{-1} (symmetrised), ln|A| = 2 sum_i ln L_ii.

    Raises
    ------
    numpy.linalg.LinAlgError
        If A is not positive definite.
    """
    chol = _cholesky(matrix)
    inverse_chol = np.linalg.inv(chol)
    inverse = inverse_chol.T @ inverse_chol
    return 0.5 * (inverse + inverse.T), 2.0 * float(np.log(chol.diagonal()).sum())


def spd_solve(matrix: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """X = A^{-1} B for a symmetric positive definite A of shape (q, q) and B of shape (q,) or (q, m).

    A = L L^T (Cholesky), then L Y = B and L^T X = Y.

    Raises
    ------
    numpy.linalg.LinAlgError
        If A is not positive definite.
    """
    chol = _cholesky(matrix)
    return np.linalg.solve(chol.T, np.linalg.solve(chol, rhs))
