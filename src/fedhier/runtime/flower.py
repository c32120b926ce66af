"""Flower runtime: run a fedhier round protocol on real machines (ARCHITECTURE "Runtimes").

One SuperLink (the coordinator) and one SuperNode per site, talking gRPC/HTTP over
Flower's Message API.  Flower only carries bytes; the round itself is ours:

* the :data:`server_app` (a Flower ``ServerApp``) runs :func:`run_rounds`, our own round
  loop over ``Grid.push_messages`` / ``Grid.pull_messages`` -- not Flower's strategies;
* the :data:`client_app` (a Flower ``ClientApp``) runs the site half of a round on the
  site's own file, whose path comes from the SuperNode's ``node_config`` (``data``), with
  the site's name in ``site``;
* every message crossing the network is a declared fedhier message serialised by
  :func:`fedhier.protocol.messages.encode` and carried as a ``bytes`` value of a Flower
  ``ConfigRecord`` -- never a pickle;
* the site step is :func:`fedhier.runtime.simulate.run_site_step` and the server step is
  :func:`fedhier.runtime.simulate.server_update`;
* a site's secrets (DP noise, its random start, secure-sum keys) come from its own
  entropy: the coordinator's request carries no seed.  A SuperNode started with a secret
  seed of its own (``node_config`` ``seed="..."``, ``fedhier flower site --seed``) draws
  what :func:`fedhier.runtime.simulate` draws with ``random_state`` equal to that seed,
  so a Flower fit whose sites are all given the simulation's seed equals it bit for bit
  (tests and reproductions only: a seed shared by the sites is no secret among them).

Robustness (issue 6, "Robustness"):

* every round has a deadline (``round_timeout``); the server never waits longer;
* a site whose step raises is dropped from that round (its error is recorded) and asked
  again in the next round;
* a site that does not answer before the deadline, or that Flower reports unreachable
  (its SuperNode crashed or disconnected, the message expired), is dropped from that
  round and *lost*: it is not asked again in this fit, so one dead site costs one
  deadline, not one per round;
* a round with fewer than ``min_sites`` replies stops the fit with
  :class:`~fedhier.runtime.simulate.RoundFailed`; no partial global update is broadcast.

Secure summation (``aggregation = "secure"`` in ``fit.toml``, ``docs/flower.md``): a site
keeps its reply in the ClientApp's ``context.state`` and answers the round request with
"held"; the server then runs the four steps of Bonawitz et al.
(:mod:`fedhier.privacy.secagg`) as Flower messages ``train.advertise_keys``,
``train.share_keys``, ``train.masked_input`` and ``train.unmask`` (:func:`_secure_sum`), and
the global step gets the decoded sum, as :func:`fedhier.runtime.simulate` with
``aggregation="secure"``.  A site's secrets between two steps stay in its
``context.state`` as declared arrays; a round whose sum cannot be recovered (fewer than
the threshold of sites left) stops the fit with ``RoundFailed``.

Site indices: the fit configuration lists the site names; site ``s`` is the ``s``-th name
(0-based).  A SuperNode whose ``site`` is not in
the list is ignored (and reported); two SuperNodes claiming the same site stop the fit.
"""

from __future__ import annotations

import json
import logging
import math
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..privacy.secagg import InsufficientSitesError, SecAggProtocolError, SecAggServer, SecAggSite
from ..privacy.secure_round import SecureAggregator
from ..protocol.base import RoundProtocol
from ..protocol.messages import Message, MessageSpec, decode, encode
from ..utils.io import atomic_write_bytes, write_json
from ..privacy.policy import SitePolicy
from ..utils.untrusted import check_site_name
from .guard import SiteGuard
from .simulate import (RoundFailed, RoundRecord, decode_state, encode_state, failure_report, global_update, run_site_step,
                       server_update, site_log)

try:
    from flwr.app import ConfigRecord, Context, Message as FlowerMessage, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.common.constant import ErrorCode
    from flwr.serverapp import Grid, ServerApp
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("the Flower runtime needs the optional extra: pip install 'fedhier[flower]'") from exc

__all__ = [
    "FlowerFitConfig",
    "FlowerFitResult",
    "run_rounds",
    "load_site",
    "site_round",
    "secure_site_step",
    "server_app",
    "client_app",
    "write_result",
    "read_result",
    "MESSAGE_TYPE",
    "RUN_CONFIG_KEY",
    "SECURE_STEPS",
]

log = logging.getLogger(__name__)

#: Flower message type of a round (a ClientApp "train" action).
MESSAGE_TYPE = "train"
#: run-config key holding the fit configuration (JSON) in the Flower app.
RUN_CONFIG_KEY = "fedhier-fit"
_RECORD = "fedhier"
#: Flower error codes meaning that the SuperNode or the message cannot be reached.
_UNREACHABLE = frozenset({ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.NODE_UNAVAILABLE})
_STATE = "fedhier-state"
#: ``context.state`` record of a site in a secure round: its reply and its secure-sum secrets (never sent).
_SECURE = "fedhier-secure"
#: The secure-sum steps of a round, in order; each is the ClientApp action ``train.<step>``.
SECURE_STEPS = ("advertise_keys", "share_keys", "masked_input", "unmask")

