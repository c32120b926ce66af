"""Symmetric positive definite q x q systems of the E- and M-steps, by LAPACK directly.

Every iteration of a site's EM factorises a few q x q matrices (q = n_components, often 5
or 10).  At that size the cost of a call is its Python overhead, so these functions call
LAPACK's ``dpotrf`` / ``dpotrs`` / ``dposv`` (Cholesky) through ``scipy.linalg.lapack``
without the checks and array conversions of ``scipy.linalg.cholesky`` / ``cho_solve``
(which call the same routines, so the results are the same to the last bit).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.lapack import dposv, dpotrf, dpotrs

__all__ = ["spd_inverse", "spd_solve"]


def spd_inverse(matrix: np.ndarray) -> tuple[np.ndarray, float]:
    """A^{-1} and ln|A| of a symmetric positive definite A of shape (q, q).

    A = L L^T (Cholesky), A^{-1} = L^{-T} L^{-1} (symmetrised), ln|A| = 2 sum_i ln L_ii.

    Raises
    ------
    numpy.linalg.LinAlgError
        If A is not positive definite.
    """
    chol, info = dpotrf(matrix, lower=1, clean=0)
    if info != 0:
        raise np.linalg.LinAlgError("a q x q matrix of the EM step is not positive definite")
    inverse, info = dpotrs(chol, np.eye(matrix.shape[0]), lower=1)
    return 0.5 * (inverse + inverse.T), 2.0 * float(np.log(chol.diagonal()).sum())


def spd_solve(matrix: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """X = A^{-1} B for a symmetric positive definite A of shape (q, q) and B of shape (q,) or (q, m).

    One LAPACK call (``dposv``: Cholesky, then two triangular solves).  ``rhs`` is best
    Fortran-ordered (e.g. the transpose of a C-ordered (m, q) array): then it is not copied.

    Raises
    ------
    numpy.linalg.LinAlgError
        If A is not positive definite.
    """
    _, solution, info = dposv(matrix, rhs, lower=1)
    if info != 0:
        raise np.linalg.LinAlgError("a q x q matrix of the EM step is not positive definite")
    return solution
