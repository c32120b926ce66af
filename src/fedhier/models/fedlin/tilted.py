"""Tilted moments of one EP site and the device posterior (spec §3.4 "Tilted moments", §4.1).

The tilted distribution of site :math:`k` is

.. math:: q_{\\backslash k}(\\phi,u)\\ \\propto\\ \\mathcal N(\\phi;m_{-k},\\Sigma_{-k})\\,p(u)\\,f_k(\\phi\\mid u),

with :math:`u` the site-local coordinates (e.g. :math:`\\log\\sigma_k`), integrated out by keeping
only the :math:`\\phi` part of the moments. Estimators, chosen by ``method``:

``"exact"``
    Conjugate case (:math:`f_k` Gaussian in :math:`\\phi`): tilted natural parameters are the cavity's
    plus :meth:`conjugate_factor`; exact.
``"quadrature"``
    Tensor Gauss–Hermite rule centred at the Laplace approximation (mode and inverse Hessian) of
    the tilted log density; used when ``p + n_local <= 3`` (``"auto"``). Exact up to quadrature
    error (the ESS of the Gauss–Hermite weights is reported, not tested: it is small by design).
``"importance"``
    Self-normalised importance sampling from the Laplace approximation :math:`\\mathcal N(\\hat z,H^{-1})`
    with antithetic pairs of randomised quasi-Monte Carlo points (a randomly shifted Sobol'
    sequence, :func:`normal_offsets`; independent draws with ``sampler="random"``), and the
    Laplace moments as control variate (the same draws, unweighted,
    estimate the known Laplace mean and covariance; their error is subtracted). When the tilted law
    is nearly Gaussian -- the usual case once the cavity is informative -- the Monte-Carlo error, and
    with it the upward bias of an inverted noisy covariance that parallel EP would add up over all
    sites each round, nearly vanishes. The effective sample size (ESS) is the diagnostic; the site
    fails the round when it falls below ``min_ess``. With ``n_pilot`` the sampler first tries that
    many draws and keeps them when their ESS is at least :data:`NEAR_GAUSSIAN` of their count (the
    weights nearly equal: the tilted law is nearly the Laplace Gaussian, and the control variate
    leaves little error); otherwise it draws ``n_draws`` afresh.
``"mcmc"``
    The Bayesian lasso (no closed form): the Gibbs/Metropolis sampler of :mod:`.lasso`, with
    split-:math:`\\hat R` as diagnostic and the unbiased precision :math:`(n-p-2)M^{-1}`.

Every result carries weighted points (or draws) that also give the device posterior of eq. (8):
:math:`\\theta_k` is drawn from the same tilted distribution (cavity, not :math:`q`).
"""

from __future__ import annotations

import functools
import itertools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy import special
from scipy.linalg import lapack

from .lasso import sample_lasso_tilted
from .natural import cholesky_lower, inv_pd, moments_from_draws, row_dot, symmetrise, to_moments, unbiased_precision
from .stats import SiteStats

__all__ = ["TiltedFailure", "TiltedResult", "tilted_moments", "DevicePosterior", "device_posterior", "normal_offsets", "reweight", "METHODS", "SAMPLERS", "NEAR_GAUSSIAN"]

#: the ways of computing the tilted moments (``method`` of :func:`tilted_moments`)
METHODS = ("auto", "exact", "quadrature", "importance", "mcmc")

#: how the importance sampler's standard normal offsets are drawn (``sampler`` of :func:`tilted_moments`)
SAMPLERS = ("qmc", "random")

#: smallest ESS / draws of the importance sampler's pilot draws that are kept as the estimate (``n_pilot``)
NEAR_GAUSSIAN = 0.9


class TiltedFailure(ValueError):
    """The tilted moments of a site could not be estimated reliably this round."""


