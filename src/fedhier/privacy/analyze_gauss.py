"""Record-level DP by a one-shot release of a noisy second-moment matrix ("Analyze Gauss").

Dwork, Talwar, Thakurta & Zhang (STOC 2014): a site holding records z_1, ..., z_n releases

    M~ = sum_i z~_i z~_i^T + E,        E symmetric, E_ab = E_ba ~ N(0, sigma^2) i.i.d. for a <= b,

once; every later use of M~ (means, covariances, regression statistics, a model fitted on
them) is post-processing and costs nothing more.  Here a record is one subject and

    z~_i = [ clip(x_i - centre, C) ,  c * o_i ]

* ``x_i - centre``: the subject's values around a *public* centre (e.g. 0.5 for data scaled
  to [0, 1] with public ranges), with unobserved entries set to 0, scaled down to norm at
  most the public clipping bound ``C`` (:func:`clip_rows`);
* ``o_i``: 0/1 indicators (one per view, or a single 1), weighted by ``c = C / sqrt(m)``
  for ``m`` indicators.  Their block of M~ holds the (noisy) counts, and the cross block
  the sums, so subjects missing a view are handled by per-view-pair blocks with their own
  counts.

Sensitivity.  Neighbouring data sets differ by adding or removing one record
(dp_accounting's ``ADD_OR_REMOVE_ONE``), which changes M by z~ z~^T.  The release is the
upper triangle (diagonal included) of M~, whose change has l2 norm

    sqrt(sum_{a <= b} z~_a^2 z~_b^2) <= ||z~||^2 <= C^2 + m c^2 = 2 C^2,

so the Gaussian mechanism with noise multiplier z (calibrated by
:func:`fedhier.privacy.calibration.gaussian_noise_multiplier`, analytic) uses
sigma = z * 2 C^2 and is recorded as ``GaussianDpEvent(z)`` (:func:`release_second_moment`).

Choosing C.  C is public and must not be read off the data.  For data scaled to [0, 1]
with public ranges and centred at 0.5, every entry lies in [-1/2, 1/2], so C = sqrt(d) / 2
never clips (d = number of columns); a smaller C lowers the noise (sigma grows as C^2)
but shrinks the records longer than C, which biases the statistics.  Fed-mv-PPCA's default
is sqrt(d) / 6, the norm of a typical row when min--max scaling spans about six standard
deviations of each feature: a third of sqrt(d) / 2, so a ninth of its noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from dp_accounting import dp_event

from .calibration import gaussian_noise_multiplier
from .sampling import NoiseSource, lattice_gaussian

__all__ = ["RecordDP", "clip_rows", "record_vectors", "second_moment", "release_second_moment", "nearest_psd"]


@dataclass(frozen=True)
class RecordDP:
    """Record-level DP by one release of DP sufficient statistics per site (module docstring).

    Parameters
    ----------
    epsilon, delta : float
        The (epsilon, delta) of the site's single release: epsilon > 0, delta in (0, 1).
    clip : float or None
        Public bound C on the norm of one record around ``centre`` (module docstring).
        None: the model's default for data scaled to [0, 1] (Fed-mv-PPCA: sqrt(d) / 6
        around 0.5); FedLin has no default and requires it.
    centre : float or None
        Public centre of the records (None: the model's default, 0.5 for Fed-mv-PPCA, 0 for
        FedLin).
    unit : {"record", "site"}
        What the release protects.  "record" (default): adding or removing one subject.
        "site": the whole site's data set of at most ``max_records`` records, by the same
        one-shot release with sensitivity ``2 * max_records * 2 C^2`` (any two data sets
        of that size differ by at most that much); for comparison with site-level DP.
    max_records : int or None
        Public bound on a site's number of records, required with ``unit="site"``.
    """

    epsilon: float
    delta: float
    clip: float | None = None
    centre: float | None = None
    unit: Literal["record", "site"] = "record"
    max_records: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be a positive finite number, got {self.epsilon!r}")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")
        if self.clip is not None and not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be a positive finite number or None, got {self.clip!r}")
        if self.centre is not None and not math.isfinite(self.centre):
            raise ValueError(f"centre must be a finite number or None, got {self.centre!r}")
        if self.unit not in ("record", "site"):
            raise ValueError(f"unit must be 'record' or 'site', got {self.unit!r}")
        if self.unit == "site" and (isinstance(self.max_records, bool) or not isinstance(self.max_records, int)
                                    or self.max_records < 1):
            raise ValueError("unit='site' needs max_records, a public bound on a site's number of records")

    @property
    def noise_multiplier(self) -> float:
        """z of the single Gaussian release (analytic calibration, Balle & Wang 2018)."""
        return gaussian_noise_multiplier(float(self.epsilon), float(self.delta), "analytic")

    def event(self) -> dp_event.GaussianDpEvent:
        """The ``dp_accounting`` event of one site's release."""
        return dp_event.GaussianDpEvent(self.noise_multiplier)

    def sensitivity(self, clip: float) -> float:
        """l2 sensitivity of the released upper triangle for records clipped to ``clip`` (module docstring)."""
        per_record = 2.0 * float(clip) ** 2
        return per_record if self.unit == "record" else 2.0 * self.max_records * per_record

    def noise_sd(self, clip: float) -> float:
        """Standard deviation of the noise on each released entry of M~."""
        return self.noise_multiplier * self.sensitivity(clip)


