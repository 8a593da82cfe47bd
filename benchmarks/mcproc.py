"""Start and stop Mooncake processes (master, storage client) on loopback.

Shared by the reference probes, store_bench.py and compare.py. It only uses
the command-line surface both systems share (binary names and the flags in
SURFACE.md), so the same code drives the reference package and ours: a
"system" is just a directory holding `mooncake_master`, `mooncake_client`,
`transfer_engine_bench` and a `python` that can import `mooncake`.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    """A port nothing listens on right now, below the kernel's ephemeral
    range: a port from bind(0) can be taken by any outgoing connection
    before the child binds it; ports here only by an explicit bind."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            start = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        start = 32768
    low, high = (10000, start) if start > 12000 else (61000, 65535)
    for _ in range(10000):
        port = random.randrange(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}..{high}")


def wait_tcp(port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args[0]} exited with {proc.returncode} before port {port} opened")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open within {timeout}s")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; HTTP errors are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


@dataclass
class System:
    """Where one implementation's binaries and Python live."""

    name: str
    bin_dir: Path

    @classmethod
    def from_venv(cls, name: str, venv: str | os.PathLike) -> "System":
        return cls(name, Path(venv).resolve() / "bin")

    def exe(self, binary: str) -> str:
        path = self.bin_dir / binary
        if not path.exists():
            raise FileNotFoundError(f"{self.name}: {binary} not found in {self.bin_dir}")
        return str(path)

    def has(self, binary: str) -> bool:
        return (self.bin_dir / binary).exists()

    @property
    def python(self) -> str:
        return self.exe("python")

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env.setdefault("GLOG_minloglevel", "2")  # reference logs are chatty; keep errors only
        if extra:
            env.update(extra)
        return env


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path
    ports: dict[str, int] = field(default_factory=dict)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`, to the process group we created for it.

        The group matters: a venv's console script may be a Python shim that runs
        the real binary as a child (the reference's `transfer_engine_bench` does),
        and signalling only the shim would leave the binary running.
        """
        p = self.popen
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=timeout)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:  # children of a shim may outlive it briefly
                os.killpg(p.pid, 0)
                time.sleep(0.05)
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=timeout)

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def normal_priority() -> None:
    """For a child of a driver run under `chrt -f`: back to the normal
    scheduler. A program that busy-polls on every core (both systems'
    `transfer_engine_bench`) would otherwise, at a real-time priority,
    starve everything else, the driver that times it out included."""
    if hasattr(os, "sched_setscheduler"):
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def _spawn(name: str, argv: list[str], workdir: Path, env: dict[str, str],
           preexec_fn=None) -> Proc:
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{name}.log"
    log = open(log_path, "wb")
    # Own session (and process group): stop() signals exactly this process and its children.
    popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                             stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=preexec_fn)
    log.close()
    return Proc(name, popen, log_path)


@dataclass
class Master:
    proc: Proc
    rpc_port: int
    http_port: int
    metrics_port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata_server(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metadata"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def stop(self) -> None:
        self.proc.stop()


def master_flags(rpc_port: int, http_port: int, metrics_port: int, extra: list[str] | None = None) -> list[str]:
    """The flags every run uses for the master, identical for both systems."""
    return [
        f"--rpc_port={rpc_port}",
        "--rpc_address=127.0.0.1",
        "--enable_http_metadata_server=true",
        "--http_metadata_server_host=127.0.0.1",
        f"--http_metadata_server_port={http_port}",
        f"--metrics_port={metrics_port}",
        *(extra or []),
    ]


def start_master(system: System, workdir: Path, extra_flags: list[str] | None = None,
                 env: dict[str, str] | None = None, timeout: float = 30.0) -> Master:
    rpc, http, metrics = free_port(), free_port(), free_port()
    argv = [system.exe("mooncake_master"), *master_flags(rpc, http, metrics, extra_flags)]
    proc = _spawn("master", argv, workdir, system.env(env))
    try:
        for port in (rpc, http, metrics):
            wait_tcp(port, timeout, proc.popen)
    except Exception:
        proc.stop()
        raise RuntimeError(f"master did not start:\n{proc.log_tail()}")
    return Master(proc, rpc, http, metrics)


def storage_client_flags(master: Master, port: int, segment_size: str, protocol: str = "tcp") -> list[str]:
    return [
        f"--master_server_address={master.address}",
        f"--metadata_server={master.metadata_server}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--protocol={protocol}",
        f"--global_segment_size={segment_size}",
    ]


def start_storage_client(system: System, master: Master, workdir: Path, segment_size: str,
                         protocol: str = "tcp", env: dict[str, str] | None = None,
                         timeout: float = 30.0, name: str = "storage") -> Proc:
    """A `mooncake_client` process that mounts a segment of `segment_size`."""
    port = free_port()
    argv = [system.exe("mooncake_client"), *storage_client_flags(master, port, segment_size, protocol)]
    proc = _spawn(name, argv, workdir, system.env(env))
    proc.ports["rpc"] = port
    try:
        wait_tcp(port, timeout, proc.popen)
    except Exception:
        proc.stop()
        raise RuntimeError(f"storage client did not start:\n{proc.log_tail()}")
    return proc


STORAGE_PY = Path(__file__).resolve().parent / "storage_holder.py"


def start_storage_python(system: System, master: Master, workdir: Path, segment_size: int,
                         protocol: str = "tcp", env: dict[str, str] | None = None,
                         timeout: float = 60.0, name: str = "storage-py") -> Proc:
    """A Python process holding a MooncakeDistributedStore with a mounted segment."""
    ready = workdir / f"{name}.ready"
    ready.unlink(missing_ok=True)
    argv = [system.python, str(STORAGE_PY), "--master", master.address,
            "--metadata", master.metadata_server, "--segment", str(segment_size),
            "--protocol", protocol, "--ready-file", str(ready)]
    proc = _spawn(name, argv, workdir, system.env(env))
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.popen.poll() is not None or time.monotonic() > deadline:
            proc.stop()
            raise RuntimeError(f"python storage holder did not start:\n{proc.log_tail()}")
        time.sleep(0.05)
    return proc
