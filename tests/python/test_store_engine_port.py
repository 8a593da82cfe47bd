"""The engine a store runs on: which port it listens on (the name's port is
only a name, with a metadata server), a TransferEngine shared with the store
(`setup(..., engine=te.get_engine())`), and the setup keywords that warn when
they have no effect. Each behaviour was checked on the reference package."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import procs
from conftest import Cluster, new_store
from mooncake.engine import TransferEngine
from mooncake.store import MooncakeDistributedStore, ReplicateConfig

MB = 1 << 20


def rpc_meta(cluster, name):
    """The `mooncake/rpc_meta/<name>` entry the engine published."""
    key = urllib.parse.quote(f"mooncake/rpc_meta/{name}", safe="")
    with urllib.request.urlopen(f"{cluster.metadata}?key={key}", timeout=10) as r:
        return json.loads(r.read())


def engine(cluster, name):
    e = TransferEngine()
    assert e.initialize(name, cluster.metadata, "tcp", "") == 0
    return e


def setup_store(cluster, name, **kw):
    s = MooncakeDistributedStore()
    rc = s.setup(name, cluster.metadata, 32 * MB, 32 * MB, "tcp", "", cluster.master, **kw)
    return s, rc


def test_store_names_a_port_another_engine_holds(cluster):
    holder = engine(cluster, f"127.0.0.1:{procs.free_port()}")
    held = holder.get_rpc_port()
    assert procs.port_open(held), "the holder engine listens on its rpc port"
    names = [f"localhost:{held}", f"localhost:{held + 1}"]
    a, rc_a = setup_store(cluster, names[0])
    b, rc_b = setup_store(cluster, names[1])
    try:
        assert (rc_a, rc_b) == (0, 0)
        assert [a.get_hostname(), b.get_hostname()] == names
        for name in names:
            meta = rpc_meta(cluster, name)
            assert meta["rpc_port"] != held and procs.port_open(meta["rpc_port"])
        payload = os.urandom(3 * MB)
        assert a.put("port-held/a", payload) == 0
        assert b.get("port-held/a") == payload
        assert b.put("port-held/b", payload[::-1]) == 0
        assert a.get("port-held/b") == payload[::-1]
    finally:
        a.close()
        b.close()
    assert holder.get_rpc_port() == held


def test_engine_rpc_port_is_the_listening_one(cluster):
    named = procs.free_port()
    e = engine(cluster, f"127.0.0.1:{named}")
    port = e.get_rpc_port()
    assert port != named and procs.port_open(port)
    assert not procs.port_open(named)
    assert rpc_meta(cluster, f"127.0.0.1:{named}")["rpc_port"] == port


def test_legacy_binding_listens_on_the_named_port(cluster, monkeypatch):
    monkeypatch.setenv("MC_LEGACY_RPC_PORT_BINDING", "1")
    named = procs.free_port()
    e = engine(cluster, f"127.0.0.1:{named}")
    assert e.get_rpc_port() == named and procs.port_open(named)
    # The named port taken: the legacy engine cannot start.
    with socket.socket() as s:
        taken = procs.free_port()
        s.bind(("0.0.0.0", taken))
        s.listen()
        assert TransferEngine().initialize(f"127.0.0.1:{taken}", cluster.metadata, "tcp", "") == -1


def test_p2p_name_carries_the_picked_port():
    a, b = TransferEngine(), TransferEngine()
    named = procs.free_port()
    assert a.initialize(f"127.0.0.1:{named}", "P2PHANDSHAKE", "tcp", "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    port = a.get_rpc_port()
    assert port != named and procs.port_open(port)
    ba, bb = a.allocate_managed_buffer(MB), b.allocate_managed_buffer(MB)
    assert b.write_bytes_to_buffer(bb, b"p2p", 3) == 0
    assert b.transfer_sync_write(f"127.0.0.1:{port}", bb, ba, 3) == 0
    assert a.read_bytes_from_buffer(ba, 3) == b"p2p"


def test_bind_address_is_published(cluster, monkeypatch):
    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    name = f"localhost:{procs.free_port()}"
    s, rc = setup_store(cluster, name)
    try:
        assert rc == 0
        assert rpc_meta(cluster, name)["ip_or_host_name"] == "127.0.0.1"
        other = new_store(cluster)
        try:
            assert s.put("bind-addr", b"x" * 4096) == 0
            assert other.get("bind-addr") == b"x" * 4096
        finally:
            other.close()
    finally:
        s.close()


def test_store_on_a_shared_engine(cluster):
    te = engine(cluster, f"127.0.0.1:{procs.free_port()}")
    name, port = f"127.0.0.1:{te.get_rpc_port()}", te.get_rpc_port()
    own = te.allocate_managed_buffer(MB)
    assert te.write_bytes_to_buffer(own, b"engine's own", 12) == 0
    store, rc = setup_store(cluster, "127.0.0.1:1", engine=te.get_engine())
    assert rc == 0
    te_name = store.get_hostname()
    assert te_name != "127.0.0.1:1", "the store takes the shared engine's name"
    assert te.get_rpc_port() == port, "no second engine"
    other = new_store(cluster)
    try:
        payload = os.urandom(2 * MB)
        assert store.put("shared/a", payload) == 0
        assert other.get("shared/a") == payload
        assert other.put("shared/b", payload[::-1]) == 0
        assert store.get("shared/b") == payload[::-1]
        assert store.close() == 0
        # The engine keeps working: its own buffer stays reachable by a peer.
        peer_name = f"127.0.0.1:{procs.free_port()}"
        peer = engine(cluster, peer_name)
        pb = peer.allocate_managed_buffer(MB)
        assert te.transfer_sync_read(peer_name, own, pb, 12) == 0
        assert te.read_bytes_from_buffer(own, 12) == b"\0" * 12
        assert te.get_rpc_port() == port and procs.port_open(port)
        # ... and takes a store again.
        again, rc = setup_store(cluster, name, engine=te.get_engine())
        assert rc == 0
        assert again.put("shared/c", b"again") == 0
        assert other.get("shared/c") == b"again"
        again.close()
    finally:
        other.close()


SETUP_SCRIPT = """
import sys
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
master, metadata, kw = sys.argv[1], sys.argv[2], eval(sys.argv[3])
s = MooncakeDistributedStore()
if kw.pop("_dict", False):
    rc = s.setup({"local_hostname": "127.0.0.1", "metadata_server": metadata,
                  "master_server_addr": master, **kw})
