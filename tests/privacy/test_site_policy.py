"""A site's own policy and lifetime ledger: refusals before the data is read, composition across analyses,
tamper detection, and the same enforcement in simulate() and in the Flower ClientApp."""

from __future__ import annotations

import json
from collections.abc import Mapping

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event

from fedhier.data.schema import ViewSchema
from fedhier.models.mvppca.dp import DPConfig
from fedhier.privacy.policy import SitePolicy
from fedhier.privacy.site_ledger import LedgerIntegrityError, SiteLedger
from fedhier.protocol.mvppca import MVPPCAProtocol
from fedhier.runtime.simulate import SiteFailedWarning, simulate

VIEWS = {"a": 4, "b": 3}


def _sites(n_sites=3, n=40, seed=0):
    rng = np.random.default_rng(seed)
    W = {v: rng.uniform(-0.3, 0.3, size=(d, 2)) for v, d in VIEWS.items()}
    return [{v: np.clip(0.5 + rng.normal(size=(n, 2)) @ W[v].T + 0.05 * rng.normal(size=(n, d)), 0, 1)
             for v, d in VIEWS.items()} for _ in range(n_sites)]


def _protocol(epsilon=None, n_rounds=2):
    schema = ViewSchema(tuple(VIEWS), tuple(VIEWS.values()))
    privacy = None if epsilon is None else DPConfig.total(epsilon, 1e-5, n_rounds=n_rounds, n_views=len(VIEWS), spread=True)
    return MVPPCAProtocol(schema, 2, n_local_iter=2, n_first_iter=3, privacy=privacy)


def pld_epsilon(events, delta=1e-5):
    """Independent composition with dp_accounting's PLD accountant."""
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_event.ComposedDpEvent(list(events)))
    return acc.get_epsilon(delta)


class Untouchable(Mapping):
    """Site data that fails the test if anything reads it."""

    def __getitem__(self, key):
        raise AssertionError("the site read its data")

    def __iter__(self):
        raise AssertionError("the site read its data")

    def __len__(self):
        raise AssertionError("the site read its data")


