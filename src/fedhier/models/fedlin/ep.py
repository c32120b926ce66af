"""Federated EP in natural parameters (spec §3.3–3.4, Algorithms 2 and 3).

The global approximation is :math:`q(\\phi)=p(\\phi)\\prod_kq_k(\\phi)`, i.e. :math:`r=r_0+\\sum_kr_k`,
:math:`Q=Q_0+\\sum_kQ_k`. A site computes its cavity, tilted moments and the **undamped** delta
:math:`(\\Delta r_k,\\Delta Q_k)=(\\hat r^{\\rm tilt}_k-r,\\ \\hat Q^{\\rm tilt}_k-Q)`; the server sums the
deltas, picks the damping :math:`\\delta` with the positive-definiteness back-off, and every site
later adds :math:`\\delta(\\Delta r_k,\\Delta Q_k)` to its own factor. Both sides therefore keep
:math:`Q=Q_0+\\sum_kQ_k` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .natural import cholesky_lower, is_pd, symmetrise, to_moments
from .stats import SiteStats
from .tilted import TiltedFailure, TiltedResult, tilted_moments

__all__ = ["SiteUpdate", "cavity", "site_update", "damped_update", "change", "converged", "WHOLE_STEP"]


def cavity(r: np.ndarray, Q: np.ndarray, r_k: np.ndarray, Q_k: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Cavity :math:`(r-r_k,\\ Q-Q_k)`, or None when :math:`Q-Q_k` is not positive definite (spec §3.4)."""
    Q_c = symmetrise(Q - Q_k)
    if cholesky_lower(Q_c) is None:  # Q_c is symmetric already
        return None
    return r - r_k, Q_c


@dataclass
class SiteUpdate:
    """Undamped EP delta of one site and the tilted result it came from (None if skipped)."""

    dr: np.ndarray
    dQ: np.ndarray
    tilted: TiltedResult | None
    reason: str = ""


def site_update(
    model,
    stats: SiteStats,
    r: np.ndarray,
    Q: np.ndarray,
    r_k: np.ndarray,
    Q_k: np.ndarray,
    rng: np.random.Generator,
    **tilted_options,
) -> SiteUpdate:
    """One site's step of Algorithm 3: cavity, tilted moments, undamped delta.

    Parameters
    ----------
    model : HM2 instance (see :mod:`.hierarchy`, :mod:`.lasso`)
    stats : SiteStats
    r, Q : ndarray, shapes (p,), (p, p)
        The broadcast global approximation.
    r_k, Q_k : ndarray, shapes (p,), (p, p)
        The site's current factor (kept on the site).
    rng : numpy.random.Generator
    **tilted_options
        Passed to :func:`~.tilted.tilted_moments`.

    Returns
    -------
    SiteUpdate
        Zero deltas (and ``tilted=None``) when the cavity is not positive definite or the
        tilted estimate failed; ``reason`` says which.
    """
    p = r.shape[0]
    zero = SiteUpdate(np.zeros(p), np.zeros((p, p)), None)
    cav = cavity(r, Q, r_k, Q_k)
    if cav is None:
        zero.reason = "cavity not positive definite"
        return zero
    try:
        tilted = tilted_moments(model, stats, cav[0], cav[1], rng, **tilted_options)
    except TiltedFailure as exc:
        zero.reason = f"tilted moments failed: {exc}"
        return zero
    return SiteUpdate(tilted.r - r, symmetrise(tilted.Q - Q), tilted)


#: largest change of q(phi) (posterior sds of the means, log marginal variances) of a step taken whole (see :func:`damped_update`)
WHOLE_STEP = 1.0


def change(mean_old: np.ndarray, var_old: np.ndarray, mean_new: np.ndarray, var_new: np.ndarray) -> float:
    """Change of a Gaussian :math:`q(\\phi)` between two rounds:
    :math:`\\max_j\\max(|m'_j-m_j|/\\sqrt{\\Sigma'_{jj}},\\ |\\log\\Sigma'_{jj}-\\log\\Sigma_{jj}|)`."""
    dm = np.max(np.abs(mean_new - mean_old) / np.sqrt(var_new))
    dv = np.max(np.abs(np.log(var_new) - np.log(var_old)))
    return float(max(dm, dv))


