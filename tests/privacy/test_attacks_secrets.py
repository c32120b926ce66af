"""Attacks on where the secrets come from, written as the adversary would run them.

(a) Whoever holds a published private fit, its model file and its configuration (the seed) replays
the fit on the data with and without one subject; when the sites' noise was derived from the seed,
the replay on the true data matches the publication exactly and decides membership.  With noise from
each site's operating system, the replay matches neither better: the published fit and the replay
differ by the noise on both.  Two runs of one private command differ.
(f) CollabDict: a neighbour that regenerates a site's chunk masks from the run's seed, or reads the
reply's scale off the spread of one chunk, learns nothing.
"""

import json

import numpy as np
import pytest

from fedhier.cli import main
from fedhier.data import load_alzheimer
from fedhier.demo import run_demo
from fedhier.estimators.collab import CollabDict
from fedhier.estimators.mvppca import FedMVPPCA
from fedhier.models.mvppca.dp import DPConfig
from fedhier.privacy.sampling import NOT_PRIVATE
from fedhier.protocol.base import RoundProtocol
from fedhier.protocol.messages import Field, MessageSpec
from fedhier.runtime import peer as peer_module
from fedhier.runtime.peer import PeerAggregation, simulate_peers
from two_view_sites import VIEWS, two_view_sites


def _sites(n_sites=3, n=40, seed=0):
    return two_view_sites(n_sites, n, seed)


def _means(model_or_path) -> np.ndarray:
    """The released means of every view, concatenated (no rotation ambiguity, unlike the loadings)."""
    model = FedMVPPCA.load(model_or_path) if not isinstance(model_or_path, FedMVPPCA) else model_or_path
    return np.concatenate([np.asarray(model.global_params_[v]["mu"]) for v in sorted(model.global_params_)])


def _undecided(published, replay_d, replay_d_prime):
    """The membership test of the replay attack: the replay on D must not match the publication better
    than the replay on D' by more than the noise allows (with seeded noise it matches to 0.0)."""
    dist_d = float(np.linalg.norm(published - replay_d))
    dist_d_prime = float(np.linalg.norm(published - replay_d_prime))
    assert dist_d > 0.0, "the replay on the true data reproduces the publication: membership is decided"
    assert 0.2 < dist_d / dist_d_prime < 5.0, (dist_d, dist_d_prime)


def _estimator_fit(sites, seed, **kw):
    return FedMVPPCA(n_components=2, n_rounds=3, n_local_iter=3, n_first_iter=5, random_state=seed,
                     privacy=DPConfig.total(1.0, 1e-5, n_rounds=3, n_views=len(VIEWS), spread=True), **kw).fit(sites)


def test_a_replaying_a_private_fit_from_its_saved_seed_cannot_tell_d_from_d_prime(tmp_path):
    sites = _sites()
    _estimator_fit(sites, 0).save(tmp_path / "published.npz")
    seed = FedMVPPCA.load(tmp_path / "published.npz").random_state  # everything the file holds
    without = [dict(s) for s in sites]
    without[0] = {v: x[1:] for v, x in sites[0].items()}  # D': the first subject of site 0 removed
    _undecided(_means(tmp_path / "published.npz"), _means(_estimator_fit(sites, seed)),
               _means(_estimator_fit(without, seed)))


def test_a_the_insecure_switch_reproduces_the_noise_and_says_the_result_is_not_private(tmp_path):
    sites = _sites()
    a, b = (_estimator_fit(sites, 0, insecure_reproducible_noise=True) for _ in range(2))
    assert np.array_equal(_means(a), _means(b))  # the replay attack's power: seeded noise is removed exactly
    assert a.privacy_report() == {"private": False, "note": NOT_PRIVATE, "epsilon": None, "delta": None}
    assert all(v["epsilon"] is None for v in a.privacy_spent_.values())
    a.save(tmp_path / "m.npz")
    meta = json.loads(bytes(np.load(tmp_path / "m.npz")["__meta__"]).decode())
    assert meta["privacy"] == NOT_PRIVATE and meta["params"]["insecure_reproducible_noise"] is True


