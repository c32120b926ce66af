"""Parameter containers of Fed-mv-PPCA (spec fed-mv-ppca §1, §3).

Two levels, each a mapping ``view name -> block``:

* :class:`ViewParams` -- the per-view PPCA parameters of one site, theta_c^(k) =
  (mu, W, sigma2).  The same container holds a *point model* built from global
  estimates (mu~, W~, s-bar) for projection, reconstruction and imputation (§9).
* :class:`GlobalView` -- the hierarchical prior of one view, theta~^(k) (§3), plus the
  two summaries the master also returns ([RC] §5.1): the point estimate of the noise
  variance ``noise_var`` (s-bar, mean of the received sigma2) and the inverse-gamma
  variance ``var_sigma`` (v_sigma).

``LocalParams = dict[str, ViewParams]`` and ``GlobalParams = dict[str, GlobalView]``.
Both are plain frozen dataclasses of numpy arrays and floats so that they can be
flattened into declared messages (:mod:`fedhier.protocol.messages`) without pickling.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

__all__ = ["ViewParams", "GlobalView", "LocalParams", "GlobalParams", "point_model", "loading_variance"]


@dataclass(frozen=True)
class ViewParams:
    """PPCA parameters of one view: t = W x + mu + eps, eps ~ N(0, sigma2 I) (§2.1).

    Attributes
    ----------
    mu : ndarray of shape (d_k,)
    W : ndarray of shape (d_k, q)
    sigma2 : float, > 0
    """

    mu: np.ndarray
    W: np.ndarray
    sigma2: float

    @property
    def dim(self) -> int:
        return int(self.W.shape[0])

    @property
    def n_components(self) -> int:
        return int(self.W.shape[1])


@dataclass(frozen=True)
class GlobalView:
    """Hierarchical prior of one view (§3) as estimated by the master (§5).

    mu_c ~ N(mu, sigma2_mu I), w_ci ~ N(w_i, sigma2_Wi I) for each column i of W_c,
    sigma2_c ~ IG(alpha, beta).

    Attributes
    ----------
    mu : ndarray of shape (d_k,)
    W : ndarray of shape (d_k, q)
    sigma2_mu, sigma2_W : float
        Prior variances (not standard deviations; spec §15.11); sigma2_W is the loadings'
        summary variance, the mean of ``sigma2_W_columns`` weighted by the columns' squared
        norms ||w_i||^2 (:func:`loading_variance`).
    alpha, beta : float
        Inverse-gamma shape and scale (scipy ``invgamma(a=alpha, scale=beta)``).
    noise_var : float
        s-bar: mean of the received sigma2_c, the point noise variance used by §9 and §11.
    var_sigma : float
        v_sigma = beta^2 / ((alpha-1)^2 (alpha-2)), the IG variance (inf if alpha <= 2).
    sigma2_W_columns : ndarray of shape (q,), optional
        sigma2_Wi, the prior variance of each column of the loadings; omitted, every column
        has variance sigma2_W.
    """

    mu: np.ndarray
    W: np.ndarray
    sigma2_mu: float
    sigma2_W: float
    alpha: float
    beta: float
    noise_var: float
    var_sigma: float
    sigma2_W_columns: np.ndarray | None = None

    def __post_init__(self):
        if self.sigma2_W_columns is None:
            object.__setattr__(self, "sigma2_W_columns", np.full(np.shape(self.W)[1], float(self.sigma2_W)))

    @property
    def dim(self) -> int:
        return int(self.W.shape[0])

    def point(self) -> ViewParams:
        """Point model (mu~, W~, s-bar) used for projection and reconstruction (§9)."""
        return ViewParams(mu=self.mu, W=self.W, sigma2=self.noise_var)

    def to_dict(self) -> dict[str, np.ndarray | float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def loading_variance(W: np.ndarray, columns: np.ndarray) -> float:
    """The summary variance of the loadings: sum_i ||w_i||^2 sigma2_Wi / sum_i ||w_i||^2.

    Each column's variance counts in proportion to the variance its column explains, so
    columns that carry no signal (w_i = 0, when q is larger than the data need) do not
    pull the summary down; with equal variances it is their common value, and with W = 0
    their mean.

    Parameters
    ----------
    W : ndarray of shape (d, q)
    columns : ndarray of shape (q,)
        sigma2_Wi.
    """
    weight = np.sum(np.asarray(W, dtype=float) ** 2, axis=0)
    columns = np.asarray(columns, dtype=float)
    total, least = weight.sum(), columns.min()  # about the least, so that equal variances give exactly their value
    return float(least + weight @ (columns - least) / total) if total > 0 and np.isfinite(total) else float(columns.mean())


LocalParams = dict[str, ViewParams]
GlobalParams = dict[str, GlobalView]


def point_model(global_params: GlobalParams) -> LocalParams:
    """Map every view of a global model to its point model (§9)."""
    return {view: g.point() for view, g in global_params.items()}
