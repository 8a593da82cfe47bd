"""The store with several processes: dummy clients of a `mooncake_client`,
replicas on two storage processes, replica descriptors, threads hammering one
client, and the GIL being released while the client waits on the network."""

from __future__ import annotations

import ctypes
import os
import random
import signal
import threading

import pytest

from conftest import Cluster, MooncakeClientProc, new_store, storage_cluster
from pymeta import PyMetadataServer
from mooncake.store import MooncakeDistributedStore, ReplicateConfig, ReplicaStatus

MiB = 1 << 20


@pytest.fixture(scope="module")
def own_cluster():
    c = Cluster()
    yield c
    assert c.stop() == 0, c.proc.output()


# ---- dummy clients ---------------------------------------------------------------


@pytest.fixture(scope="module")
def real_client(own_cluster):
    rc = MooncakeClientProc(own_cluster, segment="64 MB")
    yield rc
    assert rc.stop() == 0, rc.proc.output()


def accepted_on_unix_socket(port):
    """Connections the mooncake_client on `port` accepted on its abstract
    Unix socket (the kernel lists them under the listener's name)."""
    name = f"@mooncake_client_{port}.sock"
    with open("/proc/net/unix") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(1 for f in rows if len(f) == 8 and f[5] == "03" and f[7] == name)


def test_dummy_clients_share_a_mooncake_client(own_cluster, real_client):
    a, b = MooncakeDistributedStore(), MooncakeDistributedStore()
    port = int(real_client.address.rsplit(":", 1)[1])
    assert accepted_on_unix_socket(port) == 0
    assert a.setup_dummy(16 * MiB, 16 * MiB, real_client.address) == 0
    assert b.setup_dummy(16 * MiB, 16 * MiB, real_client.address) == 0
    # On the mooncake_client's host, dummies come over its Unix socket.
    assert accepted_on_unix_socket(port) >= 2
    try:
        value = os.urandom(3 * MiB)
        assert a.put("dummy-k", value) == 0
        assert b.get("dummy-k") == value
        assert b.is_exist("dummy-k") == 1 and b.get_size("dummy-k") == len(value)
        assert a.put_batch(["d1", "d2"], [b"1", b"22"]) == 0
        assert b.get_batch(["d1", "d2", "dx"]) == [b"1", b"22", b""]
        h = b.get_buffer("d2")
        assert bytes(h) == b"22"
        # zero copy through the memory pool shared with the mooncake_client
        p = a.alloc_from_mem_pool(4096)
        assert p != 0
        ctypes.memset(p, 0x41, 4096)
        assert a.put_from("dummy-zc", p, 4096) == 0
        q = b.alloc_from_mem_pool(4096)
        assert b.get_into("dummy-zc", q, 4096) == 4096
        assert ctypes.string_at(q, 4096) == b"A" * 4096
        # and a pure client of the cluster sees the same objects
        plain = new_store(own_cluster, segment=0, local_buffer=16 * MiB)
        try:
            assert plain.get("dummy-k") == value
        finally:
            plain.close()
        assert a.remove("dummy-k", force=True) == 0
        assert b.get("dummy-k") == b""
        assert a.upsert("d1", b"new") == 0 and b.get("d1") == b"new"
        assert b.remove_by_regex("^d[12]$", force=True) == 2
    finally:
        assert a.close() == 0 and b.close() == 0
    assert a.get("d1") == b""


def test_setup_dummy_without_server_fails():
    import procs

    s = MooncakeDistributedStore()
    assert s.setup_dummy(16 * MiB, 16 * MiB, f"127.0.0.1:{procs.free_port()}") < 0
    assert s.get_hostname() == ""


# ---- replicas -----------------------------------------------------------------------


