"""Flower runtime: run any fedhier round protocol on real machines (ARCHITECTURE "Runtimes").

One SuperLink (the coordinator) and one SuperNode per site, talking gRPC/HTTP over
Flower's Message API.  Flower only carries bytes; the round itself is ours.  Like
:func:`fedhier.runtime.simulate`, this module knows rounds, messages, sites and failures,
not models: a model family plugs in as a :class:`Deployment` (its configuration, its
:class:`~fedhier.protocol.base.RoundProtocol`, how a site reads its own file, and how the
final broadcast becomes a fitted model), which the estimator layer provides
(:mod:`fedhier.deploy`).  This module imports no estimator, no model and no CLI module.

* :func:`make_server_app` builds the Flower ``ServerApp``: it runs :func:`run_rounds`, our
  own round loop over ``Grid.push_messages`` / ``Grid.pull_messages`` -- not Flower's
  strategies -- and writes the result folder (:func:`write_result`);
* :func:`make_client_app` builds the Flower ``ClientApp``: it runs the site half of a
  round on the site's own file, whose path comes from the SuperNode's ``node_config``
  (``data``), with the site's name in ``site``;
* every message crossing the network is a declared fedhier message serialised by
  :func:`fedhier.protocol.messages.encode` and carried as a ``bytes`` value of a Flower
  ``ConfigRecord`` -- never a pickle;
* the site step is :func:`fedhier.runtime.simulate.run_site_step` and the server step is
  :func:`fedhier.runtime.simulate.server_update`;
* each site receives only its part of the broadcast (``protocol.site_broadcast``; FedLin
  HM1 sends site k only its own column of Theta).  The server asks every SuperNode its
  site name before round 1 (a Flower ``query`` message, answered from the SuperNode's
  ``node_config``), so round 1 already goes to the right node;
* a SuperNode's site name comes from its ``node_config`` (``site="..."``).  With node
  authentication the SuperLink knows each registered key's name (``flwr supernode register
  --name``): a SuperNode whose claimed site differs from its registered name is ignored;
* a site's secrets (DP noise, its random start, secure-sum keys) come from its own
  entropy: the coordinator's request carries no seed.  A SuperNode started with a secret
  seed of its own (``node_config`` ``seed="..."``, ``fedhier flower site --seed``) draws
  what :func:`fedhier.runtime.simulate` draws with ``random_state`` equal to that seed,
  so a Flower fit whose sites are all given the simulation's seed equals it bit for bit
  (tests and reproductions only: a seed shared by the sites is no secret among them);
* a failing site tells the coordinator only :func:`fedhier.runtime.simulate.failure_report`
  of its error; the full text stays in the site's log.

Robustness:

* every exchange has a deadline that follows progress: the server waits until every
  reply came or ``round_timeout`` seconds passed without a new one (so a round is not cut
  while slow ClientApps keep answering, and a dead site costs ``round_timeout`` after the
  last reply); Flower's message TTL covers that longest wait;
* the question before round 1 needs only a started ClientApp, so it is given Flower's
  start window (:data:`START_WINDOW`, its heartbeat patience): a SuperNode silent that
  long has a ClientApp Flower refused, and the fit, if it cannot go on without it, stops
  there with that cause and its remedy instead of after ``round_timeout``;
* a site whose step raises is dropped from that round (its error is recorded) and asked
  again in the next round; a site whose ClientApp Flower gave up on (no heartbeat), could
  not load or refused to run is lost, with the cause;
* a site that does not answer before the deadline, or that Flower reports unreachable
  (its SuperNode crashed or disconnected, the message expired), is dropped from that
  round and *lost*: it is not asked again in this fit, so one dead site costs one
  deadline, not one per round;
* a round with fewer than ``min_sites`` replies stops the fit with
  :class:`~fedhier.runtime.simulate.RoundFailed`; no partial global update is broadcast;
* ``summary.json`` always ends in a final status ("completed" or "failed").

Secure summation (``aggregation = "secure"``, ``docs/flower.md``): a site keeps its reply
in the ClientApp's ``context.state`` and answers the round request with "held"; the
server then runs the five steps of Bonawitz et al. (:mod:`fedhier.secure.secagg`) as
Flower messages ``train.advertise_keys``, ``train.share_keys``, ``train.masked_input``,
``train.sign_survivors`` and ``train.unmask`` (:func:`_secure_sum`), and the global step
gets the decoded sum, as :func:`fedhier.runtime.simulate` with ``aggregation="secure"``.
Each site signs with its own long-term key (``node_config["site-key"]``) and checks the
others' signatures against the roster its operator was given (``node_config["roster"]``),
never against anything the coordinator sends.  A site's secrets between two steps stay in
its ``context.state`` as declared arrays, with the broadcasts it has answered; a round
whose sum cannot be recovered (fewer than the threshold of sites left) stops the fit with
``RoundFailed``.

Site indices: the fit configuration lists the site names; site ``s`` is the ``s``-th name
(0-based).  A SuperNode whose ``site`` is not in the list is ignored (and reported); two
SuperNodes claiming the same site stop the fit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ..protocol.base import RoundProtocol, SiteError
from ..protocol.messages import Field, Message, MessageSpec, decode, encode
from ..utils.io import atomic_write_bytes, write_json
from ..utils.untrusted import check_site_name
if TYPE_CHECKING:
    from .guard import SiteGuard
from .simulate import (RoundFailed, RoundRecord, decode_state, encode_site_broadcast, encode_state, failure_report,
                       global_update, run_site_step, server_update, site_log)

try:
    from flwr.app import ConfigRecord, Context, Message as FlowerMessage, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.common import constant as flower_constant
    from flwr.common.constant import ErrorCode
    from flwr.serverapp import Grid, ServerApp
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('the Flower runtime needs the optional extra: pip install -e ".[flower]"') from exc

__all__ = [
    "Deployment",
    "FitHooks",
    "FlowerFitResult",
    "check_flower_settings",
    "check_secure_settings",
    "read_fit_tables",
    "run_rounds",
    "coordinate",
    "site_round",
    "secure_site_step",
    "make_server_app",
    "make_client_app",
    "write_result",
    "read_result",
    "MESSAGE_TYPE",
    "HELLO_TYPE",
    "RUN_CONFIG_KEY",
    "RESUME_KEY",
    "CHECKPOINT",
    "SECURE_STEPS",
    "FLOWER_KEYS",
    "SECURE_KEYS",
]

log = logging.getLogger(__name__)

#: Flower message type of a round (a ClientApp "train" action).
MESSAGE_TYPE = "train"
#: Flower message type of the question "which site are you?" asked before round 1 (a ClientApp "query").
HELLO_TYPE = "query"
#: run-config key holding the fit configuration (JSON) in the Flower app.
RUN_CONFIG_KEY = "fedhier-fit"
#: run-config key: "yes" resumes the fit from the coordinator checkpoint in its result folder.
RESUME_KEY = "fedhier-resume"
#: the coordinator checkpoint in the result folder (written after every round).
CHECKPOINT = "checkpoint.npz"
_RECORD = "fedhier"
#: Flower error codes meaning that the SuperNode or the message cannot be reached.
_UNREACHABLE = frozenset({ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.NODE_UNAVAILABLE})
#: Flower's heartbeat period (s): a ClientApp process must claim its message this long after its launch, or its
#: SuperNode launches another; a running one must send a heartbeat every HEARTBEAT_PATIENCE periods.
HEARTBEAT_PERIOD = float(getattr(flower_constant, "HEARTBEAT_DEFAULT_INTERVAL", 30))
#: seconds the coordinator gives every SuperNode to answer "which site are you?" before round 1: Flower's
#: heartbeat patience.  The question needs nothing but a started ClientApp, so a node silent that long has a
#: ClientApp Flower refused (or it never pulled the message).
START_WINDOW = float(getattr(flower_constant, "HEARTBEAT_PATIENCE", 2)) * HEARTBEAT_PERIOD
_OVERLOADED = ("the host is overloaded or the SuperNode is stuck on an earlier message; lower the host's load (or restart "
               "the SuperNode, which stops the ClientApps Flower keeps launching) and run the fit again")
#: Flower's own refusals of a site's ClientApp (error code -> cause and remedy, one line): the site is lost.
_REFUSED = {
    ErrorCode.CLIENT_APP_CRASHED: f"its ClientApp stopped sending Flower's heartbeat for {START_WINDOW:g} s and Flower gave "
                                  f"up on it: {_OVERLOADED}",
    ErrorCode.LOAD_CLIENT_APP_EXCEPTION: "Flower could not load its ClientApp; install the coordinator's fedhier version "
                                         "(with its [flower] extra) where the SuperNode runs",
    ErrorCode.INVALID_FAB: "its SuperNode refused the app, which none of its trusted entities signed; sign the app or "
                           "start the SuperNode without --trusted-entities",
}
_STATE = "fedhier-state"
#: ``context.state`` record of a site in a secure round: its reply and its secure-sum secrets (never sent).
_SECURE = "fedhier-secure"
#: The secure-sum steps of a round, in order; each is the ClientApp action ``train.<step>``.
SECURE_STEPS = ("advertise_keys", "share_keys", "masked_input", "sign_survivors", "unmask")
#: ``context.state`` record of a site: the broadcasts whose replies it has sent masked (32-byte digests).
_ANSWERED = "fedhier-answered"
#: keys of the ``[flower]`` table of a fit configuration, and of its ``[secure]`` table.
FLOWER_KEYS = frozenset({"sites", "min_sites", "round_timeout", "connect_timeout", "poll_interval", "out"})
SECURE_KEYS = frozenset({"threshold", "frac_bits"})


# --------------------------------------------------------------------------- what a model family provides


@dataclass
class FitHooks:
    """What a :class:`Deployment` runs around the rounds of one fit (fresh for every fit).

    Attributes
    ----------
    callbacks : list of callables ``(record, broadcast) -> None``, run after every round
        (e.g. metrics the estimator records in its history).
    stop : callable ``(record, broadcast) -> bool`` or None
        The family's stopping rule, as ``simulate(stop=...)``.
    notes : dict
        Whatever the callbacks record for :meth:`Deployment.write_model`.
    """

    callbacks: list[Callable[[RoundRecord, Message], None]] = field(default_factory=list)
    stop: Callable[[RoundRecord, Message], bool] | None = None
    notes: dict[str, Any] = field(default_factory=dict)


class Deployment(ABC):
    """A model family's fit over Flower: what the runtime asks of it.

    Implemented by the estimator layer (:mod:`fedhier.deploy`), one class per family, from
    the family's ``fit.toml``.  Attributes every deployment has (the ``[flower]`` table,
    :func:`check_flower_settings`, and the length of the run):

    ``sites`` (tuple of str, site-index order), ``n_rounds`` (int), ``seed`` (int or None,
    the coordinator's public seed), ``min_sites`` (int), ``round_timeout``,
    ``connect_timeout``, ``poll_interval`` (seconds), ``out`` (the result folder on the
    SuperLink host).
    """

    #: the name of the family in ``fit.toml`` (``model = "..."``) and in the run config
    model: str

    @abstractmethod
    def protocol(self) -> RoundProtocol:
        """The round protocol, built the same way on the server and on every site."""

    def reply_spec(self) -> MessageSpec:
        """A site's declared reply (what a secure fit flattens); default ``protocol().reply_spec``."""
        return self.protocol().reply_spec

    def aggregator(self) -> Any:
        """The secure summation of a secure fit (:class:`fedhier.secure.secure_round.SecureAggregator`), else None."""
        return None

    @abstractmethod
    def load_site(self, site: str, path: str | Path) -> Any:
        """Read and check one site's own file (runs at the site); the data ``protocol().site_step`` takes.

        Errors whose text names only places (column, row), never values, are
        :class:`~fedhier.protocol.base.SiteError`; anything else reaches the coordinator as
        its category only.
        """

    #: True when a site keeps state between rounds (``ctx.state``); Flower keeps it only within one run,
    #: so such a fit cannot be resumed in a new run
    sites_keep_state: bool = False

    def hooks(self, previous: Message | None = None) -> FitHooks:
        """Callbacks and stopping rule of one fit (called once per fit, on the server); ``previous``: the
        broadcast a resumed fit starts from (None: the initial one)."""
        return FitHooks()

    @abstractmethod
    def write_model(self, out: Path, result: "FlowerFitResult", hooks: FitHooks) -> dict[str, Any]:
        """Turn the final broadcast into the family's fitted model and write it into ``out``.

        Returns entries for ``summary.json`` (e.g. ``{"model": path}``).
        """

    @abstractmethod
    def to_json(self) -> str:
        """The form that travels in the Flower run config (key :data:`RUN_CONFIG_KEY`); holds ``model``."""


def check_flower_settings(config: Any) -> None:
    """Check the ``[flower]`` settings of a deployment (attributes listed in :class:`Deployment`); ValueError naming the key."""
    sites = config.sites
    if not sites or not all(isinstance(s, str) and s for s in sites):
        raise ValueError("fit configuration: [flower] sites must list the site names (non-empty strings)")
    if len(set(sites)) != len(sites):
        raise ValueError(f"fit configuration: site names must be unique, got {list(sites)}")
    for site in sites:  # a site name names its SuperNode's files (keys, logs)
        check_site_name(site, "fit configuration: [flower] sites")
    for name in ("n_rounds", "min_sites"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"fit configuration: {name} must be a positive integer, got {value!r}")
    if config.min_sites > len(sites):
        raise ValueError(f"fit configuration: min_sites={config.min_sites} exceeds the {len(sites)} listed sites")
    seed = config.seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"fit configuration: seed must be a non-negative integer, got {seed!r}")
    for name in ("round_timeout", "connect_timeout", "poll_interval"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"fit configuration: {name} must be a positive number of seconds, got {value!r}")
    if not isinstance(config.out, str) or not config.out:
        raise ValueError("fit configuration: out must be a folder name")


