"""In-process runtime: run any :class:`~fedhier.protocol.base.RoundProtocol` on one machine.

This is the embedded default engine (ARCHITECTURE "Runtimes"): tests, CI, benchmarks and
paper reproductions use it.  It behaves like a deployment in the ways that matter for
the results:

* every reply and broadcast is validated against its declared spec, serialised with
  :func:`fedhier.protocol.messages.encode` (no pickle) and its bytes are recorded; each
  site is sent only its part of the broadcast (``protocol.site_broadcast``);
* randomness is split by who may know it.  The run's *public* seed (``random_state``, or
  drawn and recorded in the result) drives what is not secret: the runtime's own draws
  (participation, ``spawn_key=(2, r)``) and each site's generator for starts and
  mini-batches (:func:`site_rng`, ``spawn_key=(1, r, s)``).  Every secret a site draws
  (DP noise, masks) comes from its :class:`~fedhier.privacy.sampling.NoiseSource`, the
  operating system's CSPRNG, whatever ``random_state`` is; only the insecure switch
  ``insecure_reproducible_noise=True`` derives it from the public seed
  (``spawn_key=(6, r, s)``), so that a run can be repeated bit for bit, and such a run
  is not private.  Results do not depend on the order in which sites run nor on the
  process pool;
* a failing site tells the runner only the category of its failure
  (:func:`failure_report`); the full message stays in the site's log;
* a private protocol's reply is checked field by field before it leaves the site
  (:func:`fedhier.protocol.base.check_disclosure`);
* partial participation: a site may miss a round (scheduled, random, or because its
  step raised); the global step sees only the sites that replied.  The first failure of
  each site raises a :class:`SiteFailedWarning`; every failure is in the history;
* a site step may run under a deadline (``site_timeout``, in worker processes): a step
  that overruns it, or whose worker process dies, is a failed site for that round (the
  worker is replaced, the fit goes on); no worker process outlives the run
  (:mod:`fedhier.runtime.workers`);
* a round with fewer than ``min_sites`` replies stops the fit with
  :class:`RoundFailed` -- no partial global update is ever broadcast;
* callbacks run after every round (progress bar, history, checkpoint); so do the observers registered
  around the call (:mod:`fedhier.runtime.observers`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np

from ..privacy.sampling import NoiseSource
from ..protocol.base import RoundProtocol, SiteContext, check_disclosure, sum_messages
from .checkpoint import Checkpoint, Fingerprint, read_checkpoint, write_checkpoint
from .observers import round_done
from ..protocol.messages import Field, Message, MessageError, MessageSpec, decode, encode, header_fields
from .workers import SiteWorkers

if TYPE_CHECKING:
    from ..privacy.policy import SitePolicy
    from .guard import SiteGuard

__all__ = [
    "simulate", "SimulationResult", "RoundRecord", "RoundFailed", "SiteFailedWarning", "site_rng", "site_noise", "Participation",
    "run_site_step", "server_update", "global_update", "encode_state", "decode_state", "failure_report",
]

#: a site's own log: the full text of its failures (never sent to the coordinator)
site_log = logging.getLogger("fedhier.site")

#: participation: None (every site, every round); a float p in (0, 1] (each site joins
#: each round with probability p); a mapping ``round -> sites that are absent``; or a
#: callable ``(round, n_sites, rng) -> iterable of participating sites``.
Participation = None | float | Mapping[int, Iterable[int]] | Callable[[int, int, np.random.Generator], Iterable[int]]


class RoundFailed(RuntimeError):
    """A round could not produce a global update (too few sites replied)."""

    def __init__(self, round: int, message: str):
        super().__init__(f"round {round}: {message}")
        self.round = round


class SiteFailedWarning(UserWarning):
    """A site's step raised; the site is left out of that round (the fit goes on without it)."""


