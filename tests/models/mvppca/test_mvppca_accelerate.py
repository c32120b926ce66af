"""SQUAREM across rounds (fedhier.models.mvppca.accelerate): the fixed point of a known map, the safeguard,
the variances it leaves alone, and the estimator's option on the demo."""

import warnings

import numpy as np
import pytest

from fedhier import FedMVPPCA
from fedhier.demo import demo_data
from fedhier.metrics import reconstruction_mae
from fedhier.models.mvppca.accelerate import Squarem
from fedhier.models.mvppca.params import GlobalView
from fedhier.models.mvppca.predictive import model_change


def global_view(mu, W, sigma2_W=1e-3):
    q = np.shape(W)[1]
    return GlobalView(mu=np.asarray(mu, float), W=np.asarray(W, float), sigma2_mu=1e-3, sigma2_W=sigma2_W, alpha=3.0,
                      beta=0.2, noise_var=0.1, var_sigma=0.01, sigma2_W_columns=np.full(q, sigma2_W))


class SlowMap:
    """theta -> A (theta - theta*) + theta* on (mu~, W~) of one view: a contraction whose slowest direction
    shrinks by ``rate`` per round, the fixed point theta* known in closed form."""

    def __init__(self, rate, d=4, q=2, seed=0):
        rng = np.random.default_rng(seed)
        self.d, self.q = d, q
        self.fixed = rng.normal(size=d + d * q)
        basis, _ = np.linalg.qr(rng.normal(size=(d + d * q, d + d * q)))
        rates = np.full(d + d * q, 0.2)
        rates[0] = rate
        self.A = basis @ np.diag(rates) @ basis.T

    def params(self, theta):
        return {"v": global_view(theta[:self.d], theta[self.d:].reshape(self.d, self.q))}

    def theta(self, params):
        return np.concatenate([params["v"].mu, params["v"].W.ravel()])

    def __call__(self, params):
        return self.params(self.A @ (self.theta(params) - self.fixed) + self.fixed)


def rounds_to_fixed_point(F, accelerate, start, tol=1e-8, cap=1000):
    """Rounds (evaluations of F, one per round) until the broadcast is within tol of the fixed point."""
    squarem = Squarem() if accelerate else None
    broadcast = F.params(start)
    for round in range(1, cap + 1):
        mapped = F(broadcast)
        broadcast = squarem.step(broadcast, mapped) if accelerate else mapped
        if np.linalg.norm(F.theta(broadcast) - F.fixed) < tol * np.linalg.norm(F.fixed):
            return round
    return cap


def test_squarem_lands_on_the_fixed_point_of_a_slow_linear_map_in_a_fraction_of_the_rounds():
    F = SlowMap(rate=0.95)
    start = F.fixed + np.random.default_rng(1).normal(size=F.fixed.size)
    plain = rounds_to_fixed_point(F, False, start)
    fast = rounds_to_fixed_point(F, True, start)
    # plain rounds shrink the error by 0.95 each: about log(1e-8 / 3) / log(0.95) rounds
    assert plain > 300
    assert fast <= 40


def test_an_extrapolation_that_moves_the_predictions_more_is_dropped_for_the_plain_step():
    F = SlowMap(rate=0.95)
    squarem = Squarem()
    broadcast = F.params(F.fixed + 1.0)
    extrapolated = None
    for _ in range(8):  # until the adaptive step length allows an extrapolation
        theta1 = broadcast
        theta2 = F(theta1)
        broadcast = squarem.step(theta1, theta2)
        if squarem.steps and squarem.steps[-1] > 1.0 and broadcast is not theta2:
            extrapolated = broadcast
            break
    assert extrapolated is not None
    assert model_change(theta2, extrapolated) > 0
    # the round from theta' changes the predictions far more than the round from theta_1 did
    far = {"v": global_view(F.fixed[:F.d] + 10.0 * np.arange(F.d), F.params(F.fixed)["v"].W)}
    assert model_change(extrapolated, far) > 2 * model_change(theta1, theta2)
    assert squarem.step(extrapolated, far) is theta2
    assert squarem.steps[-1] == 0.0
    # and the next round extrapolates from (theta_1, theta_2) instead of starting a new cycle
    after = squarem.step(theta2, F(theta2))
    assert after is not F(theta2)


def test_the_extrapolation_moves_means_and_loadings_only_and_keeps_the_cap_on_the_loadings_variance():
    F = SlowMap(rate=0.95, d=3, q=1)
    squarem = Squarem()
    broadcast = F.params(F.fixed * 10.0)
    extrapolations = 0
    for _ in range(10):
        mapped = F(broadcast)
        mapped = {"v": GlobalView(**{**mapped["v"].to_dict(), "sigma2_W": 50.0, "sigma2_W_columns": np.array([50.0])})}
        taken = len(squarem.steps)
        out = squarem.step(broadcast, mapped)
        g, m = out["v"], mapped["v"]
        assert (g.sigma2_mu, g.alpha, g.beta, g.noise_var) == (m.sigma2_mu, m.alpha, m.beta, m.noise_var)
        if len(squarem.steps) > taken and squarem.steps[-1] > 1.0:  # an extrapolation: the loadings moved, their variance is held under the new cap
            extrapolations += 1
            assert not np.allclose(g.W, m.W)
            cap = np.linalg.norm(g.W) / 5.0
            assert g.sigma2_W == pytest.approx(min(50.0, cap)) and np.allclose(g.sigma2_W_columns, min(50.0, cap))
        broadcast = out
    assert extrapolations > 0


def test_a_view_without_loadings_keeps_its_variances_when_the_means_are_extrapolated():
    """A view whose loadings are all zero has no cap to scale by: its variances stay as the master set them
    (a zero variance made the report divide by zero, and the site's prior precision infinite)."""
    from fedhier.models.mvppca.accelerate import _with_means

    view = global_view([1.0, 2.0], np.zeros((2, 2)), sigma2_W=1e-4)
    moved = _with_means(np.array([1.5, 2.5, 0.0, 0.0, 0.0, 0.0]), {"v": view}, ["v"])["v"]
    assert np.allclose(moved.mu, [1.5, 2.5]) and moved.sigma2_W == 1e-4 and np.all(moved.sigma2_W_columns == 1e-4)


def test_unknown_acceleration_is_refused():
    with pytest.raises(ValueError, match="acceleration"):
        FedMVPPCA(acceleration="aitken").fit([{"a": np.random.default_rng(0).normal(size=(20, 3))}])


def test_the_demo_stops_in_fewer_rounds_with_squarem_and_the_same_test_error():
    # the demo's splits of seeds 0-3 (benchmarks/bench_rounds.py runs seeds 0-9): fewer rounds over the four, the
    # same test error on each
    rounds = {None: 0, "squarem": 0}
    for seed in range(4):
        data = demo_data(seed=seed)
        mae = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for acceleration in rounds:
                model = FedMVPPCA(n_components=5, random_state=seed, acceleration=acceleration).fit(data.sites)
                rounds[acceleration] += model.n_rounds_
                mae[acceleration] = reconstruction_mae(data.test_masked, model.reconstruct(data.test_masked))
        assert abs(mae["squarem"] / mae[None] - 1.0) < 0.01
    assert rounds["squarem"] <= 0.85 * rounds[None]