@dataclass
class TiltedResult:
    """Tilted moments of :math:`\\phi` and the points that represent the tilted distribution.

    Attributes
    ----------
    mean : ndarray, shape (p,)
    cov : ndarray, shape (p, p)
    r, Q : ndarray, shapes (p,), (p, p)
        Tilted natural parameters used in the EP update.
    phi : ndarray, shape (n, p)
        Points or draws of :math:`\\phi`.
    local : ndarray, shape (n, n_local)
    weights : ndarray, shape (n,)
        Normalised weights (equal for MCMC draws).
    theta : ndarray, shape (n, d) or None
        MCMC draws of :math:`\\theta_k` (lasso only).
    method : str
    diagnostics : dict
        ``ess`` (importance/quadrature), ``rhat`` and ``acceptance`` (MCMC).
    gaussian : bool
        The tilted distribution is exactly Gaussian (conjugate case).
    """

    mean: np.ndarray
    cov: np.ndarray
    r: np.ndarray
    Q: np.ndarray
    phi: np.ndarray
    local: np.ndarray
    weights: np.ndarray
    theta: np.ndarray | None
    method: str
    diagnostics: dict = field(default_factory=dict)
    gaussian: bool = False


def _log_tilted(model, stats, cavity_mean, cavity_prec, z):
    """Log tilted density (up to a constant) at the points ``z (n, p + n_local)``; -inf where it is not finite.

    Call under ``np.errstate(over="ignore", invalid="ignore", divide="ignore")`` (as
    :func:`tilted_moments` does): far points overflow to a non-finite value, reported as -inf.
    """
    p = model.p
    phi, u = z[:, :p], z[:, p:]
    diff = phi - cavity_mean
    out = -0.5 * row_dot(diff @ cavity_prec, diff)
    if model.n_local:
        out += model.local_log_prior(u)
    try:
        ll = model.log_lik(stats, phi, u)
    except np.linalg.LinAlgError:
        ll = np.full(z.shape[0], -np.inf)
    return np.where(np.isfinite(ll), out + ll, -np.inf)


#: Newton decrement g^T (-H)^{-1} g below which the Laplace search takes its last step (see :func:`_laplace`)
_FINAL_DECREMENT = 1e-2

#: the same for a search that resumes from the site's previous one (its derivatives there known)
_RESUMED_DECREMENT = 0.5


