"""One training step of the multi-channel VAE baseline: ours vs the per-pair reference.

Run:  python benchmarks/bench_vae.py

The mc-VAE loss needs every decoder on every encoder's draw (K^2 decoder passes for K
views).  ``MultiChannelVAE.negative_elbo`` stacks the K draws and runs each decoder once;
the reference below is the literal double loop.  Both share the same network and draws
(their losses agree to rounding, checked here).  Shapes: the bundled Alzheimer views
(3, 4, 124 features), 33 rows per site (6 sites), and the UCI digits' six views
(76, 216, 64, 240, 47, 6), 222 rows per site (6 sites); q = 5 and 10, width 64, float64,
one thread, Adam.  Prints milliseconds per step (forward, backward, Adam) and the ratio,
the best of 5 repetitions of 200 steps each, both measured in this run.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from fedhier.baselines._networks import MultiChannelVAE, _gaussian_nll, _kl_standard, build_network


def reference_negative_elbo(net: MultiChannelVAE, views, generator) -> torch.Tensor:
    """The literal loss: decoder j on encoder k's draw, for every pair (k, j)."""
    total = 0.0
    for mean, log_var in net.encode(views):
        z = mean + torch.exp(0.5 * log_var) * torch.randn(mean.shape, generator=generator, dtype=mean.dtype)
        total = total + _kl_standard(mean, log_var)
        for dec, x in zip(net.decoders, views):
            total = total + _gaussian_nll(x, dec.mean(z), dec.log_var)
    return total.mean()


def ms_per_step(loss_fn, dims, n_rows, q, steps=200, repeats=5) -> float:
    rng = np.random.default_rng(0)
    views = [torch.from_numpy(rng.random((n_rows, d))) for d in dims]
    best = np.inf
    for _ in range(repeats):
        torch.manual_seed(0)
        net = build_network("mcvae", dims, q, 64)
        optimiser = torch.optim.Adam(net.parameters(), lr=1e-3, foreach=True)
        generator = torch.Generator().manual_seed(0)
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = loss_fn(net, views, generator)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        best = min(best, (time.perf_counter() - t0) / steps * 1e3)
    return best


def main() -> None:
    torch.set_num_threads(1)
    for name, dims, n_rows, q in (("Alzheimer", (3, 4, 124), 33, 5), ("UCI digits", (76, 216, 64, 240, 47, 6), 222, 10)):
        net = build_network("mcvae", dims, q, 64)
        views = [torch.rand(n_rows, d, dtype=torch.float64) for d in dims]
        ours = net.negative_elbo(views, torch.Generator().manual_seed(1))
        ref = reference_negative_elbo(net, views, torch.Generator().manual_seed(1))
        assert torch.allclose(ours, ref, rtol=1e-12), (float(ours), float(ref))
        t_ours = ms_per_step(lambda n, v, g: n.negative_elbo(v, g), dims, n_rows, q)
        t_ref = ms_per_step(reference_negative_elbo, dims, n_rows, q)
        print(f"{name:11s} {len(dims)} views: ours {t_ours:6.2f} ms/step, per-pair reference {t_ref:6.2f} ms/step, "
              f"ratio {t_ref / t_ours:.2f}x")


if __name__ == "__main__":
    main()
