"""Record-level DP by a one-shot release of noisy moments (Analyze Gauss) for Fed-mv-PPCA and FedLin.

* the sensitivity 2 C^2 holds by brute force over neighbouring data sets (one record added or removed);
* with (almost) no noise the post-processing gives back the non-private closed forms (numpy's
  moments, scikit-learn's PPCA covariance, SiteStats of the raw data, the non-private HM2 fit);
* the protocols declare what a site policy needs, and every release lands in the site's ledger;
* a membership audit of one release stays below the claimed epsilon and catches an understated
  sensitivity;
* every epsilon on docs/experiments/record-dp.md (its CSV) recomputes with dp-accounting.
"""

import csv
import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from audit_bounds import empirical_epsilon_lower_bound
from dp_accounting import dp_event
from dp_accounting.pld import accountant as pld_accountant
from dp_accounting.pld import common
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from sklearn.decomposition import PCA

from fedhier.data.schema import ViewSchema
from fedhier.estimators.fedlin import FedHM2Regressor
from fedhier.models.fedlin import record_dp as fedlin_rdp
from fedhier.models.fedlin.stats import SiteStats
from fedhier.models.mvppca import record_dp as mv_rdp
from fedhier.privacy.analyze_gauss import RecordDP, record_vectors, release_second_moment
from fedhier.privacy.policy import PolicyRefusal, SitePolicy
from fedhier.privacy.sampling import NoiseSource
from fedhier.privacy.site_ledger import SiteLedger
from fedhier.protocol.record_dp import FedLinRecordDPProtocol, MVPPCARecordDPProtocol
from fedhier.runtime.guard import SiteGuard
from fedhier.runtime.simulate import simulate

CSV = Path(__file__).resolve().parents[2] / "docs" / "experiments" / "record-dp.csv"
# z ~ 1e-4 relative to 2 C^2: the post-processing's exact limit; C = 1.5 clips no row of the tests' 7 or 8
# features in [0, 1] around 0.5 (sqrt(8) / 2 < 1.5), which the default sqrt(d) / 6 would
NEARLY_NO_NOISE = RecordDP(1e6, 1e-5, clip=1.5)


class ZeroNoise(NoiseSource):
    """A noise source whose draws are all 0: the release is the exact moment matrix (to the lattice's rounding)."""

    def discrete_gaussian(self, sigma, shape):
        return np.zeros(shape, dtype=np.int64)


def _upper(M):
    return M[np.triu_indices(M.shape[0])]


def _views(rng, n, dims=(4, 3), missing=()):
    views = {f"v{k}": rng.uniform(0, 1, size=(n, d)) for k, d in enumerate(dims)}
    for view, rows in missing:
        views[view][rows] = np.nan
    return views


# ------------------------------------------------------------------ sensitivity
@pytest.mark.parametrize("clip", [0.3, 1.2])
def test_sensitivity_of_the_released_moments_holds_by_brute_force(clip):
    """Removing any one subject (with any missing views) moves the released upper triangle by at most 2 C^2."""
    rng = np.random.default_rng(0)
    names, dims = ["v0", "v1"], [4, 3]
    config = RecordDP(1.0, 1e-5, clip=clip)
    worst = 0.0
    for trial in range(40):
        n = 6
        views = {v: rng.normal(0.5, 2.0 * rng.uniform(), size=(n, d)) for v, d in zip(names, dims)}
        views["v1"][rng.uniform(size=n) < 0.3] = np.nan  # subjects missing a view
        full, _ = mv_rdp.site_release(views, names, dims, config, ZeroNoise())
        for i in range(n):
            keep = np.arange(n) != i
            less, _ = mv_rdp.site_release({v: x[keep] for v, x in views.items()}, names, dims, config, ZeroNoise())
            worst = max(worst, float(np.linalg.norm(_upper(full) - _upper(less))))
    assert worst <= config.sensitivity(clip) * (1 + 1e-12)
    assert worst > 0.5 * config.sensitivity(clip)  # the brute force reaches the order of the bound
    # a record concentrated on one coordinate, observing every view, attains the bound's ||z||^2 exactly
    z = record_vectors(np.array([[10.0, 0, 0]]), np.ones((1, 2)), clip)[0]
    assert float(z @ z) == pytest.approx(config.sensitivity(clip))


