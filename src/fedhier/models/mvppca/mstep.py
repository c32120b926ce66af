"""The MAP M-step updates of one view (spec fed-mv-ppca §4.3, §4.4).

Each function is one update of §4.3 written on the sufficient quantities of the view,
so that a local iteration costs O(N d q + N q^2 + d q^2 + q^3) and never forms a
d x d matrix.  The two steps that solve a q x q system take its factor L^{-1} (:func:`._linalg.spd_factors`)
when the caller has factorised the systems of all views at once:

* :func:`mean_step` -- step (1), eq. 11 in its Woodbury shrinkage form (its q x q system: :func:`mean_system`);
* :func:`loading_step` -- step (3), W with ridge lambda_k = sigma2 / sigma2_W (its system: :func:`loading_system`);
* :func:`scatter_first_form` / :func:`scatter_second_form` -- the two equal forms of
  S_k in eq. 21;
* :func:`sigma2_step` -- step (4), eq. 21 with the [RC] safeguards;
* :func:`residual_dof` -- the residual's degrees of freedom, N d_k less those the mean and the
  loadings took [R], for step (4) instead of N d_k;
* :func:`effective_columns` -- q_k of §4.4.
"""

from __future__ import annotations

import numpy as np

from ._linalg import factor_solve, spd_factors

__all__ = [
    "effective_columns",
    "mean_system",
    "mean_step",
    "loading_system",
    "loading_step",
    "scatter_first_form",
    "scatter_second_form",
    "sigma2_step",
    "residual_dof",
    "weak_ig_prior",
    "WEAK_IG_RETRIES",
]

#: how many times the round-1 weak prior variance v0 is halved before giving up (§4.3 [RC])
WEAK_IG_RETRIES = 60


def effective_columns(dim: int, n_components: int) -> int:
    """q_k = min(q, d_k - 1) if d_k <= q, else q (§4.4): columns q_k..q-1 of W are kept at 0."""
    return n_components if dim > n_components else max(dim - 1, 0)


def mean_system(n_obs: int, W: np.ndarray, sigma2: float, prior_var: float) -> np.ndarray:
    """a I_q + W^T W with a = N v + sigma2: the q x q system of :func:`mean_step`, shape (q, q)."""
    small = W.T @ W
    small.flat[:: W.shape[1] + 1] += n_obs * prior_var + sigma2
    return small


def mean_step(
    sample_mean: np.ndarray,
    n_obs: int,
    W: np.ndarray,
    sigma2: float,
    prior_mean: np.ndarray | None = None,
    prior_var: float | None = None,
    inverse_factor: np.ndarray | None = None,
) -> np.ndarray:
    """Step (1) of §4.3: MAP update of mu_k under N(mu~, v I) (eq. 11), Woodbury form.

    mu = mu~ + N v (N v I + C)^{-1} (t-bar - mu~),  C = W W^T + sigma2 I, and with
    a = N v + sigma2,  (a I + W W^T)^{-1} u = (u - W (a I_q + W^T W)^{-1} W^T u) / a.
    Without a prior (``prior_mean`` None) the update is the sample mean t-bar.

    Parameters
    ----------
    sample_mean : ndarray of shape (d,)
        t-bar over the N subjects that have the view.
    n_obs : int
        N = N_c^(k).
    W : ndarray of shape (d, q)
    sigma2 : float
    prior_mean : ndarray of shape (d,), optional
    prior_var : float, optional
        v = sigma2_mu~ (> 0).
    inverse_factor : ndarray of shape (q, q), optional
        L^{-1} of :func:`mean_system` = L L^T, when the caller has factorised it; else factorised here.

    Returns
    -------
    ndarray of shape (d,)
    """
    if prior_mean is None:
        return sample_mean.copy()
    if inverse_factor is None:
        inverse_factor = spd_factors(mean_system(n_obs, W, sigma2, prior_var))[1]
    shrink = n_obs * prior_var
    a = shrink + sigma2
    u = sample_mean - prior_mean
    inner = factor_solve(inverse_factor, W.T @ u)
    return prior_mean + (shrink / a) * (u - W @ inner)


