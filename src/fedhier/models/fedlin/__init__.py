"""FedLin: federated hierarchical linear regression (spec ``fedlin.md``).

Modules: :mod:`.stats` (site data and sufficient statistics), :mod:`.hm1` (Algorithm 1),
:mod:`.natural` (Gaussians in natural parameters), :mod:`.hierarchy` (closed-form HM2
instances), :mod:`.lasso` (Bayesian lasso sampler), :mod:`.tilted` (tilted moments, device
posteriors), :mod:`.ep` (Algorithm 3 updates), :mod:`.inference` (intervals, tests, selection,
metrics), :mod:`.baselines`, :mod:`.datasets`.
"""

from .baselines import ditto_personalise, fit_centralised_ols, fit_separate, mixedlm_pooled
from .ep import converged, damped_update, site_update
from .hierarchy import BayesianRidge, GaussianHierarchy
from .hm1 import hm1_objective, local_steps, prior_shrinkage, shrinkage_message, update_omega
from .lasso import BayesianLasso
from .stats import SiteStats
from .tilted import DevicePosterior, TiltedResult, device_posterior, tilted_moments

__all__ = [
    "BayesianLasso",
    "BayesianRidge",
    "DevicePosterior",
    "GaussianHierarchy",
    "SiteStats",
    "TiltedResult",
    "converged",
    "damped_update",
    "device_posterior",
    "ditto_personalise",
    "fit_centralised_ols",
    "fit_separate",
    "hm1_objective",
    "local_steps",
    "mixedlm_pooled",
    "prior_shrinkage",
    "shrinkage_message",
    "site_update",
    "tilted_moments",
    "update_omega",
]
