"""CollabDict rounds for the GGM mixture as declared protocols (spec §2, §5, §11).

* :class:`MomentsProtocol`: one round of §5.6 step 1 -- the sites' counts, sums and sums of
  squares give the global mean and standard deviation used to standardise everywhere.
* :class:`GGMMixtureProtocol`: Algorithm 1 -- ``site_step`` is ``local_update`` (plus the
  l-diversity monitor of §11), the combined reply is the sum of the intermediate statistics
  ``theta^s = {N_k^s, m_k^s, C_k^s}``, ``global_step`` is ``optimize`` (Eqs. (14)-(16)
  with pruning).

Both combine by ``"sum"``, so they run unchanged on the star simulator
(:func:`fedhier.runtime.simulate.simulate`, exact sums: the centralised reference) and on
the serverless runtimes (:mod:`fedhier.runtime.peer`, :mod:`fedhier.runtime.mpi`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .base import RoundProtocol, SiteContext, SiteError
from .messages import Field, Message, MessageSpec
from ..models.collabdict.diversity import diversity_level, mitigation_noise, paper_sample_weights_entropy, sample_weights_entropy
from ..models.collabdict.ggm import global_update, initial_dictionary, l0_weights, local_update, pack_symmetric, unpack_symmetric

__all__ = ["MomentsProtocol", "GGMMixtureProtocol", "VAEProtocol", "DiversityRecord", "TrainingDiverged", "check_site_matrix",
           "standardise"]


class TrainingDiverged(SiteError, FloatingPointError):
    """A site's gradient steps gave a non-finite ELBO or gradient (its text holds no data value)."""


def check_site_matrix(site: int, data: Any, n_features: int | None = None) -> np.ndarray:
    """Validate one site's samples: a finite 2-D float array ``(N^s, M)`` with ``N^s >= 2``."""
    X = np.asarray(data, dtype=float)
    if X.ndim != 2:
        raise ValueError(f"site {site}: data must be a 2-D array (n_samples, n_features), got shape {X.shape}")
    if X.shape[0] < 2:
        raise ValueError(f"site {site}: needs at least 2 samples, got {X.shape[0]}")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"site {site}: expected {n_features} variables, got {X.shape[1]}")
    if not np.all(np.isfinite(X)):
        raise ValueError(f"site {site}: data contain NaN or inf ({int(np.sum(~np.isfinite(X)))} entries)")
    return X


def standardise(X: np.ndarray, center: np.ndarray, scale: np.ndarray, clip_norm: float | None = None) -> np.ndarray:
    """``(x - center) / scale``, then optionally ``x <- x min(1, clip_norm / ||x||_2)`` (assumption A1)."""
    Z = (np.asarray(X, dtype=float) - center) / scale
    if clip_norm is not None:
        norms = np.linalg.norm(Z, axis=1, keepdims=True)
        Z = Z * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))
    return Z


class MomentsProtocol(RoundProtocol):
    """Spec §5.6 step 1: consensus on ``(N^s, sum_n x, sum_n x*x)`` gives mean and scale."""

    name = "collab-moments"
    combine = "sum"

    def __init__(self, n_features: int) -> None:
        self.n_features = int(n_features)

    @property
    def reply_spec(self) -> MessageSpec:
        m = self.n_features
        return MessageSpec("collab-moments-reply", {"n": Field(()), "sum": Field((m,)), "sumsq": Field((m,))})

    @property
    def broadcast_spec(self) -> MessageSpec:
        m = self.n_features
        return MessageSpec("collab-moments-broadcast",
                           {"center": Field((m,)), "scale": Field((m,)), "n_total": Field(())})

    def initial_broadcast(self) -> Message:
        return {"center": np.zeros(self.n_features), "scale": np.ones(self.n_features), "n_total": np.float64(0.0)}

    def validate_site_data(self, site: int, data: Any) -> None:
        check_site_matrix(site, data, self.n_features)

    def site_step(self, ctx: SiteContext, broadcast: Message) -> Message:
        X = check_site_matrix(ctx.site, ctx.data, self.n_features)
        return {"n": np.float64(X.shape[0]), "sum": X.sum(axis=0), "sumsq": (X * X).sum(axis=0)}

    def global_step(self, combined, round, previous) -> Message:
        n = float(combined["n"])
        center = combined["sum"] / n
        var = np.maximum(combined["sumsq"] / n - center**2, 0.0)
        scale = np.sqrt(var)
        scale[scale < 1e-12] = 1.0  # constant variable: leave it unscaled
        return {"center": center, "scale": scale, "n_total": np.float64(n)}


