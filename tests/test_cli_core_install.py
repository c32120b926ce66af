"""Every command on the core install (no optional package): it works, or it says in one line which extra it needs.

Each command runs in its own ``fedhier`` process with the optional packages of pyproject.toml's extras
(pandas, statsmodels, flwr, mpi4py, torch) hidden by a ``sitecustomize`` module on PYTHONPATH, whose
import hook raises ModuleNotFoundError for them, as on the install ``make demo`` creates.  Nothing may
print a traceback; a command that needs an extra exits with 2 and prints exactly one line that names
the command, the package and the extra.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = ("pandas", "statsmodels", "flwr", "mpi4py", "torch")

BLOCKER = f'''
import sys

HIDDEN = {set(HIDDEN)!r}


class _NotInstalled:
    """As if the optional packages were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
'''


def test_the_hidden_packages_are_those_of_the_extras():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    # the test and docs extras build and check the project; the others are what commands need
    optional = {req.split(">")[0].split("=")[0].split("<")[0].strip() for name, reqs in extras.items() if name not in ("test", "docs")
                for req in reqs} - {"mpich"}  # mpich: the MPI library under mpi4py, not a Python module
    assert optional == set(HIDDEN)
    from fedhier.cli.console import EXTRAS

    assert set(EXTRAS) == set(HIDDEN) and all(package in " ".join(extras[EXTRAS[package]]) for package in HIDDEN)


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    """A folder with the blocker, small user files and a fitted CollabDict model; ``run(args)`` runs ``fedhier ARGS`` there."""
    root = tmp_path_factory.mktemp("core")
    (root / "hide").mkdir()
    (root / "hide" / "sitecustomize.py").write_text(BLOCKER)
    rng = np.random.default_rng(0)
    rows = ["site,a,b,c,y"] + [f"{s},{x[0]:.4f},{x[1]:.4f},{x[2]:.4f},{x @ [1, -1, 0.5] + rng.normal():.4f}"
                               for s in ("north", "south", "east") for x in rng.normal(size=(30, 3))]
    (root / "pooled.csv").write_text("\n".join(rows) + "\n")
    for name in ("north", "south"):
        (root / f"{name}.csv").write_text("a,b,c\n" + "\n".join(",".join(f"{v:.4f}" for v in x) for x in rng.normal(size=(30, 3))) + "\n")
    (root / "fit.toml").write_text(
        'n_components = 1\nn_rounds = 2\n[views]\nfirst = ["a", "b"]\nsecond = ["c"]\n'
        '[[sites]]\nname = "north"\npath = "north.csv"\n[[sites]]\nname = "south"\npath = "south.csv"\n')
    from fedhier.estimators.collab import CollabDict

    CollabDict(n_components=2, max_iter=2, random_state=0).fit([rng.normal(size=(20, 3)) for _ in range(3)]).save(root / "collab.npz")

    def run(args: list[str]) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "hide"), str(ROOT / "src")]), "FEDHIER_DEBUG": ""}
        code = "import sys; from fedhier.cli import main; sys.exit(main())"
        return subprocess.run([sys.executable, "-c", code, *args], cwd=root, env=env, capture_output=True, text=True)

    return run


#: commands of the core install: they run to the end
CORE = [
    ["demo", "--rounds", "2", "--quiet", "--out", "demo-report"],
    ["fit", "--config", "fit.toml", "--out", "fit-out", "--quiet"],
    ["fit", "linear", "pooled.csv", "--site", "site", "--target", "y", "--features", "a,b,c", "--rounds", "2", "--out", "lin"],
    ["experiment", "list"],
    ["collab", "fit", "--csv", "pooled.csv", "--site-column", "site", "--columns", "a,b,c", "--max-iter", "2", "--quiet",
     "--out", "collab-fit"],
    ["collab", "score", "--model", "collab.npz", "--csv", "pooled.csv", "--site", "0", "--columns", "a,b,c", "--out", "s.csv"],
    ["flower", "certs", "--out", "certs"],
    ["flower", "key", "--out", "site.key"],
    ["flower", "demo-data", "--out", "demo-sites"],
    ["flower", "link", "--insecure", "--print-command"],
    ["flower", "site", "--site", "north", "--data", "north.csv", "--superlink", "127.0.0.1:9091", "--insecure", "--print-command"],
]

#: commands that need an extra: (arguments, package, extra)
NEEDS_EXTRA = [
    (["experiment", "fedlin-radon", "--quick", "--out", "radon"], "statsmodels", "stats"),
    (["flower", "link", "--insecure", "--host", "127.0.0.1", "--port", "9"], "flwr", "flower"),
    (["flower", "site", "--site", "north", "--data", "north.csv", "--superlink", "127.0.0.1:9", "--insecure"], "flwr", "flower"),
    (["flower", "run", "--config", "demo-sites/fit.toml", "--superlink", "127.0.0.1:9", "--insecure"], "flwr", "flower"),
]


@pytest.mark.parametrize("args", CORE, ids=[" ".join(a[:2]) for a in CORE])
def test_core_commands_run_without_the_optional_packages(core, args):
    proc = core(args)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "ModuleNotFoundError" not in proc.stderr + proc.stdout


@pytest.mark.parametrize("args, package, extra", NEEDS_EXTRA, ids=[" ".join(a[:2]) for a, _, _ in NEEDS_EXTRA])
def test_a_command_that_needs_an_extra_says_so_in_one_line(core, args, package, extra):
    if args[:2] == ["flower", "run"]:
        assert core(["flower", "demo-data", "--out", "demo-sites"]).returncode == 0
    proc = core(args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    command = " ".join(["fedhier", *args[:2]]) if args[0] != "experiment" else f"fedhier experiment {args[1]}"
    assert lines[0].startswith(f"fedhier: error: `{command}` needs the optional package {package}"), lines[0]
    assert f'pip install -e ".[{extra}]"' in lines[0]
    assert "Traceback" not in proc.stdout

