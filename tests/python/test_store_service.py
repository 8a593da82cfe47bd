"""`python -m mooncake.mooncake_store_service` (and `mc_store_rest_server`)
as a process: a store holding a segment in a master of the test's own (free
ports), driven over its REST API. The handlers' cases, with a recording
store, are in test_store_service_api.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import procs
from conftest import Cluster



def eventually(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.fixture(scope="module")
def own_cluster():
    # Short leases, as the reference's CI runs its master: a read's lease
    # does not hold up the remove after it for long.
    c = Cluster("--default_kv_lease_ttl=500")
    yield c
    assert c.stop() == 0, c.proc.output()


def service_argv(cluster, port, *extra):
    return [
        f"--port={port}", "--host=127.0.0.1",
        "-Dlocal_hostname=127.0.0.1", f"-Dmetadata_server={cluster.metadata}",
        f"-Dmaster_server_address={cluster.master}", "-Dglobal_segment_size=32MB",
        "-Dlocal_buffer_size=32MB", "-Dprotocol=tcp", *extra,
    ]


def start_service(*argv, program=None, master="127.0.0.1:1"):
    """The service with `argv`; with no --config its settings come from the
    environment (MOONCAKE_MASTER), then from the -D overrides."""
    cmd = [procs.program(program)] if program else [sys.executable, "-m", "mooncake.mooncake_store_service"]
    return procs.Proc(cmd + list(argv), env={"MOONCAKE_MASTER": master})


def http(port, method, path, payload=None):
    """(status, body bytes) of a call to the service."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def running(own_cluster):
    port = procs.free_port()
    p = start_service(*service_argv(own_cluster, port), master=own_cluster.master)
    p.wait_for_line(r"Mooncake Store Service is running", timeout=120)
    yield port
    assert p.stop(signal.SIGTERM) == 0, p.output()
    assert "Mooncake service stopped" in p.output()


def test_process_put_get_exist_remove(running):
    port = running
    value = "héllo wörld " * 1000
    assert http(port, "PUT", "/api/put", {"key": "svc-a", "value": value}) == (200, b'{"status": "success"}')
    status, got = http(port, "GET", "/api/get/svc-a")
    assert (status, got) == (200, value.encode())
    assert json.loads(http(port, "GET", "/api/exist/svc-a")[1]) == {"exists": True}
    # The read leased the object (500 ms here): the remove waits it out.
    assert eventually(lambda: http(port, "DELETE", "/api/remove/svc-a")[0] == 200)
    assert json.loads(http(port, "GET", "/api/exist/svc-a")[1]) == {"exists": False}
    status, got = http(port, "GET", "/api/get/svc-a")
    assert (status, json.loads(got)) == (404, {"error": "Key not found"})
    # Removing what is not there is the store's error (-704), as a 500.
    assert http(port, "DELETE", "/api/remove/svc-a")[0] == 500


