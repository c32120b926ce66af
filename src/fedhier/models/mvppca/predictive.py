"""Using a fitted model: projection, reconstruction, imputation, likelihood, sampling (spec §9, §10).

``model`` is a point model, a mapping ``view -> ViewParams`` (use
``point_model(global_params)`` for the global (mu~, W~, s-bar) of §9, or a site's own
theta_c).  ``X`` is a mapping ``view -> (n, d_k)`` with any subset of the model's views;
entirely-NaN rows mark subjects without that view.  Each subject is conditioned on the
views it has, O_n:

    x | t^O ~ N(x-hat, M_O),  x-hat = M_O sum_{k in O} W_k^T (t_k - mu_k) / sigma2_k,
    M_O = (I + sum_{k in O} W_k^T W_k / sigma2_k)^{-1}.

Only q x q matrices are factorised, except in :func:`impute_covariance`, which returns
d x d covariances on purpose.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ._data import MultiViewData, check_views
from ._latent import LatentPosterior, check_model, marginal_loglik_rows, posterior
from .mstep import effective_columns
from .params import GlobalParams, ViewParams

__all__ = [
    "latent_posterior",
    "reconstruct",
    "impute",
    "impute_variance",
    "impute_covariance",
    "hierarchical_predictive_variance",
    "marginal_loglik",
    "sample",
    "sample_hierarchical",
    "draw_site_params",
    "model_change",
]


def _condition(model: Mapping[str, ViewParams], X: Mapping[str, np.ndarray]) -> tuple[MultiViewData, LatentPosterior]:
    check_model(model)
    data = check_views(X, what="X", dims={k: p.dim for k, p in model.items()})
    return data, posterior(data, model)


def _view(model: Mapping[str, ViewParams], view: str) -> ViewParams:
    if view not in model:
        raise ValueError(f"view {view!r} is not in the model (model views: {sorted(model)})")
    return model[view]


def latent_posterior(model: Mapping[str, ViewParams], X: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Latent projection of §9: posterior mean and covariance of x for each subject.

    Returns
    -------
    mean : ndarray of shape (n, q)
        x-hat (0 for a subject with no observed view).
    cov : ndarray of shape (n, q, q)
        M_{O_n} (I_q for a subject with no observed view).
    """
    data, post = _condition(model, X)
    return post.means, post.covariances[data.pattern_of]