else:
    rc = s.setup("127.0.0.1", metadata, 16 << 20, 16 << 20, "tcp", "", master, **kw)
print("rc", rc, flush=True)
s.close()
"""


def setup_stderr(cluster, **kw):
    out = subprocess.run(
        [sys.executable, "-c", SETUP_SCRIPT, cluster.master, cluster.metadata, repr(kw)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "MC_LOG_LEVEL": "WARNING"},
    )
    assert "rc 0" in out.stdout, out.stdout + out.stderr
    return out.stderr


def test_keywords_without_effect_warn(cluster):
    # enable_ssd_offload/ssd_offload_path and enable_client_http_server/
    # client_http_port act (test_store_ssd_tier.py, test_client_metrics.py);
    # a tenant acts on a multi-tenant master (test_tenants.py) and is
    # ignored, as on the reference, by one without that mode.
    assert "setup:" not in setup_stderr(cluster)
    assert "setup:" not in setup_stderr(cluster, tenant_id="default")
    assert "setup:" not in setup_stderr(cluster, tenant_id="team-a")
    assert "setup:" not in setup_stderr(cluster, _dict=True, tenant_id="team-a")


def test_transport_hint_warns_once():
    script = """
from mooncake.engine import TransferEngine
a, b = TransferEngine(), TransferEngine()
assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
ba, bb = a.allocate_managed_buffer(4096), b.allocate_managed_buffer(4096)
peer = f"127.0.0.1:{b.get_rpc_port()}"
for hint in ["", "unspec", "rdma", "rdma", "nvlink"]:
    assert a.transfer_sync_write(peer, ba, bb, 64, transport_hint=hint) == 0
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("transport_hint") == 2, out.stderr
    assert '"rdma"' in out.stderr and '"nvlink"' in out.stderr


HOLDER_SCRIPT = """
import sys, time
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
s = MooncakeDistributedStore()
rc = s.setup("127.0.0.1", sys.argv[2], 16 << 20, 16 << 20, "tcp", "", sys.argv[1])
print("ready", rc, s.put("held-key", b"z" * (1 << 20)), flush=True)
time.sleep(600)
"""


