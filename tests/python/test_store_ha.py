"""HA through the Python API: two `mooncake_master --enable_ha` on a real
etcd (`MOONCAKE_TEST_ETCD`, which the test script starts, or one started
here), and a store given `etcd://…` as its master, as in the reference's
deployment guide."""

from __future__ import annotations

import os
import signal
import tempfile
import time

import pytest

import procs


def ha_master(etcd: str, cluster_id: str, *flags: str) -> tuple[procs.Proc, int]:
    port = procs.free_port()
    p = procs.start(
        "mooncake_master", "--enable_ha=true", f"--etcd_endpoints={etcd}",
        f"--cluster_id={cluster_id}", f"--rpc_port={port}",
        f"--rpc_address={procs.LOOPBACK}", f"--metrics_host={procs.LOOPBACK}",
        "--metrics_port=0", "--client_ttl=2", *flags,
    )
    return p, port


def test_store_follows_the_leader(etcd, metadata_server, monkeypatch):
    from mooncake.store import MooncakeDistributedStore

    cluster_id = f"py-ha-{os.getpid()}"
    monkeypatch.setenv("MC_STORE_CLUSTER_ID", cluster_id)
    a, a_port = ha_master(etcd, cluster_id)
    b = None
    store = MooncakeDistributedStore()
    try:
        a.wait_for_line(rf"listening on rpc={procs.LOOPBACK}:{a_port}")
        b, b_port = ha_master(etcd, cluster_id)
        rc = store.setup(procs.LOOPBACK, metadata_server, 32 << 20, 16 << 20, "tcp", "", f"etcd://{etcd}")
        assert rc == 0
        assert store.put("before", b"x" * 1000) == 0
        assert store.get("before") == b"x" * 1000
        assert not procs.port_open(b_port), "the standby must not serve while A leads"

        a.stop(signal.SIGKILL)
        b.wait_for_line(rf"listening on rpc={procs.LOOPBACK}:{b_port}", timeout=60)
        # The new leader starts empty; the store remounts its segment on its
        # next heartbeat, then puts work again.
        deadline = time.monotonic() + 60
        while store.put("after", b"y" * 1000) != 0:
            assert time.monotonic() < deadline, "no put through the new leader"
            time.sleep(0.1)
        assert store.get("after") == b"y" * 1000
        assert store.is_exist("before") == 0
    finally:
        store.close()
        a.stop()
        if b is not None:
            b.stop()


def test_ha_master_address_without_a_leader_fails_setup(etcd, metadata_server, monkeypatch):
    from mooncake.store import MooncakeDistributedStore

    monkeypatch.setenv("MC_STORE_CLUSTER_ID", f"py-ha-nobody-{os.getpid()}")
    store = MooncakeDistributedStore()
    rc = store.setup(procs.LOOPBACK, metadata_server, 0, 16 << 20, "tcp", "", f"etcd://{etcd}")
    assert rc == -1, "master unreachable: -1, as the reference"


@pytest.fixture(scope="module")
def k8s_api():
    """The Kubernetes API stand-in (`k8s-standin`, built by `cargo test`;
    `MOONCAKE_TEST_K8S_STANDIN`, which the test script sets): yields the
    path of a kubeconfig pointing at it."""
    standin = os.environ.get("MOONCAKE_TEST_K8S_STANDIN")
    if not standin:
        pytest.skip("no API stand-in: set MOONCAKE_TEST_K8S_STANDIN (scripts/test-python.sh does)")
    with tempfile.TemporaryDirectory() as d:
        kubeconfig = os.path.join(d, "kubeconfig")
        p = procs.Proc([standin, "--token=py-t0ken", f"--kubeconfig={kubeconfig}"])
        try:
            p.wait_for_line(r"^http://")
            yield kubeconfig
        finally:
            p.stop()


def k8s_master(kubeconfig: str, lease: str) -> tuple[procs.Proc, int]:
    port = procs.free_port()
    p = procs.start(
        "mooncake_master", "--enable_ha=true", "--ha_backend_type=k8s",
        f"--ha_backend_connstring=default/{lease}", f"--rpc_port={port}",
        f"--rpc_address={procs.LOOPBACK}", f"--metrics_host={procs.LOOPBACK}",
        "--metrics_port=0", "--client_ttl=2",
        env={"KUBECONFIG": kubeconfig, "POD_NAME": "", "POD_NAMESPACE": ""},
    )
    return p, port


