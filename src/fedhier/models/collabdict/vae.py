"""Multi-task VAE on CollabDict (spec §8): shared decoder, one private encoder per site.

Written in numpy with hand-derived gradients (no deep-learning framework needed).

Decoder ``theta`` (global, Eq. (23)): ``g = ReLU(W1 z + b1)``, ``mu = W2 g + b2``,
``sigma = softplus(W3 g + b3) + floor``.  Encoder ``phi^s`` (private, §8.1 [R]):
``e = ReLU(V1 x + c1)``, ``m = V2 e + c2``, ``h = softplus(V3 e + c3) + floor``.
Objective (§8.2, sign of ``m^2`` corrected, slip S8), one reparameterised draw ``z = h v + m``:

    L^s = sum_n { 1/2 sum_j [1 + ln h_j^2 - h_j^2 - m_j^2] + ln N(x | mu(z), diag sigma(z)^2) }.

Shapes: ``X`` ``(n, M)``, latent ``(n, d)``, hidden width ``H``.  Parameter dictionaries map
names to arrays: decoder ``W1 (H, d), b1 (H,), W2 (M, H), b2 (M,), W3 (M, H), b3 (M,)``;
encoder ``V1 (H, M), c1 (H,), V2 (d, H), c2 (d,), V3 (d, H), c3 (d,)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["decoder_shapes", "encoder_shapes", "init_decoder", "init_encoder", "elbo_and_gradients",
           "reconstruction_scores", "check_n_draws"]

_LOG_2PI = np.log(2.0 * np.pi)
FLOOR = 1e-4  # variance floor of §8.3 [R], applied to sigma and h


def decoder_shapes(n_features: int, n_latent: int, width: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the decoder parameters ``theta``."""
    return {"W1": (width, n_latent), "b1": (width,), "W2": (n_features, width), "b2": (n_features,),
            "W3": (n_features, width), "b3": (n_features,)}


def encoder_shapes(n_features: int, n_latent: int, width: int) -> dict[str, tuple[int, ...]]:
    """Shapes of a site's encoder parameters ``phi^s``."""
    return {"V1": (width, n_features), "c1": (width,), "V2": (n_latent, width), "c2": (n_latent,),
            "V3": (n_latent, width), "c3": (n_latent,)}


def _init(shapes: dict[str, tuple[int, ...]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name, shape in shapes.items():
        out[name] = rng.normal(0.0, 1.0 / np.sqrt(shape[1]), size=shape) if len(shape) == 2 else np.zeros(shape)
    return out


def init_decoder(n_features: int, n_latent: int, width: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Common-seed decoder initialisation (scaled Gaussian weights, zero biases)."""
    return _init(decoder_shapes(n_features, n_latent, width), rng)


def init_encoder(n_features: int, n_latent: int, width: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A site's private encoder initialisation."""
    return _init(encoder_shapes(n_features, n_latent, width), rng)


def _softplus(u: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, u)


def _sigmoid(u: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * u))


def _decode(theta, z):
    g_pre = z @ theta["W1"].T + theta["b1"]
    g = np.maximum(g_pre, 0.0)
    mu = g @ theta["W2"].T + theta["b2"]
    s_pre = g @ theta["W3"].T + theta["b3"]
    return g_pre, g, mu, s_pre, _softplus(s_pre) + FLOOR


def _encode(phi, X):
    e_pre = X @ phi["V1"].T + phi["c1"]
    e = np.maximum(e_pre, 0.0)
    m = e @ phi["V2"].T + phi["c2"]
    h_pre = e @ phi["V3"].T + phi["c3"]
    return e_pre, e, m, h_pre, _softplus(h_pre) + FLOOR


def elbo_and_gradients(X: np.ndarray, theta: dict[str, np.ndarray], phi: dict[str, np.ndarray],
                       noise: np.ndarray) -> tuple[float, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``L^s`` of §8.2 for one draw ``v = noise`` ``(n, d)`` and its gradients (for ascent).

    Returns
    -------
    elbo : float
        ``L^s`` summed over the rows of ``X``.
    grad_theta : dict
        ``dL^s/dtheta`` (the site's reply in §8.3 step 1).
    grad_phi : dict
        ``dL^s/dphi^s``.
    """
    e_pre, e, m, h_pre, h = _encode(phi, X)
    z = h * noise + m
    g_pre, g, mu, s_pre, sigma = _decode(theta, z)
    resid = X - mu
    elbo = float(0.5 * np.sum(1.0 + 2.0 * np.log(h) - h**2 - m**2)
                 - 0.5 * np.sum(_LOG_2PI + 2.0 * np.log(sigma) + resid**2 / sigma**2))
    d_mu = resid / sigma**2
    d_s = (-1.0 / sigma + resid**2 / sigma**3) * _sigmoid(s_pre)
    d_g_pre = (d_mu @ theta["W2"] + d_s @ theta["W3"]) * (g_pre > 0)
    grad_theta = {"W1": d_g_pre.T @ z, "b1": d_g_pre.sum(0), "W2": d_mu.T @ g, "b2": d_mu.sum(0),
                  "W3": d_s.T @ g, "b3": d_s.sum(0)}
    d_z = d_g_pre @ theta["W1"]
    d_m = -m + d_z
    d_h_pre = (1.0 / h - h + d_z * noise) * _sigmoid(h_pre)
    d_e_pre = (d_m @ phi["V2"] + d_h_pre @ phi["V3"]) * (e_pre > 0)
    grad_phi = {"V1": d_e_pre.T @ X, "c1": d_e_pre.sum(0), "V2": d_m.T @ e, "c2": d_m.sum(0),
                "V3": d_h_pre.T @ e, "c3": d_h_pre.sum(0)}
    return elbo, grad_theta, grad_phi


def check_n_draws(n_draws: Any) -> None:
    """Refuse a number of Monte Carlo draws of the score that is not a positive integer."""
    if isinstance(n_draws, bool) or not isinstance(n_draws, (int, np.integer)) or n_draws < 1:
        raise ValueError(f"n_draws must be a positive integer, got {n_draws!r}")


def reconstruction_scores(X: np.ndarray, theta: dict[str, np.ndarray], phi: dict[str, np.ndarray],
                          rng: np.random.Generator, n_draws: int = 32) -> np.ndarray:
    """Variable-wise scores of §8.4 [R], shape ``(n, M)``; their row sums are Eq. (39).

    ``a_i(x) = 1/J sum_j [1/2 ln(2 pi sigma_i^2(z_j)) + (x_i - mu_i(z_j))^2 / (2 sigma_i^2(z_j))]``
    with ``z_j ~ N(m(x), diag h(x)^2)`` (``J = n_draws >= 32`` recommended).  Every row uses the same
    J standard normal draws (``z_j = m(x) + h(x) eps_j``), so a row's score does not depend on the
    other rows of ``X``.
    """
    check_n_draws(n_draws)
    _, _, m, _, h = _encode(phi, X)
    acc = np.zeros_like(X, dtype=float)
    for _ in range(int(n_draws)):
        z = m + h * rng.standard_normal((1, m.shape[1]))
        _, _, mu, _, sigma = _decode(theta, z)
        acc += 0.5 * (_LOG_2PI + 2.0 * np.log(sigma)) + (X - mu) ** 2 / (2.0 * sigma**2)
    return acc / n_draws
