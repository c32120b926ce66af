"""Record-level DP FedLin: each site releases its noisy sufficient statistics once; HM2 is post-processing.

Everything HM2 needs from a site is X^T X, X^T y, y^T y and n (:class:`~.stats.SiteStats`).
Site k (``site_release``) releases, once, the noisy moment matrix
(:func:`fedhier.privacy.analyze_gauss.release_second_moment`) of the records

    z~_i = [ clip([x_i, y_i] - centre, C) ,  C ],          sensitivity 2 C^2,

whose blocks are the centred second moments A, the sums s (times C) and the count n (times
C^2).  ``release_to_stats`` recovers, by post-processing only,

    n = M~[-1, -1] / C^2,  s = M~[:-1, -1] / C,
    sum_i [x_i, y_i][x_i, y_i]^T = A + s c^T + c s^T + n c c^T   (c = centre),

with its eigenvalues raised to at least sigma sqrt(d + 1) (sigma: the public noise sd of each
entry, sqrt(d + 1) sigma about the size of the noise matrix's eigenvalues).  The floor keeps
every residual sum of squares y^T y - 2 theta^T X^T y + theta^T X^T X theta above the noise
level, so that the noise cannot fake a perfect fit, and acts on X^T X as a ridge of the size
of the noise (as AdaSSP does, Wang 2018).  The result is split into a SiteStats.
HM2 (federated EP) then runs on the released statistics unchanged.

Choosing C: with every column of [X, y] mapped to [-1, 1] by public ranges (the intercept
column is 1), ||[x, y]|| <= sqrt(d + 1), so C = sqrt(d + 1) around centre 0 never clips.
"""

from __future__ import annotations

import numpy as np

from ...privacy.analyze_gauss import RecordDP, nearest_psd, record_vectors, release_second_moment
from ...privacy.sampling import NoiseSource
from .stats import SiteStats, check_site

__all__ = ["site_release", "release_to_stats", "check_config"]


def check_config(config: RecordDP, n_features: int) -> tuple[float, np.ndarray]:
    """(C, centre (d + 1,)) of a FedLin release; FedLin has no default bound."""
    if not isinstance(config, RecordDP):
        raise ValueError(f"privacy must be a RecordDP, got {type(config).__name__}")
    if config.clip is None:
        raise ValueError("FedLin's record-level DP needs clip, a public bound on the norm of one record [x, y] around "
                         "its centre: with every column mapped to [-1, 1] by public ranges, clip = sqrt(d + 1)")
    centre = np.full(int(n_features) + 1, 0.0 if config.centre is None else float(config.centre))
    return float(config.clip), centre


def site_release(X: np.ndarray, y: np.ndarray, config: RecordDP, noise: NoiseSource):
    """One site's release: (M~ of shape (d + 2, d + 2), GaussianDpEvent)."""
    X, y = check_site(X, y)
    clip, centre = check_config(config, X.shape[1])
    records = record_vectors(np.column_stack([X, y]) - centre, np.ones((X.shape[0], 1)), clip)
    return release_second_moment(records, config.sensitivity(clip), config.noise_multiplier, noise)


def release_to_stats(M: np.ndarray, config: RecordDP) -> SiteStats:
    """SiteStats from one site's release (module docstring); post-processing only."""
    M = np.asarray(M, dtype=float)
    d = M.shape[0] - 2
    clip, centre = check_config(config, d)
    n = max(float(M[-1, -1]) / clip**2, 1.0)
    s = M[:-1, -1] / clip
    moment = M[:-1, :-1] + np.outer(s, centre) + np.outer(centre, s) + n * np.outer(centre, centre)
    moment = nearest_psd(moment, config.noise_sd(clip) * np.sqrt(d + 1))
    return SiteStats(n=max(int(round(n)), 1), xx=moment[:d, :d].copy(), xy=moment[:d, d].copy(), yy=float(moment[d, d]))
