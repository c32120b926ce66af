"""Attacks on the privacy guarantees, written as an honest-but-curious adversary would run them.

Each test plays one adversary of docs/privacy.md ("Threat model") with everything that
adversary legitimately holds -- the configuration, the run's public seed, every message it
receives -- and asserts that the attack fails:

(a) the coordinator predicts a site's DP noise from the public seed (in simulation and
    through the Flower ClientApp);
(b) a CollabDict neighbour reconstructs a peer's reply from two of its chunks;
(c) an audit of every field of every private reply finds none that depends on the site's
    data other than through a recorded DP release;
(d) a likelihood-ratio membership audit over the whole transcript of a private fit stays
    below the claimed epsilon (and exceeds it when a raw field is leaked on purpose, so the
    audit can fail);
(e) error replies carry the category of a failure, never a value of the data.

The attacks on files (traversal names, size bombs, checkpoints on other data) are in
``test_attacks_files.py``.
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
from audit_bounds import empirical_epsilon_lower_bound

import fedhier.models.mvppca.dp as dp_module
from fedhier.data.schema import ViewSchema
from fedhier.models.mvppca.dp import DPConfig
from fedhier.protocol.messages import Field, MessageSpec, decode
from fedhier.protocol.mvppca import MVPPCAProtocol
from fedhier.runtime import peer as peer_module
from fedhier.privacy.sampling import NoiseSource
from fedhier.runtime.peer import PeerAggregation, simulate_peers
from fedhier.runtime.simulate import run_site_step, simulate
from two_view_sites import VIEWS, two_view_sites

simulate_module = importlib.import_module("fedhier.runtime.simulate")  # the module, not the function of that name


def _sites(n_sites=3, n=50, seed=0):
    return two_view_sites(n_sites, n, seed)


def _protocol(privacy=None):
    schema = ViewSchema(tuple(VIEWS), tuple(VIEWS.values()))
    return MVPPCAProtocol(schema, 2, n_local_iter=3, n_first_iter=5, privacy=privacy)


def _dp(n_rounds=3, epsilon=1.0):
    return DPConfig.total(epsilon, 1e-5, n_rounds=n_rounds, n_views=len(VIEWS), spread=True)  # EM update: 5 releases per view


class NoiseRecorder:
    """Wraps the Gaussian/Laplace mechanisms used by Fed-mv-PPCA; :meth:`collect` returns the noise of every
    release made while a function runs."""

    def __init__(self, monkeypatch):
        self.noise: list[np.ndarray] = []
        for name in ("release_gaussian", "release_laplace"):
            monkeypatch.setattr(dp_module, name, self._wrap(getattr(dp_module, name)))

    def _wrap(self, release):
        def recorded(value, multiplier, sensitivity, rng):
            noised, event = release(value, multiplier, sensitivity, rng)
            self.noise.append(np.ravel(noised - np.asarray(value, dtype=float)))
            return noised, event

        return recorded

    def collect(self, run):
        self.noise = []
        out = run()
        return self.noise, out


def _correlation(guesses, truths):
    """Pearson correlation over all entries, each release scaled to unit RMS (the releases' scales differ)."""
    unit = lambda v: v / max(float(np.sqrt(np.mean(v**2))), 1e-300)  # noqa: E731
    x = np.concatenate([unit(g) for g in guesses])
    y = np.concatenate([unit(t) for t in truths])
    return float(np.corrcoef(x, y)[0, 1]), x.size


# --------------------------------------------------------------------------- (a) the coordinator and the noise


def test_a_coordinator_cannot_predict_a_sites_noise_from_the_public_seed(monkeypatch):
    """The coordinator knows the run's seed, the configuration and the data's shapes; it replays every
    site's step on stand-in data of the same shapes with generators derived from that seed (what the
    sites used before their secrets were their own) and takes the replayed noise as its guess."""
    sites, protocol, recorder = _sites(), _protocol(_dp()), NoiseRecorder(monkeypatch)
    # a deployment: the sites' secrets are their own entropy
    truth, run = recorder.collect(lambda: simulate(protocol, sites, n_rounds=3, random_state=None))
    stand_in = _sites(seed=1)  # data of the same shapes
    # the coordinator's replay from the public seed
    guess, _ = recorder.collect(lambda: simulate(protocol, stand_in, n_rounds=3, random_state=run.seed))
    assert len(truth) == len(guess) >= 50  # 3 rounds x 3 sites x 2 views x 3 blocks
    r, n = _correlation(guess, truth)
    assert abs(r) < 4.0 / math.sqrt(n), (r, n)  # zero within sampling error (4 standard errors)


def test_a_the_replay_attack_recovers_noise_drawn_from_a_known_seed(monkeypatch):
    """The same attack against sites whose secret the coordinator knows (the insecure switch derives it from
    the seed) recovers the noise exactly: the test above fails when the sites' secrets are derived from the seed."""
    sites, protocol, recorder = _sites(), _protocol(_dp()), NoiseRecorder(monkeypatch)
    truth, run = recorder.collect(lambda: simulate(protocol, sites, n_rounds=3, random_state=11,
                                                   insecure_reproducible_noise=True))
    guess, _ = recorder.collect(lambda: simulate(protocol, _sites(seed=1), n_rounds=3, random_state=run.seed,
                                                 insecure_reproducible_noise=True))
    r, _ = _correlation(guess, truth)
    assert r > 0.999


def test_a_flower_site_draws_its_noise_from_its_own_entropy(monkeypatch, tmp_path):
    """Through the Flower ClientApp (the code a SuperNode runs): the coordinator's request carries no
    seed, and a site started without one answers the same request with fresh noise each time, which the
    coordinator's replay from its public seed does not predict."""
    pytest.importorskip("flwr")
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):  # as Flower's app process sets them
        monkeypatch.setattr(TaskIdentity, name, value)

    from fedhier.cli.flower import write_demo_sites
    from fedhier.deploy.apps import client_app
    from fedhier.deploy.mvppca import FlowerFitConfig
    from fedhier.runtime.flower import RUN_CONFIG_KEY, _RECORD
    from fedhier.protocol.messages import encode

    path = write_demo_sites(tmp_path, n_sites=3, seed=3, n_components=2, n_rounds=2, n_local_iter=3, n_first_iter=5)
    config = FlowerFitConfig.read(path).replace(epsilon=1.0, delta=1e-5, out=str(tmp_path / "out"))
    protocol = config.protocol()
    broadcast = encode(protocol.broadcast_spec, protocol.initial_broadcast())

    def ask(site):
        request = ConfigRecord({"round": 1, "broadcast": broadcast})
        msg = Message(RecordDict({_RECORD: request}), dst_node_id=7, message_type="train")
        context = Context(run_id=1, node_id=7, node_config={"site": site, "data": str(tmp_path / f"{site}.csv")},
                          state=RecordDict(), run_config={RUN_CONFIG_KEY: config.to_json()})
        reply = client_app(msg, context).content.config_records[_RECORD]
        assert reply["status"] == "ok", reply
        return reply

    recorder = NoiseRecorder(monkeypatch)
    truth, _ = recorder.collect(lambda: [ask(site) for _ in range(3) for site in config.sites])

    def replay():  # the coordinator's replay from its public seed, even on the sites' own data
        for _ in range(3):
            for index, site in enumerate(config.sites):
                data = config.load_site(site, tmp_path / f"{site}.csv")
                run_site_step(protocol, data, index, 1, config.seed, broadcast, {})

    guess, _ = recorder.collect(replay)
    assert len(truth) == len(guess) >= 50
    r, n = _correlation(guess, truth)
    assert abs(r) < 4.0 / math.sqrt(n), (r, n)


