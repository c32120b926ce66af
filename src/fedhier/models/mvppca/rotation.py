"""The canonical rotation of Fed-mv-PPCA's latent space.

The model t_k = W_k x + mu_k + eps_k with x ~ N(0, I_q) does not change when the latent space turns:
for any orthogonal R (q, q), the loadings W_k R with the latent x' = R^T x give every view the same
distribution, since R^T x ~ N(0, I_q) as well.  The hierarchical prior vec W_c ~ N(vec W~, sigma2_W I)
is isotropic, so it too is unchanged when W~ and every site's W_c turn together.  A fit therefore ends
at an arbitrary rotation of its factors, and the third factor of two fits, or of a fit and PCA, can
differ by any angle while the models are the same.

The canonical rotation removes that freedom.  Stack the global loadings of the views,
W = [W~_1; ...; W~_K] of shape (D, q) with D = sum_k d_k, and take its singular value decomposition
W = U S V^T.  Turning by R = V gives W R = U S: columns that are orthogonal, ordered by S^2 (the
variance of the views that each factor explains, summed over the views), each column's sign chosen
so that its largest entry in magnitude is positive.  For one view this is the PPCA solution of
Tipping & Bishop written on the principal axes, the same axes as PCA's ``components_``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .params import GlobalParams

__all__ = ["canonical_rotation", "rotate"]


def canonical_rotation(glob: GlobalParams) -> np.ndarray:
    """The orthogonal R (q, q) that puts the stacked global loadings W (D, q) on their principal axes.

    W R = U S (the thin SVD W = U S V^T, R = V with signs fixed): orthogonal columns in decreasing
    order of their squared norm, each with its largest-magnitude entry positive.
    """
    W = np.vstack([g.W for g in glob.values()])
    _, _, Vt = np.linalg.svd(W, full_matrices=False)
    R = Vt.T
    WR = W @ R
    largest = WR[np.argmax(np.abs(WR), axis=0), np.arange(R.shape[1])]
    return R * np.where(largest < 0, -1.0, 1.0)


def rotate(glob: GlobalParams, R: np.ndarray) -> GlobalParams:
    """Every view's global loadings turned by R: W~_k -> W~_k R; the other parameters are invariant."""
    return {view: replace(g, W=g.W @ R) for view, g in glob.items()}