def check_secure_settings(config: Any) -> None:
    """Check ``aggregation`` and the ``[secure]`` settings (``threshold``, ``frac_bits``) of a deployment; a secure
    fit's ``config.aggregator()`` must build.  ValueError naming the key."""
    if config.aggregation not in ("plain", "secure"):
        raise ValueError(f"fit configuration: aggregation must be 'plain' or 'secure', got {config.aggregation!r}")
    for name, value in (("threshold", config.threshold), ("frac_bits", config.frac_bits)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"fit configuration: [secure] {name} must be an integer, got {value!r}")
    if config.aggregation == "secure":
        if len(config.sites) < 2:
            raise ValueError("fit configuration: aggregation = 'secure' needs at least 2 sites")
        try:
            config.aggregator()
        except ValueError as exc:
            raise ValueError(f"fit configuration: [secure] {exc}") from None


def read_fit_tables(raw: dict[str, Any], source: str, allowed: set[str] | frozenset[str]) -> tuple[dict, dict, dict]:
    """Split a parsed ``fit.toml`` into (the family's own keys, ``[flower]``, ``[secure]``).

    ``allowed``: the family's own top-level keys (besides ``model``, ``flower``, ``secure``).
    ValueError naming ``source`` and the key for an unknown key or a missing ``[flower]`` table.
    """
    raw = dict(raw)
    raw.pop("model", None)
    unknown = sorted(set(raw) - set(allowed) - {"flower", "secure"})
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; allowed: {sorted({*allowed, 'model', 'flower', 'secure'})}")
    flower = raw.pop("flower", None)
    if not isinstance(flower, dict):
        raise ValueError(f"{source}: a [flower] table with the site names (sites = [...]) is required")
    unknown = sorted(set(flower) - FLOWER_KEYS)
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown} in [flower]; allowed: {sorted(FLOWER_KEYS)}")
    secure = raw.pop("secure", {})
    if not isinstance(secure, dict):
        raise ValueError(f"{source}: secure must be a table ([secure] with threshold, frac_bits)")
    unknown = sorted(set(secure) - SECURE_KEYS)
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown} in [secure]; allowed: {sorted(SECURE_KEYS)}")
    if secure and raw.get("aggregation") != "secure":
        raise ValueError(f"{source}: a [secure] table needs aggregation = \"secure\"")
    return raw, flower, secure