def test_two_replicas_survive_losing_a_storage_process():
    with storage_cluster(segment="32 MB") as (reader, nodes):
        cfg = ReplicateConfig()
        cfg.replica_num = 2
        values = {f"rep{i}": os.urandom(100_000 + i) for i in range(10)}
        for k, v in values.items():
            assert reader.put(k, v, cfg) == 0
        descs = reader.get_replica_desc("rep0")
        assert len(descs) == 2
        endpoints = {d.get_memory_descriptor().buffer_descriptor.transport_endpoint for d in descs}
        assert len(endpoints) == 2, "replicas on distinct storage processes"
        for d in descs:
            assert d.status == ReplicaStatus.COMPLETE and d.is_memory_replica() and not d.is_disk_replica()
            assert d.get_memory_descriptor().buffer_descriptor.size == 100_000
            with pytest.raises(RuntimeError):
                d.get_disk_descriptor()
        batch = reader.batch_get_replica_desc(["rep1", "missing"])
        assert list(batch) == ["rep1"] and len(batch["rep1"]) == 2
        assert reader.get_replica_desc("missing") == []

        # one storage process dies without a word: every object is still readable
        nodes[0].proc.p.send_signal(signal.SIGKILL)
        nodes[0].proc.p.wait(10)
        for k, v in values.items():
            assert reader.get(k) == v, k


def test_single_replica_when_one_segment_exists(cluster, store):
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    assert store.put("lonely", b"x", cfg) == 0
    assert len(store.get_replica_desc("lonely")) >= 1


def test_tasks_and_replica_clear(store):
    assert store.put("task-k", b"x") == 0
    task, code = store.create_copy_task("missing", ["nosuch:1"])
    assert task == (0, 0) and code == -704
    task, code = store.create_move_task("task-k", "a", "b")
    assert task == (0, 0) and code < 0
    assert store.query_task((0, 0)) == (None, -1400)
    assert store.get("task-k") == b"x"
    assert store.batch_replica_clear(["task-k"]) == [], "leased by the read"


# ---- concurrency -----------------------------------------------------------------


def test_threads_share_one_client(store):
    errors = []

    def worker(t):
        rnd = random.Random(t)
        mine = {}
        for i in range(60):
            key = f"stress-{t}-{i % 15}"
            op = rnd.random()
            if op < 0.5:
                v = os.urandom(rnd.choice([1, 100, 4096, 70_000]))
                rc = store.upsert(key, v)
                if rc != 0:
                    errors.append(("upsert", key, rc))
                else:
                    mine[key] = v
            elif op < 0.8:
                got = store.get(key)
                if key in mine and got != mine[key]:
                    errors.append(("get", key, len(got)))
            elif op < 0.9:
                want = 1 if key in mine else 0
                if store.is_exist(key) != want:
                    errors.append(("is_exist", key))
            else:
                rc = store.remove(key, force=True)
                if rc not in (0, -704) or (key in mine and rc != 0):
                    errors.append(("remove", key, rc))
                mine.pop(key, None)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_blocking_calls_release_the_gil(cluster):
    """Both stores resolve each other through a metadata server written in
    Python: a get can only finish if it let that server's thread run."""
    meta = PyMetadataServer()
    owner = reader = None
    try:
        owner = MooncakeDistributedStore()
        assert owner.setup("127.0.0.1", meta.url, 16 * MiB, 16 * MiB, "tcp", "", cluster.master) == 0
        cfg = ReplicateConfig()
        cfg.preferred_segment = owner.get_hostname()
        assert owner.put("gil-k", b"gil value", cfg) == 0
        reader = MooncakeDistributedStore()
        assert reader.setup("127.0.0.1", meta.url, 0, 16 * MiB, "tcp", "", cluster.master) == 0
        gets = meta.gets
        out = []
        t = threading.Thread(target=lambda: out.append(reader.get("gil-k")))
        t.start()
        t.join(60)
        assert out == [b"gil value"]
        assert meta.gets > gets
    finally:
        for s in (reader, owner):
            if s is not None:
                s.close()
        meta.close()