# --------------------------------------------------------------------------- (b) CollabDict chunks


def _secret_sum_protocol(size):
    from fedhier.protocol.base import RoundProtocol

    class SecretSum(RoundProtocol):
        name = "secret-sum"

        @property
        def reply_spec(self):
            return MessageSpec("r", {"x": Field((size,))})

        @property
        def broadcast_spec(self):
            return MessageSpec("b", {"total": Field((size,))})

        def initial_broadcast(self):
            return {"total": np.zeros(size)}

        def site_step(self, ctx, broadcast):
            return {"x": np.asarray(ctx.data, dtype=float)}

        def global_step(self, combined, round, previous):
            return {"total": combined["x"]}

    return SecretSum()


def test_b_a_neighbour_with_two_chunks_cannot_reconstruct_a_reply(monkeypatch):
    """A neighbour of site s holds 2 of its C = 3 chunks (the first and the last) and knows the run's
    public seed; it regenerates the masks from that seed, reads their scale off the first chunk and
    adds them back to the last chunk.  That works only if the masks were drawn from the public seed."""
    chunks: list[tuple[int, np.ndarray, np.ndarray]] = []
    original = peer_module.random_chunks

    def recorded(value, n_chunks, mask_scale, rng):
        out = original(value, n_chunks, mask_scale, rng)
        chunks.append((len(chunks), np.array(value), out))
        return out

    monkeypatch.setattr(peer_module, "random_chunks", recorded)
    rng = np.random.default_rng(5)
    sites = [rng.normal(size=6) for _ in range(5)]
    run = simulate_peers(_secret_sum_protocol(6), sites, n_rounds=4, random_state=None,
                         aggregation=PeerAggregation(method="chunked", n_chunks=3))
    assert len(chunks) == 20  # 5 sites x 4 rounds

    def reconstruct(k, held):
        rnd, site = k // 5 + 1, k % 5  # the masks' generator before they came from the operating system
        z = np.random.Generator(np.random.PCG64(np.random.SeedSequence(run.seed, spawn_key=(5, rnd, site)))).normal(
            0.0, 1.0, size=(2, held.shape[1]))
        # chunk_1 = v/3 + scale z_1 and chunk_3 = v/3 - scale (z_1 + z_2): subtract to get the scale
        diff = held[0] - held[-1]
        scale = float(np.dot(diff, 2 * z[0] + z[1]) / np.dot(2 * z[0] + z[1], 2 * z[0] + z[1]))
        return 3.0 * (held[0] - scale * z[0])

    errors = []
    for k, value, out in chunks:
        guess = reconstruct(k, out[[0, 2]])
        errors.append(np.linalg.norm(guess - value) / np.linalg.norm(value))
    assert min(errors) > 0.1, errors  # 20 of 20 reconstructions fail