# --------------------------------------------------------------------------- the round loop


@dataclass
class FlowerFitResult:
    """Outcome of :func:`run_rounds`.

    Attributes
    ----------
    broadcast : Message
        Final broadcast (the global parameters).
    history : list of RoundRecord
        One record per round: sites that replied, sites absent (lost earlier or never
        connected), sites that failed this round with the reason, bytes of our messages.
    seed : int
    nodes : dict site index -> Flower node id
    lost : dict site index -> round in which it stopped answering
    ignored : dict Flower node id -> reason (a node that is not one of the listed sites)
    converged : bool
        The stopping rule (``stop``) ended the fit, possibly before ``n_rounds``.
    """

    broadcast: Message
    history: list[RoundRecord]
    seed: int
    nodes: dict[int, int] = field(default_factory=dict)
    lost: dict[int, int] = field(default_factory=dict)
    ignored: dict[int, str] = field(default_factory=dict)
    converged: bool = False


def _wait_for_nodes(grid: Grid, n_wanted: int, timeout: float, poll: float) -> list[int]:
    deadline = time.monotonic() + timeout
    nodes = sorted(grid.get_node_ids())
    while len(nodes) < n_wanted and time.monotonic() < deadline:
        time.sleep(max(poll, 1.0))
        nodes = sorted(grid.get_node_ids())
    return nodes


def _exchange(grid: Grid, contents: Mapping[int, RecordDict], message_type: str, round: int, timeout: float, poll: float):
    """Push one message per node and pull the replies until all came or ``timeout`` seconds passed without a new one.

    The deadline follows progress: every reply restarts the wait, so a round whose
    ClientApps start one after the other on a loaded machine is not cut while replies keep
    coming, and a node that died costs ``timeout`` seconds after the last reply.  Each
    message's Flower TTL covers the longest such wait, ``timeout * (nodes + 1)`` seconds.

    Returns ({node: reply Flower message}, {node: reason} for nodes without a reply).
    """
    nodes = list(contents)
    ttl = timeout * (len(nodes) + 1)
    messages = [
        FlowerMessage(contents[n], dst_node_id=n, message_type=message_type, group_id=str(round), ttl=ttl)
        for n in nodes
    ]
    ids = list(grid.push_messages(messages))
    missing = {n: "the SuperLink refused the message" for n, i in zip(nodes, ids) if i is None}
    pending = {i: n for n, i in zip(nodes, ids) if i is not None}
    replies: dict[int, FlowerMessage] = {}
    deadline = time.monotonic() + timeout
    while pending:
        for msg in grid.pull_messages(list(pending)):
            node = pending.pop(msg.metadata.reply_to_message_id, None)
            if node is not None:
                replies[node] = msg
                deadline = time.monotonic() + timeout
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    missing.update({n: f"no reply within {timeout:g} s" for n in pending.values()})
    return replies, missing


def _read_reply(msg: FlowerMessage) -> tuple[str | None, str, bytes | str]:
    """(site name or None, status, payload) of a site's reply.

    Status "ok" (payload: our encoded message), "held" (secure fit: the site computed its
    reply and keeps it for the secure sum; empty payload), "error" (the site's step or its
    ClientApp failed: dropped from this round) or "gone" (Flower reports the SuperNode or
    the message unreachable, or refused the site's ClientApp: the site is lost; for a
    refusal the payload names its cause and remedy).
    """
    if msg.has_error():
        if msg.error.code in _REFUSED:
            return None, "gone", _REFUSED[msg.error.code]
        status = "gone" if msg.error.code in _UNREACHABLE else "error"
        return None, status, f"Flower error {msg.error.code}: {msg.error.reason}"
    record = msg.content.config_records.get(_RECORD)
    if record is None:
        return None, "error", "reply without a fedhier record"
    site = str(record.get("site", "")) or None
    status = str(record.get("status", "error"))
    if status == "held":
        return site, status, b""
    payload = record.get("reply") if status == "ok" else str(record.get("error", "unknown error"))
    if status == "ok" and not isinstance(payload, bytes):
        return site, "error", "reply without payload bytes"
    return site, status, payload


_UNEXPECTED = {
    "ok": "sent its reply in the clear, but the fit uses secure aggregation (the reply was not read)",
    "held": "kept its reply for secure aggregation, but the server sums the replies in the clear",
}