def test_fedlin_release_sensitivity_by_brute_force():
    rng = np.random.default_rng(1)
    config = RecordDP(1.0, 1e-5, clip=1.5)
    worst = 0.0
    for _ in range(30):
        X, y = rng.normal(size=(8, 3)) * 2, rng.normal(size=8) * 2
        full, _ = fedlin_rdp.site_release(X, y, config, ZeroNoise())
        for i in range(8):
            keep = np.arange(8) != i
            less, _ = fedlin_rdp.site_release(X[keep], y[keep], config, ZeroNoise())
            worst = max(worst, float(np.linalg.norm(_upper(full) - _upper(less))))
    assert 0.5 * config.sensitivity(1.5) < worst <= config.sensitivity(1.5) * (1 + 1e-12)


def test_the_noise_is_symmetric_with_the_stated_sd():
    config = RecordDP(1.0, 1e-5, clip=1.0)
    records = record_vectors(np.zeros((3, 2)), np.ones((3, 1)), 1.0)
    draws = np.stack([release_second_moment(records, config.sensitivity(1.0), config.noise_multiplier,
                                            np.random.default_rng(s))[0] for s in range(4000)])
    exact = records.T @ records
    noise = draws - exact
    assert np.allclose(noise, np.swapaxes(noise, 1, 2))
    assert np.std(noise[:, 0, 1]) == pytest.approx(config.noise_sd(1.0), rel=0.05)
    assert np.std(noise[:, 2, 2]) == pytest.approx(config.noise_sd(1.0), rel=0.05)
    assert config.noise_sd(1.0) == pytest.approx(config.noise_multiplier * 2.0)


# ------------------------------------------------------------------ post-processing without noise
def test_moments_give_numpys_means_and_pairwise_covariances_without_noise():
    rng = np.random.default_rng(2)
    names, dims = ["v0", "v1"], [4, 3]
    views = _views(rng, 60, dims, missing=[("v1", slice(0, 15)), ("v0", slice(50, 55))])
    M, _ = mv_rdp.site_release(views, names, dims, NEARLY_NO_NOISE, ZeroNoise())
    ks, mean, S, counts = mv_rdp.moments_to_covariance(M, dims, NEARLY_NO_NOISE)
    assert ks == [0, 1] and counts.tolist() == pytest.approx([55, 45])
    assert mean[:4] == pytest.approx(np.nanmean(views["v0"], axis=0), abs=1e-6)
    assert mean[4:] == pytest.approx(np.nanmean(views["v1"], axis=0), abs=1e-6)
    both = ~np.isnan(views["v0"][:, 0]) & ~np.isnan(views["v1"][:, 0])
    joint = np.hstack([views["v0"][both], views["v1"][both]])
    assert S[:4, 4:] == pytest.approx(np.cov(joint.T, bias=True)[:4, 4:], abs=1e-6)  # pairwise-complete block
    only0 = views["v0"][~np.isnan(views["v0"][:, 0])]
    assert S[:4, :4] == pytest.approx(np.cov(only0.T, bias=True), abs=1e-6)


def test_single_view_ppca_is_tipping_bishop_as_scikit_learn_computes_it():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 3)) @ rng.normal(size=(3, 8)) + 0.3 * rng.normal(size=(200, 8))
    S = np.cov(X.T)  # scikit-learn's PCA uses n - 1
    W, sigma2 = mv_rdp.ppca_from_covariance(S, [8], 3)
    assert W @ W.T + sigma2[0] * np.eye(8) == pytest.approx(PCA(n_components=3).fit(X).get_covariance(), abs=1e-10)


