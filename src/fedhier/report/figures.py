"""Shared figure helpers of the reports: matplotlib (Agg) imported on first use, one legible style."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["pyplot", "panel_grid", "trace_axis", "zoom_axis", "mark_stop", "site_colour", "class_colour"]

#: sizes in points at 100 dpi: tick labels of 10 pt are about 14 CSS pixels on the page
_STYLE = {
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.formatter.useoffset": False,
}


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend with the reports' style."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(_STYLE)
    return plt


def panel_grid(n: int, ncol: int, width: float, row_height: float) -> tuple[Any, list[Any], int]:
    """A figure of ``n`` panels in rows of at most ``ncol`` (cells beyond ``n`` hidden), ``width`` inches wide.

    Returns (figure, the n axes in reading order, the number of columns used).
    """
    plt = pyplot()
    ncol = max(1, min(ncol, n))
    nrow = int(np.ceil(n / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(width, row_height * nrow), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return fig, list(axes.flat[:n]), ncol


def site_colour(i: int) -> str:
    """Colour of site ``i`` (tab10, repeating)."""
    return f"C{i % 10}"


#: colours of classes, distinct from the first sites' tab10 colours
_CLASS_COLOURS = ("#222222", "#e7298a", "#8c564b", "#17becf", "#bcbd22")


def class_colour(i: int) -> str:
    """Colour of class ``i`` (black, magenta, brown, cyan, olive; repeating)."""
    return _CLASS_COLOURS[i % len(_CLASS_COLOURS)]


def trace_axis(ax: Any, values: Sequence[float]) -> str:
    """Choose a y scale that keeps a whole trace readable; returns its name for the caption.

    A trace whose largest magnitude is more than 100 times its median magnitude (e.g. the
    noisy rounds of a private fit) gets a symmetric-log axis, linear up to the median
    magnitude and logarithmic beyond, with ticks at 0 and at powers of ten outside the
    linear part; otherwise the axis stays linear.
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    mag = np.abs(v)
    typical = float(np.median(mag)) if v.size else 0.0
    if v.size < 3 or typical <= 0 or mag.max() <= 100 * typical:
        return "linear"
    ax.set_yscale("symlog", linthresh=typical)
    first, last = int(np.ceil(np.log10(typical))), int(np.ceil(np.log10(mag.max())))
    decades = list(range(first, last + 1))
    decades = decades[:: max(1, int(np.ceil(len(decades) / 4)))]
    ticks = [0.0]
    if (v > 0).any():
        ticks += [10.0**k for k in decades if 10.0**k <= 10 * v.max()]
    if (v < 0).any():
        ticks += [-(10.0**k) for k in decades if 10.0**k <= 10 * -v.min()]
    ax.set_yticks(sorted(ticks))
    return "symmetric-log"


def zoom_axis(ax: Any, x: Sequence[float], y: Sequence[float], **style: Any) -> int:
    """Plot ``y`` against ``x`` on a y range that fits the typical values; returns how many points fall outside.

    The range is the values after the first one that lie within 20 median absolute
    deviations of their median, with a margin; values outside it are drawn as red
    triangles on the edge they pass.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    rest = y[1:] if y.size > 1 else y
    rest = rest[np.isfinite(rest)]
    if rest.size == 0:
        ax.plot(x, y, **style)
        return 0
    med = float(np.median(rest))
    mad = float(np.median(np.abs(rest - med)))
    typical = rest[np.abs(rest - med) <= 20 * mad] if mad > 0 else rest
    lo, hi = float(typical.min()), float(typical.max())
    span = hi - lo if hi > lo else max(abs(hi), 1.0) * 0.01
    lo, hi = lo - 0.1 * span, hi + 0.1 * span
    inside = (y >= lo) & (y <= hi)
    ax.plot(x, np.where(inside, y, np.nan), **style)
    below, above = np.isfinite(y) & (y < lo), np.isfinite(y) & (y > hi)
    if below.any():
        ax.plot(x[below], np.full(below.sum(), lo), "v", color="C3", ms=7, clip_on=False, label="off the scale")
    if above.any():
        ax.plot(x[above], np.full(above.sum(), hi), "^", color="C3", ms=7, clip_on=False,
                label=None if below.any() else "off the scale")
    ax.set_ylim(lo, hi)
    return int(below.sum() + above.sum())


def mark_stop(ax: Any, last_round: int, planned: int | None) -> None:
    """A vertical line at the last round run, labelled with the planned number of rounds."""
    label = f"last round run: {last_round}" + (f" (of {planned} planned)" if planned and planned != last_round else "")
    ax.axvline(last_round, color="0.3", ls="--", lw=1, label=label)
