"""The q x q LAPACK helpers of a site's EM against numpy's dense inverse, determinant and solve."""

import numpy as np
import pytest

from fedhier.models.mvppca._linalg import factor_solve, spd_factors, spd_inverse


def _spd(q: int, rng: np.random.Generator) -> np.ndarray:
    A = rng.normal(size=(q, q))
    return A @ A.T + q * np.eye(q)


@pytest.mark.parametrize("q", [1, 5, 10])
def test_spd_inverse_matches_numpy_inverse_and_log_determinant(q):
    A = _spd(q, np.random.default_rng(q))
    inverse, logdet = spd_inverse(A)
    np.testing.assert_allclose(inverse, np.linalg.inv(A), rtol=1e-12, atol=1e-14)
    assert np.array_equal(inverse, inverse.T)
    sign, expected = np.linalg.slogdet(A)
    assert sign == 1.0 and logdet == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("q", [1, 5, 10])
def test_factor_solve_matches_numpy_solve_for_vectors_and_transposed_blocks(q):
    rng = np.random.default_rng(q)
    A = _spd(q, rng)
    A_before = A.copy()
    chol, inverse_chol = spd_factors(A)
    np.testing.assert_allclose(chol @ chol.T, A, rtol=1e-12, atol=1e-13)
    b = rng.normal(size=q)
    np.testing.assert_allclose(factor_solve(inverse_chol, b), np.linalg.solve(A, b), rtol=1e-12, atol=1e-14)
    block = rng.normal(size=(7, q))  # C-ordered (m, q): its transpose is the Fortran-ordered right-hand side
    block_before = block.copy()
    np.testing.assert_allclose(factor_solve(inverse_chol, block.T), np.linalg.solve(A, block.T), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(A, A_before)  # the inputs are left as they were
    np.testing.assert_array_equal(block, block_before)


def test_a_stack_is_factorised_as_its_matrices_one_by_one_bit_for_bit():
    rng = np.random.default_rng(0)
    stack = np.stack([_spd(5, rng) for _ in range(4)])
    chol, inverse_chol = spd_factors(stack)
    for m, matrix in enumerate(stack):
        one_chol, one_inverse = spd_factors(matrix)
        np.testing.assert_array_equal(chol[m], one_chol)
        np.testing.assert_array_equal(inverse_chol[m], one_inverse)
    np.testing.assert_allclose(chol @ np.swapaxes(chol, 1, 2), stack, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(inverse_chol @ chol, np.broadcast_to(np.eye(5), stack.shape), atol=1e-13)


def test_not_positive_definite_raises():
    indefinite = np.diag([1.0, -1.0, 2.0])
    with pytest.raises(np.linalg.LinAlgError, match="not positive definite"):
        spd_inverse(indefinite)
    stack = np.stack([np.eye(3), indefinite, 2.0 * np.eye(3)])  # one bad matrix among good ones
    with pytest.raises(np.linalg.LinAlgError, match="not positive definite"):
        spd_factors(stack)


def test_a_fit_runs_on_one_blas_thread_and_only_large_products_on_the_callers_threads(monkeypatch):
    import os

    from threadpoolctl import threadpool_info, threadpool_limits

    from fedhier.models.mvppca._linalg import LARGE_PRODUCT, one_blas_thread, threads_for

    def blas_threads():
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 1.0, 1.0))  # this process alone on two cores
    with threadpool_limits(limits=2, user_api="blas"):
        if blas_threads() != {2}:
            pytest.skip("the BLAS libraries here cannot run two threads")
        with one_blas_thread():
            assert blas_threads() == {1}
            with threads_for(LARGE_PRODUCT):
                assert blas_threads() == {2}
            with threads_for(LARGE_PRODUCT - 1):
                assert blas_threads() == {1}
            assert blas_threads() == {1}
        assert blas_threads() == {2}  # the caller's setting, restored
        monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 3.0, 3.0))  # another process busy on each core
        with one_blas_thread(), threads_for(10 * LARGE_PRODUCT):
            assert blas_threads() == {1}
    with threadpool_limits(limits=1, user_api="blas"), one_blas_thread(), threads_for(10 * LARGE_PRODUCT):
        assert blas_threads() == {1}  # a caller on one thread stays on one
