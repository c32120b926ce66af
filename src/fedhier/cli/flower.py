"""``fedhier flower ...``: deploy a fit on real machines with Flower (docs/flower.md).

Commands (``cli_flower(argv)``; the lead wires ``fedhier flower`` to it):

* ``fedhier flower certs --out DIR [--host H ...]`` -- a CA and a SuperLink certificate for TLS;
* ``fedhier flower key --out FILE`` -- a site's key pair for node authentication;
* ``fedhier flower link [--certificates DIR | --insecure] [--port P]`` -- start the SuperLink
  (the coordinator);
* ``fedhier flower site --site NAME --data site.csv --superlink HOST:PORT
  [--root-certificates ca.pem | --insecure]`` -- start a site's SuperNode on its own file;
* ``fedhier flower run --config fit.toml (--superlink HOST:PORT [...] | --federation NAME)`` --
  submit the fit to the SuperLink and wait for it;
* ``fedhier flower demo-data --out DIR [--model fedlin-hm2]`` -- three hospitals cut from the bundled Alzheimer
  data, or a fleet of machines (C-MAPSS engines) for FedLin.

Every command that starts a Flower process builds its command line with one of the
functions below (:func:`superlink_command`, :func:`supernode_command`, :func:`flwr_run_command`);
the integration test starts its processes with the same functions.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ..utils.untrusted import check_outputs_spare_inputs, check_site_name

__all__ = [
    "cli_flower",
    "superlink_command",
    "supernode_command",
    "flwr_run_command",
    "make_certificates",
    "make_site_key",
    "register_site_key",
    "write_demo_sites",
    "write_fleet_sites",
    "submit",
    "LoopbackFederation",
    "free_ports",
    "APP_TEMPLATE",
]

#: the Flower app shipped with fedhier (pyproject.toml, server_app.py, client_app.py, fit.toml)
APP_TEMPLATE = Path(__file__).parents[1] / "runtime" / "flower_app"
_CONNECTION = "fedhier"


def _bin(name: str) -> str:
    """A Flower executable next to this Python (the virtualenv's bin), else from PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


# --------------------------------------------------------------------------- command lines


def _require_flower() -> None:
    """Raise ModuleNotFoundError for ``flwr`` (the command then names the "flower" extra) when Flower is not
    installed, before a Flower executable is started."""
    import importlib.util

    if importlib.util.find_spec("flwr") is None:
        raise ModuleNotFoundError("No module named 'flwr'", name="flwr")


def superlink_command(
    *,
    host: str = "127.0.0.1",
    port: int = 9091,
    certificates: str | Path | None = None,
    insecure: bool = False,
    node_auth: bool = False,
    database: str | Path | None = None,
) -> list[str]:
    """``flower-superlink`` command line of the coordinator.

    Parameters
    ----------
    host, port : where the SuperLink's HTTP APIs (Fleet, Control, Runtime) listen.
    certificates : folder with ``ca.pem``, ``server.pem``, ``server.key`` (see
        :func:`make_certificates`); required unless ``insecure``.
    insecure : plain HTTP (tests on loopback only).
    node_auth : accept only SuperNodes whose public key was registered
        (``flwr supernode register``).
    database : SQLite file for the SuperLink state (default in memory).
    """
    cmd = [_bin("flower-superlink"), "--host", host, "--port", str(int(port)), "--disable-runtime-dependency-installation"]
    if insecure:
        if certificates is not None:
            raise ValueError("give either certificates or insecure=True, not both")
        cmd.append("--insecure")
    else:
        if certificates is None:
            raise ValueError("the SuperLink needs TLS certificates (a folder made by `fedhier flower certs`) or insecure=True")
        folder = Path(certificates)
        files = {name: folder / name for name in ("ca.pem", "server.pem", "server.key")}
        missing = [str(p) for p in files.values() if not p.is_file()]
        if missing:
            raise ValueError(f"certificate file(s) missing: {missing}; create them with `fedhier flower certs --out {folder}`")
        cmd += ["--ssl-ca-certfile", str(files["ca.pem"]), "--ssl-certfile", str(files["server.pem"]), "--ssl-keyfile", str(files["server.key"])]
    if node_auth:
        cmd.append("--enable-supernode-auth")
    if database is not None:
        cmd += ["--database", str(database)]
    return cmd


def supernode_command(
    *,
    superlink: str,
    site: str,
    data: str | Path,
    root_certificates: str | Path | None = None,
    insecure: bool = False,
    port: int = 9094,
    auth_key: str | Path | None = None,
    max_wait_time: float | None = None,
    seed: int | None = None,
    site_key: str | Path | None = None,
    roster: str | Path | None = None,
) -> list[str]:
    """``flower-supernode`` command line of one site.

    Parameters
    ----------
    superlink : ``HOST:PORT`` of the SuperLink.
    site : the site's name, as listed in the coordinator's ``fit.toml``.
    data : the site's CSV file (stays on the site's machine; only its path is configured).
    root_certificates : the CA certificate that signed the SuperLink's certificate.
    insecure : plain HTTP (tests on loopback only).
    port : local port of the SuperNode's own runtime API (distinct per SuperNode on a host).
    auth_key : the site's private key for node authentication (ECDSA, OpenSSH format).
    max_wait_time : give up after this many seconds without the SuperLink.
    seed : the site's own secret seed (its DP noise, random start), for reproducible tests only;
        None (a deployment): the site's operating system's entropy.  The coordinator never sends one.
    site_key : the site's long-term private key that signs its part of a secure sum (``fedhier flower
        key``; the node-authentication key may serve); default ``auth_key``.
    roster : the roster file of every site's public key, agreed by the operators (a secure fit needs both).
    """
    check_site_name(site, "--site")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", site):
        raise ValueError(f"site name {site!r}: use letters, digits, '.', '_' or '-' only")
    path = Path(data).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"site {site!r}: data file {path} does not exist")
    if '"' in str(path) or " " in str(path):
        raise ValueError(f"site {site!r}: the data path {path} must not contain spaces or quotes")
    cmd = [_bin("flower-supernode"), "--superlink", superlink, "--port", str(int(port))]
    if insecure:
        if root_certificates is not None:
            raise ValueError("give either root_certificates or insecure=True, not both")
        cmd.append("--insecure")
    else:
        if root_certificates is None or not Path(root_certificates).is_file():
            raise ValueError(f"site {site!r}: TLS needs the CA certificate file (--root-certificates ca.pem), got {root_certificates!r}")
        cmd += ["--root-certificates", str(Path(root_certificates).resolve())]
    if auth_key is not None:
        cmd += ["--auth-supernode-private-key", str(Path(auth_key).resolve())]
    if max_wait_time is not None:
        cmd += ["--max-wait-time", str(float(max_wait_time))]
    node_config = f'site="{site}" data="{path}"'
    site_key = auth_key if site_key is None else site_key
    for key, value in (("site-key", site_key), ("roster", roster)):
        if value is not None:
            file = Path(value).resolve()
            if not file.is_file() or '"' in str(file) or " " in str(file):
                raise ValueError(f"site {site!r}: the {key} file {file} must exist, without spaces or quotes in its path")
            node_config += f' {key}="{file}"'
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"site {site!r}: the seed must be a non-negative integer")
        node_config += f' seed="{seed}"'
    cmd += ["--node-config", node_config]
    return cmd


