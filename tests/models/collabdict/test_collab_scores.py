"""Overall and variable-wise anomaly scores (spec §6) against scipy."""

import numpy as np
import pytest
from scipy.stats import multivariate_normal, norm

from fedhier.models.collabdict.scores import score_expected, score_logloss, variable_scores


@pytest.fixture
def mixture():
    rng = np.random.default_rng(0)
    K, M = 3, 4
    mu = rng.normal(size=(K, M))
    prec = []
    for _ in range(K):
        a = rng.normal(size=(M, M))
        prec.append(a @ a.T + M * np.eye(M))
    return rng.normal(size=(25, M)), mu, np.stack(prec), np.array([0.5, 0.3, 0.2])


def test_logloss_is_negative_log_mixture_density(mixture):
    X, mu, prec, w = mixture
    dens = sum(w[k] * multivariate_normal(mu[k], np.linalg.inv(prec[k])).pdf(X) for k in range(3))
    assert np.allclose(score_logloss(X, mu, prec, w), -np.log(dens))


def test_expected_score_is_logloss_minus_kl(mixture):
    X, mu, prec, w = mixture
    comp = np.stack([multivariate_normal(mu[k], np.linalg.inv(prec[k])).pdf(X) for k in range(3)], axis=1)
    r = w * comp / (w * comp).sum(axis=1, keepdims=True)
    eq20 = -(r * np.log(comp)).sum(axis=1)
    kl = (r * np.log(r / w)).sum(axis=1)
    assert np.allclose(score_expected(X, mu, prec, w), eq20)
    assert np.allclose(score_expected(X, mu, prec, w), score_logloss(X, mu, prec, w) - kl)


def test_variable_scores_single_component_use_gaussian_conditionals(mixture):
    X, mu, prec, _ = mixture
    cov = np.linalg.inv(prec[0])
    got = variable_scores(X, mu[:1], prec[:1], np.ones(1))
    for i in range(4):
        rest = [j for j in range(4) if j != i]
        s_ir = cov[i, rest]
        s_rr_inv = np.linalg.inv(cov[np.ix_(rest, rest)])
        cmean = mu[0, i] + (X[:, rest] - mu[0, rest]) @ s_rr_inv @ s_ir
        cvar = cov[i, i] - s_ir @ s_rr_inv @ s_ir
        assert np.allclose(got[:, i], -norm(cmean, np.sqrt(cvar)).logpdf(X[:, i]))
    assert np.allclose(variable_scores(X, mu[:1], prec[:1], np.ones(1), kind="expected"), got)


def test_variable_scores_gated_by_responsibilities(mixture):
    X, mu, prec, w = mixture
    comp = np.stack([multivariate_normal(mu[k], np.linalg.inv(prec[k])).pdf(X) for k in range(3)], axis=1)
    r = w * comp / (w * comp).sum(axis=1, keepdims=True)
    per_comp = np.stack([variable_scores(X, mu[k:k + 1], prec[k:k + 1], np.ones(1)) for k in range(3)], axis=1)
    assert np.allclose(variable_scores(X, mu, prec, w), -np.log((r[:, :, None] * np.exp(-per_comp)).sum(axis=1)))
    assert np.allclose(variable_scores(X, mu, prec, w, kind="expected"), (r[:, :, None] * per_comp).sum(axis=1))
    with pytest.raises(ValueError, match="kind"):
        variable_scores(X, mu, prec, w, kind="bogus")


def test_variable_score_flags_the_broken_correlation():
    # spec §12 smoke test in miniature: x1, x2 strongly correlated in training; an anomaly breaks it
    cov = np.array([[1.0, 0.9, 0], [0.9, 1.0, 0], [0, 0, 1.0]])
    prec = np.linalg.inv(cov)[None]
    normal = np.array([[1.0, 1.0, 0.5]])
    broken = np.array([[1.0, -1.0, 0.5]])
    s_norm = variable_scores(normal, np.zeros((1, 3)), prec, np.ones(1))
    s_brk = variable_scores(broken, np.zeros((1, 3)), prec, np.ones(1))
    assert s_brk[0, 0] > s_norm[0, 0] + 3 and s_brk[0, 1] > s_norm[0, 1] + 3
    assert s_brk[0, 2] == pytest.approx(s_norm[0, 2])