def test_multi_view_em_on_the_covariance_recovers_the_generating_model():
    rng = np.random.default_rng(4)
    dims, q = [6, 4], 2
    W = rng.normal(size=(10, q))
    sigma2 = np.array([0.05, 0.5])
    Sigma = W @ W.T + np.diag(np.repeat(sigma2, dims))
    W_hat, s_hat = mv_rdp.ppca_from_covariance(Sigma, dims, q, n_iter=2000)
    assert s_hat == pytest.approx(sigma2, rel=1e-3)
    assert W_hat @ W_hat.T == pytest.approx(W @ W.T, abs=1e-3)


def test_global_step_without_noise_gives_the_sites_means_and_aligned_loadings():
    rng = np.random.default_rng(5)
    names, dims = ["v0", "v1"], [5, 3]
    W = rng.normal(size=(8, 2)) * 0.06  # records well inside the default clip: nothing is clipped
    sites = []
    for shift in (0.0, 0.05):
        X = 0.5 + shift + rng.normal(size=(300, 2)) @ W.T + 0.02 * rng.normal(size=(300, 8))
        sites.append({"v0": X[:, :5], "v1": X[:, 5:]})
    releases = [mv_rdp.site_release(s, names, dims, NEARLY_NO_NOISE, ZeroNoise())[0] for s in sites]
    theta, params = mv_rdp.global_from_releases(releases, names, dims, 2, NEARLY_NO_NOISE)
    expected = np.mean([np.hstack([s["v0"], s["v1"]]).mean(axis=0) for s in sites], axis=0)
    assert np.hstack([theta["v0"].mu, theta["v1"].mu]) == pytest.approx(expected, abs=1e-6)
    # aligned: the two sites' loadings agree up to sampling error, not up to a rotation
    W0, W1 = (np.vstack([p["v0"].W, p["v1"].W]) for p in params)
    assert np.linalg.norm(W0 - W1) < 0.3 * np.linalg.norm(W0)


def test_fedlin_statistics_and_fit_without_noise_are_the_non_private_ones():
    rng = np.random.default_rng(6)
    sites = []
    for k in range(3):
        X = np.column_stack([np.ones(80), rng.uniform(-1, 1, size=(80, 2))])
        sites.append((X, X @ np.array([0.2 + 0.1 * k, 0.5, -0.3]) + 0.1 * rng.normal(size=80)))
    config = RecordDP(1e6, 1e-5, clip=2.0)
    M, _ = fedlin_rdp.site_release(*sites[0], config, ZeroNoise())
    stats, exact = fedlin_rdp.release_to_stats(M, config), SiteStats.from_data(*sites[0])
    assert stats.n == exact.n
    assert stats.xx == pytest.approx(exact.xx, abs=1e-2) and stats.xy == pytest.approx(exact.xy, abs=1e-2)
    assert stats.yy == pytest.approx(exact.yy, abs=1e-2)
    options = dict(fit_intercept=False, mu_scale=1.0, random=[True, False, False], noise="shared", n_posterior_draws=500, random_state=0)
    private = FedHM2Regressor(privacy=config, **options).fit(sites)
    plain = FedHM2Regressor(**options).fit(sites)
    assert private.coef_ == pytest.approx(plain.coef_, abs=0.02)
    assert private.privacy_spent_[0]["epsilon"] == pytest.approx(1e6, rel=1e-3)


def test_fedlin_needs_a_public_clip_and_no_standardisation():
    with pytest.raises(ValueError, match="clip"):
        fedlin_rdp.check_config(RecordDP(1.0, 1e-5), 3)
    X, y = np.ones((5, 2)), np.ones(5)
    with pytest.raises(ValueError, match="standardize=False"):
        FedHM2Regressor(prior="ridge", privacy=RecordDP(1.0, 1e-5, clip=2.0)).fit([(X, y)])
    with pytest.raises(ValueError, match="max_records"):
        RecordDP(1.0, 1e-5, unit="site")