_ALLOWED_KEYS = {
    "n_components", "n_rounds", "n_local_iter", "n_first_iter", "tol", "init", "local_tol", "seed", "ig_solver", "sigma2_prior",
    "views", "flower",
    "epsilon", "delta", "aggregation", "secure",
}
_FLOWER_KEYS = {"sites", "min_sites", "round_timeout", "connect_timeout", "poll_interval", "out"}
_SECURE_KEYS = {"threshold", "frac_bits"}


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class FlowerFitConfig:
    """A Fed-mv-PPCA fit over Flower, as written in ``fit.toml`` (see ``docs/flower.md``).

    Parameters
    ----------
    views : mapping view name -> tuple of column names
        View order and dimensions (the schema every site is checked against).
    sites : tuple of str
        Site names in site-index order; each SuperNode declares its name in its
        ``node_config`` (``site="..."``).
    n_components, n_rounds, n_local_iter, n_first_iter, tol, init, local_tol, ig_solver, sigma2_prior
        As :class:`fedhier.mvppca.FedMVPPCA` (``tol``: stop after the first round in
        which theta~ changed by less, spec §6 [R]).
    seed : int or None
        The coordinator's public seed (recorded in the result); None draws one.  It never
        reaches a site's secrets (see the module docstring).
    min_sites : int
        Fewest replies a round needs; fewer stop the fit.
    round_timeout : float
        Seconds the server waits for the replies of one round.
    connect_timeout : float
        Seconds the server waits, before round 1, for a SuperNode per listed site.
    poll_interval : float
        Seconds between two pulls of replies from the SuperLink.
    out : str
        Folder, on the machine that runs the ServerApp (the SuperLink host), that
        receives ``model.npz``, ``broadcast.fhm``, ``history.json`` and ``summary.json``.
    epsilon, delta : float
        Total client-level DP budget per site (``epsilon`` None = no DP).
    aggregation : "plain" or "secure"
        "secure": the server only learns the sum of the replies (Bonawitz et al. secure
        summation, ``docs/secure-aggregation.md``), with the ``[secure]`` settings:
    threshold : int or None
        Shamir threshold t (``[secure] threshold``); default ``len(sites) // 2 + 1``.
    frac_bits : int
        Fixed-point fractional bits (``[secure] frac_bits``), default 30.  Both as
        :class:`fedhier.privacy.secure_round.SecureAggregator`.
    """

    views: Mapping[str, tuple[str, ...]]
    sites: tuple[str, ...]
    n_components: int = 5
    n_rounds: int = 100
    n_local_iter: int = 15
    n_first_iter: int = 30
    tol: float | None = None
    init: str = "pca"
    local_tol: float | None = 1e-8
    seed: int | None = None
    ig_solver: str = "newton"
    sigma2_prior: str | None = "weak"
    min_sites: int = 1
    round_timeout: float = 600.0
    connect_timeout: float = 300.0
    poll_interval: float = 0.2
    out: str = "fedhier-flower-fit"
    epsilon: float | None = None
    delta: float = 1e-5
    aggregation: str = "plain"
    threshold: int | None = None
    frac_bits: int = 30

    def __post_init__(self) -> None:
        object.__setattr__(self, "views", {str(v): tuple(c) for v, c in dict(self.views).items()})
        object.__setattr__(self, "sites", tuple(self.sites))
        self._check()

    def _check(self) -> None:
        if not self.views:
            raise ValueError("fit configuration: [views] must map at least one view name to its columns")
        seen: dict[str, str] = {}
        for view, columns in self.views.items():
            if not columns or not all(isinstance(c, str) and c for c in columns):
                raise ValueError(f"fit configuration: view {view!r} must list its columns as non-empty strings")
            for c in columns:
                if c in seen:
                    raise ValueError(f"fit configuration: column {c!r} is in both view {seen[c]!r} and view {view!r}")
                seen[c] = view
        if not self.sites or not all(isinstance(s, str) and s for s in self.sites):
            raise ValueError("fit configuration: [flower] sites must list the site names (non-empty strings)")
        if len(set(self.sites)) != len(self.sites):
            raise ValueError(f"fit configuration: site names must be unique, got {list(self.sites)}")
        for site in self.sites:  # a site name names its SuperNode's files (keys, logs)
            check_site_name(site, "fit configuration: [flower] sites")
        for name in ("n_components", "n_rounds", "n_local_iter", "n_first_iter", "min_sites"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"fit configuration: {name} must be a positive integer, got {value!r}")
        if self.min_sites > len(self.sites):
            raise ValueError(f"fit configuration: min_sites={self.min_sites} exceeds the {len(self.sites)} listed sites")
        largest = max(len(c) for c in self.views.values())
        if self.n_components >= largest:
            raise ValueError(
                f"fit configuration: n_components={self.n_components} must be smaller than the largest view dimension ({largest})"
            )
        if self.tol is not None and (
            isinstance(self.tol, bool) or not isinstance(self.tol, (int, float)) or not 0 < self.tol < math.inf
        ):
            raise ValueError(f"fit configuration: tol must be a positive number, got {self.tol!r}")
        if self.local_tol is not None and (
            isinstance(self.local_tol, bool) or not isinstance(self.local_tol, (int, float)) or not 0 < self.local_tol < math.inf
        ):
            raise ValueError(f"fit configuration: local_tol must be a positive number, got {self.local_tol!r}")
        if self.init not in ("pca", "random"):
            raise ValueError(f"fit configuration: init must be 'pca' or 'random', got {self.init!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"fit configuration: seed must be a non-negative integer, got {self.seed!r}")
        if self.ig_solver not in ("newton", "fixed_point"):
            raise ValueError(f"fit configuration: ig_solver must be 'newton' or 'fixed_point', got {self.ig_solver!r}")
        if self.sigma2_prior not in ("weak", None):
            raise ValueError(f"fit configuration: sigma2_prior must be 'weak' or 'none', got {self.sigma2_prior!r}")
        for name in ("round_timeout", "connect_timeout", "poll_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"fit configuration: {name} must be a positive number of seconds, got {value!r}")
        if not isinstance(self.out, str) or not self.out:
            raise ValueError("fit configuration: out must be a folder name")
        if self.epsilon is not None and (isinstance(self.epsilon, bool) or not isinstance(self.epsilon, (int, float)) or not self.epsilon > 0):
            raise ValueError(f"fit configuration: epsilon must be a positive number, got {self.epsilon!r}")
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or not 0 < self.delta < 1:
            raise ValueError(f"fit configuration: delta must be in (0, 1), got {self.delta!r}")
        if self.aggregation not in ("plain", "secure"):
            raise ValueError(f"fit configuration: aggregation must be 'plain' or 'secure', got {self.aggregation!r}")
        for name, value in (("threshold", self.threshold), ("frac_bits", self.frac_bits)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"fit configuration: [secure] {name} must be an integer, got {value!r}")
        if self.aggregation == "secure":
            if len(self.sites) < 2:
                raise ValueError("fit configuration: aggregation = 'secure' needs at least 2 sites")
            try:
                self.aggregator()
            except ValueError as exc:
                raise ValueError(f"fit configuration: [secure] {exc}") from None

    # ------------------------------------------------------------------ reading / writing
    @classmethod
    def from_toml(cls, text: str, source: str = "fit.toml") -> "FlowerFitConfig":
        """Parse the TOML text of a fit configuration; ValueError naming ``source`` and the key."""
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{source}: invalid TOML: {exc}") from exc
        unknown = sorted(set(raw) - _ALLOWED_KEYS)
        if unknown:
            raise ValueError(f"{source}: unknown key(s) {unknown}; allowed: {sorted(_ALLOWED_KEYS)}")
        flower = raw.pop("flower", None)
        if not isinstance(flower, dict):
            raise ValueError(f"{source}: a [flower] table with the site names (sites = [...]) is required")
        unknown = sorted(set(flower) - _FLOWER_KEYS)
        if unknown:
            raise ValueError(f"{source}: unknown key(s) {unknown} in [flower]; allowed: {sorted(_FLOWER_KEYS)}")
        views = raw.pop("views", None)
        if not isinstance(views, dict) or not all(isinstance(c, list) for c in views.values()):
            raise ValueError(f"{source}: a [views] table mapping view names to column lists is required")
        secure = raw.pop("secure", {})
        if not isinstance(secure, dict):
            raise ValueError(f"{source}: secure must be a table ([secure] with threshold, frac_bits)")
        unknown = sorted(set(secure) - _SECURE_KEYS)
        if unknown:
            raise ValueError(f"{source}: unknown key(s) {unknown} in [secure]; allowed: {sorted(_SECURE_KEYS)}")
        if secure and raw.get("aggregation") != "secure":
            raise ValueError(f"{source}: a [secure] table needs aggregation = \"secure\"")
        for key in ("sigma2_prior", "local_tol"):  # TOML has no null
            if raw.get(key) == "none":
                raw[key] = None
        try:
            return cls(views=views, **raw, **flower, **secure)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None

    @classmethod
    def read(cls, path: str | Path) -> "FlowerFitConfig":
        """Read ``fit.toml``; a relative ``out`` is resolved against the file's folder."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"fit configuration {path} does not exist")
        config = cls.from_toml(path.read_text(), str(path))
        out = Path(config.out)
        if not out.is_absolute():
            config = config.replace(out=str((path.parent / out).resolve()))
        return config

    def replace(self, **changes: Any) -> "FlowerFitConfig":
        return type(self)(**{**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["views"] = {v: list(c) for v, c in self.views.items()}
        out["sites"] = list(self.sites)
        return out

    def to_json(self) -> str:
        """The form that travels in the Flower run config (key :data:`RUN_CONFIG_KEY`)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "FlowerFitConfig":
        return cls(**json.loads(text))

    # ------------------------------------------------------------------ the model
    def schema(self):
        from ..data.schema import ViewSchema

        return ViewSchema(tuple(self.views), tuple(len(c) for c in self.views.values()))

    def protocol(self) -> RoundProtocol:
        """The Fed-mv-PPCA round, built as :class:`fedhier.mvppca.FedMVPPCA` builds it."""
        from ..protocol.mvppca import MVPPCAProtocol

        return MVPPCAProtocol(
            self.schema(),
            self.n_components,
            n_local_iter=self.n_local_iter,
            n_first_iter=self.n_first_iter,
            init=self.init,
            local_tol=self.local_tol,
            ig_solver=self.ig_solver,
            sigma2_prior=self.sigma2_prior,
            privacy=self.privacy(),
            prior_update="paper",  # the EM update's spread fields are not yet wired into Flower deployments
        )

    def reply_spec(self) -> MessageSpec:
        """A site's declared reply, ``protocol().reply_spec``, without calibrating the DP noise (it does not depend on it)."""
        from ..protocol.mvppca import MVPPCAProtocol

        return MVPPCAProtocol(self.schema(), self.n_components, prior_update="paper").reply_spec

    def aggregator(self) -> SecureAggregator | None:
        """The :class:`~fedhier.privacy.secure_round.SecureAggregator` of a secure fit, else None.

        Built as :class:`fedhier.mvppca.FedMVPPCA` builds it for ``simulate()`` (one site per
        listed name), so both runtimes sum with the same fixed point and threshold.
        """
        if self.aggregation == "plain":
            return None
        return SecureAggregator(len(self.sites), threshold=self.threshold, frac_bits=self.frac_bits)

    def privacy(self):
        """The DP configuration of a fit with a total budget (``epsilon``, ``delta``), else None.

        Calibrated for ``n_rounds`` rounds of releases of every view, so each site's
        end-to-end epsilon is at most ``epsilon`` (client-level DP, docs/privacy.md).
        """
        if self.epsilon is None:
            return None
        from ..models.mvppca.dp import DPConfig

        return DPConfig.total(float(self.epsilon), float(self.delta), n_rounds=self.n_rounds, n_views=len(self.views))


def load_site(config: FlowerFitConfig, path: str | Path, site: str) -> dict[str, np.ndarray]:
    """Read and check one site's CSV file (columns named as in ``config.views``).

    Returns ``{view: (n, d_view) float64 array}`` in schema order, views the file lacks
    omitted.  Raises ValueError naming the site, view and problem.
    """
    from ..data.validation import check_sites
    from ..userdata import SiteDataError, read_site_table

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"site {site!r}: data file {path} does not exist")
    table = read_site_table(path, {v: list(c) for v, c in config.views.items()}, site)
    try:
        checked, _ = check_sites([table], schema=config.schema(), n_components=config.n_components, min_subjects=2,
                                 site_names=[site])
    except ValueError as exc:  # check_sites names sites, views, rows and columns, never values
        raise SiteDataError(str(exc)) from None
    return checked[0]


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
    """

    broadcast: Message
    history: list[RoundRecord]
    seed: int
    nodes: dict[int, int] = field(default_factory=dict)
    lost: dict[int, int] = field(default_factory=dict)
    ignored: dict[int, str] = field(default_factory=dict)


def _wait_for_nodes(grid: Grid, n_wanted: int, timeout: float, poll: float) -> list[int]:
    deadline = time.monotonic() + timeout
    nodes = sorted(grid.get_node_ids())
    while len(nodes) < n_wanted and time.monotonic() < deadline:
        time.sleep(max(poll, 1.0))
        nodes = sorted(grid.get_node_ids())
    return nodes


def _exchange(grid: Grid, contents: Mapping[int, RecordDict], message_type: str, round: int, timeout: float, poll: float):
    """Push one message per node and pull the replies until all came or the deadline passed.

    Returns ({node: reply Flower message}, {node: reason} for nodes without a reply).
    """
    nodes = list(contents)
    messages = [
        FlowerMessage(contents[n], dst_node_id=n, message_type=message_type, group_id=str(round), ttl=timeout)
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
    the message unreachable: the site disappeared).
    """
    if msg.has_error():
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
    aggregator: SecureAggregator,
    spec: MessageSpec,
    rnd: int,
    nodes: Mapping[int, int],
    names: Sequence[str],
    timeout: float,
    poll: float,
) -> tuple[Message, list[int], dict[int, int], dict[int, int], dict[int, str], list[int]]:
    """Secure sum of the ``spec`` replies that the sites ``nodes`` (site -> node) keep in round ``rnd``.

    The four steps of :mod:`fedhier.privacy.secagg` (advertise keys, share keys, masked
    input, unmask), each one Flower message of type ``train.<step>`` per site still taking
    part, carrying the bytes of the previous server step.  The server half is a
    :class:`~fedhier.privacy.secagg.SecAggServer` with ``aggregator.params(spec, rnd)``: it
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
        roster = server.collect_keys(keys)
        routed = server.route_shares(ask("share_keys", dict.fromkeys(keys, roster)))
        masked = ask("masked_input", routed)
        survivors = server.collect_masked(masked)
        total = server.unmask(ask("unmask", dict.fromkeys(masked, survivors)))
    except (InsufficientSitesError, SecAggProtocolError) as exc:
        detail = "; ".join(f"site {s} ({names[s]}): {m}" for s, m in sorted(dropped.items()))
        raise RoundFailed(rnd, f"secure aggregation failed: {exc}" + (f" ({detail})" if detail else "")) from exc
    return spec.unflatten(total), list(server.survivors), bytes_up, bytes_down, dropped, gone


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
    aggregator: SecureAggregator | None = None,
    callbacks: Sequence[Callable[[RoundRecord, Message], None]] = (),
    stop: Callable[[RoundRecord, Message], bool] | None = None,
) -> FlowerFitResult:
    """Run ``n_rounds`` rounds of ``protocol`` over the SuperNodes connected to ``grid``.

    The server half of :func:`fedhier.runtime.simulate` over the network (see the module
    docstring for the dropout rules).  Before round 1 the server waits up to
    ``connect_timeout`` seconds for one SuperNode per listed site.  Round 1 goes to every
    connected node; each reply names its site, which fixes the node of each site for the
    rest of the fit.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    protocol : RoundProtocol
        Must be the protocol the sites build from the same configuration.
    sites : sequence of str
        Site names in site-index order.
    n_rounds, seed, min_sites, round_timeout, connect_timeout, poll_interval
        See :class:`FlowerFitConfig`.
    aggregator : SecureAggregator, optional
        Secure summation (``FlowerFitConfig.aggregator()``): each site keeps its reply
        and the round goes on with the four exchanges of :func:`_secure_sum`; the global
        step gets their sum, as :func:`fedhier.runtime.simulate` with
        ``aggregation="secure"``.  ``round_timeout`` then bounds each of the five
        exchanges of a round.  None: the replies are summed in the clear.
    callbacks : sequence of callables ``(record, broadcast) -> None`` run after each round.
    stop : callable ``(record, broadcast) -> bool``, optional
        Called after the callbacks; True ends the fit after this round, as in
        :func:`fedhier.runtime.simulate`.

    Returns
    -------
    FlowerFitResult

    Raises
    ------
    RoundFailed
        Fewer than ``min_sites`` SuperNodes connected or replied in a round, two
        SuperNodes claim the same site, or the secure sum of a round failed (fewer than
        ``aggregator.threshold`` sites remained at one of its steps).
    ValueError
        Bad arguments, or a protocol that sends each site its own part of the broadcast
        (``protocol.broadcast_is_common`` False): before round 1 the server does not know
        which SuperNode is which site.
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
    if not protocol.broadcast_is_common:
        raise ValueError(
            f"protocol {protocol.name!r} sends each site its own part of the broadcast; this runtime learns which "
            "SuperNode is which site from the round-1 replies, so it sends one common broadcast: use simulate()"
        )
    broadcast = protocol.broadcast_spec.validate(protocol.initial_broadcast())

    connected = _wait_for_nodes(grid, len(sites), connect_timeout, poll_interval)
    if len(connected) < min_sites:
        raise RoundFailed(1, f"{len(connected)} SuperNode(s) connected within {connect_timeout:g} s, at least {min_sites} needed")
    log.info("round loop: %d SuperNode(s) connected for %d listed site(s)", len(connected), len(sites))

    result = FlowerFitResult(broadcast=broadcast, history=[], seed=seed)
    for rnd in range(1, n_rounds + 1):
        t0 = time.perf_counter()
        broadcast_bytes = encode(protocol.broadcast_spec, broadcast)
        targets = connected if rnd == 1 else [n for s, n in sorted(result.nodes.items()) if s not in result.lost]
        request = ConfigRecord({"round": rnd, "broadcast": broadcast_bytes})
        contents = {n: RecordDict({_RECORD: request}) for n in targets}
        messages, silent = _exchange(grid, contents, MESSAGE_TYPE, rnd, round_timeout, poll_interval)

        site_of_node = {n: s for s, n in result.nodes.items()}
        replies: dict[int, Message] = {}  # plain: the replies
        held: list[int] = []  # secure: the sites that keep a reply for the secure sum
        failed: dict[int, str] = {}
        bytes_up: dict[int, int] = {}
        for node, msg in messages.items():
            name, status, payload = _read_reply(msg)
            if rnd == 1:
                if name not in sites:
                    result.ignored[node] = f"site {name!r} is not in the fit's site list" if name else str(payload)
                    continue
                index = sites.index(name)
                if index in result.nodes:
                    raise RoundFailed(rnd, f"SuperNodes {result.nodes[index]} and {node} both claim site {name!r}")
                result.nodes[index] = node
                site_of_node[node] = index
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
            if node in site_of_node:
                index = site_of_node[node]
                failed[index] = reason
                result.lost[index] = rnd
            elif rnd == 1:
                result.ignored[node] = reason
        ready = sorted([*replies, *held])
        absent = [s for s in range(len(sites)) if s not in ready and s not in failed]
        if len(ready) < min_sites:
            detail = "; ".join(
                [f"site {s} ({sites[s]}): {m}" for s, m in sorted(failed.items())]
                + [f"SuperNode {n}: {m}" for n, m in result.ignored.items()]
            )
            raise RoundFailed(rnd, f"{len(ready)} site(s) replied, at least {min_sites} needed" + (f" ({detail})" if detail else ""))

        bytes_down = {site_of_node[n]: len(broadcast_bytes) for n in targets if n in site_of_node}
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
            break
    return result