def loading_system(second_moment: np.ndarray, ridge: float | np.ndarray) -> np.ndarray:
    """sum <x x^T> + Lambda, the q x q system of :func:`loading_step`, shape (q, q)."""
    system = second_moment.copy()
    system.flat[:: second_moment.shape[0] + 1] += ridge
    return system


def loading_step(
    cross: np.ndarray,
    second_moment: np.ndarray,
    ridge: float | np.ndarray,
    prior_W: np.ndarray | None,
    n_effective: int,
    inverse_factor: np.ndarray | None = None,
) -> np.ndarray:
    """Step (3) of §4.3: W = [sum (t - mu) <x>^T + W~ Lambda] [sum <x x^T> + Lambda]^{-1}.

    Lambda = diag(lambda_i), lambda_i = sigma2 / sigma2_Wi for the prior w_ci ~ N(w~_i, sigma2_Wi I)
    on each column (lambda I with one variance for all columns).

    Parameters
    ----------
    cross : ndarray of shape (d, q)
        sum_n (t_n - mu) <x_n>^T over the subjects that have the view.
    second_moment : ndarray of shape (q, q)
        sum_n <x_n x_n^T> over the same subjects.
    ridge : float or ndarray of shape (q,)
        lambda_i = sigma2[s] / sigma2_Wi~ (0 without prior).
    prior_W : ndarray of shape (d, q) or None
        W~ (None without prior).
    n_effective : int
        q_k of §4.4; columns q_k..q-1 are set to 0.
    inverse_factor : ndarray of shape (q, q), optional
        L^{-1} of :func:`loading_system` = L L^T, when the caller has factorised it; else factorised here.

    Returns
    -------
    ndarray of shape (d, q)
    """
    rhs = cross if prior_W is None else cross + prior_W * ridge
    if inverse_factor is None:
        inverse_factor = spd_factors(loading_system(second_moment, ridge))[1]
    W = factor_solve(inverse_factor, rhs.T).T
    if n_effective < W.shape[1]:
        W[:, n_effective:] = 0.0
    return W


def residual_dof(n_obs: int, dim: int, second_moment: np.ndarray, ridge: float | np.ndarray, n_effective: int) -> float:
    """Degrees of freedom of the view's residual: N d_k - d_k (1 + df_W), at least d_k [R].

    Eq. 21 divides the residual sum of squares by N d_k, as if mu and W were known.  Each of the
    d_k rows of the view fits its mean and its loadings to the N subjects: the mean takes one
    degree of freedom, the loadings df_W = tr[(S_xx + Lambda)^{-1} S_xx], the trace of the ridge
    regression's hat matrix (q_k without a prior, fewer the more the prior pins the loadings to
    W~).  Dividing by N d_k underestimates sigma2 by about the factor (N - 1 - df_W) / N, which
    matters where a site has few subjects: a smaller sigma2 weakens the prior's pull
    (Lambda = sigma2 / sigma2_W) and inflates the sites' spread, and with it the between-site
    variance.

    Parameters
    ----------
    n_obs, dim : int
        N (subjects with the view) and d_k.
    second_moment : ndarray of shape (q, q)
        S_xx = sum_n <x_n x_n^T> over those subjects.
    ridge : float or ndarray of shape (q,)
        lambda_i of :func:`loading_step` (0 without prior).
    n_effective : int
        q_k of §4.4.
    """
    k = int(n_effective)
    sxx = np.asarray(second_moment, dtype=float)[:k, :k]
    lam = np.broadcast_to(np.asarray(ridge, dtype=float), (np.shape(second_moment)[0],))[:k]
    df_W = float(np.trace(np.linalg.solve(sxx + np.diag(lam), sxx))) if k else 0.0
    return max(float(n_obs) - 1.0 - df_W, 1.0) * int(dim)


