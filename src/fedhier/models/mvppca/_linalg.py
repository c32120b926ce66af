"""Symmetric positive definite q x q systems of the E- and M-steps, by LAPACK directly; BLAS threads.

Every iteration of a site's EM factorises a few q x q matrices (q = n_components, often 5
or 10).  At that size the cost of a call is its Python overhead, so these functions call
LAPACK's ``dpotrf`` / ``dpotrs`` / ``dposv`` (Cholesky) through ``scipy.linalg.lapack``
without the checks and array conversions of ``scipy.linalg.cholesky`` / ``cho_solve``
(which call the same routines, so the results are the same to the last bit).

Threads: a fit runs on one BLAS thread (:func:`one_blas_thread`), since threads on its many small
systems and products cost more than they gain; only the products with the data, of at least
:data:`LARGE_PRODUCT` multiply-adds (an (N, d) x (d, q) block, the covariance), run on the caller's
threads (:func:`threads_for`), and only as many as the machine has cores idle when the fit starts:
on a busy machine threads wait for each other at every product and a fit on them is slower than on one.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from typing import ContextManager, Iterator

import numpy as np
from scipy.linalg.lapack import dposv, dpotrf, dpotrs

__all__ = ["spd_inverse", "spd_solve", "one_blas_thread", "threads_for", "LARGE_PRODUCT"]

#: multiply-adds from which a product runs on the caller's BLAS threads: below about a million, starting the
#: threads costs as much as they save (``python benchmarks/bench_blas_threads.py``)
LARGE_PRODUCT = 2**20

_controller = None  # threadpoolctl's view of the loaded BLAS libraries, found once (it reads the process's maps)
_caller_threads = 1  # the BLAS threads of the caller of the running fit; 1 outside a fit


def _blas():
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return _controller


def _free_cores() -> int:
    """Cores this process can use without waiting: the cores less the 1-minute load average, which counts this
    process itself (so one more), rounded; all cores where the system reports no load average."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return cores
    return max(1, min(cores, int(cores - load + 1.5)))


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block on one BLAS thread, the caller's setting restored after; :func:`threads_for` lifts the
    limit for the large products inside it, to the caller's threads or the machine's free cores if fewer."""
    global _caller_threads
    controller = _blas()
    given = max((lib["num_threads"] for lib in controller.info() if lib["user_api"] == "blas"), default=1)
    outer = _caller_threads
    with controller.limit(limits=1, user_api="blas"):
        _caller_threads = min(given, _free_cores()) if outer == 1 else outer
        try:
            yield
        finally:
            _caller_threads = outer


def threads_for(multiply_adds: float) -> ContextManager:
    """The caller's BLAS threads for one product of ``multiply_adds`` (e.g. N d q for (N, d) x (d, q)) inside
    :func:`one_blas_thread`, if it is at least :data:`LARGE_PRODUCT`; otherwise nothing changes."""
    if _caller_threads > 1 and multiply_adds >= LARGE_PRODUCT:
        return _blas().limit(limits=_caller_threads, user_api="blas")
    return nullcontext()


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
