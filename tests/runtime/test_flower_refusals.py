"""Flower refuses the sites' ClientApps: the coordinator says why at once, and no SuperNode piles up processes.

Integration (marked): a real ``flower-superlink`` and three ``flower-supernode`` processes on
127.0.0.1 whose ``flwr-clientapp`` is a stand-in that sleeps longer than Flower's heartbeat
period before starting the real one, as a ClientApp does on a host whose cores are busy.  Flower
refuses every such start ("Runtime task-token authentication failed") and puts the task back to
pending; its own SuperExec would launch another process at once, and another.  About 80 s.
"""

import json
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from procs import descendants, running  # noqa: E402

from fedhier.cli.flower import LoopbackFederation, cli_flower, write_demo_sites  # noqa: E402
from fedhier.runtime.flower import HEARTBEAT_PERIOD, START_WINDOW  # noqa: E402

SITES = ("hospital-a", "hospital-b", "hospital-c")


def _clientapps(pid: int) -> int:
    """ClientApp processes (the stand-in or Flower's, not zombies) below ``pid``."""
    count = 0
    for child in descendants(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        count += b"flwr-clientapp" in command and running(child)
    return count


@pytest.mark.integration
def test_clientapps_flower_refuses_stop_the_fit_before_round_1_with_the_cause_and_no_process_storm(tmp_path):
    folder = tmp_path / "sites"
    fit = write_demo_sites(folder, n_sites=3, seed=3, n_components=2, n_rounds=3)
    fit.write_text(fit.read_text().replace("round_timeout = 300.0", "round_timeout = 900.0"))
    real = Path(sys.executable).parent / "flwr-clientapp"
    slow = tmp_path / "slow-bin"
    slow.mkdir()
    stand_in = slow / "flwr-clientapp"
    stand_in.write_text(f'#!/bin/sh\nsleep {HEARTBEAT_PERIOD + 10:g}\nexec "{real}" "$@"\n')
    stand_in.chmod(0o755)

    cluster = LoopbackFederation(tmp_path / "federation", {s: folder / f"{s}.csv" for s in SITES}, path=[slow])
    most = dict.fromkeys(SITES, 0)  # the most ClientApp processes each SuperNode ran at once
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            for site in SITES:
                most[site] = max(most[site], _clientapps(cluster.procs[site].pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    out = tmp_path / "fit"
    try:
        sampler.start()
        t0 = time.monotonic()
        code = cli_flower(["run", "--config", str(fit), "--superlink", cluster.address, "--insecure", "--timeout", "900",
                           "--out", str(out)])
        elapsed = time.monotonic() - t0
        time.sleep(HEARTBEAT_PERIOD + 5)  # Flower goes on relaunching the refused starts after the run: sample on
    finally:
        sampling.set()
        sampler.join(timeout=30)
        stopped = cluster.stop()
    summary = json.loads((out / "summary.json").read_text())
    assert code == 1 and summary["status"] == "failed" and summary["round"] == 1, cluster.logs()
    error = summary["error"]
    assert "\n" not in error and error.startswith("round 1: 0 site(s) answered before the round, at least 2 needed")
    assert f"its ClientApp did not start within Flower's heartbeat window ({START_WINDOW:g} s)" in error
    assert error.count("heartbeat window") == 1 and "lower the host's load" in error
    assert elapsed < 900, elapsed  # the start window ended the fit, not round_timeout
    # every SuperNode started the stand-in, whose starts Flower refused, but never ran two at once: its one message
    assert most == dict.fromkeys(SITES, 1), most
    assert not [pid for pid in stopped if running(pid)]