@functools.lru_cache(maxsize=16)
def _stencil(D: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Central-difference stencil of :func:`_derivatives` in D dimensions.

    Returns the first and second unit offsets of every point, ``A, B`` (shape (1 + 2D + 4P, D),
    P = D(D+1)/2 pairs i <= j; point = (x + A h) + B h, as x + E_i + E_j), and the pairs ``I, J``.
    """
    I, J = np.triu_indices(D)
    eye = np.eye(D)
    first = np.repeat(eye[I], 4, axis=0) * np.tile([1.0, 1.0, -1.0, -1.0], I.size)[:, None]
    second = np.repeat(eye[J], 4, axis=0) * np.tile([1.0, -1.0, 1.0, -1.0], I.size)[:, None]
    A = np.concatenate([np.zeros((1, D)), eye, -eye, first])
    B = np.concatenate([np.zeros((1 + 2 * D, D)), second])
    for array in (A, B, I, J):
        array.flags.writeable = False  # shared by every call (cached)
    return A, B, I, J


def _derivatives(logf, x: np.ndarray, h: np.ndarray):
    """Value, gradient and Hessian of ``logf`` at ``x`` by central differences, in one vectorised call.

    The 1 + 2D + 4 D(D+1)/2 points are x, x +- h_i e_i and x +- h_i e_i +- h_j e_j (i <= j).
    """
    D = x.size
    A, B, I, J = _stencil(D)
    vals = logf((x + A * h) + B * h)
    f0 = vals[0]
    quads = vals[1 + 2 * D :].reshape(-1, 4)
    H = np.empty((D, D))
    # -inf - -inf is nan: a non-finite derivative, which the caller reports (it runs under np.errstate)
    grad = (vals[1 : 1 + D] - vals[1 + D : 1 + 2 * D]) / (2 * h)
    second = (quads[:, 0] - quads[:, 1] - quads[:, 2] + quads[:, 3]) / (4 * h[I] * h[J])
    H[I, J] = second
    H[J, I] = second
    return f0, grad, H


@functools.lru_cache(maxsize=16)
def _identity(D: int) -> np.ndarray:
    """The D x D identity, read-only (shared by every call)."""
    eye = np.eye(D)
    eye.flags.writeable = False
    return eye


def _laplace(logf, x0: np.ndarray, known=None, max_iter: int = 100):
    """Mode and inverse negative Hessian of a vectorised log density (damped Newton, finite differences).

    ``known``: the value, gradient and Hessian of ``logf`` at ``x0`` when they are known (then
    not evaluated again).  Returns ``(mode, cov, (x_e, f_e, g_e, H_e))``, the last tuple the
    last point where the derivatives were evaluated, and their values there.

    The full Newton step is tried with the derivatives at the new point, in one call of
    ``logf``: when it is accepted (the usual case) they serve the next iteration.  The search
    ends with a step of Newton decrement g^T (-H)^{-1} g below :data:`_FINAL_DECREMENT` (1e-2,
    a step shorter than 0.1 in the metric of -H), taken without evaluating the derivatives
    again: the Hessian used is the one before that step.  The result is the proposal of the
    importance sampler and the quadrature centre; both estimators are consistent for any such
    Gaussian (the sampler's control variate uses the proposal's own moments), so this accuracy
    sets only their variance, not their value: on the radon fit's tilted problems the errors
    of ``benchmarks/tilted_accuracy.py`` are the same with ``--final-decrement 1e-6``.  A search
    that resumes from the site's previous one (``known`` given: an EP round after the site's
    first, whose tilted law has moved little and is nearly Gaussian) ends below
    :data:`_RESUMED_DECREMENT` (0.5, a step shorter than 0.7), so that it usually takes one
    step from the derivatives it starts with and evaluates none; the errors there are the same
    as with 1e-2 (``--final-decrement 0.5`` applies 0.5 everywhere: only the round-1 failures
    become more frequent, which is why a first search keeps 1e-2).

    Raises
    ------
    TiltedFailure
        If no finite mode with a positive-definite negative Hessian is found.
    """
    x = np.array(x0, dtype=float)
    D = x.size
    eye = _identity(D)
    final_decrement = _FINAL_DECREMENT if known is None else _RESUMED_DECREMENT
    f0, g, H = known if known is not None else _derivatives(logf, x, 1e-3 * np.maximum(1.0, np.abs(x)))
    x_e = x
    for _ in range(max_iter):
        if not (np.isfinite(f0) and np.isfinite(g).all() and np.isfinite(H).all()):
            raise TiltedFailure("tilted log density is not finite near the current point")
        A = -H  # symmetric by construction
        lam = 0.0
        while (factor := cholesky_lower(A + lam * eye if lam else A)) is None:  # Levenberg shift until positive definite
            lam = max(2 * lam, 1e-6 * max(1.0, float(np.abs(np.diag(A)).max())))
        step, _ = lapack.dpotrs(factor, g, lower=1)
        slope = g @ step
        if abs(slope) < final_decrement and lam == 0.0:
            # the step is shorter than 0.1 in the metric of -H: after it, x is within ~1e-2 of the
            # mode in that metric (Newton converges quadratically); keep the Hessian of this point,
            # whose inverse comes from the factor at hand
            return x + step, symmetrise(lapack.dpotrs(factor, eye, lower=1)[0]), (x_e, f0, g, H)
        # full step, with the derivatives there
        x_new = x + step
        h_new = 1e-3 * np.maximum(1.0, np.abs(x_new))
        derivs = _derivatives(logf, x_new, h_new)
        f_new = derivs[0]
        if not (np.isfinite(f_new) and f_new >= f0 + 1e-4 * slope):
            t = 0.5
            while t > 1e-8:
                x_new = x + t * step
                f_new = logf(x_new[None])[0]
                if np.isfinite(f_new) and f_new >= f0 + 1e-4 * t * slope:
                    break
                t *= 0.5
            else:
                break  # no ascent along the step: x is the mode to working precision
            h_new = 1e-3 * np.maximum(1.0, np.abs(x_new))
            derivs = _derivatives(logf, x_new, h_new)
        x = x_e = x_new
        f0, g, H = derivs
    try:
        cov = inv_pd(-H, "negative Hessian at the mode")
    except ValueError as exc:
        raise TiltedFailure(str(exc)) from exc
    return x, cov, (x_e, f0, g, H)


#: bits of the Sobol' points (scipy's default resolution)
_SOBOL_BITS = 30


@functools.lru_cache(maxsize=16)
def _sobol_integers(n: int, D: int) -> np.ndarray:
    """The first ``n`` unscrambled Sobol' points in ``D`` dimensions as integers ``(n, D)`` (units of 2^-30)."""
    from scipy.stats import qmc  # only the importance sampler needs it

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's note that a count other than a power of two loses balance
        points = qmc.Sobol(D, scramble=False, bits=_SOBOL_BITS).random(n)
    out = np.rint(points * 2.0**_SOBOL_BITS).astype(np.int64)
    out.flags.writeable = False  # shared by every call (cached)
    return out


