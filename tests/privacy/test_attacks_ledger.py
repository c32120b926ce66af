"""Attacks on a site's lifetime budget and on what its refusals tell the coordinator.

Each test is written as the adversary would try it -- a coordinator that starts two analyses
at once, an operator who restores an older backup of the ledger or raises the budget in the
policy file, a coordinator that reads the sites' refusal texts -- and fails on the code before
the ledger's reservation, lock and anchor.  Epsilons are checked against dp_accounting's PLD
accountant on the events, composed here independently of the ledger.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import shutil

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event

from fedhier.data.schema import ViewSchema
from fedhier.models.mvppca.dp import DPConfig
from fedhier.privacy.policy import AnalysisRequest, PolicyRefusal, SitePolicy
from fedhier.privacy.site_ledger import LedgerIntegrityError, SiteLedger
from fedhier.protocol.mvppca import MVPPCAProtocol
from fedhier.runtime.guard import SiteGuard
from fedhier.runtime.simulate import SiteFailedWarning, failure_report, simulate

VIEWS = {"a": 4, "b": 3}
N_ROUNDS = 2


class _Releases:
    """What a site's guard reads of an analysis' protocol: a DP analysis of views a and b whose every round
    releases one Gaussian sum (noise multiplier 2); the ledger, not the model, is under attack here."""

    private, protected_unit = True, "site"

    def requested_views(self):
        return tuple(VIEWS)

    def release_plan(self, n_rounds):
        return [dp_event.GaussianDpEvent(2.0)] * n_rounds


def _protocol(epsilon=1.0):
    """A real Fed-mv-PPCA protocol at total ``epsilon`` (for fits end to end)."""
    schema = ViewSchema(tuple(VIEWS), tuple(VIEWS.values()))
    privacy = DPConfig.total(epsilon, 1e-5, n_rounds=N_ROUNDS, n_views=len(VIEWS), spread=True)
    return MVPPCAProtocol(schema, 2, n_local_iter=2, n_first_iter=3, privacy=privacy)


def _sites(n_sites=3, n=40, seed=0):
    rng = np.random.default_rng(seed)
    W = {v: rng.uniform(-0.3, 0.3, size=(d, 2)) for v, d in VIEWS.items()}
    return [{v: np.clip(0.5 + rng.normal(size=(n, 2)) @ W[v].T + 0.05 * rng.normal(size=(n, d)), 0, 1)
             for v, d in VIEWS.items()} for _ in range(n_sites)]


def pld_epsilon(events, delta=1e-5):
    """Independent composition with dp_accounting's PLD accountant."""
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_event.ComposedDpEvent(list(events)))
    return acc.get_epsilon(delta)


def _run_plan(guard, protocol, rounds=range(1, N_ROUNDS + 1)):
    """What the site records when the analysis runs ``rounds`` (its releases, round by round)."""
    for r in rounds:
        guard.record(r, [("sum", e) for e in protocol.release_plan(1)])