def scatter_first_form(
    scatter: float,
    n_obs: int,
    sample_mean: np.ndarray,
    mu: np.ndarray,
    W: np.ndarray,
    cross: np.ndarray,
    second_moment: np.ndarray,
) -> float:
    """S_k of eq. 21, first form, from per-view sums (no pass over the data).

    S_k = sum_n [ ||t_n - mu||^2 - 2 <x_n>^T W^T (t_n - mu) + tr(W^T W <x_n x_n^T>) ]
        = scatter + N ||t-bar - mu||^2 - 2 <W, cross>_F + <W^T W, second_moment>_F,

    with scatter = sum_n ||t_n - t-bar||^2.  Loses relative accuracy when S_k is tiny
    compared with the scatter (cancellation); :func:`scatter_second_form` does not.
    """
    shift = sample_mean - mu
    return float(scatter + n_obs * (shift @ shift) - 2.0 * np.vdot(W, cross) + np.vdot(W.T @ W, second_moment))


def scatter_second_form(
    values: np.ndarray,
    mu: np.ndarray,
    W: np.ndarray,
    means: np.ndarray,
    sum_covariance: np.ndarray,
) -> float:
    """S_k of eq. 21, second form: sum_n ||t_n - mu - W <x_n>||^2 + tr(W (sum_n M_n) W^T) >= 0.

    Parameters
    ----------
    values : ndarray of shape (N, d)
        Rows of the subjects that have the view.
    means : ndarray of shape (N, q)
        Their posterior means <x_n>.
    sum_covariance : ndarray of shape (q, q)
        sum_n M_{O_n} over the same subjects.
    """
    resid = values - mu - means @ W.T
    return float(np.einsum("ij,ij->", resid, resid) + np.vdot(W.T @ W, sum_covariance))


def weak_ig_prior(v0: float = 1.0) -> tuple[float, float]:
    """[RC] round-1 weak prior on sigma2: IG(alpha0, beta0), alpha0 = 1/(4 v0) + 2, beta0 = (alpha0 - 1)/2.

    ``v0 = 1`` gives IG(2.25, 0.625): mean 0.5, variance v0 = 1 (§4.3).
    """
    alpha0 = 1.0 / (4.0 * v0) + 2.0
    return alpha0, (alpha0 - 1.0) / 2.0


def sigma2_step(
    scatter: float,
    n_dof: int,
    *,
    old: float,
    view: str,
    alpha: float | None = None,
    beta: float | None = None,
    weak: bool = False,
) -> tuple[float, list[str]]:
    """Step (4) of §4.3: sigma2 = (S_k + 2 beta) / (N d_k + 2 (alpha + 1)) (eq. 21).

    * ``alpha``, ``beta`` given: MAP under IG(alpha, beta) (rounds >= 2).
    * ``weak``: [RC] round-1 weak prior IG(alpha0, beta0), alpha0 = 1/(4 v0) + 2,
      beta0 = (alpha0 - 1)/2, v0 = 1 (i.e. IG(2.25, 0.625)); v0 is halved while the
      result is not positive.  With S_k >= 0 (second form) the first try succeeds.
    * neither: plain EM, S_k / (N d_k).

    In every case a non-positive or non-finite result is rejected and ``old`` kept [RC].

    Returns
    -------
    sigma2 : float
    notes : list of str
        Human-readable safeguard notes (empty if none triggered).
    """
    notes: list[str] = []
    if alpha is not None:
        new = (scatter + 2.0 * beta) / (n_dof + 2.0 * (alpha + 1.0))
    elif weak:
        v0 = 1.0
        for _ in range(WEAK_IG_RETRIES):
            alpha0, beta0 = weak_ig_prior(v0)
            new = (scatter + 2.0 * beta0) / (n_dof + 2.0 * (alpha0 + 1.0))
            if new > 0:
                break
            v0 /= 2.0
        if v0 != 1.0:
            notes.append(f"view {view!r}: weak IG prior variance halved to v0={v0:.3g} to keep sigma2 positive")
    else:
        new = scatter / n_dof
    if not (np.isfinite(new) and new > 0):
        notes.append(f"view {view!r}: non-positive sigma2 {new:.4g} rejected, kept {old:.4g}")
        return old, notes
    return float(new), notes
