"""One round that fits a per-column scaling on every site's data without pooling it.

``kind="standard"``: each site sends, per column, its count of observed cells ``n``, their sum
and their sum of squares (``combine = "sum"``, so secure summation can replace the plain sum);
the global step gives the pooled mean and standard deviation

    center_j = sum_s S1_sj / N_j,   scale_j = sqrt(sum_s S2_sj / N_j - center_j^2)   (ddof 0).

``kind="minmax"``: each site sends, per column, its count, minimum and maximum (the minima and
maxima cannot be summed, so the replies are gathered, as :func:`fedhier.data.scaling.combine_ranges`
combines them); ``center_j = min_s min_sj``, ``scale_j = max_s max_sj - center_j``.

The replies are exact statistics of the raw data, not DP releases (a site's maximum is one subject's
value): ``fedhier fit`` refuses this round in a private fit unless the user opts in, and builds a min-max
scaling from public ranges, with no round at all, when they are declared (``docs/privacy.md``).

Missing cells (NaN) are left out of every statistic.  A column with a single value everywhere
gets scale 1 (left unscaled); a column observed at no site is an error.  The broadcast is
``{"center", "scale"}`` with shape ``(m,)``: the scaled value is ``(x - center) / scale``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .base import RoundProtocol, SiteContext
from .messages import Field, Message, MessageSpec

__all__ = ["ColumnScalingProtocol", "SCALES"]

#: the scalings a command line offers
SCALES = ("standard", "minmax", "none")


class ColumnScalingProtocol(RoundProtocol):
    """Per-column centre and scale from the sites' sums (standard) or ranges (min-max); one round.

    Parameters
    ----------
    n_columns : int
        ``m``; every site's data is an ``(n_s, m)`` float array, NaN for a missing cell.
    kind : "standard" or "minmax"
    """

    name = "column-scaling"

    def __init__(self, n_columns: int, kind: str = "standard") -> None:
        if kind not in ("standard", "minmax"):
            raise ValueError(f"kind must be 'standard' or 'minmax', got {kind!r}")
        self.n_columns = int(n_columns)
        self.kind = kind
        self.combine = "sum" if kind == "standard" else "gather"

    @property
    def reply_spec(self) -> MessageSpec:
        m = (self.n_columns,)
        if self.kind == "standard":
            return MessageSpec("scaling-sums", {"n": Field(m), "sum": Field(m), "sumsq": Field(m)})
        return MessageSpec("scaling-ranges", {"n": Field(m), "min": Field(m), "max": Field(m)})

    @property
    def broadcast_spec(self) -> MessageSpec:
        m = (self.n_columns,)
        return MessageSpec("scaling", {"center": Field(m), "scale": Field(m)})

    def initial_broadcast(self) -> Message:
        return {"center": np.zeros(self.n_columns), "scale": np.ones(self.n_columns)}

    def validate_site_data(self, site: int, data: Any) -> None:
        X = np.asarray(data, dtype=float)
        if X.ndim != 2 or X.shape[1] != self.n_columns:
            raise ValueError(f"site {site}: expected an array (n, {self.n_columns}), got shape {X.shape}")

    def site_step(self, ctx: SiteContext, broadcast: Message) -> Message:
        X = np.asarray(ctx.data, dtype=float)
        seen = ~np.isnan(X)
        n = seen.sum(axis=0).astype(float)
        Z = np.where(seen, X, 0.0)
        if self.kind == "standard":
            return {"n": n, "sum": Z.sum(axis=0), "sumsq": (Z * Z).sum(axis=0)}
        lo = np.where(n > 0, np.nanmin(np.where(seen, X, np.inf), axis=0, initial=np.inf), 0.0)
        hi = np.where(n > 0, np.nanmax(np.where(seen, X, -np.inf), axis=0, initial=-np.inf), 0.0)
        return {"n": n, "min": lo, "max": hi}

    def global_step(self, combined: Message | Mapping[int, Message], round: int, previous: Message) -> Message:
        if self.kind == "standard":
            n = np.asarray(combined["n"], dtype=float)
            if np.any(n == 0):
                raise ValueError(f"column(s) {np.flatnonzero(n == 0).tolist()} observed at no site")
            center = combined["sum"] / n
            scale = np.sqrt(np.maximum(combined["sumsq"] / n - center**2, 0.0))
        else:
            replies = list(combined.values())
            n = sum(np.asarray(r["n"], dtype=float) for r in replies)
            if np.any(n == 0):
                raise ValueError(f"column(s) {np.flatnonzero(n == 0).tolist()} observed at no site")
            center = np.min([np.where(r["n"] > 0, r["min"], np.inf) for r in replies], axis=0)
            scale = np.max([np.where(r["n"] > 0, r["max"], -np.inf) for r in replies], axis=0) - center
        scale = np.where(scale > 1e-12 * np.maximum(1.0, np.abs(center)), scale, 1.0)  # a constant column: unscaled
        return {"center": center, "scale": scale}