def normal_offsets(rng: np.random.Generator, n: int, D: int, sampler: str = "qmc") -> np.ndarray:
    """``n`` standard normal points in ``D`` dimensions, shape (n, D), each marginally :math:`\\mathcal N(0,I)`.

    ``"random"``: independent draws.  ``"qmc"``: randomised quasi-Monte Carlo, the first ``n``
    Sobol' points :math:`x_i` (integers in units of :math:`2^{-30}`) with a random digital shift
    :math:`s` (one 30-bit integer per dimension, XORed into every point) and a common random
    remainder :math:`\\rho\\in(0,1)` below the last bit, :math:`u_i=(x_i\\oplus s+\\rho)\\,2^{-30}`,
    mapped through the normal quantile :math:`\\Phi^{-1}`.  Each :math:`u_i` is uniform on the
    unit cube (every estimate is unbiased, as with independent draws) while the set keeps the
    Sobol' net's even spread (powers of two ``n`` are best).  The shift comes from ``rng``, the
    site's own generator.
    """
    if sampler == "random":
        return rng.standard_normal((n, D))
    if sampler != "qmc":
        raise ValueError(f"unknown sampler {sampler!r}; one of {SAMPLERS}")
    r = rng.random(2 * D)  # (Generator.random costs a tenth of Generator.integers)
    shift = (r[:D] * 2.0**_SOBOL_BITS).astype(np.int64)  # uniform on 0 .. 2^30 - 1
    rest = (np.floor(r[D:] * 2.0**20) + 0.5) * 2.0**-20  # strictly inside (0, 1): no point at 0 or 1
    u = np.bitwise_xor(_sobol_integers(n, D), shift) + rest
    u *= 2.0**-_SOBOL_BITS
    return special.ndtri(u)


def _cavity_part(x: np.ndarray, cavity_mean: np.ndarray, cavity_Q: np.ndarray, p: int):
    """Value, gradient and Hessian at ``x (D,)`` of the cavity's term -(phi - m)^T Q (phi - m) / 2 of the log tilted density."""
    D = x.size
    diff = x[:p] - cavity_mean
    grad, hess = np.zeros(D), np.zeros((D, D))
    grad[:p] = -(cavity_Q @ diff)
    hess[:p, :p] = -cavity_Q
    return -0.5 * float(diff @ cavity_Q @ diff), grad, hess