@dataclass
class RoundRecord:
    """What happened in one round (one entry of ``history``)."""

    round: int
    sites: list[int]
    absent: list[int]
    failed: dict[int, str]
    bytes_up: dict[int, int]
    bytes_down: dict[int, int]
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> "RoundRecord":
        return cls(
            round=int(row["round"]),
            sites=[int(s) for s in row["sites"]],
            absent=[int(s) for s in row["absent"]],
            failed={int(k): v for k, v in row["failed"].items()},
            bytes_up={int(k): int(v) for k, v in row["bytes_up"].items()},
            bytes_down={int(k): int(v) for k, v in row["bytes_down"].items()},
            metrics=dict(row["metrics"]),
            seconds=float(row["seconds"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "sites": list(self.sites),
            "absent": list(self.absent),
            "failed": {str(k): v for k, v in self.failed.items()},
            "bytes_up": {str(k): v for k, v in self.bytes_up.items()},
            "bytes_down": {str(k): v for k, v in self.bytes_down.items()},
            "metrics": dict(self.metrics),
            "seconds": self.seconds,
        }


@dataclass
class SimulationResult:
    """Final broadcast, per-round history and the site-private states."""

    broadcast: Message
    history: list[RoundRecord]
    site_states: list[dict[str, np.ndarray]]
    seed: int


def site_rng(site_seed: int | None, round: int, site: int) -> np.random.Generator:
    """The site's generator for ``round``, for what is not secret (starts, mini-batches).

    ``SeedSequence(site_seed, spawn_key=(1, round, site))``; None draws fresh entropy from
    the operating system.  Secrets come from :func:`site_noise` instead.
    """
    if site_seed is None:
        return np.random.default_rng()
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(site_seed), spawn_key=(1, round, site))))


def site_noise(noise_seed: int | None, round: int, site: int) -> NoiseSource:
    """The site's source of secrets for ``round``: the operating system's CSPRNG (``noise_seed=None``).

    An int ``noise_seed`` is the insecure switch (``insecure_reproducible_noise``):
    ``SeedSequence(noise_seed, spawn_key=(6, round, site))``, reproducible and not private.
    """
    if noise_seed is None:
        return NoiseSource()
    return NoiseSource.seeded(np.random.SeedSequence(int(noise_seed), spawn_key=(6, round, site)))


def failure_report(exc: BaseException) -> str:
    """The one line a failing site sends to the coordinator: the failure's category and,
    for an error whose text is safe to send (``public_message``, e.g.
    :class:`~fedhier.protocol.base.SiteError`), its first line.  Never a value of the data."""
    name = type(exc).__name__
    if getattr(exc, "public_summary", None):  # e.g. a site policy's refusal: its category only
        return f"{name}: {exc.public_summary}"
    if getattr(exc, "public_message", False):
        text = str(exc).splitlines()[0] if str(exc) else ""
        return f"{name}: {text}" if text else name
    return f"{name} at the site (the details are in the site's own log)"


def _runtime_rng(seed: int, round: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(2, round))))


def _state_spec(state: Mapping[str, np.ndarray]) -> MessageSpec:
    return MessageSpec("site-state", {k: Field(tuple(np.shape(v)), np.asarray(v).dtype.name) for k, v in state.items()})


def _state_spec_of(data: bytes) -> MessageSpec:
    return MessageSpec("site-state", {k: Field(tuple(shape), dtype) for k, dtype, shape in header_fields(data)})


# --------------------------------------------------------------------------- site execution
# The same function runs in-process and in pool workers; it only ever receives and returns
# bytes for the messages that cross the site boundary.

_WORKER: dict[str, Any] = {}


def _pool_init(protocol: RoundProtocol, sites: Sequence[Any]) -> None:
    _WORKER["protocol"] = protocol
    _WORKER["sites"] = sites


