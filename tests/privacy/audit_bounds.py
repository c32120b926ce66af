"""Empirical lower bounds on epsilon from a distinguisher's error rates (shared by the privacy audits).

(epsilon, delta)-DP implies, for every threshold t of a score,

    TPR(t) <= e^epsilon FPR(t) + delta   =>   epsilon >= ln((TPR - delta) / FPR).

The threshold is chosen on one half of the draws; on the other half Clopper--Pearson
bounds (TPR lower, FPR upper, each at level alpha/2) give an empirical lower bound on
epsilon that exceeds the true epsilon with probability at most alpha.
"""

import math

import numpy as np
from scipy import stats

ALPHA = 1e-3


def _cp_lower(k, n, level):
    return 0.0 if k == 0 else stats.beta.ppf(level, k, n - k + 1)


def _cp_upper(k, n, level):
    return 1.0 if k == n else stats.beta.ppf(1 - level, k + 1, n - k)


def _epsilon_bound(positives, negatives, threshold, delta, alpha):
    tpr = _cp_lower(int(np.sum(positives > threshold)), positives.size, alpha / 2)
    fpr = _cp_upper(int(np.sum(negatives > threshold)), negatives.size, alpha / 2)
    return math.log((tpr - delta) / fpr) if tpr > delta else -math.inf


def empirical_epsilon_lower_bound(scores_d, scores_d_prime, delta, thresholds, alpha=ALPHA):
    """Threshold chosen on the first half, bound evaluated on the second half (confidence 1 - alpha)."""
    scores_d, scores_d_prime = np.asarray(scores_d), np.asarray(scores_d_prime)
    half = scores_d.size // 2
    best = max(thresholds, key=lambda t: _epsilon_bound(scores_d[:half], scores_d_prime[:half], t, delta, alpha))
    return _epsilon_bound(scores_d[half:], scores_d_prime[half:], best, delta, alpha)
