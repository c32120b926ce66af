"""Defaults a fit shares wherever it runs: the estimator, the command line and a Flower deployment.

Kept apart from the protocols so that reading a deployment's configuration (a ClientApp's first
step) loads no model code.
"""

#: Fed-mv-PPCA's ``tol``: a fit stops after the first round whose ``model_change`` (the change of the
#: model's predictions, :func:`fedhier.protocol.mvppca.model_settled`) is below it.
MVPPCA_TOL = 0.02
