"""One local training step of the VAE baselines: ours vs the literal reference.

Run:  python benchmarks/bench_vae.py

A site step of FedAvg / FedProx is 15 epochs of Adam on mini-batches of 32 rows
(``FederatedAveraging.site_step``).  The steps are small, so their cost is mostly the
number of autograd nodes, optimiser calls and passes over arrays of the data's size.  Ours:

* the Gaussian log-likelihood is summed as 0.5 (rows d ln 2 pi + rows sum(log_var) + ||scaled
  residual||^2), so only the residual (mean - x) exp(-log_var / 2) is an array of the data's size;
* the site concatenates its views once and takes each mini-batch's rows with one index;
* the multi-channel VAE stacks its K encoders' outputs and draws into one (K n, q) batch:
  one KL computation, and each decoder runs once on all K draws and is scored against the
  view's rows by broadcasting;
* the FedProx term's gradient lambda (theta - anchor) is added after the backward pass;
* Adam is the fused CPU kernel.

The reference is the literal formulation: the per-row density formula, each view indexed
per mini-batch, a decoder pass and a likelihood term for every (encoder, decoder) pair, the
proximal term inside the loss on the flattened parameters, and Adam's foreach kernel.  Both
start from the same parameters and use the same draws; the benchmark checks their final
parameters agree to 1e-9 and prints seconds per site step (best of 3) and the ratio, both
measured in this run.  Shapes: the bundled Alzheimer views (3, 4, 124 features) and the SD
views (15, 8, 10) with q = 5, the UCI digits' six views (76, 216, 64, 240, 47, 6) with
q = 10; 90 rows per site in mini-batches of 32, and for the digits also 444 rows in one full
batch (a site at C = 3 in ``fedhier experiment mvppca-mfeat``; full batch is one of the
settings its baselines' tuning tries); linear and width 64, float64, one thread.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from fedhier.baselines.vae import FederatedAveraging
from fedhier.data.schema import ViewSchema
from fedhier.protocol.base import SiteContext


def literal_nll(x, mean, log_var) -> torch.Tensor:
    """-ln N(x; mean, diag exp(log_var)) per row, written as the density's formula."""
    return 0.5 * (math.log(2 * math.pi) + log_var + (x - mean) ** 2 / torch.exp(log_var)).sum(dim=1)


def literal_kl(mean, log_var) -> torch.Tensor:
    """KL(N(mean, diag exp(log_var)) || N(0, I)) per row."""
    return 0.5 * (torch.exp(log_var) + mean**2 - 1.0 - log_var).sum(dim=1)


def draw(mean, log_var, generator) -> torch.Tensor:
    return mean + torch.exp(0.5 * log_var) * torch.randn(mean.shape, generator=generator, dtype=mean.dtype)


def reference_concat_elbo(net, views, generator) -> torch.Tensor:
    """The literal VAE loss on the concatenated views, per-row terms averaged."""
    x = torch.cat(list(views), dim=1)
    mean, log_var = net.encode(views)
    nll = literal_nll(x, net.decoder.mean(draw(mean, log_var, generator)), net.decoder.log_var)
    return (nll + literal_kl(mean, log_var)).mean()


def reference_multichannel_elbo(net, views, generator) -> torch.Tensor:
    """The literal mc-VAE loss: decoder j on encoder k's draw, for every pair (k, j)."""
    total = 0.0
    for mean, log_var in net.encode(views):
        z = draw(mean, log_var, generator)
        total = total + literal_kl(mean, log_var)
        for dec, x in zip(net.decoders, views):
            total = total + literal_nll(x, dec.mean(z), dec.log_var)
    return total.mean()


def reference_site_step(protocol: FederatedAveraging, ctx: SiteContext, broadcast) -> np.ndarray:
    """The site step written literally (module docstring); returns the final parameters."""
    net = protocol.network()
    anchor = torch.from_numpy(np.array(broadcast["params"], dtype=np.float64))
    torch.nn.utils.vector_to_parameters(anchor.clone(), net.parameters())
    generator = torch.Generator().manual_seed(int(ctx.rng.integers(2**63 - 1)))
    views = [torch.from_numpy(ctx.data[v]) for v in protocol.schema.names]
    n = views[0].shape[0]
    optimiser = torch.optim.Adam(net.parameters(), lr=protocol.learning_rate, foreach=True)
    loss_fn = reference_multichannel_elbo if protocol.model == "mcvae" else reference_concat_elbo
    batch = n if protocol.batch_size is None else protocol.batch_size
    for _ in range(protocol.n_epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch):
            rows = order[start : start + batch]
            loss = loss_fn(net, [x[rows] for x in views], generator)
            if protocol.proximal > 0:
                theta = torch.nn.utils.parameters_to_vector(net.parameters())
                loss = loss + 0.5 * protocol.proximal * torch.sum((theta - anchor) ** 2)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    return torch.nn.utils.parameters_to_vector(net.parameters()).detach().numpy()


def seconds(step, repeats: int = 3) -> tuple[float, np.ndarray]:
    best, out = np.inf, None
    for _ in range(repeats):
        t0 = time.thread_time()
        out = step()
        best = min(best, time.thread_time() - t0)
    return best, out


def main() -> None:
    torch.set_num_threads(1)
    digits = ((76, 216, 64, 240, 47, 6), 10)
    for data_name, (dims, q), n_rows, batch_size in (
        ("Alzheimer", ((3, 4, 124), 5), 90, 32),
        ("SD", ((15, 8, 10), 5), 90, 32),
        ("UCI digits", digits, 90, 32),
        ("UCI digits, full batch", digits, 444, None),
    ):
        schema = ViewSchema(tuple(f"view{k}" for k in range(len(dims))), dims)
        rng = np.random.default_rng(0)
        data = {v: rng.random((n_rows, d)) for v, d in zip(schema.names, dims)}
        for model in ("vae", "mcvae"):
            for hidden in (None, 64):
                for proximal in (0.0, 0.1):
                    protocol = FederatedAveraging(
                        schema, q, model=model, hidden=hidden, n_epochs=15, learning_rate=1e-3,
                        batch_size=batch_size, proximal=proximal, init_seed=0,
                    )
                    broadcast = protocol.initial_broadcast()

                    def ctx():
                        return SiteContext(0, 1, np.random.default_rng(1), data)

                    t_ours, ours = seconds(lambda: protocol.site_step(ctx(), broadcast)["weighted_params"] / n_rows)
                    t_ref, ref = seconds(lambda: reference_site_step(protocol, ctx(), broadcast))
                    diff = float(np.max(np.abs(ours - ref)))
                    assert diff < 1e-9, diff
                    name = f"{'mc-VAE' if model == 'mcvae' else 'VAE'} ({'linear' if hidden is None else '2-layer'})"
                    how = "FedAvg" if proximal == 0 else f"FedProx {proximal}"
                    print(f"{data_name:22s} {name:17s} {how:11s}: ours {t_ours * 1e3:6.1f} ms, reference "
                          f"{t_ref * 1e3:6.1f} ms per site step, ratio {t_ref / t_ours:.2f}x (max |diff| {diff:.0e})")


if __name__ == "__main__":
    main()