def tilted_moments(
    model,
    stats: SiteStats,
    cavity_r: np.ndarray,
    cavity_Q: np.ndarray,
    rng: np.random.Generator,
    *,
    method: str = "auto",
    n_nodes: int = 12,
    n_draws: int = 1024,
    n_pilot: int | None = None,
    sampler: str = "qmc",
    min_ess: float = 100.0,
    mcmc: dict | None = None,
    init: dict | None = None,
    start: np.ndarray | None = None,
    offsets: np.ndarray | None = None,
) -> TiltedResult:
    """Moments of the tilted distribution of one site (module docstring).

    Parameters
    ----------
    model : GaussianHierarchy, BayesianRidge or BayesianLasso
    stats : SiteStats
    cavity_r, cavity_Q : ndarray, shapes (p,), (p, p)
        Cavity natural parameters (``cavity_Q`` positive definite).
    rng : numpy.random.Generator
    method : {"auto", "exact", "quadrature", "importance", "mcmc"}
    n_nodes : int
        Gauss–Hermite nodes per dimension (quadrature).
    n_draws : int
        Importance-sampling draws (``n_draws // 2`` antithetic pairs).
    n_pilot : int, optional
        Importance sampling: draws tried first, kept when their ESS is at least :data:`NEAR_GAUSSIAN`
        of their count (module docstring); None: ``n_draws`` at once.
    sampler : {"qmc", "random"}
        How the importance draws' normal offsets are drawn (:func:`normal_offsets`).
    min_ess : float
        Fewest effective draws/nodes accepted.
    mcmc : dict, optional
        Keyword arguments of :func:`~.lasso.sample_lasso_tilted` (chains, warm-up, draws).
    init : dict, optional
        ``{"phi": (chains, p), "theta": (chains, d)}`` starting points for MCMC.
    start : ndarray of shape (p + n_local,) or mapping, optional
        Where the Laplace mode search starts (quadrature, importance); default the cavity mean
        and ``model.local_start``.  A mapping is the ``diagnostics["laplace"]`` of the site's
        previous call (what EP rounds pass): ``point``, and the ``value``, ``grad`` and ``hess``
        there of the site's part of the log tilted density (without the cavity's term, which
        is added analytically), so that the search needs no evaluation at its start.  The
        search runs to the same tolerance from any start.
    offsets : ndarray of shape (h, p + n_local), optional
        Importance sampling: standard normal offsets to use again (the ``diagnostics["offsets"]`` of the
        site's previous call) when a sample of ``2 h`` draws is taken, instead of drawing new ones: the
        EP rounds then differ only through the proposal, and the quantile transform of new offsets is
        saved.  Each estimate is unbiased as with new offsets; the rounds' Monte-Carlo errors are
        correlated instead of independent.

    Raises
    ------
    TiltedFailure
        When the estimate is unreliable (ESS too small, scatter matrix singular).
    """
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; one of {SAMPLERS}")
    cavity_mean, cavity_cov = to_moments(cavity_r, cavity_Q)
    if method == "auto":
        if not model.closed_form:
            method = "mcmc"
        elif model.is_conjugate:
            method = "exact"
        else:
            method = "quadrature" if model.p + model.n_local <= 3 else "importance"
    if method == "exact":
        if not model.is_conjugate:
            raise ValueError("method='exact' needs a conjugate model (fixed tau, known noise)")
        r_f, Q_f = model.conjugate_factor(stats)
        Q = symmetrise(cavity_Q + Q_f)
        r = cavity_r + r_f
        mean, cov = to_moments(r, Q)
        # sigma points reproduce the first two moments of anything linear in phi exactly
        L = np.linalg.cholesky(cov)
        p = mean.size
        offsets = np.sqrt(p) * np.concatenate([L.T, -L.T])
        pts = mean + offsets
        return TiltedResult(mean, cov, r, Q, pts, np.zeros((2 * p, 0)), np.full(2 * p, 0.5 / p), None, "exact", {}, True)
    if method == "mcmc":
        if model.closed_form:
            raise ValueError("method='mcmc' is implemented for the Bayesian lasso only")
        init = init or {}
        draws = sample_lasso_tilted(
            stats, cavity_mean, cavity_cov, rng, init_phi=init.get("phi"), init_theta=init.get("theta"), **(mcmc or {})
        )
        phi = draws.phi.reshape(-1, model.p)
        try:
            r, Q = unbiased_precision(phi)
        except ValueError as exc:
            raise TiltedFailure(str(exc)) from exc
        mean, cov = moments_from_draws(phi)
        n = phi.shape[0]
        return TiltedResult(
            mean, cov, r, Q, phi, np.zeros((n, 0)), np.full(n, 1.0 / n), draws.theta.reshape(n, -1), "mcmc",
            {"rhat": draws.rhat, "acceptance": draws.acceptance, "last_phi": draws.phi[:, -1], "last_theta": draws.theta[:, -1]},
        )
    if method not in ("quadrature", "importance"):
        raise ValueError(f"unknown tilted-moment method {method!r}; one of {METHODS}")

    def logf(z):
        return _log_tilted(model, stats, cavity_mean, cavity_Q, z)

    known = site_part = None
    point = start.get("point") if isinstance(start, Mapping) else start
    if point is not None and np.shape(point) == (model.p + model.n_local,) and np.isfinite(point).all():
        x0 = np.asarray(point, dtype=float)
        if isinstance(start, Mapping) and all(k in start for k in ("value", "grad", "hess")):
            # the site's part is the same as in the previous round; only the cavity's term changed
            site_part = (float(start["value"]), np.asarray(start["grad"], float), np.asarray(start["hess"], float))
            known = tuple(a + b for a, b in zip(site_part, _cavity_part(x0, cavity_mean, cavity_Q, model.p)))
    else:
        phi_start = model.phi_start(stats, cavity_mean) if hasattr(model, "phi_start") else cavity_mean
        x0 = np.concatenate([phi_start, model.local_start(stats)])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # non-finite values are -inf (_log_tilted)
        mode, lap_cov, (x_e, f_e, g_e, H_e) = _laplace(logf, x0, known)
        if site_part is None or not np.array_equal(x_e, x0):  # derivatives evaluated at a new point: take the cavity's term off
            c, gc, Hc = _cavity_part(x_e, cavity_mean, cavity_Q, model.p)
            site_part = (f_e - c, g_e - gc, H_e - Hc)
        laplace = {"mode": mode, "point": x_e, "value": site_part[0], "grad": site_part[1], "hess": site_part[2]}
        if method == "quadrature":
            return _quadrature(model, logf, mode, lap_cov, n_nodes, laplace)
        result = None
        if n_pilot is not None and n_pilot < n_draws:
            try:
                pilot = _importance(model, logf, mode, lap_cov, rng, n_pilot, 0.0, laplace, sampler, offsets)
            except TiltedFailure:
                pilot = None
            if pilot is not None and pilot.diagnostics["ess"] >= max(NEAR_GAUSSIAN * pilot.weights.size, min_ess):
                result = pilot
        if result is None:
            result = _importance(model, logf, mode, lap_cov, rng, n_draws, min_ess, laplace, sampler, offsets)
        # the draws' log weights without the cavity's term, for reuse under another cavity (reweight)
        diff = result.phi - cavity_mean
        result.diagnostics["log_ratio"] = result.diagnostics.pop("log_weights") + 0.5 * row_dot(diff @ cavity_Q, diff)
        return result


