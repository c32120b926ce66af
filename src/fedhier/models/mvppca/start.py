"""Round-1 start of a site's EM from a PCA of its own views ([R]; the paper draws W ~ U(-2, 2)).

The single-view PPCA likelihood is maximised in closed form (Tipping & Bishop 1999): with
lambda_1 >= ... >= lambda_d the eigenvalues of the sample covariance C and U_q its leading
eigenvectors,

    sigma2 = (tr C - sum_{i <= q} lambda_i) / (d - q),   W = U_q (Lambda_q - sigma2 I)^{1/2}.

:func:`pca_start` applies this to the site's views side by side (centred by their sample
means; a subject lacking a view contributes zeros to it), so that the views share one latent
space, then gives each view its own sigma2_k = (tr C_kk - ||W_k||_F^2) / d_k.  For one view
this is the ML solution itself, and EM starts at the optimum instead of far from it.

The leading eigenpairs come from a randomized subspace iteration (Halko, Martinsson & Tropp
2011, algorithm 4.4) on the *implicitly* centred data: every product with
T_c = T - 1 t-bar^T is formed as T V - 1 (t-bar^T V), so the data are never copied.  Cost:
2 (n_power_iter + 1) products of the data with a (d, q + p) or (N, q + p) block;
memory O((N + d)(q + p)).  (scikit-learn's ``randomized_svd`` needs the centred matrix itself,
i.e. a copy of the data.)

When every subject has every view and the site is narrow enough (:func:`_covariance_is_cheaper`),
the start instead forms C = T_c^T T_c / N block by block (T_k^T T_l - N t-bar_k t-bar_l^T, one
pass over the data; :func:`joint_covariance`) and takes its q leading eigenpairs exactly:
N d^2 + O(d^3) operations against the 2 (2 n_power_iter + 3) N d (q + p) of the subspace
iteration.  For one view this is the exact ML solution, so EM starts at its fixed point; the
site's round-1 EM then runs on C as well (:func:`fedhier.models.mvppca.local.fit_local`).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import eigh, qr, svd

from ._data import MultiViewData
from ._linalg import threads_for

__all__ = ["pca_start", "joint_covariance"]

#: extra columns of the random test block (Halko et al.'s oversampling p)
N_OVERSAMPLES = 10
#: subspace (power) iterations; each sharpens the leading subspace by (lambda_{k+1} / lambda_q)^2
N_POWER_ITER = 4


#: entries of the data (float64) beyond which every pass over them streams them from memory: 32 MiB, more than
#: the last-level cache of most machines
STREAMED_ENTRIES = 2**22
#: multiply-adds a core does in the time it reads one entry of the data from memory, about: a product of streamed
#: data with a block of fewer columns than this waits on memory, not on arithmetic (measured on the project's
#: machine: a 20,000 x 1,000 product with 20 columns runs at a quarter of the Gram matrix's rate per multiply-add)
MEMORY_BOUND_COLUMNS = 45


def _covariance_is_cheaper(n: int, d: int, k: int) -> bool:
    """True when forming C and its eigenpairs undercuts the subspace iteration, counted in multiply-adds.

    Data that fit in cache: N d^2 + 10 d^3 (C and its eigenpairs, counted generously) against the
    2 (2 n_power_iter + 3) N d k of the subspace iteration's products, which then run at the arithmetic's pace.
    Streamed data (more than :data:`STREAMED_ENTRIES` entries): C costs N d^2 / 2 (BLAS forms one triangle of
    a view's block) and about 2.5 d^3 (eigenpairs and the round-1 EM on C); the subspace iteration's products and its
    round-1 EM's passes over the data (two iterations counted) cost N d max(k, MEMORY_BOUND_COLUMNS) each,
    since a product with few columns waits on memory.  Counted as in cache, C was formed at N = 20,000 only up
    to d of about 400, where it is the cheaper one up to d of about 1,700
    (``benchmarks/bench_mvppca.py --routes 10``).
    """
    products = 2 * (2 * N_POWER_ITER + 3)
    if n * d <= STREAMED_ENTRIES:
        return n * d * d + 10 * d**3 < products * n * d * k
    return n * d * d / 2 + 2.5 * d**3 < (products + 4) * n * d * max(k, MEMORY_BOUND_COLUMNS)


def joint_covariance(data: MultiViewData, sample_mean: dict[str, np.ndarray], n_components: int) -> np.ndarray | None:
    """C = T_c^T T_c / N (d, d) of the views side by side, d = sum_k d_k, or None when the start should not form it.

    C is formed when every subject has every view, q < d and forming it undercuts the subspace
    iteration (:func:`_covariance_is_cheaper`); block (k, l) is (T_k^T T_l - N t-bar_k t-bar_l^T) / N.
    """
    names = list(data.views)
    d = sum(data.views[k].dim for k in names)
    complete = all(data.views[k].rows is None for k in names)
    if not (complete and n_components < d and _covariance_is_cheaper(data.n, d, min(n_components + N_OVERSAMPLES, d, data.n))):
        return None
    blocks = [data.views[k].values for k in names]
    means = [sample_mean[k] for k in names]
    with threads_for(data.n * d * d):
        return np.block([[(A.T @ B - data.n * np.outer(a, b)) / data.n for B, b in zip(blocks, means)]
                         for A, a in zip(blocks, means)])


def _leading_eigenpairs(covariance: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray]:
    """The q largest eigenvalues (descending) and eigenvectors (d, q) of the covariance (d, d)."""
    d = covariance.shape[0]
    lam, U = eigh(covariance, subset_by_index=[d - q, d - 1], check_finite=False)
    return lam[::-1], U[:, ::-1]


def _orthonormal(Y: np.ndarray) -> np.ndarray:
    return qr(Y, mode="economic", overwrite_a=True, check_finite=False)[0]


def pca_start(
    data: MultiViewData,
    sample_mean: dict[str, np.ndarray],
    scatter: dict[str, float],
    n_components: int,
    rng: np.random.Generator,
    covariance: np.ndarray | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """W_k (d_k, q) and sigma2_k of every view from the leading eigenpairs of the site's covariance.

    Parameters
    ----------
    data : MultiViewData
        The site's checked views.
    sample_mean : dict view -> ndarray (d_k,)
        t-bar_k over the subjects that have view k.
    scatter : dict view -> float
        sum_n ||t_n - t-bar_k||^2 over the same subjects.
    n_components : int
        q.
    rng : numpy.random.Generator
        Draws the random test block (the site's own generator).
    covariance : ndarray (d, d), optional
        :func:`joint_covariance` of the site, if the caller has formed it; otherwise the start
        forms it when that pays.

    Returns
    -------
    W : dict view -> ndarray (d_k, q)
    sigma2 : dict view -> float (> 0)
    """
    q = int(n_components)
    names = list(data.views)
    edges = np.cumsum([0] + [data.views[k].dim for k in names])
    d_total, n = int(edges[-1]), data.n
    k = min(q + N_OVERSAMPLES, d_total, n)

    def times(V: np.ndarray) -> np.ndarray:
        """T_c V, (N, k): the views side by side, centred, zeros where a subject lacks a view."""
        out = np.zeros((n, V.shape[1]))
        for j, name in enumerate(names):
            block, Vj = data.views[name], V[edges[j]:edges[j + 1]]
            with threads_for(block.values.size * Vj.shape[1]):
                part = block.values @ Vj
            part -= sample_mean[name] @ Vj
            if block.rows is None:
                out += part
            else:
                out[block.rows] += part
        return out

    def transposed_times(Y: np.ndarray) -> np.ndarray:
        """T_c^T Y, (d, k)."""
        out = np.empty((d_total, Y.shape[1]))
        for j, name in enumerate(names):
            block = data.views[name]
            Yj = Y if block.rows is None else Y[block.rows]
            with threads_for(block.values.size * Yj.shape[1]):
                part = block.values.T @ Yj
            part -= np.outer(sample_mean[name], Yj.sum(axis=0))
            out[edges[j]:edges[j + 1]] = part
        return out

    if covariance is None:
        covariance = joint_covariance(data, sample_mean, q)
    if covariance is not None:
        lam, U = _leading_eigenpairs(covariance, q)
    else:
        Q = _orthonormal(times(rng.standard_normal((d_total, k))))
        for _ in range(N_POWER_ITER):
            Q = _orthonormal(times(_orthonormal(transposed_times(Q))))
        # C = T_c^T T_c / N restricted to range(T_c^T Q): T_c^T Q = U S V^T, eigenpairs (U, S^2 / N)
        U, s, _ = svd(transposed_times(Q), full_matrices=False, check_finite=False)
        lam = s[:q] ** 2 / n
    trace = sum(scatter.values()) / n
    noise = max((trace - lam.sum()) / (d_total - q), 1e-12 * trace / d_total)
    W_joint = U[:, :q] * np.sqrt(np.maximum(lam - noise, 1e-6 * lam))
    if W_joint.shape[1] < q:
        # fewer subjects than components: the data span fewer directions; the rest start small
        # and random (a zero column would stay zero under EM)
        extra = rng.standard_normal((d_total, q - W_joint.shape[1])) * np.sqrt(1e-3 * noise / d_total)
        W_joint = np.hstack([W_joint, extra])

    W, sigma2 = {}, {}
    for j, name in enumerate(names):
        block = data.views[name]
        # a view observed for N_k < N subjects has its block of C shrunk by N_k / N: undo it
        share = block.n_obs / n
        Wj = W_joint[edges[j]:edges[j + 1]] / np.sqrt(share)
        per_entry = scatter[name] / (block.n_obs * block.dim)
        residual = per_entry - float(np.vdot(Wj, Wj)) / block.dim
        W[name] = Wj
        # a constant view carries no scale: start its noise at 1 (as the data's unit scale)
        sigma2[name] = max(residual, 1e-3 * per_entry) if per_entry > 0 else 1.0
    return W, sigma2
