"""Maximum-likelihood fit of an inverse gamma, the "ML1" block of the master (spec §5.2).

For x_1..x_m ~ IG(alpha, beta) (shape alpha, scale beta, as ``scipy.stats.invgamma``),

    beta = m alpha / sum_c 1/x_c,        psi(alpha) = ln alpha - s,
    s = ln( (1/m) sum_c 1/x_c ) + (1/m) sum_c ln x_c  >= 0,

so the estimator needs only the sums m, sum 1/x, sum ln x (plus sum x, sum x^2 for the
[RC] moment start) -- secure summation can deliver them.

Solvers:

* ``"newton"`` [R]: Newton on f(alpha) = ln alpha - psi(alpha) - s from the Minka /
  Choi–Wette start, relative tolerance 1e-10, alpha capped at 1e8 (s = 0, e.g. m = 1 or
  identical values, gives the cap) and floored at 2 + 1e-5.
* ``"fixed_point"`` [RC]: ``fixed_point_steps`` (10 in [RC]) steps of
  alpha <- psi^{-1}(ln alpha - s) from the moment start alpha_0 = xbar^2 / v + 2 (v the
  sample variance, from sum x and sum x^2; a zero v is replaced by 1e-20), then the
  floor alpha >= 2 + 1e-5.  Converges slowly when alpha is large (rate ~ 1 - 1/(2 alpha)).

This is the coordinator's global step; a site's step imports the module (through the
package) but never calls it, so ``scipy.special`` is imported by the functions that use it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["invgamma_mle", "invgamma_mle_from_statistics", "inverse_digamma", "ALPHA_FLOOR", "ALPHA_CAP"]

#: alpha >= 2 + 1e-5 keeps the IG variance v_sigma finite ([RC])
ALPHA_FLOOR = 2.0 + 1e-5
#: alpha <= 1e8 when s is (numerically) 0 (§5.2 [R])
ALPHA_CAP = 1e8
_NEWTON_RTOL = 1e-10
_NEWTON_MAX_STEPS = 100
_SERIES_FROM = 20.0


def _trigamma(a: float) -> float:
    """psi'(a) = zeta(2, a), the Hurwitz zeta function (a > 0): the value of ``_trigamma(a)``
    without that wrapper's per-call cost, which made up half of a master step."""
    from scipy.special import zeta

    return zeta(2.0, a)


def _log_minus_digamma(a: float) -> float:
    """ln a - psi(a), by its asymptotic series for large a (no cancellation)."""
    if a < _SERIES_FROM:
        from scipy.special import digamma

        return float(np.log(a) - digamma(a))
    r = 1.0 / (a * a)
    return float(1.0 / (2.0 * a) + r * (1.0 / 12.0 - r * (1.0 / 120.0 - r / 252.0)))


def _inv_a_minus_trigamma(a: float) -> float:
    """1/a - psi'(a), by its asymptotic series for large a."""
    if a < _SERIES_FROM:
        return float(1.0 / a - _trigamma(a))
    r = 1.0 / (a * a)
    return float(-r * (0.5 + (1.0 / a) * (1.0 / 6.0 - r * (1.0 / 30.0 - r / 42.0))))


def inverse_digamma(y: float, *, tol: float = 1e-8, max_steps: int = 100) -> float:
    """psi^{-1}(y) by Newton as in [RC] (§5.2): start e^y + 1/2 if y >= -2.22 else -1/(y - psi(1))."""
    from scipy.special import digamma

    x = np.exp(y) + 0.5 if y >= -2.22 else -1.0 / (y - digamma(1.0))
    for _ in range(max_steps):
        step = (digamma(x) - y) / _trigamma(x)
        x -= step
        if abs(step) < tol:
            break
    return float(x)


def _newton_alpha(s: float) -> float:
    if s <= 0.0:
        return ALPHA_CAP
    alpha = (3.0 - s + np.sqrt((s - 3.0) ** 2 + 24.0 * s)) / (12.0 * s)
    for _ in range(_NEWTON_MAX_STEPS):
        if alpha >= ALPHA_CAP:
            return ALPHA_CAP
        new = alpha - (_log_minus_digamma(alpha) - s) / _inv_a_minus_trigamma(alpha)
        if new <= 0.0:
            new = 0.5 * alpha
        if abs(new - alpha) <= _NEWTON_RTOL * alpha:
            return float(min(new, ALPHA_CAP))
        alpha = new
    return float(min(alpha, ALPHA_CAP))


