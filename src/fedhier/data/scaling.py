"""Per-feature min–max scaling to [0, 1] (spec fed-mv-ppca §12.1, §14 row 1).

[R] (default): one transform fitted on the pooled training data without pooling it.  Each site
computes its per-feature minima and maxima locally (:func:`site_ranges`), only these 2 d numbers
per view travel, and the global range is their element-wise min / max (:func:`combine_ranges`).
The same :class:`MinMaxScaling` is then applied to every site and to the test set.

[RC] (fidelity switch): :func:`per_dataset_minmax` fits the range on the very data it scales, as
the reference code does separately for each site and for the test set.

Note: the ranges reveal each site's extreme values; they are released in the clear.

Scaled value: z = (t - min) / (max - min); a constant feature (max == min) maps to 0 and
inverts to min.  NaN rows (subjects lacking a view) stay NaN.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["site_ranges", "combine_ranges", "MinMaxScaling", "per_dataset_minmax", "ColumnScaling"]

Ranges = dict[str, tuple[np.ndarray, np.ndarray]]


def site_ranges(site: Mapping[str, Any]) -> Ranges:
    """Per-feature minimum and maximum of every view of one site, computed locally.

    Parameters
    ----------
    site : mapping ``view name -> array (n, d_view)``; entirely-NaN rows are ignored.

    Returns
    -------
    dict ``view name -> (min (d_view,), max (d_view,))``.  A view with no observed row is left out.
    """
    ranges: Ranges = {}
    for view, X in site.items():
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"view {view!r}: expected a 2-D array (n, d), got shape {X.shape}")
        observed = X[~np.isnan(X).all(axis=1)]
        if np.isnan(observed).any():
            raise ValueError(f"view {view!r}: a row is partially NaN; min–max ranges need whole rows")
        if observed.shape[0] > 0:
            ranges[view] = (observed.min(axis=0), observed.max(axis=0))
    return ranges


def combine_ranges(ranges: Sequence[Mapping[str, tuple[Any, Any]]]) -> Ranges:
    """Global per-feature range: element-wise min of the minima and max of the maxima over sites.

    Parameters
    ----------
    ranges : list of the outputs of :func:`site_ranges`, one per site; a view may be absent at some.

    Returns
    -------
    dict ``view name -> (min (d_view,), max (d_view,))``, views in first-seen order.
    """
    combined: Ranges = {}
    for s, site in enumerate(ranges):
        for view, (lo, hi) in site.items():
            lo = np.asarray(lo, dtype=np.float64)
            hi = np.asarray(hi, dtype=np.float64)
            if lo.ndim != 1 or lo.shape != hi.shape:
                raise ValueError(
                    f"site {s}, view {view!r}: min and max must be 1-D of equal length, got {lo.shape} and {hi.shape}"
                )
            if view in combined:
                if combined[view][0].shape != lo.shape:
                    raise ValueError(
                        f"site {s}, view {view!r}: range of dimension {lo.size}, "
                        f"earlier sites gave {combined[view][0].size}"
                    )
                combined[view] = (np.minimum(combined[view][0], lo), np.maximum(combined[view][1], hi))
            else:
                combined[view] = (lo.copy(), hi.copy())
    return combined


class MinMaxScaling:
    """Per-feature affine map z = (t - min) / (max - min) of every view (spec §12.1 [R]).

    Parameters
    ----------
    ranges : mapping ``view name -> (min (d_view,), max (d_view,))``
        Typically ``combine_ranges([site_ranges(s) for s in sites])``.
    """

    def __init__(self, ranges: Mapping[str, tuple[Any, Any]]):
        self.ranges = combine_ranges([ranges])
        for view, (lo, hi) in self.ranges.items():
            if np.any(~np.isfinite(lo)) or np.any(~np.isfinite(hi)) or np.any(hi < lo):
                raise ValueError(f"view {view!r}: ranges must be finite with max >= min")

    @classmethod
    def from_sites(cls, sites: Sequence[Mapping[str, Any]]) -> "MinMaxScaling":
        """Fit on the union of the sites' data via local ranges (federated)."""
        return cls(combine_ranges([site_ranges(site) for site in sites]))

    def transform(self, X: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Scale any subset of the fitted views.

        Parameters
        ----------
        X : mapping ``view name -> array (n, d_view)``

        Returns
        -------
        dict ``view name -> float64 ndarray (n, d_view)``; NaN rows preserved.
        """
        out = {}
        for view, T in X.items():
            lo, span = self._affine(view, T)
            T = np.asarray(T, dtype=np.float64)
            Z = np.divide(T - lo, span, out=np.zeros(T.shape), where=span > 0)
            Z[np.isnan(T)] = np.nan
            out[view] = Z
        return out

    def inverse_transform(self, Z: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Undo :meth:`transform`: t = min + z (max - min), for any subset of the fitted views."""
        out = {}
        for view, T in Z.items():
            lo, span = self._affine(view, T)
            out[view] = lo + np.asarray(T, dtype=np.float64) * span
        return out

    def _affine(self, view: str, T: Any) -> tuple[np.ndarray, np.ndarray]:
        if view not in self.ranges:
            raise ValueError(f"view {view!r} was not fitted; fitted views are {list(self.ranges)}")
        lo, hi = self.ranges[view]
        shape = np.shape(T)
        if len(shape) != 2 or shape[1] != lo.size:
            raise ValueError(f"view {view!r}: expected shape (n, {lo.size}), got {shape}")
        return lo, hi - lo

    def __repr__(self) -> str:
        return f"MinMaxScaling(views={list(self.ranges)})"


def per_dataset_minmax(views: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """[RC] variant: min–max scale a data set with its own per-feature range (spec §12.1).

    Apply separately to each site's data and to the test set to reproduce the reference code.
    """
    return MinMaxScaling(site_ranges(views)).transform(views)


class ColumnScaling:
    """A fitted per-column affine map ``z = (x - center) / scale`` of named columns.

    Fitted across sites by :class:`fedhier.protocol.scaling.ColumnScalingProtocol`; saved with a
    model (:meth:`to_dict`) and applied to any later input (:meth:`transform`) and output
    (:meth:`inverse_transform`).

    Parameters
    ----------
    kind : "standard", "minmax" or "none"
    columns : sequence of str, length m
    center, scale : array-like (m,)
    """

    def __init__(self, kind: str, columns: Sequence[str], center: Any = None, scale: Any = None):
        self.kind = kind
        self.columns = tuple(columns)
        m = len(self.columns)
        self.center = np.zeros(m) if center is None else np.asarray(center, dtype=np.float64).reshape(m)
        self.scale = np.ones(m) if scale is None else np.asarray(scale, dtype=np.float64).reshape(m)
        if not (np.all(np.isfinite(self.center)) and np.all(np.isfinite(self.scale)) and np.all(self.scale > 0)):
            raise ValueError("scaling: centers must be finite and scales positive")
        self._index = {c: j for j, c in enumerate(self.columns)}

    def _take(self, columns: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        unknown = [c for c in columns if c not in self._index]
        if unknown:
            raise ValueError(f"column(s) {unknown} were not scaled when the model was fitted; scaled: {list(self.columns)}")
        j = [self._index[c] for c in columns]
        return self.center[j], self.scale[j]

    def transform(self, columns: Sequence[str], X: Any) -> np.ndarray:
        """``(X - center) / scale`` for the named columns of ``X`` (n, len(columns)); NaN stays NaN."""
        center, scale = self._take(columns)
        return (np.asarray(X, dtype=np.float64) - center) / scale

    def inverse_transform(self, columns: Sequence[str], Z: Any) -> np.ndarray:
        """``center + Z * scale``: back to the units of the sites' files."""
        center, scale = self._take(columns)
        return center + np.asarray(Z, dtype=np.float64) * scale

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "columns": list(self.columns), "center": self.center.tolist(), "scale": self.scale.tolist()}

    @classmethod
    def from_ranges(cls, columns: Sequence[str], ranges: Mapping[str, tuple[float, float]]) -> "ColumnScaling":
        """Min-max scaling from public bounds ``column -> (low, high)``, declared in advance: ``z = (x - low) / (high - low)``.

        Built at each site from the configuration alone, so nothing about the data leaves a site.
        """
        lo = np.array([ranges[c][0] for c in columns], dtype=np.float64)
        hi = np.array([ranges[c][1] for c in columns], dtype=np.float64)
        return cls("minmax", columns, lo, hi - lo)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ColumnScaling":
        return cls(str(d["kind"]), [str(c) for c in d["columns"]], d["center"], d["scale"])

    def __repr__(self) -> str:
        return f"ColumnScaling(kind={self.kind!r}, columns={list(self.columns)})"
