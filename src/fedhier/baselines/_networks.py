"""PyTorch networks of the VAE baselines (spec fed-mv-ppca §12.5, §14 row 27).

Imported only when a baseline is fitted, so that fedhier works without torch.

* :class:`ConcatVAE` -- one encoder and one decoder on the concatenated views.
* :class:`MultiChannelVAE` -- Antelmi et al. (ICML 2019): one encoder and one decoder
  per view; the latent distribution of every view must reconstruct every view.

Both use Gaussian encoders q(z | x) = N(m(x), diag exp(l(x))) with a N(0, I) prior and
Gaussian decoders p(x_j | z) = N(f_j(z), diag exp(lambda_j)) with a learned per-feature
log-variance lambda_j.  "Linear" networks are one affine map; "2-layer" networks have one
hidden layer of ``hidden`` units (ReLU) in both encoder and decoder.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

__all__ = ["ConcatVAE", "MultiChannelVAE", "build_network"]

#: initial observation log-variance lambda_j; the data are min-max scaled to [0, 1] (§14 row 1)
INITIAL_LOG_VARIANCE = math.log(0.05)
_LOG_2PI = math.log(2 * math.pi)


def _map(n_in: int, n_out: int, hidden: int | None) -> nn.Module:
    if hidden is None:
        return nn.Linear(n_in, n_out)
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))


def _gaussian_nll(x: torch.Tensor, mean: torch.Tensor, log_var: torch.Tensor) -> torch.Tensor:
    """-sum of ln N(x_i; mean_i, diag exp(log_var)) over rows i and features (a scalar).

    ``x`` is (n, d); ``mean`` is (n, d) or (K, n, d), K decoder means scored against the same
    rows.  Written as 0.5 (rows d ln 2 pi + rows sum(log_var) + ||(mean - x) exp(-log_var / 2)||^2)
    so that only the scaled residual is an array of the data's size.
    """
    scaled = (mean - x) * torch.exp(-0.5 * log_var)
    rows = scaled.numel() // log_var.numel()
    return 0.5 * (scaled.numel() * _LOG_2PI + rows * log_var.sum() + (scaled * scaled).sum())


def _kl_standard(mean: torch.Tensor, log_var: torch.Tensor) -> torch.Tensor:
    """Sum over rows of KL(N(mean, diag exp(log_var)) || N(0, I)) (a scalar)."""
    return 0.5 * (torch.exp(log_var) + mean**2 - 1.0 - log_var).sum()


class _Decoder(nn.Module):
    def __init__(self, n_components: int, dim: int, hidden: int | None):
        super().__init__()
        self.mean = _map(n_components, dim, hidden)
        self.log_var = nn.Parameter(torch.full((dim,), INITIAL_LOG_VARIANCE, dtype=torch.float64))


class ConcatVAE(nn.Module):
    """VAE on the concatenation of the views (dims in view order)."""

    def __init__(self, dims: Sequence[int], n_components: int, hidden: int | None):
        super().__init__()
        self.dims = list(dims)
        self.n_components = n_components
        self.encoder = _map(sum(self.dims), 2 * n_components, hidden)
        self.decoder = _Decoder(n_components, sum(self.dims), hidden)

    def encode(self, views: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.encoder(torch.cat(list(views), dim=1))
        return out[:, : self.n_components], out[:, self.n_components :]

    def negative_elbo(self, views: Sequence[torch.Tensor], generator: torch.Generator) -> torch.Tensor:
        """Mean over rows of -ELBO with one reparameterised draw."""
        x = torch.cat(list(views), dim=1)
        mean, log_var = self.encode(views)
        z = mean + torch.exp(0.5 * log_var) * torch.randn(mean.shape, generator=generator, dtype=mean.dtype)
        return (_gaussian_nll(x, self.decoder.mean(z), self.decoder.log_var) + _kl_standard(mean, log_var)) / x.shape[0]

    def latent(self, views: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.encode(views)[0]

    def reconstruct(self, views: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        full = self.decoder.mean(self.latent(views))
        return list(torch.split(full, self.dims, dim=1))


class MultiChannelVAE(nn.Module):
    """Multi-channel VAE (Antelmi et al. 2019): per-view encoders and decoders.

    -ELBO = sum_k [ KL(q(z | x_k) || p(z)) - sum_j E_{q(z | x_k)} ln p(x_j | z) ];
    the latent of a subject is the average of the view-wise encoder means and the
    reconstruction is the decoders' mean at that latent (§14 row 27).
    """

    def __init__(self, dims: Sequence[int], n_components: int, hidden: int | None):
        super().__init__()
        self.dims = list(dims)
        self.n_components = n_components
        self.encoders = nn.ModuleList(_map(d, 2 * n_components, hidden) for d in self.dims)
        self.decoders = nn.ModuleList(_Decoder(n_components, d, hidden) for d in self.dims)

    def encode(self, views: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        q = self.n_components
        return [(out[:, :q], out[:, q:]) for out in (enc(x) for enc, x in zip(self.encoders, views))]

    def negative_elbo(self, views: Sequence[torch.Tensor], generator: torch.Generator) -> torch.Tensor:
        """Mean over rows of -ELBO, one reparameterised draw per view-wise encoder.

        The K encoders' outputs and draws are stacked into one (K n, q) batch, so the KL term
        is one computation and each decoder runs once on all K draws; its (K, n, d_j) means are
        scored against the view's (n, d_j) rows by broadcasting, instead of once per
        (encoder, decoder) pair (fewer autograd nodes: ``benchmarks/bench_vae.py``).
        """
        n, q, K = views[0].shape[0], self.n_components, len(views)
        out = torch.stack([enc(x) for enc, x in zip(self.encoders, views)]).reshape(K * n, 2 * q)
        mean, log_var = out[:, :q], out[:, q:]
        noise = torch.cat([torch.randn((n, q), generator=generator, dtype=out.dtype) for _ in range(K)])
        z = mean + torch.exp(0.5 * log_var) * noise
        total = _kl_standard(mean, log_var)
        for dec, x in zip(self.decoders, views):
            total = total + _gaussian_nll(x, dec.mean(z).view(K, n, -1), dec.log_var)
        return total / n

    def latent(self, views: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.stack([mean for mean, _ in self.encode(views)]).mean(dim=0)

    def reconstruct(self, views: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        z = self.latent(views)
        return [dec.mean(z) for dec in self.decoders]


def build_network(model: str, dims: Sequence[int], n_components: int, hidden: int | None) -> nn.Module:
    """``"vae"`` -> :class:`ConcatVAE`, ``"mcvae"`` -> :class:`MultiChannelVAE` (float64)."""
    cls = {"vae": ConcatVAE, "mcvae": MultiChannelVAE}[model]
    return cls(dims, n_components, hidden).double()