def _secure_sum(
    grid: Grid,
    aggregator: Any,
    spec: MessageSpec,
    rnd: int,
    nodes: Mapping[int, int],
    names: Sequence[str],
    timeout: float,
    poll: float,
) -> tuple[Message, list[int], dict[int, int], dict[int, int], dict[int, str], list[int]]:
    """Secure sum of the ``spec`` replies that the sites ``nodes`` (site -> node) keep in round ``rnd``.

    The five steps of :mod:`fedhier.secure.secagg` (advertise keys, share keys, masked
    input, sign the survivor list, unmask), each one Flower message of type ``train.<step>`` per site still taking
    part, carrying the bytes of the previous server step.  The server half is a
    :class:`~fedhier.secure.secagg.SecAggServer` with ``aggregator.params(spec, rnd)``: it
    receives public keys, ciphertexts, masked vectors (of which it keeps the running sum)
    and Shamir shares, never a reply.  A site that does not answer a step is left out of
    the later ones; its masked input, if sent, stays in the sum.

    Returns
    -------
    total : Message
        Field-wise sum (``spec``) of the replies of ``contributors``, to fixed-point
        precision (``len(contributors) * aggregator.precision / 2`` per entry).
    contributors : list of int
        U3, the sites whose masked input is in the sum.
    bytes_up, bytes_down : dict site -> int
        Bytes of the secure-sum messages each site sent, and received.
    dropped : dict site -> str
        Sites that did not answer a step: the step and the reason.
    gone : list of int
        Those of them that Flower reports unreachable or that missed the deadline.

    Raises
    ------
    RoundFailed
        Fewer than ``aggregator.threshold`` sites remained at some step, or a message broke
        the protocol; no sum is released.
    """
    from ..secure.secagg import InsufficientSitesError, SecAggProtocolError, SecAggServer, to_site

    server = SecAggServer(aggregator.params(spec, rnd))
    site_of_node = {n: s for s, n in nodes.items()}
    bytes_up, bytes_down = dict.fromkeys(nodes, 0), dict.fromkeys(nodes, 0)
    dropped: dict[int, str] = {}
    gone: list[int] = []

    def ask(step: str, payloads: Mapping[int, bytes]) -> dict[int, bytes]:
        """Send ``payloads[site]`` to each site for ``step``; return the answers ``{site: bytes}``."""
        contents = {}
        for s, data in payloads.items():
            bytes_down[s] += len(data)
            contents[nodes[s]] = RecordDict({_RECORD: ConfigRecord({"round": rnd, "payload": data})})
        messages, silent = _exchange(grid, contents, f"{MESSAGE_TYPE}.{step}", rnd, timeout, poll)
        answers = {}
        for node, msg in messages.items():
            s = site_of_node[node]
            name, status, payload = _read_reply(msg)
            if status == "ok" and name == names[s]:
                answers[s] = payload
                bytes_up[s] += len(payload)
            elif status == "gone":
                silent[node] = str(payload)
            else:
                dropped[s] = f"{step}: " + (str(payload).splitlines()[0] if status == "error" else f"unexpected reply from {name!r}")
        for node, reason in silent.items():
            dropped[site_of_node[node]] = f"{step}: {reason}"
            gone.append(site_of_node[node])
        return answers

    try:
        keys = ask("advertise_keys", dict.fromkeys(nodes, b""))
        key_list = server.collect_keys(keys)
        # on a sparse (SecAgg+) graph each site is sent its own neighbourhood's keys and signatures
        routed = server.route_shares(ask("share_keys", {s: to_site(key_list, s) for s in keys}))
        masked = ask("masked_input", routed)
        survivors = server.collect_masked(masked)
        signed = ask("sign_survivors", dict.fromkeys(masked, survivors))
        signatures = server.collect_signatures(signed)
        total = server.unmask(ask("unmask", {s: to_site(signatures, s) for s in signed}))
    except (InsufficientSitesError, SecAggProtocolError) as exc:
        detail = "; ".join(f"site {s} ({names[s]}): {m}" for s, m in sorted(dropped.items()))
        raise RoundFailed(rnd, f"secure aggregation failed: {exc}" + (f" ({detail})" if detail else "")) from exc
    return spec.unflatten(total), list(server.survivors), bytes_up, bytes_down, dropped, gone


def _registered_names(grid: Grid) -> dict[int, str]:
    """Node id -> the name its key was registered under (node authentication), for nodes that have one."""
    get_nodes = getattr(grid, "get_nodes", None)
    if get_nodes is None:
        return {}
    try:
        return {int(info.node_id): str(info.name) for info in get_nodes() if getattr(info, "name", "")}
    except Exception as exc:  # an older SuperLink without node details: names are then not cross-checked
        log.info("node details unavailable (%s): site names are not cross-checked with registered names", exc)
        return {}


def _claim(result: FlowerFitResult, sites: Sequence[str], registered: Mapping[int, str], node: int, name: str | None,
           payload: Any, rnd: int) -> int | None:
    """Record that ``node`` is site ``name``; its site index, or None when the node is ignored."""
    if name not in sites:
        result.ignored[node] = f"site {name!r} is not in the fit's site list" if name else str(payload).splitlines()[0]
        return None
    if node in registered and registered[node] != name:
        result.ignored[node] = f"registered as {registered[node]!r} but claims site {name!r}"
        return None
    index = sites.index(name)
    if index in result.nodes:
        raise RoundFailed(rnd, f"SuperNodes {result.nodes[index]} and {node} both claim site {name!r}")
    result.nodes[index] = node
    return index


def _identify(grid: Grid, nodes: Sequence[int], sites: Sequence[str], registered: Mapping[int, str], timeout: float,
              poll: float, result: FlowerFitResult) -> None:
    """Ask every connected SuperNode its site name (a ``query`` message) and fill ``result.nodes`` / ``ignored``.

    The question needs only a started ClientApp, so :func:`run_rounds` gives it ``min(round_timeout, START_WINDOW)``
    seconds (``timeout``): a node silent through Flower's whole start window has a ClientApp that Flower refused,
    and is named as such.
    """
    window = timeout
    contents = {n: RecordDict({_RECORD: ConfigRecord({"round": 0})}) for n in nodes}
    messages, silent = _exchange(grid, contents, HELLO_TYPE, 0, window, poll)
    for node, msg in messages.items():
        name, status, payload = _read_reply(msg)
        if status == "ok":
            _claim(result, sites, registered, node, name, payload, 1)
        else:
            result.ignored[node] = str(payload).splitlines()[0] if str(payload) else status
    if window >= START_WINDOW:
        silent = dict.fromkeys(silent, f"its ClientApp did not start within Flower's heartbeat window ({window:g} s): "
                                       + _OVERLOADED)
    result.ignored.update(silent)


def _causes(failed: Mapping[int, str], sites: Sequence[str], ignored: Mapping[int, str]) -> str:
    """The reasons of a failed round on one line, each reason once with the sites (or SuperNodes) it concerns."""
    by_reason: dict[str, list[str]] = {}
    for s, reason in sorted(failed.items()):
        by_reason.setdefault(reason, []).append(f"site {s} ({sites[s]})")
    for node, reason in ignored.items():
        by_reason.setdefault(reason, []).append(f"SuperNode {node}")
    return "; ".join(f"{', '.join(who)}: {reason}" for reason, who in by_reason.items())