@dataclass(frozen=True)
class DiversityRecord:
    """One l-diversity check (spec §11): site, round, ``E^s``, threshold ``ln l_0``, breach."""

    site: int
    round: int
    level: float
    threshold: float
    breached: bool
    mitigated: int


class GGMMixtureProtocol(RoundProtocol):
    """Algorithm 1 for the sparse GGM mixture (spec §5) with the §11 monitor.

    Parameters
    ----------
    n_features, n_components : int
        ``M`` and ``K``.
    center, scale : ndarray (M,)
        Public standardisation from :class:`MomentsProtocol`.
    rho : float
        l1 strength on ``Lambda_k`` (Eq. (8)).
    lambda0 : float
        Gauss-Laplace prior strength (A3: > 0); ``m0 = 0`` on standardised data.
    n_min : float
        Pruning threshold on ``Nbar_k`` (the paper's ``delta``); if every component falls
        below it, the heaviest one is kept [R].
    weights : {"local", "shared"}
        ``"local"``: private ``pi^s = N_k^s / N^s`` (Eq. (13), the paper);
        ``"shared"``: one global ``pi_k = Nbar_k / N`` (a single pooled mixture).
    l0_penalty : float or None
        Use the l0-sparse weights of §5.5 with this ``tau`` (local weights only).
    seed : int
        Common seed of the initial dictionary (§5.6).
    ell0 : float
        l-diversity threshold ``l_0`` (capped at ``N^s``).
    diversity_rule : {"min", "max"}
        ``E^s = min_k H_k^s`` [R] or ``max_k`` [P].
    diversity_weights : {"responsibility", "paper"}
        ``g = r/N_k^s`` [R] or Eq. (47) [P].
    mitigate : bool
        On a breach add ``zeta ~ N(0, lambda_k Lambda_k^{-1})`` to the concentrated ``m_k^s`` (O15).
    clip_norm : float or None
        Clip standardised samples to this l2 norm (enforces A1 with ``R = 2 clip_norm``).
    tol : float
        Convergence: max abs change of ``(mu_k, Lambda_k)`` (§5.7).
    glasso_tol : float
        Duality-gap tolerance of the graphical-lasso step.
    """

    name = "collab-ggm"
    combine = "sum"

    def __init__(self, n_features: int, n_components: int, center: np.ndarray, scale: np.ndarray, *, rho: float = 0.8,
                 lambda0: float = 1.0, n_min: float = 5.0, weights: str = "local", l0_penalty: float | None = None,
                 seed: int = 0, ell0: float = 10.0, diversity_rule: str = "min",
                 diversity_weights: str = "responsibility", mitigate: bool = True, clip_norm: float | None = None,
                 tol: float = 1e-4, glasso_tol: float = 1e-4) -> None:
        if weights not in ("local", "shared"):
            raise ValueError(f"weights must be 'local' or 'shared', got {weights!r}")
        if diversity_weights not in ("responsibility", "paper"):
            raise ValueError(f"diversity_weights must be 'responsibility' or 'paper', got {diversity_weights!r}")
        if lambda0 <= 0 or rho < 0 or n_min <= 0:
            raise ValueError(f"need lambda0 > 0, rho >= 0, n_min > 0; got {lambda0}, {rho}, {n_min}")
        self.n_features, self.n_components = int(n_features), int(n_components)
        self.center, self.scale = np.asarray(center, float), np.asarray(scale, float)
        self.rho, self.lambda0, self.n_min = float(rho), float(lambda0), float(n_min)
        self.weights, self.l0_penalty, self.seed = weights, l0_penalty, int(seed)
        self.ell0, self.diversity_rule, self.diversity_weights = float(ell0), diversity_rule, diversity_weights
        self.mitigate, self.clip_norm, self.tol = bool(mitigate), clip_norm, float(tol)
        self.glasso_tol = float(glasso_tol)
        self.m0 = np.zeros(self.n_features)
        #: l-diversity checks run by the sites of this process (site-local log, never sent)
        self.diversity_log: list[DiversityRecord] = []

    @property
    def reply_spec(self) -> MessageSpec:
        k, m = self.n_components, self.n_features
        return MessageSpec("collab-ggm-reply", {
            "n": Field((k,)), "m": Field((k, m)), "c": Field((k, m * (m + 1) // 2))})

    @property
    def broadcast_spec(self) -> MessageSpec:
        k, m = self.n_components, self.n_features
        return MessageSpec("collab-ggm-model", {
            "mu": Field((k, m)), "precision": Field((k, m, m)), "sigma": Field((k, m, m)),
            "n_bar": Field((k,)), "active": Field((k,), "bool"), "weights": Field((k,)), "change": Field(())})

    def initial_broadcast(self) -> Message:
        mu, prec = initial_dictionary(self.n_components, self.n_features, self.seed)
        k = self.n_components
        return {"mu": mu, "precision": prec, "sigma": prec.copy(), "n_bar": np.zeros(k),
                "active": np.ones(k, dtype=bool), "weights": np.full(k, 1.0 / k),
                "change": np.float64(np.finfo(float).max)}

    def validate_site_data(self, site: int, data: Any) -> None:
        check_site_matrix(site, data, self.n_features)

    def transform(self, X: np.ndarray) -> np.ndarray:
        """Public standardisation (and clipping) applied at every site."""
        return standardise(X, self.center, self.scale, self.clip_norm)

    def site_step(self, ctx: SiteContext, broadcast: Message) -> Message:
        X = self.transform(check_site_matrix(ctx.site, ctx.data, self.n_features))
        active = broadcast["active"]
        if self.weights == "shared":
            pi = broadcast["weights"]
        else:
            pi = ctx.state.get("weights", np.full(self.n_components, 1.0 / self.n_components))
        pi = np.where(active, pi, 0.0)
        if pi.sum() <= 0:
            pi = active / active.sum()
        resp, pi_new, (n, m, c) = local_update(X, broadcast["mu"], broadcast["precision"], pi / pi.sum(), active)
        if self.l0_penalty is not None and self.weights == "local":
            pi_new = np.where(active, l0_weights(np.where(active, n, 0.0), self.l0_penalty,
                                                 1.0 / (100 * self.n_components)), 0.0)
        ctx.state["weights"] = pi_new / pi_new.sum()
        m = self._monitor(ctx, X, resp, broadcast, n, m)
        return {"n": n, "m": m, "c": pack_symmetric(c)}

    def _monitor(self, ctx: SiteContext, X, resp, broadcast, n, m) -> np.ndarray:
        """Spec §11: entropy l-diversity of ``m_k^s`` before it enters consensus."""
        active = broadcast["active"] & (n > 0)
        if self.diversity_weights == "paper":
            entropy = paper_sample_weights_entropy(X, broadcast["mu"], broadcast["precision"])
        else:
            entropy = sample_weights_entropy(resp)
        threshold = float(np.log(min(self.ell0, X.shape[0])))
        level = diversity_level(entropy, active, self.diversity_rule) if active.any() else float(np.log(X.shape[0]))
        breached = level < threshold
        concentrated = active & (entropy < threshold)
        if breached and self.mitigate and concentrated.any():
            noise = mitigation_noise(broadcast["precision"], broadcast["n_bar"], self.lambda0, ctx.noise)
            m = m + np.where(concentrated[:, None], noise, 0.0)
        self.diversity_log.append(DiversityRecord(ctx.site, ctx.round, level, threshold, bool(breached),
                                                  int(concentrated.sum()) if breached and self.mitigate else 0))
        ctx.state["diversity_level"] = np.float64(level)
        return m

    def global_step(self, combined, round, previous) -> Message:
        n_bar = np.asarray(combined["n"], dtype=float)
        active = previous["active"] & (n_bar >= self.n_min)
        if not active.any():  # [R] never prune the whole dictionary: keep the heaviest component
            active = np.zeros_like(active)
            active[np.argmax(np.where(previous["active"], n_bar, -np.inf))] = True
        safe_n = np.where(active, n_bar, 1.0)
        m_bar = combined["m"] / safe_n[:, None]
        c_bar = unpack_symmetric(combined["c"], self.n_features) / safe_n[:, None, None]
        mu, prec, sigma = global_update(n_bar, m_bar, c_bar, rho=self.rho, lambda0=self.lambda0, m0=self.m0,
                                        active=active, glasso_tol=self.glasso_tol)
        mu = np.where(active[:, None], mu, previous["mu"])
        prec = np.where(active[:, None, None], prec, previous["precision"])
        sigma = np.where(active[:, None, None], sigma, previous["sigma"])
        change = max(float(np.max(np.abs(mu - previous["mu"])[active])),
                     float(np.max(np.abs(prec - previous["precision"])[active])))
        weights = np.where(active, n_bar, 0.0)
        return {"mu": mu, "precision": prec, "sigma": sigma, "n_bar": np.where(active, n_bar, 0.0), "active": active,
                "weights": weights / weights.sum(), "change": np.float64(change)}

    def round_metrics(self, combined, round) -> dict[str, float]:
        n_bar = np.asarray(combined["n"], dtype=float)
        return {"n_total": float(n_bar.sum()), "n_retained": float(np.sum(n_bar >= self.n_min))}

    def converged(self, broadcast: Message) -> bool:
        """Stopping rule (§5.7): max abs change of ``(mu_k, Lambda_k)`` below ``tol``."""
        return float(broadcast["change"]) < self.tol


def check_vae_options(n_latent: int, width: int, learning_rate: float, local_steps: int,
                      max_grad_norm: float | None) -> None:
    """Refuse VAE settings that cannot train, with the offending value named."""
    for name, value in (("n_latent", n_latent), ("width", width), ("local_steps", local_steps)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not float(learning_rate) > 0:
        raise ValueError(f"learning_rate must be positive, got {learning_rate!r}")
    if max_grad_norm is not None and not float(max_grad_norm) > 0:
        raise ValueError(f"max_grad_norm must be positive or None, got {max_grad_norm!r}")


class VAEProtocol(RoundProtocol):
    """Algorithm 1 for the multi-task VAE (spec §8.3), on standardised data.

    ``site_step``: ``local_steps`` gradient-ascent steps on the site's private encoder
    (kept in the site state, never sent), then the decoder gradient ``theta^s`` at the
    updated encoder.  The reply is ``(N^s, theta^s)``; ``global_step`` is
    ``theta <- theta + eta * clip(sum_s theta^s / sum_s N^s)`` (normalised by ``N``, O17), run
    identically at every site.  Full-batch, one Monte Carlo draw (``J = 1``), gradient
    ascent without optimiser state (the paper's update).

    ``clip(g) = g * min(1, max_grad_norm / ||g||)`` scales a per-sample average gradient
    (the encoder's at each local step, the aggregated decoder's) to a global L2 norm of at
    most ``max_grad_norm`` [R].  Without it (``max_grad_norm=None``, the paper's update) a
    decoder standard deviation near the floor makes ``(x - mu)^2 / sigma^3`` explode and the
    fit diverges in its first rounds for most initialisations; the clip is deterministic, so
    every site still applies the same decoder update.

    Parameters
    ----------
    n_features, center, scale : as :class:`GGMMixtureProtocol`
    n_latent, width : int
        ``d`` and the hidden width ``H`` (§8.3 defaults: d in [3, 8], H = 100).
    learning_rate : float
        ``eta`` applied to per-sample average gradients.
    local_steps : int
        Encoder steps per round (§8.3: 1-5).
    seed : int
        Common seed of the decoder initialisation.
    max_grad_norm : float or None
        Clip of the per-sample average gradients (default 10; ``None``: no clip, the paper's update).
    """

    name = "collab-vae"
    combine = "sum"

    def __init__(self, n_features: int, center: np.ndarray, scale: np.ndarray, *, n_latent: int = 3,
                 width: int = 32, learning_rate: float = 0.05, local_steps: int = 2, seed: int = 0,
                 max_grad_norm: float | None = 10.0) -> None:
        from ..models.collabdict.vae import decoder_shapes

        check_vae_options(n_latent, width, learning_rate, local_steps, max_grad_norm)
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.n_features, self.n_latent, self.width = int(n_features), int(n_latent), int(width)
        self.center, self.scale = np.asarray(center, float), np.asarray(scale, float)
        self.learning_rate, self.local_steps, self.seed = float(learning_rate), int(local_steps), int(seed)
        self.shapes = decoder_shapes(self.n_features, self.n_latent, self.width)

    @property
    def reply_spec(self) -> MessageSpec:
        return MessageSpec("collab-vae-reply", {"n": Field(()), "elbo": Field(()),
                                                **{k: Field(v) for k, v in self.shapes.items()}})

    @property
    def broadcast_spec(self) -> MessageSpec:
        return MessageSpec("collab-vae-decoder", {"elbo_per_sample": Field(()),
                                                  **{k: Field(v) for k, v in self.shapes.items()}})

    def initial_broadcast(self) -> Message:
        from ..models.collabdict.vae import init_decoder

        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=(8,))))
        return {"elbo_per_sample": np.float64(0.0),
                **init_decoder(self.n_features, self.n_latent, self.width, rng)}

    def validate_site_data(self, site: int, data: Any) -> None:
        check_site_matrix(site, data, self.n_features)

    def decoder(self, broadcast: Message) -> dict[str, np.ndarray]:
        return {k: np.asarray(broadcast[k]) for k in self.shapes}

    def site_step(self, ctx: SiteContext, broadcast: Message) -> Message:
        from ..models.collabdict.vae import elbo_and_gradients, encoder_shapes, init_encoder

        X = standardise(check_site_matrix(ctx.site, ctx.data, self.n_features), self.center, self.scale)
        enc_keys = list(encoder_shapes(self.n_features, self.n_latent, self.width))
        if not ctx.state:
            ctx.state.update(init_encoder(self.n_features, self.n_latent, self.width, ctx.rng))
        phi = {k: ctx.state[k] for k in enc_keys}
        theta = self.decoder(broadcast)
        n = X.shape[0]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # divergence is reported below
            for _ in range(self.local_steps):
                _, _, grad_phi = elbo_and_gradients(X, theta, phi, ctx.rng.standard_normal((n, self.n_latent)))
                step = self._clip({k: grad_phi[k] / n for k in enc_keys})
                phi = {k: phi[k] + self.learning_rate * step[k] for k in enc_keys}
            elbo, grad_theta, _ = elbo_and_gradients(X, theta, phi, ctx.rng.standard_normal((n, self.n_latent)))
        if not (np.isfinite(elbo) and all(np.all(np.isfinite(g)) for g in grad_theta.values())):
            raise TrainingDiverged(
                f"the VAE diverged at site {ctx.site} (non-finite ELBO or gradient): lower learning_rate"
                + (" or set max_grad_norm" if self.max_grad_norm is None else " or max_grad_norm"))
        ctx.state.update(phi)
        return {"n": np.float64(n), "elbo": np.float64(elbo), **grad_theta}

    def _clip(self, grad: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``grad`` scaled to a global L2 norm of at most ``max_grad_norm`` (unchanged if None or within it)."""
        if self.max_grad_norm is None:
            return grad
        norm = float(np.sqrt(sum(np.sum(g * g) for g in grad.values())))
        if not norm > self.max_grad_norm:  # also leaves a non-finite gradient to the divergence check
            return grad
        return {k: g * (self.max_grad_norm / norm) for k, g in grad.items()}

    def global_step(self, combined, round, previous) -> Message:
        n = float(combined["n"])
        step = self._clip({k: combined[k] / n for k in self.shapes})
        out = {k: previous[k] + self.learning_rate * step[k] for k in self.shapes}
        return {"elbo_per_sample": np.float64(float(combined["elbo"]) / n), **out}

    def round_metrics(self, combined, round) -> dict[str, float]:
        return {"elbo_per_sample": float(combined["elbo"]) / float(combined["n"])}