def clip_rows(values: np.ndarray, bound: float) -> np.ndarray:
    """Rows of ``values (n, D)`` scaled by ``min(1, bound / ||row||)``: every row's norm is at most ``bound``."""
    values = np.asarray(values, dtype=float)
    norms = np.linalg.norm(values, axis=1)
    scale = np.minimum(1.0, bound / np.maximum(norms, np.finfo(float).tiny))
    return values * scale[:, None]


def record_vectors(values: np.ndarray, indicators: np.ndarray, clip: float) -> np.ndarray:
    """z~_i = [clip(values_i, C), c o_i] with c = C / sqrt(m) (module docstring); shape (n, D + m).

    ``values (n, D)``: the records around their public centre, unobserved entries 0;
    ``indicators (n, m)``: 0/1.
    """
    indicators = np.asarray(indicators, dtype=float)
    weight = float(clip) / math.sqrt(indicators.shape[1])
    return np.hstack([clip_rows(values, clip), weight * indicators])


def second_moment(records: np.ndarray) -> np.ndarray:
    """M = sum_i z~_i z~_i^T of ``records (n, D)``; shape (D, D)."""
    records = np.asarray(records, dtype=float)
    return records.T @ records


def release_second_moment(
    records: np.ndarray, sensitivity: float, noise_multiplier: float, noise: NoiseSource,
) -> tuple[np.ndarray, dp_event.GaussianDpEvent]:
    """M~ = M + E (module docstring): symmetric Gaussian noise of sd ``noise_multiplier * sensitivity``.

    Parameters
    ----------
    records : (n, D) the z~_i, already clipped (so that ``sensitivity`` holds).
    sensitivity : l2 sensitivity of the upper triangle of M (2 C^2 for :func:`record_vectors`).
    noise_multiplier : z, the event records exactly this number.
    noise : the site's source of secrets (:class:`~fedhier.privacy.sampling.NoiseSource`); the
        upper triangle gets discrete Gaussian noise on a lattice (:func:`~fedhier.privacy.sampling.lattice_gaussian`).

    Every entry is noised, a coordinate whose records are all zero (e.g. a view no subject at
    the site measures) as much as any other: an exact zero would tell that no subject has it.

    Returns
    -------
    noisy : ndarray (D, D), symmetric
    event : ``GaussianDpEvent(noise_multiplier)``
    """
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be positive and finite, got {sensitivity!r}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be positive and finite, got {noise_multiplier!r}")
    M = second_moment(records)
    if not np.all(np.isfinite(M)):
        raise ValueError("the records contain NaN or infinite entries")
    D = M.shape[0]
    rows, cols = np.triu_indices(D)
    released_upper = lattice_gaussian(M[rows, cols], noise_multiplier, sensitivity, noise)
    noisy = np.zeros(released_upper.shape[:-1] + (D, D))
    noisy[..., rows, cols] = released_upper
    noisy[..., cols, rows] = released_upper
    return noisy, dp_event.GaussianDpEvent(float(noise_multiplier))


def nearest_psd(matrix: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """The symmetric part of ``matrix`` with its eigenvalues raised to at least ``floor`` (post-processing)."""
    sym = 0.5 * (np.asarray(matrix, dtype=float) + np.asarray(matrix, dtype=float).T)
    values, vectors = np.linalg.eigh(sym)
    return (vectors * np.maximum(values, floor)) @ vectors.T