def run_rounds(
    grid: Grid,
    protocol: RoundProtocol,
    sites: Sequence[str],
    *,
    n_rounds: int,
    seed: int | None = None,
    min_sites: int = 1,
    round_timeout: float = 600.0,
    connect_timeout: float = 300.0,
    poll_interval: float = 0.2,
    aggregator: Any = None,
    callbacks: Sequence[Callable[[RoundRecord, Message], None]] = (),
    stop: Callable[[RoundRecord, Message], bool] | None = None,
    start: tuple[int, Message, Sequence[RoundRecord]] | None = None,
) -> FlowerFitResult:
    """Run ``n_rounds`` rounds of ``protocol`` over the SuperNodes connected to ``grid``.

    The server half of :func:`fedhier.runtime.simulate` over the network (see the module
    docstring for the dropout rules).  Before round 1 the server waits up to
    ``connect_timeout`` seconds for one SuperNode per listed site, then asks every node its
    site name (a ``query`` message) and gives it Flower's start window,
    ``min(round_timeout, START_WINDOW)`` seconds, to answer: a node whose ClientApp Flower
    refused stops the fit there, with the cause, when fewer than ``min_sites`` sites
    answered (a resumed fit gives them ``round_timeout``: a SuperNode may still be on the
    interrupted run's last message).  When ``protocol.broadcast_is_common`` is False each round sends each site
    only its part of the broadcast.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    protocol : RoundProtocol
        Must be the protocol the sites build from the same configuration.
    sites : sequence of str
        Site names in site-index order.
    n_rounds, seed, min_sites, round_timeout, connect_timeout, poll_interval
        See :class:`Deployment`.
    aggregator : SecureAggregator, optional
        Secure summation (``Deployment.aggregator()``): each site keeps its reply and the
        round goes on with the four exchanges of :func:`_secure_sum`; the global step gets
        their sum, as :func:`fedhier.runtime.simulate` with ``aggregation="secure"``.
        ``round_timeout`` then bounds each of the five exchanges of a round.  None: the
        replies are summed in the clear.
    callbacks : sequence of callables ``(record, broadcast) -> None`` run after each round.
    stop : callable ``(record, broadcast) -> bool``, optional
        Called after the callbacks; True ends the fit after this round, as in
        :func:`fedhier.runtime.simulate`.
    start : (round, broadcast, history), optional
        Resume after ``round`` from its ``broadcast`` and the records of the rounds run so
        far (a coordinator checkpoint, :func:`coordinate`); the sites are identified again.

    Returns
    -------
    FlowerFitResult

    Raises
    ------
    RoundFailed
        Fewer than ``min_sites`` SuperNodes connected, answered before round 1 or replied in a round, two
        SuperNodes claim the same site, or the secure sum of a round failed (fewer than
        ``aggregator.threshold`` sites remained at one of its steps).
    ValueError
        Bad arguments.
    """
    sites = list(sites)
    if not 1 <= min_sites <= len(sites):
        raise ValueError(f"min_sites must be between 1 and the number of sites ({len(sites)}), got {min_sites}")
    if aggregator is not None and (protocol.combine != "sum" or aggregator.n_sites != len(sites)):
        raise ValueError(
            f"secure aggregation needs a protocol that sums its replies (protocol {protocol.name!r} combines by "
            f"{protocol.combine!r}) and an aggregator for the {len(sites)} sites (it has {aggregator.n_sites})"
        )
    if int(n_rounds) != n_rounds or n_rounds < 1:
        raise ValueError(f"n_rounds must be a positive integer, got {n_rounds!r}")
    seed = int(np.random.SeedSequence().entropy % (2**63)) if seed is None else int(seed)
    per_site = not protocol.broadcast_is_common
    first, broadcast, history = (0, protocol.initial_broadcast(), []) if start is None else start
    broadcast = protocol.broadcast_spec.validate(broadcast)

    connected = _wait_for_nodes(grid, len(sites), connect_timeout, poll_interval)
    if len(connected) < min_sites:
        raise RoundFailed(1, f"{len(connected)} SuperNode(s) connected within {connect_timeout:g} s, at least {min_sites} needed")
    log.info("round loop: %d SuperNode(s) connected for %d listed site(s)", len(connected), len(sites))

    result = FlowerFitResult(broadcast=broadcast, history=list(history), seed=seed)
    registered = _registered_names(grid)
    # a resumed fit's SuperNodes may still be on the interrupted run's last message: they get round_timeout
    _identify(grid, connected, sites, registered, round_timeout if start is not None else min(round_timeout, START_WINDOW),
              poll_interval, result)
    if len(result.nodes) < min_sites:
        detail = _causes({}, sites, result.ignored)
        raise RoundFailed(int(first) + 1, f"{len(result.nodes)} site(s) answered before the round, at least {min_sites} "
                                          "needed" + (f" ({detail})" if detail else ""))
    for rnd in range(int(first) + 1, n_rounds + 1):
        t0 = time.perf_counter()
        targets = {n: s for s, n in sorted(result.nodes.items()) if s not in result.lost}
        common = None if per_site else encode(protocol.broadcast_spec, broadcast)
        down = {n: common if common is not None else encode_site_broadcast(protocol, broadcast, s) for n, s in targets.items()}
        contents = {n: RecordDict({_RECORD: ConfigRecord({"round": rnd, "broadcast": down[n]})}) for n in targets}
        messages, silent = _exchange(grid, contents, MESSAGE_TYPE, rnd, round_timeout, poll_interval)

        site_of_node = {n: s for s, n in result.nodes.items()}
        replies: dict[int, Message] = {}  # plain: the replies
        held: list[int] = []  # secure: the sites that keep a reply for the secure sum
        failed: dict[int, str] = {}
        bytes_up: dict[int, int] = {}
        for node, msg in messages.items():
            _, status, payload = _read_reply(msg)
            index = site_of_node[node]
            if status == "gone":
                silent[node] = str(payload)
                continue
            if status == "ok" and aggregator is None:
                try:
                    replies[index] = decode(protocol.reply_spec, payload)
                    bytes_up[index] = len(payload)
                except ValueError as exc:
                    failed[index] = f"malformed reply: {exc}"
            elif status == "held" and aggregator is not None:
                held.append(index)
            elif status in ("ok", "held"):
                failed[index] = _UNEXPECTED[status]
            else:
                failed[index] = str(payload).splitlines()[0] if str(payload) else "error"
        for node, reason in silent.items():
            failed[site_of_node[node]] = reason
            result.lost[site_of_node[node]] = rnd
        ready = sorted([*replies, *held])
        absent = [s for s in range(len(sites)) if s not in ready and s not in failed]
        if len(ready) < min_sites:
            detail = _causes(failed, sites, result.ignored)
            raise RoundFailed(rnd, f"{len(ready)} site(s) replied, at least {min_sites} needed" + (f" ({detail})" if detail else ""))

        bytes_down = {site_of_node[n]: len(down[n]) for n in targets if n in site_of_node}
        if aggregator is None:
            # sites in index order, as simulate() sums them: the float sums are then identical
            replies = {s: replies[s] for s in sorted(replies)}
            broadcast, metrics, contributors, _ = server_update(protocol, replies, rnd, broadcast, seed=seed)
        else:
            # every site of the exchange was identified by its reply above
            total, contributors, bytes_up, secure_down, dropped, gone = _secure_sum(
                grid, aggregator, protocol.reply_spec, rnd, {s: result.nodes[s] for s in held}, sites, round_timeout, poll_interval
            )
            for s, n in secure_down.items():
                bytes_down[s] += n
            for s, reason in dropped.items():
                if s in contributors:
                    log.warning("round %d: site %d (%s) left the secure sum after its masked input: %s", rnd, s, sites[s], reason)
                else:
                    failed[s] = f"secure sum, step {reason}"
            result.lost.update({s: rnd for s in gone})
            broadcast, metrics = global_update(protocol, total, rnd, broadcast)
        record = RoundRecord(
            round=rnd,
            sites=sorted(contributors),
            absent=absent,
            failed=failed,
            bytes_up=bytes_up,
            bytes_down=bytes_down,
            metrics=metrics,
            seconds=time.perf_counter() - t0,
        )
        result.history.append(record)
        result.broadcast = broadcast
        for index, reason in sorted(failed.items()):
            log.warning("round %d: site %d (%s) dropped: %s", rnd, index, sites[index], reason)
        for cb in callbacks:
            cb(record, broadcast)
        if stop is not None and stop(record, broadcast):
            result.converged = True
            break
    return result


# --------------------------------------------------------------------------- the site half