def run_site_step(
    protocol: RoundProtocol,
    data: Any,
    site: int,
    round: int,
    site_seed: int | None,
    broadcast_bytes: bytes,
    state: dict[str, np.ndarray],
    guard: "SiteGuard | None" = None,
    noise_seed: int | None = None,
) -> tuple[str, bytes | str, dict[str, np.ndarray]]:
    """Run one site step from the bytes the site received (its :meth:`site_broadcast`); the site-side half of a round.

    ``site_seed`` seeds the site's generator for what is not secret (:func:`site_rng`; None:
    the operating system's entropy); the step's secrets come from :func:`site_noise`
    (``noise_seed=None``, the default: the operating system's CSPRNG).  A private protocol's reply is
    checked by :func:`~fedhier.protocol.base.check_disclosure` before it is encoded.
    ``guard`` (:class:`~fedhier.runtime.guard.SiteGuard`): the site's own policy, checked
    on the data before the step, and its ledger, which records the step's releases.

    Returns ("ok", reply bytes, new state) or ("error", :func:`failure_report`, old
    state); the full error is written to the site's log (``fedhier.site``).  Every
    runtime (this simulator, its process pool, the Flower ClientApp) calls this, so a
    site computes the same reply from the same seeds, round and site wherever it runs.
    """
    try:
        broadcast = decode(protocol.site_broadcast_spec, broadcast_bytes)
        if guard is not None:
            guard.check_data(protocol, data)
        ctx = SiteContext(site=site, round=round, rng=site_rng(site_seed, round, site), data=data,
                          noise=site_noise(noise_seed, round, site), state=dict(state))
        reply = protocol.site_step(ctx, broadcast)
        check_disclosure(protocol, reply, ctx.releases)
        encoded = encode(protocol.reply_spec, reply)
        if guard is not None:  # recorded before it is sent: a release lost on the way still counts
            guard.record(round, ctx.releases)
        return "ok", encoded, ctx.state
    except Exception as exc:  # a failing site is dropped from the round, never silently
        site_log.warning("site %d, round %d failed: %s: %s\n%s", site, round, type(exc).__name__, exc,
                         traceback.format_exc(limit=3))
        return "error", failure_report(exc), state


def _site_step_in_worker(site: int, round: int, site_seed: int | None, broadcast_bytes: bytes, state_bytes: bytes | None,
                         guard: "SiteGuard | None" = None, noise_seed: int | None = None):
    protocol = _WORKER["protocol"]
    state = decode_state(state_bytes)
    status, payload, new_state = run_site_step(protocol, _WORKER["sites"][site], site, round, site_seed, broadcast_bytes,
                                               state, guard, noise_seed)
    return status, payload, encode_state(new_state)


#: what the runner records for a step that produced no answer in its worker process
_LOST = {
    "lost": "WorkerLost: the site's worker process ended during its step (killed or crashed)",
    "timeout": "SiteTimeout: the site's step did not answer within its deadline of {} s",
}


def encode_site_broadcast(protocol: RoundProtocol, broadcast: Message, site: int) -> bytes:
    """The bytes sent to ``site``: its :meth:`~fedhier.protocol.base.RoundProtocol.site_broadcast`, encoded."""
    return encode(protocol.site_broadcast_spec, protocol.site_broadcast(broadcast, site))


# Site states never leave the site in a deployment; in the pool they travel between the
# simulator and its worker processes, with the same self-describing encoding (no pickle).


def encode_state(state: Mapping[str, np.ndarray]) -> bytes | None:
    return encode(_state_spec(state), state) if state else None


def decode_state(data: bytes | None) -> dict[str, np.ndarray]:
    return {} if data is None else decode(_state_spec_of(data), data)