# --------------------------------------------------------------------------- the site half


def site_round(config: FlowerFitConfig, site: str, data_path: str | Path, request: Mapping[str, Any],
               state: Mapping[str, np.ndarray], site_seed: int | None = None, guard: SiteGuard | None = None):
    """One site's answer to a round request (what the ClientApp does, without Flower).

    Parameters
    ----------
    config : FlowerFitConfig
    site : str
        This site's name (``node_config["site"]``).
    data_path : path
        This site's CSV file (``node_config["data"]``).
    request : mapping with ``round`` (int), ``broadcast`` (bytes)
    state : dict of arrays kept by the site between rounds
    site_seed : int or None
        The site's own secret seed (``node_config["seed"]``); None: the operating
        system's entropy.  Nothing in ``request`` seeds the site.
    guard : SiteGuard or None
        The site's own policy (``node_config["policy"]``) for this run: in round 1 the
        analysis is admitted or refused before the site reads its file; every release is
        recorded in the site's ledger.

    Returns
    -------
    (reply fields, new state): the reply has ``site``, ``status`` ("ok"/"error") and
    ``reply`` (our encoded message) or ``error`` (one line).
    """
    if site not in config.sites:
        return {"site": site, "status": "error", "error": f"site {site!r} is not in the fit's site list {list(config.sites)}"}, state
    index = config.sites.index(site)
    protocol, rnd = config.protocol(), int(request["round"])
    try:
        if guard is not None and rnd == 1:  # before the site reads its data
            guard.admit(protocol, config.n_rounds, config.aggregation == "secure")
        elif guard is not None:
            guard.check_admitted()
        data = load_site(config, data_path, site)
    except Exception as exc:
        site_log.warning("site %s, round %d: %s: %s", site, rnd, type(exc).__name__, exc)
        return {"site": site, "status": "error", "error": failure_report(exc)}, state
    status, payload, new_state = run_site_step(
        protocol, data, index, rnd, site_seed, bytes(request["broadcast"]), dict(state), guard
    )
    if status == "ok":
        return {"site": site, "status": "ok", "reply": payload}, new_state
    return {"site": site, "status": "error", "error": str(payload).splitlines()[0]}, state