class NodeConfigError(SiteError):
    """A SuperNode started without a setting the ClientApp needs (its text names the setting, never data)."""


def site_round(deployment: Deployment, site: str, data_path: str | Path, request: Mapping[str, Any],
               state: Mapping[str, np.ndarray], site_seed: int | None = None, guard: "SiteGuard | None" = None):
    """One site's answer to a round request (what the ClientApp does, without Flower).

    Parameters
    ----------
    deployment : Deployment
    site : str
        This site's name (``node_config["site"]``).
    data_path : path
        This site's file (``node_config["data"]``), read by ``deployment.load_site``.
    request : mapping with ``round`` (int), ``broadcast`` (bytes: this site's part of the broadcast)
    state : dict of arrays kept by the site between rounds
    site_seed : int or None
        The site's own secret seed (``node_config["seed"]``); None: the operating
        system's entropy.  Nothing in ``request`` seeds the site.
    guard : SiteGuard or None
        The site's own policy (``node_config["policy"]``) for this run: in round 1 the
        analysis is admitted or refused before the site reads its file; every release is
        recorded in the site's ledger; after its last round the unspent reservation is given back
        (a run that stops early keeps its whole plan reserved).

    Returns
    -------
    (reply fields, new state): the reply has ``site``, ``status`` ("ok"/"error") and
    ``reply`` (our encoded message) or ``error`` (one line, :func:`failure_report`).
    """
    if site not in deployment.sites:
        return {"site": site, "status": "error", "error": f"site {site!r} is not in the fit's site list {list(deployment.sites)}"}, state
    index = deployment.sites.index(site)
    protocol, rnd = deployment.protocol(), int(request["round"])
    try:
        if guard is not None and rnd == 1:  # before the site reads its data
            guard.admit(protocol, deployment.n_rounds, deployment.aggregator() is not None)
        elif guard is not None:
            guard.check_admitted()
        data = deployment.load_site(site, data_path)
        protocol.validate_site_data(index, data)
    except Exception as exc:  # the coordinator learns the category (and a SiteError's place), the site's log the rest
        site_log.warning("site %s: its data could not be used: %s: %s", site, type(exc).__name__, exc)
        return {"site": site, "status": "error", "error": failure_report(exc)}, state
    status, payload, new_state = run_site_step(
        protocol, data, index, rnd, site_seed, bytes(request["broadcast"]), dict(state), guard
    )
    if guard is not None and rnd >= deployment.n_rounds:  # the plan's last round: give back what was not spent
        guard.finish()
    if status == "ok":
        return {"site": site, "status": "ok", "reply": payload}, new_state
    return {"site": site, "status": "error", "error": str(payload).splitlines()[0]}, state


def secure_site_step(deployment: Deployment, site: str, step: str, request: Mapping[str, Any], kept: Mapping[str, Any] | None,
                     *, signing_key: Any, roster: Mapping[str, Any], answered: set[bytes] | None = None):
    """One site's answer to the secure-sum request ``step`` of a round (what the ClientApp does, without Flower).

    Parameters
    ----------
    deployment : Deployment
        A fit with secure summation (``deployment.aggregator()`` not None).
    site : str
        This site's name.
    step : one of :data:`SECURE_STEPS`
    request : mapping with ``round`` (int) and, after ``advertise_keys``, ``payload``
        (the server's bytes of the previous step: key list, routed shares, survivor list, signatures).
    kept : mapping or None
        What the site keeps for this round and never sends: ``round``, ``reply`` (its
        encoded reply, from the site step), ``spec`` (the reply's declaration; without it
        ``deployment.reply_spec()`` is built) and, from ``advertise_keys`` on, ``secagg``
        (its secrets, :meth:`fedhier.secure.secagg.SecAggSite.to_state`); ``context`` (what
        the reply answers: a digest of the run, the reply kind and the broadcast).
    signing_key : private key
        The site's long-term key (:func:`fedhier.secure.keys.load_signing_key`).
    roster : mapping site name -> public key
        The roster the operators agreed on (:class:`fedhier.secure.keys.Roster`); it must
        hold every site of the fit, and the threshold must be more than half of its sites.
    answered : set of bytes, optional
        The contexts this site has already answered; ``masked_input`` adds to it, and refuses
        a context already in it.

    Returns
    -------
    (reply fields, what to keep or None): the reply has ``site``, ``status`` ("ok" /
    "error") and ``reply`` (this step's encoded message) or ``error`` (one line).  The
    site's input to ``masked_input`` is ``reply_spec.flatten(reply)``.  A failed step and
    the last step erase what the site kept: it never answers a step of a round twice.
    """
    from ..secure.secagg import InsufficientSitesError, SecAggProtocolError, SecAggSite

    rnd = int(request["round"])
    try:
        if kept is None or int(kept["round"]) != rnd:
            raise SecAggProtocolError(f"site {site!r} holds no reply for round {rnd}")
        if step == "advertise_keys" and "secagg" in kept:
            raise SecAggProtocolError(f"site {site!r} already advertised its keys for round {rnd}")
        # the reply's declaration, kept by the site's round step: the secure steps then need not import the model
        spec = _spec_from_text(str(kept["spec"])) if "spec" in kept else deployment.reply_spec()
        params = deployment.aggregator().params(spec, rnd)
        missing = [name for name in deployment.sites if name not in roster]
        if missing:
            raise SecAggProtocolError(f"site {site!r}: the roster has no key for sites {missing} of the fit")
        if 2 * params.threshold <= len(roster):
            # the coordinator chooses which sites of the roster a fit lists: t is measured against the roster
            raise SecAggProtocolError(f"site {site!r}: the fit's threshold t = {params.threshold} is not more than half "
                                      f"of the {len(roster)} sites of the roster; this site refuses the secure sum")
        identity = dict(signing_key=signing_key, roster={k: roster[name] for k, name in enumerate(deployment.sites)},
                        journal=answered, context=None if answered is None else bytes(kept["context"]))
        if step == "advertise_keys":
            secagg = SecAggSite(deployment.sites.index(site), params, **identity)
            message = secagg.advertise_keys()
        else:
            secagg = SecAggSite.from_state(params, bytes(kept["secagg"]), **identity)
            payload = bytes(request["payload"])
            if step == "share_keys":
                message = secagg.share_keys(payload)
            elif step == "masked_input":
                message = secagg.masked_input(spec.flatten(decode(spec, bytes(kept["reply"]))), payload)
            elif step == "sign_survivors":
                message = secagg.sign_survivors(payload)
            else:
                message = secagg.unmask(payload)
    except (KeyError, ValueError, OverflowError, InsufficientSitesError) as exc:
        site_log.warning("site %s, round %d, secure sum step %s failed: %s: %s", site, rnd, step, type(exc).__name__, exc)
        return {"site": site, "status": "error", "error": failure_report(exc)}, None
    fields = {"site": site, "status": "ok", "reply": message}
    return fields, None if step == SECURE_STEPS[-1] else {**kept, "secagg": secagg.to_state()}


def _spec_text(spec: MessageSpec) -> str:
    """A reply's declaration as text (kept by a site between the steps of a secure round)."""
    return json.dumps([spec.name, [[k, list(f.shape), f.dtype, f.optional] for k, f in spec.fields.items()]])


