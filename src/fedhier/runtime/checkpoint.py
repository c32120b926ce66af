"""Checkpoints of a simulated fit: resume a long run after an interruption.

One ``.npz`` file (no pickle), rewritten atomically after every round: the broadcast, each
site's private state, the history so far, the seed and a :class:`Fingerprint` of the data
and configuration it belongs to (a resume on other data or settings is refused, naming
what differs).  Because every random draw is
derived from (seed, round, site), a fit resumed from round r gives bit for bit the result
of an uninterrupted fit.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..protocol.base import RoundProtocol
from ..protocol.messages import Message, MessageSpec
from ..utils.io import atomic_write_bytes, remove_stale_temporaries
from ..utils.untrusted import read_meta_json, read_npz

__all__ = ["Checkpoint", "Fingerprint", "write_checkpoint", "read_checkpoint"]

_FORMAT = "fedhier.checkpoint/2"


@dataclass(frozen=True)
class Fingerprint:
    """What a checkpoint belongs to: the sites' data and the protocol's configuration.

    ``sites`` holds, per site, HMAC-SHA256 keyed by the random ``salt`` of the site's
    :meth:`~fedhier.protocol.base.RoundProtocol.site_fingerprint` (a SHA-256 of its
    arrays).  The salt is stored with the checkpoint, so whoever holds the file can test a
    guess of a site's exact data (equality), nothing more; the salt makes digests of the
    same data differ between checkpoints, so two files cannot be linked by them.  This
    suits :func:`fedhier.runtime.simulate`, where the checkpoint is written by the process
    that holds the sites.  ``config`` maps each configuration item (protocol name, reply
    and broadcast fields, every :meth:`~fedhier.protocol.base.RoundProtocol.config_fingerprint`
    key) to a SHA-256 of its text.
    """

    salt: bytes
    sites: tuple[str, ...]
    config: dict[str, str]

    @classmethod
    def of(cls, protocol: RoundProtocol, sites: Sequence[Any], salt: bytes | None = None) -> "Fingerprint":
        salt = os.urandom(16) if salt is None else bytes(salt)
        digests = tuple(
            hmac.new(salt, protocol.site_fingerprint(s, data), hashlib.sha256).hexdigest() for s, data in enumerate(sites)
        )
        items = {
            "protocol": protocol.name,
            "reply fields": _spec_text(protocol.reply_spec),
            "broadcast fields": _spec_text(protocol.broadcast_spec),
            **{f"setting {k}": v for k, v in protocol.config_fingerprint().items()},
        }
        return cls(salt, digests, {k: hashlib.sha256(v.encode()).hexdigest() for k, v in items.items()})

    def to_dict(self) -> dict[str, Any]:
        return {"salt": self.salt.hex(), "sites": list(self.sites), "config": dict(self.config)}

    @classmethod
    def from_dict(cls, row: Any, what: str) -> "Fingerprint":
        try:
            fp = cls(bytes.fromhex(row["salt"]), tuple(str(s) for s in row["sites"]), {str(k): str(v) for k, v in row["config"].items()})
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ValueError(f"{what}: damaged checkpoint fingerprint") from None
        return fp

    def check_resume(self, protocol: RoundProtocol, sites: Sequence[Any], what: str) -> None:
        """ValueError naming what differs if this run's sites or configuration are not those of the checkpoint."""
        now = Fingerprint.of(protocol, sites, self.salt)
        config = sorted(k for k in set(self.config) | set(now.config) if self.config.get(k) != now.config.get(k))
        if config:
            raise ValueError(
                f"{what} was written by a differently configured {protocol.name!r} fit: {', '.join(config)} "
                "differ; delete the checkpoint or resume with the configuration it was written with"
            )
        other = [s for s, (a, b) in enumerate(zip(self.sites, now.sites)) if a != b]
        if other:
            raise ValueError(
                f"{what} belongs to other data: the data of site(s) {other} differ from those the checkpoint was "
                "written with; delete the checkpoint or resume on the same data"
            )


def _spec_text(spec: MessageSpec) -> str:
    return json.dumps([spec.name, [[k, f.dtype, list(f.shape), f.optional] for k, f in spec.fields.items()]])


