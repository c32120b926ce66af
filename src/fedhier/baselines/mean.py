"""The trivial baseline of every utility table: each feature predicted by its training mean.

For every view, the mean of each feature over the subjects of all training sites that have
the view,

.. math::  \\bar t_{k} = \\sum_c \\sum_{n \\in \\mathcal O_{c,k}} t^{(c)}_{n,k} \\Big/ \\sum_c |\\mathcal O_{c,k}| ,

which a federation gets for the price of one round of per-feature sums and counts.  A method
whose test MAE is not below this one's has learnt nothing about the data that a column average
does not already give.  It has no latent space (``has_latent = False``: no LDA accuracy).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..data.validation import check_sites

__all__ = ["TrainingMean"]


class TrainingMean:
    """Predict every feature of every view by its mean over the training sites' observed subjects.

    Attributes
    ----------
    means_ : dict ``view -> (d_view,)``
    """

    has_latent = False

    def fit(self, sites: Sequence[Mapping[str, Any]]) -> "TrainingMean":
        """Per-view feature means over all sites (subjects lacking a view do not count for it).

        Raises
        ------
        ValueError
            If no site observes some view of the schema.
        """
        sites, schema = check_sites(sites, min_subjects=1)
        self.means_ = {}
        for view, d in zip(schema.names, schema.dims):
            total, count = np.zeros(d), 0
            for site in sites:
                X = site.get(view)
                if X is None:
                    continue
                rows = ~np.all(np.isnan(X), axis=1)
                total += X[rows].sum(axis=0)
                count += int(rows.sum())
            if count == 0:
                raise ValueError(f"no training site observes view {view!r}")
            self.means_[view] = total / count
        return self

    def reconstruct(self, X: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """``{view: (n, d_view)}``: the training means, for every view of ``X``."""
        if not hasattr(self, "means_"):
            raise RuntimeError("this TrainingMean is not fitted yet: call fit(sites) first")
        out = {}
        for view, T in X.items():
            if view not in self.means_:
                raise ValueError(f"view {view!r} was not seen in training")
            out[view] = np.tile(self.means_[view], (np.asarray(T).shape[0], 1))
        return out