# --------------------------------------------------------------------------- (d) the lifetime budget holds
def test_two_analyses_admitted_before_either_releases_cannot_exceed_the_lifetime_budget(tmp_path):
    protocol = _Releases()
    plan = protocol.release_plan(N_ROUNDS)
    one, two = pld_epsilon(plan), pld_epsilon(plan * 2)
    lifetime = (one + two) / 2  # room for one analysis, not two
    policy = SitePolicy(modes=("dp",), lifetime_epsilon=lifetime, ledger=tmp_path / "ledger.jsonl")
    first, second = SiteGuard(policy, "run-1"), SiteGuard(policy, "run-2")
    first.admit(protocol, N_ROUNDS, secure=False)
    with pytest.raises(PolicyRefusal):  # the coordinator's second run, started before the first released anything
        second.admit(protocol, N_ROUNDS, secure=False)
    _run_plan(first, protocol)
    ledger = SiteLedger(policy.ledger)
    assert pld_epsilon(ledger.events()) <= lifetime and ledger.analyses == ["run-1"]
    # what the first run did not spend is given back when it ends: it stopped after round 1
    half = pld_epsilon(plan + plan[: len(plan) // 2])
    policy = SitePolicy(modes=("dp",), lifetime_epsilon=(half + two) / 2, ledger=tmp_path / "other.jsonl")
    early, later = SiteGuard(policy, "early"), SiteGuard(policy, "later")
    early.admit(protocol, N_ROUNDS, secure=False)
    _run_plan(early, protocol, rounds=[1])
    with pytest.raises(PolicyRefusal):  # still reserved while it runs
        later.admit(protocol, N_ROUNDS, secure=False)
    early.finish()
    later.admit(protocol, N_ROUNDS, secure=False)
    assert SiteLedger(policy.ledger).epsilon(1e-5) == pytest.approx(half, rel=1e-3)


def _writer(path, analysis, n, barrier, out):
    ledger = SiteLedger(path)
    barrier.wait()
    try:
        for r in range(1, n + 1):
            ledger.record(analysis, r, [("x.mu", dp_event.GaussianDpEvent(50.0))])
        out.put(None)
    except Exception as exc:  # what a site would drop out of the round for
        out.put(f"{type(exc).__name__}: {exc}")


def _admitter(path, lifetime, barrier, out):
    policy = SitePolicy(modes=("dp",), lifetime_epsilon=lifetime, ledger=path)
    guard = SiteGuard(policy, f"run-{multiprocessing.current_process().pid}")
    barrier.wait()
    try:
        guard.admit(_Releases(), N_ROUNDS, secure=False)
        out.put("admitted")
    except PolicyRefusal:
        out.put("refused")


def _race(target, args_per_process):
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(len(args_per_process)), ctx.Queue()
    processes = [ctx.Process(target=target, args=(*args, barrier, out)) for args in args_per_process]
    for p in processes:
        p.start()
    results = [out.get(timeout=300) for _ in processes]
    for p in processes:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def test_a_coordinator_that_asks_for_more_rounds_than_it_announced_is_refused(tmp_path):
    """The coordinator announces N rounds (the site admits and reserves that plan), then asks for more rounds, or
    the same round again, or a round after the analysis ended: every release beyond the admitted plan is refused
    before it is sent, and the ledger holds exactly the plan.  On the code before, the extra releases were made,
    sent and recorded: the spend had no bound but the coordinator's word."""
    protocol = _Releases()
    plan = protocol.release_plan(N_ROUNDS)
    policy = SitePolicy(modes=("dp",), lifetime_epsilon=100.0, ledger=tmp_path / "ledger.jsonl")
    guard = SiteGuard(policy, "run-1")
    guard.admit(protocol, N_ROUNDS, secure=False)
    _run_plan(guard, protocol)
    for extra in (N_ROUNDS + 1, 1):  # one round more, then round 1 again
        with pytest.raises(PolicyRefusal) as refused:
            _run_plan(guard, protocol, rounds=[extra])
        assert failure_report(refused.value) == "PolicyRefusal: refused by the site's policy (the reason is in the site's own log)"
    ledger = SiteLedger(policy.ledger)
    assert ledger.events() == plan and pld_epsilon(ledger.events()) == pytest.approx(pld_epsilon(plan))
    # a repeated round within the plan spends the plan's own releases; after finish nothing more
    early = SiteGuard(policy, "run-2")
    early.admit(protocol, N_ROUNDS, secure=False)
    _run_plan(early, protocol, rounds=[1, 1])
    early.finish()
    with pytest.raises(PolicyRefusal):
        _run_plan(early, protocol, rounds=[2])
    assert SiteLedger(policy.ledger).events() == plan * 2


def test_two_fits_writing_one_ledger_at_once_leave_it_valid_and_admit_one_of_two(tmp_path):
    path = tmp_path / "ledger.jsonl"
    SiteLedger(path)
    results = _race(_writer, [(path, "fit-a", 40), (path, "fit-b", 40)])
    assert results == [None, None]  # no writer saw a half-written ledger
    ledger = SiteLedger(path)  # verifies every line's MAC and the head
    assert sorted(e.analysis for e in ledger.entries) == ["fit-a"] * 40 + ["fit-b"] * 40
    # two processes admitted at the same instant, room for one analysis: exactly one gets it
    plan = _Releases().release_plan(N_ROUNDS)
    lifetime = (pld_epsilon(plan) + pld_epsilon(plan * 2)) / 2
    results = _race(_admitter, [(tmp_path / "budget.jsonl", lifetime), (tmp_path / "budget.jsonl", lifetime)])
    assert sorted(results) == ["admitted", "refused"]
    assert len(SiteLedger(tmp_path / "budget.jsonl").analyses) == 1


def _policy_file(folder, lifetime, anchor="../anchor/ledger.anchor"):
    path = folder / "policy.toml"
    path.write_text(f'modes = ["dp"]\nlifetime_epsilon = {lifetime}\nledger = "ledger.jsonl"\nanchor = "{anchor}"\n')
    return path


@pytest.mark.parametrize("attack", ["restore backup", "delete ledger and head", "delete every ledger file",
                                    "point the policy at a new ledger", "restore backup, delete anchor",
                                    "drop the anchor from the policy"])
def test_rolling_the_ledger_back_is_detected_where_the_anchor_is_kept(tmp_path, attack):
    site, backup = tmp_path / "site", tmp_path / "backup"
    site.mkdir()
    protocol = _Releases()
    plan = protocol.release_plan(N_ROUNDS)
    path = _policy_file(site, (pld_epsilon(plan * 2) + pld_epsilon(plan * 3)) / 2)  # room for two analyses
    first = SiteGuard(SitePolicy.read(path), "study-1")
    first.admit(protocol, N_ROUNDS, secure=False)
    _run_plan(first, protocol)
    first.finish()
    shutil.copytree(site, backup)  # the operator's backup after one analysis
    second = SiteGuard(SitePolicy.read(path), "study-2")
    second.admit(protocol, N_ROUNDS, secure=False)
    _run_plan(second, protocol)
    second.finish()
    assert (tmp_path / "anchor" / "ledger.anchor").exists()
    if attack == "restore backup":  # gives back the second analysis' spend
        for name in ("ledger.jsonl", "ledger.jsonl.head"):
            shutil.copy(backup / name, site / name)
    elif attack == "delete ledger and head":
        (site / "ledger.jsonl").unlink()
        (site / "ledger.jsonl.head").unlink()
    elif attack == "delete every ledger file":
        for name in ("ledger.jsonl", "ledger.jsonl.head", "ledger.jsonl.key"):
            (site / name).unlink()
    elif attack == "point the policy at a new ledger":
        path.write_text(path.read_text().replace('ledger = "ledger.jsonl"', 'ledger = "fresh.jsonl"'))
    elif attack == "restore backup, delete anchor":
        for name in ("ledger.jsonl", "ledger.jsonl.head"):
            shutil.copy(backup / name, site / name)
        (tmp_path / "anchor" / "ledger.anchor").unlink()
    else:
        path.write_text(path.read_text().replace('anchor = "../anchor/ledger.anchor"\n', ""))
    third = SiteGuard(SitePolicy.read(path), "study-3")
    with pytest.raises(LedgerIntegrityError, match="anchor"):
        third.admit(protocol, N_ROUNDS, secure=False)
    assert not (site / "fresh.jsonl").exists() or SiteLedger(site / "fresh.jsonl").entries == []


def test_rolling_back_the_ledger_and_its_anchor_together_stays_undetectable(tmp_path):
    """The residual the docs state: an anchor restored with the ledger proves nothing."""
    protocol = _Releases()
    path = _policy_file(tmp_path, 100.0, anchor="ledger.anchor")
    first = SiteGuard(SitePolicy.read(path), "study-1")
    first.admit(protocol, N_ROUNDS, secure=False)
    saved = {name: (tmp_path / name).read_bytes() for name in ("ledger.jsonl", "ledger.jsonl.head", "ledger.anchor")}
    _run_plan(first, protocol)
    for name, content in saved.items():
        (tmp_path / name).write_bytes(content)
    assert SiteLedger(tmp_path / "ledger.jsonl", anchor=tmp_path / "ledger.anchor").entries == []


def test_raising_lifetime_epsilon_in_the_policy_file_is_refused(tmp_path):
    protocol = _Releases()
    plan = protocol.release_plan(N_ROUNDS)
    lifetime = (pld_epsilon(plan) + pld_epsilon(plan * 2)) / 2
    path = _policy_file(tmp_path, lifetime)
    guard = SiteGuard(SitePolicy.read(path), "study-1")
    guard.admit(protocol, N_ROUNDS, secure=False)
    _run_plan(guard, protocol)
    guard.finish()
    path.write_text(path.read_text().replace(f"lifetime_epsilon = {lifetime}", "lifetime_epsilon = 100.0"))
    with pytest.raises(PolicyRefusal, match="cannot be raised"):
        SiteGuard(SitePolicy.read(path), "study-2").admit(protocol, N_ROUNDS, secure=False)
    path.write_text(path.read_text().replace("lifetime_epsilon = 100.0\n", ""))  # or removed altogether
    with pytest.raises(PolicyRefusal, match="cannot be raised"):
        SiteGuard(SitePolicy.read(path), "study-2").admit(protocol, N_ROUNDS, secure=False)
    assert SiteLedger(tmp_path / "ledger.jsonl").analyses == ["study-1"]
    assert SiteLedger(tmp_path / "ledger.jsonl").policies[0]["sha256"]  # the admitted policy file's hash


# --------------------------------------------------------------------------- (e) what a refusal tells
def _refusals(tmp_path):
    """Every way a site with a policy refuses, as ``(kind, exception)`` raised by the site's own guard."""
    protocol = _Releases()
    plan = protocol.release_plan(N_ROUNDS)
    cases = {
        "mode": SitePolicy(modes=("plain",)),
        "views": SitePolicy(views=("a",), modes=("dp",)),
        "unit": SitePolicy(unit="site", modes=("dp",)),
        "per-analysis cap": SitePolicy(modes=("dp",), max_epsilon=0.5),
        "lifetime": SitePolicy(modes=("dp",), lifetime_epsilon=pld_epsilon(plan) / 2, ledger=tmp_path / "l1.jsonl"),
    }
    out = []
    for kind, policy in cases.items():
        with pytest.raises(PolicyRefusal) as caught:
            SiteGuard(policy, "probe").admit(protocol if kind != "unit" else _record_protocol(), N_ROUNDS, False)
        out.append((kind, caught.value))
    with pytest.raises(PolicyRefusal) as caught:
        SitePolicy(modes=("dp",), max_epsilon=1.0).admit(
            AnalysisRequest("probe", "dp", tuple(VIEWS), "site", (dp_event.NonPrivateDpEvent(),)))
    out.append(("non-private", caught.value))
    with pytest.raises(PolicyRefusal) as caught:
        SitePolicy(min_subjects=41).check_subjects({"a": 40, "b": 40})
    out.append(("min_subjects", caught.value))
    with pytest.raises(PolicyRefusal) as caught:
        SiteGuard(SitePolicy(modes=("dp",), ledger=tmp_path / "l2.jsonl"), "never-admitted").check_admitted()
    out.append(("never admitted", caught.value))
    raised = _policy_file(tmp_path, 5.0, anchor="l3.anchor")
    SiteGuard(SitePolicy.read(raised), "study").admit(protocol, N_ROUNDS, False)
    raised.write_text(raised.read_text().replace("lifetime_epsilon = 5.0", "lifetime_epsilon = 9.0"))
    with pytest.raises(PolicyRefusal) as caught:
        SiteGuard(SitePolicy.read(raised), "probe").admit(protocol, N_ROUNDS, False)
    out.append(("lifetime raised", caught.value))
    (tmp_path / "ledger.jsonl").write_text("")  # a ledger emptied behind its anchor's back
    (tmp_path / "ledger.jsonl.head").unlink()
    with pytest.raises(LedgerIntegrityError) as caught:
        SiteGuard(SitePolicy.read(raised), "probe").admit(protocol, N_ROUNDS, False)
    out.append(("ledger rolled back", caught.value))
    return out


def test_min_subjects_is_not_an_exact_membership_oracle(tmp_path):
    """The coordinator starts many DP analyses against a site whose minimum is 30 subjects: with the target
    in (30 subjects) the site must sometimes refuse, with the target out (29) sometimes take part."""
    protocol = _protocol()
    policy = SitePolicy(modes=("dp",), min_subjects=30, subjects_epsilon=0.5, ledger=tmp_path / "l.jsonl")
    trials = 60

    def refusals(n):
        refused = 0
        for k in range(trials):
            guard = SiteGuard(policy, f"probe-{n}-{k}")
            try:
                guard.check_data(protocol, {"a": np.zeros((n, 4))})
            except PolicyRefusal:
                refused += 1
        return refused

    with_target, without_target = refusals(30), refusals(29)
    assert 0 < with_target < trials and 0 < without_target < trials  # the exact check gives 0 and `trials`
    # one analysis decides alike in every round, and its count is one release in the ledger
    guard, outcomes = SiteGuard(policy, "one-analysis"), []
    for _ in range(3):
        try:
            guard.check_data(protocol, {"a": np.zeros((30, 4))})
            outcomes.append("ok")
        except PolicyRefusal:
            outcomes.append("refused")
    assert len(set(outcomes)) == 1
    ledger = SiteLedger(policy.ledger)
    mine = [e for e in ledger.entries if e.analysis == "one-analysis"]
    assert [(e.block, e.event) for e in mine] == [("subjects/a", dp_event.LaplaceDpEvent(2.0))]
    line = next(json.loads(json.loads(row)["body"]) for row in policy.ledger.read_text().splitlines()
                if '\\"one-analysis\\"' in row)
    assert set(line) == {"kind", "analysis", "round", "block", "event", "passed"}  # the outcome, not the count
    assert ledger.epsilon(1e-5) == pytest.approx(pld_epsilon([dp_event.LaplaceDpEvent(2.0)] * (2 * trials + 1)), rel=2e-3)


def _record_protocol():
    """A protocol whose DP protects each record (a site's policy may demand each site)."""
    from fedhier.privacy.analyze_gauss import RecordDP
    from fedhier.protocol.record_dp import MVPPCARecordDPProtocol

    return MVPPCARecordDPProtocol(ViewSchema(tuple(VIEWS), tuple(VIEWS.values())), 2, RecordDP(1.0, 1e-5))


def test_no_refusal_text_at_the_coordinator_holds_a_number_or_a_path(tmp_path):
    refusals = _refusals(tmp_path)
    assert len(refusals) == 10
    for kind, exc in refusals:
        sent = failure_report(exc)  # the one line the coordinator receives, in simulate() and over Flower
        assert not re.search(r"\d", sent), (kind, sent)
        assert "/" not in sent and str(tmp_path) not in sent, (kind, sent)
        assert re.search(r"\d", str(exc)) or kind in ("mode", "views", "unit", "non-private", "never admitted"), kind
    # end to end: the text in the coordinator's history of a fit
    protocol = _protocol()
    policy = SitePolicy(modes=("dp",), lifetime_epsilon=0.3, ledger=tmp_path / "e2e.jsonl")
    with pytest.warns(SiteFailedWarning):
        run = simulate(protocol, _sites(), n_rounds=1, random_state=0, site_policies=[policy, None, None])
    assert not re.search(r"\d", run.history[0].failed[0]) and "/" not in run.history[0].failed[0]
