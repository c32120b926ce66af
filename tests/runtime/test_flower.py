"""Flower runtime (issue 6): our round loop over Flower's Message API equals simulate().

Two kinds of tests:

* fast tests of the round loop against an in-memory stand-in for Flower's ``Grid`` that
  runs the real ClientApp in this process (dropouts, errors, minimum sites, site names),
  of the fit configuration, of the command lines and of the TLS certificates;
* integration tests (marked) that start a real ``flower-superlink`` and three
  ``flower-supernode`` processes on 127.0.0.1, plain and with TLS + node authentication, fit Fed-mv-PPCA on
  three bundled-data sites with ``fedhier flower run`` and compare with simulate() to
  1e-10; one SuperNode is killed mid-fit and the fit completes from the other two; a
  secure-summation fit on the same kind of federation is marked slow as well.
  Every process is stopped by PID at the end, pass or fail.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedhier[flower]')")

from flwr.app import Context, RecordDict  # noqa: E402

from fedhier.data import load_alzheimer, partition  # noqa: E402
from fedhier.cli.flower import (  # noqa: E402
    LoopbackFederation,
    cli_flower,
    make_certificates,
    make_site_key,
    superlink_command,
    supernode_command,
    write_demo_sites,
)
from fedhier.secure.secure_round import SecureAggregator  # noqa: E402
from fedhier.protocol.messages import decode  # noqa: E402
from fedhier.deploy.apps import client_app, server_app  # noqa: E402
from fedhier.deploy.mvppca import FlowerFitConfig  # noqa: E402
import fedhier.runtime.flower as flower_runtime  # noqa: E402
from fedhier.runtime.flower import (  # noqa: E402
    RUN_CONFIG_KEY,
    SECURE_STEPS,
    read_result,
    run_rounds,
    secure_site_step,
    write_result,
)
from fedhier.runtime.simulate import RoundFailed, simulate, site_noise  # noqa: E402

SITES = ("hospital-a", "hospital-b", "hospital-c")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """Three Alzheimer hospitals on disk, the fit config, and the same sites in memory."""
    folder = tmp_path_factory.mktemp("flower-sites")
    path = write_demo_sites(folder, n_sites=3, seed=3, n_components=3, n_rounds=3, n_local_iter=4, n_first_iter=8)
    data = load_alzheimer()
    sites = partition(data.views, data.labels, 3, "iid", random_state=3).sites
    return folder, FlowerFitConfig.read(path), sites


def _max_diff(a, b) -> float:
    assert set(a) == set(b)
    return max(float(np.max(np.abs(np.asarray(a[k], float) - np.asarray(b[k], float)))) for k in a)


# --------------------------------------------------------------------------- in-memory grid


class LocalGrid:
    """Stand-in for ``flwr.serverapp.Grid``: delivers each message to the real ClientApp.

    ``behaviour[node]`` is "ok" (answer), "silent" (never answer: a dead SuperNode),
    "crash" (Flower error reply, as when the ClientApp process dies), "unreachable"
    (the SuperLink's reply when the message to a vanished SuperNode expires) or "no
    heartbeat" (the SuperNode's reply when Flower gave up on its ClientApp).  A node in
    ``vanish_after[(round, message type)]`` becomes unreachable once it has answered that
    message.  ``received`` keeps every (message type, reply) the server pulled, and
    ``delivered`` every (node, message type, content) a node's ClientApp was given.
    """

    def __init__(self, config, nodes: dict[int, tuple[str, Path]], behaviour: dict[int, str] | None = None):
        self.config = config
        self.nodes = nodes
        self.behaviour = behaviour or {}
        self.vanish_after: dict[tuple[int, str], list[int]] = {}
        self.states = {n: RecordDict() for n in nodes}
        self.inbox: dict[str, object] = {}
        self.sent: list[tuple[int, str]] = []
        self.received: list[tuple[str, object]] = []
        self.delivered: list[tuple[int, str, dict]] = []
        self._ids = itertools.count()
        # each site's own secret seed, set to the simulation's so that the fits can be compared bit for bit
        self.node_seed = {"seed": str(config.seed)}
        # each site's long-term key and the roster of them all, given to every SuperNode by its operator
        folder = Path(next(iter(nodes.values()))[1]).parent
        self.site_keys, self.roster = _site_keys(folder, {*config.sites, *(name for name, _ in nodes.values())})

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mid = f"m{next(self._ids)}"
            msg.metadata.__dict__["_message_id"] = mid  # what Flower's own grids do on push
            self.inbox[mid] = msg
            self.sent.append((msg.metadata.dst_node_id, msg.metadata.group_id))
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        replies = []
        for mid in message_ids:
            msg = self.inbox.pop(mid, None)
            if msg is None:
                continue
            node = msg.metadata.dst_node_id
            behaviour = self.behaviour.get(node, "ok")
            if behaviour == "silent":
                self.inbox[mid] = msg
                continue
            if behaviour in ("crash", "unreachable", "no heartbeat"):
                from flwr.app import Error, Message

                # "no heartbeat": what a SuperNode replies when its ClientApp's heartbeats stopped
                error = {"crash": Error(code=0, reason="ClientApp process died"),
                         "unreachable": Error(code=3, reason="Message Unavailable"),
                         "no heartbeat": Error(code=8, reason="ClientApp stopped responding.")}[behaviour]
                replies.append(Message(error, reply_to=msg))
                continue
            site, path = self.nodes[node]
            context = Context(
                run_id=1, node_id=node, state=self.states[node],
                node_config={"site": site, "data": str(path), **self.node_seed, "site-key": str(self.site_keys[site]),
                             "roster": str(self.roster)},
                run_config={RUN_CONFIG_KEY: self.config.to_json()},
            )
            self.delivered.append((node, msg.metadata.message_type, dict(msg.content.config_records["fedhier"])))
            reply = client_app(msg, context)
            replies.append(reply)
            self.received.append((msg.metadata.message_type, reply))
            if node in self.vanish_after.get((int(msg.metadata.group_id), msg.metadata.message_type), ()):
                self.behaviour[node] = "unreachable"
        return replies


def _site_keys(folder: Path, names) -> tuple[dict[str, Path], Path]:
    """A key pair per site in ``folder/site-keys`` (made once) and the roster file of all of them."""
    from fedhier.secure.keys import Roster, load_signing_key

    keys = {}
    for name in sorted(names):
        keys[name] = folder / "site-keys" / name
        if not keys[name].exists():
            make_site_key(keys[name])
    roster = folder / "site-keys" / "roster.txt"
    Roster({name: load_signing_key(path) for name, path in keys.items()}).write(roster)
    return keys, roster


def _identity(folder: Path, site: str, names) -> dict:
    """What ``secure_site_step`` takes from a SuperNode's config: its key and the roster."""
    from fedhier.secure.keys import Roster, load_signing_key

    keys, roster = _site_keys(folder, names)
    return {"signing_key": load_signing_key(keys[site]), "roster": Roster.read(roster)}


@pytest.fixture(autouse=True)
def server_identity(monkeypatch):
    """The identity Flower's ServerApp process sets before the app runs (run, node, task ids)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _grid(folder, config, behaviour=None, names=SITES):
    nodes = {1000 + 7 * k: (name, folder / f"{name}.csv") for k, name in enumerate(names)}
    return LocalGrid(config, nodes, behaviour), list(nodes)


def _run(grid, config, **kw):
    options = dict(n_rounds=config.n_rounds, seed=config.seed, min_sites=1, round_timeout=5.0, connect_timeout=1.0, poll_interval=0.01)
    options.update(kw)
    return run_rounds(grid, config.protocol(), config.sites, **options)


def test_round_loop_equals_simulate(demo):
    folder, config, sites = demo
    grid, _ = _grid(folder, config)
    result = _run(grid, config)
    reference = simulate(config.protocol(), sites, n_rounds=config.n_rounds, random_state=config.seed)
    assert _max_diff(result.broadcast, reference.broadcast) <= 1e-10
    assert [r.sites for r in result.history] == [[0, 1, 2]] * config.n_rounds
    assert [r.bytes_up for r in result.history] == [r.bytes_up for r in reference.history]
    assert [r.metrics for r in result.history] == [r.metrics for r in reference.history]


def test_round_loop_with_the_coordinator_s_extrapolation_equals_simulate(demo):
    """Enough rounds for SQUAREM to extrapolate: the coordinator's state lives in the protocol, the same on both."""
    folder, config, sites = demo
    grid, _ = _grid(folder, config)
    protocol, reference_protocol = config.protocol(), config.protocol()
    options = dict(seed=config.seed, min_sites=1, round_timeout=5.0, connect_timeout=1.0, poll_interval=0.01)
    result = run_rounds(grid, protocol, config.sites, n_rounds=9, **options)
    reference = simulate(reference_protocol, sites, n_rounds=9, random_state=config.seed)
    assert max(protocol.accelerator.steps) > 1.0
    assert protocol.accelerator.steps == reference_protocol.accelerator.steps
    assert _max_diff(result.broadcast, reference.broadcast) <= 1e-10


def _public_ranges(folder, config):
    """The sites' files in their own units, public ranges a little wider than every column's values, and the files
    scaled by hand with them: ``(raw sites, ranges, scaled sites)``."""
    raw = [config.load_site(name, folder / f"{name}.csv") for name in SITES]  # no ranges: the files' own units
    columns = [c for cols in config.views.values() for c in cols]
    pooled = {c: np.concatenate([s[v][:, config.views[v].index(c)] for s in raw for v in s if c in config.views[v]])
              for c in columns}
    ranges = {c: (float(np.floor(np.nanmin(x))) - 1.0, float(np.ceil(np.nanmax(x))) + 1.0) for c, x in pooled.items()}
    by_hand = [{v: (X - np.array([ranges[c][0] for c in config.views[v]]))
                / (np.array([ranges[c][1] for c in config.views[v]]) - np.array([ranges[c][0] for c in config.views[v]]))
                for v, X in s.items()} for s in raw]
    return raw, ranges, by_hand


def test_public_ranges_scale_each_site_s_own_file_and_equal_simulate_on_files_scaled_by_hand(demo):
    """``scale = "minmax"`` with ``[ranges]``: the ClientApp scales its file from the run configuration; no other message."""
    folder, config, _ = demo
    raw, ranges, by_hand = _public_ranges(folder, config)
    columns = [c for cols in config.views.values() for c in cols]
    scaled = config.replace(ranges=ranges)
    assert type(scaled).from_json(scaled.to_json()) == scaled  # the ranges travel in the run configuration
    grid, _ = _grid(folder, scaled)
    result = _run(grid, scaled)
    reference = simulate(scaled.protocol(), by_hand, n_rounds=scaled.n_rounds, random_state=scaled.seed)
    assert _max_diff(result.broadcast, reference.broadcast) <= 1e-10
    unscaled = simulate(config.protocol(), raw, n_rounds=config.n_rounds, random_state=config.seed)
    assert _max_diff(result.broadcast, unscaled.broadcast) > 1e-3  # the scaling changed the fit
    assert len(grid.sent) == (1 + scaled.n_rounds) * len(SITES)  # "which site?", then the model's rounds
    # a value outside its declared range: the site names the column and row, never the value
    tight = config.replace(ranges={**ranges, columns[0]: (ranges[columns[0]][0] + 1.0, ranges[columns[0]][0] + 1.5)})
    from fedhier.data.sitefiles import SiteDataError

    with pytest.raises(SiteDataError, match=rf"site 'hospital-a': column '{columns[0]}': \d+ value\(s\) outside its declared range"):
        tight.load_site("hospital-a", folder / "hospital-a.csv")


@pytest.fixture
def seeded_noise(monkeypatch):
    """Every site's noise drawn from a seed, in the Flower sites and in the reference simulation alike, so that the
    two compare bit for bit (a site's noise otherwise comes from its operating system)."""
    import importlib

    from fedhier.privacy.sampling import NoiseSource

    monkeypatch.setattr(importlib.import_module("fedhier.runtime.simulate"), "site_noise", lambda noise_seed, round, site: NoiseSource.seeded(
        np.random.SeedSequence(0, spawn_key=(6, round, site))))
    return monkeypatch


def test_round_loop_with_client_level_dp_equals_simulate(demo, tmp_path, seeded_noise):
    folder, config, sites = demo
    assert config.replace(tol=0.02).hooks().stop is not None
    config = config.replace(epsilon=2.0, delta=1e-5, out=str(tmp_path / "out"))
    assert config.replace(tol=0.02).hooks().stop is None  # a total budget runs every round it was calibrated for
    grid, _ = _grid(folder, config)
    result = _run(grid, config)
    reference = simulate(config.protocol(), sites, n_rounds=config.n_rounds, random_state=config.seed)
    assert config.protocol().privacy is not None
    assert _max_diff(result.broadcast, reference.broadcast) <= 1e-10
    write_result(config.out, config, result)
    spent = json.loads((Path(config.out) / "summary.json").read_text())["privacy_spent"]
    assert set(spent) == set(config.sites) and all(v["epsilon"] <= 2.0 + 1e-9 for v in spent.values())
    # with secure summation too (one round): the sites noise their blocks, then mask them
    config = config.replace(aggregation="secure", n_rounds=1)
    protocol = config.protocol()
    assert config.reply_spec() == protocol.reply_spec  # what the sites flatten, without calibrating the noise
    result = run_rounds(_grid(folder, config)[0], protocol, config.sites, n_rounds=1, seed=config.seed, round_timeout=5.0,
                        connect_timeout=1.0, poll_interval=0.01, aggregator=config.aggregator())
    reference = simulate(protocol, sites, n_rounds=1, random_state=config.seed, aggregation="secure", aggregator=config.aggregator())
    assert _max_diff(result.broadcast, reference.broadcast) == 0


def test_record_level_dp_over_flower_is_one_noisy_release_per_site_and_equals_the_estimator(demo, tmp_path, seeded_noise):
    """privacy_unit = "record": one round in which each site releases its noisy moments, the noise drawn from the
    site's operating system (here a seed shared with the estimator, to compare); the saved model equals FedMVPPCA(privacy=RecordDP) on the files scaled by hand, and summary.json
    states what each site spent."""
    from fedhier.estimators.mvppca import FedMVPPCA
    from fedhier.privacy.analyze_gauss import RecordDP

    folder, config, _ = demo
    _, ranges, by_hand = _public_ranges(folder, config)
    record = config.replace(ranges=ranges, epsilon=10.0, delta=1e-5, privacy_unit="record", out=str(tmp_path / "out"))
    assert record.n_rounds == 1 and type(record).from_json(record.to_json()) == record
    assert record.reply_spec() == record.protocol().reply_spec and record.reply_spec().fields["moments"].disclosure == "release"
    grid, _ = _grid(folder, record)
    result = _run(grid, record)
    assert len(grid.sent) == 2 * len(SITES) and [r.sites for r in result.history] == [[0, 1, 2]]  # "which site?", one release
    write_result(record.out, record, result)
    saved = FedMVPPCA.load(Path(record.out) / "model.npz")
    estimator = FedMVPPCA(n_components=record.n_components, privacy=RecordDP(10.0, 1e-5), random_state=record.seed,
                          ig_solver=record.ig_solver).fit(by_hand)
    for site in by_hand:
        np.testing.assert_allclose(saved.transform(site), estimator.transform(site), rtol=0, atol=1e-10)
    summary = json.loads((Path(record.out) / "summary.json").read_text())
    assert summary["privacy_unit"] == "record"
    for k, name in enumerate(SITES):
        assert summary["privacy_spent"][name]["epsilon"] == pytest.approx(estimator.privacy_spent_[k]["epsilon"], rel=1e-12)
        assert 9.0 < summary["privacy_spent"][name]["epsilon"] <= 10.0 + 1e-9
    # a site whose own policy protects only whole data sets refuses before it reads its file
    from fedhier.privacy.policy import SitePolicy
    from fedhier.runtime.flower import site_round
    from fedhier.runtime.guard import SiteGuard

    refused, _ = site_round(record, SITES[0], folder / f"{SITES[0]}.csv", {"round": 1, "broadcast": b""}, {},
                            guard=SiteGuard(SitePolicy(unit="site", modes=("dp",)), "flower-run-1"))
    assert refused == {"site": SITES[0], "status": "error",
                       "error": "PolicyRefusal: refused by the site's policy (the reason is in the site's own log)"}
    # the noise is the site's own: from its operating system, another model
    import importlib

    seeded_noise.setattr(importlib.import_module("fedhier.runtime.simulate"), "site_noise", site_noise)
    grid.node_seed = {"seed": str(record.seed + 1)}
    other = _run(grid, record)
    assert _max_diff(other.broadcast, result.broadcast) > 1e-3
    text = (Path(folder) / "fit.toml").read_text()
    ranges_table = "\n[ranges]\n" + "".join(f'"{c}" = [{lo}, {hi}]\n' for c, (lo, hi) in ranges.items())

    def read(keys: str, public: bool = True):
        return FlowerFitConfig.from_toml(text.replace("[views]", keys + "[views]", 1) + (ranges_table if public else ""))

    assert "n_rounds = 3" in text and read('scale = "minmax"\nepsilon = 10.0\nprivacy_unit = "record"\n').n_rounds == 1
    with pytest.raises(ValueError, match="privacy_unit = 'record' needs a privacy budget"):
        read('scale = "minmax"\nprivacy_unit = "record"\n')
    with pytest.raises(ValueError, match="nothing to sum securely"):
        read('scale = "minmax"\nepsilon = 10.0\nprivacy_unit = "record"\naggregation = "secure"\n')
    with pytest.raises(ValueError, match=r"set scale = \"minmax\" with public bounds in a \[ranges\] table"):
        read('epsilon = 10.0\nprivacy_unit = "record"\n', public=False)


@pytest.mark.parametrize("how, reason", [("silent", "no reply within 0.3 s"), ("unreachable", "Flower error 3: Message Unavailable")])
def test_site_that_disappears_is_dropped_once_and_lost(demo, how, reason):
    folder, config, sites = demo
    grid, nodes = _grid(folder, config)

    def vanish_after_round_1(record, _broadcast):
        if record.round == 1:
            grid.behaviour[nodes[1]] = how

    result = _run(grid, config, round_timeout=0.3, callbacks=[vanish_after_round_1])
    assert result.lost == {1: 2}
    assert result.history[0].sites == [0, 1, 2]
    assert result.history[1].failed[1] == reason
    assert all(r.sites == [0, 2] for r in result.history[1:])
    assert all(r.absent == [1] for r in result.history[2:])
    assert sum(1 for node, group in grid.sent if node == nodes[1] and group != "0") == 2  # not asked after it was lost
    reference = simulate(config.protocol(), sites, n_rounds=config.n_rounds, random_state=config.seed,
                         participation={r: [1] for r in range(2, config.n_rounds + 1)})
    assert _max_diff(result.broadcast, reference.broadcast) <= 1e-10


def test_node_silent_from_the_start_is_reported_and_the_site_absent(demo):
    folder, config, sites = demo
    grid, nodes = _grid(folder, config)
    grid.behaviour[nodes[0]] = "silent"
    result = _run(grid, config, round_timeout=0.3)
    assert result.ignored == {nodes[0]: "no reply within 0.3 s"}
    assert all(r.absent == [0] and r.sites == [1, 2] for r in result.history)
    reference = simulate(config.protocol(), sites, n_rounds=config.n_rounds, random_state=config.seed,
                         participation={r: [0] for r in range(1, config.n_rounds + 1)})
    assert _max_diff(result.broadcast, reference.broadcast) <= 1e-10


def test_site_whose_step_fails_is_dropped_per_round(demo, tmp_path):
    folder, config, sites = demo
    broken = tmp_path / "broken.csv"
    lines = (folder / "hospital-c.csv").read_text().splitlines()
    broken.write_text("\n".join([lines[0], lines[1].replace(lines[1].split(",")[0], "not-a-number", 1), *lines[2:]]) + "\n")
    grid, nodes = _grid(folder, config)
    grid.nodes[nodes[2]] = ("hospital-c", broken)
    result = _run(grid, config)
    for record in result.history:
        assert record.sites == [0, 1]
        assert "non-numeric value in column" in record.failed[2] and ", row 1" in record.failed[2]
        assert "not-a-number" not in record.failed[2]  # the coordinator learns where, never what
    assert result.lost == {}
    assert sum(1 for node, group in grid.sent if node == nodes[2] and group != "0") == config.n_rounds  # asked every round
    reference = simulate(config.protocol(), sites, n_rounds=config.n_rounds, random_state=config.seed,
                         participation={r: [2] for r in range(1, config.n_rounds + 1)})
    assert _max_diff(result.broadcast, reference.broadcast) <= 1e-10


def test_a_clientapp_flower_refuses_is_named_with_its_cause_and_remedy(demo, monkeypatch):
    """Flower's own refusals end a site's part at once, with one line saying why and what to do: a ClientApp
    whose heartbeats stopped is lost (not asked again); SuperNodes silent through Flower's start window stop the
    fit before round 1, not after round_timeout."""
    folder, config, sites = demo
    grid, nodes = _grid(folder, config)

    def no_heartbeat_after_round_1(record, _broadcast):
        if record.round == 1:
            grid.behaviour[nodes[1]] = "no heartbeat"

    result = _run(grid, config, round_timeout=5.0, callbacks=[no_heartbeat_after_round_1])
    assert result.lost == {1: 2}
    reason = result.history[1].failed[1]
    assert reason.startswith("its ClientApp stopped sending Flower's heartbeat") and "lower the host's load" in reason
    assert sum(1 for node, group in grid.sent if node == nodes[1] and group != "0") == 2  # not asked again
    reference = simulate(config.protocol(), sites, n_rounds=config.n_rounds, random_state=config.seed,
                         participation={r: [1] for r in range(2, config.n_rounds + 1)})
    assert _max_diff(result.broadcast, reference.broadcast) <= 1e-10

    monkeypatch.setattr(flower_runtime, "START_WINDOW", 0.3)  # Flower's is 60 s
    grid, nodes = _grid(folder, config)
    grid.behaviour.update({nodes[0]: "silent", nodes[2]: "silent"})
    t0 = time.monotonic()
    with pytest.raises(RoundFailed) as info:
        _run(grid, config, min_sites=2, round_timeout=600.0)
    assert time.monotonic() - t0 < 600.0  # the start window, not round_timeout
    line = str(info.value)
    assert "\n" not in line and line.startswith("round 1: 1 site(s) answered before the round, at least 2 needed")
    cause = f"SuperNode {nodes[0]}, SuperNode {nodes[2]}: its ClientApp did not start within Flower's heartbeat window (0.3 s)"
    assert cause in line and line.count("heartbeat window") == 1 and "restart the SuperNode" in line
    assert not any(group != "0" for _, group in grid.sent)  # no round was sent


def test_too_few_sites_stop_the_fit_with_a_clear_error(demo):
    folder, config, _ = demo
    grid, nodes = _grid(folder, config)
    grid.behaviour.update({nodes[0]: "silent", nodes[2]: "crash"})
    with pytest.raises(RoundFailed, match=r"round 1: 1 site\(s\) answered before the round, at least 2 needed") as info:
        _run(grid, config, min_sites=2, round_timeout=0.3)
    assert f"SuperNode {nodes[0]}: no reply within 0.3 s" in str(info.value)
    assert f"SuperNode {nodes[2]}: Flower error 0: ClientApp process died" in str(info.value)
    grid, nodes = _grid(folder, config)

    def crash_after_round_1(record, _broadcast):
        grid.behaviour[nodes[1]] = "crash"

    with pytest.raises(RoundFailed, match=r"round 2: 2 site\(s\) replied, at least 3 needed \(site 1 \(hospital-b\): Flower error"):
        _run(grid, config, min_sites=3, callbacks=[crash_after_round_1])
    grid, _ = _grid(folder, config)
    grid.nodes = {}
    with pytest.raises(RoundFailed, match="0 SuperNode"):
        _run(grid, config, connect_timeout=0.05)


def test_unknown_and_duplicate_site_names(demo):
    folder, config, _ = demo
    grid, nodes = _grid(folder, config, names=("hospital-a", "hospital-b", "hospital-x"))
    result = _run(grid, config)
    assert result.ignored == {nodes[2]: "site 'hospital-x' is not in the fit's site list"}
    assert result.history[0].absent == [2] and result.history[0].sites == [0, 1]
    grid, _ = _grid(folder, config, names=("hospital-a", "hospital-a", "hospital-b"))
    with pytest.raises(RoundFailed, match="both claim site 'hospital-a'"):
        _run(grid, config)


def test_site_state_is_kept_between_rounds_at_the_site(demo):
    folder, config, _ = demo
    grid, nodes = _grid(folder, config)
    _run(grid, config)
    # Fed-mv-PPCA sites are stateless: nothing is stored, and nothing crossed the boundary
    assert all(len(state.config_records) == 0 for state in grid.states.values())


@contextlib.contextmanager
def _flower_log_lines():
    """The messages logged through Flower's logger (what a ServerApp's streamed log shows) while the block runs."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def test_server_app_writes_a_loadable_model_and_reports_failure(demo, tmp_path):
    from fedhier.estimators.mvppca import FedMVPPCA

    folder, config, sites = demo
    config = config.replace(out=str(tmp_path / "out"), round_timeout=5.0, poll_interval=0.01)
    grid, nodes = _grid(folder, config)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={RUN_CONFIG_KEY: config.to_json()})
    with _flower_log_lines() as lines:
        server_app(grid, context)
    broadcast, history, summary = read_result(tmp_path / "out", config)
    # one line per round in the ServerApp's log, which Flower streams to whoever started the run
    rounds = [line for line in lines if line.startswith("fedhier: round")]
    assert [r.split()[2] for r in rounds] == [str(h["round"]) for h in history]
    assert all(f"of at most {config.n_rounds} done" in r and f"{len(SITES)} of {len(SITES)} site(s) replied" in r for r in rounds)
    assert summary["status"] == "completed" and summary["nodes"] == {name: str(n) for name, n in zip(SITES, nodes)}
    model = FedMVPPCA.load(tmp_path / "out" / "model.npz")
    pooled = FedMVPPCA(n_components=config.n_components, n_rounds=config.n_rounds, n_local_iter=config.n_local_iter,
                       n_first_iter=config.n_first_iter, random_state=config.seed, tol=None).fit(sites)  # the EM update
    for view, params in pooled.global_params_.items():
        for name, value in params.items():
            assert np.max(np.abs(np.asarray(model.global_params_[view][name]) - np.asarray(value))) <= 1e-10, (view, name)
    assert [h["expected_ll"] for h in model.history_] == [h["expected_ll"] for h in pooled.history_]
    # the same metrics in the history as FedMVPPCA.fit records (global sds, changes of theta~ and of the predictions)
    for ours, theirs in zip(model.history_, pooled.history_):
        assert ours["metrics"].keys() == theirs["metrics"].keys()
        assert ours["metrics"] == pytest.approx(theirs["metrics"], rel=1e-8)
    assert "model_change" in model.history_[-1]["metrics"] and model.n_rounds_ == config.n_rounds

    # with tol, the deployment stops where FedMVPPCA.fit stops
    tol = 1.0001 * pooled.history_[1]["metrics"]["model_change"]  # just above round 2's change: it stops there
    stopped = FedMVPPCA(n_components=config.n_components, n_rounds=config.n_rounds, n_local_iter=config.n_local_iter,
                        n_first_iter=config.n_first_iter, random_state=config.seed, tol=tol).fit(sites)
    assert 1 < stopped.n_rounds_ < config.n_rounds
    grid, nodes = _grid(folder, config.replace(out=str(tmp_path / "tol"), tol=tol))
    context.run_config[RUN_CONFIG_KEY] = config.replace(out=str(tmp_path / "tol"), tol=tol).to_json()
    server_app(grid, context)
    model = FedMVPPCA.load(tmp_path / "tol" / "model.npz")
    assert (model.tol, model.n_rounds_) == (tol, stopped.n_rounds_)

    grid, nodes = _grid(folder, config.replace(out=str(tmp_path / "failed"), min_sites=3))
    grid.behaviour[nodes[1]] = "crash"
    context.run_config[RUN_CONFIG_KEY] = config.replace(out=str(tmp_path / "failed"), min_sites=3).to_json()
    with pytest.raises(RoundFailed), _flower_log_lines() as lines:
        server_app(grid, context)
    assert not [line for line in lines if line.startswith("fedhier: round")]  # no round completed
    failed = json.loads((tmp_path / "failed" / "summary.json").read_text())
    assert failed["status"] == "failed" and "at least 3 needed" in failed["error"]
    with pytest.raises(RuntimeError, match="did not complete"):
        read_result(tmp_path / "failed", config)


def test_a_deployment_has_the_estimator_s_defaults_and_stops_where_it_stops(demo, tmp_path):
    """One stopping rule and one set of defaults: a fit.toml without ``tol`` stops in the round ``FedMVPPCA.fit``
    with its own defaults stops, and summary.json says so."""
    import dataclasses
    import inspect

    from fedhier.estimators.mvppca import FedMVPPCA

    estimator = {k: p.default for k, p in inspect.signature(FedMVPPCA.__init__).parameters.items()}
    shared = {f.name: f.default for f in dataclasses.fields(FlowerFitConfig) if f.name in estimator}
    assert {"tol", "n_rounds", "n_local_iter", "local_tol", "init", "prior_update"} <= set(shared)
    assert shared == {k: estimator[k] for k in shared}
    assert FlowerFitConfig.from_toml('tol = "none"\nn_components = 1\n[views]\na = ["x", "y"]\n[flower]\nsites = ["s"]\n').tol is None

    folder, config, sites = demo
    config = config.replace(out=str(tmp_path / "out"), n_rounds=40, round_timeout=5.0, poll_interval=0.01)
    assert config.tol == estimator["tol"]
    reference = FedMVPPCA(n_components=config.n_components, n_rounds=config.n_rounds, n_local_iter=config.n_local_iter,
                          n_first_iter=config.n_first_iter, random_state=config.seed).fit(sites)
    assert 1 < reference.n_rounds_ < config.n_rounds  # the rule stops it
    grid, _ = _grid(folder, config)
    server_app(grid, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={RUN_CONFIG_KEY: config.to_json()}))
    _, history, summary = read_result(tmp_path / "out", config)
    assert (summary["rounds_run"], summary["n_rounds"], summary["converged"]) == (reference.n_rounds_, 40, True)
    assert len(history) == reference.n_rounds_
    model = FedMVPPCA.load(tmp_path / "out" / "model.npz")
    for view, params in reference.global_params_.items():
        for name, value in params.items():
            assert np.max(np.abs(np.asarray(model.global_params_[view][name]) - np.asarray(value))) <= 1e-10, (view, name)


# --------------------------------------------------------------------------- secure summation


@pytest.fixture(scope="module")
def demo5(tmp_path_factory):
    """Five Alzheimer hospitals on disk (threshold 3 by default), a secure fit config, the same sites in memory."""
    folder = tmp_path_factory.mktemp("flower-sites-5")
    path = write_demo_sites(folder, n_sites=5, seed=4, n_components=2, n_rounds=3, n_local_iter=3, n_first_iter=6, min_sites=1)
    data = load_alzheimer()
    sites = partition(data.views, data.labels, 5, "iid", random_state=4).sites
    return folder, FlowerFitConfig.read(path).replace(aggregation="secure"), sites


def test_secure_round_loop_equals_simulate_and_the_server_never_receives_a_reply(demo, tmp_path):
    folder, config, sites = demo
    config = config.replace(aggregation="secure")
    grid, _ = _grid(folder, config)
    result = _run(grid, config, aggregator=config.aggregator())
    reference = simulate(config.protocol(), sites, n_rounds=config.n_rounds, random_state=config.seed,
                         aggregation="secure", aggregator=config.aggregator())
    # the masks cancel exactly and the fixed-point sums are integers: the same model, bit for bit
    assert _max_diff(result.broadcast, reference.broadcast) == 0
    assert [r.sites for r in result.history] == [[0, 1, 2]] * config.n_rounds
    assert [r.bytes_up for r in result.history] == [r.bytes_up for r in reference.history]
    assert [r.metrics for r in result.history] == [r.metrics for r in reference.history]
    # against plain sums, one global step: a sum is off by at most 3 * precision / 2 (fixed-point
    # rounding); the inverse-gamma shape alpha ~ 1 / (2 s) turns an error e of s into a relative
    # 2 alpha e, so alpha and beta get that bound (times 10, as tests/test_mvppca_secure.py)
    error = 3 * config.aggregator().precision / 2
    secure = _run(_grid(folder, config)[0], config.replace(n_rounds=1), aggregator=config.aggregator()).broadcast
    plain = simulate(config.protocol(), sites, n_rounds=1, random_state=config.seed).broadcast
    for key, value in plain.items():
        view, _, name = key.rpartition("/")
        rtol = 10 * 2 * plain[f"{view}/alpha"] * error if name in ("alpha", "beta") else 0.0
        np.testing.assert_allclose(secure[key], value, rtol=rtol, atol=10 * error, err_msg=key)

    spec = config.protocol().reply_spec
    kinds = [kind for kind, _ in grid.received]
    assert kinds == ["query"] * 3 + (["train"] * 3 + [f"train.{step}" for step in SECURE_STEPS for _ in range(3)]) * config.n_rounds
    for kind, reply in grid.received:
        record = dict(reply.content.config_records["fedhier"])
        assert record["status"] == ("held" if kind == "train" else "ok"), record
        for value in record.values():
            if isinstance(value, bytes):
                with pytest.raises(ValueError):
                    decode(spec, value)
    # the held replies and the secrets stayed at the sites, and are erased after the round
    assert all("fedhier-secure" not in state.config_records for state in grid.states.values())
    from fedhier.estimators.mvppca import FedMVPPCA

    write_result(tmp_path, config, result)
    assert FedMVPPCA.load(tmp_path / "model.npz").aggregation == "secure"


def test_secure_round_recovers_a_site_dropping_after_its_masked_input(demo5):
    folder, config, sites = demo5
    grid, nodes = _grid(folder, config, names=config.sites)
    grid.vanish_after[(2, "train.masked_input")] = [nodes[3]]
    result = _run(grid, config, aggregator=config.aggregator())
    assert result.lost == {3: 2}
    assert [r.sites for r in result.history] == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4], [0, 1, 2, 4]]
    assert result.history[1].failed == {} and result.history[2].absent == [3]
    reference = simulate(config.protocol(), sites, n_rounds=config.n_rounds, random_state=config.seed, participation={3: [3]},
                         aggregation="secure", aggregator=SecureAggregator(5, drop_after_masking={2: [3]}))
    assert _max_diff(result.broadcast, reference.broadcast) == 0


def test_a_secure_sum_over_flower_equals_the_plain_sum_with_a_site_dropping_after_its_masked_input(demo5):
    """The same round request to five fresh sites, answered in the clear and through the secure steps (36
    fractional bits, site 3 vanishing after its masked input): the secure total equals the plain sum of the five
    replies to 1e-9."""
    from flwr.app import ConfigRecord

    from fedhier.protocol.base import sum_messages
    from fedhier.runtime.flower import _exchange, _secure_sum

    folder, config, _ = demo5
    plain_config, secure_config = config.replace(aggregation="plain"), config.replace(frac_bits=36)
    first, nodes = _grid(folder, plain_config, names=config.sites)
    _run(first, plain_config.replace(n_rounds=1))
    requests = {node: content for node, kind, content in first.delivered if kind == "train"}

    def ask(grid):
        answers, _ = _exchange(grid, {n: RecordDict({"fedhier": ConfigRecord(requests[n])}) for n in nodes}, "train", 1,
                               5.0, 0.01)
        return {nodes.index(n): dict(m.content.config_records["fedhier"]) for n, m in answers.items()}

    spec = config.protocol().reply_spec
    replies = ask(_grid(folder, plain_config, names=config.sites)[0])
    plain = sum_messages(spec, {s: decode(spec, bytes(replies[s]["reply"])) for s in sorted(replies)})
    grid, _ = _grid(folder, secure_config, names=config.sites)
    assert {r["status"] for r in ask(grid).values()} == {"held"}
    grid.vanish_after[(1, "train.masked_input")] = [nodes[3]]
    total, contributors, *_ = _secure_sum(grid, secure_config.aggregator(), spec, 1, dict(enumerate(nodes)), config.sites,
                                          5.0, 0.01)
    assert contributors == [0, 1, 2, 3, 4]
    for key, value in plain.items():
        np.testing.assert_allclose(total[key], value, rtol=0, atol=1e-9, err_msg=key)


def test_secure_round_with_too_many_drops_fails_and_writes_nothing(demo5):
    folder, config, _ = demo5
    grid, nodes = _grid(folder, config, names=config.sites)
    grid.vanish_after[(2, "train.masked_input")] = nodes[:3]
    seen = []
    with pytest.raises(RoundFailed, match=r"round 2: secure aggregation failed: .*fewer than the threshold t = 3") as info:
        _run(grid, config, aggregator=config.aggregator(), callbacks=[lambda record, _b: seen.append(record.round)])
    assert "site 0 (hospital-a): sign_survivors: Flower error 3" in str(info.value)
    assert seen == [1]


def test_a_site_answers_each_secure_step_of_a_round_once(demo):
    folder, config, _ = demo
    config = config.replace(aggregation="secure")
    identity = _identity(folder, "hospital-a", config.sites)
    fields, kept = secure_site_step(config, "hospital-a", "advertise_keys", {"round": 2}, {"round": 2, "reply": b""}, **identity)
    assert fields["status"] == "ok" and set(kept) == {"round", "reply", "secagg"}
    fields, kept = secure_site_step(config, "hospital-a", "advertise_keys", {"round": 2}, kept, **identity)
    assert fields["error"] == "SecAggProtocolError: site 'hospital-a' already advertised its keys for round 2" and kept is None
    fields, kept = secure_site_step(config, "hospital-a", "share_keys", {"round": 3, "payload": b""}, {"round": 2, "reply": b""},
                                    **identity)
    assert fields["error"] == "SecAggProtocolError: site 'hospital-a' holds no reply for round 3" and kept is None


def test_a_site_refuses_a_fit_listing_too_few_sites_of_its_roster(demo):
    """A coordinator lists 3 of the 5 sites of the roster, with t = 2: a sum over 2 sites is not what the operators
    agreed to; the site refuses (the threshold is measured against the roster, not the fit's list)."""
    from fedhier.secure.keys import Roster, generate_signing_key

    folder, config, _ = demo
    config = config.replace(aggregation="secure")
    identity = _identity(folder, "hospital-a", config.sites)
    roster = Roster({**identity["roster"], "hospital-d": generate_signing_key(), "hospital-e": generate_signing_key()})
    fields, kept = secure_site_step(config, "hospital-a", "advertise_keys", {"round": 2}, {"round": 2, "reply": b""},
                                    signing_key=identity["signing_key"], roster=roster)
    assert fields["error"] == ("SecAggProtocolError: site 'hospital-a': the fit's threshold t = 2 is not more than half of "
                               "the 5 sites of the roster; this site refuses the secure sum") and kept is None


def test_a_coordinator_repeating_a_secure_round_without_a_site_is_refused(demo5):
    """The coordinator sends round 1's broadcast again to every site but site 0 and runs the secure sum on them:
    the difference of the two sums would be site 0's reply.  Each site refuses a broadcast it already answered."""
    from flwr.app import ConfigRecord

    from fedhier.runtime.flower import _exchange, _secure_sum

    folder, config, _ = demo5
    grid, nodes = _grid(folder, config, names=config.sites)
    aggregator = config.aggregator()
    _run(grid, config.replace(n_rounds=1), aggregator=aggregator)  # an honest round 1
    requests = {node: content for node, kind, content in grid.delivered if kind == "train"}
    cohort = {s: nodes[s] for s in (1, 2, 3, 4)}
    replies, _ = _exchange(grid, {n: RecordDict({"fedhier": ConfigRecord(requests[n])}) for n in cohort.values()},
                           "train", 1, 5.0, 0.01)
    assert [dict(r.content.config_records["fedhier"])["status"] for r in replies.values()] == ["held"] * 4
    with pytest.raises(RoundFailed, match="site 1 .*this site already answered this reply to this broadcast"):
        _secure_sum(grid, aggregator, config.protocol().reply_spec, 1, cohort, config.sites, 5.0, 0.01)


def test_secure_configuration(tmp_path):
    base = 'n_components = 2\n[views]\na = ["x", "y", "z"]\n[flower]\nsites = ["s1", "s2", "s3"]\n'
    config = FlowerFitConfig.from_toml('aggregation = "secure"\n' + base + "[secure]\nthreshold = 3\nfrac_bits = 20\n")
    aggregator = config.aggregator()
    assert (aggregator.n_sites, aggregator.threshold, aggregator.precision) == (3, 3, 2.0**-20)
    assert FlowerFitConfig.from_json(config.to_json()) == config
    assert FlowerFitConfig.from_toml('aggregation = "secure"\n' + base).aggregator().threshold == 2
    assert FlowerFitConfig.from_toml(base).aggregator() is None
    cases = {
        'aggregation = "masked"\n' + base: "aggregation must be 'plain' or 'secure', got 'masked'",
        base + "[secure]\nthreshold = 2\n": 'a \\[secure\\] table needs aggregation = "secure"',
        'aggregation = "secure"\n' + base + "[secure]\nshares = 2\n": r"unknown key\(s\) \['shares'\] in \[secure\]",
        'aggregation = "secure"\n' + base + "[secure]\nthreshold = 4\n": r"\[secure\] threshold must be more than half of 3 sites and at most 3, got 4",
        'aggregation = "secure"\n' + base + "[secure]\nthreshold = 1\n": r"\[secure\] threshold must be more than half of 3 sites",
        'aggregation = "secure"\n' + base + "[secure]\nthreshold = 2.5\n": r"\[secure\] threshold must be an integer, got 2.5",
        'aggregation = "secure"\n' + base + "[secure]\nfrac_bits = 60\n": r"\[secure\] frac_bits must be an integer in \[0, 52\]",
    }
    for text, message in cases.items():
        with pytest.raises(ValueError, match="my.toml: .*" + message):
            FlowerFitConfig.from_toml(text, "my.toml")


# --------------------------------------------------------------------------- configuration, commands, TLS


def test_config_errors_name_the_key(tmp_path):
    views = '[views]\na = ["x", "y", "z"]\n'
    flower = '[flower]\nsites = ["s1", "s2"]\n'
    config = FlowerFitConfig.from_toml("n_components = 2\n" + views + flower)
    assert config.schema().dims == (3,) and config.sites == ("s1", "s2") and config.min_sites == 1
    cases = {
        "n_components = 3\n" + views + flower: "n_components=3 must be smaller",
        "n_components = 2\ncolour = 1\n" + views + flower: r"unknown key\(s\) \['colour'\]",
        "n_components = 2\n" + views: r"\[flower\] table",
        "n_components = 2\n" + views + flower + "min_sites = 3\n": "min_sites=3 exceeds the 2 listed sites",
        "n_components = 2\n" + views + flower + "round_timeout = 0\n": "round_timeout must be a positive number",
        "n_components = 2\ntol = -1e-6\n" + views + flower: "tol must be a positive number",
        "n_components = 2\n" + views + flower.replace('"s2"', '"s1"'): "site names must be unique",
        "n_components = 1\n" + '[views]\na = ["x", "y"]\nb = ["y"]\n' + flower: "column 'y' is in both view 'a' and view 'b'",
    }
    for text, message in cases.items():
        with pytest.raises(ValueError, match="my.toml: .*" + message):
            FlowerFitConfig.from_toml(text, "my.toml")
    path = tmp_path / "fit.toml"
    path.write_text("n_components = 1\n" + views + flower)
    assert FlowerFitConfig.read(path).out == str(tmp_path / "fedhier-flower-fit")
    assert FlowerFitConfig.from_json(config.to_json()) == config


def test_command_lines(tmp_path, demo):
    folder, _, _ = demo
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    cmd = supernode_command(superlink="10.0.0.1:9091", site="hospital-a", data=folder / "hospital-a.csv", root_certificates=ca, port=9100)
    assert cmd[cmd.index("--root-certificates") + 1] == str(ca.resolve())
    assert cmd[-2:] == ["--node-config", f'site="hospital-a" data="{(folder / "hospital-a.csv").resolve()}"']
    assert "--insecure" not in cmd
    with pytest.raises(FileNotFoundError, match="hospital-z.*does not exist"):
        supernode_command(superlink="h:1", site="hospital-z", data=tmp_path / "nope.csv", insecure=True)
    with pytest.raises(ValueError, match="TLS needs the CA certificate"):
        supernode_command(superlink="h:1", site="hospital-a", data=folder / "hospital-a.csv")
    with pytest.raises(ValueError, match="needs TLS certificates"):
        superlink_command()
    link = superlink_command(insecure=True, port=9200, node_auth=True)
    assert {"--insecure", "--enable-supernode-auth", "--disable-runtime-dependency-installation"} <= set(link)
    assert cli_flower(["site", "--site", "hospital-a", "--data", str(tmp_path / "nope.csv"), "--superlink", "h:1", "--insecure"]) == 2


def test_a_site_command_carries_its_signing_key_and_the_roster(tmp_path, demo):
    folder, _, _ = demo
    key, _ = make_site_key(tmp_path / "hospital-a-key")
    roster = tmp_path / "roster.txt"
    roster.write_text("")
    cmd = supernode_command(superlink="h:1", site="hospital-a", data=folder / "hospital-a.csv", insecure=True, auth_key=key,
                            roster=roster)
    node_config = cmd[cmd.index("--node-config") + 1]
    assert f'site-key="{key.resolve()}"' in node_config and f'roster="{roster.resolve()}"' in node_config
    with pytest.raises(ValueError, match="the roster file .* must exist"):
        supernode_command(superlink="h:1", site="hospital-a", data=folder / "hospital-a.csv", insecure=True,
                          roster=tmp_path / "none.txt")


def test_certificates_verify_for_loopback(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    paths = make_certificates(tmp_path, hosts=["127.0.0.1", "localhost"])
    ca = x509.load_pem_x509_certificate(paths["ca.pem"].read_bytes())
    server = x509.load_pem_x509_certificate(paths["server.pem"].read_bytes())
    ca.public_key().verify(server.signature, server.tbs_certificate_bytes, ec.ECDSA(server.signature_hash_algorithm))
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert oct(paths["server.key"].stat().st_mode & 0o777) == "0o600"


def test_site_key_is_an_openssh_ecdsa_pair(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private, public = make_site_key(tmp_path / "hospital-a-key")
    key = serialization.load_ssh_private_key(private.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    pub = serialization.load_ssh_public_key(public.read_bytes())
    assert pub.public_numbers() == key.public_key().public_numbers()
    assert oct(private.stat().st_mode & 0o777) == "0o600"


# --------------------------------------------------------------------------- real SuperLink + SuperNodes


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _flower_fit(cluster: LoopbackFederation, config_path: Path, out: Path) -> int:
    tls = ["--root-certificates", str(cluster.certificates["ca.pem"])] if cluster.tls else ["--insecure"]
    return cli_flower(["run", "--config", str(config_path), "--superlink", cluster.address, *tls, "--timeout", "300", "--out", str(out)])


def _flower_fit_killing_after_round_1(cluster: LoopbackFederation, config_path: Path, out: Path, site: str) -> list[int]:
    """Run the fit of ``config_path`` and SIGKILL ``site``'s SuperNode once round 1 is in the history; the exit codes."""
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(_flower_fit(cluster, config_path, out)), daemon=True)
    runner.start()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and runner.is_alive():
        rows = json.loads((out / "history.json").read_text()) if (out / "history.json").is_file() else []
        if rows:
            cluster.kill(site)
            break
        time.sleep(0.2)
    runner.join(timeout=330)
    return codes


@pytest.mark.integration
@pytest.mark.parametrize("transport", ["insecure", "tls+node-auth"])
def test_flower_fit_equals_simulate_and_survives_a_lost_site(tmp_path, demo, transport, capsys):
    folder, config, sites = demo
    secure = transport == "tls+node-auth"
    cluster = LoopbackFederation(tmp_path, {name: folder / f"{name}.csv" for name in SITES}, tls=secure, node_auth=secure,
                                 site_seed=config.seed)
    try:
        # 1. all three sites: the same global parameters as simulate()
        out = tmp_path / "fit-all"
        assert _flower_fit(cluster, folder / "fit.toml", out) == 0, cluster.logs()
        broadcast, history, summary = read_result(out, config)
        reference = simulate(config.protocol(), sites, n_rounds=config.n_rounds, random_state=config.seed)
        assert _max_diff(broadcast, reference.broadcast) <= 1e-10
        assert [r["sites"] for r in history] == [[0, 1, 2]] * config.n_rounds
        assert summary["lost"] == {} and set(summary["nodes"]) == set(SITES)
        assert (out / "report.html").is_file() and (out / "report.md").is_file()
        # the ServerApp's line per round reaches `fedhier flower run` through Flower's streamed log
        streamed = capsys.readouterr().out
        assert all(f"fedhier: round {r} of at most {config.n_rounds}" in streamed for r in range(1, config.n_rounds + 1))

        # 2. hospital-c's SuperNode is killed after round 1: the fit completes from the other two
        dropout = tmp_path / "fit-dropout.toml"
        dropout.write_text((folder / "fit.toml").read_text().replace("round_timeout = 300.0", "round_timeout = 25.0").replace("min_sites = 2", "min_sites = 1"))
        out = tmp_path / "fit-dropout"
        assert _flower_fit_killing_after_round_1(cluster, dropout, out, "hospital-c") == [0], cluster.logs()
        broadcast, history, summary = read_result(out, config)
        assert history[0]["sites"] == [0, 1, 2]
        assert summary["lost"].keys() == {"hospital-c"}
        dropped = summary["lost"]["hospital-c"]  # the round whose deadline it missed
        assert history[dropped - 1]["failed"]["2"].startswith(("no reply within 25 s", "Flower error 3", "Flower error 5"))
        for row in history[dropped - 1:]:
            assert row["sites"] == [0, 1]
        reference = simulate(config.protocol(), sites, n_rounds=config.n_rounds, random_state=config.seed,
                             participation={r: [2] for r in range(dropped, config.n_rounds + 1)})
        assert _max_diff(broadcast, reference.broadcast) <= 1e-10
    finally:
        stopped = cluster.stop()
    assert not [pid for pid in stopped if _alive(pid)]


@pytest.mark.integration
def test_flower_fit_stops_in_the_round_the_estimator_stops(tmp_path, demo):
    """The demo's fit.toml without ``tol``, over real SuperNodes: the estimator's default rule ends it in the same
    round as ``FedMVPPCA.fit`` (= simulate() with that rule), with the same parameters to 1e-10."""
    from fedhier.estimators.mvppca import FedMVPPCA

    folder, config, sites = demo
    path = tmp_path / "fit-tol.toml"
    path.write_text((folder / "fit.toml").read_text().replace("n_rounds = 3", "n_rounds = 40"))
    reference = FedMVPPCA(n_components=config.n_components, n_rounds=40, n_local_iter=config.n_local_iter,
                          n_first_iter=config.n_first_iter, random_state=config.seed).fit(sites)
    assert 1 < reference.n_rounds_ < 40
    cluster = LoopbackFederation(tmp_path, {name: folder / f"{name}.csv" for name in SITES}, site_seed=config.seed)
    try:
        out = tmp_path / "fit-tol"
        assert _flower_fit(cluster, path, out) == 0, cluster.logs()
        _, history, summary = read_result(out, config)
        assert (summary["rounds_run"], summary["converged"], len(history)) == (reference.n_rounds_, True, reference.n_rounds_)
        model = FedMVPPCA.load(out / "model.npz")
        for view, params in reference.global_params_.items():
            for name, value in params.items():
                assert np.max(np.abs(np.asarray(model.global_params_[view][name]) - np.asarray(value))) <= 1e-10, (view, name)
    finally:
        stopped = cluster.stop()
    assert not [pid for pid in stopped if _alive(pid)]


@pytest.mark.integration
@pytest.mark.slow  # five Flower exchanges per round: about two minutes on the project machine
def test_secure_flower_fit_equals_simulate(tmp_path, demo):
    folder, config, sites = demo
    path = tmp_path / "fit-secure.toml"
    path.write_text('aggregation = "secure"\n' + (folder / "fit.toml").read_text().replace("n_rounds = 3", "n_rounds = 2"))
    cluster = LoopbackFederation(tmp_path, {name: folder / f"{name}.csv" for name in SITES}, site_seed=config.seed)
    try:
        out = tmp_path / "fit-secure"
        assert _flower_fit(cluster, path, out) == 0, cluster.logs()
        broadcast, history, summary = read_result(out, config)
        reference = simulate(config.protocol(), sites, n_rounds=2, random_state=config.seed,
                             aggregation="secure", aggregator=FlowerFitConfig.read(path).aggregator())
        assert _max_diff(broadcast, reference.broadcast) == 0
        assert [r["sites"] for r in history] == [[0, 1, 2]] * 2 and summary["lost"] == {}
    finally:
        stopped = cluster.stop()
    assert not [pid for pid in stopped if _alive(pid)]


# --------------------------------------------------------------------------- FedLin (HM1, HM2) over Flower

FLEET = ("machine-01", "machine-02", "machine-03")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Three C-MAPSS machines on disk, an HM2 and an HM1 fit.toml, the same sites in memory as (X, y)."""
    from fedhier.deploy import read_fit
    from fedhier.cli.flower import write_fleet_sites

    folder = tmp_path_factory.mktemp("flower-fleet")
    configs = {}
    for model in ("fedlin-hm2", "fedlin-hm1"):
        path = write_fleet_sites(folder / model, model=model, n_sites=3, n_rounds=3, seed=5, min_sites=1)
        if model == "fedlin-hm1":  # a random start: every site's column differs from round 1 on
            path.write_text(path.read_text().replace("eta = 0.0002\n", 'eta = 0.0002\ninit = "random"\n'))
        configs[model] = read_fit(path)
    sites = []
    for name in FLEET:  # read independently of the deployment's reader
        lines = (folder / "fedlin-hm2" / f"{name}.csv").read_text().splitlines()[1:]
        table = np.array([[float(cell) for cell in line.split(",")] for line in lines])
        sites.append((np.column_stack([np.ones(len(table)), table[:, :4]]), table[:, 4].copy()))  # contiguous, as read
    return folder, configs, sites


def _fleet_grid(folder, config, names=FLEET):
    nodes = {2000 + 11 * k: (name, folder / config.model / f"{name}.csv") for k, name in enumerate(names)}
    return LocalGrid(config, nodes), list(nodes)


def _serve(grid, config, out):
    config = config.replace(out=str(out), round_timeout=5.0, connect_timeout=1.0, poll_interval=0.01)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={RUN_CONFIG_KEY: config.to_json()})
    grid.config = config
    server_app(grid, context)
    return config


def test_fedlin_hm2_over_flower_equals_the_estimator_and_writes_a_loadable_model(fleet, tmp_path):
    from fedhier.estimators.fedlin import FedHM2Regressor, load

    folder, configs, sites = fleet
    config = configs["fedlin-hm2"]
    grid, nodes = _fleet_grid(folder, config)
    _serve(grid, config, tmp_path / "out")
    model = load(tmp_path / "out" / "model.npz")
    reference = FedHM2Regressor(**config.estimator_params()).fit(sites)  # simulate() inside
    assert model.n_rounds_ == reference.n_rounds_ and model.n_sites_ == 3
    assert np.max(np.abs(model.r_ - reference.r_)) <= 1e-10 and np.max(np.abs(model.Q_ - reference.Q_)) <= 1e-10
    np.testing.assert_allclose(model.phi_interval(0.9), reference.phi_interval(0.9), rtol=0, atol=1e-10)
    np.testing.assert_allclose([h["phi_mean"] for h in model.history_], [h["phi_mean"] for h in reference.history_], rtol=0, atol=1e-10)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["model"] == "fedlin-hm2"
    assert summary["coefficients"] == ["(intercept)", "t", "t2", "t3", "t4"]
    assert (tmp_path / "out" / "phi.csv").read_text().startswith("component,mean,lower,upper,level")
    # the coordinator's model has no site's posterior; a machine computes its own from q(phi) and its data
    assert model.coef_.shape == (0, 5)
    assert model.adapt(*sites[0]) == 0 and model.coef_.shape == (1, 5)
    # every site was asked its name, then received the whole (common) EP broadcast
    assert [kind for _, kind, _ in grid.delivered][:3] == ["query"] * 3
    assert {kind for _, kind, _ in grid.delivered[3:]} == {"train"}


def test_fedlin_hm1_over_flower_equals_the_estimator_and_sends_each_site_only_its_own_column(fleet, tmp_path):
    from fedhier.estimators.fedlin import FedHM1Regressor, load

    folder, configs, sites = fleet
    config = configs["fedlin-hm1"]
    grid, nodes = _fleet_grid(folder, config)
    _serve(grid, config, tmp_path / "out")
    model = load(tmp_path / "out" / "model.npz")
    reference = FedHM1Regressor(**config.estimator_params()).fit(sites)
    assert np.max(np.abs(model.coef_ - reference.coef_)) <= 1e-10
    assert np.max(np.abs(model.omega_ - reference.omega_)) <= 1e-10
    rows = (tmp_path / "out" / "coefficients.csv").read_text().splitlines()
    assert rows[0] == "site,feature,estimate" and len(rows) == 1 + 3 * 5

    # what each node received: first "which site are you?" (nothing else), then only its own part of
    # each broadcast -- its column of Theta and of Theta Omega^-1 -- never another site's column
    protocol = config.protocol()
    assert [(node, kind) for node, kind, _ in grid.delivered[:3]] == [(n, "query") for n in nodes]
    assert all(set(content) == {"round"} for _, _, content in grid.delivered[:3])
    trains = [(node, content) for node, kind, content in grid.delivered if kind == "train"]
    assert len(trains) == 3 * config.n_rounds
    theta_by_round = _hm1_broadcasts(config, sites)
    for i, (node, content) in enumerate(trains):
        rnd, site = int(content["round"]), nodes.index(node)
        assert rnd == i // 3 + 1
        received = decode(protocol.site_broadcast_spec, bytes(content["broadcast"]))
        full = theta_by_round[rnd - 1]
        np.testing.assert_array_equal(received["theta"], full["theta"][:, site])
        np.testing.assert_array_equal(received["shrink"], full["shrink"][:, site])
        for other in set(range(3)) - {site}:  # no bytes of another site's parameters
            assert full["theta"][:, other].tobytes() not in bytes(content["broadcast"])
            assert full["shrink"][:, other].tobytes() not in bytes(content["broadcast"])


def _hm1_broadcasts(config, sites):
    """The server's HM1 broadcast before each round, from simulate() on the same sites."""
    seen = []
    protocol = config.protocol()
    first = protocol.broadcast_spec.validate(protocol.initial_broadcast())
    result = simulate(protocol, sites, n_rounds=config.n_rounds, random_state=config.seed,
                      callbacks=[lambda record, broadcast: seen.append(broadcast)])
    assert len(seen) == len(result.history)
    return [first, *seen[:-1]]


@pytest.mark.parametrize("model", ["fedlin-hm2", "fedlin-hm1"])
def test_fedlin_site_lost_after_round_1_equals_simulate_without_it(fleet, model):
    folder, configs, sites = fleet
    config = configs[model]
    grid, nodes = _fleet_grid(folder, config)

    def vanish_after_round_1(record, _broadcast):
        if record.round == 1:
            grid.behaviour[nodes[2]] = "unreachable"

    estimator = config.estimator()
    protocol = config.protocol()
    stop = estimator.tracker(estimator.protocol(5))[0] if model == "fedlin-hm2" else None
    result = run_rounds(grid, protocol, config.sites, n_rounds=config.n_rounds, seed=config.seed, round_timeout=5.0,
                        connect_timeout=1.0, poll_interval=0.01, callbacks=[vanish_after_round_1], stop=stop)
    assert result.lost == {2: 2} and [r.sites for r in result.history] == [[0, 1, 2]] + [[0, 1]] * (len(result.history) - 1)
    data = sites if model == "fedlin-hm1" else [estimator.site_stats(X, y, site=k)[0] for k, (X, y) in enumerate(sites)]
    stop = estimator.tracker(estimator.protocol(5))[0] if model == "fedlin-hm2" else None
    reference = simulate(protocol, data, n_rounds=config.n_rounds, random_state=config.seed, stop=stop,
                         participation={r: [2] for r in range(2, config.n_rounds + 1)})
    assert len(reference.history) == len(result.history) >= 2
    assert _max_diff(result.broadcast, reference.broadcast) <= 1e-10


def test_a_node_whose_registered_name_differs_from_its_site_is_ignored(fleet, tmp_path):
    from types import SimpleNamespace

    folder, configs, _ = fleet
    config = configs["fedlin-hm1"]
    grid, nodes = _fleet_grid(folder, config)
    registered = {nodes[0]: "machine-01", nodes[1]: "machine-01", nodes[2]: ""}  # node 1 claims machine-02
    grid.get_nodes = lambda: [SimpleNamespace(node_id=n, name=registered[n]) for n in nodes]
    result = run_rounds(grid, config.protocol(), config.sites, n_rounds=1, seed=config.seed, round_timeout=5.0,
                        connect_timeout=1.0, poll_interval=0.01)
    assert result.ignored == {nodes[1]: "registered as 'machine-01' but claims site 'machine-02'"}
    assert result.history[0].sites == [0, 2] and result.history[0].absent == [1]
    assert all(node != nodes[1] for node, kind, _ in grid.delivered if kind == "train")


def test_a_fedlin_deployment_has_the_estimator_s_defaults(fleet):
    """A fit.toml without n_rounds runs the rounds the estimator runs by default (HM1 and HM2 differ)."""
    import inspect

    from fedhier.deploy.fedlin import FedLinFitConfig
    from fedhier.estimators.fedlin import FedHM1Regressor, FedHM2Regressor

    for model, estimator in (("fedlin-hm1", FedHM1Regressor), ("fedlin-hm2", FedHM2Regressor)):
        text = f'model = "{model}"\ntarget = "y"\nfeatures = ["x"]\n[flower]\nsites = ["a", "b"]\n'
        config = FedLinFitConfig.from_toml(text)
        assert config.n_rounds == inspect.signature(estimator).parameters["n_rounds"].default
        assert config.estimator().get_params() == estimator(**config.estimator_params()).get_params()
        assert type(config).from_json(config.to_json()) == config


def test_fedlin_configuration_errors_name_the_key(fleet):
    from fedhier.deploy import fit_from_toml

    base = 'target = "y"\nfeatures = ["a", "b"]\n[flower]\nsites = ["m1", "m2"]\n'
    assert fit_from_toml('model = "fedlin-hm2"\n' + base).protocol().name == "fedlin-ep"
    cases = {
        'model = "fedlin-hm3"\n' + base: r"model must be one of \['fed-mv-ppca', 'fedlin-hm1', 'fedlin-hm2'\]",
        'model = "fedlin-hm1"\nprior = "lasso"\n' + base: r"unknown key\(s\) \['prior'\]",
        'model = "fedlin-hm1"\naggregation = "secure"\n' + base: "needs model = 'fedlin-hm2'",
        'model = "fedlin-hm2"\nprior = "horseshoe"\n' + base: "prior must be 'gaussian', 'lasso' or 'ridge'",
        'model = "fedlin-hm2"\nrandom = ["c"]\n' + base: r"random must list feature names .* unknown: \['c'\]",
        'model = "fedlin-hm2"\nfeatures = ["a"]\n[flower]\nsites = ["m1"]\n': "target is required",
        'model = "fedlin-hm2"\n' + base.replace('"b"', '"y"'): r"column\(s\) \['y'\] named more than once",
        'model = "fedlin-hm2"\nepsilon = 1.0\n' + base: "sets epsilon, but a FedLin fit takes no privacy budget",
    }
    for text, message in cases.items():
        with pytest.raises(ValueError, match="my.toml: .*" + message):
            fit_from_toml(text, "my.toml")


def test_a_fleet_site_with_a_bad_cell_tells_where_not_what(fleet, tmp_path):
    folder, configs, _ = fleet
    config = configs["fedlin-hm2"].replace(partial="refuse")  # default "missing": a row with an empty cell is left out
    lines = (folder / "fedlin-hm2" / "machine-02.csv").read_text().splitlines()
    lines[3] = "0.1,0.01,0.001,0.0001,0.123456789"
    lines[4] = lines[4].split(",", 1)[0] + ",,0.1,0.1,0.1"
    bad = tmp_path / "machine-02.csv"
    bad.write_text("\n".join(lines) + "\n")
    from fedhier.runtime.flower import site_round

    reply, _ = site_round(config, "machine-02", bad, {"round": 1, "broadcast": b""}, {})
    assert reply["status"] == "error" and "site 'machine-02'" in reply["error"] and "column 't2', row 4" in reply["error"]
    assert "0.123456789" not in reply["error"]
    lines[4] = ",,,,0.5"  # a row without features: FedLin needs every cell
    bad.write_text("\n".join(lines) + "\n")
    reply, _ = site_round(config, "machine-02", bad, {"round": 1, "broadcast": b""}, {})
    assert "empty cell, first in column 't', row 4" in reply["error"] and "0.123456789" not in reply["error"]


def test_the_flower_runtime_imports_no_model_estimator_or_cli_module():
    """runtime/flower.py knows rounds, messages, sites and failures: checked on its imports and on what importing it loads."""
    import ast
    import subprocess
    import sys

    import fedhier.runtime.flower as runtime

    forbidden = ("fedhier.models", "fedhier.estimators", "fedhier.cli",
                 "fedhier.userdata", "fedhier.deploy", "fedhier.protocol.mvppca", "fedhier.protocol.fedlin",
                 "fedhier.protocol.collab", "fedhier.experiments", "fedhier.demo", "fedhier.data")
    tree = ast.parse(Path(runtime.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):  # every import, also inside functions
        if isinstance(node, ast.ImportFrom):
            base = "fedhier.runtime" if node.level == 1 else "fedhier" if node.level == 2 else ""
            imported.add(".".join(p for p in (base, node.module or "") if p))
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert "fedhier.runtime.simulate" in imported and "fedhier.protocol.messages" in imported  # the check sees our imports
    assert not [m for m in imported if m.startswith(forbidden)], imported
    code = "import sys, fedhier.runtime.flower; print('\\n'.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "fedhier.runtime.flower" in loaded
    assert not [m for m in loaded if m.startswith(forbidden)]


@pytest.mark.integration
@pytest.mark.parametrize("model", ["fedlin-hm2", "fedlin-hm1"])
def test_fedlin_flower_fit_equals_simulate_and_survives_a_lost_site(tmp_path, fleet, model):
    """FedLin on a real SuperLink and three SuperNodes: the estimator's simulate() fit to 1e-10; then with
    machine-03's SuperNode killed after round 1, simulate() with machine-03 absent from its lost round on."""
    from fedhier.estimators.fedlin import load

    folder, configs, sites = fleet
    config = configs[model]
    path = folder / model / "fit.toml"
    cluster = LoopbackFederation(tmp_path, {name: folder / model / f"{name}.csv" for name in FLEET}, site_seed=config.seed)
    estimator = config.estimator()
    data = sites if model == "fedlin-hm1" else [estimator.site_stats(X, y, site=k)[0] for k, (X, y) in enumerate(sites)]

    def reference(absent_from=None):
        stop = estimator.tracker(estimator.protocol(5))[0] if model == "fedlin-hm2" else None
        participation = None if absent_from is None else {r: [2] for r in range(absent_from, config.n_rounds + 1)}
        return simulate(config.protocol(), data, n_rounds=config.n_rounds, random_state=config.seed, stop=stop,
                        participation=participation)

    try:
        out = tmp_path / "fit-all"
        assert _flower_fit(cluster, path, out) == 0, cluster.logs()
        broadcast, history, summary = read_result(out, config)
        expected = reference()
        assert _max_diff(broadcast, expected.broadcast) <= 1e-10
        assert [r["sites"] for r in history] == [[0, 1, 2]] * len(expected.history)
        assert summary["lost"] == {} and set(summary["nodes"]) == set(FLEET)
        assert load(out / "model.npz").n_sites_ == 3

        dropout = tmp_path / "fit-dropout.toml"
        dropout.write_text(path.read_text().replace("round_timeout = 300.0", "round_timeout = 25.0"))
        out = tmp_path / "fit-dropout"
        assert _flower_fit_killing_after_round_1(cluster, dropout, out, "machine-03") == [0], cluster.logs()
        broadcast, history, summary = read_result(out, config)
        assert history[0]["sites"] == [0, 1, 2] and summary["lost"].keys() == {"machine-03"}
        dropped = summary["lost"]["machine-03"]
        assert history[dropped - 1]["failed"]["2"].startswith(("no reply within 25 s", "Flower error 3", "Flower error 5"))
        assert all(row["sites"] == [0, 1] for row in history[dropped - 1:])
        expected = reference(absent_from=dropped)
        assert len(history) == len(expected.history)
        assert _max_diff(broadcast, expected.broadcast) <= 1e-10
    finally:
        stopped = cluster.stop()
    assert not [pid for pid in stopped if _alive(pid)]


# --------------------------------------------------------------------------- coordinator checkpoint, resume


def _coordinator_context(config, resume=False):
    from fedhier.runtime.flower import RESUME_KEY

    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                   run_config={RUN_CONFIG_KEY: config.to_json(), RESUME_KEY: "yes" if resume else ""})


def _interrupt_before_round(grid, rnd):
    """The SuperLink disappears when the server pushes round ``rnd``: the ServerApp dies there."""
    push = grid.push_messages

    def push_or_die(messages):
        messages = list(messages)
        if any(m.metadata.message_type == "train" and m.metadata.group_id == str(rnd) for m in messages):
            raise ConnectionError("the SuperLink is gone")
        return push(messages)

    grid.push_messages = push_or_die


@pytest.mark.parametrize("family", ["fed-mv-ppca", "fedlin-hm1"])
def test_a_fit_resumed_from_the_coordinator_checkpoint_equals_an_uninterrupted_one(demo, fleet, tmp_path, family):
    from fedhier.runtime.flower import CHECKPOINT

    if family == "fed-mv-ppca":
        folder, config, _ = demo
        make_grid = lambda c: _grid(folder, c)[0]  # noqa: E731
    else:
        folder, configs, _ = fleet
        config = configs["fedlin-hm1"]
        make_grid = lambda c: _fleet_grid(folder, c)[0]  # noqa: E731
    # Fed-mv-PPCA: long enough for the coordinator's extrapolation to be under way when the SuperLink goes
    n_rounds, broken_before = (9, 7) if family == "fed-mv-ppca" else (3, 3)
    config = config.replace(round_timeout=5.0, connect_timeout=1.0, poll_interval=0.01, n_rounds=n_rounds)
    if family == "fed-mv-ppca":
        config = config.replace(tol=None)
    whole = config.replace(out=str(tmp_path / "whole"))
    server_app(make_grid(whole), _coordinator_context(whole))
    reference, reference_history, _ = read_result(whole.out, whole)

    broken = config.replace(out=str(tmp_path / "broken"))
    grid = make_grid(broken)
    _interrupt_before_round(grid, broken_before)
    with pytest.raises(ConnectionError):
        server_app(grid, _coordinator_context(broken))
    if family == "fed-mv-ppca":
        from fedhier.runtime.checkpoint import read_checkpoint

        assert any(k.startswith("first/") for k in read_checkpoint(tmp_path / "broken" / CHECKPOINT).coordinator)
    summary = json.loads((tmp_path / "broken" / "summary.json").read_text())
    assert summary["status"] == "failed" and "the SuperLink is gone" in summary["error"]
    assert (tmp_path / "broken" / CHECKPOINT).is_file()

    server_app(make_grid(broken), _coordinator_context(broken, resume=True))  # a new run: fresh SuperNode states
    broadcast, history, summary = read_result(broken.out, broken)
    assert _max_diff(broadcast, reference) == 0
    assert summary["resumed_after_round"] == broken_before - 1
    assert [h["round"] for h in history] == [h["round"] for h in reference_history] == list(range(1, n_rounds + 1))
    assert [h["metrics"] for h in history] == [h["metrics"] for h in reference_history]


def test_resume_is_refused_with_the_reason(demo, fleet, tmp_path):
    folder, config, _ = demo
    config = config.replace(out=str(tmp_path / "fit"), round_timeout=5.0, connect_timeout=1.0, poll_interval=0.01)
    with pytest.raises(ValueError, match="nothing to resume: .*checkpoint.npz does not exist"):
        server_app(_grid(folder, config)[0], _coordinator_context(config, resume=True))
    assert json.loads((tmp_path / "fit" / "summary.json").read_text())["status"] == "failed"
    server_app(_grid(folder, config)[0], _coordinator_context(config))
    other = config.replace(n_local_iter=config.n_local_iter + 1)
    with pytest.raises(ValueError, match="written by another fit .*n_local_iter"):
        server_app(_grid(folder, other)[0], _coordinator_context(other, resume=True))
    with pytest.raises(ValueError, match="written with seed 3, not 4"):
        server_app(_grid(folder, config)[0], _coordinator_context(config.replace(seed=4), resume=True))
    folder, configs, _ = fleet
    hm2 = configs["fedlin-hm2"].replace(out=str(tmp_path / "hm2"))
    with pytest.raises(ValueError, match="a fedlin-hm2 fit cannot be resumed: its sites keep state"):
        server_app(_fleet_grid(folder, hm2)[0], _coordinator_context(hm2, resume=True))


def test_a_summary_left_running_by_a_killed_run_is_closed(tmp_path):
    from fedhier.cli.flower import _close_summary

    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"status": "running", "sites": ["a"]}))
    _close_summary(path)
    summary = json.loads(path.read_text())
    assert summary["status"] == "failed" and "--resume" in summary["error"] and summary["sites"] == ["a"]
    path.write_text(json.dumps({"status": "completed"}))
    _close_summary(path)
    assert json.loads(path.read_text()) == {"status": "completed"}


def test_a_run_that_ends_before_its_server_app_starts_leaves_a_failed_summary(demo, tmp_path, monkeypatch):
    """`flwr run` cannot reach the SuperLink: summary.json says "failed" with the reason, not nothing at all."""
    import fedhier.cli.flower as flower_cli

    folder, config, _ = demo
    monkeypatch.setattr(flower_cli, "_run_streaming",
                        lambda cmd, env, timeout: (1, "Connection to the SuperLink is unavailable"))
    with pytest.raises(RuntimeError, match="flwr run failed"):
        flower_cli.submit(folder / "fit.toml", superlink="127.0.0.1:9", insecure=True, out=tmp_path / "fit")
    summary = json.loads((tmp_path / "fit" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["sites"] == list(SITES) and summary["model"] == config.model
    assert summary["error"] == ("the run ended before its ServerApp wrote anything: flwr run failed (exit code 1): "
                                "Connection to the SuperLink is unavailable")


def test_the_deadline_follows_progress_and_the_ttl_covers_it(demo):
    """Replies 0.25 s apart with a 0.4 s round_timeout: all three are waited for (0.75 s in all, which a fixed
    0.4 s deadline would cut), and a node that never answers is given up; each message's TTL covers the longest wait."""
    folder, config, _ = demo
    grid, nodes = _grid(folder, config)
    pushed: dict[str, float] = {}
    ttls = []
    push, pull = grid.push_messages, grid.pull_messages

    def push_timed(messages):
        messages = list(messages)
        ttls.extend(m.metadata.ttl for m in messages)
        ids = push(messages)
        pushed.update(dict.fromkeys(ids, time.monotonic()))
        return ids

    def pull_when_ready(ids):  # node k's reply is ready 0.25 * (k + 1) s after its request
        ready = [i for i in ids if time.monotonic() - pushed[i] >= 0.25 * (nodes.index(grid.inbox[i].metadata.dst_node_id) + 1)
                 if i in grid.inbox]
        return pull(ready)

    grid.push_messages, grid.pull_messages = push_timed, pull_when_ready
    result = _run(grid, config, n_rounds=1, round_timeout=0.4)
    assert result.history[0].sites == [0, 1, 2]
    assert ttls == [0.4 * 4] * 6  # "which site?" and round 1
    grid, nodes = _grid(folder, config)
    grid.behaviour[nodes[2]] = "silent"
    result = _run(grid, config, n_rounds=1, round_timeout=0.4)
    assert result.history[0].sites == [0, 1] and result.ignored == {nodes[2]: "no reply within 0.4 s"}


def test_fedlin_hm2_with_secure_summation_over_flower_equals_simulate(fleet, tmp_path):
    """The EP deltas summed securely (the coordinator learns only their sum): the same global posterior as
    simulate(..., aggregation="secure"), bit for bit; no message the server receives decodes as a reply."""
    folder, configs, sites = fleet
    config = configs["fedlin-hm2"].replace(aggregation="secure", n_rounds=2)
    grid, _ = _fleet_grid(folder, config)
    estimator = config.estimator()
    protocol = config.protocol()
    result = run_rounds(grid, protocol, config.sites, n_rounds=2, seed=config.seed, round_timeout=5.0, connect_timeout=1.0,
                        poll_interval=0.01, aggregator=config.aggregator())
    data = [estimator.site_stats(X, y, site=k)[0] for k, (X, y) in enumerate(sites)]
    reference = simulate(protocol, data, n_rounds=2, random_state=config.seed, aggregation="secure",
                         aggregator=config.aggregator())
    assert _max_diff(result.broadcast, reference.broadcast) == 0
    for kind, reply in grid.received:
        for value in dict(reply.content.config_records["fedhier"]).values():
            if isinstance(value, bytes) and value:
                with pytest.raises(ValueError):
                    decode(protocol.reply_spec, value)


@pytest.mark.integration
def test_a_fit_whose_superlink_is_killed_resumes_to_the_uninterrupted_result(tmp_path, demo):
    """The SuperLink (and its ServerApp) is SIGKILLed once round 1 is done; summary.json is closed as failed; a new
    SuperLink on the same port, the same SuperNodes reconnecting, and `fedhier flower run --resume` finish the fit
    with the parameters of an uninterrupted simulate() fit."""
    folder, config, sites = demo
    cluster = LoopbackFederation(tmp_path, {name: folder / f"{name}.csv" for name in SITES}, site_seed=config.seed,
                                 startup_timeout=300, database=tmp_path / "superlink.db")
    try:
        out = tmp_path / "fit"
        assert _flower_fit_killing_after_round_1(cluster, folder / "fit.toml", out, "superlink") not in ([], [0])
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "failed" and "--resume" in summary["error"], summary
        done = len(json.loads((out / "history.json").read_text()))
        assert 1 <= done < config.n_rounds
        cluster.restart("superlink")
        tls = ["--insecure"]
        assert cli_flower(["run", "--config", str(folder / "fit.toml"), "--superlink", cluster.address, *tls,
                           "--timeout", "300", "--out", str(out), "--resume"]) == 0, cluster.logs()
        broadcast, history, summary = read_result(out, config)
        assert summary["resumed_after_round"] == done and [r["round"] for r in history] == list(range(1, config.n_rounds + 1))
        reference = simulate(config.protocol(), sites, n_rounds=config.n_rounds, random_state=config.seed)
        assert _max_diff(broadcast, reference.broadcast) <= 1e-10
    finally:
        stopped = cluster.stop()
    assert not [pid for pid in stopped if _alive(pid)]


def test_a_secure_step_imports_neither_the_model_nor_dp_accounting(demo):
    """What a ClientApp process of a secure-sum step loads: the reply's declaration kept by the site's round step
    spares it the model (and scipy), the lazy privacy package spares it dp_accounting."""
    import subprocess
    import sys

    from fedhier.runtime.flower import _spec_from_text, _spec_text

    folder, config, _ = demo
    config = config.replace(aggregation="secure")
    keys, roster = _site_keys(folder, config.sites)
    spec = config.reply_spec()
    assert _spec_from_text(_spec_text(spec)) == spec and any(f.optional for f in spec.fields.values())
    code = (
        "import sys\n"
        "from fedhier.deploy import fit_from_json\n"
        "from fedhier.runtime.flower import secure_site_step\n"
        f"config = fit_from_json({config.to_json()!r})\n"
        f"kept = {{'round': 2, 'reply': b'', 'spec': {_spec_text(spec)!r}}}\n"
        "from fedhier.secure.keys import Roster, load_signing_key\n"
        f"identity = dict(signing_key=load_signing_key({str(keys['hospital-a'])!r}), roster=Roster.read({str(roster)!r}))\n"
        "fields, kept = secure_site_step(config, 'hospital-a', 'advertise_keys', {'round': 2}, kept, **identity)\n"
        "assert fields['status'] == 'ok', fields\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "fedhier.secure.secagg" in loaded
    assert not [m for m in loaded if m.split(".")[0] in ("scipy", "dp_accounting", "sklearn") or m.startswith("fedhier.models")]
