"""VAE / multi-channel VAE baselines with FedAvg and FedProx (spec §12.5) on tiny problems."""

import numpy as np
import pytest
from scipy.stats import norm

torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional extra: pip install torch==2.13.0)")

from fedhier.baselines import FederatedAveraging, FederatedVAE  # noqa: E402
from fedhier.baselines._networks import build_network  # noqa: E402
from fedhier.data import ViewSchema  # noqa: E402
from fedhier.protocol.base import SiteContext  # noqa: E402
from fedhier.runtime.simulate import simulate, site_rng  # noqa: E402

DIMS = {"a": 4, "b": 3}
Q = 2


def _sites(sizes=(20, 12), seed=0):
    rng = np.random.default_rng(seed)
    W = {v: rng.normal(size=(d, Q)) for v, d in DIMS.items()}
    out = []
    for n in sizes:
        x = rng.normal(size=(n, Q))
        out.append({v: 0.5 + 0.1 * (x @ W[v].T) + 0.02 * rng.normal(size=(n, d)) for v, d in DIMS.items()})
    return out


def _linear(layer):
    return layer.weight.detach().numpy(), layer.bias.detach().numpy()


def _nll(x, mean, log_var):
    return -norm.logpdf(x, loc=mean, scale=np.exp(0.5 * log_var)).sum(axis=1)


def _kl(m, lv):
    return 0.5 * (np.exp(lv) + m**2 - 1 - lv).sum(axis=1)


def test_concat_vae_negative_elbo_matches_numpy():
    torch.manual_seed(0)
    net = build_network("vae", list(DIMS.values()), Q, None)
    site = _sites()[0]
    x = np.hstack([site[v] for v in DIMS])
    with torch.no_grad():
        got = float(net.negative_elbo([torch.from_numpy(site[v]) for v in DIMS], torch.Generator().manual_seed(3)))
    eps = torch.randn((x.shape[0], Q), generator=torch.Generator().manual_seed(3), dtype=torch.float64).numpy()
    A, a = _linear(net.encoder)
    B, b = _linear(net.decoder.mean)
    out = x @ A.T + a
    m, lv = out[:, :Q], out[:, Q:]
    z = m + np.exp(0.5 * lv) * eps
    expected = np.mean(_nll(x, z @ B.T + b, net.decoder.log_var.detach().numpy()) + _kl(m, lv))
    assert got == pytest.approx(expected, rel=1e-10)


def test_multichannel_vae_elbo_and_reconstruction_match_numpy():
    torch.manual_seed(1)
    net = build_network("mcvae", list(DIMS.values()), Q, None)
    site = _sites()[0]
    views = [site[v] for v in DIMS]
    with torch.no_grad():
        got = float(net.negative_elbo([torch.from_numpy(x) for x in views], torch.Generator().manual_seed(4)))
    gen = torch.Generator().manual_seed(4)
    total = 0.0
    means = []
    for enc, x in zip(net.encoders, views):
        A, a = _linear(enc)
        out = x @ A.T + a
        m, lv = out[:, :Q], out[:, Q:]
        means.append(m)
        z = m + np.exp(0.5 * lv) * torch.randn((x.shape[0], Q), generator=gen, dtype=torch.float64).numpy()
        total = total + _kl(m, lv)
        for dec, y in zip(net.decoders, views):
            B, b = _linear(dec.mean)
            total = total + _nll(y, z @ B.T + b, dec.log_var.detach().numpy())
    assert got == pytest.approx(np.mean(total), rel=1e-10)
    # latent = average of the view-wise encoder means; reconstruction = decoders at that latent (§14 row 27)
    z_bar = np.mean(means, axis=0)
    with torch.no_grad():
        np.testing.assert_allclose(net.latent([torch.from_numpy(x) for x in views]).numpy(), z_bar, atol=1e-12)
        rec = net.reconstruct([torch.from_numpy(x) for x in views])
    for dec, r in zip(net.decoders, rec):
        B, b = _linear(dec.mean)
        np.testing.assert_allclose(r.numpy(), z_bar @ B.T + b, atol=1e-12)


def _protocol(proximal=0.0, model="mcvae", n_epochs=3):
    schema = ViewSchema(tuple(DIMS), tuple(DIMS.values()))
    return FederatedAveraging(
        schema, Q, model=model, hidden=None, n_epochs=n_epochs, learning_rate=1e-2, batch_size=8, proximal=proximal, init_seed=9
    )


def test_fedavg_global_step_is_the_size_weighted_average_of_site_updates():
    protocol, sites = _protocol(), _sites()
    result = simulate(protocol, sites, n_rounds=1, random_state=5)
    start = protocol.initial_broadcast()
    thetas = []
    for s, site in enumerate(sites):
        reply = protocol.site_step(SiteContext(site=s, round=1, rng=site_rng(5, 1, s), data=site), start)
        thetas.append(reply["weighted_params"] / reply["n_samples"])
    sizes = np.array([20.0, 12.0])
    expected = (sizes[0] * thetas[0] + sizes[1] * thetas[1]) / sizes.sum()
    np.testing.assert_allclose(result.broadcast["params"], expected, rtol=1e-12)
    assert not np.allclose(thetas[0], thetas[1])  # the sites did move differently


def test_fedprox_keeps_the_site_close_to_the_global_parameters():
    sites = _sites()
    distances = {}
    for lam in (0.0, 1e4):
        protocol = _protocol(proximal=lam, n_epochs=10)
        start = protocol.initial_broadcast()
        reply = protocol.site_step(SiteContext(site=0, round=1, rng=site_rng(2, 1, 0), data=sites[0]), start)
        distances[lam] = np.linalg.norm(reply["weighted_params"] / reply["n_samples"] - start["params"])
    assert distances[1e4] < distances[0.0] / 3


@pytest.mark.parametrize("model", ["vae", "mcvae"])
def test_federated_training_lowers_the_negative_elbo(model):
    fitted = FederatedVAE(Q, model=model, n_rounds=6, n_epochs=3, learning_rate=1e-2, batch_size=8, random_state=0).fit(_sites())
    elbo = [h["negative_elbo"] for h in fitted.history_]
    assert elbo[-1] < elbo[0]
    test = _sites((7,), seed=3)[0]
    assert fitted.transform(test).shape == (7, Q)
    assert {v: X.shape for v, X in fitted.reconstruct(test).items()} == {"a": (7, 4), "b": (7, 3)}


def test_missing_views_are_refused():
    sites = _sites()
    del sites[1]["a"]
    with pytest.raises(ValueError, match="site 1 lacks view 'a'"):
        FederatedVAE(Q, n_rounds=1).fit(sites)
    with pytest.raises(ValueError, match="proximal"):
        FederatedVAE(Q, proximal=-1.0).fit(_sites())



def test_a_site_trains_on_one_torch_thread_and_gives_the_caller_its_threads_back(monkeypatch):
    """The sites' local epochs run on one torch thread (small networks: more threads only wait for each other on a
    busy machine); the caller's thread count is restored after the fit."""
    seen = []
    original = FederatedAveraging._local_epochs

    def spy(self, ctx, broadcast):
        seen.append(torch.get_num_threads())
        return original(self, ctx, broadcast)

    monkeypatch.setattr(FederatedAveraging, "_local_epochs", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        X = np.random.default_rng(0).normal(size=(20, 3))
        FederatedVAE(n_components=1, n_rounds=2, n_epochs=1, random_state=0).fit(X)
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
