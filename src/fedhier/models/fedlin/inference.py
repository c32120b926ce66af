"""Inference products from posterior draws (spec §4.2, §5) and the metrics of spec §5, §7."""

from __future__ import annotations

import numpy as np
from scipy import stats as sps

__all__ = [
    "credible_interval",
    "gaussian_interval",
    "tail_probability",
    "reject_null",
    "select_features",
    "inclusion_score",
    "a_rmse",
    "inclusion_rates",
]


def _check_level(level: float) -> float:
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return level


def credible_interval(draws: np.ndarray, level: float = 0.9) -> np.ndarray:
    """Equal-tailed :math:`(1-a)` interval from ``draws (n, ...)``; returns shape ``(..., 2)``.

    The ends are numpy's default (linear) quantiles at :math:`a/2` and :math:`1-a/2`: at :math:`h=q(n-1)`,
    :math:`x_{(\\lfloor h\\rfloor)}+(h-\\lfloor h\\rfloor)(x_{(\\lfloor h\\rfloor+1)}-x_{(\\lfloor h\\rfloor)})` of the sorted
    draws, computed as ``np.quantile`` does (the same numbers); one sort along the draws costs a fraction of
    its selection of several order statistics.
    """
    a = 1.0 - _check_level(level)
    x = np.sort(np.asarray(draws, dtype=float), axis=0)
    n = x.shape[0]
    ends = []
    for q in (a / 2, 1 - a / 2):
        h = (n - 1) * q
        below = int(np.floor(h))
        t = h - below
        lo, hi = x[below], x[min(below + 1, n - 1)]
        step = hi - lo
        ends.append(lo + step * t if t < 0.5 else hi - step * (1.0 - t))  # numpy's symmetric interpolation
    return np.stack(ends, axis=-1)


def gaussian_interval(mean: np.ndarray, var: np.ndarray, level: float = 0.9) -> np.ndarray:
    """:math:`m_j\\pm z_{1-a/2}\\sqrt{\\Sigma_{jj}}` (spec §4.2, for :math:`\\phi`); shape ``(p, 2)``."""
    z = sps.norm.ppf(0.5 + _check_level(level) / 2)
    half = z * np.sqrt(var)
    return np.stack([mean - half, mean + half], axis=-1)


def tail_probability(draws: np.ndarray, c: float | np.ndarray = 0.0) -> np.ndarray:
    """Posterior two-sided tail probability :math:`2\\min\\{\\Pr(\\theta>c),\\Pr(\\theta<c)\\}` per coordinate."""
    above = np.mean(draws > c, axis=0)
    below = np.mean(draws < c, axis=0)
    return 2.0 * np.minimum(above, below)


def reject_null(draws: np.ndarray, c: float | np.ndarray = 0.0, level: float = 0.9) -> np.ndarray:
    """Test of :math:`H_0:\\theta_j=c` at level :math:`a=1-` ``level``: reject iff ``c`` lies outside the interval."""
    ci = credible_interval(draws, level)
    c = np.broadcast_to(c, ci.shape[:-1])
    return (c < ci[..., 0]) | (c > ci[..., 1])


def select_features(draws: np.ndarray, level: float = 0.9) -> np.ndarray:
    """Spec §5 selection rule: predictor :math:`j` is included iff its interval excludes 0 (bool per coordinate)."""
    return reject_null(draws, 0.0, level)


def inclusion_score(draws: np.ndarray) -> np.ndarray:
    """Graded score :math:`\\max\\{\\Pr(\\theta_j>0),\\Pr(\\theta_j<0)\\}` (spec §5)."""
    return np.maximum(np.mean(draws > 0, axis=0), np.mean(draws < 0, axis=0))


def a_rmse(predictions, targets) -> float:
    """Spec §7: mean over sites of the per-site RMSE; both arguments are lists of (n_k,) arrays."""
    if len(predictions) != len(targets) or not predictions:
        raise ValueError("predictions and targets must be non-empty lists of the same length")
    return float(np.mean([np.sqrt(np.mean((np.asarray(p) - np.asarray(t)) ** 2)) for p, t in zip(predictions, targets)]))


def inclusion_rates(selected: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """Spec §5 metrics averaged over sites: (CIR, FIR) from ``selected (K, d)`` and true ``(K, d)`` or ``(d,)`` coefficients."""
    selected = np.atleast_2d(selected)
    support = np.broadcast_to(np.asarray(truth) != 0, selected.shape)
    cir, fir = [], []
    for sel, sup in zip(selected, support):
        cir.append(sel[sup].mean() if sup.any() else np.nan)
        fir.append(sel[~sup].mean() if (~sup).any() else np.nan)
    return float(np.nanmean(cir)), float(np.nanmean(fir))