def reconstruct(model: Mapping[str, ViewParams], X: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Reconstruction t-hat_k = W_k x-hat + mu_k of the views in X (§9; what the MAE uses).

    Rows where the subject lacks view k get the same formula, i.e. the conditional mean
    given the subject's other views (the imputation of §9).

    Returns
    -------
    dict view -> ndarray of shape (n, d_k), for the views of X.
    """
    data, post = _condition(model, X)
    return {k: post.means @ model[k].W.T + model[k].mu for k in data.views}


def impute(model: Mapping[str, ViewParams], X: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Predictive means mu_m + W_m x-hat for every view of the model (§9).

    For a view the subject lacks this is the conditional mean E[t_m | t^O] of §9.  For a
    view the subject has, it is the reconstruction (x-hat then also uses that view) --
    deliberately not the conditional mean given the *other* views, which would discard
    the measurement.  A subject with no view gets the marginal mean mu_m.

    Returns
    -------
    dict view -> ndarray of shape (n, d_m), for every view of the model.
    """
    _, post = _condition(model, X)
    return {k: post.means @ p.W.T + p.mu for k, p in model.items()}


def impute_variance(model: Mapping[str, ViewParams], X: Mapping[str, np.ndarray], view: str) -> np.ndarray:
    """Per-feature predictive variance of view m: diag(W_m M_O W_m^T) + sigma2_m (§9).

    For subjects without the view this is the diagonal of the conditional predictive
    covariance of §9; for subjects with it, the variance of a replicate measurement
    around the reconstruction (same formula, O including m).

    Returns
    -------
    ndarray of shape (n, d_m)
    """
    p = _view(model, view)
    data, post = _condition(model, X)
    per_pattern = np.einsum("dq,pqr,dr->pd", p.W, post.covariances, p.W) + p.sigma2
    return per_pattern[data.pattern_of]


def impute_covariance(model: Mapping[str, ViewParams], X: Mapping[str, np.ndarray], view: str) -> np.ndarray:
    """Full predictive covariance W_m M_O W_m^T + sigma2_m I of view m per subject (§9).

    This is the only function of the package that forms d_m x d_m matrices (n of them).

    Returns
    -------
    ndarray of shape (n, d_m, d_m)
    """
    p = _view(model, view)
    data, post = _condition(model, X)
    per_pattern = np.einsum("dq,pqr,er->pde", p.W, post.covariances, p.W) + p.sigma2 * np.eye(p.dim)
    return per_pattern[data.pattern_of]


def hierarchical_predictive_variance(global_params: GlobalParams, X: Mapping[str, np.ndarray], view: str) -> np.ndarray:
    """Per-feature predictive variance of view m for an unseen site (§9 [R], moment matched).

    diag(W~ M_O W~^T) + s-bar + sigma2_mu~ + sum_i sigma2_Wi~ ((M_O)_ii + x-hat_i^2), under the
    point model (mu~, W~, s-bar) of ``global_params``.

    Returns
    -------
    ndarray of shape (n, d_m)
    """
    model = {k: g.point() for k, g in global_params.items()}
    p = _view(model, view)
    data, post = _condition(model, X)
    g = global_params[view]
    per_pattern = np.einsum("dq,pqr,dr->pd", p.W, post.covariances, p.W) + p.sigma2
    columns = np.asarray(g.sigma2_W_columns, dtype=float)
    weighted_trace = np.einsum("pii,i->p", post.covariances, columns)[data.pattern_of]
    between = g.sigma2_mu + weighted_trace + post.means**2 @ columns
    return per_pattern[data.pattern_of] + between[:, None]


def marginal_loglik(model: Mapping[str, ViewParams], X: Mapping[str, np.ndarray]) -> np.ndarray:
    """ln p(t^{O_n} | model) per subject, x integrated out (§10; determinant lemma + Woodbury).

    Returns
    -------
    ndarray of shape (n,)
        0 for a subject with no observed view.
    """
    data, post = _condition(model, X)
    return marginal_loglik_rows(data, model, post)


def sample(model: Mapping[str, ViewParams], n: int, rng: np.random.Generator | int | None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Draw n subjects from the point model (§9 a): x ~ N(0, I), t_k = W_k x + mu_k + eps_k.

    Returns
    -------
    views : dict view -> ndarray of shape (n, d_k)
    latent : ndarray of shape (n, q)
    """
    q = check_model(model)
    if int(n) < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = np.random.default_rng(rng)
    latent = rng.standard_normal((int(n), q))
    views = {
        k: latent @ np.asarray(p.W).T + np.asarray(p.mu) + np.sqrt(p.sigma2) * rng.standard_normal((int(n), p.dim))
        for k, p in model.items()
    }
    return views, latent


def draw_site_params(global_params: GlobalParams, rng: np.random.Generator) -> dict[str, ViewParams]:
    """theta ~ P(theta | theta~) of §3, per view in sorted view order.

    mu ~ N(mu~, sigma2_mu~ I), w_i ~ N(w~_i, sigma2_Wi~ I) per column, sigma2 ~ IG(alpha, beta), drawn in
    that order for each view.  §3 is followed literally: the columns that §4.4 keeps at 0
    for d_k <= q receive their prior noise like the others.
    """
    out = {}
    for view in sorted(global_params):
        g = global_params[view]
        mu = np.asarray(g.mu, dtype=float)
        W = np.asarray(g.W, dtype=float)
        out[view] = ViewParams(
            mu=mu + np.sqrt(g.sigma2_mu) * rng.standard_normal(mu.shape),
            W=W + np.sqrt(np.asarray(g.sigma2_W_columns, dtype=float)) * rng.standard_normal(W.shape),
            sigma2=float(g.beta / rng.gamma(g.alpha)),
        )
    return out


def sample_hierarchical(
    global_params: GlobalParams, n: int, rng: np.random.Generator | int | None
) -> tuple[dict[str, np.ndarray], dict[str, ViewParams]]:
    """Draw a synthetic site (§9 b): theta ~ P(theta | theta~), then n subjects from it.

    Returns
    -------
    views : dict view -> ndarray of shape (n, d_k)
    site_params : dict view -> ViewParams
        The drawn local parameters.
    """
    rng = np.random.default_rng(rng)
    site_params = draw_site_params(global_params, rng)
    views, _ = sample(site_params, n, rng)
    return views, site_params


def _stacked(model: GlobalParams, views: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m, W, D) of a subject at a new site, all views stacked: t ~ N(m, W W^T + diag(D)) with
    D = s-bar_k + sigma2_mu~k + sum_{i < q_k} sigma2_Wi~k on the coordinates of view k (q_k effective columns)."""
    m = np.concatenate([np.asarray(model[v].mu, dtype=float) for v in views])
    W = np.vstack([np.asarray(model[v].W, dtype=float) for v in views])
    D = np.concatenate([
        np.full(np.shape(model[v].W)[0],
                model[v].noise_var + model[v].sigma2_mu
                + np.sum(np.asarray(model[v].sigma2_W_columns, dtype=float)[: effective_columns(*np.shape(model[v].W))]))
        for v in views
    ])
    return m, W, D


def _kl(m0, W0, D0, m1, W1, D1) -> float:
    """KL(N(m0, C0) || N(m1, C1)), C = W W^T + diag(D), by the Woodbury identity (q x q systems only):

    C1^{-1} A = A / D1 - (W1 / D1) M1^{-1} W1^T (A / D1),  M1 = I + W1^T (W1 / D1),  ln det C = sum ln D + ln det M.
    """
    V1 = W1 / D1[:, None]
    M1 = np.eye(W1.shape[1]) + W1.T @ V1
    inv = np.linalg.inv(M1)
    cross = V1.T @ W0  # W1^T D1^{-1} W0
    trace = (
        np.sum(D0 / D1) - np.sum(inv * (V1.T @ (V1 * D0[:, None])))  # tr(C1^{-1} diag(D0))
        + np.sum(W0 * (W0 / D1[:, None])) - np.sum(inv * (cross @ cross.T))  # tr(C1^{-1} W0 W0^T)
    )
    delta = m1 - m0
    u = V1.T @ delta
    quad = delta @ (delta / D1) - u @ inv @ u
    return 0.5 * float(trace - m0.size + quad + _logdet(W1, D1) - _logdet(W0, D0))


def _logdet(W: np.ndarray, D: np.ndarray) -> float:
    """ln det(W W^T + diag(D)) = sum ln D + ln det(I + W^T D^{-1} W)."""
    return float(np.sum(np.log(D)) + np.linalg.slogdet(np.eye(W.shape[1]) + W.T @ (W / D[:, None]))[1])


def model_change(previous: GlobalParams, current: GlobalParams) -> float:
    """How much the predictive distribution of a subject changed between two global models.

    The distribution is that of a subject at a new site, every view stacked (spec §9 [R]):
    t ~ N(mu~, W~ W~^T + diag(D)), D = s-bar_k + sigma2_mu~k + sum_{i < q_k} sigma2_Wi~k on the
    coordinates of view k (the site's own mu_c and W_c integrated out).  The change is the
    square root of the symmetrised Kullback-Leibler divergence,

        sqrt(KL(N_0 || N_1) + KL(N_1 || N_0)),

    which is the shift of the mean in standard deviations for a move of the mean alone, and
    about |r| / sqrt(2) for a relative change r of the variance along one direction.  It
    measures every change by what it does to the predictions: a turn of the latent space
    (W~ -> W~ R) gives 0, and a between-site variance that creeps toward 0 (or an
    inverse-gamma shape toward its cap) counts by its share of the predictive variance.
    Only q x q systems are solved.

    Parameters
    ----------
    previous, current : GlobalParams
        The same views and shapes.

    Returns
    -------
    float
        inf when ``current`` has a view that ``previous`` lacks.
    """
    views = list(current)
    if any(v not in previous for v in views):
        return float("inf")
    old, new = _stacked(previous, views), _stacked(current, views)
    return float(np.sqrt(max(_kl(*old, *new) + _kl(*new, *old), 0.0)))