def _fixed_point_alpha(m: int, s: float, sum_x: float, sum_sq_x: float, steps: int) -> float:
    mean = sum_x / m
    # [RC] moment start; for m = 1 the un-normalised spread, i.e. 0
    var = (sum_sq_x - m * mean * mean) / (m - 1) if m > 1 else 0.0
    if var <= 0.0:
        var = 1e-20
    alpha = mean * mean / var + 2.0
    for _ in range(steps):
        alpha = inverse_digamma(np.log(alpha) - s)
    return alpha


def fit_invgamma_statistics(
    m: float, sum_inv: float, sum_log: float, sum_x: float, sum_sq_x: float, solver: str = "newton",
    *, fixed_point_steps: int = 10,
) -> tuple[float, float, list[str]]:
    """As :func:`invgamma_mle_from_statistics`, also returning notes on the floor/cap."""
    m = int(round(float(m)))
    if m < 1:
        raise ValueError(f"inverse-gamma fit needs at least one value, got m = {m}")
    if not (np.isfinite(sum_inv) and sum_inv > 0 and np.isfinite(sum_log)):
        raise ValueError(f"inverse-gamma fit needs positive finite values (sum 1/x = {sum_inv}, sum ln x = {sum_log})")
    s = float(np.log(sum_inv / m) + sum_log / m)
    notes: list[str] = []
    if solver == "newton":
        alpha = _newton_alpha(s)
        if alpha >= ALPHA_CAP:
            notes.append(f"alpha capped at {ALPHA_CAP:g} (s = {s:.3g}: the values are (nearly) equal)")
    elif solver == "fixed_point":
        alpha = _fixed_point_alpha(m, max(s, 0.0), float(sum_x), float(sum_sq_x), int(fixed_point_steps))
    else:
        raise ValueError(f"ig_solver must be 'newton' or 'fixed_point', got {solver!r}")
    if alpha < ALPHA_FLOOR:
        notes.append(f"alpha {alpha:.4g} floored at {ALPHA_FLOOR}")
        alpha = ALPHA_FLOOR
    beta = m * alpha / sum_inv
    return float(alpha), float(beta), notes


def invgamma_mle_from_statistics(
    m: float, sum_inv: float, sum_log: float, sum_x: float, sum_sq_x: float, solver: str = "newton",
    *, fixed_point_steps: int = 10,
) -> tuple[float, float]:
    """IG(alpha, beta) maximum likelihood from sums over the m values (§5.2).

    Parameters
    ----------
    m : number of values (C_k).
    sum_inv, sum_log, sum_x, sum_sq_x : float
        sum 1/x_c, sum ln x_c, sum x_c, sum x_c^2 (the last two only feed the
        fixed-point moment start).
    solver : {"newton", "fixed_point"}
    fixed_point_steps : int
        Steps of the [RC] fixed point (10 reproduces [RC]).

    Returns
    -------
    alpha, beta : float
    """
    alpha, beta, _ = fit_invgamma_statistics(m, sum_inv, sum_log, sum_x, sum_sq_x, solver, fixed_point_steps=fixed_point_steps)
    return alpha, beta


def invgamma_mle(x, solver: str = "newton", *, fixed_point_steps: int = 10) -> tuple[float, float]:
    """IG(alpha, beta) maximum likelihood of positive values x of shape (m,) (§5.2).

    Equals ``scipy.stats.invgamma.fit(x, floc=0)`` (up to that optimiser's tolerance)
    with the Newton solver, when the MLE lies in (2, 1e8].

    Raises
    ------
    ValueError
        If x is empty, not 1-D, or has a non-positive or non-finite value.
    """
    x = np.asarray(x, dtype=float)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError("invgamma_mle needs a non-empty 1-D array of positive finite values")
    return invgamma_mle_from_statistics(
        x.size, float(np.sum(1.0 / x)), float(np.sum(np.log(x))), float(x.sum()), float(x @ x), solver,
        fixed_point_steps=fixed_point_steps,
    )