# ------------------------------------------------------------------ which views a site measures: from the noisy counts
def test_a_view_nobody_measures_is_taken_as_measured_at_the_normal_tail_rate():
    """Its count is pure noise of sd z 2 C^2 / c^2: above PRESENCE_SDS sds with probability 1 - Phi(3)."""
    from scipy import stats

    names, dims, config = ["v0", "v1"], [4, 3], RecordDP(1.0, 1e-5)
    rng = np.random.default_rng(11)
    draws = 20_000

    class Draws(NoiseSource):  # ``draws`` independent releases at once (a seeded stand-in for the lattice sampler)
        def discrete_gaussian(self, sigma, shape):
            return np.rint(rng.normal(0.0, sigma, size=(draws, *shape)))

    views = {"v0": rng.uniform(size=(30, 4))}  # v1 measured by nobody
    M, _ = mv_rdp.site_release(views, names, dims, config, Draws())
    shown = sum(1 in mv_rdp.measured_views(m, dims, config) for m in M)
    low, high = stats.binom.interval(0.999, draws, stats.norm.sf(mv_rdp.PRESENCE_SDS))
    assert low <= shown <= high
    # a view measured by ten times as many subjects as the count's noise sd is always shown
    clip = mv_rdp.default_clip(dims)
    count_sd = config.noise_sd(clip) / (clip**2 / len(dims))
    many = {"v0": rng.uniform(size=(int(10 * count_sd), 4))}
    assert all(0 in mv_rdp.measured_views(m, dims, config) for m in mv_rdp.site_release(many, names, dims, config, Draws())[0])


def test_a_site_showing_fewer_features_than_components_fits_what_it_can_and_an_unseen_view_keeps_the_public_prior():
    rng = np.random.default_rng(12)
    names, dims, q = ["v0", "v1"], [4, 3], 3
    X = 0.5 + rng.normal(size=(400, 2)) @ rng.uniform(-0.1, 0.1, size=(2, 3)) + 0.01 * rng.normal(size=(400, 3))
    M, _ = mv_rdp.site_release({"v1": X}, names, dims, NEARLY_NO_NOISE, ZeroNoise())
    with pytest.warns(UserWarning, match=r"view\(s\) \['v0'\].*public prior"):
        theta, (site,) = mv_rdp.global_from_releases([M], names, dims, q, NEARLY_NO_NOISE)
    assert list(site) == ["v1"]  # v0's zero count is not shown
    W, sigma2 = site["v1"].W, site["v1"].sigma2
    assert np.all(W[:, 2] == 0)  # 3 features: 2 free columns
    pca = PCA(n_components=2).fit(X)
    assert W @ W.T + sigma2 * np.eye(3) == pytest.approx(pca.get_covariance() * (399 / 400), abs=1e-6)
    assert site["v1"].mu == pytest.approx(X.mean(axis=0), abs=1e-6)
    assert np.all(theta["v0"].mu == 0.5) and np.all(theta["v0"].W == 0)  # the public, data-independent prior


# ------------------------------------------------------------------ declarations, policy and ledger
def test_protocols_declare_a_private_record_level_one_shot_release():
    schema = ViewSchema(("v0", "v1"), (4, 3))
    config = RecordDP(1.0, 1e-5)
    for protocol in (MVPPCARecordDPProtocol(schema, 2, config), FedLinRecordDPProtocol(2, 3, RecordDP(1.0, 1e-5, clip=2.0))):
        assert protocol.private and protocol.protected_unit == "record"
        assert protocol.release_plan(7) == [dp_event.GaussianDpEvent(config.noise_multiplier)]
        assert {f.disclosure for f in protocol.reply_spec.fields.values()} <= {"release", "public"}
        assert set(protocol.reply_spec.fields) == {"moments"}  # nothing about which views a site measures
        assert protocol.reply_spec.fields["moments"].disclosure == "release"
    guard = SiteGuard(SitePolicy(unit="site", modes=("dp",)), "a")
    with pytest.raises(PolicyRefusal, match="each site"):
        guard.admit(MVPPCARecordDPProtocol(schema, 2, config), 1, False)
    SiteGuard(SitePolicy(unit="site", modes=("dp",)), "b").admit(
        MVPPCARecordDPProtocol(schema, 2, RecordDP(1.0, 1e-5, unit="site", max_records=100)), 1, False)
    with pytest.raises(PolicyRefusal, match="per analysis"):
        SiteGuard(SitePolicy(max_epsilon=0.5, modes=("dp",)), "c").admit(MVPPCARecordDPProtocol(schema, 2, config), 1, False)