@dataclass
class Checkpoint:
    """State after ``round``: what :func:`fedhier.runtime.simulate` needs to go on."""

    protocol: str
    round: int
    seed: int
    broadcast: Message
    site_states: list[dict[str, np.ndarray]]
    history: list[dict[str, Any]]
    fingerprint: Fingerprint | None = None
    #: what the coordinator's step carries between rounds (``RoundProtocol.coordinator_state``)
    coordinator: dict[str, np.ndarray] = field(default_factory=dict)


def write_checkpoint(path: str | Path, checkpoint: Checkpoint) -> Path:
    """Write ``checkpoint`` to ``path`` atomically; temporary files of ``path`` left by a process killed while
    writing it (an earlier run of the same fit) are removed, so a kill leaves no litter beyond the next round."""
    arrays: dict[str, np.ndarray] = {f"broadcast/{k}": np.asarray(v) for k, v in checkpoint.broadcast.items()}
    for s, state in enumerate(checkpoint.site_states):
        arrays.update({f"state/{s}/{k}": np.asarray(v) for k, v in state.items()})
    arrays.update({f"coordinator/{k}": np.asarray(v) for k, v in checkpoint.coordinator.items()})
    meta = {
        "format": _FORMAT,
        "protocol": checkpoint.protocol,
        "round": checkpoint.round,
        "seed": checkpoint.seed,
        "n_sites": len(checkpoint.site_states),
        "history": checkpoint.history,
        "fingerprint": None if checkpoint.fingerprint is None else checkpoint.fingerprint.to_dict(),
    }
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())
    remove_stale_temporaries(path)
    return Path(path)


def read_checkpoint(path: str | Path, *, n_sites: int | None = None) -> Checkpoint:
    """The checkpoint in ``path``; ValueError if the file is not one (it is never unpickled).

    The file is untrusted input: array sizes are checked against the file before they are
    read (:func:`fedhier.utils.untrusted.read_npz`), and the declared number of sites
    against ``n_sites`` (when given) and the history before any per-site structure is built.
    """
    what = f"{path}"
    try:
        arrays = read_npz(path, what)
    except ValueError as exc:
        raise ValueError(f"{path}: not a fedhier checkpoint ({exc})") from None
    if "__meta__" not in arrays:
        raise ValueError(f"{path}: not a fedhier checkpoint")
    meta = read_meta_json(arrays, "__meta__", what)
    if meta.get("format") == "fedhier.checkpoint/1":
        raise ValueError(f"{path}: written by an earlier fedhier that did not record which data it belongs to; delete it")
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{path}: unsupported checkpoint format {meta.get('format')!r}")
    declared = meta.get("n_sites")
    if isinstance(declared, bool) or not isinstance(declared, int) or declared < 1:
        raise ValueError(f"{path}: damaged checkpoint (n_sites {declared!r})")
    if n_sites is not None and declared != n_sites:
        raise ValueError(f"checkpoint {path} is for {declared} sites, not {n_sites}")
    history = meta.get("history")
    if not isinstance(history, list) or not history or not all(isinstance(h, dict) for h in history):
        raise ValueError(f"{path}: damaged checkpoint (history)")
    for h in history[:1]:  # every site is listed in each round's record: as replying, absent or failed
        listed = len(h.get("sites", ())) + len(h.get("absent", ())) + len(h.get("failed", ()))
        if listed < declared:
            raise ValueError(f"{path}: damaged checkpoint ({declared} sites declared, {listed} in the history)")
    broadcast = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("broadcast/")}
    coordinator = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("coordinator/")}
    states: list[dict[str, np.ndarray]] = [{} for _ in range(declared)]
    for k, v in arrays.items():
        if k.startswith("state/"):
            parts = k.split("/", 2)
            if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) >= declared:
                raise ValueError(f"{path}: damaged checkpoint (array {k!r})")
            states[int(parts[1])][parts[2]] = v
    fingerprint = meta.get("fingerprint")
    fingerprint = None if fingerprint is None else Fingerprint.from_dict(fingerprint, what)
    if fingerprint is not None and len(fingerprint.sites) != declared:
        raise ValueError(f"{path}: damaged checkpoint fingerprint")
    try:
        round_, seed = int(meta["round"]), int(meta["seed"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path}: damaged checkpoint (round or seed)") from None
    return Checkpoint(str(meta.get("protocol")), round_, seed, broadcast, states, history, fingerprint, coordinator)
