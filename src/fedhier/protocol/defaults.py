"""Defaults a fit shares wherever it runs: the estimator, the command line and a Flower deployment.

Kept apart from the protocols so that reading a deployment's configuration (a ClientApp's first
step) loads no model code.
"""

#: Fed-mv-PPCA's ``tol``: a fit stops after the first round whose ``model_change`` (the change of the
#: model's predictions, :func:`fedhier.protocol.mvppca.model_settled`) is below it.
MVPPCA_TOL = 0.02

#: Fed-mv-PPCA's latent dimension when ``n_components`` is None, if the views are wide enough.
MVPPCA_COMPONENTS = 5


def default_n_components(widest: int) -> int:
    """``n_components=None``: :data:`MVPPCA_COMPONENTS`, or one fewer than the widest view's number of features
    (``widest``) if that is smaller, so that every fit leaves a noise dimension in some view."""
    return min(MVPPCA_COMPONENTS, widest - 1)
