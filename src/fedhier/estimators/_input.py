"""The three forms in which every estimator takes its data, shared by the families.

* a list with one entry per site (the federated form: each entry stays where it is);
* pooled rows with a site label, ``groups`` of shape (n,) as scikit-learn's ``GroupKFold`` takes it:
  row i belongs to site ``groups[i]``; the sites are the distinct labels in sorted order
  (``sites_`` of the fitted estimator);
* one array (or one mapping of views), no ``groups``: a single site, the centralised special case,
  which is what scikit-learn's own tools (``check_estimator``, ``Pipeline``) pass.

Cross-validation passes ``groups`` to the splitter only (``GroupKFold``), not to ``fit``, unless
scikit-learn's metadata routing is switched on.  An estimator constructed with ``site_column="site"``
instead reads each row's site from that column of a pandas DataFrame ``X``
(:func:`split_site_column`), which travels with the rows through every split.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from scipy.sparse import issparse
from sklearn.utils.validation import validate_data

__all__ = ["ARRAY_VIEW", "NOT_FITTED", "array_view", "site_labels", "site_of_rows", "split_site_column", "take_rows",
           "view_sites"]

#: ``msg`` of :func:`sklearn.utils.validation.check_is_fitted` for every estimator of the package.
NOT_FITTED = "this %(name)s is not fitted yet: call fit first"


def site_labels(groups: Any, n_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """``(labels (S,), site (n,))``: the distinct site labels in sorted order and each row's site index.

    ValueError unless ``groups`` is one label per row, with no missing label.
    """
    groups = np.asarray(groups)
    if groups.ndim != 1 or groups.shape[0] != n_samples:
        raise ValueError(f"groups must hold one site label per row ({n_samples},), got shape {groups.shape}")
    if groups.dtype.kind == "f" and np.isnan(groups).any():
        raise ValueError("groups holds a missing (NaN) site label; every row needs its site")
    if groups.dtype.kind == "O" and any(g is None for g in groups):
        raise ValueError("groups holds a missing (None) site label; every row needs its site")
    try:
        labels, index = np.unique(groups, return_inverse=True)
    except TypeError:  # mixed label types that do not sort
        raise ValueError("groups mixes label types that cannot be sorted (e.g. numbers and strings); use one type") from None
    return labels, index.reshape(-1)


def split_site_column(estimator: Any, X: Any, groups: Any = None, *, required: bool = True) -> tuple[Any, Any]:
    """``(X without the site column, groups)`` for an estimator whose ``site_column`` names a column of X.

    With ``site_column=None`` (the default), ``(X, groups)`` unchanged.  Otherwise X must be a pandas
    DataFrame holding that column; its values become ``groups`` (n,) and the column is not a feature.
    ValueError if X is not a DataFrame, lacks the column, or ``groups=`` is given as well; with
    ``required=False`` (prediction), X without the column is returned unchanged.
    """
    column = getattr(estimator, "site_column", None)
    if column is None or (not required and not (hasattr(X, "columns") and column in X.columns)):
        return X, groups
    name = type(estimator).__name__
    if not hasattr(X, "columns"):
        raise ValueError(f"{name}(site_column={column!r}) reads each row's site from that column of a pandas "
                         f"DataFrame; X is a {type(X).__name__}")
    if column not in X.columns:
        raise ValueError(f"{name}(site_column={column!r}): X has no column {column!r}; "
                         f"its columns are {[str(c) for c in X.columns][:10]}")
    if groups is not None:
        raise ValueError(f"{name}(site_column={column!r}) reads the sites from X; do not pass groups= as well")
    return X.drop(columns=[column]), X[column].to_numpy()


def take_rows(X: Any, rows: np.ndarray) -> Any:
    """Rows ``rows`` of an array or a pandas DataFrame (which keeps its column names)."""
    if hasattr(X, "iloc"):
        return X.iloc[rows]
    return np.asarray(X)[rows]


def site_of_rows(labels: np.ndarray, groups: Any, n_samples: int) -> np.ndarray:
    """Index into the fitted site ``labels`` of each row's label, -1 for a label not seen in fit."""
    groups = np.asarray(groups)
    if groups.ndim != 1 or groups.shape[0] != n_samples:
        raise ValueError(f"groups must hold one site label per row ({n_samples},), got shape {groups.shape}")
    lookup = {label.item() if hasattr(label, "item") else label: k for k, label in enumerate(labels)}
    return np.array([lookup.get(g.item() if hasattr(g, "item") else g, -1) for g in groups], dtype=int)


#: The view name of multi-view data given as one array (a single view).
ARRAY_VIEW = "X"


def _is_view_site_list(X: Any) -> bool:
    """True for a list of sites (mappings, or sequences of ``(view, array)`` pairs)."""
    if not isinstance(X, (list, tuple)) or not X:
        return False
    return all(
        isinstance(site, Mapping)
        or (isinstance(site, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) for p in site))
        for site in X
    )


def view_sites(estimator: Any, X: Any, groups: Any) -> list[Any]:
    """The sites of multi-view data in any form: a list of sites ``{view: array}``; pooled views with
    ``groups``; one mapping (one site); one array (one view, :data:`ARRAY_VIEW`, at one site, validated
    by scikit-learn's ``validate_data``, which sets ``n_features_in_`` / ``feature_names_in_``).

    Sets ``estimator.sites_`` and ``estimator._array_input``; the views themselves are checked later
    by :func:`fedhier.data.validation.check_sites`.
    """
    name = type(estimator).__name__
    estimator._array_input = False
    if _is_view_site_list(X):
        if groups is not None:
            raise ValueError(f"{name}.fit: give either a list of sites or groups= with pooled views, not both")
        estimator.sites_ = np.arange(len(X))
        return list(X)
    if isinstance(X, Mapping) and not issparse(X):  # scipy's dok sparse matrices are dicts
        views = dict(X)
    else:
        if isinstance(X, (list, tuple)) and X and all(np.ndim(x) == 2 for x in X):
            raise ValueError(f"{name}.fit: got a list of arrays; pass a list of sites, each a mapping "
                             "{view: array}, or one array (a single view at one site), or views with groups=")
        X = validate_data(estimator, X, ensure_min_samples=2, dtype=np.float64)
        estimator._array_input = True
        views = {ARRAY_VIEW: X}
    if groups is None:
        estimator.sites_ = np.arange(1)
        return [views]
    n = {np.shape(v)[0] for v in views.values()}
    if len(n) != 1:
        raise ValueError(f"{name}.fit: with groups=, every view needs one row per subject; got row counts {sorted(n)}")
    labels, site = site_labels(groups, n.pop())
    estimator.sites_ = labels
    return [{view: take_rows(V, np.flatnonzero(site == k)) for view, V in views.items()} for k in range(labels.size)]


def array_view(estimator: Any, X: Any) -> Any:
    """Prediction-time input of a model fitted on one array: ``{ARRAY_VIEW: X}`` checked by scikit-learn
    (feature count and names); anything else unchanged."""
    if getattr(estimator, "_array_input", False) and (not isinstance(X, Mapping) or issparse(X)):
        return {ARRAY_VIEW: validate_data(estimator, X, reset=False, dtype=np.float64)}
    return X