def reweight(model, points: np.ndarray, log_ratio: np.ndarray, cavity_r: np.ndarray, cavity_Q: np.ndarray,
             min_ess: float) -> TiltedResult:
    """The tilted distribution under a new cavity from importance draws made under an earlier one.

    The draws :math:`z_i=(\\phi_i,u_i)` came from a proposal :math:`g`; ``log_ratio`` holds
    :math:`\\log p(u_i)+\\log f_k(\\phi_i\\mid u_i)-\\log g(z_i)` (the ``diagnostics["log_ratio"]`` of
    :func:`tilted_moments`), which does not involve the cavity.  Under the cavity
    :math:`\\mathcal N(m,Q^{-1})` the self-normalised weights are

    .. math:: w_i\\ \\propto\\ \\exp\\big(\\text{log\\_ratio}_i-\\tfrac12(\\phi_i-m)^\\top Q(\\phi_i-m)\\big),

    the same estimator as fresh draws from :math:`g` would give, without evaluating the site's
    likelihood again.

    Parameters
    ----------
    points : ndarray, shape (n, p + n_local)
    log_ratio : ndarray, shape (n,)
    cavity_r, cavity_Q : ndarray, shapes (p,), (p, p)
    min_ess : float
        Fewest effective draws accepted.

    Raises
    ------
    TiltedFailure
        When the effective sample size under the new cavity is below ``min_ess``.
    """
    cavity_mean, _ = to_moments(cavity_r, cavity_Q)
    phi = np.ascontiguousarray(points[:, : model.p])
    diff = phi - cavity_mean
    weights, ess = _normalised(log_ratio - 0.5 * row_dot(diff @ cavity_Q, diff))
    if ess < min_ess:
        raise TiltedFailure(f"effective sample size {ess:.1f} is below {min_ess}")
    mean, cov = moments_from_draws(phi, weights)
    return _result(model, mean, cov, phi, points, weights, "importance", {"ess": ess})


