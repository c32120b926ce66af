"""``fedhier flower link`` and ``fedhier flower site`` pass SIGTERM/SIGINT on to the Flower processes they run.

The wrappers are started as a user starts them (a ``fedhier`` process), on free loopback ports;
the signal goes to the wrapper's PID only (as ``kill PID`` or systemd does), and the test
checks that ``flower-superlink`` / ``flower-supernode`` and everything they started are gone
and that the wrapper exited with 128 + the signal.  Every process is killed by PID at the end,
pass or fail.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedhier[flower]')")

from fedhier.cli.flower import free_ports  # noqa: E402

from procs import descendants, running  # noqa: E402

pytestmark = pytest.mark.integration

#: generous: Flower processes start slowly on a loaded machine; every wait polls and ends as soon as it can
DEADLINE = 180.0


def _fedhier(args: list[str], log: Path) -> subprocess.Popen:
    code = "import sys; from fedhier.cli import main; sys.exit(main())"
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-c", code, *args], stdout=out, stderr=subprocess.STDOUT)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _wait(condition, what: str, log: Path) -> None:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} within {DEADLINE:g} s; log:\n{log.read_text(errors='replace')[-3000:]}")


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _flower_children(wrapper: subprocess.Popen, name: str) -> list[int]:
    return [pid for pid in descendants(wrapper.pid) if name in _cmdline(pid)]


def _stop_and_check(wrapper: subprocess.Popen, sig: int, name: str, log: Path) -> None:
    """Send ``sig`` to the wrapper only; its Flower process (and helpers) must end, and then the wrapper."""
    started = descendants(wrapper.pid)
    assert any(name in _cmdline(pid) for pid in started), f"no {name} below the wrapper"
    wrapper.send_signal(sig)
    _wait(lambda: wrapper.poll() is not None, f"the wrapper did not exit after {sig.name}", log)
    _wait(lambda: not any(running(pid) for pid in started), f"{name} or its helpers still run after {sig.name}", log)
    assert wrapper.returncode == 128 + sig, log.read_text(errors="replace")[-3000:]
    assert "fedhier/cli" not in log.read_text(errors="replace")  # no traceback through the wrapper


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_link_and_site_wrappers_stop_their_flower_processes(tmp_path, sig):
    link_port, node_port = free_ports(2)
    data = tmp_path / "site.csv"
    data.write_text("a,b\n1,2\n3,4\n")
    procs: list[subprocess.Popen] = []
    seen: set[int] = set()
    try:
        link = _fedhier(["flower", "link", "--insecure", "--host", "127.0.0.1", "--port", str(link_port)], tmp_path / "link.log")
        procs.append(link)
        _wait(lambda: _listening(link_port), "the SuperLink did not listen", tmp_path / "link.log")
        site = _fedhier(["flower", "site", "--site", "hospital-a", "--data", str(data), "--superlink", f"127.0.0.1:{link_port}",
                         "--insecure", "--port", str(node_port)], tmp_path / "site.log")
        procs.append(site)
        # both up: the SuperLink has started its helper, the SuperNode has logged its start
        _wait(lambda: _flower_children(link, "flower-superexec"), "the SuperLink started no flower-superexec", tmp_path / "link.log")
        _wait(lambda: _flower_children(site, "flower-supernode") and "INFO" in (tmp_path / "site.log").read_text(errors="replace"),
              "no flower-supernode started", tmp_path / "site.log")
        seen.update(descendants(link.pid) + descendants(site.pid))

        _stop_and_check(site, sig, "flower-supernode", tmp_path / "site.log")
        _stop_and_check(link, sig, "flower-superlink", tmp_path / "link.log")
    finally:
        for proc in procs:
            seen.update(descendants(proc.pid))
        for pid in [*seen, *(p.pid for p in procs)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in procs:
            proc.wait(timeout=60)


def test_run_wrapper_passes_sigterm_to_flwr_run_and_stops_the_fit(tmp_path):
    import json

    from fedhier.cli.flower import LoopbackFederation, write_demo_sites

    config = write_demo_sites(tmp_path / "sites", n_rounds=20)
    names = ["hospital-a", "hospital-b", "hospital-c"]
    out, log = tmp_path / "out", tmp_path / "run.log"
    cluster = LoopbackFederation(tmp_path / "cluster", {n: tmp_path / "sites" / f"{n}.csv" for n in names}, site_seed=0)
    wrapper = None
    started: list[int] = []
    try:
        wrapper = _fedhier(["flower", "run", "--config", str(config), "--superlink", cluster.address, "--insecure",
                            "--out", str(out)], log)

        def rounds() -> int:
            try:
                return len(json.loads((out / "history.json").read_text()))
            except (OSError, ValueError):
                return 0

        _wait(lambda: rounds() >= 1 or wrapper.poll() is not None, "no round completed", log)
        assert wrapper.poll() is None, log.read_text(errors="replace")[-3000:]
        started = descendants(wrapper.pid)
        assert any("flwr" in _cmdline(pid) for pid in started)
        wrapper.send_signal(signal.SIGTERM)
        _wait(lambda: wrapper.poll() is not None, "the wrapper did not exit after SIGTERM", log)
        _wait(lambda: not any(running(pid) for pid in started), "flwr run still runs after SIGTERM", log)
        text = log.read_text(errors="replace")
        assert wrapper.returncode == 128 + signal.SIGTERM and "fedhier: interrupted" in text, text[-3000:]
        assert "fedhier/cli" not in text
        # the fit was stopped at the SuperLink: its summary ends "failed" and no round is added any more
        assert json.loads((out / "summary.json").read_text())["status"] == "failed"
    finally:
        if wrapper is not None:
            for pid in [*started, *descendants(wrapper.pid), wrapper.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            wrapper.wait(timeout=60)
        cluster.stop()