def test_b_the_chunk_attack_works_when_masks_come_from_a_known_seed(monkeypatch):
    """Against masks derived from a seed the neighbour knows (here the k-th split's seed is k), the attack
    above reconstructs every reply: the test above would fail if the masks were predictable."""
    chunks = []
    original = peer_module.random_chunks
    monkeypatch.setattr(peer_module, "random_chunks",
                        lambda value, c, scale, noise: chunks.append(
                            (np.array(value), original(value, c, scale, NoiseSource.seeded(len(chunks))))) or chunks[-1][1])
    rng = np.random.default_rng(5)
    sites = [rng.normal(size=6) for _ in range(5)]
    run = simulate_peers(_secret_sum_protocol(6), sites, n_rounds=4, random_state=8,
                         aggregation=PeerAggregation(method="chunked", n_chunks=3))
    for k, (value, out) in enumerate(chunks):
        z = NoiseSource.seeded(k).standard_normal((2, 6))
        diff = out[0] - out[2]
        scale = float(np.dot(diff, 2 * z[0] + z[1]) / np.dot(2 * z[0] + z[1], 2 * z[0] + z[1]))
        assert np.allclose(3.0 * (out[0] - scale * z[0]), value, atol=1e-9)


# --------------------------------------------------------------------------- (c) every field of every reply