def server_update(
    protocol: RoundProtocol,
    replies: Mapping[int, Message],
    round: int,
    broadcast: Message,
    *,
    aggregation: str = "plain",
    aggregator: Any = None,
    seed: int = 0,
    context: bytes = b"",
) -> tuple[Message, dict[str, float], list[int], dict[int, int] | None]:
    """The server-side half of a round: combine the replies and run the global step.

    ``context`` names the run for the secure sum: each site answers a broadcast of a run once.
    Returns (new broadcast, round metrics, contributing sites, bytes per site of the
    secure-sum exchange or None).  Raises :class:`RoundFailed` when secure aggregation
    cannot recover the sum.  Shared by every runtime.
    """
    secure_bytes = None
    contributors = sorted(replies)
    if protocol.combine == "sum":
        if aggregation == "secure":
            try:
                answered = context + hashlib.sha256(encode(protocol.broadcast_spec, broadcast)).digest()
                combined, secure_bytes, contributors = aggregator.sum(
                    protocol.reply_spec, replies, round, _runtime_rng(seed, round), context=answered
                )
            except Exception as exc:
                raise RoundFailed(round, f"secure aggregation failed: {exc}") from exc
        else:
            combined = sum_messages(protocol.reply_spec, replies)
    else:
        combined = dict(replies)
    new_broadcast, metrics = global_update(protocol, combined, round, broadcast)
    return new_broadcast, metrics, list(contributors), secure_bytes


def global_update(protocol: RoundProtocol, combined: Message, round: int, broadcast: Message) -> tuple[Message, dict[str, float]]:
    """The global step on the combined replies; returns (new broadcast, round metrics).

    ``combined`` is the field-wise sum of the replies (``combine == "sum"``, plain or
    secure) or the mapping site -> reply (``"gather"``).  Shared by every runtime.
    """
    metrics = protocol.round_metrics(combined, round)
    return protocol.broadcast_spec.validate(protocol.global_step(combined, round, broadcast)), metrics


# --------------------------------------------------------------------------- main loop


def _admit_sites(protocol: RoundProtocol, n_sites: int, policies, analysis: str | None, n_rounds: int,
                 secure: bool) -> tuple[list["SiteGuard | None"], dict[int, str]]:
    """Each site's guard and the sites whose own policy refuses the analysis (site -> the reason it sends)."""
    if policies is None:
        return [None] * n_sites, {}
    if len(policies) != n_sites:
        raise ValueError(f"site_policies: {len(policies)} given for {n_sites} sites")
    from .guard import SiteGuard

    name = analysis if analysis is not None else f"simulate-{uuid.uuid4().hex}"
    guards: list[SiteGuard | None] = [None if p is None else SiteGuard(p, name) for p in policies]
    refused = {}
    for s, guard in enumerate(guards):
        if guard is None:
            continue
        try:
            guard.admit(protocol, n_rounds, secure)
        except Exception as exc:  # the site says no (or its ledger does not check out): it takes no part
            site_log.warning("site %d refused analysis %s: %s", s, name, exc)
            refused[s] = failure_report(exc)
    return guards, refused


def _participants(participation: Participation, round: int, n_sites: int, rng: np.random.Generator) -> list[int]:
    if participation is None:
        return list(range(n_sites))
    if isinstance(participation, (float, int)) and not isinstance(participation, bool):
        p = float(participation)
        if not 0.0 < p <= 1.0:
            raise ValueError(f"participation probability must be in (0, 1], got {p}")
        return [s for s in range(n_sites) if rng.random() < p]
    if isinstance(participation, Mapping):
        absent = {int(s) for s in participation.get(round, ())}
        return [s for s in range(n_sites) if s not in absent]
    if callable(participation):
        chosen = sorted({int(s) for s in participation(round, n_sites, rng)})
        bad = [s for s in chosen if not 0 <= s < n_sites]
        if bad:
            raise ValueError(f"participation returned unknown site(s) {bad}")
        return chosen
    raise TypeError(f"participation must be None, a float, a mapping or a callable, got {type(participation).__name__}")


