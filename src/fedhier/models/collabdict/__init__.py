"""CollabDict: decentralised sparse GGM mixture for collaborative anomaly detection (spec collabdict).

Modules: :mod:`.graphs` (peer graphs, spectra, step size, stopping rule), :mod:`.consensus`
(average consensus, chunking, agreement), :mod:`.ggm` (local/global updates), :mod:`.scores`
(anomaly scores), :mod:`.rdp` (Rényi-DP release of the means), :mod:`.diversity` (entropy
l-diversity monitor), :mod:`.protocol` (the rounds as declared protocols), :mod:`.datasets`
(bundled real data).  The estimator is :class:`fedhier.estimators.collab.CollabDict`.
"""
