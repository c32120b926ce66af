"""What a ClientApp process imports: Flower starts a fresh one for every message, so its imports are paid by every
site in every round (``python benchmarks/bench_flower.py --start-only`` measures that start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedhier[flower]')")

import fedhier  # noqa: E402
from fedhier.cli.flower import write_demo_sites  # noqa: E402
from fedhier.deploy.mvppca import FlowerFitConfig  # noqa: E402
from fedhier.protocol.messages import decode  # noqa: E402
from fedhier.runtime.flower import site_round  # noqa: E402
from fedhier.runtime.simulate import encode_site_broadcast, server_update  # noqa: E402

#: packages a site step has no use for; importing any of them costs a ClientApp process 0.1 CPU s or more
HEAVY = ("scipy", "sklearn", "pandas", "matplotlib", "torch", "dp_accounting")

#: a fresh process, as Flower's ``flwr-clientapp``: load the app module, then answer one round request
CLIENT_PROCESS = """
import json, sys
from pathlib import Path
import fedhier.runtime.flower_app.client_app  # the module Flower loads
from fedhier.deploy import fit_from_json
from fedhier.runtime.flower import site_round

fit, site, data, broadcast, seed = sys.argv[1:6]
request = {"round": 2, "broadcast": Path(broadcast).read_bytes()}
fields, _ = site_round(fit_from_json(Path(fit).read_text()), site, data, request, {}, site_seed=int(seed))
heavy = sorted({name.split(".")[0] for name in sys.modules} & set(json.loads(sys.argv[6])))
print(json.dumps({"status": fields["status"], "reply": fields.get("reply", b"").hex(), "heavy": heavy}))
"""


def test_a_later_round_s_site_step_in_a_fresh_client_app_process_imports_no_scipy(tmp_path):
    path = write_demo_sites(tmp_path, n_sites=3, seed=0, n_components=3, n_rounds=3, n_local_iter=4, n_first_iter=8)
    config = FlowerFitConfig.read(path)
    protocol = config.protocol()
    first = protocol.initial_broadcast()
    replies = {}
    for index, site in enumerate(config.sites):
        request = {"round": 1, "broadcast": encode_site_broadcast(protocol, first, index)}
        fields, _ = site_round(config, site, tmp_path / f"{site}.csv", request, {}, site_seed=index)
        assert fields["status"] == "ok", fields
        replies[index] = decode(protocol.reply_spec, fields["reply"])
    second, *_ = server_update(protocol, replies, 1, first, seed=config.seed)
    broadcast = tmp_path / "round-2.fhm"
    broadcast.write_bytes(encode_site_broadcast(protocol, second, 0))
    site = config.sites[0]
    fit = tmp_path / "fit.json"
    fit.write_text(config.to_json())

    env = {**os.environ, "PYTHONPATH": str(Path(fedhier.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", CLIENT_PROCESS, str(fit), site, str(tmp_path / f"{site}.csv"),
                          str(broadcast), "5", json.dumps(HEAVY)], capture_output=True, text=True, env=env, check=True)
    answer = json.loads(out.stdout.splitlines()[-1])

    expected, _ = site_round(config, site, tmp_path / f"{site}.csv", {"round": 2, "broadcast": broadcast.read_bytes()}, {},
                             site_seed=5)
    assert answer["status"] == "ok"
    assert bytes.fromhex(answer["reply"]) == expected["reply"]  # the process ran the whole site step
    assert answer["heavy"] == []
