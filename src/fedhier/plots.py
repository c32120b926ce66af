"""Figures of the Fed-mv-PPCA experiments (matplotlib, Agg backend; files written atomically).

The reports of the commands are in :mod:`fedhier.report`."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .utils.io import atomic_write_bytes  # noqa: E402

__all__ = ["save_figure", "plot_convergence", "plot_latent", "plot_imputation"]


def save_figure(fig, path: str | Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def plot_convergence(history: Sequence[Mapping], path: str | Path, title: str = "Convergence") -> Path:
    """Expected complete-data log-likelihood (sum over sites, §4.2) per round."""
    rounds = [h["round"] for h in history]
    ell = [h["expected_ll"] for h in history]
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot(rounds, ell, marker=".", lw=1)
    ax.set_xlabel("round")
    ax.set_ylabel("expected log-likelihood (sum over sites)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_latent(
    latent: np.ndarray,
    labels: np.ndarray,
    label_names: Sequence[str],
    path: str | Path,
    groups: np.ndarray | None = None,
    group_name: str = "site",
    title: str = "Latent space",
) -> Path:
    """First two latent coordinates coloured by class (and marked by site if given)."""
    latent = np.asarray(latent)
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    markers = "osd^v<>"
    group_values = [None] if groups is None else list(np.unique(groups))
    for gi, g in enumerate(group_values):
        in_group = np.ones(len(latent), bool) if g is None else np.asarray(groups) == g
        for ci, name in enumerate(label_names):
            sel = in_group & (np.asarray(labels) == ci)
            if sel.any():
                ax.scatter(
                    latent[sel, 0],
                    latent[sel, 1] if latent.shape[1] > 1 else np.zeros(sel.sum()),
                    s=14,
                    alpha=0.7,
                    color=f"C{ci}",
                    marker=markers[gi % len(markers)],
                    label=name if g is None else f"{name}, {group_name} {g}",
                )
    ax.set_xlabel("latent 1")
    ax.set_ylabel("latent 2")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="best")
    return save_figure(fig, path)


def plot_imputation(
    truth: np.ndarray,
    mean: np.ndarray,
    variance: np.ndarray,
    feature_names: Sequence[str],
    path: str | Path,
    title: str = "Imputed view",
    max_features: int = 3,
) -> Path:
    """Histogram of real held-out values against the predictive distribution (paper Figs 5c, 8).

    The predictive distribution of each feature over the subjects is the mixture of the
    per-subject Gaussians N(mean_i, variance_i); it is drawn as a density curve.
    """
    truth, mean, variance = (np.asarray(a, dtype=float) for a in (truth, mean, variance))
    k = min(max_features, truth.shape[1])
    fig, axes = plt.subplots(1, k, figsize=(4 * k, 3.2), squeeze=False)
    for j, ax in enumerate(axes[0]):
        lo = min(truth[:, j].min(), (mean[:, j] - 3 * np.sqrt(variance[:, j])).min())
        hi = max(truth[:, j].max(), (mean[:, j] + 3 * np.sqrt(variance[:, j])).max())
        grid = np.linspace(lo, hi, 200)
        sd = np.sqrt(variance[:, j])[:, None]
        density = np.mean(np.exp(-0.5 * ((grid[None, :] - mean[:, j, None]) / sd) ** 2) / (sd * np.sqrt(2 * np.pi)), axis=0)
        ax.hist(truth[:, j], bins=15, density=True, alpha=0.5, color="C0", label="real (hidden)")
        ax.plot(grid, density, color="C3", lw=2, label="predicted")
        ax.set_title(feature_names[j], fontsize=9)
        if j == 0:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    return save_figure(fig, path)
