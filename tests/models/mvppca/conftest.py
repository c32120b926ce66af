"""Shared helpers for the Fed-mv-PPCA core tests: random models and their data."""

import numpy as np
import pytest
from scipy.linalg import block_diag

from fedhier.models.mvppca import ViewParams


def random_model(dims, q, noise, rng, scale=1.5):
    """A point model {view: ViewParams} with the given view dimensions and noise variances."""
    return {
        f"v{k}": ViewParams(mu=rng.normal(size=d), W=scale * rng.normal(size=(d, q)), sigma2=float(s2))
        for k, (d, s2) in enumerate(zip(dims, noise))
    }


def stacked(model, views):
    """Stacked mu^O (d_O,), W^O (d_O, q), and covariance W W^T + Psi (d_O, d_O) of §2.2, built densely."""
    mu = np.concatenate([model[v].mu for v in views])
    W = np.vstack([model[v].W for v in views])
    psi = block_diag(*[model[v].sigma2 * np.eye(model[v].dim) for v in views])
    return mu, W, W @ W.T + psi


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)


@pytest.fixture
def make_model():
    return random_model


@pytest.fixture
def stack():
    return stacked
