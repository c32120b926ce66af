"""Memory a malicious model file or checkpoint makes the loaders allocate, measured in one run.

    PYTHONPATH=src python benchmarks/bomb_files.py

Builds two small files as an attacker would and loads them under ``tracemalloc``:

* a FedMVPPCA model file of about 1 MiB whose ``v0/W`` array header declares 2**27
  doubles (1 GiB), followed by 1 MiB of data;
* a checkpoint of a few kB whose metadata declares ten million sites.

It prints each file's size, the peak traced allocation of loading it and the outcome.
Run it on a tree before and after a change to compare (docs/privacy.md, "Files and error
messages", quotes one such pair).
"""

from __future__ import annotations

import io
import json
import sys
import tempfile
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np

from fedhier import FedMVPPCA
from fedhier.runtime.checkpoint import read_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "privacy"))
from test_attacks_files import npy_bytes as _npy, replace_members as _replace  # noqa: E402  the attack tests' file builders


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="fedhier-bombs-"))
    rng = np.random.default_rng(3)
    W = rng.normal(size=(6, 2))
    sites = [{"v0": rng.normal(size=(40, 2)) @ W.T + 0.3 * rng.normal(size=(40, 6))} for _ in range(3)]
    model = tmp / "model.npz"
    FedMVPPCA(n_components=2, n_rounds=2, n_local_iter=2, n_first_iter=3, random_state=0).fit(sites).save(model)
    _replace(model, {"v0/W": _npy(header_shape=(2**27,), payload=bytes(2**20))})
    checkpoint = tmp / "checkpoint.npz"
    FedMVPPCA(n_components=2, n_rounds=1, n_local_iter=2, n_first_iter=3, random_state=0).fit(sites, checkpoint=checkpoint)
    with zipfile.ZipFile(checkpoint) as zf:
        meta = json.loads(np.load(io.BytesIO(zf.read("__meta__.npy"))).tobytes())
    meta["n_sites"] = 10_000_000
    _replace(checkpoint, {"__meta__": _npy(np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))})
    for name, path, load in (("model file declaring 1 GiB", model, FedMVPPCA.load),
                             ("checkpoint declaring 10^7 sites", checkpoint, read_checkpoint)):
        tracemalloc.start()
        try:
            load(path)
            outcome = "loaded"
        except Exception as exc:  # the outcome is what we report
            outcome = f"refused ({type(exc).__name__})"
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"{name}: file {path.stat().st_size:,} bytes, peak traced allocation {peak / 2**20:.2f} MiB ({peak:,} bytes), {outcome}")


if __name__ == "__main__":
    main()