@pytest.fixture
def fit_toml(tmp_path):
    data = load_alzheimer()
    cols = list(data.feature_names["csf"]) + list(data.feature_names["demographics"])
    rows = np.hstack([data.views["csf"], data.views["demographics"]])
    halves = np.array_split(np.arange(data.n_samples), 2)

    def write(folder, drop_first):
        folder.mkdir()
        for name, idx in zip("ab", halves):
            idx = idx[1:] if (drop_first and name == "a") else idx
            np.savetxt(folder / f"{name}.csv", rows[idx], delimiter=",", header=",".join(cols), comments="")
        toml = folder / "fit.toml"
        toml.write_text(
            "n_components = 2\nn_rounds = 3\nn_local_iter = 3\nn_first_iter = 5\n"
            f"[views]\ncsf = {json.dumps(list(data.feature_names['csf']))}\n"
            f"demographics = {json.dumps(list(data.feature_names['demographics']))}\n"
            '[[sites]]\nname = "a"\npath = "a.csv"\n[[sites]]\nname = "b"\npath = "b.csv"\n'
        )
        return toml

    return write(tmp_path / "D", False), write(tmp_path / "D_prime", True)


@pytest.mark.slow
def test_a_two_fedhier_fit_dp_runs_differ_and_a_replay_cannot_tell_d_from_d_prime(tmp_path, fit_toml, capsys):
    d, d_prime = fit_toml
    runs = {}
    for name, toml in (("published", d), ("again", d), ("replay_d_prime", d_prime)):
        assert main(["fit", "--config", str(toml), "--dp", "--out", str(tmp_path / name), "--quiet"]) == 0
        runs[name] = _means(tmp_path / name / "model.npz")
    capsys.readouterr()
    assert not np.array_equal(runs["published"], runs["again"])  # two runs of one fit.toml
    # the adversary's replay on D is a run of the same fit.toml with the stored seed: "again"
    _undecided(runs["published"], runs["again"], runs["replay_d_prime"])
    meta = json.loads(bytes(np.load(tmp_path / "published" / "model.npz")["__meta__"]).decode())
    assert meta["params"]["insecure_reproducible_noise"] is False and "privacy" not in meta


@pytest.mark.slow
def test_a_fedhier_demo_dp_runs_differ_and_report_epsilon_at_most_1_with_every_release(tmp_path):
    for name in ("one", "two"):
        run_demo(tmp_path / name, n_rounds=3, total_budget=(1.0, 1e-5), unit="site", progress=False)
    assert not np.array_equal(_means(tmp_path / "one" / "model.npz"), _means(tmp_path / "two" / "model.npz"))
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    report = json.loads((tmp_path / "one" / "privacy-report.json").read_text())
    views = ("proteins", "csf", "demographics")  # the demo's three views; missing_views names each site's absent ones
    assert any(summary["missing_views"])  # some site lacks a view, and still releases it (as pure noise)
    for site in range(len(summary["missing_views"])):
        entry = report["sites"][str(site)] if str(site) in report["sites"] else report["sites"][site]
        assert entry["epsilon"] <= 1.0 + 1e-9
        # every release: mu, W, sigma2 and the two spread scalars of every view of the analysis, every round
        assert len(entry["releases"]) == summary["rounds_run"] * len(views) * 5