def secure_site_step(config: FlowerFitConfig, site: str, step: str, request: Mapping[str, Any], kept: Mapping[str, Any] | None):
    """One site's answer to the secure-sum request ``step`` of a round (what the ClientApp does, without Flower).

    Parameters
    ----------
    config : FlowerFitConfig
        A fit with ``aggregation = "secure"``.
    site : str
        This site's name.
    step : one of :data:`SECURE_STEPS`
    request : mapping with ``round`` (int) and, after ``advertise_keys``, ``payload``
        (the server's bytes of the previous step: roster, routed shares, survivor list).
    kept : mapping or None
        What the site keeps for this round and never sends: ``round``, ``reply`` (its
        encoded reply, from the site step) and, from ``advertise_keys`` on, ``secagg``
        (its secrets, :meth:`fedhier.privacy.secagg.SecAggSite.to_state`).

    Returns
    -------
    (reply fields, what to keep or None): the reply has ``site``, ``status`` ("ok" /
    "error") and ``reply`` (this step's encoded message) or ``error`` (one line).  The
    site's input to ``masked_input`` is ``reply_spec.flatten(reply)``.  A failed step and
    the last step erase what the site kept: it never answers a step of a round twice.
    """
    rnd = int(request["round"])
    try:
        if kept is None or int(kept["round"]) != rnd:
            raise SecAggProtocolError(f"site {site!r} holds no reply for round {rnd}")
        if step == "advertise_keys" and "secagg" in kept:
            raise SecAggProtocolError(f"site {site!r} already advertised its keys for round {rnd}")
        spec = config.reply_spec()
        params = config.aggregator().params(spec, rnd)
        if step == "advertise_keys":
            secagg = SecAggSite(config.sites.index(site), params)
            message = secagg.advertise_keys()
        else:
            secagg = SecAggSite.from_state(params, bytes(kept["secagg"]))
            payload = bytes(request["payload"])
            if step == "share_keys":
                message = secagg.share_keys(payload)
            elif step == "masked_input":
                message = secagg.masked_input(spec.flatten(decode(spec, bytes(kept["reply"]))), payload)
            else:
                message = secagg.unmask(payload)
    except (KeyError, ValueError, OverflowError, InsufficientSitesError) as exc:
        site_log.warning("site %s, round %d, secure sum step %s failed: %s: %s", site, rnd, step, type(exc).__name__, exc)
        return {"site": site, "status": "error", "error": failure_report(exc)}, None
    fields = {"site": site, "status": "ok", "reply": message}
    return fields, None if step == SECURE_STEPS[-1] else {**kept, "secagg": secagg.to_state()}


