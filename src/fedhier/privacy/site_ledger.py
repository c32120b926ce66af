"""A site's own record of every release it ever made, across analyses (append-only, integrity-checked).

:class:`~fedhier.privacy.ledger.PrivacyLedger` accounts one fit; a site that takes part in
many analyses needs the composition of *all* of them to enforce a lifetime budget
(:class:`~fedhier.privacy.policy.SitePolicy`).  :class:`SiteLedger` keeps that record in
a file the site's administrator owns, next to the data:

* one JSON line per release: analysis id, round, block and its ``dp_accounting`` event
  (:func:`~fedhier.privacy.ledger.event_to_dict`); one line per admitted analysis (``start``:
  its whole planned spend, reserved, and the policy it was admitted under: the SHA-256 of the
  policy file, its ``lifetime_epsilon`` and ``delta``); one line when it ends (``finish``: the
  part of the plan it did not spend is given back);
* every line carries an HMAC-SHA256 over its content *and the previous line's MAC* (a
  chain), keyed by a secret kept in ``<ledger>.key`` (created with mode 0600 on first
  use); a head file ``<ledger>.head`` holds the number of lines and the last MAC, also
  authenticated.  Editing, reordering, deleting or truncating lines, or replacing the head,
  is detected by :meth:`SiteLedger.verify` (every open verifies) without the key holder's
  cooperation being forgeable;
* the lifetime epsilon is dp_accounting's PLD composition of every recorded event and of the
  unspent reservation of every analysis still running
  (:func:`~fedhier.privacy.ledger.epsilon_of_events`), never a hand-made sum;
* every read-check-write happens under an exclusive lock on ``<ledger>.lock``
  (``fcntl.flock``): two analyses admitted at once are admitted one after the other, the
  second seeing the first's reservation, and two fits writing at once never interleave;
* an optional *anchor* file, kept by the operator apart from the ledger (another disk or
  machine), holds the number of lines and the last MAC after every write, and the head
  records that the ledger is anchored.  At open the ledger must extend the anchor: a ledger
  restored from an older backup, or deleted, is detected, and so is an anchored ledger
  opened without its anchor.  A roll-back of the ledger *and* its anchor together, or to a
  state from before it was anchored with the anchor deleted, is not detectable.

Only events are recorded -- never data, and of released values only the outcome of a noisy
subject count (pass or refuse), which the coordinator sees anyway.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from dp_accounting import dp_event

from .ledger import epsilon_of_events, event_from_dict, event_to_dict

__all__ = ["SiteLedger", "LedgerIntegrityError", "LedgerEntry", "BeyondPlanError"]

_FORMAT = "fedhier.site_ledger/1"
_ANCHOR_FORMAT = "fedhier.site_ledger_anchor/1"
_GENESIS = "0" * 64


class LedgerIntegrityError(RuntimeError):
    """The site ledger's file, its head, its key or its anchor does not check out: it was edited, truncated,
    replaced or rolled back."""

    #: what the coordinator is told; the text (file names, line counts) stays in the site's log
    public_summary = "the site's privacy ledger does not check out (the details are in the site's own log)"


class BeyondPlanError(RuntimeError):
    """A step's releases exceed what its analysis reserved at admission (more rounds than planned, a repeated
    round, or a round after the analysis finished)."""


@dataclass(frozen=True)
class LedgerEntry:
    """One release recorded by a site: the analysis it belonged to, its round and block, its DpEvent."""

    analysis: str
    round: int
    block: str
    event: dp_event.DpEvent


class SiteLedger:
    """Append-only, HMAC-chained ledger of one site (see the module docstring).

    Parameters
    ----------
    path : path of the ledger file (JSON lines).  Created, with its key and head files,
        when it does not exist; otherwise verified line by line before anything is read.
    anchor : path of the anchor file, or None (no roll-back check).  Created on the first
        write; afterwards the ledger must extend what it records.

    Attributes
    ----------
    entries : every release recorded, in order.
    analyses : every analysis admitted, in order.
    plans : analysis -> the events its latest admission reserved.
    open_analyses : the admitted analyses that have not finished.
    policies : the policy records (``sha256``, ``lifetime_epsilon``, ``delta``) of every admission.
    count_checks : (analysis, view) -> whether its noisy subject count reached the site's minimum.
    anchored : the ledger has kept an anchor (its head says so).
    """

    def __init__(self, path: str | os.PathLike, anchor: str | os.PathLike | None = None) -> None:
        self.path = Path(path)
        self.key_path = self.path.with_name(self.path.name + ".key")
        self.head_path = self.path.with_name(self.path.name + ".head")
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.anchor_path = None if anchor is None else Path(anchor)
        self._lock_depth = 0
        self._lock_file: Any = None
        self.entries: list[LedgerEntry] = []
        self.analyses: list[str] = []
        self.plans: dict[str, list[dp_event.DpEvent]] = {}
        self.open_analyses: set[str] = set()
        self.policies: list[dict[str, Any]] = []
        self.count_checks: dict[tuple[str, str], bool] = {}
        self.anchored = False
        self._last_mac = _GENESIS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.locked():
            if not self.path.exists():
                if self.head_path.exists():
                    raise LedgerIntegrityError(f"{self.path}: the ledger file is missing but its head exists (deleted?)")
                if self.anchor_path is not None and self.anchor_path.exists():
                    raise LedgerIntegrityError(f"{self.path}: the ledger file is missing but its anchor "
                                               f"{self.anchor_path} exists (deleted?)")
                self._create()
            self._key = self._read_key()
            self.verify()

    # ------------------------------------------------------------------ lock
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the ledger's exclusive file lock (``fcntl.flock`` on ``<ledger>.lock``); re-entrant per object.

        Every reader-writer takes it, in this process or another, so a check and the write
        it leads to are one step for every other ledger object.
        """
        if self._lock_depth == 0:
            fh = open(self.lock_path, "a")
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)  # waits for the holder
            self._lock_file = fh
        self._lock_depth += 1
        try:
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
                self._lock_file.close()
                self._lock_file = None

    # ------------------------------------------------------------------ files
    def _create(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.key_path.exists():
            fd = os.open(self.key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32) + "\n")
        self.path.write_text("")
        self._key = self._read_key()
        self._write_head(0, _GENESIS)
        self._write_anchor(0, _GENESIS)

    def _read_key(self) -> bytes:
        try:
            text = self.key_path.read_text().strip()
        except OSError as exc:
            raise LedgerIntegrityError(f"{self.path}: its key file {self.key_path.name} cannot be read ({exc.strerror})") from None
        if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
            raise LedgerIntegrityError(f"{self.path}: its key file {self.key_path.name} is not a ledger key")
        return bytes.fromhex(text)

    def _mac(self, previous: str, body: str) -> str:
        return hmac.new(self._key, (previous + "\n" + body).encode(), hashlib.sha256).hexdigest()

    def _write_head(self, count: int, last: str) -> None:
        anchored = self.anchor_path is not None or self.anchored
        body = json.dumps({"format": _FORMAT, "lines": count, "last": last, "anchored": anchored}, sort_keys=True)
        tmp = self.head_path.with_name(self.head_path.name + ".tmp")
        tmp.write_text(json.dumps({"head": body, "mac": self._mac("head", body)}) + "\n")
        os.replace(tmp, self.head_path)

    def _write_anchor(self, count: int, last: str) -> None:
        if self.anchor_path is None:
            return
        self.anchor_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.anchor_path.with_name(self.anchor_path.name + ".tmp")
        tmp.write_text(json.dumps({"format": _ANCHOR_FORMAT, "lines": count, "last": last}) + "\n")
        os.replace(tmp, self.anchor_path)

    def _check_anchor(self, macs: list[str], anchored: bool) -> None:
        """The ledger (its line MACs ``macs``) must extend the anchor's state.

        ``anchored``: the head says an anchor was kept; then it must be present (opened without
        one, e.g. to read a report, nothing is checked).  An unanchored ledger opened with an
        anchor is anchored from now on.
        """
        self.anchored = anchored
        if self.anchor_path is None:
            return
        last = macs[-1] if macs else _GENESIS
        if not self.anchor_path.exists():
            if anchored:
                raise LedgerIntegrityError(f"{self.path}: its anchor {self.anchor_path} is missing (deleted or moved?)")
            self._write_anchor(len(macs), last)
            self._write_head(len(macs), last)
            self.anchored = True
            return
        try:
            fields = json.loads(self.anchor_path.read_text())
            count, last = int(fields["lines"]), str(fields["last"])
            if fields.get("format") != _ANCHOR_FORMAT:
                raise ValueError
        except (OSError, ValueError, KeyError, TypeError):
            raise LedgerIntegrityError(f"{self.path}: its anchor {self.anchor_path} is not a ledger anchor") from None
        if count > len(macs) or (macs[count - 1] if count else _GENESIS) != last:
            raise LedgerIntegrityError(
                f"{self.path}: it does not extend its anchor {self.anchor_path} ({len(macs)} line(s), the anchor "
                f"records {count}): the ledger was rolled back, deleted or replaced"
            )

    # ------------------------------------------------------------------ checks
    def verify(self) -> None:
        """Re-read the file and check every line's MAC chain, the head and the anchor; raise
        :class:`LedgerIntegrityError`.  Under the lock: a write in progress is never half-read."""
        with self.locked():
            self._verify()

    def _verify(self) -> None:
        try:
            head = json.loads(self.head_path.read_text())
            body, mac = head["head"], head["mac"]
            fields = json.loads(body)
        except (OSError, ValueError, KeyError, TypeError):
            raise LedgerIntegrityError(f"{self.path}: its head file {self.head_path.name} is missing or damaged") from None
        if not hmac.compare_digest(mac, self._mac("head", body)) or fields.get("format") != _FORMAT:
            raise LedgerIntegrityError(f"{self.path}: its head file {self.head_path.name} does not check out")
        entries, analyses, plans, finished, policies, macs, previous = [], [], {}, set(), [], [], _GENESIS
        count_checks: dict[tuple[str, str], bool] = {}
        lines = self.path.read_text().splitlines()
        for number, line in enumerate(lines, start=1):
            try:
                row = json.loads(line)
                body, mac = row["body"], row["mac"]
                record = json.loads(body)
            except (ValueError, KeyError, TypeError):
                raise LedgerIntegrityError(f"{self.path}: line {number} is not a ledger line") from None
            if not hmac.compare_digest(mac, self._mac(previous, body)):
                raise LedgerIntegrityError(f"{self.path}: line {number} was changed, moved or inserted")
            previous = mac
            macs.append(mac)
            kind, analysis = record.get("kind"), str(record.get("analysis"))
            if kind == "start":
                if analysis not in analyses:
                    analyses.append(analysis)
                plans[analysis] = [event_from_dict(e) for e in record.get("plan", [])]
                finished.discard(analysis)
                if "policy" in record:
                    policies.append(dict(record["policy"]))
            elif kind == "release":
                entries.append(LedgerEntry(analysis, int(record["round"]), str(record["block"]),
                                           event_from_dict(record["event"])))
                if "passed" in record:
                    count_checks[(analysis, str(record["block"]).removeprefix("subjects/"))] = bool(record["passed"])
            elif kind == "finish":
                finished.add(analysis)
            else:
                raise LedgerIntegrityError(f"{self.path}: line {number} has an unknown kind")
        if fields["lines"] != len(lines) or fields["last"] != previous:
            raise LedgerIntegrityError(
                f"{self.path}: it holds {len(lines)} line(s) but its head records {fields['lines']}: lines were removed or added"
            )
        self._check_anchor(macs, bool(fields.get("anchored", False)))
        self.entries, self.analyses, self._last_mac, self._lines = entries, analyses, previous, len(lines)
        self.plans, self.open_analyses, self.policies = plans, set(plans) - finished, policies
        self.count_checks = count_checks

    # ------------------------------------------------------------------ recording
    def _append(self, records: Iterable[dict[str, Any]], check: Callable[[], None] | None = None) -> None:
        """Append ``records`` under the lock, after re-reading the ledger and ``check()`` (which may refuse by raising)."""
        with self.locked():
            self.verify()  # another process may have appended since this object was opened
            if check is not None:
                check()
            lines, previous = [], self._last_mac
            for record in records:
                body = json.dumps(record, sort_keys=True)
                previous = self._mac(previous, body)
                lines.append(json.dumps({"body": body, "mac": previous}))
            if not lines:
                return
            with self.path.open("a") as fh:
                fh.write("".join(line + "\n" for line in lines))
                fh.flush()
                os.fsync(fh.fileno())
            self._write_head(self._lines + len(lines), previous)
            self._write_anchor(self._lines + len(lines), previous)
            self.verify()

    def start(self, analysis: str, plan: Iterable[dp_event.DpEvent] = (), policy: dict[str, Any] | None = None,
              admit: Callable[["SiteLedger"], None] | None = None) -> None:
        """Admit ``analysis`` (an id the site chose or the run's name), reserving its whole planned spend.

        Under the ledger's lock: re-read the ledger, let ``admit(self)`` refuse (it raises; it
        sees every recorded release and every running analysis' reservation), then append
        the ``start`` line with ``plan`` (the analysis' DpEvents over all its rounds) and
        ``policy`` (what the site's policy was: ``sha256``, ``lifetime_epsilon``, ``delta``).
        """
        record: dict[str, Any] = {"kind": "start", "analysis": str(analysis), "plan": [event_to_dict(e) for e in plan]}
        if policy is not None:
            record["policy"] = policy
        self._append([record], check=None if admit is None else lambda: admit(self))

    def finish(self, analysis: str) -> None:
        """``analysis`` ended: what it reserved and did not spend is given back (no-op if it is not running)."""
        with self.locked():
            self.verify()
            if str(analysis) in self.open_analyses:
                self._append([{"kind": "finish", "analysis": str(analysis)}])

    def record(self, analysis: str, round: int, releases: Iterable[tuple[str, dp_event.DpEvent]]) -> None:
        """Append the releases ``[(block, DpEvent)]`` a step of ``analysis`` made in ``round``.

        An analysis admitted with a plan may only spend what it reserved: releases beyond the unspent part of its
        plan, or after it finished, raise :class:`BeyondPlanError` and are not recorded (the site then does not
        send them).  A coordinator that asks for more rounds than it announced, or repeats a round, is refused."""
        releases, analysis = list(releases), str(analysis)

        def within_plan() -> None:
            if self.plans.get(analysis):  # an analysis admitted with a plan (a guard always gives one)
                left = self._unspent(analysis) if analysis in self.open_analyses else Counter()
                if Counter(event for _, event in releases) - left:
                    raise BeyondPlanError(f"analysis {analysis!r} asked for releases beyond the plan the site admitted "
                                          f"(round {int(round)}; {sum(left.values())} planned release(s) left)")

        self._append(({"kind": "release", "analysis": analysis, "round": int(round), "block": str(block),
                       "event": event_to_dict(event)} for block, event in releases), check=within_plan)

    def record_count_check(self, analysis: str, view: str, event: dp_event.DpEvent, passed: bool) -> None:
        """Append the release of a noisy subject count of ``view`` for ``analysis`` and its outcome.

        The outcome (whether the noisy count reached the site's minimum) is the one released
        value a ledger holds: the coordinator learns it anyway, from the site taking part or not.
        """
        self._append([{"kind": "release", "analysis": str(analysis), "round": 1, "block": f"subjects/{view}",
                       "event": event_to_dict(event), "passed": bool(passed)}])

    # ------------------------------------------------------------------ queries
    def events(self) -> list[dp_event.DpEvent]:
        """Every recorded event, in order."""
        return [e.event for e in self.entries]

    def reserved(self) -> list[dp_event.DpEvent]:
        """The unspent part of every running analysis' plan: its planned events minus those it recorded."""
        out: list[dp_event.DpEvent] = []
        for analysis in sorted(self.open_analyses):
            out.extend(self._unspent(analysis).elements())
        return out

    def _unspent(self, analysis: str) -> Counter:
        """The events of ``analysis``' plan it has not recorded yet (a multiset)."""
        return Counter(self.plans[analysis]) - Counter(e.event for e in self.entries if e.analysis == analysis)

    def epsilon(self, delta: float, extra_events: Iterable[dp_event.DpEvent] = ()) -> float:
        """Lifetime epsilon at ``delta`` of every release recorded, every running analysis' unspent
        reservation (:meth:`reserved`) and ``extra_events`` (e.g. a planned analysis)."""
        events = self.events() + self.reserved() + list(extra_events)
        return epsilon_of_events(events, delta) if events else 0.0
