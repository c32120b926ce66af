"""Input checks for multi-view site data, run before any computation (issue "Bad input").

Site data convention (spec fed-mv-ppca §2.3 and its [R] generalisation):

* a site is a mapping ``view name -> float64 array (n, d_view)`` (or a sequence of
  ``(view name, array)`` pairs);
* a view absent from the mapping is not measured by the site;
* a row that is entirely NaN within a view means that subject lacks that view;
* all views of a site have the same number of rows n.

Every error is a ``ValueError`` whose message names the site (0-based index, and its name if
given), the view and the problem.  pandas DataFrames are accepted as view arrays, but pandas is
never imported.
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping, Sequence

import numpy as np

from fedhier.data.schema import ViewSchema, _site_label

__all__ = ["check_sites", "check_views", "check_site_index", "feature_names", "check_feature_names"]


def check_site_index(site: Any, n_sites: int) -> int:
    """``site`` as an index into ``n_sites`` sites; ValueError unless it is a whole number in [0, n_sites)."""
    if isinstance(site, bool) or not isinstance(site, numbers.Real) or int(site) != site or not 0 <= int(site) < n_sites:
        raise ValueError(f"site must be an integer in [0, {n_sites}), got {site!r}")
    return int(site)


def check_sites(
    sites: Sequence[Any],
    *,
    n_components: int | None = None,
    min_subjects: int = 2,
    schema: ViewSchema | None = None,
    site_names: Sequence[str] | None = None,
) -> tuple[list[dict[str, np.ndarray]], ViewSchema]:
    """Check and normalise the data of all sites.

    Parameters
    ----------
    sites : list of mappings ``view name -> array-like (n_c, d_view)``
        One entry per site.  A site may also be a sequence of ``(view name, array)`` pairs.
        View arrays may be numpy arrays, nested lists or pandas DataFrames with numeric columns.
    n_components : int, optional
        Latent dimension q; must be smaller than the largest view dimension (spec §1, §4.4).
    min_subjects : int
        Smallest accepted number of subjects (rows with at least one observed view) per site.
    schema : ViewSchema, optional
        If given, every view must be in it with the same dimension.  Otherwise the schema is the
        union of the sites' views in first-seen order.
    site_names : sequence of str, optional
        Names used in error messages, e.g. the hospital names.

    Returns
    -------
    sites : list of dict ``view name -> float64 ndarray (n_c, d_view)``
        C-contiguous float64 arrays, views in schema order: the caller's own array when it
        already is one (it is never written to), else a converted copy.
    schema : ViewSchema

    Raises
    ------
    ValueError
        Naming the site, the view and the problem, if: ``sites`` is not a list of mappings; a
        site is empty (no views or zero rows); a view holds non-numeric values, inf, is not 2-D or
        has no column; a row is partially NaN within a view; a view has no observed row; the views
        of a site have different row counts; a view name is duplicated; a view's dimension differs
        between sites or from ``schema``; a view is not in ``schema``; a site has fewer than
        ``min_subjects`` subjects; ``n_components`` is not smaller than the largest view dimension.
    """
    if isinstance(sites, (Mapping, str, bytes, np.ndarray)) or not isinstance(sites, Sequence):
        raise ValueError(
            f"sites must be a list of mappings 'view name -> array (n, d)', one per site; got {type(sites).__name__}"
        )
    if len(sites) == 0:
        raise ValueError("sites is an empty list; at least one site is needed")
    if site_names is not None and len(site_names) != len(sites):
        raise ValueError(f"{len(site_names)} site names given for {len(sites)} sites")
    if isinstance(min_subjects, bool) or not isinstance(min_subjects, numbers.Integral) or min_subjects < 1:
        raise ValueError(f"min_subjects must be a positive integer, got {min_subjects!r}")

    checked = []
    for s, site in enumerate(sites):
        where = _site_label(s, site_names)
        views = _check_one(site, where, schema=schema)
        if not views:
            raise ValueError(f"{where}: the site has no view")
        n = next(iter(views.values())).shape[0]
        n_subjects = int(np.sum(~np.all(np.stack([_missing_rows(X) for X in views.values()]), axis=0)))
        if n_subjects < min_subjects:
            raise ValueError(
                f"{where}: {n_subjects} subject(s) with an observed view (of {n} rows); "
                f"at least {min_subjects} are needed"
            )
        checked.append(views)

    inferred = ViewSchema.from_sites(checked, site_names)
    if schema is None:
        schema = inferred
    if n_components is not None:
        _check_n_components(n_components, schema)
    checked = [{v: site[v] for v in schema.names if v in site} for site in checked]
    return checked, schema


def check_views(
    X: Any, schema: ViewSchema, *, require_any: bool = True, name: str = "X"
) -> dict[str, np.ndarray]:
    """Check prediction-time input: any subset of the schema's views, same rules as :func:`check_sites`.

    Parameters
    ----------
    X : mapping ``view name -> array-like (n, d_view)`` or sequence of ``(name, array)`` pairs
    schema : ViewSchema
        Views must be in it, with its dimensions.
    require_any : bool
        Refuse an input with no view at all.
    name : str
        How the input is called in error messages.

    Returns
    -------
    dict ``view name -> float64 ndarray (n, d_view)`` in schema order.

    Raises
    ------
    ValueError
        As :func:`check_sites`, naming the view; also when ``require_any`` and no view is given.
    """
    views = _check_one(X, name, schema=schema)
    if require_any and not views:
        raise ValueError(f"{name}: no view given; expected at least one of {list(schema.names)}")
    return {v: views[v] for v in schema.names if v in views}


def _check_one(site: Any, where: str, *, schema: ViewSchema | None) -> dict[str, np.ndarray]:
    """Validate one site (or one prediction input) and return its views as C-contiguous float64 arrays."""
    pairs = _view_pairs(site, where)
    views: dict[str, np.ndarray] = {}
    n_rows: dict[str, int] = {}
    for view, raw in pairs:
        if not isinstance(view, str) or not view:
            raise ValueError(f"{where}: view names must be non-empty strings, got {view!r}")
        if view in views:
            raise ValueError(f"{where}: view {view!r} is given twice")
        if schema is not None and view not in schema:
            raise ValueError(f"{where}: unknown view {view!r}; the schema has views {list(schema.names)}")
        X = _as_float_matrix(raw, f"{where}, view {view!r}")
        if schema is not None and X.shape[1] != schema.dim(view):
            raise ValueError(
                f"{where}, view {view!r}: {X.shape[1]} columns, but the schema says dimension {schema.dim(view)}"
            )
        views[view] = X
        n_rows[view] = X.shape[0]
    if len(set(n_rows.values())) > 1:
        raise ValueError(
            f"{where}: the views have different numbers of rows {n_rows}; every view needs one row per subject"
        )
    if views and next(iter(n_rows.values())) == 0:
        raise ValueError(f"{where}: the site has zero rows (view {next(iter(views))!r})")
    for view, X in views.items():
        _check_values(X, f"{where}, view {view!r}")
    return views


def _is_frame(raw: Any) -> bool:
    """A pandas DataFrame (or anything that looks like one), without importing pandas."""
    return hasattr(raw, "dtypes") and hasattr(raw, "to_numpy") and hasattr(raw, "columns")


def feature_names(sites: Sequence[Any], site_names: Sequence[str] | None = None) -> dict[str, tuple[str, ...]]:
    """Column names of the views that sites give as DataFrames, ``{view: names}``.

    Views given as arrays have no names and are left out.  ValueError when two sites name a
    view's columns differently (a different order included): the columns would be mixed up.
    """
    names: dict[str, tuple[str, ...]] = {}
    first: dict[str, str] = {}
    for s, site in enumerate(sites):
        where = _site_label(s, site_names)
        for view, raw in _view_pairs(site, where):
            if not _is_frame(raw):
                continue
            columns = tuple(str(c) for c in raw.columns)
            if view in names and columns != names[view]:
                raise ValueError(
                    f"{where}, view {view!r}: columns {list(columns)} differ from those of {first[view]} "
                    f"{list(names[view])}; give every site the same columns in the same order"
                )
            names.setdefault(view, columns)
            first.setdefault(view, where)
    return names


def check_feature_names(fitted: Mapping[str, Sequence[str]], X: Any, name: str = "X") -> None:
    """Refuse DataFrame views of ``X`` whose columns differ from the names seen in fit (as scikit-learn does)."""
    for view, raw in _view_pairs(X, name):
        if view in fitted and _is_frame(raw):
            columns = tuple(str(c) for c in raw.columns)
            if columns != tuple(fitted[view]):
                raise ValueError(
                    f"{name}, view {view!r}: columns {list(columns)} differ from those seen in fit {list(fitted[view])}; "
                    "select them in that order"
                )


def _view_pairs(site: Any, where: str) -> list[tuple[Any, Any]]:
    """``(view, array)`` pairs of a mapping or of a sequence of pairs."""
    if isinstance(site, Mapping):
        return list(site.items())
    if isinstance(site, Sequence) and not isinstance(site, (str, bytes)):
        pairs = list(site)
        if all(isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str) for p in pairs):
            return [(p[0], p[1]) for p in pairs]
    raise ValueError(
        f"{where}: expected a mapping 'view name -> array (n, d)' or a sequence of (view name, array) pairs, "
        f"got {type(site).__name__}"
    )


def _as_float_matrix(raw: Any, where: str) -> np.ndarray:
    """One view as a C-contiguous float64 (n, d) array (no copy if it is one), refusing non-numeric content."""
    if _is_frame(raw):
        bad = [str(col) for col, dt in zip(raw.columns, raw.dtypes) if getattr(dt, "kind", "O") not in "biuf"]
        if bad:
            raise ValueError(f"{where}: non-numeric DataFrame column(s) {bad}; convert or drop them first")
        try:
            arr = raw.to_numpy(dtype=np.float64, na_value=np.nan)
        except (TypeError, ValueError):  # pandas' own text may quote a cell: not repeated
            raise ValueError(f"{where}: cannot convert the DataFrame to float64") from None
    elif hasattr(raw, "dtype") and hasattr(raw, "to_numpy") and not isinstance(raw, np.ndarray):
        raise ValueError(f"{where}: a 1-D pandas Series was given; a view must be 2-D (n, d), e.g. series.to_frame()")
    else:
        arr = np.asarray(raw)
        if arr.dtype.kind == "O":
            flat = arr.ravel()
            bad = next((i for i, v in enumerate(flat) if not _is_real_number(v)), None)
            if bad is not None:
                at = f"row {bad // arr.shape[1]}, column {bad % arr.shape[1]}" if arr.ndim == 2 else f"flat position {bad}"
                raise ValueError(  # the value itself is not quoted: error text may cross a site boundary
                    f"{where}: non-numeric value (of type {type(flat[bad]).__name__}) at {at}; views must hold numbers"
                )
        elif arr.dtype.kind not in "biuf":
            raise ValueError(f"{where}: non-numeric array of dtype {arr.dtype}; views must hold real numbers")
    if arr.ndim != 2:
        raise ValueError(f"{where}: expected a 2-D array (n, d), got shape {arr.shape}")
    if arr.shape[1] == 0:
        raise ValueError(f"{where}: the view has no column")
    return np.ascontiguousarray(arr, dtype=np.float64)


def _is_real_number(v: Any) -> bool:
    return isinstance(v, (numbers.Real, np.bool_)) and not isinstance(v, (str, bytes))


def _check_values(X: np.ndarray, where: str) -> None:
    """Refuse inf, partially-NaN rows and a view with no observed row.

    A row with a finite sum holds neither NaN nor inf, so only the other rows are inspected
    (one pass over the data, no data-sized temporary).
    """
    suspect = np.flatnonzero(~np.isfinite(X.sum(axis=1)))
    block = X[suspect]
    inf = np.isinf(block)
    if inf.any():
        r, c = np.argwhere(inf)[0]
        raise ValueError(f"{where}: {int(inf.sum())} infinite value(s), first at row {suspect[r]}, column {c}")
    nan = np.isnan(block)
    partial = nan.any(axis=1) & ~nan.all(axis=1)
    if partial.any():
        rows = suspect[partial]
        raise ValueError(
            f"{where}: {rows.size} row(s) partially NaN, first at row {rows[0]}; a subject either has all "
            f"features of a view or none (mark the whole row NaN)"
        )
    if X.shape[0] > 0 and suspect.size == X.shape[0] and nan.all():
        raise ValueError(f"{where}: every row is NaN; leave the view out of the site's mapping instead")


def _missing_rows(X: np.ndarray) -> np.ndarray:
    """Boolean (n,) mask of subjects lacking the view (entirely-NaN rows)."""
    missing = np.isnan(X[:, 0])
    missing[missing] = np.isnan(X[missing]).all(axis=1)
    return missing


def _check_n_components(n_components: Any, schema: ViewSchema) -> None:
    if isinstance(n_components, bool) or not isinstance(n_components, numbers.Integral) or n_components < 1:
        raise ValueError(f"n_components must be a positive integer, got {n_components!r}")
    k = int(np.argmax(schema.dims))
    if n_components >= schema.dims[k]:
        raise ValueError(
            f"n_components={n_components} must be smaller than the largest view dimension: "
            f"view {schema.names[k]!r} has dimension {schema.dims[k]}"
        )