class ReleaseReplayer:
    """Makes the DP mechanisms return the noised outputs of a recorded step, whatever value they are given."""

    def __init__(self, monkeypatch):
        self.recorded: list[list[tuple[np.ndarray, object]]] = []
        self.replay: list[tuple[np.ndarray, object]] | None = None
        for name in ("release_gaussian", "release_laplace"):
            monkeypatch.setattr(dp_module, name, self._wrap(getattr(dp_module, name)))

    def _wrap(self, release):
        def wrapped(value, multiplier, sensitivity, rng):
            if self.replay is not None:
                noised, event = self.replay.pop(0)
                return noised.copy(), event
            noised, event = release(value, multiplier, sensitivity, rng)
            self.recorded[-1].append((noised.copy(), event))
            return noised, event

        return wrapped


@pytest.mark.parametrize("aggregation", ["plain", "secure"])
def test_c_every_field_of_every_private_reply_is_public_or_a_release(monkeypatch, aggregation):
    """The audit runs each site step of a private fit again on *other* data while the mechanisms return
    the releases the real step made.  A field that is public or computed from the releases alone comes out
    identical; a field computed from the data (before: ``expected_ll``, ``safeguards``) differs."""
    sites, protocol = _sites(), _protocol(_dp())
    others = _sites(seed=99)
    replayer = ReleaseReplayer(monkeypatch)
    steps = []
    original = simulate_module.run_site_step

    def recorded_step(protocol, data, site, round, site_seed, broadcast_bytes, state, guard=None, noise_seed=None):
        replayer.recorded.append([])
        status, payload, new_state = original(protocol, data, site, round, site_seed, broadcast_bytes, state, guard, noise_seed)
        steps.append((site, round, site_seed, broadcast_bytes, dict(state), status, payload, replayer.recorded[-1]))
        return status, payload, new_state

    monkeypatch.setattr(simulate_module, "run_site_step", recorded_step)
    kw = {}
    if aggregation == "secure":
        from fedhier.secure.secure_round import SecureAggregator

        kw = dict(aggregation="secure", aggregator=SecureAggregator(len(sites)))
    simulate(protocol, sites, n_rounds=3, random_state=4, **kw)
    assert len(steps) == 9 and all(status == "ok" for *_, status, _, _ in steps)
    leaks, undeclared = [], []
    for site, rnd, site_seed, broadcast, state, _, payload, releases in steps:
        real = decode(protocol.reply_spec, payload)
        replayer.replay = list(releases)
        status, other, _ = original(protocol, others[site], site, rnd, site_seed, broadcast, state)
        replayer.replay = None
        assert status == "ok", other
        counterfactual = decode(protocol.reply_spec, other)
        assert set(counterfactual) == set(real)
        leaks += [(site, rnd, key) for key in real if not np.array_equal(real[key], counterfactual[key])]
        undeclared += [key for key in real if getattr(protocol.reply_spec.fields[key], "disclosure", "raw") not in ("public", "release")]
    assert leaks == []
    assert undeclared == []  # and each field says what it is


def test_c_a_raw_field_in_a_private_reply_is_refused_before_it_is_sent():
    """The protocol layer's check: a private protocol that tried to send a field computed from raw data
    (here the old ``expected_ll``) has its step refused; nothing is encoded."""

    class Leaky(MVPPCAProtocol):
        def site_step(self, ctx, broadcast):
            reply = super().site_step(ctx, broadcast)
            reply["expected_ll"] = np.asarray(-123.0)
            return reply

    schema = ViewSchema(tuple(VIEWS), tuple(VIEWS.values()))
    leaky = Leaky(schema, 2, n_local_iter=3, n_first_iter=5, privacy=_dp())
    broadcast = leaky.broadcast_spec.validate(leaky.initial_broadcast())
    from fedhier.protocol.messages import encode

    status, payload, _ = run_site_step(leaky, _sites()[0], 0, 1, 3, encode(leaky.broadcast_spec, broadcast), {})
    assert status == "error" and payload.startswith("DisclosureError") and "expected_ll" in payload
    # a release field without any recorded release is refused too
    from fedhier.protocol.base import SiteContext, check_disclosure

    ctx = SiteContext(site=0, round=1, rng=np.random.default_rng(0), data=None)
    with pytest.raises(Exception, match="recorded no differentially private release"):
        check_disclosure(leaky, {"a/sum_mu": np.zeros(4)}, ctx.releases)