def test_process_bad_requests(running):
    port = running
    status, got = http(port, "PUT", "/api/put", {"key": "k"})
    assert (status, json.loads(got)) == (400, {"error": "Missing key or value"})
    assert http(port, "PUT", "/api/put", {"key": "k", "value": 5})[0] == 400
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/put", data=b"{not json", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 500
    assert http(port, "POST", "/api/reconfigure", {"mode": "sideways"})[0] == 400
    assert http(port, "POST", "/api/mount", {"size": -1})[0] == 400
    assert http(port, "POST", "/api/unmount_local_disk", {"grace_period_seconds": 3601})[0] == 400
    assert http(port, "GET", "/api/put")[0] == 405
    assert http(port, "GET", "/api/nothing")[0] == 404


def test_process_remove_all(running):
    port = running
    for i in range(3):
        assert http(port, "PUT", "/api/put", {"key": f"svc-all-{i}", "value": "v"})[0] == 200
    status, got = http(port, "DELETE", "/api/remove_all")
    assert status == 200
    assert json.loads(got) == {"status": "success removed 3 keys"}
    assert json.loads(http(port, "GET", "/api/exist/svc-all-0")[1]) == {"exists": False}


def test_process_segment_routes(running, own_cluster):
    """Segments mounted and unmounted through the service: allocated
    memory, a /dev/shm file, and a decode reconfiguration; the master lists
    each while it is mounted; unmounting the local disk segment of a store
    without one answers 200."""
    port = running

    def listed():
        url = f"http://127.0.0.1:{own_cluster.metrics_port}/get_segments_detail"
        with urllib.request.urlopen(url, timeout=10) as r:
            return {x["segment_name"] for x in json.loads(r.read())["segments"]}

    status, got = http(port, "POST", "/api/mount", {"size": 8 << 20})
    assert status == 200, got
    body = json.loads(got)
    assert body["allocated_size"] == 8 << 20
    (seg,) = body["segment_ids"]
    assert seg in listed()
    status, got = http(port, "POST", "/api/unmount", {"segment_ids": [seg]})
    assert status == 200, got
    assert seg not in listed()
    assert http(port, "POST", "/api/unmount", {"segment_ids": [seg]})[0] == 500, "already gone"

    name = f"mooncake-svc-test-{os.getpid()}"
    with open(f"/dev/shm/{name}", "wb") as f:
        f.truncate(4 << 20)
    try:
        status, got = http(port, "POST", "/api/mount_shm", {"name": name, "size": 4 << 20})
        assert status == 200, got
        (shm,) = json.loads(got)["segment_ids"]
        assert shm in listed()
        status, got = http(port, "POST", "/api/unmount_shm", {"segment_ids": [shm]})
        assert status == 200, got
        assert shm not in listed()

        status, got = http(port, "POST", "/api/reconfigure",
                           {"mode": "decode", "path": f"/dev/shm/{name}", "size": 2 << 20})
        assert status == 200, got
        decode = json.loads(got)["segment_ids"]
        assert set(decode) <= listed()
        status, got = http(port, "POST", "/api/reconfigure", {"mode": "prefill"})
        assert status == 200, got
        assert not set(decode) & listed()
    finally:
        os.unlink(f"/dev/shm/{name}")
    # This store has no SSD tier: nothing to withdraw (200, as the reference).
    status, got = http(port, "POST", "/api/unmount_local_disk", {})
    assert status == 200, got


def test_process_console_script_and_config_file(own_cluster, tmp_path):
    """`mc_store_rest_server` with a config file; SIGINT stops it."""
    port = procs.free_port()
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({
        "local_hostname": "127.0.0.1", "metadata_server": own_cluster.metadata,
        "master_server_address": own_cluster.master, "global_segment_size": "16MB",
        "local_buffer_size": "16MB", "protocol": "tcp",
    }))
    p = start_service(f"--config={path}", f"--port={port}", "--host=127.0.0.1", program="mc_store_rest_server")
    try:
        p.wait_for_line(r"Mooncake Store Service is running", timeout=120)
        assert http(port, "PUT", "/api/put", {"key": "svc-cfg", "value": "x"})[0] == 200
        assert http(port, "GET", "/api/get/svc-cfg") == (200, b"x")
    finally:
        assert p.stop(signal.SIGINT) == 0, p.output()


def test_process_gives_up_without_a_master():
    """No master on the address: retried for --max-wait-time, then exit 1."""
    dead = procs.free_port()
    p = start_service(
        f"--port={procs.free_port()}", "--max-wait-time=3", "-Dlocal_hostname=127.0.0.1",
        "-Dmetadata_server=P2PHANDSHAKE", "-Dglobal_segment_size=16MB", "-Dlocal_buffer_size=16MB",
        master=f"127.0.0.1:{dead}",
    )
    assert p.p.wait(120) == 1, p.output()
    assert "Failed to start store service" in p.output()


@pytest.mark.parametrize("argv,message", [
    (["-Dno_such_field=1"], "no_such_field"),
    (["-Dlocal_hostname"], "key=value"),
    (["-Dglobal_segment_size=lots"], "Invalid size"),
])
def test_process_rejects_bad_settings(argv, message):
    p = start_service("--port=1", *argv)
    code = p.p.wait(60)
    assert code != 0, p.output()
    assert message in p.output()


def test_process_without_any_config_says_so():
    env = {k: v for k, v in os.environ.items() if k not in ("MOONCAKE_CONFIG_PATH", "MOONCAKE_MASTER")}
    r = subprocess.run(
        [sys.executable, "-m", "mooncake.mooncake_store_service", "--port=1"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 1, r
    assert "MOONCAKE_MASTER" in r.stderr


def test_subprocess_help_lists_the_flags():
    out = subprocess.run(
        [sys.executable, "-m", "mooncake.mooncake_store_service", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for flag in ("--config", "--define", "--port", "--max-wait-time", "--host"):
        assert flag in out, flag
