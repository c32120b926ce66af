"""HM2 model instances whose site factor has a closed form (spec §3.1–3.2, §5).

Each instance maps an unconstrained global vector :math:`\\phi` (and optional site-local
coordinates :math:`u`, e.g. :math:`\\log\\sigma_k`) to the marginal likelihood of one site,

.. math:: f_k(\\phi\\mid u)=\\int p(Y_k\\mid\\theta_k,\\phi,u)\\,p(\\theta_k\\mid\\phi)\\,d\\theta_k
          =\\mathcal N\\big(Y_k;\\ X_k^\\top\\mu,\\ X_{k,r}^\\top D_\\tau X_{k,r}+\\sigma_k^2 I\\big),

computed from the sufficient statistics only (spec §3.2, with Woodbury on the random
coordinates ``r``), and to the Gaussian conditional posterior :math:`\\theta_k\\mid\\phi,u,Y_k`.
The Bayesian lasso has no closed form and lives in :mod:`.lasso`.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import lapack

from .natural import cholesky_lower, row_dot
from .stats import SiteStats

__all__ = ["GaussianHierarchy", "BayesianRidge", "log_marginal", "conditional_theta"]

_LOG_2PI = float(np.log(2.0 * np.pi))


def log_marginal(stats: SiteStats, mu: np.ndarray, tau: np.ndarray, s2: np.ndarray, random: np.ndarray) -> np.ndarray:
    """Vectorised :math:`\\log\\mathcal N(Y_k;X_k^\\top\\mu,X_{k,r}^\\top\\mathrm{diag}(\\tau)X_{k,r}+s^2I)`.

    Parameters
    ----------
    stats : SiteStats
    mu : ndarray, shape (n, d)
        Prior means of :math:`\\theta_k`.
    tau : ndarray, shape (n, d_r)
        Prior variances of the random coordinates.
    s2 : ndarray, shape (n,)
        Noise variances.
    random : ndarray of int, shape (d_r,)
        Indices of the coordinates of :math:`\\theta_k` that vary across sites.

    Returns
    -------
    ndarray, shape (n,)
    """
    mu_xx = mu @ stats.xx
    ee = row_dot(mu_xx - 2.0 * stats.xy, mu) + stats.yy  # ||Y - X^T mu||^2
    if random.size == 1:  # a random intercept (or one slope): P is a scalar per point
        # with s2 P = xx_jj + s2 / tau: log P = log(s2 P) - log s2 and b^2 / (P s2^2) = b^2 / (s2 P s2)
        j = int(random[0])
        b = stats.xy[j] - mu_xx[:, j]
        s2P = stats.xx[j, j] + s2 / tau[:, 0]
        return (-0.5 * stats.n * _LOG_2PI - 0.5 * (stats.n - 1) * np.log(s2) - 0.5 * (ee - b * b / s2P) / s2
                - 0.5 * np.log(tau[:, 0] * s2P))
    out = -0.5 * stats.n * (_LOG_2PI + np.log(s2)) - 0.5 * ee / s2
    if random.size:
        b = stats.xy[random] - mu_xx[:, random]  # X^T X is symmetric: (mu X^T X)_r = mu (X^T X)_{:, r}
        P = stats.xx[np.ix_(random, random)][None] / s2[:, None, None] + _diag(1.0 / tau)
        L = np.linalg.cholesky(P)
        z = np.linalg.solve(L, b[..., None])[..., 0]
        logdet_P = 2.0 * np.log(np.diagonal(L, axis1=-2, axis2=-1)).sum(-1)
        out = out - 0.5 * np.log(tau).sum(-1) - 0.5 * logdet_P + 0.5 * row_dot(z, z) / s2**2
    return out


def conditional_theta(stats: SiteStats, mu: np.ndarray, tau: np.ndarray, s2: np.ndarray, random: np.ndarray):
    """Spec §3.2: :math:`\\theta_k\\mid\\phi,Y_k\\sim\\mathcal N(P_k^{-1}h_k,P_k^{-1})` on the random coordinates.

    Coordinates not in ``random`` equal :math:`\\mu` exactly (zero variance).

    Returns
    -------
    mean : ndarray, shape (n, d)
    cov : ndarray, shape (n, d, d)
    """
    n, d = mu.shape
    mean = mu.copy()
    cov = np.zeros((n, d, d))
    if random.size == 1:  # a random intercept (or one slope): P is a scalar per point
        j = int(random[0])
        var = 1.0 / (stats.xx[j, j] / s2 + 1.0 / tau[:, 0])
        mean[:, j] += var * (stats.xy[j] - mu @ stats.xx[:, j]) / s2
        cov[:, j, j] = var
    elif random.size:
        b = stats.xy[random] - mu @ stats.xx[:, random]
        P = stats.xx[np.ix_(random, random)][None] / s2[:, None, None] + _diag(1.0 / tau)
        Pinv = np.linalg.inv(P)
        Pinv = 0.5 * (Pinv + np.swapaxes(Pinv, -1, -2))
        mean[:, random] += np.einsum("nij,nj->ni", Pinv, b) / s2[:, None]
        cov[:, random[:, None], random[None, :]] = Pinv
    return mean, cov


def _diag(v: np.ndarray) -> np.ndarray:
    out = np.zeros(v.shape + (v.shape[-1],))
    idx = np.arange(v.shape[-1])
    out[..., idx, idx] = v
    return out


class _GaussianSites:
    """Site likelihood of an instance whose ``unpack(phi, u)`` gives the Gaussian prior of theta_k.

    ``unpack`` returns ``mu (n, d)``, ``tau (n, d)`` (prior variances) and ``s2 (n,)`` (noise
    variance); theta_k is then integrated out in closed form (spec §3.1).
    """

    def log_lik(self, stats: SiteStats, phi: np.ndarray, u: np.ndarray) -> np.ndarray:
        """:math:`\\log f_k(\\phi\\mid u)` for ``phi (n, p)``; shape (n,)."""
        mu, tau, s2 = self.unpack(phi, u)
        return log_marginal(stats, mu, tau, s2, self.random)

    def theta_conditional(self, stats: SiteStats, phi: np.ndarray, u: np.ndarray):
        """Mean ``(n, d)`` and covariance ``(n, d, d)`` of :math:`\\theta_k\\mid\\phi,u,Y_k`."""
        mu, tau, s2 = self.unpack(phi, u)
        return conditional_theta(stats, mu, tau, s2, self.random)


class GaussianHierarchy(_GaussianSites):
    """Gaussian HM2 instances of spec §3.1: :math:`\\theta_k\\mid\\phi\\sim\\mathcal N(\\mu,D_\\tau)`.

    Parameters
    ----------
    n_features : int
        :math:`d`.
    covariance : {"diagonal", "isotropic", "fixed"}
        "diagonal" (Example 4.1, UQ study): one :math:`\\log\\tau_j` per random coordinate;
        "isotropic" (Sec. 4.1): one shared :math:`\\log\\tau`; "fixed": :math:`\\tau` given by
        ``tau`` and :math:`\\phi=\\mu` (with a known noise this is the conjugate case).
    random : array of bool, shape (d,), optional
        Which coordinates vary across sites (default all). ``[True, False, ...]`` is the
        random-intercept model a statistician fits with MixedLM.
    noise : "local", "shared" or float
        "local" (spec §9 #16, default): :math:`\\log\\sigma_k\\sim\\mathcal N(0,1.5^2)` is a site-local
        coordinate integrated inside the site; "shared": :math:`\\log\\sigma^2` is the last
        component of :math:`\\phi` (ep-stan m1a); a float: known noise variance of every site.
    tau : float or array, shape (d_r,)
        Prior variances when ``covariance="fixed"``.
    mu_scale : float
        Prior :math:`\\mu\\sim\\mathcal N(0,\\text{mu\\_scale}^2I)` (UQ study: 1).
    log_tau_prior, log_sigma2_prior, log_sigma_local_prior : (mean, sd)
        Gaussian priors of the log-scale components (spec §8.3, §9 #16–17).
    """

    closed_form = True

    def __init__(
        self,
        n_features: int,
        *,
        covariance: str = "diagonal",
        random=None,
        noise="local",
        tau=None,
        mu_scale: float = 1.0,
        log_tau_prior: tuple[float, float] = (0.0, 1.0),
        log_sigma2_prior: tuple[float, float] = (0.0, 1.0),
        log_sigma_local_prior: tuple[float, float] = (0.0, 1.5),
    ):
        d = int(n_features)
        if d < 1:
            raise ValueError(f"n_features must be >= 1, got {n_features}")
        if covariance not in ("diagonal", "isotropic", "fixed"):
            raise ValueError(f"covariance must be 'diagonal', 'isotropic' or 'fixed', got {covariance!r}")
        mask = np.ones(d, dtype=bool) if random is None else np.asarray(random, dtype=bool)
        if mask.shape != (d,):
            raise ValueError(f"random must have shape ({d},), got {mask.shape}")
        self.d = d
        self.random = np.flatnonzero(mask)
        self.covariance = covariance
        if covariance == "fixed":
            if tau is None:
                raise ValueError("covariance='fixed' needs tau (the prior variances of the random coordinates)")
            tau = np.broadcast_to(np.asarray(tau, dtype=float), (self.random.size,)).copy()
            if np.any(tau <= 0):
                raise ValueError("tau must be positive")
        self.tau = tau
        if isinstance(noise, str):
            if noise not in ("local", "shared"):
                raise ValueError(f"noise must be 'local', 'shared' or a positive variance, got {noise!r}")
        elif not float(noise) > 0:
            raise ValueError(f"noise variance must be positive, got {noise}")
        self.noise = noise
        self.mu_scale = float(mu_scale)
        self.log_tau_prior = tuple(map(float, log_tau_prior))
        self.log_sigma2_prior = tuple(map(float, log_sigma2_prior))
        self.log_sigma_local_prior = tuple(map(float, log_sigma_local_prior))
        self.n_tau = {"diagonal": self.random.size, "isotropic": 1 if self.random.size else 0, "fixed": 0}[covariance]
        self.p = d + self.n_tau + (1 if noise == "shared" else 0)
        self.n_local = 1 if noise == "local" else 0

    @property
    def phi_names(self) -> list[str]:
        names = [f"mu[{j}]" for j in range(self.d)]
        if self.covariance == "diagonal":
            names += [f"log_tau[{j}]" for j in self.random]
        elif self.covariance == "isotropic" and self.n_tau:
            names += ["log_tau"]
        if self.noise == "shared":
            names += ["log_sigma2"]
        return names

    @property
    def is_conjugate(self) -> bool:
        """True when :math:`f_k` is Gaussian in :math:`\\phi=\\mu` (fixed :math:`\\tau`, known noise)."""
        return self.covariance == "fixed" and not isinstance(self.noise, str)

    def prior(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean ``(p,)`` and covariance ``(p, p)`` of the Gaussian prior :math:`p(\\phi)`."""
        mean = np.zeros(self.p)
        var = np.full(self.p, self.mu_scale**2)
        mean[self.d : self.d + self.n_tau], var[self.d : self.d + self.n_tau] = self.log_tau_prior[0], self.log_tau_prior[1] ** 2
        if self.noise == "shared":
            mean[-1], var[-1] = self.log_sigma2_prior[0], self.log_sigma2_prior[1] ** 2
        return mean, np.diag(var)

    def local_log_prior(self, u: np.ndarray) -> np.ndarray:
        """Log prior of the site-local coordinates ``u (n, n_local)``; shape (n,)."""
        if not self.n_local:
            return np.zeros(u.shape[0])
        m, s = self.log_sigma_local_prior
        return -0.5 * ((u[:, 0] - m) / s) ** 2 - np.log(s) - 0.5 * _LOG_2PI

    def local_start(self, stats: SiteStats) -> np.ndarray:
        """A sensible starting value of ``u`` (half the log of the mean square of Y)."""
        if not self.n_local:
            return np.zeros(0)
        return np.array([0.5 * np.log(max(stats.yy / stats.n, 1e-12))])

    def phi_start(self, stats: SiteStats, cavity_mean: np.ndarray) -> np.ndarray:
        """Where a site's first Laplace search starts, ``(p,)``: the site's least squares
        :math:`\\hat\\mu=(X^\\top X)^{-1}X^\\top Y` and, with a shared noise, :math:`\\log\\sigma^2` at the log of
        its residual mean square :math:`\\|Y-X\\hat\\mu\\|^2/n`; the cavity mean elsewhere, and everywhere
        when :math:`X^\\top X` is singular or the site has no more rows than columns."""
        start = np.array(cavity_mean, dtype=float)
        if stats.n <= self.d:
            return start
        factor = cholesky_lower(stats.xx)
        if factor is None:
            return start
        mu = lapack.dpotrs(factor, stats.xy, lower=1)[0]
        rss = float(stats.yy - mu @ stats.xy)  # ||Y - X mu||^2 at the least-squares mu
        start[: self.d] = mu
        if self.noise == "shared" and rss > 0:
            start[-1] = np.log(rss / stats.n)
        return start

    def unpack(self, phi: np.ndarray, u: np.ndarray):
        """``phi (n, p)``, ``u (n, n_local)`` -> ``mu (n, d)``, ``tau (n, d_r)``, ``s2 (n,)``."""
        n = phi.shape[0]
        mu = phi[:, : self.d]
        if self.covariance == "diagonal":
            tau = np.exp(phi[:, self.d : self.d + self.n_tau])
        elif self.covariance == "isotropic":
            tau = np.repeat(np.exp(phi[:, self.d : self.d + 1]), self.random.size, axis=1)
        else:
            tau = np.broadcast_to(self.tau, (n, self.random.size))
        if self.noise == "shared":
            s2 = np.exp(phi[:, -1])
        elif self.noise == "local":
            s2 = np.exp(2.0 * u[:, 0])
        else:
            s2 = np.full(n, float(self.noise))
        return mu, tau, s2

    def conjugate_factor(self, stats: SiteStats) -> tuple[np.ndarray, np.ndarray]:
        """Natural parameters ``(r_f (d,), Q_f (d, d))`` of the Gaussian :math:`f_k(\\mu)` (conjugate case).

        With :math:`V=X_{k,r}^\\top D_\\tau X_{k,r}+\\sigma^2I`: :math:`Q_f=X_kV^{-1}X_k^\\top`,
        :math:`r_f=X_kV^{-1}Y_k`, via Woodbury on the sufficient statistics.
        """
        if not self.is_conjugate:
            raise ValueError("conjugate_factor needs covariance='fixed' and a known noise variance")
        s2 = float(self.noise)
        Q = stats.xx / s2
        r = stats.xy / s2
        if self.random.size:
            r_ = self.random
            P = stats.xx[np.ix_(r_, r_)] / s2 + np.diag(1.0 / self.tau)
            B = stats.xx[:, r_] / s2
            Q = Q - B @ np.linalg.solve(P, B.T)
            r = r - B @ np.linalg.solve(P, stats.xy[r_] / s2)
        return r, 0.5 * (Q + Q.T)


class PenalisedHierarchy:
    """phi = (log lambda, log sigma2) with independent Gaussian priors (spec §5, §9 #17).

    Shared by the HM2 ridge (:class:`BayesianRidge`) and lasso
    (:class:`fedhier.models.fedlin.lasso.BayesianLasso`) instances.
    """

    n_local = 0
    p = 2
    phi_names = ["log_lambda", "log_sigma2"]

    def __init__(self, n_features: int, *, log_lambda_prior=(0.0, 1.0), log_sigma2_prior=(0.0, 1.0)):
        self.d = int(n_features)
        if self.d < 1:
            raise ValueError(f"n_features must be >= 1, got {n_features}")
        self.log_lambda_prior = tuple(map(float, log_lambda_prior))
        self.log_sigma2_prior = tuple(map(float, log_sigma2_prior))

    def prior(self) -> tuple[np.ndarray, np.ndarray]:
        return (
            np.array([self.log_lambda_prior[0], self.log_sigma2_prior[0]]),
            np.diag([self.log_lambda_prior[1] ** 2, self.log_sigma2_prior[1] ** 2]),
        )


class BayesianRidge(_GaussianSites, PenalisedHierarchy):
    """HM2 ridge instance (spec §5): :math:`\\theta_{kj}\\mid\\phi\\sim\\mathcal N(0,\\sigma^2/\\lambda)`.

    :math:`\\phi=(\\log\\lambda,\\log\\sigma^2)` with independent Gaussian priors (spec §9 #17),
    :math:`Y_k\\sim\\mathcal N(X_k^\\top\\theta_k,\\sigma^2I)` with a shared noise variance.
    """

    closed_form = True
    is_conjugate = False

    def __init__(self, n_features: int, **priors):
        super().__init__(n_features, **priors)
        self.random = np.arange(self.d)

    def local_log_prior(self, u: np.ndarray) -> np.ndarray:
        return np.zeros(u.shape[0])

    def local_start(self, stats: SiteStats) -> np.ndarray:
        return np.zeros(0)

    def unpack(self, phi: np.ndarray, u: np.ndarray):
        s2 = np.exp(phi[:, 1])
        tau = np.repeat((s2 / np.exp(phi[:, 0]))[:, None], self.d, axis=1)
        return np.zeros((phi.shape[0], self.d)), tau, s2