# --------------------------------------------------------------------------- (d) membership over the transcript


def _transcripts(protocol, sites, n_fits, n_rounds):
    """Site 0's replies of ``n_fits`` private fits (all fields, all rounds), each from fresh site entropy."""
    rows = []
    for _ in range(n_fits):
        replies = []
        original = simulate_module.run_site_step

        def keep(protocol, data, site, round, site_seed, broadcast_bytes, state, guard=None, noise_seed=None):
            out = original(protocol, data, site, round, site_seed, broadcast_bytes, state, guard, noise_seed)
            if site == 0 and out[0] == "ok":
                replies.append(protocol.reply_spec.flatten(decode(protocol.reply_spec, out[1])))
            return out

        simulate_module.run_site_step = keep
        try:
            simulate(protocol, sites, n_rounds=n_rounds, random_state=None)
        finally:
            simulate_module.run_site_step = original
        rows.append(np.concatenate(replies))
    return np.array(rows)


def _membership_bound(protocol, n_fits=240, n_rounds=2):
    """Empirical epsilon lower bound of a membership test on site 0's transcript: D has one more subject.

    The attacker trains a diagonal linear discriminant on half the fits, thresholds its score
    (Clopper--Pearson bounds at confidence 1 - 1e-3 on the other half, :mod:`audit_bounds`).
    """
    sites = _sites(n=30, seed=7)
    without = [dict(s) for s in sites]
    without[0] = {v: x[1:] for v, x in sites[0].items()}  # one subject removed
    d = _transcripts(protocol, sites, n_fits, n_rounds)
    d_prime = _transcripts(protocol, without, n_fits, n_rounds)
    half = n_fits // 2
    train_d, train_p = d[:half], d_prime[:half]
    var = 0.5 * (train_d.var(axis=0) + train_p.var(axis=0)) + 1e-12
    direction = (train_d.mean(axis=0) - train_p.mean(axis=0)) / var
    score_d, score_p = d @ direction, d_prime @ direction
    # the helper chooses the threshold on the first half (the discriminant's training fits) and bounds
    # epsilon on the second half, which neither the direction nor the threshold has seen
    thresholds = np.quantile(np.r_[score_d[:half], score_p[:half]], np.linspace(0.01, 0.99, 99))
    return empirical_epsilon_lower_bound(score_d, score_p, 1e-5, thresholds)


@pytest.fixture(scope="module")
def claimed_epsilon():
    from fedhier.models.mvppca.dp import ledger_from_history

    sites = _sites(n=30, seed=7)
    config = _dp(n_rounds=2)
    run = simulate(_protocol(config), sites, n_rounds=2, random_state=1)
    ledger = ledger_from_history(config, [list(s) for s in sites], run.history)
    return ledger.spent(1e-5)[0]["epsilon"]


def test_d_membership_audit_of_the_whole_transcript_stays_below_the_claimed_epsilon(claimed_epsilon):
    schema = ViewSchema(tuple(VIEWS), tuple(VIEWS.values()))
    # local fits near convergence, where a raw likelihood would give one subject away (the audit's power)
    bound = _membership_bound(MVPPCAProtocol(schema, 2, n_local_iter=10, n_first_iter=30, privacy=_dp(n_rounds=2)))
    assert claimed_epsilon <= 1.0 + 1e-9
    assert bound < claimed_epsilon, (bound, claimed_epsilon)


