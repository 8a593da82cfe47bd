"""Shared fixtures: real processes of the installed package on loopback."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import procs  # noqa: E402


@pytest.fixture(scope="session")
def metadata_server():
    """A `mooncake_http_metadata_server`; yields its metadata URL."""
    p = procs.start("mooncake_http_metadata_server", "--port=0", f"--host={procs.LOOPBACK}")
    try:
        m = p.wait_for_line(r"listening on ([\d.]+):(\d+)")
        yield f"http://{procs.LOOPBACK}:{m.group(2)}/metadata"
    finally:
        assert p.stop() == 0, p.output()


class Cluster:
    """A running `mooncake_master` with its embedded HTTP metadata server."""

    def __init__(self, *flags: str):
        self.rpc_port = procs.free_port()
        self.http_port = procs.free_port()
        self.metrics_port = procs.free_port()
        self.proc = procs.start(
            "mooncake_master",
            f"--rpc_port={self.rpc_port}",
            f"--rpc_address={procs.LOOPBACK}",
            "--enable_http_metadata_server=true",
            f"--http_metadata_server_host={procs.LOOPBACK}",
            f"--http_metadata_server_port={self.http_port}",
            f"--metrics_port={self.metrics_port}",
            # The suite cleans up with remove_all(force=True), an admin call.
            "--allow_force_remove_all=true",
            *flags,
        )
        self.proc.wait_for_line(r"mooncake_master listening on rpc=")
        self.master = f"{procs.LOOPBACK}:{self.rpc_port}"
        self.metadata = f"http://{procs.LOOPBACK}:{self.http_port}/metadata"

    def stop(self) -> int:
        return self.proc.stop()


class ExternalCluster:
    """A cluster someone else runs: MOONCAKE_TEST_CLUSTER="<master>,<metadata
    URL>[,<admin port>]". Lets a test file run against another package (the
    reference) unchanged."""

    def __init__(self, spec: str):
        self.master, self.metadata, *rest = spec.split(",")
        self.metrics_port = int(rest[0]) if rest else None


@pytest.fixture(scope="module")
def etcd():
    """A real etcd: `MOONCAKE_TEST_ETCD` (the test script starts one), else
    one started here for the module."""
    addr = os.environ.get("MOONCAKE_TEST_ETCD")
    if addr:
        yield addr
        return
    if shutil.which("etcd") is None:
        pytest.skip("no etcd: set MOONCAKE_TEST_ETCD or install etcd-server")
    client, peer = procs.free_port(), procs.free_port()
    with tempfile.TemporaryDirectory() as data:
        peer_url = f"http://{procs.LOOPBACK}:{peer}"
        p = procs.Proc([
            "etcd", "--name=test", f"--data-dir={data}",
            f"--listen-client-urls=http://{procs.LOOPBACK}:{client}",
            f"--advertise-client-urls=http://{procs.LOOPBACK}:{client}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=test={peer_url}",
        ])
        try:
            p.wait_port(client)
            yield f"{procs.LOOPBACK}:{client}"
        finally:
            p.stop()


@pytest.fixture(scope="session")
def cluster():
    if os.environ.get("MOONCAKE_TEST_CLUSTER"):
        yield ExternalCluster(os.environ["MOONCAKE_TEST_CLUSTER"])
        return
    c = Cluster()
    try:
        yield c
    finally:
        assert c.stop() == 0, c.proc.output()


def new_store(cluster, segment=64 << 20, local_buffer=64 << 20, hostname="127.0.0.1"):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup(hostname, cluster.metadata, segment, local_buffer, "tcp", "", cluster.master)
    assert rc == 0, rc
    return s


@pytest.fixture(scope="module")
def store(cluster):
    """A store owning a 64 MiB segment; every key it wrote is removed after the module."""
    s = new_store(cluster)
    yield s
    s.remove_all(force=True)
    s.close()


class Buffer:
    """A host buffer registered with `store`; ``at(offset)`` is an address inside it."""

    def __init__(self, store, size=1 << 20):
        self.store, self.size = store, size
        self.mem = (ctypes.c_ubyte * size)()
        self.ptr = ctypes.addressof(self.mem)
        assert store.register_buffer(self.ptr, size) == 0

    def at(self, offset: int) -> int:
        return self.ptr + offset

    def close(self):
        assert self.store.unregister_buffer(self.ptr) == 0


@pytest.fixture
def buf(store):
    b = Buffer(store)
    yield b
    b.close()


class MooncakeClientProc:
    """A standalone `mooncake_client` (real client serving dummy clients)."""

    def __init__(self, cluster, segment="64 MB"):
        self.port = procs.free_port()
        self.proc = procs.start(
            "mooncake_client",
            f"--master_server_address={cluster.master}",
            f"--metadata_server={cluster.metadata}",
            f"--host={procs.LOOPBACK}",
            f"--port={self.port}",
            f"--global_segment_size={segment}",
            "--protocol=tcp",
        )
        self.proc.wait_for_line(r"mooncake_client ready")
        self.address = f"{procs.LOOPBACK}:{self.port}"

    def stop(self) -> int:
        return self.proc.stop()


@contextlib.contextmanager
def storage_cluster(*flags: str, nodes: int = 2, segment: str = "16 MB", local_buffer: int = 32 << 20):
    """A master (with `flags`), `nodes` storage processes (`mooncake_client`
    with `segment` each) and a pure client of them; yields `(client, nodes)`
    and stops everything afterwards."""
    cluster = Cluster(*flags)
    storage = []
    client = None
    try:
        storage = [MooncakeClientProc(cluster, segment=segment) for _ in range(nodes)]
        client = new_store(cluster, segment=0, local_buffer=local_buffer)
        yield client, storage
    finally:
        if client is not None:
            client.close()
        for n in storage:
            n.stop()
        cluster.stop()