def damped_update(
    r: np.ndarray,
    Q: np.ndarray,
    dr_sum: np.ndarray,
    dQ_sum: np.ndarray,
    damping: float,
    *,
    whole_step: float | None = WHOLE_STEP,
    backoff: float = 0.8,
    min_damping: float = 1e-6,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Server step of spec §3.4: :math:`Q\\leftarrow Q+\\delta\\sum_k\\Delta Q_k`, :math:`r\\leftarrow r+\\delta\\sum_k\\Delta r_k`.

    :math:`\\delta` is ``damping``, except that a step whose whole (:math:`\\delta=1`) :func:`change` of
    :math:`q(\\phi)` is at most ``whole_step`` (None: never) is taken whole: damping guards parallel EP
    against overshooting with large steps, and near its fixed point, where the tilted laws are
    nearly Gaussian and the sites' deltas nearly exact, it only slows the approach (a damped
    round leaves a fraction :math:`1-\\delta` of the remaining distance).  A whole step that
    overshoots is large again the next round, and is damped.

    The step is accepted only if the new :math:`Q` is positive definite; otherwise
    :math:`\\delta\\leftarrow0.8\\,\\delta` and retry (ep-stan safeguard). Cavities are checked on the
    sites, which alone know their factors.

    Returns
    -------
    r_new, Q_new, delta

    Raises
    ------
    ValueError
        When :math:`\\delta` falls below ``min_damping``.
    """
    if not 0.0 < damping <= 1.0:
        raise ValueError(f"damping must be in (0, 1], got {damping}")
    delta = float(damping)
    if whole_step is not None and delta < 1.0:
        Q_whole = symmetrise(Q + dQ_sum)
        if is_pd(Q_whole):
            (m, S), (m_whole, S_whole) = to_moments(r, Q), to_moments(r + dr_sum, Q_whole)
            if change(m, np.diag(S), m_whole, np.diag(S_whole)) <= whole_step:
                return r + dr_sum, Q_whole, 1.0
    while True:
        Q_new = symmetrise(Q + delta * dQ_sum)
        if is_pd(Q_new):
            return r + delta * dr_sum, Q_new, delta
        delta *= backoff
        if delta < min_damping:
            raise ValueError(f"EP update: no damping above {min_damping} keeps the global precision positive definite")


def converged(means: list[np.ndarray], variances: list[np.ndarray], *, tol: float = 0.05) -> bool:
    """Stopping rule on the history of global means and marginal variances (the prior's first).

    A round's change is :math:`\\Delta_c=\\max_j\\max(|m_j^{(c)}-m_j^{(c-1)}|/\\sqrt{\\Sigma_{jj}^{(c)}},\\
    |\\log\\Sigma_{jj}^{(c)}-\\log\\Sigma_{jj}^{(c-1)}|)`.  EP's damped rounds approach their fixed point
    about geometrically, at the rate :math:`\\rho=\\Delta_c/\\Delta_{c-1}` of the last two rounds, so the
    change still to come is about :math:`\\Delta_c\\rho/(1-\\rho)`.  True when the last change and that
    estimate are both below ``tol`` (and :math:`\\rho<1`): the estimate is then within ``tol``
    posterior standard deviations of where more rounds would take it.
    """
    if len(means) < 3:
        return False
    c = len(means) - 1
    now = change(means[c - 1], variances[c - 1], means[c], variances[c])
    before = change(means[c - 2], variances[c - 2], means[c - 1], variances[c - 1])
    if not now < tol:
        return False
    if now == 0.0:
        return True
    rho = now / before if before > 0.0 else np.inf
    return bool(rho < 1.0 and now * rho / (1.0 - rho) < tol)