def test_policy_file_is_read_and_checked(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('views = ["a"]\nmin_subjects = 5\nmodes = ["dp"]\nunit = "site"\nmax_epsilon = 1.0\n'
                    'lifetime_epsilon = 3\ndelta = 1e-5\nledger = "ledger.jsonl"\n')
    policy = SitePolicy.read(path)
    assert policy.views == ("a",) and policy.modes == ("dp",) and policy.ledger == (tmp_path / "ledger.jsonl").resolve()
    for text, message in (('colour = "red"\n', "unknown key"), ('modes = ["open"]\n', "modes must"),
                          ("lifetime_epsilon = 2.0\n", "needs a ledger"), ('max_epsilon = 1.0\n', "bounds only DP"),
                          ("min_subjects = 0\n", "min_subjects")):
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            SitePolicy.read(path)


@pytest.mark.parametrize("policy, reason", [
    (SitePolicy(modes=("dp", "dp+secure")), "allows modes"),
    (SitePolicy(views=("a",)), "allows views"),
])
def test_a_request_beyond_the_policy_is_refused_before_the_site_reads_its_data(policy, reason, caplog):
    sites = _sites()
    sites[1] = Untouchable()
    with pytest.warns(SiteFailedWarning, match="refused by the site's policy"), caplog.at_level("WARNING", "fedhier.site"):
        run = simulate(_protocol(), sites, n_rounds=2, random_state=0, site_policies=[None, policy, None])
    assert reason in caplog.text  # the reason stays in the site's log
    assert all(r.sites == [0, 2] and "PolicyRefusal" in r.failed[1] for r in run.history)
    reference = simulate(_protocol(), _sites(), n_rounds=2, random_state=0, participation={1: [1], 2: [1]})
    assert all(np.array_equal(run.broadcast[k], reference.broadcast[k]) for k in reference.broadcast)


def test_per_analysis_budget_and_minimum_subjects(caplog):
    sites = _sites()
    sites[0] = Untouchable()
    strict = SitePolicy(modes=("dp",), max_epsilon=0.5)
    with pytest.warns(SiteFailedWarning, match="refused by the site's policy"), caplog.at_level("WARNING", "fedhier.site"):
        simulate(_protocol(epsilon=1.0), sites, n_rounds=2, random_state=0, site_policies=[strict, None, None])
    assert "would spend epsilon 1 at delta 1e-05; the site allows 0.5 per analysis" in caplog.text
    few = SitePolicy(min_subjects=41)  # the site has 40 subjects per view: refused before any computation
    with pytest.warns(SiteFailedWarning, match="refused by the site's policy"), caplog.at_level("WARNING", "fedhier.site"):
        run = simulate(_protocol(), _sites(), n_rounds=1, random_state=0, site_policies=[None, few, None])
    assert "fewer than the 41 subjects" in caplog.text
    assert run.history[0].sites == [0, 2]


def test_the_lifetime_ledger_composes_two_fits_and_stops_the_third(tmp_path, caplog):
    plan = _protocol(epsilon=1.0).release_plan(2)
    two, three = pld_epsilon(plan * 2), pld_epsilon(plan * 3)
    assert two < three
    policy = SitePolicy(modes=("dp",), lifetime_epsilon=(two + three) / 2, ledger=tmp_path / "ledger.jsonl")
    sites = _sites()
    for k in range(2):
        run = simulate(_protocol(epsilon=1.0), sites, n_rounds=2, random_state=k, site_policies=[policy, None, None],
                       analysis=f"study-{k}")
        assert run.history[-1].sites == [0, 1, 2]
    ledger = SiteLedger(tmp_path / "ledger.jsonl")
    assert ledger.analyses == ["study-0", "study-1"] and len(ledger.entries) == len(plan) * 2
    assert ledger.epsilon(1e-5) == pytest.approx(two, rel=1e-3)  # the ledger's figure, checked independently
    sites[0] = Untouchable()
    with pytest.warns(SiteFailedWarning, match="refused by the site's policy"), caplog.at_level("WARNING", "fedhier.site"):
        run = simulate(_protocol(epsilon=1.0), sites, n_rounds=2, random_state=2, site_policies=[policy, None, None])
    assert "has spent or reserved epsilon" in caplog.text and "it would reach" in caplog.text
    assert all(0 not in r.sites for r in run.history)
    assert len(SiteLedger(tmp_path / "ledger.jsonl").entries) == len(plan) * 2  # nothing more was spent


@pytest.mark.parametrize("tamper", ["edit", "delete", "truncate", "reorder", "head", "key"])
def test_a_tampered_ledger_is_detected(tmp_path, tamper):
    path = tmp_path / "ledger.jsonl"
    ledger = SiteLedger(path)
    ledger.start("a")
    ledger.record("a", 1, [("x.mu", dp_event.GaussianDpEvent(2.0)), ("x.W", dp_event.GaussianDpEvent(3.0))])
    ledger.record("a", 2, [("x.mu", dp_event.GaussianDpEvent(2.0))])
    lines = path.read_text().splitlines()
    if tamper == "edit":  # a smaller spend: a larger noise multiplier
        row = json.loads(lines[1])
        row["body"] = row["body"].replace('"noise_multiplier": 2.0', '"noise_multiplier": 20.0')
        lines[1] = json.dumps(row)
    elif tamper == "delete":
        del lines[2]
    elif tamper == "truncate":
        lines = lines[:-1]
    elif tamper == "reorder":
        lines[1], lines[2] = lines[2], lines[1]
    if tamper in ("edit", "delete", "truncate", "reorder"):
        path.write_text("".join(line + "\n" for line in lines))
    elif tamper == "head":  # a head from a fresh ledger elsewhere, with its own key
        SiteLedger(tmp_path / "other.jsonl")
        (tmp_path / "ledger.jsonl.head").write_text((tmp_path / "other.jsonl.head").read_text())
    else:
        (tmp_path / "ledger.jsonl.key").write_text("0" * 64 + "\n")
    with pytest.raises(LedgerIntegrityError):
        SiteLedger(path)


def test_an_untampered_ledger_reopens_with_every_entry(tmp_path):
    ledger = SiteLedger(tmp_path / "l.jsonl")
    ledger.start("a")
    ledger.record("a", 1, [("x.mu", dp_event.GaussianDpEvent(2.0))])
    again = SiteLedger(tmp_path / "l.jsonl")
    assert again.analyses == ["a"] and [e.event for e in again.entries] == [dp_event.GaussianDpEvent(2.0)]
    assert again.epsilon(1e-5) == pytest.approx(pld_epsilon([dp_event.GaussianDpEvent(2.0)]), rel=1e-3)


def test_flower_and_simulate_enforce_the_same_policy(tmp_path, monkeypatch, caplog):
    """The ClientApp of a SuperNode started with a policy refuses what simulate() refuses, with the same reason,
    before reading its file; an admitted run's releases land in the site's ledger as in simulate()."""
    pytest.importorskip("flwr")
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedhier.cli.flower import write_demo_sites
    from fedhier.protocol.messages import encode
    from fedhier.deploy.apps import client_app
    from fedhier.deploy.mvppca import FlowerFitConfig
    from fedhier.runtime.flower import RUN_CONFIG_KEY, _RECORD

    for name, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
    path = write_demo_sites(tmp_path, n_sites=3, seed=3, n_components=2, n_rounds=2, n_local_iter=2, n_first_iter=3)
    config = FlowerFitConfig.read(path).replace(epsilon=1.0, delta=1e-5, out=str(tmp_path / "out"))
    protocol = config.protocol()
    broadcast = encode(protocol.broadcast_spec, protocol.initial_broadcast())
    site = config.sites[0]

    def ask(policy_file, data_file):
        msg = Message(RecordDict({_RECORD: ConfigRecord({"round": 1, "broadcast": broadcast})}), dst_node_id=7,
                      message_type="train")
        context = Context(run_id=5, node_id=7, state=RecordDict(), run_config={RUN_CONFIG_KEY: config.to_json()},
                          node_config={"site": site, "data": str(data_file), "policy": str(policy_file)})
        return client_app(msg, context).content.config_records[_RECORD]

    strict = tmp_path / "strict.toml"
    strict.write_text('modes = ["dp"]\nmax_epsilon = 0.5\n')
    missing = tmp_path / "no-such-file.csv"  # reading it would fail: a refusal must come first
    with caplog.at_level("WARNING", "fedhier.site"):
        reply = ask(strict, missing)
    assert "the analysis would spend epsilon" in caplog.text  # in the site's log only
    sites = [config.load_site(name, tmp_path / f"{name}.csv") for name in config.sites[:2]]
    with pytest.warns(SiteFailedWarning):
        run = simulate(protocol, sites, n_rounds=config.n_rounds, random_state=0,
                       site_policies=[SitePolicy.read(strict), None])
    assert reply["status"] == "error" and reply["error"] == run.history[0].failed[0]
    assert reply["error"] == "PolicyRefusal: refused by the site's policy (the reason is in the site's own log)"

    kept = tmp_path / "kept.toml"
    kept.write_text('modes = ["dp"]\nlifetime_epsilon = 10.0\nledger = "site-ledger.jsonl"\n')
    reply = ask(kept, tmp_path / f"{site}.csv")
    assert reply["status"] == "ok"
    ledger = SiteLedger(tmp_path / "site-ledger.jsonl")
    assert ledger.analyses == ["flower-run-5"]
    assert [e.event for e in ledger.entries] == protocol.release_plan(1)  # round 1's releases, as planned


def test_privacy_reports_are_json_and_their_epsilons_recompute_with_dp_accounting(tmp_path):
    from fedhier import FedMVPPCA
    from fedhier.privacy.report import site_report

    model = FedMVPPCA(n_components=2, n_rounds=2, n_local_iter=2, n_first_iter=3, random_state=0,
                      privacy=DPConfig.total(1.0, 1e-5, n_rounds=2, n_views=2, spread=True)).fit(_sites())
    report = json.loads(json.dumps(model.privacy_report(site_names={0: "a", 1: "b", 2: "c"})))
    assert report["format"] == "fedhier.privacy_report/1" and set(report["sites"]) == {"a", "b", "c"}
    assert report["software"]["fedhier"] and report["unit"] == "site" and report["delta"] == 1e-5
    for s, name in enumerate("abc"):
        entry = report["sites"][name]
        events = model.privacy_ledger_.events(s)
        assert len(entry["releases"]) == len(events) == 20  # 2 rounds x 2 views x 5 blocks (3 + the EM update's 2 spreads)
        assert entry["epsilon"] == pytest.approx(pld_epsilon(events), rel=1e-3) and entry["epsilon"] <= 1.0 + 1e-9
        for row, event in zip(entry["releases"], events):
            assert row["epsilon_alone"] == pytest.approx(pld_epsilon([event]), rel=1e-3)
        assert [r["round"] for r in entry["epsilon_after_round"]] == [1, 2]
        assert entry["epsilon_after_round"][-1]["epsilon"] == pytest.approx(entry["epsilon"])

    policy = SitePolicy(modes=("dp",), lifetime_epsilon=5.0, ledger=tmp_path / "l.jsonl", anchor=tmp_path / "l.anchor")
    for k in range(2):
        simulate(_protocol(epsilon=1.0), _sites(), n_rounds=2, random_state=k, site_policies=[policy, None, None],
                 analysis=f"study-{k}")
    report = json.loads(json.dumps(site_report(SiteLedger(policy.ledger), 1e-5, policy)))
    assert report["analyses"] == ["study-0", "study-1"] and report["policy"]["lifetime_epsilon"] == 5.0
    assert report["policy"]["anchor"] == str(tmp_path / "l.anchor")
    events = _protocol(epsilon=1.0).release_plan(2) * 2
    assert report["epsilon"] == pytest.approx(pld_epsilon(events), rel=1e-3)
