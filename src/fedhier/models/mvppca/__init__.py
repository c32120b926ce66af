"""Fed-mv-PPCA: federated hierarchical multi-view probabilistic PCA (spec fed-mv-ppca).

Numerical core, on numpy arrays (no transport, no privacy):

* :mod:`.local` -- one site's round: EM / MAP-EM (§4), the E-step, the local objective J_c;
* :mod:`.mstep` -- the single-view M-step updates of §4.3;
* :mod:`.master` -- the master's ML step from summed site statistics (§5);
* :mod:`.invgamma` -- the inverse-gamma ML1 estimator (§5.2);
* :mod:`.predictive` -- projection, reconstruction, imputation, likelihood, sampling (§9, §10);
* :mod:`.waic` -- WAIC for choosing q (§10);
* :mod:`.params` -- the parameter containers shared by all of the above.
"""

from .local import LocalFit, e_step, fit_local, local_objective
from .master import (
    data_independent_prior,
    global_step,
    global_step_from_params,
    invgamma_mle,
    invgamma_mle_from_statistics,
    relative_change,
    site_statistics,
    statistic_shapes,
)
from .params import GlobalParams, GlobalView, LocalParams, ViewParams, point_model
from .predictive import (
    hierarchical_predictive_variance,
    impute,
    impute_covariance,
    impute_variance,
    latent_posterior,
    marginal_loglik,
    model_change,
    reconstruct,
    sample,
    sample_hierarchical,
)
from .waic import waic, waic_site_terms

__all__ = [
    "ViewParams", "GlobalView", "LocalParams", "GlobalParams", "point_model",
    "LocalFit", "fit_local", "e_step", "local_objective",
    "statistic_shapes", "site_statistics", "global_step", "global_step_from_params", "data_independent_prior",
    "relative_change",
    "invgamma_mle", "invgamma_mle_from_statistics",
    "latent_posterior", "reconstruct", "impute", "impute_variance", "impute_covariance",
    "hierarchical_predictive_variance", "marginal_loglik", "model_change", "sample", "sample_hierarchical",
    "waic", "waic_site_terms",
]
