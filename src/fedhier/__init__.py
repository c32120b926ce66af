"""fedhier: hierarchical probabilistic models fitted across sites whose data may not move.

Estimators (imported lazily, so ``import fedhier`` stays light):

* :class:`FedMVPPCA` -- federated multi-view probabilistic PCA (spec fed-mv-ppca);
* :class:`FedHM1Regressor`, :class:`FedHM2Regressor` -- FedLin (spec fedlin);
* :class:`CollabDict`, :class:`CollabVAE` -- serverless collaborative anomaly detection (spec collabdict);
* :func:`simulate` -- the in-process runtime for any round protocol.
"""

from importlib import import_module

__version__ = "0.1.0"

_LAZY = {
    "FedMVPPCA": "fedhier.estimators.mvppca",
    "FedHM1Regressor": "fedhier.estimators.fedlin",
    "FedHM2Regressor": "fedhier.estimators.fedlin",
    "CollabDict": "fedhier.estimators.collab",
    "CollabVAE": "fedhier.estimators.collab",
    "simulate": "fedhier.runtime.simulate",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fedhier' has no attribute {name!r}")