@pytest.mark.slow
def test_the_default_fedhier_demo_dp_protects_subjects_at_epsilon_10_with_its_one_release_in_the_ledger(tmp_path, capsys):
    for name in ("one", "two"):
        assert main(["demo", "--dp", "--quiet", "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    assert not np.array_equal(_means(tmp_path / "one" / "model.npz"), _means(tmp_path / "two" / "model.npz"))
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    report = json.loads((tmp_path / "one" / "privacy-report.json").read_text())
    assert (summary["privacy_unit"], summary["epsilon"], summary["delta"]) == ("record", 10.0, 1e-5)
    assert report["unit"] == "record" and len(report["sites"]) == len(summary["site_sizes"])
    for entry in report["sites"].values():
        assert entry["epsilon"] <= 10.0 + 1e-9
        assert [r["block"] for r in entry["releases"]] == ["moments"]  # each site's noisy moments, once: nothing else left it
    assert summary["test_mae"] < summary["training_mean_test_mae"]  # the point of the default: better than the mean


# --------------------------------------------------------------------------- (f) CollabDict's chunk masks


class _SecretVector(RoundProtocol):
    """Each site replies its private vector; the sum is the broadcast."""

    name, combine = "secret-vector", "sum"

    def __init__(self, m):
        self.m = m

    @property
    def reply_spec(self):
        return MessageSpec("reply", {"x": Field((self.m,))})

    @property
    def broadcast_spec(self):
        return MessageSpec("total", {"total": Field((self.m,))})

    def initial_broadcast(self):
        return {"total": np.zeros(self.m)}

    def site_step(self, ctx, broadcast):
        return {"x": np.asarray(ctx.data, dtype=float)}

    def global_step(self, combined, round, previous):
        return {"total": combined["x"]}


def _recorded_chunks(monkeypatch, run):
    chunks = []
    original = peer_module.random_chunks

    def recorded(value, n_chunks, mask_scale, noise):
        out = original(value, n_chunks, mask_scale, noise)
        chunks.append((np.array(value), out))
        return out

    monkeypatch.setattr(peer_module, "random_chunks", recorded)
    result = run()
    monkeypatch.undo()
    return chunks, result


def test_f_collabdict_defaults_to_no_seed_and_a_replay_of_its_masks_from_the_seed_fails(monkeypatch):
    assert CollabDict().random_state is None
    rng = np.random.default_rng(3)
    sites = [rng.normal(size=(60, 3)) for _ in range(4)]
    model = CollabDict(n_components=2, aggregation="chunked", max_iter=2, random_state=0)
    chunks, _ = _recorded_chunks(monkeypatch, lambda: model.fit(sites))
    assert len(chunks) >= 4
    errors = []
    for k, (value, out) in enumerate(chunks):  # site order, round after round: the moments' round, then the fit's
        rnd, site = (1 if k < 4 else (k - 4) // 4 + 1), k % 4
        # the masks as they were once derived from the seed: SeedSequence(seed, spawn_key=(5, round, site))
        z = np.random.Generator(np.random.PCG64(np.random.SeedSequence(model.seed_, spawn_key=(5, rnd, site)))).normal(
            0.0, 1.0, size=(out.shape[0] - 1, value.size))
        diff = out[0] - out[-1]  # = sigma (2 z_1 + z_2 + ...) for the first and last chunk
        basis = z[0] + z.sum(axis=0)
        scale = float(np.dot(diff, basis) / np.dot(basis, basis))
        guess = out.shape[0] * (out[0] - scale * z[0])
        errors.append(np.linalg.norm(guess - value) / max(np.linalg.norm(value), 1e-12))
    assert min(errors) > 0.1, errors  # the seeded masks of the old code gave every reply to 1e-14


def test_f_one_chunk_does_not_tell_the_scale_of_the_reply(monkeypatch):
    """The neighbour holding one chunk estimates the reply's scale by the chunk's spread; replies 1000
    times larger must leave that spread where it was (once the masks' sd was 10 max|reply|)."""
    rng = np.random.default_rng(4)
    base = [rng.normal(size=50) for _ in range(5)]
    spread = {}
    for factor in (1.0, 1000.0):
        chunks, result = _recorded_chunks(monkeypatch, lambda: simulate_peers(
            _SecretVector(50), [factor * v for v in base], n_rounds=1, random_state=2,
            aggregation=PeerAggregation(method="chunked", n_chunks=3)))
        assert np.allclose(result.broadcast["total"], factor * np.sum(base, axis=0), rtol=1e-6)
        spread[factor] = np.median([np.std(out[0]) for _, out in chunks])
    assert 0.5 < spread[1000.0] / spread[1.0] < 2.0, spread
