"""The estimators, one module per family, each a scikit-learn estimator fitted across sites.

* :class:`~fedhier.estimators.mvppca.FedMVPPCA` -- federated multi-view probabilistic PCA;
* :class:`~fedhier.estimators.fedlin.FedHM1Regressor`, :class:`~fedhier.estimators.fedlin.FedHM2Regressor`
  -- federated hierarchical linear regression;
* :class:`~fedhier.estimators.collab.CollabDict`, :class:`~fedhier.estimators.collab.CollabVAE` -- serverless
  collaborative anomaly detection.

Import a family's module (``from fedhier.estimators.fedlin import FedHM2Regressor``) or the class from the
package root (``from fedhier import FedHM2Regressor``); either loads only that family.
"""