# --------------------------------------------------------------------------- Flower apps

server_app = ServerApp()
client_app = ClientApp()


def _node_setting(context: Context, key: str) -> str:
    value = context.node_config.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"SuperNode {context.node_id}: node_config has no {key!r}; start it with --node-config '{key}=\"...\"'")
    return value


def _site_seed(context: Context) -> int | None:
    """The site's own secret seed from its SuperNode's ``node_config`` (``seed="..."``), or None."""
    value = context.node_config.get("seed")
    if value is None or value == "":
        return None
    text = str(value)
    if not text.isdigit():
        raise ValueError(f"SuperNode {context.node_id}: node_config 'seed' must be a non-negative integer")
    return int(text)


def _site_guard(context: Context) -> SiteGuard | None:
    """The site's own policy from its SuperNode's ``node_config`` (``policy="<file>"``), for this run; or None."""
    value = context.node_config.get("policy")
    if value is None or value == "":
        return None
    return SiteGuard(SitePolicy.read(str(value)), analysis=f"flower-run-{context.run_id}")


def _reply(msg: FlowerMessage, fields: Mapping[str, Any]) -> FlowerMessage:
    return FlowerMessage(RecordDict({_RECORD: ConfigRecord(dict(fields))}), reply_to=msg)


def _setup_failure(context: Context, exc: Exception) -> dict[str, Any]:
    return {"site": str(context.node_config.get("site", "")), "status": "error", "error": f"{type(exc).__name__}: {exc}"}


