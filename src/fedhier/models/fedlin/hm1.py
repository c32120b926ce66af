"""HM1: matrix-normal prior across sites, federated MAP (spec §2, Algorithm 1).

Notation: ``theta`` is :math:`\\Theta\\in\\mathbb R^{d\\times K}` (one column per site), ``omega``
is :math:`\\Omega\\in\\mathbb R^{K\\times K}`. Designs are row-major, ``X`` of shape ``(n_k, d)``,
so the spec's :math:`X_k` is ``X.T``.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg

__all__ = ["shrinkage_message", "local_steps", "check_step_size", "prior_shrinkage", "update_omega", "hm1_objective"]


def shrinkage_message(theta: np.ndarray, omega: np.ndarray, *, jitter: bool = False) -> np.ndarray:
    """Spec §2.3 step 2: :math:`S=\\Theta\\,\\Omega^{-1}` (column :math:`k` is :math:`s_k`), via Cholesky.

    Parameters
    ----------
    theta : ndarray, shape (d, K)
    omega : ndarray, shape (K, K)
    jitter : bool
        Add :math:`\\epsilon I`, :math:`\\epsilon=10^{-8}\\mathrm{tr}(\\Omega)/K` (spec §9 #6; off by default).

    Raises
    ------
    ValueError
        If :math:`\\Omega` is not positive definite.
    """
    K = omega.shape[0]
    if theta.shape[1] != K:
        raise ValueError(f"theta has {theta.shape[1]} columns but omega is {K}x{K}")
    if jitter:
        omega = omega + 1e-8 * np.trace(omega) / K * np.eye(K)
    try:
        factor = linalg.cho_factor(omega)
    except linalg.LinAlgError as exc:
        raise ValueError("Omega is not positive definite (consider jitter=True or a smaller alpha)") from exc
    return linalg.cho_solve(factor, theta.T).T


def local_steps(
    X: np.ndarray,
    y: np.ndarray,
    theta: np.ndarray,
    *,
    eta: float,
    n_steps: int,
    batch_size: int | None = None,
    gradient: str = "sum",
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Spec §2.3 step 3: :math:`u^{(t+1)}=u^{(t)}+2\\eta X_{k,B_t}(Y_{k,B_t}-X_{k,B_t}^\\top u^{(t)})`.

    Parameters
    ----------
    X : ndarray, shape (n, d)
    y : ndarray, shape (n,)
    theta : ndarray, shape (d,)
        Starting point :math:`u^{(0)}`.
    eta : float
        Step size :math:`\\eta` (the paper's :math:`\\eta_2`).
    n_steps : int
        :math:`T`.
    batch_size : int, optional
        Mini-batch size (drawn uniformly without replacement each step); None = full batch (GD).
    gradient : {"sum", "mean"}
        Paper mode sums over the batch; "mean" divides by the batch size (spec §2.4 option (i)).
    rng : numpy.random.Generator
        Needed when ``batch_size`` is smaller than ``n``.

    Returns
    -------
    ndarray, shape (d,)
    """
    if gradient not in ("sum", "mean"):
        raise ValueError(f"gradient must be 'sum' or 'mean', got {gradient!r}")
    n = X.shape[0]
    u = np.array(theta, dtype=float, copy=True)
    full = batch_size is None or batch_size >= n
    if full:
        xx, xy = X.T @ X, X.T @ y
        scale = 1.0 / n if gradient == "mean" else 1.0
        for _ in range(n_steps):
            u = u + 2.0 * eta * scale * (xy - xx @ u)
        return u
    if rng is None:
        raise ValueError("mini-batch steps need a random generator")
    scale = 1.0 / batch_size if gradient == "mean" else 1.0
    # batch t: the first batch_size entries of a uniform random permutation (without replacement)
    batches = np.argsort(rng.random((n_steps, n)), axis=1)[:, :batch_size]
    for idx in batches:
        Xb = X[idx]
        u = u + 2.0 * eta * scale * (Xb.T @ (y[idx] - Xb @ u))
    return u


def check_step_size(X: np.ndarray, *, eta: float, batch_size: int | None = None, gradient: str = "sum",
                    site: int = 0) -> None:
    """Refuse a full-batch step size for which :func:`local_steps` diverges.

    Full batch, ``u - u*`` is multiplied by :math:`I-2\\eta c X^\\top X` at every step (``c = 1``, or
    ``1/n`` with ``gradient="mean"``), which grows along the top eigenvector exactly when
    :math:`\\eta c\\lambda_{\\max}(X^\\top X)\\ge 1`.  Mini-batches are not checked (their largest
    batch eigenvalue varies).  Called by the protocols' ``validate_site_data``, before any round.

    Raises
    ------
    ValueError
        Naming the site and the largest step size that converges.
    """
    n = X.shape[0]
    if batch_size is not None and batch_size < n:
        return
    scale = 1.0 / n if gradient == "mean" else 1.0
    largest = float(np.linalg.eigvalsh(X.T @ X)[-1]) * scale
    if eta * largest >= 1.0:
        raise ValueError(
            f"site {site}: eta={eta:g} makes the full-batch local steps diverge; with gradient={gradient!r} "
            f"this site needs eta < {1.0 / largest:.3g} (1 / the largest eigenvalue of "
            f"{'X^T X / n' if gradient == 'mean' else 'X^T X'}); lower eta or standardise the features"
        )


def prior_shrinkage(u: np.ndarray, s: np.ndarray, *, eta: float, shrink_scale: float = 1.0) -> np.ndarray:
    """Spec §2.3 step 4: :math:`\\theta_k^{(c+1)}=u^{(T)}-2\\eta\\,\\text{shrink\\_scale}\\,s_k` (shapes (d,)).

    ``shrink_scale = T`` is the option of spec §2.4 (ii) that restores the prior's weight in :math:`L`.
    """
    return u - 2.0 * eta * shrink_scale * s


def update_omega(omega: np.ndarray, theta: np.ndarray, *, alpha: float = 0.1, rule: str = "paper") -> np.ndarray:
    """Spec §2.2/§2.5: the damped :math:`\\Omega` update.

    ``rule="paper"``: :math:`\\Omega\\leftarrow(1-\\alpha)\\Omega+\\frac{\\alpha}{d}\\Theta^\\top\\Theta`.
    ``rule="rcode"``: the reference code's C-MAPSS variant
    :math:`\\Omega\\leftarrow\\alpha\\,\\Omega+\\frac{\\alpha}{d-1}\\Theta^\\top\\Theta` (0.8 and 0.8/4 for
    :math:`d=5`, ``alpha=0.8``), not a convex combination.

    Parameters
    ----------
    omega : ndarray, shape (K, K)
    theta : ndarray, shape (d, K)
    """
    d = theta.shape[0]
    gram = theta.T @ theta
    if rule == "paper":
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        new = (1.0 - alpha) * omega + (alpha / d) * gram
    elif rule == "rcode":
        if d < 2:
            raise ValueError("rule='rcode' divides by d - 1 and needs d >= 2")
        new = alpha * omega + (alpha / (d - 1)) * gram
    else:
        raise ValueError(f"rule must be 'paper' or 'rcode', got {rule!r}")
    return 0.5 * (new + new.T)


def hm1_objective(sites, theta: np.ndarray, omega: np.ndarray, noise_var=1.0) -> float:
    """Spec §2.1: :math:`L(\\Theta,\\Omega)=\\sum_k\\sigma_k^{-2}\\lVert Y_k-X_k^\\top\\theta_k\\rVert^2+\\mathrm{tr}(\\Theta\\Omega^{-1}\\Theta^\\top)+d\\log|\\Omega|`.

    ``sites`` is a list of ``(X (n_k, d), y (n_k,))``; ``noise_var`` a scalar or one per site.
    """
    K = theta.shape[1]
    s2 = np.broadcast_to(np.asarray(noise_var, dtype=float), (K,))
    fit = sum(np.sum((y - X @ theta[:, k]) ** 2) / s2[k] for k, (X, y) in enumerate(sites))
    S = shrinkage_message(theta, omega)
    sign, logdet = np.linalg.slogdet(omega)
    return float(fit + np.sum(S * theta) + theta.shape[0] * logdet)
