"""The three forms in which every estimator takes its data, shared by the families.

* a list with one entry per site (the federated form: each entry stays where it is);
* pooled rows with a site label, ``groups`` of shape (n,) as scikit-learn's ``GroupKFold`` takes it:
  row i belongs to site ``groups[i]``; the sites are the distinct labels in sorted order
  (``sites_`` of the fitted estimator);
* one array (or one mapping of views), no ``groups``: a single site, the centralised special case,
  which is what scikit-learn's own tools (``check_estimator``, ``Pipeline``) pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["NOT_FITTED", "site_labels", "site_of_rows", "take_rows"]

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