def _spec_from_text(text: str) -> MessageSpec:
    name, fields = json.loads(text)
    return MessageSpec(name, {k: Field(tuple(shape), dtype, optional) for k, shape, dtype, optional in fields})


# --------------------------------------------------------------------------- Flower apps

#: ``resolve(run_config_json) -> Deployment``: how an app turns the run config into the fit (the estimator layer's).
Resolver = Callable[[str], Deployment]


def _node_setting(context: Context, key: str) -> str:
    value = context.node_config.get(key)
    if not isinstance(value, str) or not value:
        raise NodeConfigError(f"SuperNode {context.node_id}: node_config has no {key!r}; start it with --node-config '{key}=\"...\"'")
    return value


def _site_seed(context: Context) -> int | None:
    """The site's own secret seed from its SuperNode's ``node_config`` (``seed="..."``), or None."""
    value = context.node_config.get("seed")
    if value is None or value == "":
        return None
    text = str(value)
    if not text.isdigit():
        raise NodeConfigError(f"SuperNode {context.node_id}: node_config 'seed' must be a non-negative integer")
    return int(text)


def _site_guard(context: Context) -> "SiteGuard | None":
    """The site's own policy from its SuperNode's ``node_config`` (``policy="<file>"``), for this run; or None."""
    value = context.node_config.get("policy")
    if value is None or value == "":
        return None
    from ..privacy.policy import SitePolicy  # only a site with a policy loads the accountant
    from .guard import SiteGuard

    return SiteGuard(SitePolicy.read(str(value)), analysis=f"flower-run-{context.run_id}")


def _reply(msg: FlowerMessage, fields: Mapping[str, Any]) -> FlowerMessage:
    return FlowerMessage(RecordDict({_RECORD: ConfigRecord(dict(fields))}), reply_to=msg)


def _setup_failure(context: Context, exc: Exception) -> dict[str, Any]:
    site_log.warning("SuperNode %s: the fit could not be set up: %s: %s", context.node_id, type(exc).__name__, exc)
    return {"site": str(context.node_config.get("site", "")), "status": "error", "error": failure_report(exc)}


def make_client_app(resolve: Resolver) -> ClientApp:
    """The Flower ``ClientApp`` of a site: answers "which site?", round requests and secure-sum steps.

    ``resolve`` turns the run config's fit (JSON, key :data:`RUN_CONFIG_KEY`) into the
    :class:`Deployment`; it is called only by the handlers that need the fit.
    """
    app = ClientApp()

    @app.query()
    def _hello(msg: FlowerMessage, context: Context) -> FlowerMessage:
        """The site's name, from its SuperNode's ``node_config`` (public: it is in the fit's site list)."""
        try:
            site = _node_setting(context, "site")
        except NodeConfigError as exc:
            return _reply(msg, _setup_failure(context, exc))
        return _reply(msg, {"site": site, "status": "ok", "reply": b""})

    @app.train()
    def _site_message(msg: FlowerMessage, context: Context) -> FlowerMessage:
        """Decode the request, run the site step, reply with our bytes.

        In a secure fit the reply stays in ``context.state`` for the secure sum that follows
        and the server is only told that it is ready (status "held").
        """
        try:
            deployment = resolve(str(context.run_config[RUN_CONFIG_KEY]))
            site, path = _node_setting(context, "site"), _node_setting(context, "data")
            site_seed = _site_seed(context)
            guard = _site_guard(context)
        except (KeyError, ValueError, TypeError) as exc:
            return _reply(msg, _setup_failure(context, exc))
        kept = context.state.config_records.get(_STATE)
        state = decode_state(kept["state"]) if kept is not None and "state" in kept else {}
        request = msg.content.config_records[_RECORD]
        fields, new_state = site_round(deployment, site, path, request, state, site_seed, guard)
        encoded = encode_state(new_state)
        if encoded is not None:
            context.state[_STATE] = ConfigRecord({"state": encoded})
        if deployment.aggregator() is not None:
            context.state.pop(_SECURE, None)
            if fields["status"] == "ok":
                spec = deployment.reply_spec()
                answers = hashlib.sha256(f"flower-run-{context.run_id}\0{spec.name}\0".encode() + bytes(request["broadcast"]))
                context.state[_SECURE] = ConfigRecord({"round": int(request["round"]), "reply": fields["reply"],
                                                       "spec": _spec_text(spec), "context": answers.digest()})
                fields = {"site": site, "status": "held"}
        return _reply(msg, fields)

    def secure_message(step: str) -> Callable[[FlowerMessage, Context], FlowerMessage]:
        """ClientApp entry of the secure-sum step ``step`` (message type ``train.<step>``)."""

        def handle(msg: FlowerMessage, context: Context) -> FlowerMessage:
            from ..secure.keys import Roster, load_signing_key

            try:
                deployment = resolve(str(context.run_config[RUN_CONFIG_KEY]))
                site = _node_setting(context, "site")
                # the site's own key and the operators' roster: from this SuperNode's config, never from the coordinator
                signing_key = load_signing_key(_node_setting(context, "site-key"))
                roster = Roster.read(_node_setting(context, "roster"))
            except (KeyError, ValueError, TypeError, OSError) as exc:
                return _reply(msg, _setup_failure(context, exc))
            kept = context.state.config_records.get(_SECURE)
            record = context.state.config_records.get(_ANSWERED)
            digests = bytes(record["digests"]) if record is not None else b""
            answered = {digests[i : i + 32] for i in range(0, len(digests), 32)}
            fields, keep = secure_site_step(deployment, site, step, msg.content.config_records[_RECORD], kept,
                                            signing_key=signing_key, roster=roster, answered=answered)
            context.state[_ANSWERED] = ConfigRecord({"digests": b"".join(sorted(answered))})
            if keep is None:
                context.state.pop(_SECURE, None)
            else:
                context.state[_SECURE] = ConfigRecord(keep)
            return _reply(msg, fields)

        return handle

    for step in SECURE_STEPS:
        app.train(step)(secure_message(step))
    return app


def make_server_app(resolve: Resolver) -> ServerApp:
    """The Flower ``ServerApp``: :func:`coordinate` the fit of the run config (``resolve`` as :func:`make_client_app`)."""
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        resume = str(context.run_config.get(RESUME_KEY, "")) == "yes"
        coordinate(grid, resolve(str(context.run_config[RUN_CONFIG_KEY])), resume=resume)

    return app


