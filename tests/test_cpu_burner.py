"""The CPU burner that holds the machine busy for ``make test-integration-busy`` and the benchmarks."""

import importlib.util
import os
import time
from pathlib import Path

spec = importlib.util.spec_from_file_location("cpu_burner", Path(__file__).parents[1] / "benchmarks" / "cpu_burner.py")
cpu_burner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_burner)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_burner_spins_per_core_processes_and_stops_each_by_pid():
    with cpu_burner.CpuBurner(per_core=2) as burner:
        procs = list(burner.procs)
        pids = [p.pid for p in procs]
        assert len(pids) == 2 * os.cpu_count()
        deadline = time.monotonic() + 60
        while not all(_cpu_seconds(pid) > 0.05 for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_cpu_seconds(pid) > 0.05 for pid in pids)  # each one burns CPU
    assert burner.procs == [] and all(p.returncode is not None for p in procs)  # each one reaped


def test_a_burner_nobody_stops_ends_by_itself():
    burner = cpu_burner.CpuBurner(per_core=1, max_seconds=0.2).start()
    for proc in burner.procs:
        assert proc.wait(timeout=60) == 0  # ended after max_seconds, not killed
    burner.stop()