def test_store_follows_the_leader_of_a_k8s_lease(k8s_api, metadata_server, monkeypatch):
    from mooncake.store import MooncakeDistributedStore

    monkeypatch.setenv("KUBECONFIG", k8s_api)
    lease = f"py-{os.getpid()}"
    a, a_port = k8s_master(k8s_api, lease)
    b = None
    store = MooncakeDistributedStore()
    try:
        a.wait_for_line(rf"listening on rpc={procs.LOOPBACK}:{a_port}")
        b, b_port = k8s_master(k8s_api, lease)
        rc = store.setup(procs.LOOPBACK, metadata_server, 32 << 20, 16 << 20, "tcp", "", f"k8s://default/{lease}")
        assert rc == 0
        assert store.put("before", b"x" * 1000) == 0
        assert not procs.port_open(b_port), "the standby must not serve while A leads"

        a.stop(signal.SIGKILL)
        b.wait_for_line(rf"listening on rpc={procs.LOOPBACK}:{b_port}", timeout=60)
        deadline = time.monotonic() + 60
        while store.put("after", b"y" * 1000) != 0:
            assert time.monotonic() < deadline, "no put through the new leader"
            time.sleep(0.1)
        assert store.get("after") == b"y" * 1000
        assert store.is_exist("before") == 0
    finally:
        store.close()
        a.stop()
        if b is not None:
            b.stop()


def test_a_malformed_k8s_master_address_fails_setup(metadata_server):
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup(procs.LOOPBACK, metadata_server, 0, 16 << 20, "tcp", "", "k8s://a/b/c")
    assert rc != 0


def test_kv_event_numbers_go_on_across_a_failover(etcd, metadata_server, monkeypatch):
    """Each master binds its own KV-event socket; a consumer of both sees the
    new leader's batch numbers continue above the old leader's (a gap, not a
    restart at 1)."""
    zmq = pytest.importorskip("zmq")
    from mooncake.store import MooncakeDistributedStore

    cluster_id = f"py-ha-ev-{os.getpid()}"
    monkeypatch.setenv("MC_STORE_CLUSTER_ID", cluster_id)
    ports = [procs.free_port(), procs.free_port()]
    ev = [f"tcp://{procs.LOOPBACK}:{p}" for p in ports]
    flags = lambda i: ("--enable_kv_events=true", f"--kv_events_bind_endpoint={ev[i]}",
                       "--kv_events_backend_id=ha-pool")
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 200)
    a, a_port = ha_master(etcd, cluster_id, *flags(0))
    b = None
    store = MooncakeDistributedStore()

    def next_seq(key_base: int) -> int:
        """Puts keys until a batch arrives (a PUB socket drops what it sends
        before the subscription reaches it); that batch's number."""
        deadline = time.monotonic() + 60
        n = 0
        while time.monotonic() < deadline:
            n += 1
            if store.put(hex(key_base + n), b"v") != 0:
                time.sleep(0.1)
                continue
            try:
                return int.from_bytes(sub.recv_multipart()[1], "big")
            except zmq.Again:
                continue
        pytest.fail("no KV event arrived")

    try:
        a.wait_for_line(rf"listening on rpc={procs.LOOPBACK}:{a_port}")
        b, b_port = ha_master(etcd, cluster_id, *flags(1))
        for e in ev:
            sub.connect(e)
        assert store.setup(procs.LOOPBACK, metadata_server, 32 << 20, 16 << 20, "tcp", "", f"etcd://{etcd}") == 0
        started_ms = int(time.time() * 1000)
        seq_a = next_seq(0x1000)
        # A leader numbers from its wall-clock base, not from 1.
        assert seq_a >= (started_ms - 60_000) * 1000, seq_a
        a.stop(signal.SIGKILL)
        b.wait_for_line(rf"listening on rpc={procs.LOOPBACK}:{b_port}", timeout=60)
        seq_b = next_seq(0x2000)
        assert seq_b > seq_a, (seq_a, seq_b)
    finally:
        store.close()
        sub.close(linger=0)
        ctx.destroy(linger=0)  # closes what a failed assertion left open
        a.stop()
        if b is not None:
            b.stop()
