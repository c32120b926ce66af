"""Master step: maximum-likelihood estimate of the hierarchical prior theta~ (spec §5).

Per view k, over the C_k sites that sent it (1/C_k, §15.9):

    mu~ = mean_c mu_c,      sigma2_mu~ = sum_c ||mu_c - mu~||^2   / (C_k d_k)        (eqs. 13, 14)
    W~  = mean_c W_c,       sigma2_W~  = sum_c ||W_c - W~||_F^2 / (C_k d_k q)      (eqs. 17, 18)
    (alpha, beta) = ML1 of the sigma2_c (§5.2),  s-bar = mean_c sigma2_c,
    v_sigma = beta^2 / ((alpha - 1)^2 (alpha - 2)).

All of this needs only *sums over sites* of the per-site statistics of
:func:`site_statistics` (so secure summation can replace plain summation).  Squared
deviations are taken about an anchor a (the previous global mu~, W~; zeros in round 1):
sum_c ||mu_c - mu~||^2 = sum_c ||mu_c - a||^2 - C_k ||mu~ - a||^2, which avoids the
cancellation of the raw second moment.

[RC] safeguards (reported, never silent): C_k = 1 sets both variances to 1e-4; a zero
spread sets the variance to 1e-20; sigma2_W~ is capped at ||W~||_F / 5.  A spread is
"zero" when it is below 1e-12 of sum_c ||mu_c - a||^2 (identical values up to rounding).

``prior_update="em"`` [R] replaces eqs. 14 and 18 by an EM (empirical Bayes) update of
the between-site variances.  The sites' estimates m_c (mu_c or W_c) are shrunk toward the
prior; the update adds back each site's posterior covariance V_c (:mod:`.spread`, summed
over sites as ``sum_post_var_mu`` and ``sum_post_var_W``) and the uncertainty of the
global mean (REML: the mean is integrated out, which removes the (C_k - 1) / C_k bias of
ML), with v the variance the sites used and D = d_k (mu) or d_k q_k (W, q_k effective
columns, §4.4):

    v_new = [sum_c ||m_c - m~||^2 + (1 - 1/C_k) sum_c tr V_c + D v] / (C_k D),

and, with the sites' exact traces (no privacy), a Gamma(2, 0) prior on the sd that keeps the
variance off zero (denominator C_k D - 1; :func:`_em_variance`, which also adds back the
rotations the local MAP removes).

With the fields of :data:`COLUMN_FIELDS` (per column i, the sites' ||w_ci - a_i||^2 and
tr Cov(w_ci)) the columns that carry signal share this update over their d_k |group| coordinates
and each column without signal gets it from its own d_k (:func:`column_groups`), sigma2_Wi~;
sigma2_W~ is their mean weighted by ||w~_i||^2 (:func:`.params.loading_variance`).

In round 1 the sites fit without a prior; the update is then the spread of their
maximum-likelihood estimates, sum_c ||m_c - m~||^2 / ((C_k - 1) D), which includes their
sampling error: a start from above, from which the EM steps of the next rounds descend.

The scale of the loadings (:func:`latent_scale`).  x ~ N(0, I_q) is the only thing that
fixes the scale of W~: W_c -> W_c A, x -> A^{-1} x leaves every site's likelihood
unchanged but for the latents' prior.  Each local MAP is pinned to the scale of W~ by the
prior (d_k q coordinates, each of variance sigma2_W~), while a site's data inform the
scale through its N_c latents only, so the master's averages barely move it from round to
round and it drifts: the fitted loadings come out too small and their spread with them.
A parameter-expanded EM step (Liu, Rubin & Wu 1998) lets the latents' variance be
estimated, x ~ N(0, s I) with s = tr S / q, S = sum_c sum_n <x_n x_n^T> / sum_c N_c, and
folds it back into the loadings:

    W~ <- sqrt(s) W~,   sigma2_W~ <- s sigma2_W~,

which moves the scale in one step; at a fixed point s = 1.  Once, after round 2, the whole
of S is folded, W~ <- W~ S^{1/2}: round 1's W~ is the average of maximum-likelihood
loadings that each site found in its own rotation of the latent space, so the sizes of its
columns relative to one another are arbitrary (a column can nearly cancel), and the round-2
sites, fitted with that prior, measure in S how far they are from N(0, I).  (Folding the
whole of S in every round also keeps turning the latent space; on sites holding different
groups, whose latents differ in covariance, that led the fit astray.)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from .invgamma import fit_invgamma_statistics, invgamma_mle, invgamma_mle_from_statistics
from .mstep import effective_columns
from .params import GlobalParams, GlobalView, LocalParams, loading_variance

__all__ = [
    "statistic_shapes",
    "site_statistics",
    "global_step",
    "global_step_from_params",
    "data_independent_prior",
    "relative_change",
    "THETA_BLOCKS",
    "invgamma_mle",
    "invgamma_mle_from_statistics",
    "SINGLE_SITE_VARIANCE",
    "ZERO_SPREAD_VARIANCE",
    "PRIOR_UPDATES",
    "SPREAD_FIELDS",
    "latent_shapes",
    "COLUMN_FIELDS",
    "latent_scale",
    "column_groups",
    "loading_variance_cap",
]

#: [RC] rho: prior variances when a single site observes the view
SINGLE_SITE_VARIANCE = 1e-4
#: [RC] prior variance when all sites sent identical values
ZERO_SPREAD_VARIANCE = 1e-20
#: the blocks of theta~ (per view) whose change the optional stopping rule measures (§6 [R])
THETA_BLOCKS = ("mu", "W", "sigma2_mu", "sigma2_W", "alpha", "beta")
#: ways to update the prior's variances from the sites' replies: the [R] EM update or eqs. 14, 18 [P]
PRIOR_UPDATES = ("em", "paper")
#: the per-view fields that ``prior_update="em"`` adds to the site statistics
SPREAD_FIELDS = ("sum_post_var_mu", "sum_post_var_W")
#: the per-view fields of shape (q,) that the per-column update of sigma2_Wi adds: the columns' terms of
#: sum_sq_W and sum_post_var_W
COLUMN_FIELDS = ("sum_sq_W_columns", "sum_post_var_W_columns")
#: the accelerated step of the variance update stays within this factor of the EM step
_NEWTON_RANGE = 4.0
#: a spread below this fraction of the summed squared norms (about the anchor) is rounding noise
_ZERO_SPREAD_RTOL = 1e-12


def _check_prior_update(prior_update: str) -> None:
    if prior_update not in PRIOR_UPDATES:
        raise ValueError(f"prior_update must be one of {PRIOR_UPDATES}, got {prior_update!r}")


def statistic_shapes(
    dim: int, n_components: int, prior_update: str = "paper", columns: bool = False
) -> dict[str, tuple[int, ...]]:
    """Field names and shapes of the per-view statistics of :func:`site_statistics`
    (``prior_update="em"`` adds the scalars of :data:`SPREAD_FIELDS`, and with ``columns``
    the (q,) vectors of :data:`COLUMN_FIELDS`)."""
    _check_prior_update(prior_update)
    spread = {name: () for name in SPREAD_FIELDS} if prior_update == "em" else {}
    if prior_update == "em" and columns:
        spread |= {name: (n_components,) for name in COLUMN_FIELDS}
    return spread | {
        "count": (),
        "sum_mu": (dim,),
        "sum_sq_mu": (),
        "sum_W": (dim, n_components),
        "sum_sq_W": (),
        "sum_inv_sigma2": (),
        "sum_log_sigma2": (),
        "sum_sigma2": (),
        "sum_sq_sigma2": (),
    }


def latent_shapes(n_components: int) -> dict[str, tuple[int, ...]]:
    """The fields (not per view) that ``prior_update="em"`` adds to a site's reply without privacy:
    ``latent_moment`` = sum_n <x_n x_n^T> (q, q) and ``latent_count`` = N_c (:func:`latent_scale`)."""
    q = int(n_components)
    return {"latent_moment": (q, q), "latent_count": ()}


def _anchor(anchor: GlobalParams | None, view: str, dim: int, q: int) -> tuple[np.ndarray, np.ndarray]:
    if anchor is None or view not in anchor:
        return np.zeros(dim), np.zeros((dim, q))
    a = anchor[view]
    if np.shape(a.mu) != (dim,) or np.shape(a.W) != (dim, q):
        raise ValueError(f"anchor: view {view!r} has mu {np.shape(a.mu)} and W {np.shape(a.W)}, expected ({dim},) and ({dim}, {q})")
    return np.asarray(a.mu, dtype=float), np.asarray(a.W, dtype=float)


def site_statistics(
    params: LocalParams,
    anchor: GlobalParams | None,
    spread: Mapping[str, tuple[float, float]] | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """Per-view statistics of one site whose sums over sites determine :func:`global_step`.

    Parameters
    ----------
    params : LocalParams
        theta_c for the views the site observes.
    anchor : GlobalParams or None
        The previous global model (same for every site); None or a missing view means
        anchor 0.
    spread : mapping view -> (tr Cov(mu_c), tr Cov(W_c)), optional
        The site's posterior spread (:func:`.spread.posterior_spread`); adds the fields
        ``sum_post_var_mu``, ``sum_post_var_W`` (for ``prior_update="em"``).  Given per
        column (an ndarray of shape (q,)), also the fields of :data:`COLUMN_FIELDS`:
        sum_sq_W_columns = ||w_ci - a_i||^2 and sum_post_var_W_columns = tr Cov(w_ci).

    Returns
    -------
    dict view -> dict field -> ndarray
        Fields and shapes as :func:`statistic_shapes`: count = 1, sum_mu = mu_c,
        sum_sq_mu = ||mu_c - a_mu||^2, sum_W = W_c, sum_sq_W = ||W_c - a_W||_F^2,
        sum_inv_sigma2 = 1/sigma2_c, sum_log_sigma2 = ln sigma2_c, sum_sigma2 = sigma2_c,
        sum_sq_sigma2 = sigma2_c^2.
    """
    out = {}
    for view, p in params.items():
        mu = np.asarray(p.mu, dtype=float)
        W = np.asarray(p.W, dtype=float)
        if W.ndim != 2 or mu.shape != (W.shape[0],):
            raise ValueError(f"params: view {view!r} needs mu (d,) and W (d, q), got {mu.shape} and {W.shape}")
        s2 = float(p.sigma2)
        if not (np.isfinite(s2) and s2 > 0):
            raise ValueError(f"params: view {view!r} has sigma2 = {s2}; it must be positive and finite")
        a_mu, a_W = _anchor(anchor, view, *W.shape)
        dmu, dW = mu - a_mu, W - a_W
        out[view] = {
            "count": np.array(1.0),
            "sum_mu": mu.copy(),
            "sum_sq_mu": np.array(dmu @ dmu),
            "sum_W": W.copy(),
            "sum_sq_W": np.array(np.vdot(dW, dW)),
            "sum_inv_sigma2": np.array(1.0 / s2),
            "sum_log_sigma2": np.array(np.log(s2)),
            "sum_sigma2": np.array(s2),
            "sum_sq_sigma2": np.array(s2 * s2),
        }
        if spread is not None:
            post_mu, post_W = float(spread[view][0]), np.asarray(spread[view][1], dtype=float)
            if post_W.shape not in ((), (W.shape[1],)):
                raise ValueError(f"spread: view {view!r} needs tr Cov(W_c) as a number or {W.shape[1]} columns")
            if not (np.isfinite(post_mu) and np.all(np.isfinite(post_W)) and post_mu >= 0 and np.all(post_W >= 0)):
                raise ValueError(f"spread: view {view!r} needs non-negative finite traces")
            out[view]["sum_post_var_mu"] = np.array(post_mu)
            out[view]["sum_post_var_W"] = np.array(post_W.sum())
            if post_W.ndim == 1:
                out[view]["sum_sq_W_columns"] = np.sum(dW**2, axis=0)
                out[view]["sum_post_var_W_columns"] = post_W.copy()
    return out


def _spread(spread: float, sum_sq: float) -> float:
    """The summed squared deviation, or 0 when it is below rounding noise of sum_c ||v_c - a||^2."""
    return spread if spread > _ZERO_SPREAD_RTOL * sum_sq else 0.0


def _em_variance(spread, posterior, used, count: int, n_coord: int, flat=0.0, newton: bool = True,
                 sd_prior: bool = True):
    """One step for a between-site variance with the global mean integrated out (REML), and a
    prior that keeps it off zero.

    Elementwise: ``spread``, ``posterior``, ``used``, ``flat`` are numbers, or arrays of one
    entry per column of the loadings (each column its own variance, D = d_k).

    The EM step is

        T(v) = [sum_c ||m_c - m~||^2 + (1 - 1/C) sum_c tr V_c + D v + (C - 1) r (v - t)] / (C D - 1),

    m_c the sites' estimates, V_c their posterior covariances under the prior variance v
    they used, t = sum_c tr V_c / (C D) a coordinate's posterior variance at a site, D the
    number of coordinates, r (``flat``) the number of them the likelihood does not see
    (:func:`rotation_shares`).  The term D v - (1/C) sum_c tr V_c is the uncertainty of the
    global mean m~ (module docstring).  Along a coordinate the likelihood does not see the
    site's estimate is m~ and its exact posterior variance is the prior's v, while tr V_c
    counts t there as everywhere: the term (C - 1) r (v - t) puts v - t in its place.  The
    denominator C D - 1 (``sd_prior``; C D without) is the mode under a Gamma(2, 0) prior on
    the sd, density proportional to sqrt(v) (Chung et al. 2013, "A nondegenerate penalized
    likelihood estimator for variance parameters in multilevel models"): where the spread is
    small against the sampling error the REML estimate is often 0 and EM creeps to it; the
    prior's mode never is, and it costs a relative 1 / (C D) where the data fix v.

    EM converges at the rate T'(v) = 1 - (1 - rho)^2, rho = a / (v + a) the fraction of
    missing information of a coordinate with sampling variance a at a site, which tends to
    1 when the spread is small against the sampling error: there EM takes hundreds of
    rounds, and a small error in T moves its fixed point far.  With ``newton`` the step
    solves the fixed-point equation T(v) = v of a model of how the sites' statistics answer
    to v, with every site's coordinates of one sampling variance a: a site's posterior
    variance is t(v) = a v / (a + v), its estimate is the maximum-likelihood one shrunk by
    b(v) = v / (v + a), so the spread is b(v)^2 S_ML, S_ML summed over the K / (C - 1) =
    D - r coordinates the likelihood sees.  From the statistics at the v0 the sites used,
    t0 = sum_c tr V_c / (C D) gives a = v0 t0 / (v0 - t0) and S_ML = S / b(v0)^2, and
    T(v) = v becomes K (v - t(v)) - v = b(v)^2 S_ML, that is

        (K - 1) v^2 - (S_ML - (K - 2) a) v - a^2 = 0,

    whose positive root is the mode of the REML likelihood of the sites' maximum-likelihood
    estimates, -(K / 2) ln(v + a) - S_ML / (2 (v + a)), times the prior (without the prior,
    S_ML / K - a, or 0 when that is negative).  Where the sites' statistics satisfy
    T(v0) = v0 the root is v0, so the fixed points are those of EM.  The step is kept within
    a factor :data:`_NEWTON_RANGE` of T(v0).
    """
    t0 = np.asarray(posterior, dtype=float) / (count * n_coord)
    unseen = used - np.clip(t0, 0.0, used)  # v - t, with traces made noisy by privacy kept to [0, v]
    total = spread + (1.0 - 1.0 / count) * posterior + n_coord * used + (count - 1) * flat * unseen
    prior = 1.0 if sd_prior else 0.0
    step = total / (count * n_coord - prior)
    if not newton:
        return step
    spread, used, flat = (np.asarray(x, dtype=float) for x in (spread, used, flat))
    with np.errstate(divide="ignore", invalid="ignore"):
        a = used * t0 / (used - t0)
        ml_spread = spread * ((used + a) / used) ** 2
        k = (count - 1) * (n_coord - flat)
        half = ml_spread - (k - 2.0 * prior) * a
        solved = (half + np.sqrt(half**2 + 4.0 * (k - prior) * prior * a**2)) / (2.0 * (k - prior))
    ok = (t0 > 0) & (t0 < used) & np.isfinite(solved)
    accelerated = np.where(ok, solved, step)
    return np.minimum(np.maximum(accelerated, step / _NEWTON_RANGE), step * _NEWTON_RANGE)


def column_groups(W: np.ndarray, noise_var: float, n_subjects: float | None) -> np.ndarray:
    """Which columns of the loadings share a between-site variance: those that carry signal.

    A column carries signal when the variance it explains, ||w~_i||^2, exceeds the most that
    sampling noise alone gives a site's fit, the Marchenko-Pastur edge of the eigenvalues of a
    covariance of d_k features of noise variance sigma2 estimated from n subjects,

        ||w~_i||^2 > sigma2 [(1 + sqrt(d_k / n))^2 - 1].

    The signal columns form one group (they share sigma2_W, so a column cannot drift loose
    from the others on sites that differ); each column without signal is a group of its own,
    whose variance falls toward 0 without pulling the shared one down.

    Parameters
    ----------
    W : ndarray of shape (d_k, q_k)
        W~ (effective columns).
    noise_var : float
        sigma2, the sites' mean noise variance.
    n_subjects : float or None
        n, the mean number of subjects a site holds; None counts every column as signal.

    Returns
    -------
    ndarray of shape (n_groups, q_k)
        0/1 membership of the columns; every column in exactly one group.
    """
    d, q_k = W.shape
    edge = 0.0 if n_subjects is None else noise_var * ((1.0 + np.sqrt(d / n_subjects)) ** 2 - 1.0)
    signal = np.sum(np.asarray(W, dtype=float) ** 2, axis=0) > edge
    groups = [signal] if signal.any() else []
    groups += [np.arange(q_k) == i for i in np.flatnonzero(~signal)]
    return np.array(groups, dtype=float)


def loading_variance_cap(W: np.ndarray) -> float:
    """[RC] The largest between-site variance of the loadings, ||W~||_F / 5; inf when W~ = 0 (nothing to scale it by)."""
    cap = float(np.linalg.norm(W)) / 5.0
    return cap if cap > 0.0 else np.inf


def rotation_shares(prior: GlobalParams) -> dict[str, np.ndarray]:
    """How many of the q (q - 1) / 2 rotation directions of the latent space fall on each column of each view.

    The likelihood of a site depends on its loadings only through W_c W_c^T: W_c R (R
    orthogonal, the same for all views) fits equally well, so the local MAP turns W_c
    toward W~ and its deviation along the q (q - 1) / 2 directions W~ A (A skew-symmetric)
    is lost, although the prior gives each of them variance.  The direction of the pair
    (i, j) moves column i of view k along w~_kj and column j along w~_ki; their whitened
    weights ||w~_kj||^2 / sigma2_W~ki and ||w~_ki||^2 / sigma2_W~kj over the sum over views
    and the two columns are their shares of the direction; r_ki sums the shares of column i.

    Returns
    -------
    dict view -> ndarray of shape (q,)
    """
    views = list(prior)
    if not views:
        return {}
    q = np.shape(prior[views[0]].W)[1]
    norms = np.array([np.sum(np.asarray(prior[v].W, dtype=float) ** 2, axis=0) for v in views])  # (K, q)
    variances = np.array([np.asarray(prior[v].sigma2_W_columns, dtype=float) for v in views])  # (K, q)
    shares = np.zeros((len(views), q))
    for i in range(q):
        for j in range(i + 1, q):
            weight_i, weight_j = norms[:, j] / variances[:, i], norms[:, i] / variances[:, j]
            total = weight_i.sum() + weight_j.sum()
            if total > 0 and np.isfinite(total):
                shares[:, i] += weight_i / total
                shares[:, j] += weight_j / total
    return dict(zip(views, shares))


def _finish_view(
    view: str,
    count: int,
    mu: np.ndarray,
    spread_mu: float,
    W: np.ndarray,
    spread_W: float | np.ndarray,
    ig: tuple[float, float, list[str]],
    noise_var: float,
    notes: list[str],
    posterior: tuple | None = None,
    newton: bool = True,
    n_subjects: float | None = None,
) -> GlobalView:
    """Variances with the [RC] safeguards, from the means and summed squared deviations.

    ``posterior`` = (sum_c tr Cov(mu_c), sum_c tr Cov(W_c), the prior view the sites used or
    None in round 1, the view's rotation shares per column) selects the EM update (module
    docstring); None the paper's eqs. 14, 18; ``newton`` as :func:`_em_variance`.  With
    ``spread_W`` and the W trace given per column (ndarrays of shape (q,)) each column i
    shares one variance among the columns that carry signal and gives each other column its
    own (:func:`column_groups`, ``n_subjects`` the mean number of subjects a site holds);
    otherwise one variance is shared by all columns.
    """
    d, q = W.shape
    q_k = max(effective_columns(d, q), 1)
    if count == 1:
        var_mu, var_W = SINGLE_SITE_VARIANCE, np.full(q_k, SINGLE_SITE_VARIANCE)
        notes.append(f"view {view!r}: a single site (C_k = 1), prior variances set to {SINGLE_SITE_VARIANCE:g}")
    else:
        if posterior is None:  # eqs. 14, 18
            var_mu = spread_mu / (count * d)
            var_W = np.full(q_k, spread_W / (count * d * q))
        else:
            post_mu, post_W, used, flat = posterior
            if np.ndim(spread_W) == 1:  # the signal columns share a variance, each other column has its own
                group = column_groups(W[:, :q_k], noise_var, n_subjects)
                spread_W, post_W, flat = (group @ np.asarray(x, dtype=float)[:q_k] for x in (spread_W, post_W, flat))
                n_coord = d * group.sum(axis=1)
                used_W = None if used is None else group @ np.asarray(used.sigma2_W_columns, dtype=float)[:q_k] / group.sum(axis=1)
            else:
                flat, n_coord = float(np.sum(flat)), d * q_k
                used_W = None if used is None else used.sigma2_W
            if used is None:  # round 1: the sites' maximum-likelihood estimates, an upper start
                var_mu = spread_mu / ((count - 1) * d)
                var_W = spread_W / ((count - 1) * n_coord)
            else:
                # the prior on the sds with the sites' exact traces only: under privacy the noise of the releases
                # sets the variances, and the prior's push on them made the fits of the paper's setting diverge
                var_mu = _em_variance(spread_mu, post_mu, used.sigma2_mu, count, d, newton=newton, sd_prior=newton)
                var_W = _em_variance(spread_W, post_W, used_W, count, n_coord, flat, newton=newton, sd_prior=newton)
            var_W = (var_W @ group) if np.ndim(var_W) == 1 else np.full(q_k, float(var_W))
        if var_mu <= 0.0:
            var_mu = ZERO_SPREAD_VARIANCE
            notes.append(f"view {view!r}: zero spread of mu, sigma2_mu set to {ZERO_SPREAD_VARIANCE:g}")
        if np.any(var_W <= 0.0):
            var_W[var_W <= 0.0] = ZERO_SPREAD_VARIANCE
            notes.append(f"view {view!r}: zero spread of W, sigma2_W set to {ZERO_SPREAD_VARIANCE:g}")
    cap = loading_variance_cap(W)
    if cap < var_W.max():
        notes.append(f"view {view!r}: sigma2_W {var_W.max():.4g} capped at ||W~||_F / 5 = {cap:.4g}")
        var_W = np.minimum(var_W, cap)
    var_summary = loading_variance(W[:, :q_k], var_W)
    columns = np.concatenate([var_W, np.full(q - q_k, var_summary)])[:q]  # columns beyond q_k are 0 (§4.4)
    alpha, beta, ig_notes = ig
    notes.extend(f"view {view!r}: {note}" for note in ig_notes)
    var_sigma = beta**2 / ((alpha - 1.0) ** 2 * (alpha - 2.0)) if alpha > 2.0 else np.inf
    return GlobalView(
        mu=mu, W=W, sigma2_mu=float(var_mu), sigma2_W=var_summary, alpha=alpha, beta=beta,
        noise_var=float(noise_var), var_sigma=float(var_sigma), sigma2_W_columns=columns,
    )


def global_step(
    stats: Mapping[str, Mapping[str, np.ndarray]],
    *,
    anchor: GlobalParams | None,
    n_components: int,
    ig_solver: str = "newton",
    previous: GlobalParams | None = None,
    prior_update: str = "paper",
    newton: bool = True,
    n_subjects: float | None = None,
) -> tuple[GlobalParams, tuple[str, ...]]:
    """ML estimate of theta~ from the per-view sums of :func:`site_statistics` (§5).

    Parameters
    ----------
    stats : mapping view -> mapping field -> ndarray
        Field-wise sums over the sites that replied (shapes of :func:`statistic_shapes`).
    anchor : GlobalParams or None
        The anchor the sites used (must be the same).
    n_components : int
        q.
    ig_solver : {"newton", "fixed_point"}
        ML1 solver (§5.2).
    previous : GlobalParams, optional
        Returned unchanged for a view with count 0 (the view is absent from the result
        when ``previous`` lacks it too).
    prior_update : {"paper", "em"}
        Eqs. 14, 18 [P] or the EM update of the variances [R] (module docstring), which
        needs the fields of :data:`SPREAD_FIELDS`; with "em", ``previous`` None means that
        the sites fitted without a prior (round 1).
    newton : bool
        With "em": take the Newton step on the EM map of the variances (:func:`_em_variance`),
        which needs the sites' exact posterior traces; False takes the plain EM step.
    n_subjects : float, optional
        With the fields of :data:`COLUMN_FIELDS`: the mean number of subjects a site holds,
        which sets the noise level below which a column carries no signal (:func:`column_groups`);
        None counts every column as signal.

    Returns
    -------
    global_params : GlobalParams
    safeguards : tuple of str
        One note per [RC] safeguard that triggered.

    Raises
    ------
    ValueError
        If a field is missing, mis-shaped, or the count is not a non-negative integer.
    """
    _check_prior_update(prior_update)
    q = int(n_components)
    notes: list[str] = []
    result: GlobalParams = {}
    views = list(stats) + [v for v in (previous or {}) if v not in stats]
    shares = rotation_shares(previous) if prior_update == "em" and previous is not None else {}
    for view in views:
        fields = stats.get(view)
        count = 0 if fields is None else float(np.asarray(fields.get("count", np.nan)))
        if not (np.isfinite(count) and count >= 0 and count == round(count)):
            raise ValueError(f"statistics: view {view!r} has count {count}; expected a non-negative integer")
        if count == 0:
            if previous is not None and view in previous:
                result[view] = previous[view]
            continue
        count = int(count)
        dim = np.shape(fields.get("sum_mu"))[0] if np.ndim(fields.get("sum_mu")) == 1 else -1
        columns = prior_update == "em" and COLUMN_FIELDS[0] in fields
        for name, shape in statistic_shapes(dim, q, prior_update, columns).items():
            if name not in fields:
                raise ValueError(f"statistics: view {view!r} lacks field {name!r}")
            if np.shape(fields[name]) != shape:
                raise ValueError(f"statistics: view {view!r} field {name!r} has shape {np.shape(fields[name])}, expected {shape}")
        a_mu, a_W = _anchor(anchor, view, dim, q)
        mu = np.asarray(fields["sum_mu"], dtype=float) / count
        W = np.asarray(fields["sum_W"], dtype=float) / count
        dmu, dW = mu - a_mu, W - a_W
        sum_sq_mu, sum_sq_W = float(fields["sum_sq_mu"]), float(fields["sum_sq_W"])
        spread_mu = _spread(sum_sq_mu - count * float(dmu @ dmu), sum_sq_mu)
        spread_W = _spread(sum_sq_W - count * float(np.vdot(dW, dW)), sum_sq_W)
        post_W = float(fields["sum_post_var_W"]) if prior_update == "em" else 0.0
        if columns:  # per column i: sum_c ||w_ci - w~_i||^2, zero below the rounding noise of its own sum
            sum_sq_columns = np.asarray(fields["sum_sq_W_columns"], dtype=float)
            spread_W = sum_sq_columns - count * np.sum(dW**2, axis=0)
            spread_W[spread_W <= _ZERO_SPREAD_RTOL * sum_sq_columns] = 0.0
            post_W = np.asarray(fields["sum_post_var_W_columns"], dtype=float)
        ig = fit_invgamma_statistics(
            count, float(fields["sum_inv_sigma2"]), float(fields["sum_log_sigma2"]),
            float(fields["sum_sigma2"]), float(fields["sum_sq_sigma2"]), ig_solver,
        )
        posterior = None
        if prior_update == "em":
            used = None if previous is None else previous.get(view)
            flat = shares.get(view, np.zeros(q))
            posterior = (float(fields["sum_post_var_mu"]), post_W, used, flat)
        result[view] = _finish_view(
            view, count, mu, spread_mu, W, spread_W, ig, float(fields["sum_sigma2"]) / count, notes, posterior, newton,
            n_subjects,
        )
    return result, tuple(notes)


def global_step_from_params(
    site_params: Sequence[LocalParams],
    *,
    n_components: int,
    ig_solver: str = "newton",
    previous: GlobalParams | None = None,
) -> tuple[GlobalParams, tuple[str, ...]]:
    """The paper's direct form of the master step (eqs. 13, 14, 17, 18 and ML1 on the values).

    Same result as ``global_step`` on the summed :func:`site_statistics` (up to
    rounding); kept as the reference implementation.  Arguments and returns as
    :func:`global_step`.
    """
    q = int(n_components)
    notes: list[str] = []
    result: GlobalParams = {}
    views: list[str] = []
    for params in site_params:
        views.extend(v for v in params if v not in views)
    views.extend(v for v in (previous or {}) if v not in views)
    for view in views:
        blocks = [params[view] for params in site_params if view in params]
        if not blocks:
            if previous is not None and view in previous:
                result[view] = previous[view]
            continue
        mus = np.stack([np.asarray(b.mu, dtype=float) for b in blocks])
        Ws = np.stack([np.asarray(b.W, dtype=float) for b in blocks])
        if Ws.shape[2] != q:
            raise ValueError(f"params: view {view!r} has {Ws.shape[2]} latent components, expected {q}")
        s2 = np.array([float(b.sigma2) for b in blocks])
        mu = mus.mean(axis=0)
        W = Ws.mean(axis=0)
        spread_mu = _spread(float(((mus - mu) ** 2).sum()), float((mus**2).sum()))
        spread_W = _spread(float(((Ws - W) ** 2).sum()), float((Ws**2).sum()))
        if not (np.all(np.isfinite(s2)) and np.all(s2 > 0)):
            raise ValueError(f"params: view {view!r} has a non-positive or non-finite sigma2 among {s2.tolist()}")
        ig = fit_invgamma_statistics(
            s2.size, float(np.sum(1.0 / s2)), float(np.sum(np.log(s2))), float(s2.sum()), float(s2 @ s2), ig_solver
        )
        result[view] = _finish_view(view, len(blocks), mu, spread_mu, W, spread_W, ig, float(s2.mean()), notes)
    return result, tuple(notes)


def data_independent_prior(dims: Mapping[str, int], n_components: int) -> GlobalParams:
    """Public, data-independent theta~[0] of §8.2 "Round 1" [R] (used by DP in round 1).

    For data min–max scaled to [0, 1]: mu~ = 0.5 (mid-range), W~ = 0, sigma2_mu~ =
    sigma2_W~ = 1, IG(2.25, 0.625) (mean 0.5, variance 1) so s-bar = 0.5 and v_sigma = 1.
    """
    alpha, beta = 2.25, 0.625
    out = {}
    for view, dim in dims.items():
        if int(dim) < 1:
            raise ValueError(f"dims: view {view!r} has dimension {dim}; it must be >= 1")
        out[view] = GlobalView(
            mu=np.full(int(dim), 0.5), W=np.zeros((int(dim), int(n_components))), sigma2_mu=1.0, sigma2_W=1.0,
            alpha=alpha, beta=beta, noise_var=beta / (alpha - 1.0),
            var_sigma=beta**2 / ((alpha - 1.0) ** 2 * (alpha - 2.0)),
        )
    return out


def latent_scale(params: GlobalParams, second_moment: float | np.ndarray, *, shape: bool = False) -> GlobalParams:
    """Fold the latents' pooled second moment S into the loadings (module docstring).

    By default its scale s = tr S / q: W~ <- sqrt(s) W~, sigma2_W~ <- s sigma2_W~ (and each
    sigma2_Wi~).  With ``shape`` the whole of it, W~ <- W~ S^{1/2} (the symmetric root), which
    also gives the columns their relative sizes; the variances are scaled by s as before.  The
    rest of theta~ is unchanged.

    Parameters
    ----------
    params : GlobalParams
        theta~ from :func:`global_step`.
    second_moment : float or ndarray of shape (q, q)
        S = sum_c sum_n <x_n x_n^T> / sum_c N_c over the sites that replied, or its scale s.
    shape : bool
        Fold S itself, not only its scale (needs S as a matrix).

    Raises
    ------
    ValueError
        If S is not positive definite and finite (s not a positive finite number).
    """
    S = np.asarray(second_moment, dtype=float)
    s = float(np.trace(S)) / S.shape[0] if S.ndim == 2 else float(S)
    if not (np.isfinite(s) and s > 0.0):
        raise ValueError(f"latent second moment must be positive and finite, got scale {s}")
    root = None
    if shape:
        if S.ndim != 2 or S.shape[0] != S.shape[1]:
            raise ValueError(f"folding the shape needs the latents' second moment as a square matrix, got shape {S.shape}")
        eig, vec = np.linalg.eigh((S + S.T) / 2.0)
        if not (np.all(np.isfinite(eig)) and eig.min() > 0.0):
            raise ValueError("latent second moment must be positive definite and finite")
        root = (vec * np.sqrt(eig)) @ vec.T
    out = {}
    for view, g in params.items():
        W = np.asarray(g.W, dtype=float)
        out[view] = replace(g, W=np.sqrt(s) * W if root is None else W @ root, sigma2_W=g.sigma2_W * s,
                            sigma2_W_columns=s * np.asarray(g.sigma2_W_columns, dtype=float))
    return out


def relative_change(previous: GlobalParams, current: GlobalParams, blocks: Sequence[str] = THETA_BLOCKS) -> float:
    """Relative change of theta~ between two rounds, for the optional stopping rule of §6 [R].

    The largest ``||b_new - b_old|| / ||b_old||`` over the views of ``current`` and the
    ``blocks`` b (default :data:`THETA_BLOCKS`: mu~ (d,), W~ (d, q), sigma2_mu~,
    sigma2_W~, alpha, beta); per block, so that no block's scale hides another's change.
    A view that ``previous`` lacks, or a block that moves away from 0, counts as an
    infinite change.
    """
    largest = 0.0
    for view, new in current.items():
        old = previous.get(view)
        if old is None:
            return float("inf")
        for name in blocks:
            a, b = np.asarray(getattr(old, name), dtype=float), np.asarray(getattr(new, name), dtype=float)
            step, size = float(np.linalg.norm(b - a)), float(np.linalg.norm(a))
            if step > 0.0:
                largest = max(largest, step / size if size > 0.0 else float("inf"))
    return largest