def simulate(
    protocol: RoundProtocol,
    sites: Sequence[Any],
    *,
    n_rounds: int,
    random_state: int | None = None,
    n_jobs: int = 1,
    participation: Participation = None,
    min_sites: int = 1,
    callbacks: Sequence[Callable[[RoundRecord, Message], None]] = (),
    aggregation: Literal["plain", "secure"] = "plain",
    aggregator: Any = None,
    checkpoint: str | Path | None = None,
    stop: Callable[[RoundRecord, Message], bool] | None = None,
    site_policies: Sequence["SitePolicy | None"] | None = None,
    analysis: str | None = None,
    site_timeout: float | None = None,
    insecure_reproducible_noise: bool = False,
) -> SimulationResult:
    """Run ``n_rounds`` rounds of ``protocol`` over ``sites`` in this process.

    Parameters
    ----------
    protocol : RoundProtocol
    sites : sequence
        Private data of each site, passed unchanged to ``protocol.site_step``.
    n_rounds : int
        Number of communication rounds (>= 1).
    random_state : int or None
        The run's public seed: participation and the sites' starts and mini-batches (None:
        one is drawn and recorded in the result).  It never seeds a secret: every site
        draws its DP noise and masks from the operating system, as in a deployment (see
        the module docstring).
    n_jobs : int
        Number of worker processes for the site steps (1 = no pool, unless
        ``site_timeout`` is given).  Results are bit-identical with and without the pool.
        A worker process that dies during a step (killed, crashed) makes that site a
        failed site of the round; the worker is replaced and the fit goes on.
    participation : see :data:`Participation`
    min_sites : int
        Fewest replies a round needs; fewer raise :class:`RoundFailed`.
    callbacks : sequence of callables ``(record, broadcast) -> None``
        Run after every round, in order, before the checkpoint is written (metrics a
        callback adds to ``record.metrics`` are saved with it).
    aggregation : "plain" or "secure"
        "secure" replaces the plain sum by the secure summation of ``aggregator``
        (e.g. :class:`fedhier.secure.secure_round.SecureAggregator`, an object with
        ``sum(spec, replies, round, rng) -> (sum, bytes sent per site, contributing
        sites)``); only for ``combine == "sum"`` protocols.  The recorded bytes are then
        those of the whole secure-sum exchange.
    stop : callable ``(record, broadcast) -> bool``, optional
        Called after each round (after the callbacks and the checkpoint); True ends the
        fit early (a stopping rule such as FedLin's EP convergence test).  A run resumed
        from a checkpoint whose last round met ``stop`` runs no further round.
    checkpoint : path, optional
        Write a checkpoint (:mod:`fedhier.runtime.checkpoint`) after every round; if the
        file exists when the run starts, resume from it (same protocol, sites and seed
        required) -- with ``random_state`` given a fit without secrets (or one under the
        insecure switch) is bit-identical to an uninterrupted run; the sites' secrets after
        the restart are fresh draws.
        A resume on other data (even of the same shapes) or with another configuration is
        refused, naming what differs (:class:`~fedhier.runtime.checkpoint.Fingerprint`).

    site_policies : sequence of SitePolicy or None, optional
        Each site's own privacy policy (:class:`fedhier.privacy.policy.SitePolicy`), enforced
        at the site as in a deployment (:class:`fedhier.runtime.guard.SiteGuard`): before
        round 1 a site whose policy refuses the analysis takes no part (every round's
        ``failed`` and a :class:`SiteFailedWarning` say that its policy refused; the reason is
        in the site's log, ``fedhier.site``), an admitted analysis reserves its plan in the
        site's ledger, every release a site makes is appended there, and when the fit ends
        the unspent reservation is given back.
    analysis : str, optional
        The analysis' name in the sites' ledgers (default: a fresh random id).
    site_timeout : float, optional
        Deadline of one site step, in seconds (None: no deadline).  A step that has not
        answered ``site_timeout`` seconds after it was handed to its worker is a failed site
        of that round (like a step that raised): its worker is killed and replaced, and the
        round goes on with the other sites.  A running step can only be stopped safely in
        another process, so with a deadline the steps always run in worker processes
        (``max(n_jobs, 1)`` of them, also for ``n_jobs=1``).  Choose it well above the
        slowest normal step on a loaded machine: a missed deadline drops the site's reply.
    insecure_reproducible_noise : bool
        Insecure switch: derive every site's DP noise and masks from the public seed, so
        that a run can be repeated bit for bit.  Whoever knows the seed knows the noise:
        the result is not private, whatever epsilon its ledger adds up.  Default False.

    Returns
    -------
    SimulationResult
    """
    if not isinstance(protocol, RoundProtocol):
        raise TypeError(f"protocol must be a RoundProtocol, got {type(protocol).__name__}")
    n_sites = len(sites)
    if n_sites == 0:
        raise ValueError("no sites given")
    if int(n_rounds) != n_rounds or n_rounds < 1:
        raise ValueError(f"n_rounds must be a positive integer, got {n_rounds!r}")
    if int(n_jobs) != n_jobs or n_jobs < 1:
        raise ValueError(f"n_jobs must be a positive integer, got {n_jobs!r}")
    if site_timeout is not None and (isinstance(site_timeout, bool) or not float(site_timeout) > 0):
        raise ValueError(f"site_timeout must be a positive number of seconds or None, got {site_timeout!r}")
    if not 1 <= min_sites <= n_sites:
        raise ValueError(f"min_sites must be between 1 and the number of sites ({n_sites}), got {min_sites}")
    if aggregation not in ("plain", "secure"):
        raise ValueError(f"aggregation must be 'plain' or 'secure', got {aggregation!r}")
    if aggregation == "secure":
        if protocol.combine != "sum":
            raise ValueError(f"protocol {protocol.name!r} combines by {protocol.combine!r}; secure aggregation needs 'sum'")
        if aggregator is None:
            raise ValueError("aggregation='secure' needs an aggregator")
    guards, refused = _admit_sites(protocol, n_sites, site_policies, analysis, n_rounds, aggregation == "secure")
    for s, data in enumerate(sites):
        if s not in refused:
            protocol.validate_site_data(s, data)

    seed = int(np.random.SeedSequence().entropy % (2**63)) if random_state is None else int(random_state)
    first_round, broadcast, states = 1, protocol.broadcast_spec.validate(protocol.initial_broadcast()), [{} for _ in sites]
    history: list[RoundRecord] = []
    fingerprint = None
    if checkpoint is not None and Path(checkpoint).exists():
        saved = read_checkpoint(checkpoint, n_sites=n_sites)
        if saved.protocol != protocol.name or len(saved.site_states) != n_sites:
            raise ValueError(
                f"checkpoint {checkpoint} is for protocol {saved.protocol!r} with {len(saved.site_states)} sites, "
                f"not {protocol.name!r} with {n_sites}"
            )
        if saved.fingerprint is None:
            raise ValueError(f"checkpoint {checkpoint} does not say which data and configuration it belongs to; delete it")
        saved.fingerprint.check_resume(protocol, sites, f"checkpoint {checkpoint}")
        fingerprint = saved.fingerprint
        if random_state is not None and saved.seed != seed:
            raise ValueError(f"checkpoint {checkpoint} was written with seed {saved.seed}, not {seed}")
        if saved.round > n_rounds:
            raise ValueError(f"checkpoint {checkpoint} is after round {saved.round}, beyond this run's n_rounds={n_rounds}")
        seed, first_round = saved.seed, saved.round + 1
        try:
            broadcast = protocol.broadcast_spec.validate(saved.broadcast)
        except MessageError as exc:
            raise ValueError(f"checkpoint {checkpoint} was written by a differently configured {protocol.name!r} fit: {exc}") from None
        try:
            protocol.restore_coordinator_state(saved.coordinator)
        except ValueError as exc:
            raise ValueError(f"checkpoint {checkpoint}: {exc}") from None
        states = saved.site_states
        history = [RoundRecord.from_dict(h) for h in saved.history]
        if stop is not None and history and stop(history[-1], broadcast):
            first_round = n_rounds + 1  # the checkpointed run had already stopped: resume to its end

    run_context = os.urandom(16)  # this run, for the secure sum's record of answered broadcasts
    noise_seed = seed if insecure_reproducible_noise else None  # None: each site's secrets from the OS CSPRNG
    pool = (SiteWorkers(n_jobs, _site_step_in_worker, _pool_init, (protocol, sites), timeout=site_timeout)
            if n_jobs > 1 or site_timeout is not None else None)
    warned: set[int] = set()  # sites whose failure has been reported by a warning
    try:
        for rnd in range(first_round, n_rounds + 1):
            t0 = time.perf_counter()
            active = [s for s in _participants(participation, rnd, n_sites, _runtime_rng(seed, rnd)) if s not in refused]
            if protocol.broadcast_is_common:  # the same bytes for every site: encoded once
                common = encode_site_broadcast(protocol, broadcast, active[0]) if active else b""
                down = dict.fromkeys(active, common)
            else:
                down = {s: encode_site_broadcast(protocol, broadcast, s) for s in active}
            outcomes: dict[int, tuple[str, bytes | str, dict[str, np.ndarray]]] = {}
            if pool is None:
                for s in active:
                    outcomes[s] = run_site_step(protocol, sites[s], s, rnd, seed, down[s], states[s], guards[s], noise_seed)
            else:
                done = pool.run({s: (s, rnd, seed, down[s], encode_state(states[s]), guards[s], noise_seed) for s in active},
                                describe_lost=lambda why: _LOST[why].format(site_timeout))
                for s in active:
                    status, payload, state_bytes = done[s]
                    outcomes[s] = (status, payload, states[s] if status != "ok" else decode_state(state_bytes))

            replies: dict[int, Message] = {}
            failed: dict[int, str] = dict(refused)  # a site that refused the analysis, every round
            bytes_up: dict[int, int] = {}
            for s in active:
                status, payload, new_state = outcomes[s]
                if status == "ok":
                    replies[s] = decode(protocol.reply_spec, payload)
                    bytes_up[s] = len(payload)
                    states[s] = new_state
                else:
                    failed[s] = str(payload)
            absent = [s for s in range(n_sites) if s not in active and s not in refused]
            if len(replies) < min_sites:
                detail = "; ".join(f"site {s}: {m.splitlines()[0]}" for s, m in failed.items())
                raise RoundFailed(rnd, f"{len(replies)} site(s) replied, at least {min_sites} needed" + (f" ({detail})" if detail else ""))
            for s in sorted(set(failed) - warned):
                warned.add(s)
                warnings.warn(
                    f"round {rnd}: site {s} failed and is left out of the round ({failed[s].splitlines()[0]}); "
                    "the fit goes on with the sites that replied. Every failure is in the history (record.failed)",
                    SiteFailedWarning, stacklevel=2,
                )

            broadcast, metrics, contributors, secure_bytes = server_update(
                protocol, replies, rnd, broadcast, aggregation=aggregation, aggregator=aggregator, seed=seed,
                context=run_context,
            )
            if secure_bytes is not None:
                bytes_up = secure_bytes
            replies = {s: replies[s] for s in contributors}
            record = RoundRecord(
                round=rnd,
                sites=sorted(replies),
                absent=absent,
                failed=failed,
                bytes_up=bytes_up,
                bytes_down={s: len(down[s]) for s in active},
                metrics=metrics,
                seconds=time.perf_counter() - t0,
            )
            history.append(record)
            for cb in callbacks:  # before the checkpoint, which then holds the metrics they add
                cb(record, broadcast)
            if checkpoint is not None:
                fingerprint = fingerprint or Fingerprint.of(protocol, sites)  # salted digests of the data, see Fingerprint
                write_checkpoint(
                    checkpoint,
                    Checkpoint(protocol.name, rnd, seed, broadcast, states, [h.to_dict() for h in history], fingerprint,
                               protocol.coordinator_state()),
                )
            round_done(record, broadcast)  # observers registered by the caller (fedhier.runtime.observers)
            if stop is not None and stop(record, broadcast):
                break
    finally:
        if pool is not None:
            pool.close()
        for guard in guards:  # each site gives back what it reserved and did not spend
            if guard is not None:
                guard.finish()
    return SimulationResult(broadcast=broadcast, history=history, site_states=states, seed=seed)