@client_app.train()
def _site_message(msg: FlowerMessage, context: Context) -> FlowerMessage:
    """ClientApp entry: decode the request, run the site step, reply with our bytes.

    In a secure fit the reply stays in ``context.state`` for the secure sum that follows
    and the server is only told that it is ready (status "held").
    """
    try:
        config = FlowerFitConfig.from_json(str(context.run_config[RUN_CONFIG_KEY]))
        site, path = _node_setting(context, "site"), _node_setting(context, "data")
        site_seed = _site_seed(context)
        guard = _site_guard(context)
    except (KeyError, ValueError, TypeError) as exc:
        return _reply(msg, _setup_failure(context, exc))
    kept = context.state.config_records.get(_STATE)
    state = decode_state(kept["state"]) if kept is not None and "state" in kept else {}
    request = msg.content.config_records[_RECORD]
    fields, new_state = site_round(config, site, path, request, state, site_seed, guard)
    encoded = encode_state(new_state)
    if encoded is not None:
        context.state[_STATE] = ConfigRecord({"state": encoded})
    if config.aggregation == "secure":
        context.state.pop(_SECURE, None)
        if fields["status"] == "ok":
            context.state[_SECURE] = ConfigRecord({"round": int(request["round"]), "reply": fields["reply"]})
            fields = {"site": site, "status": "held"}
    return _reply(msg, fields)


