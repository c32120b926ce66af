"""Multi-view data of one site: checks and observed-view patterns (spec fed-mv-ppca §2.3).

A data set is a mapping ``view name -> float array (n, d_k)``.  A view absent from the
mapping is not measured at all; a row that is entirely NaN means that subject lacks the
view (subject-level missingness, §2.3 [R]); a partially NaN row is an error.

Subjects are grouped by their *pattern* -- the set of views they have -- because the
latent posterior covariance depends on the pattern only (§4.1): one q x q Cholesky
factorisation per pattern serves every subject of that pattern.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Mapping

import numpy as np

__all__ = ["ViewBlock", "MultiViewData", "check_views", "row_blocks", "squared_distances"]

#: entries per block of rows in the passes below (8 MiB of float64: stays in cache-sized pieces)
_BLOCK_ENTRIES = 2**20


def row_blocks(values: np.ndarray, rows: np.ndarray | None = None):
    """Yield consecutive blocks of the rows of ``values`` (n, d) -- all rows, or those indexed by ``rows`` --
    of about 2^20 entries each, so that a pass over the data needs no data-sized temporary."""
    chunk = max(1, _BLOCK_ENTRIES // max(values.shape[1], 1))
    n = values.shape[0] if rows is None else rows.size
    for start in range(0, n, chunk):
        yield values[start:start + chunk] if rows is None else values[rows[start:start + chunk]]


def squared_distances(values: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """||t_n - centre||^2 for every row of ``values`` (n, d), by blocks of rows; shape (n,)."""
    out = np.empty(values.shape[0])
    start = 0
    for block in row_blocks(values):
        diff = block - centre
        out[start:start + block.shape[0]] = np.einsum("ij,ij->i", diff, diff)
        start += block.shape[0]
    return out


@dataclass(frozen=True)
class ViewBlock:
    """The observed rows of one view.

    Attributes
    ----------
    name : str
    values : ndarray of shape (n_k, d_k)
        Rows of the subjects that have the view, NaN-free.
    rows : ndarray of shape (n_k,) of int, or None
        Their indices among the n subjects; ``None`` when every subject has the view
        (then ``values`` is the caller's array, not a copy).
    """

    name: str
    values: np.ndarray
    rows: np.ndarray | None

    @property
    def n_obs(self) -> int:
        return int(self.values.shape[0])

    @property
    def dim(self) -> int:
        return int(self.values.shape[1])


@dataclass(frozen=True)
class MultiViewData:
    """Checked multi-view data of n subjects.

    Attributes
    ----------
    n : int
        Number of subjects.
    views : dict[str, ViewBlock]
        Views in the caller's order.
    patterns : ndarray of shape (P, K) of bool
        Distinct observed-view patterns; column j refers to the j-th entry of ``views``.
    pattern_of : ndarray of shape (n,) of int
        Pattern index of every subject.
    pattern_rows : tuple of (ndarray of int or None)
        Subjects of each pattern; ``None`` when a single pattern covers all subjects.
    """

    n: int
    views: dict[str, ViewBlock]
    patterns: np.ndarray
    pattern_of: np.ndarray
    pattern_rows: tuple[np.ndarray | None, ...]

    def pattern_views(self, p: int) -> tuple[str, ...]:
        """Names of the views observed in pattern ``p``."""
        return self._pattern_views[p]

    @cached_property
    def _pattern_views(self) -> tuple[tuple[str, ...], ...]:
        names = list(self.views)
        return tuple(tuple(names[j] for j in np.flatnonzero(observed)) for observed in self.patterns)

    @cached_property
    def pattern_sizes(self) -> np.ndarray:
        """Subjects per pattern, shape (P,), as floats (the factor of each pattern's summed covariance)."""
        sizes = np.array([self.n if rows is None else rows.size for rows in self.pattern_rows], dtype=float)
        sizes.flags.writeable = False
        return sizes


def check_views(
    data: Mapping[str, np.ndarray],
    *,
    what: str = "data",
    dims: Mapping[str, int] | None = None,
) -> MultiViewData:
    """Check a multi-view data set and group its subjects by observed-view pattern.

    Parameters
    ----------
    data : mapping str -> array_like of shape (n, d_k)
        Views of one data set; all views have the same n.  Entirely-NaN rows mark a
        subject without that view.
    what : str
        Name of the data set used in error messages (e.g. ``"site 3"``).
    dims : mapping str -> int, optional
        Known view dimensions (a model's); every view of ``data`` must be one of them
        with that dimension.

    Returns
    -------
    MultiViewData

    Raises
    ------
    ValueError
        If ``data`` is not a non-empty mapping, a view is not 2-D, has zero columns,
        contains inf, has a partially NaN row, has a different n than the others, is
        unknown to ``dims`` or has the wrong dimension.
    """
    if not isinstance(data, Mapping) or len(data) == 0:
        raise ValueError(f"{what}: expected a non-empty mapping view name -> (n, d) array")
    n = None
    views: dict[str, ViewBlock] = {}
    masks = []
    for name, value in data.items():
        arr = np.asarray(value, dtype=float)
        if arr.ndim != 2 or arr.shape[1] == 0:
            raise ValueError(f"{what}: view {name!r} must be a 2-D array (n, d) with d >= 1, got shape {arr.shape}")
        if dims is not None:
            if name not in dims:
                raise ValueError(f"{what}: view {name!r} is not in the model (model views: {sorted(dims)})")
            if arr.shape[1] != dims[name]:
                raise ValueError(f"{what}: view {name!r} has {arr.shape[1]} columns, the model has {dims[name]}")
        if n is None:
            n = arr.shape[0]
        elif arr.shape[0] != n:
            raise ValueError(f"{what}: view {name!r} has {arr.shape[0]} rows, other views have {n}")
        # a row with a finite sum has no NaN/inf: inspect only the other rows (one cheap pass)
        suspect = np.flatnonzero(~np.isfinite(arr.sum(axis=1)))
        observed = np.ones(arr.shape[0], dtype=bool)
        if suspect.size:
            block = arr[suspect]
            if np.isinf(block).any():
                raise ValueError(f"{what}: view {name!r} contains infinite values")
            nan_count = np.isnan(block).sum(axis=1)
            partial = suspect[(nan_count > 0) & (nan_count < arr.shape[1])]
            if partial.size:
                raise ValueError(
                    f"{what}: view {name!r} has partially missing rows {partial[:5].tolist()}"
                    f"{' ...' if partial.size > 5 else ''}; a subject lacks a view only when its whole row is NaN"
                )
            observed[suspect[nan_count == arr.shape[1]]] = False
        if observed.all():
            views[name] = ViewBlock(name, arr, None)
        else:
            rows = np.flatnonzero(observed)
            views[name] = ViewBlock(name, np.ascontiguousarray(arr[rows]), rows)
        masks.append(observed)
    mask = np.column_stack(masks)
    if mask.all():
        patterns = np.ones((1, mask.shape[1]), dtype=bool)
        pattern_of = np.zeros(n, dtype=np.intp)
        pattern_rows: tuple[np.ndarray | None, ...] = (None,)
    else:
        patterns, pattern_of = np.unique(mask, axis=0, return_inverse=True)
        pattern_of = pattern_of.reshape(-1)
        pattern_rows = tuple(np.flatnonzero(pattern_of == p) for p in range(patterns.shape[0]))
    return MultiViewData(n=int(n), views=views, patterns=patterns, pattern_of=pattern_of, pattern_rows=pattern_rows)
