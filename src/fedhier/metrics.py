"""Evaluation metrics of Fed-mv-PPCA (spec fed-mv-ppca §11).

* :func:`reconstruction_mae` -- mean absolute error between the observed views and their
  reconstruction, over the observed entries only (missing views do not enter).
* :func:`latent_accuracy` -- LDA (scikit-learn defaults) fitted on training latent
  means, accuracy on test latent means.
* :func:`imputation_mae` -- error of predicted values of views that were hidden.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

__all__ = ["reconstruction_mae", "latent_accuracy", "imputation_mae", "observed_rows"]


def observed_rows(X: np.ndarray) -> np.ndarray:
    """Boolean (n,) mask of the subjects that have this view (rows not all-NaN)."""
    return ~np.all(np.isnan(np.asarray(X, dtype=float)), axis=1)


def reconstruction_mae(X: Mapping[str, np.ndarray], X_hat: Mapping[str, np.ndarray]) -> float:
    """MAE = sum of |t - t_hat| over observed entries / number of observed entries (§11).

    For complete data with views O this is ``sklearn.metrics.mean_absolute_error`` on
    the n x d_O matrix; subjects lacking a view (NaN rows) contribute nothing for it.
    """
    total, count = 0.0, 0
    for view, T in X.items():
        T = np.asarray(T, dtype=float)
        rows = observed_rows(T)
        if not rows.any():
            continue
        diff = np.abs(T[rows] - np.asarray(X_hat[view], dtype=float)[rows])
        total += float(diff.sum())
        count += diff.size
    if count == 0:
        raise ValueError("no observed entries to compute the MAE on")
    return total / count


def latent_accuracy(
    latent_train: np.ndarray, labels_train: np.ndarray, latent_test: np.ndarray, labels_test: np.ndarray
) -> float:
    """Accuracy of LDA fitted on training latent means, predicting test labels (§11)."""
    lda = LinearDiscriminantAnalysis().fit(np.asarray(latent_train), np.asarray(labels_train))
    return float(np.mean(lda.predict(np.asarray(latent_test)) == np.asarray(labels_test)))


def imputation_mae(truth: np.ndarray, predicted: np.ndarray, hidden_rows: np.ndarray) -> float:
    """MAE of ``predicted`` against ``truth`` on the rows that were hidden from the model."""
    hidden_rows = np.asarray(hidden_rows, dtype=bool)
    if not hidden_rows.any():
        raise ValueError("no hidden rows to evaluate the imputation on")
    return float(np.mean(np.abs(np.asarray(truth)[hidden_rows] - np.asarray(predicted)[hidden_rows])))
