"""A site's own record of every release it ever made, across analyses (append-only, integrity-checked).

:class:`~fedhier.privacy.ledger.PrivacyLedger` accounts one fit; a site that takes part in
many analyses needs the composition of *all* of them to enforce a lifetime budget
(:class:`~fedhier.privacy.policy.SitePolicy`).  :class:`SiteLedger` keeps that record in
a file the site's administrator owns, next to the data:

* one JSON line per release: analysis id, round, block and its ``dp_accounting`` event
  (:func:`~fedhier.privacy.ledger.event_to_dict`), plus analysis starts;
* every line carries an HMAC-SHA256 over its content *and the previous line's MAC* (a
  chain), keyed by a secret kept in ``<ledger>.key`` (created with mode 0600 on first
  use); a head file ``<ledger>.head`` holds the number of lines and the last MAC, also
  authenticated.  Editing, reordering, deleting or truncating lines, or replacing the head,
  is detected by :meth:`SiteLedger.verify` (every open verifies) without the key holder's
  cooperation being forgeable;
* the lifetime epsilon is dp_accounting's PLD composition of every recorded event
  (:func:`~fedhier.privacy.ledger.epsilon_of_events`), never a hand-made sum.

Only events are recorded -- never data, never a released value.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from dp_accounting import dp_event

from .ledger import epsilon_of_events, event_from_dict, event_to_dict

__all__ = ["SiteLedger", "LedgerIntegrityError", "LedgerEntry"]

_FORMAT = "fedhier.site_ledger/1"
_GENESIS = "0" * 64


class LedgerIntegrityError(RuntimeError):
    """The site ledger's file, its head or its key does not check out: it was edited, truncated or replaced."""

    #: its text names files and line numbers, never data
    public_message = True


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
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.key_path = self.path.with_name(self.path.name + ".key")
        self.head_path = self.path.with_name(self.path.name + ".head")
        if not self.path.exists():
            if self.head_path.exists():
                raise LedgerIntegrityError(f"{self.path}: the ledger file is missing but its head exists (deleted?)")
            self._create()
        self._key = self._read_key()
        self.entries: list[LedgerEntry] = []
        self.analyses: list[str] = []
        self._last_mac = _GENESIS
        self.verify()

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
        body = json.dumps({"format": _FORMAT, "lines": count, "last": last}, sort_keys=True)
        tmp = self.head_path.with_name(self.head_path.name + ".tmp")
        tmp.write_text(json.dumps({"head": body, "mac": self._mac("head", body)}) + "\n")
        os.replace(tmp, self.head_path)

    # ------------------------------------------------------------------ checks
    def verify(self) -> None:
        """Re-read the file and check every line's MAC chain and the head; raise :class:`LedgerIntegrityError`."""
        try:
            head = json.loads(self.head_path.read_text())
            body, mac = head["head"], head["mac"]
            fields = json.loads(body)
        except (OSError, ValueError, KeyError, TypeError):
            raise LedgerIntegrityError(f"{self.path}: its head file {self.head_path.name} is missing or damaged") from None
        if not hmac.compare_digest(mac, self._mac("head", body)) or fields.get("format") != _FORMAT:
            raise LedgerIntegrityError(f"{self.path}: its head file {self.head_path.name} does not check out")
        entries, analyses, previous = [], [], _GENESIS
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
            if record.get("kind") == "start":
                analyses.append(str(record["analysis"]))
            elif record.get("kind") == "release":
                entries.append(LedgerEntry(str(record["analysis"]), int(record["round"]), str(record["block"]),
                                           event_from_dict(record["event"])))
            else:
                raise LedgerIntegrityError(f"{self.path}: line {number} has an unknown kind")
        if fields["lines"] != len(lines) or fields["last"] != previous:
            raise LedgerIntegrityError(
                f"{self.path}: it holds {len(lines)} line(s) but its head records {fields['lines']}: lines were removed or added"
            )
        self.entries, self.analyses, self._last_mac, self._lines = entries, analyses, previous, len(lines)

    # ------------------------------------------------------------------ recording
    def _append(self, records: Iterable[dict[str, Any]]) -> None:
        self.verify()  # another process may have appended since this object was opened
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
        self.verify()

    def start(self, analysis: str) -> None:
        """Record that the site admitted ``analysis`` (an id the site chose or the run's name)."""
        self._append([{"kind": "start", "analysis": str(analysis)}])

    def record(self, analysis: str, round: int, releases: Iterable[tuple[str, dp_event.DpEvent]]) -> None:
        """Append the releases ``[(block, DpEvent)]`` a step of ``analysis`` made in ``round``."""
        self._append({"kind": "release", "analysis": str(analysis), "round": int(round), "block": str(block),
                      "event": event_to_dict(event)} for block, event in releases)

    # ------------------------------------------------------------------ queries
    def events(self) -> list[dp_event.DpEvent]:
        """Every recorded event, in order."""
        return [e.event for e in self.entries]

    def epsilon(self, delta: float, extra_events: Iterable[dp_event.DpEvent] = ()) -> float:
        """Lifetime epsilon at ``delta`` of every release recorded (plus ``extra_events``, e.g. a planned analysis)."""
        events = self.events() + list(extra_events)
        return epsilon_of_events(events, delta) if events else 0.0
