"""WAIC of a fitted hierarchical model, computed federatedly (spec §10).

    lppd   = sum_i ln( (1/S) sum_s p(t_i | theta^(s)) ),
    p_WAIC = sum_i Var_s[ ln p(t_i | theta^(s)) ]    (divisor S - 1: p_WAIC2),
    WAIC   = -2 (lppd - p_WAIC),

with theta^(s) ~ P(theta | theta~) drawn i.i.d. per view (§3) from a fixed seed -- the
same draws at every site -- and p(t_i | theta) the marginal likelihood of subject i's
observed views, x integrated out.  Each site returns the two sums and its number of
points; the master adds them up.  Draws are streamed: memory is O(n), not O(n S).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ._data import check_views
from ._latent import marginal_loglik_rows
from .params import GlobalParams
from .predictive import draw_site_params

__all__ = ["waic_site_terms", "waic"]


def waic_site_terms(
    global_params: GlobalParams,
    X: Mapping[str, np.ndarray],
    *,
    n_draws: int = 1000,
    seed: int,
) -> tuple[float, float, int]:
    """One site's contribution to WAIC (§10).

    Parameters
    ----------
    global_params : GlobalParams
        theta~; must contain every view of X.
    X : mapping view -> ndarray of shape (n, d_k)
        The site's training data (entirely-NaN rows: view missing for that subject).
    n_draws : int
        S >= 2 draws theta^(s) ~ P(theta | theta~).
    seed : int
        Seed of the draws; use the same at every site.

    Returns
    -------
    lppd_sum : float
        sum_i lppd_i over subjects with at least one observed view.
    p_waic_sum : float
        sum_i Var_s ln p(t_i | theta^(s)) (ddof 1).
    n_points : int
        Number of such subjects.
    """
    S = int(n_draws)
    if S < 2:
        raise ValueError(f"n_draws must be >= 2 (the variance needs two draws), got {n_draws}")
    data = check_views(X, what="X", dims={k: g.dim for k, g in global_params.items()})
    rng = np.random.default_rng(seed)
    top = np.full(data.n, -np.inf)
    scaled_sum = np.zeros(data.n)
    mean = np.zeros(data.n)
    m2 = np.zeros(data.n)
    for s in range(S):
        ll = marginal_loglik_rows(data, draw_site_params(global_params, rng))
        new_top = np.maximum(top, ll)
        scaled_sum = scaled_sum * np.exp(top - new_top) + np.exp(ll - new_top)
        top = new_top
        delta = ll - mean
        mean += delta / (s + 1)
        m2 += delta * (ll - mean)
    has_view = data.patterns[data.pattern_of].any(axis=1)
    lppd = top + np.log(scaled_sum) - np.log(S)
    p_waic = m2 / (S - 1)
    return float(lppd[has_view].sum()), float(p_waic[has_view].sum()), int(has_view.sum())


def waic(
    global_params: GlobalParams,
    sites: Sequence[Mapping[str, np.ndarray]],
    *,
    n_draws: int = 1000,
    seed: int = 0,
) -> float:
    """WAIC = -2 (lppd - p_WAIC) summed over the sites' training subjects (§10); lower is better."""
    lppd = p_waic = 0.0
    for X in sites:
        site_lppd, site_p, _ = waic_site_terms(global_params, X, n_draws=n_draws, seed=seed)
        lppd += site_lppd
        p_waic += site_p
    return -2.0 * (lppd - p_waic)
