"""Record-level DP Fed-mv-PPCA: one release of each site's noisy moments, the hierarchical fit as post-processing.

Site c (``site_release``): its subjects' stacked observed views, centred at the public
centre, clipped to norm C, with one indicator per view (:func:`fedhier.privacy.analyze_gauss.record_vectors`),
give one noisy moment matrix M~_c over the layout

    [ view_1 (d_1) | ... | view_K (d_K) | o_1 ... o_K ]       (K = views of the schema)

From M~_c alone (``moments_to_covariance``), per pair of views (k, l):
n_kl = M~[o_k, o_l] / c^2 subjects observing both (at least twice its noise sd), sums s_k|l = M~[view_k, o_l] / c and
S_kl = M~[view_k, view_l] / n_kl - s_k|l s_l|k^T / n_kl^2 (pairwise-complete blocks, each
with its own count, so a subject missing a view still counts for the others).  The view
means s_k|k / n_kk are shrunk towards the public centre by positive-part James--Stein with
the known noise variance; the assembled covariance is made positive semi-definite
(eigenvalues floored).

Then, all post-processing: each site's multi-view PPCA t = mu + W x + eps,
eps_k ~ N(0, sigma2_k I) from its covariance (``ppca_from_covariance``: Tipping & Bishop's
closed form, refined by EM on the covariance for view-specific noise variances); the sites'
loadings, identified only up to a rotation, are rotated (orthogonal Procrustes) onto the
PPCA of the sum of all releases; and the existing master step of the hierarchical prior
(:func:`fedhier.models.mvppca.master.global_step_from_params`) gives theta~.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ...privacy.analyze_gauss import RecordDP, nearest_psd, record_vectors, release_second_moment
from . import master
from .params import GlobalParams, LocalParams, ViewParams

__all__ = ["default_clip", "layout", "site_release", "moments_to_covariance", "ppca_from_covariance",
           "align_loadings", "global_from_releases", "CENTRE"]

#: public centre of data min--max scaled to [0, 1]
CENTRE = 0.5
#: eigenvalue floor of the released covariance (post-processing)
EIGENVALUE_FLOOR = 1e-6


def default_clip(dims: Sequence[int]) -> float:
    """sqrt(d) / 2: no record of data in [0, 1] is clipped around 0.5 (d = sum of the view dimensions)."""
    return 0.5 * math.sqrt(float(sum(dims)))


def layout(dims: Sequence[int]) -> tuple[list[slice], list[int]]:
    """Slices of each view's block and the index of each view's indicator in the moment matrix."""
    starts = np.concatenate([[0], np.cumsum(dims)]).astype(int)
    D = int(starts[-1])
    return [slice(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])], [D + k for k in range(len(dims))]


def _clip_centre(config: RecordDP, dims: Sequence[int]) -> tuple[float, float]:
    clip = default_clip(dims) if config.clip is None else float(config.clip)
    centre = CENTRE if config.centre is None else float(config.centre)
    return clip, centre


def site_release(views: Mapping[str, np.ndarray], names: Sequence[str], dims: Sequence[int], config: RecordDP,
                 rng: np.random.Generator):
    """One site's release: (M~ of shape (D + K, D + K), observed (K,) 0/1, GaussianDpEvent).

    ``views``: the site's ``{view: (n, d_k)}`` (a view it does not measure is absent; an
    unobserved subject is a row of NaN).  Every view present must have the same rows.
    """
    blocks, indices = layout(dims)
    clip, centre = _clip_centre(config, dims)
    n = {np.asarray(x).shape[0] for x in views.values()}
    if len(n) != 1:
        raise ValueError("the site's views must have the same number of rows (one per subject)")
    n_rows = n.pop()
    values = np.zeros((n_rows, blocks[-1].stop))
    indicators = np.zeros((n_rows, len(names)))
    released = np.zeros(blocks[-1].stop + len(names), dtype=bool)
    observed = np.zeros(len(names))
    for k, name in enumerate(names):
        if name not in views:
            continue
        x = np.asarray(views[name], dtype=float)
        seen = ~np.isnan(x).all(axis=1)
        if not seen.any():
            continue
        values[seen, blocks[k]] = x[seen] - centre
        indicators[seen, k] = 1.0
        released[blocks[k]] = True
        released[indices[k]] = True
        observed[k] = 1.0
    if not np.all(np.isfinite(values)):
        raise ValueError("a subject's view is partly missing: a view is observed for a subject or not at all")
    records = record_vectors(values, indicators, clip)
    noisy, event = release_second_moment(records, config.sensitivity(clip), config.noise_multiplier, rng, released)
    return noisy, observed, event


def moments_to_covariance(M: np.ndarray, observed: np.ndarray, dims: Sequence[int], config: RecordDP):
    """Means and covariance of the observed views from one (possibly summed) release; post-processing.

    Returns ``(views, mean (D_o,), covariance (D_o, D_o), counts (K_o,))`` over the observed
    views ``views`` (indices), in layout order; ``mean`` on the data's scale.
    """
    blocks, indices = layout(dims)
    clip, centre = _clip_centre(config, dims)
    weight = clip / math.sqrt(len(dims))
    ks = [k for k in range(len(dims)) if observed[k] > 0]
    noise = config.noise_sd(clip) * math.sqrt(max(float(observed.max()), 1.0))
    # a count is never taken below twice its noise sd: dividing by a count the noise made small would
    # blow the moments up; a larger divisor shrinks them towards the public centre instead
    least = max(2.0, 2.0 * noise / weight**2)
    counts = {(k, l): max(M[indices[k], indices[l]] / weight**2, least) for k in ks for l in ks}
    means, sums = [], {}
    for k in ks:
        for l in ks:
            sums[k, l] = M[blocks[k], indices[l]] / weight
        m = sums[k, k] / counts[k, k]
        # positive-part James--Stein towards the centre with the known noise variance of m
        tau2 = (noise / weight / counts[k, k]) ** 2
        size = float(m @ m)
        means.append(m * max(0.0, 1.0 - m.size * tau2 / size) if size > 0 else m)
    rows = []
    for k in ks:
        row = []
        for l in ks:
            n_kl = counts[k, l]
            row.append(M[blocks[k], blocks[l]] / n_kl - np.outer(sums[k, l], sums[l, k]) / n_kl**2)
        rows.append(np.hstack(row))
    covariance = nearest_psd(np.vstack(rows), EIGENVALUE_FLOOR)
    mean = np.concatenate(means) + centre
    return ks, mean, covariance, np.array([counts[k, k] for k in ks])


def ppca_from_covariance(S: np.ndarray, view_dims: Sequence[int], n_components: int, n_iter: int = 200,
                         floor: float = EIGENVALUE_FLOOR) -> tuple[np.ndarray, np.ndarray]:
    """ML multi-view PPCA from a covariance S (D, D): (W (D, q), sigma2 (K,)), one noise variance per view.

    Start: Tipping & Bishop's closed form W = U_q (Lambda_q - s2 I)^{1/2}, s2 = mean of the
    other eigenvalues.  With one view that is the ML solution; with several, ``n_iter`` EM
    steps on S (Psi block-diagonal, s2_k I per view):
    beta = W^T Sigma^-1, A = I - beta W + beta S beta^T, W <- S beta^T A^-1,
    s2_k <- mean of diag(S - W beta S) over view k.
    """
    D, q = S.shape[0], int(n_components)
    if not 1 <= q < D:
        raise ValueError(f"n_components must be between 1 and {D - 1}, got {q}")
    values, vectors = np.linalg.eigh(S)
    values, vectors = values[::-1], vectors[:, ::-1]
    s2 = max(float(values[q:].mean()), floor)
    W = vectors[:, :q] * np.sqrt(np.maximum(values[:q] - s2, 0.0))
    view_of = np.repeat(np.arange(len(view_dims)), view_dims)
    sigma2 = np.full(len(view_dims), s2)
    if len(view_dims) == 1:
        return W, sigma2
    for _ in range(int(n_iter)):
        psi = sigma2[view_of]
        Sigma = W @ W.T + np.diag(psi)
        beta = np.linalg.solve(Sigma, W).T
        A = np.eye(q) - beta @ W + beta @ S @ beta.T
        W = np.linalg.solve(A, (S @ beta.T).T).T
        residual = np.diag(S) - np.einsum("ij,ji->i", W, beta @ S)
        sigma2 = np.maximum(np.bincount(view_of, residual) / np.asarray(view_dims), floor)
    return W, sigma2


def _site_params(M, observed, names, dims, q, config) -> tuple[LocalParams, list[int]]:
    ks, mean, S, _ = moments_to_covariance(M, observed, dims, config)
    view_dims = [dims[k] for k in ks]
    W, sigma2 = ppca_from_covariance(S, view_dims, q)
    starts = np.concatenate([[0], np.cumsum(view_dims)]).astype(int)
    params = {names[k]: ViewParams(mu=mean[a:b].copy(), W=W[a:b].copy(), sigma2=float(sigma2[i]))
              for i, (k, a, b) in enumerate(zip(ks, starts[:-1], starts[1:]))}
    return params, ks


def align_loadings(params: LocalParams, reference: Mapping[str, np.ndarray]) -> LocalParams:
    """Rotate a site's loadings onto ``reference`` ({view: W}) by orthogonal Procrustes over its views.

    R = U V^T from the SVD U Sigma V^T of W_c^T W_ref (stacked views): the rotation (or
    reflection) minimising ||W_c R - W_ref||_F.  A PPCA is identified only up to such R.
    """
    views = [v for v in params if v in reference]
    if not views:
        return params
    Wc = np.vstack([params[v].W for v in views])
    Wr = np.vstack([reference[v] for v in views])
    U, _, Vt = np.linalg.svd(Wc.T @ Wr)
    R = U @ Vt
    return {v: ViewParams(mu=p.mu, W=p.W @ R, sigma2=p.sigma2) for v, p in params.items()}


def global_from_releases(releases: Sequence[tuple[np.ndarray, np.ndarray]], names: Sequence[str], dims: Sequence[int],
                         n_components: int, config: RecordDP, *, ig_solver: str = "newton"
                         ) -> tuple[GlobalParams, list[LocalParams]]:
    """theta~ and the aligned site parameters from the sites' releases ``[(M~_c, observed_c)]``.

    Post-processing only: nothing here reads data.
    """
    q = int(n_components)
    pooled_M = sum(M for M, _ in releases)
    pooled_observed = np.sum([obs for _, obs in releases], axis=0)
    pooled, _ = _site_params(pooled_M, pooled_observed, names, dims, q, config)
    reference = {v: p.W for v, p in pooled.items()}
    sites = [align_loadings(_site_params(M, obs, names, dims, q, config)[0], reference) for M, obs in releases]
    theta, _ = master.global_step_from_params(sites, n_components=q, ig_solver=ig_solver)
    return theta, sites