def _secure_message(step: str) -> Callable[[FlowerMessage, Context], FlowerMessage]:
    """ClientApp entry of the secure-sum step ``step`` (message type ``train.<step>``)."""

    def handle(msg: FlowerMessage, context: Context) -> FlowerMessage:
        try:
            config = FlowerFitConfig.from_json(str(context.run_config[RUN_CONFIG_KEY]))
            site = _node_setting(context, "site")
        except (KeyError, ValueError, TypeError) as exc:
            return _reply(msg, _setup_failure(context, exc))
        kept = context.state.config_records.get(_SECURE)
        fields, keep = secure_site_step(config, site, step, msg.content.config_records[_RECORD], kept)
        if keep is None:
            context.state.pop(_SECURE, None)
        else:
            context.state[_SECURE] = ConfigRecord(keep)
        return _reply(msg, fields)

    return handle


for _step in SECURE_STEPS:
    client_app.train(_step)(_secure_message(_step))


@server_app.main()
def _coordinate(grid: Grid, context: Context) -> None:
    """ServerApp entry: run the fit of the run config and write the result folder."""
    from ..protocol.mvppca import BroadcastMetrics, theta_settled

    config = FlowerFitConfig.from_json(str(context.run_config[RUN_CONFIG_KEY]))
    out = Path(config.out)
    protocol = config.protocol()
    history: list[RoundRecord] = []

    def progress(record: RoundRecord, _broadcast: Message) -> None:
        history.append(record)
        write_json(out / "history.json", [r.to_dict() for r in history])

    write_json(out / "summary.json", {"status": "running", "sites": list(config.sites)})
    try:
        result = run_rounds(
            grid,
            protocol,
            config.sites,
            n_rounds=config.n_rounds,
            seed=config.seed,
            min_sites=config.min_sites,
            round_timeout=config.round_timeout,
            connect_timeout=config.connect_timeout,
            poll_interval=config.poll_interval,
            aggregator=config.aggregator(),
            callbacks=[BroadcastMetrics(config.schema()), progress],  # the history FedMVPPCA.fit records
            stop=None if config.tol is None else theta_settled(config.tol),
        )
    except RoundFailed as exc:
        write_json(out / "summary.json", {"status": "failed", "error": str(exc), "round": exc.round, "sites": list(config.sites)})
        raise
    write_result(out, config, result)


