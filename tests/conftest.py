"""Shared fixtures."""

import importlib.util
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
