"""Shared fixtures."""

import importlib.util
import os
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def example():
    """``example(name)`` loads ``examples/<name>.py`` as a module, so a test can reuse an example's data
    (and the example stays importable)."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session", autouse=True)
def busy_machine():
    """With ``FEDHIER_BUSY=N`` (``make test-integration-busy``), the whole session runs with N busy processes per
    core (``benchmarks/cpu_burner.py``), stopped by PID at the end: the tests as on a loaded host."""
    per_core = os.environ.get("FEDHIER_BUSY", "")
    if not per_core:
        yield None
        return
    spec = importlib.util.spec_from_file_location("cpu_burner", EXAMPLES.parent / "benchmarks" / "cpu_burner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with module.CpuBurner(per_core=int(per_core)) as burner:
        yield burner