def _quadrature(model, logf, mode, lap_cov, n_nodes: int, laplace: dict) -> TiltedResult:
    """Tensor Gauss–Hermite rule of ``n_nodes`` per dimension at the Laplace approximation."""
    D = mode.size
    L = np.linalg.cholesky(lap_cov)
    x, w = special.roots_hermite(n_nodes)
    grid = np.array(list(itertools.product(range(n_nodes), repeat=D)))
    xs = x[grid]
    z = mode + np.sqrt(2.0) * xs @ L.T
    weights, ess = _normalised(np.log(w[grid]).sum(1) + row_dot(xs, xs) + logf(z))
    phi = np.ascontiguousarray(z[:, : model.p])
    mean, cov = moments_from_draws(phi, weights)
    return _result(model, mean, cov, phi, z, weights, "quadrature", {"ess": ess, "mode": mode, "laplace": laplace})


def _importance(model, logf, mode, lap_cov, rng: np.random.Generator, n_draws: int, min_ess: float, laplace: dict,
                sampler: str, offsets: np.ndarray | None = None) -> TiltedResult:
    """Self-normalised importance sampling from the Laplace approximation, antithetic, with control variate.

    With draws z = mode +- e_i (i = 1..h, n = 2h), weights w_i^+ and w_i^-, and the
    phi-part of the offsets e_i, the weighted moments minus the plain moments of the same
    draws plus the Laplace moments are

        mean = mode + sum_i (w_i^+ - w_i^-) e_i,
        cov  = Sigma_Laplace + sum_i (w_i^+ + w_i^- - 1/h) e_i e_i^T - (mean - mode)(mean - mode)^T

    (the plain mean of antithetic pairs is the mode), i.e. one product over the h offsets.
    """
    D, p = mode.size, model.p
    L = cholesky_lower(lap_cov)
    if L is None:
        raise TiltedFailure("the Laplace covariance is not positive definite")
    half = max(n_draws // 2, 1)
    xi = offsets if offsets is not None and np.shape(offsets) == (half, D) else normal_offsets(rng, half, D, sampler)
    eps = xi @ L.T
    z = np.empty((2 * half, D))  # antithetic pairs mode +- eps: the plain sample mean is the mode
    np.add(mode, eps, out=z[:half])
    np.subtract(mode, eps, out=z[half:])
    # log N(z; mode, L L^T) with L^{-1}(z - mode) = +-xi: no second factorisation or solve
    log_q = -0.5 * row_dot(xi, xi) - (np.log(np.diag(L)).sum() + 0.5 * D * np.log(2.0 * np.pi))
    log_w = logf(z)
    log_w[:half] -= log_q
    log_w[half:] -= log_q
    weights, ess = _normalised(log_w)
    if ess < min_ess:
        raise TiltedFailure(f"effective sample size {ess:.1f} is below {min_ess}")
    e = eps[:, :p]
    plus, minus = weights[:half], weights[half:]
    shift = (plus - minus) @ e
    cov = lap_cov[:p, :p] + (e.T * (plus + minus - 1.0 / half)) @ e - shift[:, None] * shift
    phi = np.ascontiguousarray(z[:, :p])
    return _result(model, mode[:p] + shift, symmetrise(cov), phi, z, weights, "importance",
                   {"ess": ess, "mode": mode, "laplace": laplace, "log_weights": log_w, "offsets": xi})


def _normalised(log_w: np.ndarray) -> tuple[np.ndarray, float]:
    """Self-normalised weights from log weights (non-finite ones count as zero) and their ESS."""
    top = log_w.max()
    if not np.isfinite(top):  # a nan or +inf among them (or no finite one): those count as zero
        log_w = np.where(np.isfinite(log_w), log_w, -np.inf)
        top = log_w.max()
        if not np.isfinite(top):
            raise TiltedFailure("tilted density is not finite at any point")
    weights = np.exp(log_w - top)
    weights /= weights.sum()
    return weights, float(1.0 / (weights @ weights))


def _result(model, mean, cov, phi, z, weights, method: str, diagnostics: dict) -> TiltedResult:
    try:
        Q = inv_pd(cov, "tilted covariance")
    except ValueError as exc:
        raise TiltedFailure(str(exc)) from exc
    return TiltedResult(mean, cov, Q @ mean, Q, phi, z[:, model.p :], weights, None, method, diagnostics)


@dataclass
class DevicePosterior:
    """Posterior of one device's coefficients (spec §4.1).

    Attributes
    ----------
    mean : ndarray, shape (d,)
    cov : ndarray, shape (d, d)
    draws : ndarray, shape (n_draws, d)
    """

    mean: np.ndarray
    cov: np.ndarray
    draws: np.ndarray


def device_posterior(model, stats: SiteStats, tilted: TiltedResult, rng: np.random.Generator, n_draws: int = 4000) -> DevicePosterior:
    """Spec eq. (8): :math:`p(\\theta_k\\mid Y_{1:K})\\approx\\int q_{-k}(\\phi)p(Y_k\\mid\\theta_k,\\phi)p(\\theta_k\\mid\\phi)d\\phi`.

    ``tilted`` must have been computed under the site's cavity (or under the full :math:`q`
    for a new device, spec §4.3). For closed-form models the moments are Rao–Blackwellised
    over the tilted points, :math:`E[\\theta]=\\sum_iw_im_i`,
    :math:`\\mathrm{Cov}=\\sum_iw_i(C_i+m_im_i^\\top)-E[\\theta]E[\\theta]^\\top`, and draws come from
    the mixture (from the exact Gaussian tilted law in the conjugate case). For the lasso the
    MCMC draws of :math:`\\theta_k` are used.
    """
    if tilted.theta is not None:
        mean, cov = moments_from_draws(tilted.theta)
        return DevicePosterior(mean, cov, tilted.theta)
    m, C = model.theta_conditional(stats, tilted.phi, tilted.local)
    w = tilted.weights
    n, d = m.shape
    mean = w @ m
    cov = symmetrise((w @ C.reshape(n, d * d)).reshape(d, d) + (m.T * w) @ m - np.outer(mean, mean))
    # C may be singular on fixed coordinates: draw through the block of the coordinates that vary
    # (C is zero outside it), its square root from an eigen-decomposition computed once per
    # distinct point (conjugate case: C does not depend on phi, one decomposition)
    if tilted.gaussian:
        phi = rng.multivariate_normal(tilted.mean, tilted.cov, size=n_draws)
        m_d, _ = model.theta_conditional(stats, phi, np.zeros((n_draws, 0)))
        idx, C = np.zeros(n_draws, dtype=int), C[:1]
    else:  # points drawn by their weights: inverse CDF at sorted uniforms, in a random order (i.i.d. draws;
        # a binary search for sorted keys runs several times faster than for keys in random order)
        cdf = np.cumsum(w)
        u = rng.random(n_draws)
        u.sort()
        idx = np.minimum(cdf.searchsorted(u * cdf[-1], side="right"), n - 1)[rng.permutation(n_draws)]
        m_d = m[idx]
    varying = np.flatnonzero((C != 0.0).any(axis=0).any(axis=0))
    z = rng.standard_normal((n_draws, varying.size))
    draws = m_d  # a new array (fancy indexing, or theta_conditional's own)
    if varying.size == 1:  # one coordinate varies (a random intercept): its conditional sd
        j = varying[0]
        draws[:, j] += np.sqrt(np.clip(C[idx, j, j], 0.0, None)) * z[:, 0]
        return DevicePosterior(mean, cov, draws)
    used, which = np.unique(idx, return_inverse=True)
    vals, vecs = np.linalg.eigh(C[used][:, varying[:, None], varying[None, :]])
    z *= np.sqrt(np.clip(vals[which], 0.0, None))
    draws[:, varying] += np.einsum("nij,nj->ni", vecs[which], z)
    return DevicePosterior(mean, cov, draws)