def test_every_release_is_in_the_site_ledger_and_the_fits_ledger(tmp_path):
    rng = np.random.default_rng(7)
    schema = ViewSchema(("v0", "v1"), (4, 3))
    config = RecordDP(2.0, 1e-5)
    sites = [_views(rng, 30), {"v0": rng.uniform(size=(20, 4))}]
    policies = [SitePolicy(modes=("dp",), ledger=tmp_path / f"site{k}.jsonl") for k in range(2)]
    result = simulate(MVPPCARecordDPProtocol(schema, 2, config), sites, n_rounds=1, random_state=0,
                      site_policies=policies, analysis="one-shot")
    assert result.history[0].sites == [0, 1]
    for k in range(2):
        entries = SiteLedger(tmp_path / f"site{k}.jsonl").entries
        assert [(e.block, e.event) for e in entries] == [("moments", config.event())]
        assert SiteLedger(tmp_path / f"site{k}.jsonl").epsilon(1e-5) == pytest.approx(2.0, rel=1e-3)


def test_fed_mv_ppca_estimator_with_record_dp_reports_record_unit():
    from fedhier.estimators.mvppca import FedMVPPCA

    rng = np.random.default_rng(8)
    sites = [_views(rng, 200), _views(rng, 150)]
    model = FedMVPPCA(n_components=2, random_state=0, privacy=RecordDP(1.0, 1e-5)).fit(sites)
    report = model.privacy_report()
    assert report["unit"] == "record"
    assert [len(s["releases"]) for s in report["sites"].values()] == [1, 1]
    assert model.privacy_spent_[0]["epsilon"] == pytest.approx(1.0, rel=1e-3)
    assert np.isfinite(model.reconstruct(sites[0])["v0"]).all()
    with pytest.raises(ValueError, match="aggregation='plain'"):
        FedMVPPCA(n_components=2, privacy=RecordDP(1.0, 1e-5), aggregation="secure").fit(sites)


# ------------------------------------------------------------------ membership audit of one release
N_AUDIT = 1_000_000  # releases per data set: the Gaussian tail needs them for power
CHUNK = 200_000


class Batch(NoiseSource):
    """Draws ``CHUNK`` independent noise matrices at once: ``release_second_moment`` then returns CHUNK releases."""

    def __init__(self, rng):
        super().__init__()
        self.source = NoiseSource.seeded(rng)

    def discrete_gaussian(self, sigma, shape):
        return self.source.discrete_gaussian(sigma, (CHUNK, *shape))


def _audit_scores(config, sensitivity, rng):
    """Neighbouring data sets D and D + one worst-case record; the score projects the release on that record."""
    clip = config.clip
    base = record_vectors(rng.uniform(-0.3, 0.3, size=(5, 3)), np.ones((5, 2)), clip)
    extra = record_vectors(np.array([[5.0, 0.0, 0.0]]), np.ones((1, 2)), clip)
    rows, cols = np.triu_indices(base.shape[1])
    direction = (extra.T @ extra)[rows, cols]
    direction = direction / np.linalg.norm(direction)
    centre = _upper(base.T @ base) @ direction

    def scores(records):
        batches = [release_second_moment(records, sensitivity, config.noise_multiplier, Batch(rng))[0][:, rows, cols]
                   for _ in range(N_AUDIT // CHUNK)]
        return np.concatenate(batches) @ direction - centre

    with_record, without = scores(np.vstack([base, extra])), scores(base)
    sd = config.noise_multiplier * sensitivity
    return with_record, without, np.linspace(0.0, 6 * sd, 121)


def test_membership_audit_of_one_release_stays_below_epsilon_and_catches_an_understated_sensitivity():
    config = RecordDP(1.0, 1e-5, clip=0.8)
    rng = np.random.default_rng(2030)
    honest = _audit_scores(config, config.sensitivity(config.clip), rng)
    bound = empirical_epsilon_lower_bound(*honest[:2], 1e-5, honest[2])
    assert config.epsilon / 4 < bound <= config.epsilon  # below the claim, and with the power to refute a smaller one
    # noise for ||x||^2 <= C^2 only (forgetting the count indicators): half the sensitivity
    broken = _audit_scores(config, 0.5 * config.sensitivity(config.clip), rng)
    assert empirical_epsilon_lower_bound(*broken[:2], 1e-5, broken[2]) > config.epsilon


# ------------------------------------------------------------------ the experiment page's epsilons
def _pld_epsilon(z: float, releases: int, delta: float) -> float:
    accountant = PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4)
    accountant.compose(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(z), releases))
    return float(accountant.get_epsilon(delta))


