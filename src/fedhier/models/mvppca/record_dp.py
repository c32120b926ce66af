"""Record-level DP Fed-mv-PPCA: one release of each site's noisy moments, the hierarchical fit as post-processing.

Site c (``site_release``): its subjects' stacked observed views, centred at the public
centre, clipped to norm C (default sqrt(d) / 6, :func:`default_clip`), with one indicator per view (:func:`fedhier.privacy.analyze_gauss.record_vectors`),
give one noisy moment matrix M~_c over the layout

    [ view_1 (d_1) | ... | view_K (d_K) | o_1 ... o_K ]       (K = views of the schema)

Every block is released, those of a view no subject at the site measures too (zero moments
plus the same noise): which views a site measures is released through the mechanism, in the
noisy counts, never sent as such.  The coordinator takes view k as measured at the site when
its noisy count n~_k = M~[o_k, o_k] / c^2 is at least ``PRESENCE_SDS`` noise sds
(``measured_views``, post-processing); a view no site's release shows keeps the public prior.

From M~_c alone (``moments_to_covariance``), per pair of measured views (k, l):
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
import warnings
from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from ...privacy.analyze_gauss import RecordDP, nearest_psd, record_vectors, release_second_moment
from ...privacy.sampling import NoiseSource
from . import master
from .params import GlobalParams, LocalParams, ViewParams

__all__ = ["default_clip", "layout", "site_release", "measured_views", "moments_to_covariance", "ppca_from_covariance",
           "align_loadings", "global_from_releases", "CENTRE", "PRESENCE_SDS"]

#: public centre of data min--max scaled to [0, 1]
CENTRE = 0.5
#: eigenvalue floor of the released covariance (post-processing)
EIGENVALUE_FLOOR = 1e-6
#: a view counts as measured in a release when its noisy count is at least this many noise sds
#: (a view nobody measures passes with probability 0.13 %)
PRESENCE_SDS = 3.0


def default_clip(dims: Sequence[int]) -> float:
    """sqrt(d) / 6, for rows of d features min--max scaled to [0, 1], around 0.5 (d = sum of the view dimensions).

    Min--max scaling maps a feature's range, about six standard deviations of a bell-shaped
    feature, onto [0, 1], so a feature's sd is about 1/6 and a typical row lies within
    sqrt(d) / 6 of the centre.  sqrt(d) / 2 never clips, but its noise, proportional to C^2,
    is nine times as large; the few rows beyond sqrt(d) / 6 are shrunk onto it.
    """
    return math.sqrt(float(sum(dims))) / 6.0


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
                 noise: NoiseSource):
    """One site's release: (M~ of shape (D + K, D + K), GaussianDpEvent).

    ``views``: the site's ``{view: (n, d_k)}`` (a view it does not measure is absent; an
    unobserved subject is a row of NaN).  Every view present must have the same rows.  Every
    entry of M~ is noised, a view's blocks whether or not any subject measures it.
    """
    blocks, _ = layout(dims)
    clip, centre = _clip_centre(config, dims)
    n = {np.asarray(x).shape[0] for x in views.values()}
    if len(n) != 1:
        raise ValueError("the site's views must have the same number of rows (one per subject)")
    n_rows = n.pop()
    values = np.zeros((n_rows, blocks[-1].stop))
    indicators = np.zeros((n_rows, len(names)))
    for k, name in enumerate(names):
        if name not in views:
            continue
        x = np.asarray(views[name], dtype=float)
        seen = ~np.isnan(x).all(axis=1)
        values[seen, blocks[k]] = x[seen] - centre
        indicators[seen, k] = 1.0
    if not np.all(np.isfinite(values)):
        raise ValueError("a subject's view is partly missing: a view is observed for a subject or not at all")
    records = record_vectors(values, indicators, clip)
    return release_second_moment(records, config.sensitivity(clip), config.noise_multiplier, noise)


def _count_noise(dims: Sequence[int], config: RecordDP, n_releases: int) -> tuple[float, float]:
    """(c, sd of a count n~ = M~[o_k, o_l] / c^2) in a sum of ``n_releases`` releases."""
    clip, _ = _clip_centre(config, dims)
    weight = clip / math.sqrt(len(dims))
    return weight, config.noise_sd(clip) * math.sqrt(n_releases) / weight**2


def measured_views(M: np.ndarray, dims: Sequence[int], config: RecordDP, n_releases: int = 1) -> list[int]:
    """Indices k of the views whose noisy count n~_k = M~[o_k, o_k] / c^2 is at least ``PRESENCE_SDS`` noise sds.

    ``M``: one release, or the sum of ``n_releases`` releases.  Post-processing: the decision
    reads the released counts only.
    """
    _, indices = layout(dims)
    weight, count_sd = _count_noise(dims, config, n_releases)
    return [k for k in range(len(dims)) if M[indices[k], indices[k]] / weight**2 >= PRESENCE_SDS * count_sd]


def moments_to_covariance(M: np.ndarray, dims: Sequence[int], config: RecordDP, n_releases: int = 1):
    """Means and covariance of the measured views from one release, or a sum of ``n_releases``; post-processing.

    Returns ``(views, mean (D_o,), covariance (D_o, D_o), counts (K_o,))`` over the views
    :func:`measured_views` finds, ``views`` (indices) in layout order; ``mean`` on the data's
    scale.
    """
    blocks, indices = layout(dims)
    _, centre = _clip_centre(config, dims)
    weight, count_sd = _count_noise(dims, config, n_releases)
    noise = count_sd * weight**2
    ks = measured_views(M, dims, config, n_releases)
    if not ks:
        return ks, np.zeros(0), np.zeros((0, 0)), np.zeros(0)
    # a count is never taken below twice its noise sd: dividing by a count the noise made small would
    # blow the moments up; a larger divisor shrinks them towards the public centre instead
    least = max(2.0, 2.0 * count_sd)
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


def _site_params(M, names, dims, q, config, n_releases=1) -> LocalParams:
    """The multi-view PPCA of the views measured in ``M`` (one release or a sum of ``n_releases``).

    Views of D <= q features in all have D - 1 free loading columns (as a single view of
    d_k <= q features has, :func:`~fedhier.models.mvppca.mstep.effective_columns`); the
    other columns of W are 0.
    """
    ks, mean, S, _ = moments_to_covariance(M, dims, config, n_releases)
    if not ks:
        return {}
    view_dims = [dims[k] for k in ks]
    free = min(q, S.shape[0] - 1)
    W = np.zeros((S.shape[0], q))
    if free >= 1:
        W[:, :free], sigma2 = ppca_from_covariance(S, view_dims, free)
    else:  # one feature: no loading, all of its variance is noise
        sigma2 = np.maximum(np.diag(S), EIGENVALUE_FLOOR)
    starts = np.concatenate([[0], np.cumsum(view_dims)]).astype(int)
    return {names[k]: ViewParams(mu=mean[a:b].copy(), W=W[a:b].copy(), sigma2=float(sigma2[i]))
            for i, (k, a, b) in enumerate(zip(ks, starts[:-1], starts[1:]))}


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


def global_from_releases(releases: Sequence[np.ndarray], names: Sequence[str], dims: Sequence[int],
                         n_components: int, config: RecordDP, *, ig_solver: str = "newton"
                         ) -> tuple[GlobalParams, list[LocalParams]]:
    """theta~ and the aligned site parameters from the sites' releases ``[M~_c]``.

    Post-processing only: nothing here reads data.  A site contributes the views its release
    shows (:func:`measured_views`).  A view that no site's release shows keeps the public,
    data-independent prior (:func:`master.data_independent_prior` around the public centre),
    with a warning: the noise hides whatever the sites hold of it.
    """
    q = int(n_components)
    pooled = _site_params(sum(releases), names, dims, q, config, len(releases))
    reference = {v: p.W for v, p in pooled.items()}
    sites = [align_loadings(_site_params(M, names, dims, q, config), reference) for M in releases]
    _, centre = _clip_centre(config, dims)
    public = {v: replace(g, mu=np.full(g.mu.shape, centre))
              for v, g in master.data_independent_prior(dict(zip(names, dims)), q).items()}
    unseen = [v for v in names if not any(v in site for site in sites)]
    if unseen:
        warnings.warn(f"no site's release shows subjects of view(s) {unseen} above the noise, so the model keeps the "
                      "public prior for them: a larger epsilon, or sites with more subjects measuring them, would "
                      "let the data speak", UserWarning, stacklevel=2)
    theta, _ = master.global_step_from_params(sites, n_components=q, ig_solver=ig_solver, previous=public)
    return theta, sites