def test_replica_holder_gone_is_transfer_fail():
    """The only replica's holder killed (its segment still listed): reads
    answer TRANSFER_FAIL (-800) as the reference's do, never an engine
    number that reads as a store code (ERR_METADATA -200, ERR_SOCKET -102).
    A cluster of its own: the dead segment stays listed for a while."""
    import ctypes
    import signal

    cluster = Cluster()
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER_SCRIPT, cluster.master, cluster.metadata],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert p.stdout.readline().split() == ["ready", "0", "0"]
        s = new_store(cluster, segment=0)
        buf = ctypes.create_string_buffer(2 * MB)
        addr = ctypes.addressof(buf)
        assert s.register_buffer(addr, 2 * MB) == 0
        assert s.get_into("held-key", addr, 2 * MB) == MB
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert s.get_into("held-key", addr, 2 * MB) == -800
        assert s.batch_get_into(["held-key"], [addr], [2 * MB]) == [-800]
        assert s.get("held-key") == b""
        s.close()
    finally:
        p.kill()
        p.wait()
        assert cluster.stop() == 0


def test_a_name_in_use_is_refused_and_its_owner_keeps_it(cluster):
    name = f"127.0.0.1:{procs.free_port()}"
    first, rc = setup_store(cluster, name)
    assert rc == 0
    try:
        owner = rpc_meta(cluster, name)
        second, rc = setup_store(cluster, name)
        assert rc == -600, "the metadata server refuses a second rpc_meta value, as the reference's"
        assert rpc_meta(cluster, name) == owner, "the refused engine removed nothing"
        assert first.put("name-in-use", b"still mine") == 0
        other = new_store(cluster)
        try:
            assert other.get("name-in-use") == b"still mine"
        finally:
            other.close()
    finally:
        first.close()


def test_metadata_server_keeps_the_first_rpc_meta(cluster):
    key = urllib.parse.quote(f"mooncake/rpc_meta/dup-{os.getpid()}", safe="")
    url = f"{cluster.metadata}?key={key}"

    def put(body):
        req = urllib.request.Request(url, data=body, method="PUT")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    assert put(b'{"a":1}') == (200, b"metadata updated")
    assert put(b'{"a":1}') == (200, b"metadata unchanged")
    assert put(b'{"a":2}') == (400, b"Duplicate rpc_meta key not allowed")
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.read() == b'{"a":1}'
    urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10).close()


def test_rdma_without_a_nic_runs_as_the_reference(cluster):
    """No RDMA NIC here (nor an RDMA transport in this build): `rdma` without
    devices serves over TCP, naming devices fails setup (-600 with a named
    port), and the engine starts either way, as the reference's do."""
    s = MooncakeDistributedStore()
    name = f"127.0.0.1:{procs.free_port()}"
    assert s.setup(name, cluster.metadata, 32 * MB, 16 * MB, "rdma", "", cluster.master) == 0
    try:
        # Placed here: the session's cluster may list a killed holder's segment.
        cfg = ReplicateConfig()
        cfg.preferred_segment = name
        assert s.put("rdma-key", b"r" * 100_000, cfg) == 0
        reader = new_store(cluster, segment=0)
        try:
            assert reader.get("rdma-key") == b"r" * 100_000
        finally:
            reader.close()
    finally:
        s.close()
    d = MooncakeDistributedStore()
    assert d.setup(f"127.0.0.1:{procs.free_port()}", cluster.metadata, 32 * MB, 16 * MB, "rdma", "mlx5_0",
                   cluster.master) == -600
    for device in ["", "mlx5_0"]:
        e = TransferEngine()
        assert e.initialize(f"127.0.0.1:{procs.free_port()}", cluster.metadata, "rdma", device) == 0


def test_failed_join_with_a_named_port_is_invalid_params(cluster):
    dead = f"http://127.0.0.1:{procs.free_port()}/metadata"
    s = MooncakeDistributedStore()
    assert s.setup(f"127.0.0.1:{procs.free_port()}", dead, 16 * MB, 16 * MB, "tcp", "", cluster.master) == -600
    assert s.setup("127.0.0.1", dead, 16 * MB, 16 * MB, "tcp", "", cluster.master) == -1
