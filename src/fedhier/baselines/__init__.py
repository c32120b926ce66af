"""Baselines of the Fed-mv-PPCA evaluation.

* :class:`FederatedVAE` -- VAE on concatenated views and multi-channel VAE (Antelmi et al.
  2019), linear or 2-layer, trained with FedAvg or FedProx.  Needs PyTorch (the optional
  ``torch`` extra), imported only when a baseline is fitted.
* :class:`PooledPCA`, :class:`PooledFactorAnalysis` -- the centralised anchors a user would try
  first: scikit-learn PCA / FactorAnalysis on the pooled, concatenated training views.
* :class:`TrainingMean` -- the trivial baseline: each feature predicted by its training mean.

None of the first three handles missing views: they refuse incomplete data, and the experiments report them
as "n/a" in the scenarios K and G/K.
"""

from .mean import TrainingMean
from .pooled import PooledFactorAnalysis, PooledPCA
from .vae import FederatedAveraging, FederatedVAE, torch_available

__all__ = ["FederatedVAE", "FederatedAveraging", "PooledPCA", "PooledFactorAnalysis", "TrainingMean", "torch_available"]