# --------------------------------------------------------------------------- result folder


def write_result(out: str | Path, config: FlowerFitConfig, result: FlowerFitResult) -> Path:
    """Write ``model.npz`` (a :class:`fedhier.mvppca.FedMVPPCA` file), ``broadcast.fhm``
    (the final broadcast, encoded), ``history.json`` and ``summary.json`` into ``out``."""
    from ..mvppca import FedMVPPCA

    out = Path(out)
    protocol = config.protocol()
    schema = config.schema()
    atomic_write_bytes(out / "broadcast.fhm", encode(protocol.broadcast_spec, result.broadcast))
    model = FedMVPPCA.from_broadcast(
        result.broadcast,
        schema,
        result.history,
        seed=result.seed,
        n_sites=len(config.sites),
        n_components=config.n_components,
        n_rounds=config.n_rounds,
        n_local_iter=config.n_local_iter,
        n_first_iter=config.n_first_iter,
        tol=config.tol,
        init=config.init,
        local_tol=config.local_tol,
        random_state=result.seed,
        ig_solver=config.ig_solver,
        sigma2_prior=config.sigma2_prior,
        min_sites=config.min_sites,
        aggregation=config.aggregation,
    )
    model.save(out / "model.npz")
    write_json(out / "history.json", [r.to_dict() for r in result.history])
    write_json(
        out / "summary.json",
        {
            "status": "completed",
            "sites": list(config.sites),
            "nodes": {config.sites[s]: str(n) for s, n in sorted(result.nodes.items())},
            "lost": {config.sites[s]: r for s, r in sorted(result.lost.items())},
            "ignored_nodes": {str(n): why for n, why in result.ignored.items()},
            "seed": result.seed,
            "n_rounds": config.n_rounds,
            "final_metrics": result.history[-1].metrics if result.history else {},
            "bytes_up": int(sum(sum(r.bytes_up.values()) for r in result.history)),
            "bytes_down": int(sum(sum(r.bytes_down.values()) for r in result.history)),
            "model": str(out / "model.npz"),
            **_privacy_summary(config, result),
        },
    )
    return out


def _privacy_summary(config: FlowerFitConfig, result: FlowerFitResult) -> dict[str, Any]:
    """Epsilon spent per site, counting every view as released (an upper bound for sites lacking views)."""
    if config.epsilon is None:
        return {}
    from ..models.mvppca.dp import ledger_from_history

    ledger = ledger_from_history(config.privacy(), [list(config.views)] * len(config.sites), result.history)
    return {"privacy_spent": {config.sites[s]: v for s, v in ledger.spent(config.delta).items()}}


def read_result(out: str | Path, config: FlowerFitConfig) -> tuple[Message, list[dict[str, Any]], dict[str, Any]]:
    """(final broadcast, history rows, summary) of a result folder written by :func:`write_result`."""
    out = Path(out)
    summary = json.loads((out / "summary.json").read_text())
    if summary.get("status") != "completed":
        raise RuntimeError(f"{out}: the fit did not complete: {summary.get('error', summary.get('status'))}")
    broadcast = decode(config.protocol().broadcast_spec, (out / "broadcast.fhm").read_bytes())
    history = json.loads((out / "history.json").read_text())
    return broadcast, history, summary
