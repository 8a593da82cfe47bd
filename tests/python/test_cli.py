"""The programs `pip install .` puts on PATH: they run the same Rust entry
points as the standalone binaries, inside a Python console script."""

from __future__ import annotations

import signal
import subprocess

import pytest

import procs
from mooncake import _mooncake

PROGRAMS = [
    "mooncake_master",
    "mooncake_client",
    "mooncake_http_metadata_server",
    "transfer_engine_bench",
    "mooncake",
    "mooncake_conductor",
]


@pytest.mark.parametrize("name", PROGRAMS)
def test_program_is_on_path(name):
    assert procs.program(name)


def test_every_program_is_built_in():
    """Each console script runs a program built into the extension; one
    missing from it would answer 127 instead of running."""
    built = _mooncake._programs()
    missing = [p for p in PROGRAMS if p not in built]
    assert missing == [], f"console scripts without a built-in program: {missing} (built in: {built})"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_metadata_server_stops_cleanly_on_signals(sig):
    p = procs.start("mooncake_http_metadata_server", "--port=0", "--host=127.0.0.1")
    m = p.wait_for_line(r"listening on [\d.]+:(\d+)")
    assert procs.port_open(int(m.group(1)))
    assert p.stop(sig) == 0, p.output()
    assert not procs.port_open(int(m.group(1)))


def test_bad_flag_is_an_error():
    out = subprocess.run(
        [procs.program("mooncake_http_metadata_server"), "--no_such_flag=1"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0
    assert "no_such_flag" in out.stderr + out.stdout


def test_unknown_program_name():
    assert _mooncake._run_cli("no_such_program", ["no_such_program"]) == 127


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_master_and_client_stop_cleanly_on_signals(sig):
    from conftest import Cluster, MooncakeClientProc

    cluster = Cluster()
    client = MooncakeClientProc(cluster, segment="16 MB")
    assert procs.port_open(client.port)
    assert client.proc.stop(sig) == 0, client.proc.output()
    assert procs.port_open(cluster.rpc_port)
    assert cluster.proc.stop(sig) == 0, cluster.proc.output()
    assert not procs.port_open(cluster.rpc_port)


def test_master_bad_flag():
    out = subprocess.run([procs.program("mooncake_master"), "--rpc_port=notaport"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


def test_master_version():
    out = subprocess.run([procs.program("mooncake_master"), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("mooncake_master version "), out.stdout
    assert "build" in out.stdout


def test_embedded_metadata_server_health(cluster):
    import urllib.request

    base = cluster.metadata.rsplit("/", 1)[0]
    with urllib.request.urlopen(f"{base}/health", timeout=10) as r:
        assert (r.status, r.read()) == (200, b"OK")