def coordinate(grid: Grid, deployment: Deployment, *, resume: bool = False) -> FlowerFitResult:
    """Run ``deployment``'s fit over ``grid`` and write its result folder (``deployment.out``).

    ``summary.json`` says "running" from the start, is rewritten after the fit and ends in
    "completed" or "failed" (with the error and, for a failed round, its number);
    ``history.json`` and the coordinator checkpoint (:data:`CHECKPOINT`: the broadcast, the
    seed and the history after the last round) are rewritten after every round.

    ``resume``: go on from the checkpoint of an interrupted run of the same fit (a SuperLink
    that was stopped or crashed): the rounds after it are those an uninterrupted fit runs,
    so with the sites' test seeds the result is the same.  Refused, with the reason, when
    there is no checkpoint, when it belongs to another fit (protocol settings, sites or
    seed), or when the sites keep state between rounds (``Deployment.sites_keep_state``:
    a SuperNode keeps it only within one Flower run).
    """
    from .checkpoint import Checkpoint, Fingerprint, write_checkpoint

    out = Path(deployment.out)
    sites = list(deployment.sites)
    protocol = deployment.protocol()
    write_json(out / "summary.json", {"status": "running", "model": deployment.model, "sites": sites})
    try:
        start = _resume_point(out / CHECKPOINT, deployment, protocol) if resume else None
        seed = deployment.seed if start is None else start[3]
        seed = int(np.random.SeedSequence().entropy % (2**63)) if seed is None else int(seed)
        fingerprint = Fingerprint(b"", tuple(sites), Fingerprint.of(protocol, []).config)
        history: list[RoundRecord] = [] if start is None else list(start[2])

        def progress(record: RoundRecord, broadcast: Message) -> None:
            history.append(record)
            _log_round(record, deployment.n_rounds, sites)
            rows = [r.to_dict() for r in history]
            # the checkpoint first: a round that history.json shows can always be resumed from, even when the
            # coordinator is killed between the two writes
            write_checkpoint(out / CHECKPOINT, Checkpoint(protocol.name, record.round, seed, broadcast, [{} for _ in sites], rows,
                                                          fingerprint, protocol.coordinator_state()))
            write_json(out / "history.json", rows)

        hooks = deployment.hooks(None if start is None else start[1])
        if start is not None and hooks.stop is not None and start[2] and hooks.stop(start[2][-1], start[1]):
            result = FlowerFitResult(broadcast=start[1], history=list(start[2]), seed=seed, converged=True)  # it had stopped
        else:
            result = run_rounds(
                grid,
                protocol,
                deployment.sites,
                n_rounds=deployment.n_rounds,
                seed=seed,
                min_sites=deployment.min_sites,
                round_timeout=deployment.round_timeout,
                connect_timeout=deployment.connect_timeout,
                poll_interval=deployment.poll_interval,
                aggregator=deployment.aggregator(),
                callbacks=[*hooks.callbacks, progress],
                stop=hooks.stop,
                start=None if start is None else start[:3],
            )
        write_result(out, deployment, result, hooks, resumed_after=None if start is None else start[0])
    except BaseException as exc:
        error = str(exc) if isinstance(exc, RoundFailed) else f"{type(exc).__name__}: {exc}"
        write_json(out / "summary.json", {"status": "failed", "model": deployment.model, "error": error,
                                          "round": getattr(exc, "round", None), "sites": sites})
        raise
    return result


def _log_round(record: RoundRecord, n_rounds: int, sites: Sequence[str]) -> None:
    """One line per round in the ServerApp's log, which Flower streams to ``flwr run --stream`` / ``flwr log``:
    the rounds can be followed where the result folder cannot be read."""
    from flwr.common import log as flower_log

    dropped = f", {len(record.failed)} dropped ({', '.join(sites[s] for s in sorted(record.failed))})" if record.failed else ""
    flower_log(logging.INFO, "fedhier: round %d of at most %d done in %.1f s: %d of %d site(s) replied%s",
               record.round, n_rounds, record.seconds, len(record.sites), len(sites), dropped)


def _resume_point(path: Path, deployment: Deployment, protocol: RoundProtocol):
    """(round, broadcast, history records, seed) of the coordinator checkpoint ``path``; ValueError saying why not."""
    from .checkpoint import Fingerprint, read_checkpoint

    if deployment.sites_keep_state:
        raise ValueError(f"a {deployment.model} fit cannot be resumed: its sites keep state between rounds, which a "
                         "SuperNode holds only within one run; start the fit again")
    if not path.is_file():
        raise ValueError(f"nothing to resume: {path} does not exist (run the fit without --resume)")
    saved = read_checkpoint(path, n_sites=len(deployment.sites))
    expected = Fingerprint.of(protocol, []).config
    if saved.protocol != protocol.name or saved.fingerprint is None or saved.fingerprint.config != expected:
        differ = sorted(k for k in set(expected) | set(saved.fingerprint.config if saved.fingerprint else {})
                        if saved.fingerprint is None or saved.fingerprint.config.get(k) != expected.get(k))
        raise ValueError(f"{path} was written by another fit ({', '.join(differ) or saved.protocol} differ); "
                         "resume with the fit.toml it was written with")
    if list(saved.fingerprint.sites) != list(deployment.sites):
        raise ValueError(f"{path} was written for the sites {list(saved.fingerprint.sites)}, not {list(deployment.sites)}")
    if deployment.seed is not None and saved.seed != deployment.seed:
        raise ValueError(f"{path} was written with seed {saved.seed}, not {deployment.seed}")
    if saved.round > deployment.n_rounds:
        raise ValueError(f"{path} is after round {saved.round}, beyond this fit's n_rounds={deployment.n_rounds}")
    history = [RoundRecord.from_dict(h) for h in saved.history]
    try:
        protocol.restore_coordinator_state(saved.coordinator)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return saved.round, protocol.broadcast_spec.validate(saved.broadcast), history, saved.seed


# --------------------------------------------------------------------------- result folder


def write_result(out: str | Path, deployment: Deployment, result: FlowerFitResult, hooks: FitHooks | None = None,
                 resumed_after: int | None = None) -> Path:
    """Write the result folder: ``broadcast.fhm`` (the final broadcast, encoded), ``history.json``,
    the family's model (``deployment.write_model``) and, last, ``summary.json`` (status "completed";
    ``rounds_run`` of at most ``n_rounds``; ``converged``: the stopping rule ended the fit;
    ``resumed_after``: the round of the checkpoint a resumed fit went on from)."""
    out = Path(out)
    protocol = deployment.protocol()
    atomic_write_bytes(out / "broadcast.fhm", encode(protocol.broadcast_spec, result.broadcast))
    write_json(out / "history.json", [r.to_dict() for r in result.history])
    extra = deployment.write_model(out, result, hooks or deployment.hooks())
    sites = deployment.sites
    write_json(
        out / "summary.json",
        {
            "status": "completed",
            "model": deployment.model,
            "sites": list(sites),
            "nodes": {sites[s]: str(n) for s, n in sorted(result.nodes.items())},
            "lost": {sites[s]: r for s, r in sorted(result.lost.items())},
            "ignored_nodes": {str(n): why for n, why in result.ignored.items()},
            "seed": result.seed,
            "n_rounds": deployment.n_rounds,
            "rounds_run": len(result.history),
            "converged": result.converged,
            "final_metrics": result.history[-1].metrics if result.history else {},
            "bytes_up": int(sum(sum(r.bytes_up.values()) for r in result.history)),
            "bytes_down": int(sum(sum(r.bytes_down.values()) for r in result.history)),
            **({} if resumed_after is None else {"resumed_after_round": resumed_after}),
            **extra,
        },
    )
    return out


def read_result(out: str | Path, deployment: Deployment) -> tuple[Message, list[dict[str, Any]], dict[str, Any]]:
    """(final broadcast, history rows, summary) of a result folder written by :func:`write_result`."""
    out = Path(out)
    summary = json.loads((out / "summary.json").read_text())
    if summary.get("status") != "completed":
        raise RuntimeError(f"{out}: the fit did not complete: {summary.get('error', summary.get('status'))}")
    broadcast = decode(deployment.protocol().broadcast_spec, (out / "broadcast.fhm").read_bytes())
    history = json.loads((out / "history.json").read_text())
    return broadcast, history, summary
