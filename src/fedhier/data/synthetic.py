"""Synthetic multi-view PPCA data (spec fed-mv-ppca §2.1, §3, §12.1 [RC], §14 row 26).

* :func:`make_multiview_ppca` -- the "SD" data set: one model t^(k) = W^(k) (x + a_g) + mu^(k) + eps^(k)
  with a latent shift a added to a random subsample (the group label).
* :func:`make_federated_ppca` -- sites whose parameters are drawn from the hierarchical prior of §3
  around random global parameters; the ground truth for testing federated fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from fedhier.models.mvppca.params import GlobalView, ViewParams

__all__ = ["SyntheticData", "FederatedSynthetic", "make_multiview_ppca", "make_federated_ppca"]

# [RC] demo generator: entries of W^(k) and mu^(k) ~ U(-r_k, r_k), noise variances sigma2_k,
# both cycling over the views for more than three views.
_RC_HALF_WIDTHS = (10.0, 5.0, 15.0)
_RC_SIGMA2 = (2.0, 1.0, 3.0)
_RC_SHIFT_HALF_WIDTH = 10.0


@dataclass(frozen=True)
class SyntheticData:
    """Output of :func:`make_multiview_ppca`.

    Attributes
    ----------
    views : dict ``"view1", "view2", ... -> ndarray (n, d_k)``
    labels : int ndarray (n,)
        1 for the shifted subsample, 0 otherwise.
    latent : ndarray (n, q)
        x before the shift (the shift of row i is ``labels[i] * shift``).
    shift : ndarray (q,)
        The group shift a.
    params : dict ``view -> ViewParams``
        True (mu, W, sigma2) of every view.
    """

    views: dict[str, np.ndarray]
    labels: np.ndarray
    latent: np.ndarray
    shift: np.ndarray
    params: dict[str, ViewParams]


@dataclass(frozen=True)
class FederatedSynthetic:
    """Output of :func:`make_federated_ppca`.

    Attributes
    ----------
    sites : list of dict ``view -> ndarray (n_c, d_k)``
    global_params : dict ``view -> GlobalView``
        The true prior: mu~, W~, sigma2_mu = sd_mu^2, sigma2_W = sd_W^2, alpha, beta; ``noise_var`` is
        the IG mean beta / (alpha - 1) (inf if alpha <= 1), ``var_sigma`` the IG variance (inf if alpha <= 2).
    site_params : list of dict ``view -> ViewParams``
        The parameters theta_c drawn for each site (only its observed views).
    latent : list of ndarray (n_c, q)
    """

    sites: list[dict[str, np.ndarray]]
    global_params: dict[str, GlobalView]
    site_params: list[dict[str, ViewParams]]
    latent: list[np.ndarray]


def make_multiview_ppca(
    n_samples: int = 400,
    dims: Sequence[int] = (15, 8, 10),
    n_components: int = 5,
    n_shifted: int = 250,
    *,
    random_state: Any,
) -> SyntheticData:
    """Draw the SD data set of spec §12.1 with the [RC] generator.

    For view k (cycling over three settings for more views): W^(k) and mu^(k) entries ~
    U(-r_k, r_k) with r = (10, 5, 15), sigma2_k = (2, 1, 3).  x_n ~ N(0, I_q); a random subsample of
    ``n_shifted`` subjects gets the shift a ~ U(-10, 10)^q added *before* the mapping:
    t^(k)_n = W^(k) (x_n + a 1[n shifted]) + mu^(k) + eps, eps ~ N(0, sigma2_k I).

    Parameters
    ----------
    n_samples : int
    dims : sequence of int, one dimension per view
    n_components : int, q
    n_shifted : int, 0 <= n_shifted <= n_samples
    random_state : None, int or numpy Generator

    Returns
    -------
    SyntheticData
    """
    _check_counts(n_samples=n_samples, n_components=n_components)
    dims = _check_dims(dims)
    if not 0 <= n_shifted <= n_samples:
        raise ValueError(f"n_shifted={n_shifted} must lie in [0, n_samples={n_samples}]")
    rng = np.random.default_rng(random_state)
    params = {}
    for k, d in enumerate(dims):
        r = _RC_HALF_WIDTHS[k % 3]
        W = rng.uniform(-r, r, size=(d, n_components))
        mu = rng.uniform(-r, r, size=d)
        params[f"view{k + 1}"] = ViewParams(mu=mu, W=W, sigma2=_RC_SIGMA2[k % 3])
    latent = rng.standard_normal((n_samples, n_components))
    shift = rng.uniform(-_RC_SHIFT_HALF_WIDTH, _RC_SHIFT_HALF_WIDTH, size=n_components)
    labels = np.zeros(n_samples, dtype=int)
    labels[rng.choice(n_samples, size=n_shifted, replace=False)] = 1
    shifted = latent + labels[:, None] * shift
    views = {view: _emit(shifted, p, rng) for view, p in params.items()}
    return SyntheticData(views=views, labels=labels, latent=latent, shift=shift, params=params)


def make_federated_ppca(
    n_sites: int,
    n_per_site: int | Sequence[int],
    dims: Sequence[int],
    n_components: int,
    *,
    sd_mu: float | Sequence[float],
    sd_W: float | Sequence[float],
    sigma2_alpha: float | Sequence[float],
    sigma2_beta: float | Sequence[float],
    site_views: Sequence[Sequence[str]] | None = None,
    global_sd: tuple[float, float] | None = None,
    random_state: Any,
) -> FederatedSynthetic:
    """Sites drawn from the hierarchical model of spec §3 around random global parameters.

    Global parameters: entries of mu~^(k) and W~^(k) ~ U(-r_k, r_k) with the [RC] widths
    r = (10, 5, 15) cycling over views.  Site c, view k (spec §3):
    mu_c ~ N(mu~, sd_mu^2 I), vec W_c ~ N(vec W~, sd_W^2 I), sigma2_c ~ IG(alpha, beta); then
    n_c subjects from §2.1 with x ~ N(0, I_q).

    Parameters
    ----------
    n_sites : int
    n_per_site : int or sequence of int (one per site)
    dims : sequence of int, d_k per view (views named ``"view1"``, ``"view2"``, ...)
    n_components : int, q
    sd_mu, sd_W : float or sequence (one per view)
        Standard deviations of the prior; the variances sigma2_mu, sigma2_W are their squares.
    sigma2_alpha, sigma2_beta : float or sequence (one per view)
        Inverse-gamma shape and scale (scipy ``invgamma(a=alpha, scale=beta)``).
    site_views : optional sequence (one per site) of the view names the site observes;
        default all views everywhere.
    global_sd : (float, float), optional
        Draw the entries of mu~ and W~ from N(0, global_sd[0]^2) and N(0, global_sd[1]^2)
        instead of the [RC] uniform widths.
    random_state : None, int or numpy Generator

    Returns
    -------
    FederatedSynthetic
    """
    _check_counts(n_sites=n_sites, n_components=n_components)
    dims = _check_dims(dims)
    names = [f"view{k + 1}" for k in range(len(dims))]
    n_per_site = _per("n_per_site", n_per_site, n_sites)
    for c, n in enumerate(n_per_site):
        if n != int(n) or n < 1:
            raise ValueError(f"n_per_site: site {c} has {n!r} subjects; expected a positive integer")
    prior = {
        key: _per(key, value, len(dims))
        for key, value in dict(sd_mu=sd_mu, sd_W=sd_W, sigma2_alpha=sigma2_alpha, sigma2_beta=sigma2_beta).items()
    }
    for key, values in prior.items():
        strict = key.startswith("sigma2")
        if any(not np.isfinite(v) or v < 0 or (strict and v == 0) for v in values):
            raise ValueError(f"{key} must be finite and {'positive' if strict else 'non-negative'}, got {values}")
    if site_views is None:
        site_views = [names] * n_sites
    if len(site_views) != n_sites:
        raise ValueError(f"site_views has {len(site_views)} entries for {n_sites} sites")
    for c, observed in enumerate(site_views):
        unknown = [v for v in observed if v not in names]
        if unknown or not observed:
            raise ValueError(f"site_views: site {c} lists {list(observed)}; expected a non-empty subset of {names}")

    if global_sd is not None and (len(global_sd) != 2 or not all(np.isfinite(v) and v > 0 for v in global_sd)):
        raise ValueError(f"global_sd must be two positive numbers, got {global_sd!r}")
    rng = np.random.default_rng(random_state)
    global_params = {}
    for k, (view, d) in enumerate(zip(names, dims)):
        r = _RC_HALF_WIDTHS[k % 3]
        alpha, beta = prior["sigma2_alpha"][k], prior["sigma2_beta"][k]
        if global_sd is None:
            mu, W = rng.uniform(-r, r, size=d), rng.uniform(-r, r, size=(d, n_components))
        else:
            mu, W = global_sd[0] * rng.standard_normal(d), global_sd[1] * rng.standard_normal((d, n_components))
        global_params[view] = GlobalView(
            mu=mu,
            W=W,
            sigma2_mu=prior["sd_mu"][k] ** 2,
            sigma2_W=prior["sd_W"][k] ** 2,
            alpha=alpha,
            beta=beta,
            noise_var=beta / (alpha - 1) if alpha > 1 else np.inf,
            var_sigma=beta**2 / ((alpha - 1) ** 2 * (alpha - 2)) if alpha > 2 else np.inf,
        )
    sites, site_params, latent = [], [], []
    for c in range(n_sites):
        theta = {}
        for view in names:
            if view not in site_views[c]:
                continue
            g = global_params[view]
            theta[view] = ViewParams(
                mu=g.mu + np.sqrt(g.sigma2_mu) * rng.standard_normal(g.mu.shape),
                W=g.W + np.sqrt(g.sigma2_W) * rng.standard_normal(g.W.shape),
                sigma2=float(g.beta / rng.gamma(g.alpha)),
            )
        x = rng.standard_normal((int(n_per_site[c]), n_components))
        sites.append({view: _emit(x, p, rng) for view, p in theta.items()})
        site_params.append(theta)
        latent.append(x)
    return FederatedSynthetic(sites=sites, global_params=global_params, site_params=site_params, latent=latent)


def _emit(x: np.ndarray, p: ViewParams, rng: np.random.Generator) -> np.ndarray:
    """t = W x + mu + eps, eps ~ N(0, sigma2 I) (spec §2.1), row-wise for x of shape (n, q)."""
    return x @ p.W.T + p.mu + np.sqrt(p.sigma2) * rng.standard_normal((x.shape[0], p.mu.size))


def _check_counts(**counts: Any) -> None:
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_dims(dims: Sequence[int]) -> tuple[int, ...]:
    dims = tuple(dims)
    if not dims or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in dims):
        raise ValueError(f"dims must be a non-empty sequence of positive integers, got {dims!r}")
    return tuple(int(d) for d in dims)


def _per(name: str, value: Any, count: int) -> list[float]:
    """A scalar repeated ``count`` times, or a sequence of exactly ``count`` values."""
    if np.ndim(value) == 0:
        return [float(value)] * count
    values = [float(v) for v in value]
    if len(values) != count:
        raise ValueError(f"{name} has {len(values)} values; expected 1 or {count}")
    return values
