"""Multi-task VAE (spec §8): gradients by finite differences, the corrected KL sign, decentralised = star."""

import numpy as np
import pytest
from scipy.stats import norm

from fedhier.collab import CollabVAE
from fedhier.models.collabdict.vae import elbo_and_gradients, init_decoder, init_encoder, reconstruction_scores


def _setup(seed=0, n=7, M=3, d=2, H=5):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, M))
    theta = init_decoder(M, d, H, rng)
    phi = init_encoder(M, d, H, rng)
    for p in (theta, phi):  # non-zero biases so every branch is exercised
        for k, v in p.items():
            if v.ndim == 1:
                p[k] = rng.normal(scale=0.3, size=v.shape)
    return X, theta, phi, rng.standard_normal((n, d))


def test_gradients_match_finite_differences():
    X, theta, phi, v = _setup()
    _, g_theta, g_phi = elbo_and_gradients(X, theta, phi, v)
    rng = np.random.default_rng(1)
    for params, grads in ((theta, g_theta), (phi, g_phi)):
        for name in params:
            for _ in range(3):
                idx = tuple(rng.integers(0, s) for s in params[name].shape)
                h = 1e-6
                plus = {k: a.copy() for k, a in params.items()}
                minus = {k: a.copy() for k, a in params.items()}
                plus[name][idx] += h
                minus[name][idx] -= h
                args_p = (plus, phi) if params is theta else (theta, plus)
                args_m = (minus, phi) if params is theta else (theta, minus)
                fd = (elbo_and_gradients(X, *args_p, v)[0] - elbo_and_gradients(X, *args_m, v)[0]) / (2 * h)
                assert grads[name][idx] == pytest.approx(fd, rel=1e-5, abs=1e-6), name


def test_kl_term_has_the_corrected_sign():
    # with a decoder that ignores z, L^s minus the likelihood part is -KL(q || N(0, I)) (slip S8)
    X, theta, phi, _ = _setup(n=1, M=1, d=1)
    theta = {k: np.zeros_like(v) for k, v in theta.items()}
    rng = np.random.default_rng(2)
    v = rng.standard_normal((1, 1))
    elbo, _, _ = elbo_and_gradients(X, theta, phi, v)
    sigma = np.logaddexp(0, 0) + 1e-4
    loglik = norm(0, sigma).logpdf(X[0, 0])
    e = np.maximum(X @ phi["V1"].T + phi["c1"], 0)
    m = (e @ phi["V2"].T + phi["c2"]).item()
    h = (np.logaddexp(0, e @ phi["V3"].T + phi["c3"]) + 1e-4).item()
    z = rng.normal(m, h, size=400000)
    kl_mc = np.mean(norm(m, h).logpdf(z) - norm(0, 1).logpdf(z))
    assert elbo - loglik == pytest.approx(-kl_mc, abs=5e-3)


def test_reconstruction_scores_sum_to_the_mc_log_loss():
    X, theta, phi, _ = _setup()
    s1 = reconstruction_scores(X, theta, phi, np.random.default_rng(3), n_draws=4)
    rng = np.random.default_rng(3)
    total = np.zeros(X.shape[0])
    for _ in range(4):
        e = np.maximum(X @ phi["V1"].T + phi["c1"], 0)
        m, h = e @ phi["V2"].T + phi["c2"], np.logaddexp(0, e @ phi["V3"].T + phi["c3"]) + 1e-4
        z = m + h * rng.standard_normal(m.shape)
        g = np.maximum(z @ theta["W1"].T + theta["b1"], 0)
        mu, sig = g @ theta["W2"].T + theta["b2"], np.logaddexp(0, g @ theta["W3"].T + theta["b3"]) + 1e-4
        total += -norm(mu, sig).logpdf(X).sum(axis=1)
    assert np.allclose(s1.sum(axis=1), total / 4)


def _sites(seed=0):
    rng = np.random.default_rng(seed)
    basis = rng.normal(size=(2, 4))
    return [rng.normal(size=(40 + 5 * s, 2)) @ basis + 0.1 * rng.normal(size=(40 + 5 * s, 4)) for s in range(5)]


def test_decentralised_vae_equals_star_and_learns():
    sites = _sites()
    peer = CollabVAE(2, width=8, max_iter=40, random_state=1).fit(sites)
    star = CollabVAE(2, width=8, max_iter=40, random_state=1, runtime="star").fit(sites)
    for k in peer.decoder_:
        assert np.allclose(peer.decoder_[k], star.decoder_[k], atol=1e-8)
    elbo = [h["metrics"]["elbo_per_sample"] for h in peer.history_]
    assert elbo[-1] > elbo[0] + 0.5
    X = sites[1][:5]
    outlier = X + np.array([0, 0, 8.0, -8.0])
    assert np.all(peer.score_samples(outlier, site=1) > peer.score_samples(X, site=1))
    assert peer.variable_scores(outlier, site=1).shape == (5, 4)
