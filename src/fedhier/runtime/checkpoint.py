"""Checkpoints of a simulated fit: resume a long run after an interruption.

One ``.npz`` file (no pickle), rewritten atomically after every round: the broadcast, each
site's private state, the history so far and the seed.  Because every random draw is
derived from (seed, round, site), a fit resumed from round r gives bit for bit the result
of an uninterrupted fit.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..protocol.messages import Message
from ..utils.io import atomic_write_bytes

__all__ = ["Checkpoint", "write_checkpoint", "read_checkpoint"]

_FORMAT = "fedhier.checkpoint/1"


@dataclass
class Checkpoint:
    """State after ``round``: what :func:`fedhier.runtime.simulate` needs to go on."""

    protocol: str
    round: int
    seed: int
    broadcast: Message
    site_states: list[dict[str, np.ndarray]]
    history: list[dict[str, Any]]


def write_checkpoint(path: str | Path, checkpoint: Checkpoint) -> Path:
    arrays: dict[str, np.ndarray] = {f"broadcast/{k}": np.asarray(v) for k, v in checkpoint.broadcast.items()}
    for s, state in enumerate(checkpoint.site_states):
        arrays.update({f"state/{s}/{k}": np.asarray(v) for k, v in state.items()})
    meta = {
        "format": _FORMAT,
        "protocol": checkpoint.protocol,
        "round": checkpoint.round,
        "seed": checkpoint.seed,
        "n_sites": len(checkpoint.site_states),
        "history": checkpoint.history,
    }
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return atomic_write_bytes(path, buf.getvalue())


def read_checkpoint(path: str | Path) -> Checkpoint:
    """The checkpoint in ``path``; ValueError if the file is not one (it is never unpickled)."""
    try:
        data = np.load(Path(path), allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a fedhier checkpoint ({exc})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: not a fedhier checkpoint (a single array, not an .npz archive)")
    with data:
        if "__meta__" not in data.files:
            raise ValueError(f"{path}: not a fedhier checkpoint")
        meta = json.loads(data["__meta__"].tobytes().decode())
        if meta.get("format") != _FORMAT:
            raise ValueError(f"{path}: unsupported checkpoint format {meta.get('format')!r}")
        broadcast = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith("broadcast/")}
        states: list[dict[str, np.ndarray]] = [{} for _ in range(meta["n_sites"])]
        for k in data.files:
            if k.startswith("state/"):
                _, s, name = k.split("/", 2)
                states[int(s)][name] = data[k]
    return Checkpoint(meta["protocol"], meta["round"], meta["seed"], broadcast, states, meta["history"])