def test_d_the_membership_audit_catches_a_leaked_raw_field(claimed_epsilon):
    """The same audit against a protocol that also sends the raw expected log-likelihood, declared public
    to get past the protocol check (what every private reply did before): the bound exceeds the claim."""

    class Leaky(MVPPCAProtocol):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            fields = dict(self._reply_spec.fields)
            fields["expected_ll"] = Field((), optional=True, disclosure="public")
            self._reply_spec = MessageSpec(self._reply_spec.name, fields)

        def site_step(self, ctx, broadcast):
            from fedhier.models.mvppca import local

            reply = super().site_step(ctx, broadcast)
            fit = local.fit_local(ctx.data, self.n_components, None, n_iter=3, rng=np.random.default_rng(0))
            reply["expected_ll"] = np.asarray(float(fit.expected_ll[-1]))
            return reply

    schema = ViewSchema(tuple(VIEWS), tuple(VIEWS.values()))
    bound = _membership_bound(Leaky(schema, 2, n_local_iter=10, n_first_iter=30, privacy=_dp(n_rounds=2)))
    assert bound > claimed_epsilon, (bound, claimed_epsilon)


# --------------------------------------------------------------------------- (e) error replies


def test_e_an_error_reply_carries_the_category_not_the_value():
    secret = "Jane Doe 1950-01-02"

    class Failing(MVPPCAProtocol):
        def site_step(self, ctx, broadcast):
            raise ValueError(f"could not convert {secret!r} to float")

    schema = ViewSchema(tuple(VIEWS), tuple(VIEWS.values()))
    failing = Failing(schema, 2)
    from fedhier.protocol.messages import encode

    broadcast = encode(failing.broadcast_spec, failing.broadcast_spec.validate(failing.initial_broadcast()))
    status, payload, _ = run_site_step(failing, _sites()[0], 0, 1, None, broadcast, {})
    assert status == "error" and payload.startswith("ValueError") and "Jane" not in payload and "1950" not in payload
    # what the runner reports when too few sites replied holds the categories only
    with pytest.raises(simulate_module.RoundFailed) as info:
        simulate(failing, _sites(), n_rounds=1, random_state=0)
    assert "ValueError" in str(info.value) and "Jane" not in str(info.value)


def test_every_release_a_site_makes_is_in_the_accountants_ledger(monkeypatch):
    """The releases each site step records (what it actually noised) are exactly the events of the ledger
    the estimator reports epsilon from, site by site and round by round."""
    from fedhier import FedMVPPCA

    steps = {}
    original = simulate_module.run_site_step

    def recorded_step(protocol, data, site, round, site_seed, broadcast_bytes, state, guard=None, noise_seed=None):
        from fedhier.protocol import base

        made = []
        real_check = base.check_disclosure

        def spy(protocol, reply, releases):
            made.extend(releases)
            return real_check(protocol, reply, releases)

        monkeypatch.setattr(simulate_module, "check_disclosure", spy)
        out = original(protocol, data, site, round, site_seed, broadcast_bytes, state, guard, noise_seed)
        steps[(site, round)] = [(label, event) for label, event in made]
        return out

    monkeypatch.setattr(simulate_module, "run_site_step", recorded_step)
    sites = _sites()
    del sites[2]["b"]  # a site that lacks a view releases it all the same, at the anchor
    model = FedMVPPCA(n_components=2, n_rounds=3, n_local_iter=3, n_first_iter=5, random_state=0,
                      privacy=_dp(n_rounds=3)).fit(sites)
    ledger = model.privacy_ledger_
    assert len(steps) == 9 and all(steps.values())  # 3 sites x 3 rounds, each with its releases
    for (site, rnd), made in steps.items():
        accounted = [(r.block, r.event) for r in ledger.releases(site) if r.round == rnd]
        assert made == accounted, (site, rnd)
    assert all(v["epsilon"] <= 1.0 + 1e-9 for v in model.privacy_spent_.values())