def flwr_run_command(app: str | Path, connection: str, overrides: str | Path) -> list[str]:
    """``flwr run APP CONNECTION --run-config OVERRIDES --stream``."""
    return [_bin("flwr"), "run", str(app), connection, "--run-config", str(overrides), "--stream"]


# --------------------------------------------------------------------------- certificates


def make_certificates(out: str | Path, hosts: Sequence[str] = ("127.0.0.1", "localhost"), days: int = 365) -> dict[str, Path]:
    """Write a self-signed CA and a SuperLink certificate signed by it (TLS set-up).

    Files in ``out``: ``ca.pem`` (give it to every site: ``--root-certificates``),
    ``ca.key`` (keep it offline), ``server.pem`` and ``server.key`` (the SuperLink's).
    ``hosts`` are the names/IP addresses the sites use to reach the SuperLink (subject
    alternative names).  Keys are ECDSA P-256.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise ValueError("at least one host name or IP address is needed for the SuperLink certificate")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(minutes=5)
    until = now + _dt.timedelta(days=int(days))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedhier federation CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(hosts[0]))]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def key_bytes(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    from ..utils.io import atomic_write_bytes

    paths = {
        "ca.pem": atomic_write_bytes(out / "ca.pem", ca.public_bytes(serialization.Encoding.PEM)),
        "ca.key": atomic_write_bytes(out / "ca.key", key_bytes(ca_key)),
        "server.pem": atomic_write_bytes(out / "server.pem", server.public_bytes(serialization.Encoding.PEM)),
        "server.key": atomic_write_bytes(out / "server.key", key_bytes(server_key)),
    }
    for name, path in paths.items():
        os.chmod(path, 0o600 if name.endswith(".key") else 0o644)
    return paths


def make_site_key(path: str | Path) -> tuple[Path, Path]:
    """An ECDSA P-384 key pair for node authentication, in OpenSSH format.

    Writes ``path`` (the private key, mode 0600; it stays at the site and is given to its
    SuperNode with ``--auth-key``) and ``path.pub`` (sent to the coordinator, who registers
    it with ``flwr supernode register``).  Same result as ``ssh-keygen -t ecdsa -b 384``.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from ..utils.io import atomic_write_bytes

    key = ec.generate_private_key(ec.SECP384R1())
    private = atomic_write_bytes(
        path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    public = atomic_write_bytes(
        f"{path}.pub", key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    )
    os.chmod(private, 0o600)
    os.chmod(public, 0o644)
    return private, public


# --------------------------------------------------------------------------- demo data


def write_demo_sites(
    out: str | Path,
    *,
    n_sites: int = 3,
    seed: int = 0,
    n_components: int = 5,
    n_rounds: int = 20,
    n_local_iter: int = 15,
    n_first_iter: int = 30,
    min_sites: int = 2,
    round_timeout: float = 300.0,
) -> Path:
    """Cut the bundled Alzheimer data into ``n_sites`` hospitals (iid scenario) and write them.

    Writes ``hospital-<k>.csv`` (one row per subject, columns named after the features,
    floats written exactly) and a matching ``fit.toml`` into ``out``; returns the path of
    ``fit.toml``.  The sites are ``partition(views, labels, n_sites, "iid", random_state=seed)``.
    """
    from ..data import load_alzheimer, partition
    from ..utils.io import atomic_write_text, write_csv

    data = load_alzheimer()
    parts = partition(data.views, data.labels, n_sites, "iid", random_state=seed)
    out = Path(out)
    names = [f"hospital-{chr(ord('a') + k)}" if n_sites <= 26 else f"hospital-{k}" for k in range(n_sites)]
    for name, site in zip(names, parts.sites):
        columns = [c for view in site for c in data.feature_names[view]]
        table = np.hstack([site[view] for view in site])
        write_csv(out / f"{name}.csv", [dict(zip(columns, map(float, row))) for row in table], columns)
    views = "\n".join(f"{view} = {json.dumps(list(data.feature_names[view]))}" for view in data.views)
    text = (
        "# Fed-mv-PPCA over Flower on the bundled Alzheimer data, "
        f"{n_sites} hospitals (written by `fedhier flower demo-data`)\n"
        f"n_components = {n_components}\nn_rounds = {n_rounds}\nn_local_iter = {n_local_iter}\n"
        f"n_first_iter = {n_first_iter}\nseed = {seed}\n\n[views]\n{views}\n\n"
        "# the same fit in one process: fedhier fit --config fit.toml (each SuperNode reads only its own file)\n"
        "[sites]\n" + "".join(f"{json.dumps(name)} = {json.dumps(name + '.csv')}\n" for name in names) + "\n[flower]\n"
        f"sites = {json.dumps(names)}\nmin_sites = {min_sites}\nround_timeout = {float(round_timeout)}\n"
        'out = "fedhier-flower-fit"\n'
    )
    return atomic_write_text(out / "fit.toml", text)


def write_fleet_sites(
    out: str | Path,
    *,
    model: str = "fedlin-hm2",
    n_sites: int = 4,
    sensor: int = 2,
    n_rounds: int = 10,
    seed: int = 0,
    min_sites: int = 2,
    round_timeout: float = 300.0,
) -> Path:
    """A fleet of ``n_sites`` machines from the bundled C-MAPSS FD001 turbofan engines, for a FedLin fit.

    Machine ``k`` is engine ``k + 1``: one row per cycle, columns ``t, t2, t3, t4`` (the
    polynomial design of the FedLin paper, ``t = (cycle - 1) / 299``) and ``sensor`` (sensor
    ``sensor``, min-max scaled on the engine's own cycles), written to ``machine-<k>.csv``
    with a ``fit.toml`` for ``model`` ("fedlin-hm1" or "fedlin-hm2"); returns its path.
    """
    from ..models.fedlin.datasets import load_cmapss
    from ..utils.io import atomic_write_text, write_csv

    if model not in ("fedlin-hm1", "fedlin-hm2"):
        raise ValueError(f"model must be 'fedlin-hm1' or 'fedlin-hm2', got {model!r}")
    engines = load_cmapss(sensor)
    if not 2 <= n_sites <= len(engines):
        raise ValueError(f"a fleet needs between 2 and {len(engines)} machines, got {n_sites}")
    out = Path(out)
    names = [f"machine-{k + 1:02d}" for k in range(n_sites)]
    columns = ["t", "t2", "t3", "t4", "sensor"]
    for name, (cycle, value) in zip(names, engines):
        t = (cycle - 1) / 299.0
        span = value.max() - value.min()
        y = (value - value.min()) / (span if span > 0 else 1.0)
        write_csv(out / f"{name}.csv", [dict(zip(columns, map(float, row))) for row in np.column_stack([t, t**2, t**3, t**4, y])], columns)
    options = 'prior = "gaussian"\nmu_scale = 10.0\n' if model == "fedlin-hm2" else "eta = 0.0002\nn_local_steps = 20\n"
    text = (
        f"# FedLin ({model}) over Flower on the bundled C-MAPSS engines, one machine per SuperNode "
        "(written by `fedhier flower demo-data --model ...`)\n"
        f'model = "{model}"\ntarget = "sensor"\nfeatures = ["t", "t2", "t3", "t4"]\nintercept = true\n'
        f"n_rounds = {n_rounds}\nseed = {seed}\n{options}\n[flower]\n"
        f"sites = {json.dumps(names)}\nmin_sites = {min_sites}\nround_timeout = {float(round_timeout)}\n"
        'out = "fedhier-flower-fit"\n'
    )
    return atomic_write_text(out / "fit.toml", text)


# --------------------------------------------------------------------------- one-machine federation


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports that were free on ``host`` a moment ago."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _descendants(pid: int) -> list[int]:
    """Live descendants of ``pid`` from /proc (Flower detaches some helpers into new sessions)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _signal(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has); False where /proc is absent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _await_exit(pids, timeout: float) -> None:
    """Wait until none of ``pids`` is running, at most ``timeout`` seconds: a SIGKILLed process that is not our
    child (a descendant Flower detached) is reaped by the kernel on its own time, slower on a busy machine."""
    deadline = time.monotonic() + timeout
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


#: seconds a Flower process has to exit after a forwarded SIGINT/SIGTERM before it is sent SIGTERM, then SIGKILL
STOP_GRACE = 10.0


class _Forwarding:
    """SIGTERM and SIGINT sent to this command go to the Flower process it runs (:meth:`start`).

    ``kill PID`` of ``fedhier flower link`` (systemd's stop, a test's clean-up) or Ctrl-C then stop
    ``flower-superlink`` as if it had been sent the signal itself; when it has exited, whatever it had
    started and left running (Flower's helpers, seen at the time of the signal) gets SIGTERM too.
    A signal that arrives before the process is started is passed on as soon as it is.
    Handlers can only be set in the main thread; elsewhere nothing is forwarded.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.received: int | None = None
        self._helpers: set[int] = set()
        self._previous: dict = {}

    def __enter__(self) -> "_Forwarding":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def start(self, cmd: list[str], **popen) -> subprocess.Popen:
        self.proc = subprocess.Popen(cmd, **popen)
        if self.received is not None:
            self._forward(self.received, None)
        return self.proc

    def _forward(self, signum: int, _frame) -> None:
        self.received = signum
        if self.proc is not None and self.proc.poll() is None:
            self._helpers.update(_descendants(self.proc.pid))
            self.proc.send_signal(signum)

    def wait(self) -> int:
        """Wait for the process; its exit status.  After a forwarded signal the process has ``STOP_GRACE``
        seconds to exit, then gets SIGTERM and, another ``STOP_GRACE`` later, SIGKILL (as systemd escalates a
        stop): a Flower process interrupted during its start-up can otherwise hang in a server thread."""
        escalation, deadline = [signal.SIGTERM, signal.SIGKILL], None
        while True:
            try:
                return self.proc.wait(timeout=0.5)  # a short wait, so that a signal's arrival is seen
            except subprocess.TimeoutExpired:
                if self.received is None:
                    continue
                now = time.monotonic()
                if deadline is None:
                    deadline = now + STOP_GRACE
                elif now >= deadline and escalation:
                    self.proc.send_signal(escalation.pop(0))
                    deadline = now + STOP_GRACE

    def exit_code(self, code: int) -> int:
        """The command's exit code: 128 + the signal it was stopped by (the shell's convention)."""
        if self.received is not None:
            return 128 + self.received
        return 128 - code if code < 0 else code

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self.received is not None and self.proc is not None:
            if self.proc.poll() is not None:
                _signal([pid for pid in self._helpers if Path(f"/proc/{pid}").exists()], signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A command stopped by SIGINT or SIGTERM (``signum``) after passing it on to its Flower process."""

    def __init__(self, signum: int, output: str = "") -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.output = output


class LoopbackFederation:
    """A SuperLink and one SuperNode per site on 127.0.0.1 (tests, benchmarks, trying it out).

    Every process runs in its own session with its own ``FLWR_HOME`` under ``root`` and a
    log file ``root/<name>.log``; :meth:`stop` ends them, and everything they started, by
    PID.  Use as a context manager.

    Parameters
    ----------
    root : folder for logs, Flower homes and certificates.
    sites : mapping site name -> data file.
    tls : serve TLS with certificates made by :func:`make_certificates` in ``root/certs``.
    node_auth : the SuperLink accepts only registered SuperNodes; each site's key pair (below) is
        registered before the SuperNode starts.

    Every site gets a key pair in ``root/keys`` (:func:`make_site_key`), and ``root/roster.txt``
    lists their public keys: each SuperNode signs its part of a secure sum with its key and
    checks the others' against that roster.
    site_seed : every SuperNode's secret seed (:func:`supernode_command`), so that a fit equals
        :func:`fedhier.runtime.simulate` with ``random_state=site_seed``; None: each site's own entropy.
    database : SQLite file of the SuperLink's state, so that a restarted SuperLink (:meth:`restart`) knows the
        SuperNodes again (with the default in-memory state they cannot reconnect).
    path : folders put on every process's ``PATH`` before this Python's bin and the inherited ``PATH``, e.g. a
        test's stand-in for a Flower executable.
    """

    def __init__(
        self, root: str | Path, sites: dict[str, str | Path], *, tls: bool = False, node_auth: bool = False,
        startup_timeout: float = 60.0, site_seed: int | None = None, database: str | Path | None = None,
        path: Sequence[str | Path] = (),
    ):
        for name in sites:  # each names files under root (log, Flower home, keys)
            check_site_name(name, "FlowerCluster")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = tuple(path)
        self.tls = tls
        self.procs: dict[str, subprocess.Popen] = {}
        self.commands: dict[str, list[str]] = {}
        link_port, *site_ports = free_ports(1 + len(sites))
        self.address = f"127.0.0.1:{link_port}"
        self.certificates = make_certificates(self.root / "certs") if tls else None
        try:
            link = {"certificates": self.root / "certs"} if tls else {"insecure": True}
            self._start("superlink", superlink_command(host="127.0.0.1", port=link_port, node_auth=node_auth, database=database,
                                                       **link))
            self._wait_for_port(link_port, startup_timeout)
            keys = {name: make_site_key(self.root / "keys" / name) for name in sites}
            from ..secure.keys import Roster, load_signing_key

            self.roster = self.root / "roster.txt"
            Roster({name: load_signing_key(private) for name, (private, _) in keys.items()}).write(self.roster)
            for (name, data), port in zip(sites.items(), site_ports):
                key, public = keys[name]
                if node_auth:
                    register_site_key(public, superlink=self.address, name=name, root_certificates=self.tls_options().get("root_certificates"))
                self._start(name, supernode_command(
                    superlink=self.address, site=name, data=data, port=port, auth_key=key if node_auth else None,
                    site_key=key, roster=self.roster, max_wait_time=startup_timeout, seed=site_seed, **self.tls_options()
                ))
        except BaseException:
            self.stop()
            raise

    def tls_options(self) -> dict:
        """``root_certificates=...`` or ``insecure=True``, as :func:`submit` and :func:`supernode_command` take them."""
        return {"root_certificates": self.certificates["ca.pem"]} if self.tls else {"insecure": True}

    def env(self, name: str) -> dict[str, str]:
        """The environment of process ``name``: its own ``FLWR_HOME``; ``PATH`` starts with ``path`` and this Python's
        bin, after, for a SuperNode, fedhier's SuperExec (one ClientApp process at a time,
        :mod:`fedhier.runtime.flower_exec`)."""
        home = self.root / f"home-{name}"
        home.mkdir(exist_ok=True)
        first = [*map(str, self.path), str(Path(sys.executable).parent)]
        if name != "superlink":
            from ..runtime.flower_exec import superexec_folder

            first.insert(0, str(superexec_folder(self.root / "superexec")))
        return {**os.environ, "FLWR_HOME": str(home), "PATH": os.pathsep.join([*first, os.environ.get("PATH", "")])}

    def _start(self, name: str, cmd: list[str]) -> None:
        self.commands[name] = cmd
        with open(self.root / f"{name}.log", "a") as log:
            self.procs[name] = subprocess.Popen(cmd, env=self.env(name), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def restart(self, name: str, timeout: float = 60.0) -> None:
        """Start again a process that was killed (:meth:`kill`), with its command line; the SuperLink on its port.

        PIDs of the earlier process are not reused: :meth:`stop` ends the new one (the old one is gone)."""
        proc = self.procs[name]
        if proc.poll() is None:
            raise RuntimeError(f"{name} is still running; kill it first")
        self._start(name, self.commands[name])
        if name == "superlink":
            self._wait_for_port(int(self.address.rsplit(":", 1)[1]), timeout)

    def _wait_for_port(self, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs["superlink"].poll() is not None:
                raise RuntimeError(f"the SuperLink exited:\n{self.logs()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"the SuperLink did not listen on port {port} within {timeout:g} s:\n{self.logs()}")

    def logs(self) -> str:
        """The tail of every process's log."""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.root.glob("*.log")))

    def kill(self, name: str) -> None:
        """SIGKILL one process and everything it started (a machine that disappears)."""
        proc = self.procs[name]
        _signal([proc.pid, *_descendants(proc.pid)], signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self, grace: float = 10.0) -> set[int]:
        """SIGTERM, then after ``grace`` seconds SIGKILL, every process and its descendants; returns their PIDs."""
        victims: set[int] = set()
        for proc in self.procs.values():
            victims.update([proc.pid, *_descendants(proc.pid)])
        _signal(victims, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        _signal(victims, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait(timeout=10)
        _await_exit(victims, timeout=30.0)
        return victims

    def __enter__(self) -> "LoopbackFederation":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------- submitting a fit


def _toml_string(text: str) -> str:
    """A TOML basic string holding ``text`` (JSON string escapes are valid TOML escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _connection_home(home: Path, superlink: str, root_certificates: str | Path | None) -> Path:
    """A private ``FLWR_HOME`` whose Flower configuration has one SuperLink connection, ``fedhier``."""
    home.mkdir(parents=True, exist_ok=True)
    lines = [f"[superlink]\ndefault = {_toml_string(_CONNECTION)}\n", f"[superlink.{_CONNECTION}]", f"address = {_toml_string(superlink)}"]
    if root_certificates is None:
        lines.append("insecure = true")
    else:
        lines.append(f"root-certificates = {_toml_string(str(Path(root_certificates).resolve()))}")
    (home / "config.toml").write_text("\n".join(lines) + "\n")
    return home


def register_site_key(
    public_key: str | Path, *, superlink: str, name: str, root_certificates: str | Path | None = None, timeout: float = 120.0
) -> str:
    """Register a site's public key with a SuperLink started with node authentication.

    Runs ``flwr supernode register PUBLIC_KEY`` against ``superlink`` (``root_certificates``:
    the CA of its TLS certificate; None for plain HTTP) and returns Flower's output.
    Raises RuntimeError when Flower refuses the key.
    """
    with tempfile.TemporaryDirectory(prefix="fedhier-flower-") as tmp:
        home = _connection_home(Path(tmp) / "flwr-home", superlink, root_certificates)
        proc = subprocess.run(
            [_bin("flwr"), "supernode", "register", str(Path(public_key).resolve()), _CONNECTION, "--name", name],
            env={**os.environ, "FLWR_HOME": str(home)}, capture_output=True, text=True, timeout=timeout,
        )
    if proc.returncode != 0 or "registered successfully" not in proc.stdout:
        raise RuntimeError(f"site {name!r}: Flower did not register {public_key}: {(proc.stderr or proc.stdout).strip()[-1000:]}")
    return proc.stdout


def _run_streaming(cmd: list[str], env: dict[str, str], timeout: float | None) -> tuple[int | None, str]:
    """Run ``cmd``, echoing its output live; (exit code or None on timeout, output).

    SIGINT/SIGTERM are passed on to it (:class:`_Forwarding`); once it has exited, :class:`Interrupted`
    is raised with its output."""
    lines: list[str] = []
    with _Forwarding() as forwarding:
        proc = forwarding.start(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")

        def pump() -> None:
            for line in proc.stdout:
                lines.append(line)
                sys.stdout.write(line)
                sys.stdout.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
        reader.join(timeout=10)
    if forwarding.received is not None:
        raise Interrupted(forwarding.received, "".join(lines))
    return code, "".join(lines)


class _HistoryFollower(threading.Thread):
    """Shows the rounds of a Flower fit as the coordinator completes them, from its ``history.json``.

    The ServerApp rewrites ``history.json`` in the result folder after every round
    (:func:`fedhier.runtime.flower.coordinate`); when that folder is readable from here (``fedhier flower run``
    on the SuperLink's machine or a shared disk) each new round advances ``display`` (a
    :class:`~fedhier.utils.progress.RoundProgress`).  A file already there when the run starts (an earlier run's,
    or the one a resumed run goes on from) counts only once it has been rewritten.
    """

    def __init__(self, path: Path, display, poll: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.path, self.display, self.poll = path, display, poll
        self.shown = 0
        self._before = self._stamp()
        self._done = threading.Event()

    def _stamp(self):
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def update(self) -> None:
        stamp = self._stamp()
        if stamp is None or stamp == self._before:
            return
        try:
            rows = json.loads(self.path.read_text())
        except (OSError, ValueError):  # being replaced: next time
            return
        from ..runtime.simulate import RoundRecord

        for row in rows[self.shown:] if isinstance(rows, list) else []:
            self.display(RoundRecord.from_dict(row))
        self.shown = max(self.shown, len(rows) if isinstance(rows, list) else 0)

    def run(self) -> None:
        while not self._done.wait(self.poll):
            self.update()

    def stop(self) -> None:
        self._done.set()
        self.join()
        self.update()
        self.display.close()


def submit(
    config_path: str | Path,
    *,
    superlink: str | None = None,
    federation: str | None = None,
    root_certificates: str | Path | None = None,
    insecure: bool = False,
    timeout: float | None = None,
    out: str | Path | None = None,
    env: dict[str, str] | None = None,
    resume: bool = False,
    progress: bool = False,
) -> dict:
    """Submit the fit of ``fit.toml`` to a SuperLink with ``flwr run`` and wait for it.

    Parameters
    ----------
    config_path : the coordinator's ``fit.toml`` (any family, :func:`fedhier.deploy.read_fit`).
    superlink : ``HOST:PORT`` of the SuperLink; a private Flower configuration with one
        connection is written for this call (with ``root_certificates`` or ``insecure``).
    federation : instead of ``superlink``, the name of a SuperLink connection in your own
        Flower configuration (``$FLWR_HOME/config.toml``).
    timeout : seconds to wait for the run (None: wait until it ends).
    out : overrides ``out`` of ``fit.toml`` (the result folder on the SuperLink host).
    env : environment of ``flwr run`` (default: this process's).
    resume : go on from the coordinator checkpoint in the result folder (a fit whose SuperLink
        or ServerApp stopped), as :func:`fedhier.runtime.flower.coordinate` with ``resume=True``.
    progress : show the rounds as the coordinator completes them (a bar on a terminal, a line a minute
        otherwise), when the result folder is readable from here (:class:`_HistoryFollower`).

    When the run ends (or this call fails) and the result folder is readable from here but its
    ``summary.json`` still says "running" (the ServerApp was killed), it is rewritten as "failed";
    when this call fails before the ServerApp wrote one (the SuperLink could not be reached, the
    run timed out before it started) and the result folder's parent folder is on this machine,
    a "failed" ``summary.json`` with the error is written there.

    Returns
    -------
    dict : the run's ``summary.json`` (status "completed" or "failed") when the result
    folder is readable from here, else ``{"status": "ended", "out": ...}``.  A completed
    run's folder also gets the report (``report.html``, ``report.md``; its path in ``"report"``).

    Raises
    ------
    ValueError : bad configuration or options; TimeoutError : the run did not end in time;
    RuntimeError : ``flwr run`` failed.
    """
    _require_flower()
    from ..deploy import read_fit
    from ..runtime.flower import CHECKPOINT, RESUME_KEY, RUN_CONFIG_KEY

    config = read_fit(config_path)
    if out is not None:
        config = config.replace(out=str(Path(out).resolve()))
    results = ("summary.json", "history.json", "model.npz", "broadcast.fhm", "coefficients.csv", "phi.csv", CHECKPOINT)
    check_outputs_spare_inputs([Path(config.out) / name for name in results], [config_path])
    if (superlink is None) == (federation is None):
        raise ValueError("give exactly one of --superlink HOST:PORT or --federation NAME")
    if federation is not None and (insecure or root_certificates is not None):
        raise ValueError("--federation takes the address and certificates from your Flower configuration; drop --root-certificates/--insecure")
    env = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="fedhier-flower-") as tmp:
        tmp = Path(tmp)
        app = tmp / "app"
        shutil.copytree(APP_TEMPLATE, app, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "fit.toml"))
        overrides = tmp / "run-config.toml"
        overrides.write_text(f"{RUN_CONFIG_KEY} = {_toml_string(config.to_json())}\n{RESUME_KEY} = {_toml_string('yes' if resume else '')}\n")
        connection = federation
        if superlink is not None:
            if insecure == (root_certificates is not None):
                raise ValueError("with --superlink give either --root-certificates ca.pem or --insecure")
            env["FLWR_HOME"] = str(_connection_home(tmp / "flwr-home", superlink, root_certificates))
            connection = _CONNECTION
        summary_path = Path(config.out) / "summary.json"
        summary_path.unlink(missing_ok=True)  # a stale result must not pass for this run's
        def stop_run(output: str) -> None:
            run_id = re.search(r"started run (\d+)", output)
            if run_id:
                subprocess.run([_bin("flwr"), "stop", run_id.group(1), connection], env=env, timeout=60, capture_output=True)

        follower = None
        if progress:
            from ..utils.progress import RoundProgress

            follower = _HistoryFollower(Path(config.out) / "history.json", RoundProgress(config.n_rounds, f"{config.model} rounds"))
            follower.start()
        error: BaseException | None = None
        try:
            try:
                code, output = _run_streaming(flwr_run_command(app, connection, overrides), env, timeout)
            except Interrupted as exc:  # Ctrl-C or kill of this command: the fit stops too
                stop_run(exc.output)
                raise
            finally:
                if follower is not None:
                    follower.stop()
            if code is None:
                stop_run(output)
                raise TimeoutError(f"the fit did not end within {timeout:g} s (run stopped)")
            if code != 0 or "started run" not in output:
                raise RuntimeError(f"flwr run failed (exit code {code}): {output.strip()[-2000:]}")
        except BaseException as exc:
            error = exc
            raise
        finally:
            _close_summary(summary_path, error, {"model": config.model, "sites": list(config.sites)})
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        # the coordinator's report of a Fed-mv-PPCA fit; FedLin's report needs the sites' data (not on the coordinator)
        if summary.get("status") == "completed" and config.model == "fed-mv-ppca":
            from ..report.mvppca import write_result_report

            summary["report"] = str(write_result_report(
                config.out, title="Fed-mv-PPCA on Flower", site_names=summary["sites"], feature_names=config.views,
                privacy_spent=summary.get("privacy_spent"),
                intro=f"Fed-mv-PPCA fitted over Flower by {len(summary['sites'])} sites ({', '.join(summary['sites'])}); "
                      "the coordinator holds the global model and the round history, not the sites' data, so this "
                      "report shows the model and the fit only."))
        return summary
    return {"status": "ended", "out": config.out, "note": "the result folder is on the SuperLink host"}


def _close_summary(path: Path, error: BaseException | None = None, fit: dict | None = None) -> None:
    """A ``summary.json`` left at "running" by a run that ended (its ServerApp or SuperLink was killed) becomes "failed";
    a run that failed with ``error`` before its ServerApp wrote one gets a "failed" one (with ``fit``: model, sites)
    when the result folder's parent is on this machine."""
    from ..utils.io import write_json

    if error is not None and not path.exists() and path.parent.parent.is_dir():
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if isinstance(error, KeyboardInterrupt):
            reason = "interrupted"
        write_json(path, {"status": "failed", **(fit or {}), "round": None,
                          "error": f"the run ended before its ServerApp wrote anything: {reason}"})
        return
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(summary, dict) and summary.get("status") == "running":
        summary.update(status="failed", error="the run ended before the fit did (its ServerApp or the SuperLink stopped); "
                                              "`fedhier flower run --resume` goes on from the last completed round")
        write_json(path, summary)


# --------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedhier flower", description="Deploy a fedhier fit on real machines with Flower (docs/flower.md).")
    sub = parser.add_subparsers(dest="command", required=True)

    def tls(p, who: str) -> None:
        g = p.add_mutually_exclusive_group(required=True)
        g.add_argument("--root-certificates", help=f"CA certificate (ca.pem) that signed the SuperLink's certificate ({who})")
        g.add_argument("--insecure", action="store_true", help="no TLS (loopback tests only)")

    p = sub.add_parser("certs", help="create a CA and a SuperLink certificate for TLS")
    p.add_argument("--out", required=True, help="folder for ca.pem, ca.key, server.pem, server.key")
    p.add_argument("--host", action="append", help="SuperLink host name or IP the sites use (repeatable; default 127.0.0.1 and localhost)")
    p.add_argument("--days", type=int, default=365, help="days the certificates are valid (default 365)")

    p = sub.add_parser("key", help="create a site's key pair for node authentication")
    p.add_argument("--out", required=True, help="private key file; the public key goes to OUT.pub")

    p = sub.add_parser("link", help="start the SuperLink (coordinator)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--certificates", help="folder made by `fedhier flower certs`")
    g.add_argument("--insecure", action="store_true", help="no TLS (loopback tests only)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default all interfaces)")
    p.add_argument("--port", type=int, default=9091, help="port of the SuperLink's APIs (default 9091)")
    p.add_argument("--node-auth", action=argparse.BooleanOptionalAction, default=None,
                   help="accept only registered SuperNodes (flwr supernode register); on by default with TLS, "
                        "off with --insecure; --no-node-auth lets any SuperNode claim a site's name")
    p.add_argument("--database", help="SQLite file for the SuperLink state")
    p.add_argument("--print-command", action="store_true", help="print the flower-superlink command instead of running it")

    p = sub.add_parser("site", help="start a site's SuperNode on its own data file")
    p.add_argument("--site", required=True, help="the site's name, as listed in the coordinator's fit.toml")
    p.add_argument("--data", required=True, help="the site's CSV file (never leaves this machine)")
    p.add_argument("--superlink", required=True, help="HOST:PORT of the SuperLink")
    tls(p, "the coordinator sends it")
    p.add_argument("--port", type=int, default=9094, help="local port of the SuperNode's runtime API")
    p.add_argument("--auth-key", help="this site's private key for node authentication")
    p.add_argument("--site-key", help="this site's private key that signs its part of a secure sum (default: --auth-key)")
    p.add_argument("--roster", help="the roster file of every site's public key, agreed by the operators (secure fits)")
    p.add_argument("--config", help="check the data file against this fit.toml before starting")
    p.add_argument("--seed", type=int, default=None,
                   help="this site's own secret seed, for reproducible tests only (default: the machine's entropy)")
    p.add_argument("--print-command", action="store_true", help="print the flower-supernode command instead of running it")

    p = sub.add_parser("run", help="submit a fit to the SuperLink and wait for it")
    p.add_argument("--config", required=True, help="fit.toml: views, site names, rounds, timeouts")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--superlink", help="HOST:PORT of the SuperLink")
    where.add_argument("--federation", help="name of a SuperLink connection in your Flower configuration")
    p.add_argument("--root-certificates", help="CA certificate of the SuperLink (with --superlink)")
    p.add_argument("--insecure", action="store_true", help="no TLS (with --superlink; loopback tests only)")
    p.add_argument("--timeout", type=float, default=None, help="seconds to wait for the fit")
    p.add_argument("--out", help="result folder on the SuperLink host (overrides fit.toml)")
    p.add_argument("--resume", action="store_true", help="go on from the checkpoint of an interrupted run of this fit")
    p.add_argument("--quiet", action="store_true", help="no progress bar (it needs the result folder on this machine; the streamed log has a line per round anyway)")

    p = sub.add_parser("demo-data", help="example sites with a fit.toml: hospitals (Alzheimer data) or a fleet of engines (FedLin)")
    p.add_argument("--out", required=True, help="folder for the site files and fit.toml")
    p.add_argument("--model", choices=["fed-mv-ppca", "fedlin-hm1", "fedlin-hm2"], default="fed-mv-ppca",
                   help="fed-mv-ppca: hospitals cut from the bundled Alzheimer data; fedlin-*: C-MAPSS engines, one per machine")
    p.add_argument("--sites", type=int, default=None, help="number of sites (default 3 hospitals, 4 machines)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split into sites and of the fit (default 0)")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 20 for fed-mv-ppca, 10 for FedLin)")
    return parser


def _describe(data) -> str:
    """What a site's file holds, as its deployment read it (shapes only, never values)."""
    if isinstance(data, dict):  # Fed-mv-PPCA: view -> (n, d)
        return ", ".join(f"{v} {X.shape[0]}x{X.shape[1]}" for v, X in data.items())
    if isinstance(data, tuple):  # FedLin HM1: (X, y)
        return f"{data[0].shape[0]} rows, {data[0].shape[1]} coefficients"
    return f"{data.n} rows, {data.d} coefficients"  # FedLin HM2: the site's sufficient statistics


def _run(cmd: list[str], print_only: bool, site: bool = False) -> int:
    """Run a Flower process in the foreground until it exits; SIGINT/SIGTERM are passed on to it.

    ``site``: the process is a SuperNode, which starts fedhier's SuperExec (one ClientApp process at a time,
    :mod:`fedhier.runtime.flower_exec`)."""
    if print_only:
        print(shlex.join(cmd))
        return 0
    # Flower starts helpers (flower-superexec) by name: put this environment's bin first on PATH
    _require_flower()
    with tempfile.TemporaryDirectory(prefix="fedhier-superexec-") as folder:
        if site:
            from ..runtime.flower_exec import superexec_folder, supernode_path

            env = {**os.environ, "PATH": supernode_path(superexec_folder(folder))}
        else:
            env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        with _Forwarding() as forwarding:
            forwarding.start(cmd, env=env)
            code = forwarding.wait()
    return forwarding.exit_code(code)


def cli_flower(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fedhier flower ...``; returns the exit code."""
    from .console import run

    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return run(lambda: _flower(args), f"fedhier flower {args.command}", also=(TimeoutError, RuntimeError))


def _flower(args: argparse.Namespace) -> int:
    if args.command == "certs":
        paths = make_certificates(args.out, hosts=args.host or ("127.0.0.1", "localhost"), days=args.days)
        print(f"wrote {', '.join(str(p) for p in paths.values())}; give ca.pem to every site, keep ca.key offline")
        return 0
    if args.command == "key":
        private, public = make_site_key(args.out)
        print(f"wrote {private} (keep it at the site) and {public} (send it to the coordinator, and to the other "
              f"sites as this site's line of the roster: SITE-NAME followed by the content of {public})")
        return 0
    if args.command == "link":
        cmd = superlink_command(
            host=args.host, port=args.port, certificates=args.certificates, insecure=args.insecure,
            node_auth=not args.insecure if args.node_auth is None else args.node_auth, database=args.database,
        )
        return _run(cmd, args.print_command)
    if args.command == "site":
        if args.config:
            from ..deploy import read_fit

            print(f"site {args.site!r}: " + _describe(read_fit(args.config).load_site(args.site, args.data)))
        cmd = supernode_command(
            superlink=args.superlink, site=args.site, data=args.data, root_certificates=args.root_certificates,
            insecure=args.insecure, port=args.port, auth_key=args.auth_key, seed=args.seed, site_key=args.site_key,
            roster=args.roster,
        )
        return _run(cmd, args.print_command, site=True)
    if args.command == "run":
        summary = submit(
            args.config, superlink=args.superlink, federation=args.federation, root_certificates=args.root_certificates,
            insecure=args.insecure, timeout=args.timeout, out=args.out, resume=args.resume, progress=not args.quiet,
        )
        print(json.dumps(summary, indent=2))
        return 0 if summary.get("status") in ("completed", "ended") else 1
    if args.command == "demo-data":
        if args.model == "fed-mv-ppca":
            n_sites = 3 if args.sites is None else args.sites
            path = write_demo_sites(args.out, n_sites=n_sites, seed=args.seed, n_rounds=20 if args.rounds is None else args.rounds)
        else:
            n_sites = 4 if args.sites is None else args.sites
            path = write_fleet_sites(args.out, model=args.model, n_sites=n_sites, seed=args.seed,
                                     n_rounds=10 if args.rounds is None else args.rounds)
        print(f"wrote {n_sites} site files and {path}")
        return 0
    raise AssertionError(f"unhandled command {args.command!r}")  # pragma: no cover - argparse restricts commands