def test_every_epsilon_on_the_record_dp_page_recomputes_with_dp_accounting():
    rows = [r for r in csv.DictReader(CSV.open()) if r["epsilon"]]
    assert {r["method"] for r in rows} == {"record-level DP", "site-level DP", "Analyze Gauss, pooled"}
    assert {float(r["epsilon"]) for r in rows} == {0.5, 1.0, 2.0, 5.0, 10.0}
    checked = {}
    for r in rows:
        key = (r["noise_multiplier"], r["releases"], r["delta"])
        if key not in checked:
            checked[key] = _pld_epsilon(float(r["noise_multiplier"]), int(r["releases"]), float(r["delta"]))
        assert float(r["reported_epsilon"]) == pytest.approx(checked[key], rel=2e-3)
        assert checked[key] <= float(r["epsilon"]) * (1 + 2e-3)  # each point keeps its nominal budget
        if r["method"] != "site-level DP" or r["data"] == "heart":  # one release per site: dp-accounting's own z
            assert int(r["releases"]) == 1
            smallest = pld_accountant.get_smallest_gaussian_noise(
                common.DifferentialPrivacyParameters(float(r["epsilon"]), float(r["delta"])), 1)
            assert float(r["noise_multiplier"]) == pytest.approx(smallest, rel=1e-3)


def _model_data(n_subjects, seed):
    """3 sites of views 20 / 20 / 20 drawn from the hierarchical model (q = 5), min-max scaled; a third held out."""
    from fedhier.data import MinMaxScaling, combine_ranges, site_ranges
    from fedhier.data.synthetic import make_federated_ppca

    fed = make_federated_ppca(3, n_subjects // 3, (20, 20, 20), 5, sd_mu=1.0, sd_W=1.0, sigma2_alpha=3.0,
                              sigma2_beta=2.0, random_state=seed)
    cut = 2 * (n_subjects // 3) // 3
    train = [{v: X[:cut] for v, X in s.items()} for s in fed.sites]
    test = {v: np.vstack([s[v][cut:] for s in fed.sites]) for v in fed.sites[0]}
    scaling = MinMaxScaling(combine_ranges([site_ranges(s) for s in train]))
    return [scaling.transform(s) for s in train], scaling.transform(test)


def test_default_bound_brings_epsilon_one_within_15_percent_of_the_noiseless_fit_on_30000_subjects():
    from fedhier.estimators.mvppca import FedMVPPCA
    from fedhier.metrics import reconstruction_mae

    sites, test = _model_data(30_000, seed=3)

    def mae(config):
        model = FedMVPPCA(n_components=5, privacy=config).fit(sites)
        return reconstruction_mae(test, model.reconstruct(test))

    noiseless = mae(RecordDP(1e6, 1e-5, clip=math.sqrt(60) / 2))  # no row clipped, noise negligible
    assert mae(RecordDP(1.0, 1e-5)) < 1.15 * noiseless
    assert mae(RecordDP(1.0, 1e-5, clip=math.sqrt(60) / 2)) > 1.5 * noiseless  # the bound that never clips
