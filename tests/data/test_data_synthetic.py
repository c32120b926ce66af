import numpy as np
import pytest
from scipy import stats

from fedhier.data import make_federated_ppca, make_multiview_ppca
from fedhier.models.mvppca.params import ViewParams


def test_sd_defaults_shapes_and_ranges():
    sd = make_multiview_ppca(random_state=0)
    assert {v: X.shape for v, X in sd.views.items()} == {"view1": (400, 15), "view2": (400, 8), "view3": (400, 10)}
    assert sd.labels.sum() == 250 and sd.latent.shape == (400, 5)
    assert all(isinstance(p, ViewParams) for p in sd.params.values())
    assert [p.sigma2 for p in sd.params.values()] == [2.0, 1.0, 3.0]
    for p, r in zip(sd.params.values(), (10, 5, 15)):
        assert np.abs(p.W).max() <= r and np.abs(p.mu).max() <= r
        assert np.abs(p.W).max() > r / 2  # uses the whole range
    assert np.abs(sd.shift).max() <= 10


def test_views_follow_the_model_given_the_latents():
    sd = make_multiview_ppca(n_samples=3000, random_state=1)
    x = sd.latent + sd.labels[:, None] * sd.shift
    for view, p in sd.params.items():
        resid = sd.views[view] - x @ p.W.T - p.mu
        assert abs(resid.var() / p.sigma2 - 1) < 0.05


@pytest.mark.parametrize("n_shifted", [0, 12000])
def test_sample_covariance_matches_model(n_shifted):
    """cov t^O = W^O (I + p(1-p) a a^T) W^O^T + Psi^O with p the shifted fraction (spec §2.2)."""
    n = 20000
    sd = make_multiview_ppca(n_samples=n, dims=(6, 4, 5, 3), n_components=3, n_shifted=n_shifted, random_state=2)
    W = np.vstack([p.W for p in sd.params.values()])
    psi = np.concatenate([np.full(p.dim, p.sigma2) for p in sd.params.values()])
    p = n_shifted / n
    cov_x = np.eye(3) + p * (1 - p) * np.outer(sd.shift, sd.shift)
    model = W @ cov_x @ W.T + np.diag(psi)
    sample = np.cov(np.hstack(list(sd.views.values())), rowvar=False)
    assert np.linalg.norm(sample - model) / np.linalg.norm(model) < 0.03
    mean = np.concatenate([q.mu for q in sd.params.values()]) + W @ (p * sd.shift)
    sample_mean = np.hstack(list(sd.views.values())).mean(axis=0)
    assert np.all(np.abs(sample_mean - mean) < 5 * np.sqrt(np.diag(model) / n))
    assert [q.sigma2 for q in sd.params.values()] == [2.0, 1.0, 3.0, 2.0]  # cycling


def test_sd_bad_input():
    with pytest.raises(ValueError, match="n_shifted=500"):
        make_multiview_ppca(n_samples=400, n_shifted=500, random_state=0)
    with pytest.raises(ValueError, match="dims"):
        make_multiview_ppca(dims=(3, 0), random_state=0)


def test_federated_sites_follow_the_hierarchical_prior():
    fed = make_federated_ppca(
        400, 3, (4, 2), 2, sd_mu=0.5, sd_W=0.3, sigma2_alpha=5.0, sigma2_beta=2.0, random_state=3
    )
    assert len(fed.sites) == 400 and fed.sites[0]["view1"].shape == (3, 4)
    g = fed.global_params["view1"]
    assert g.sigma2_mu == 0.25 and np.isclose(g.sigma2_W, 0.09)
    assert np.isclose(g.noise_var, 2.0 / 4.0) and np.isclose(g.var_sigma, 4.0 / (16 * 3))
    mus = np.array([t["view1"].mu for t in fed.site_params])
    Ws = np.array([t["view1"].W for t in fed.site_params])
    sig = np.array([t["view1"].sigma2 for t in fed.site_params])
    dev_mu = (mus - g.mu).ravel() / 0.5
    dev_W = (Ws - g.W).ravel() / 0.3
    assert stats.kstest(dev_mu, "norm").pvalue > 1e-3
    assert stats.kstest(dev_W, "norm").pvalue > 1e-3
    assert stats.kstest(sig, stats.invgamma(a=5.0, scale=2.0).cdf).pvalue > 1e-3


def test_federated_site_data_given_parameters():
    fed = make_federated_ppca(
        2, [4000, 3000], (5, 3, 4), 2, sd_mu=1.0, sd_W=1.0, sigma2_alpha=3.0, sigma2_beta=2.0,
        site_views=[("view1", "view2", "view3"), ("view1", "view3")], random_state=4,
    )
    assert list(fed.sites[1]) == ["view1", "view3"] and list(fed.site_params[1]) == ["view1", "view3"]
    assert fed.sites[1]["view1"].shape == (3000, 5)
    for site, theta in zip(fed.sites, fed.site_params):
        W = np.vstack([p.W for p in theta.values()])
        model = W @ W.T + np.diag(np.concatenate([np.full(p.dim, p.sigma2) for p in theta.values()]))
        sample = np.cov(np.hstack(list(site.values())), rowvar=False)
        assert np.linalg.norm(sample - model) / np.linalg.norm(model) < 0.08


def test_federated_bad_input():
    kw = dict(sd_mu=1.0, sd_W=1.0, sigma2_alpha=3.0, sigma2_beta=2.0, random_state=0)
    with pytest.raises(ValueError, match="site 1 lists"):
        make_federated_ppca(2, 5, (3, 3), 1, site_views=[("view1",), ("view9",)], **kw)
    with pytest.raises(ValueError, match="n_per_site has 3 values; expected 1 or 2"):
        make_federated_ppca(2, [5, 5, 5], (3, 3), 1, **kw)
    with pytest.raises(ValueError, match="sigma2_beta must be finite and positive"):
        make_federated_ppca(2, 5, (3, 3), 1, **{**kw, "sigma2_beta": 0.0})
