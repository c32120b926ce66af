"""Symmetric positive definite q x q systems of the E- and M-steps, by Cholesky; BLAS threads.

Every iteration of a site's EM factorises a few q x q matrices (q = n_components, often 5
or 10), as stacks (:func:`spd_factors`): one call for all the systems it has at one time.
These functions use numpy's LAPACK (``numpy.linalg``), not scipy's: a site step over
Flower runs in a fresh process every round, and importing ``scipy.linalg`` costs that
process about 0.1 CPU s, more than the whole site step of a small fit; at q x q the two
differ by microseconds per call.

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

__all__ = [
    "spd_factors", "inverse_from_factor", "log_determinant", "spd_inverse", "factor_solve",
    "one_blas_thread", "threads_for", "LARGE_PRODUCT",
]

#: multiply-adds from which a product runs on the caller's BLAS threads: below about a million, starting the
#: threads costs as much as they save (``python benchmarks/bench_blas_threads.py``)
LARGE_PRODUCT = 2**20

_UNCHANGED = nullcontext()  # reusable: it holds no state
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
    return _UNCHANGED


try:  # numpy.linalg's own LAPACK kernels, without the wrapper's per-call checks (a few microseconds a call)
    from numpy.linalg import _umath_linalg as _kernels
except ImportError:  # pragma: no cover - a numpy without them: its public functions, the same kernels
    _kernels = None


def _cholesky(matrices: np.ndarray) -> np.ndarray:
    """Lower-triangular L with A = L L^T, for a symmetric positive definite A of shape (q, q) or each of a stack
    (m, q, q).

    numpy.linalg.cholesky's kernel, called directly: it fills L with NaN where A is not positive definite.
    """
    if _kernels is None:
        try:
            return np.linalg.cholesky(matrices)
        except np.linalg.LinAlgError:
            raise np.linalg.LinAlgError("a q x q matrix of the EM step is not positive definite") from None
    with np.errstate(invalid="ignore"):
        chol = _kernels.cholesky_lo(matrices, signature="d->d")
    if not np.isfinite(chol.diagonal(0, -2, -1).sum()):
        raise np.linalg.LinAlgError("a q x q matrix of the EM step is not positive definite")
    return chol


def spd_factors(matrices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """L and L^{-1} with A = L L^T, for a symmetric positive definite A of shape (q, q) or each of a stack (m, q, q).

    One Cholesky call and one inverse call (numpy.linalg's kernels, the inverse an LU solve) for the whole
    stack: at q x q a call's fixed cost exceeds its arithmetic, so a site's iteration factorises the systems
    it has at one time together.  The factors of a stack equal those of its matrices one by one, bit for bit.

    Raises
    ------
    numpy.linalg.LinAlgError
        If a matrix is not positive definite.
    """
    chol = _cholesky(matrices)
    return chol, (np.linalg.inv(chol) if _kernels is None else _kernels.inv(chol, signature="d->d"))


def inverse_from_factor(inverse_chol: np.ndarray) -> np.ndarray:
    """A^{-1} = L^{-T} L^{-1} (symmetrised) from L^{-1} of :func:`spd_factors`, shape (q, q) or (m, q, q)."""
    inverse = inverse_chol.swapaxes(-1, -2) @ inverse_chol
    return 0.5 * (inverse + inverse.swapaxes(-1, -2))


def log_determinant(chol: np.ndarray) -> np.ndarray:
    """ln|A| = 2 sum_i ln L_ii from L of :func:`spd_factors`: shape () for one matrix, (m,) for a stack."""
    return 2.0 * np.log(chol.diagonal(0, -2, -1)).sum(axis=-1)


def spd_inverse(matrix: np.ndarray) -> tuple[np.ndarray, float]:
    """A^{-1} and ln|A| of a symmetric positive definite A of shape (q, q), by its Cholesky factor.

    Raises
    ------
    numpy.linalg.LinAlgError
        If A is not positive definite.
    """
    chol, inverse_chol = spd_factors(matrix)
    return inverse_from_factor(inverse_chol), float(log_determinant(chol))


def factor_solve(inverse_chol: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """X = A^{-1} B = L^{-T} (L^{-1} B) for B of shape (q,) or (q, m), from L^{-1} of A = L L^T
    (:func:`spd_factors`): at q x q, inverting L costs one call, as each of the two triangular solves would
    (numpy has no triangular solver; its general solve factorises again)."""
    return inverse_chol.T @ (inverse_chol @ rhs)
