"""The SSD tier started in-process by `setup(enable_ssd_offload=True,
ssd_offload_path=...)`: objects beyond memory go to files there, stay
readable from this and other clients, and replica descriptors say so."""

from __future__ import annotations

import os
import time

import pytest

from conftest import Cluster
from mooncake.store import MooncakeDistributedStore

MiB = 1 << 20
KEYS = 48
VALUE = 256 << 10


@pytest.fixture(scope="module")
def offload_cluster():
    c = Cluster("--enable_offload=true", "--default_kv_lease_ttl=50")
    yield c
    assert c.stop() == 0, c.proc.output()


def put_retrying(store, key, value):
    # -200 (NO_AVAILABLE_HANDLE) is the tier's back-pressure: retry.
    for _ in range(20000):
        rc = store.put(key, value)
        if rc != -200:
            return rc
    return rc


def test_setup_keywords_start_the_tier(offload_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES", str(64 * MiB))
    owner = MooncakeDistributedStore()
    rc = owner.setup(
        "127.0.0.1", offload_cluster.metadata, 4 * MiB, 16 * MiB, "tcp", "",
        offload_cluster.master, enable_ssd_offload=True, ssd_offload_path=str(tmp_path),
    )
    assert rc == 0
    reader = MooncakeDistributedStore()
    assert reader.setup("127.0.0.1", offload_cluster.metadata, 0, 16 * MiB, "tcp", "",
                        offload_cluster.master) == 0
    try:
        values = {f"py-tier-{i}": os.urandom(VALUE) for i in range(KEYS)}
        for k, v in values.items():
            assert put_retrying(owner, k, v) == 0, k
        for k, v in values.items():
            assert reader.get(k) == v, k
            assert owner.get(k) == v, k
        assert any(p.suffix == ".bucket" for p in tmp_path.iterdir())
        descs = reader.batch_get_replica_desc(list(values))
        disk_only = [k for k, reps in descs.items()
                     if reps and all(r.is_local_disk_replica() for r in reps)]
        assert len(disk_only) > KEYS // 2
        for r in descs[disk_only[0]]:
            assert not r.is_memory_replica() and not r.is_disk_replica()
        # Reads of disk-only objects from another client go to the owner's
        # tier service over RPC, and are counted there only.
        before = reader.get_offload_rpc_read_count()
        assert reader.get(disk_only[0]) == values[disk_only[0]]
        assert reader.get_offload_rpc_read_count() > before
        own = owner.get_offload_rpc_read_count()
        assert owner.get(disk_only[0]) == values[disk_only[0]]
        assert owner.get_offload_rpc_read_count() == own, "its own tier is read in place"
    finally:
        reader.close()
        owner.close()


def test_the_tier_needs_offload_on_the_master(tmp_path):
    c = Cluster()
    try:
        s = MooncakeDistributedStore()
        rc = s.setup("127.0.0.1", c.metadata, 4 * MiB, 16 * MiB, "tcp", "", c.master,
                     enable_ssd_offload=True, ssd_offload_path=str(tmp_path))
        assert rc != 0
    finally:
        assert c.stop() == 0


def test_unmount_local_disk_segment_withdraws_the_tier(offload_cluster, tmp_path, monkeypatch):
    """A pre-stop hook: the tier leaves the master with the objects held
    only there; objects in memory stay readable; a second call and a call
    on a store without a tier answer 0, as the reference's."""
    monkeypatch.setenv("MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES", str(64 * MiB))
    owner = MooncakeDistributedStore()
    assert owner.setup(
        "127.0.0.1", offload_cluster.metadata, 4 * MiB, 16 * MiB, "tcp", "",
        offload_cluster.master, enable_ssd_offload=True, ssd_offload_path=str(tmp_path),
    ) == 0
    reader = MooncakeDistributedStore()
    assert reader.setup("127.0.0.1", offload_cluster.metadata, 0, 16 * MiB, "tcp", "",
                        offload_cluster.master) == 0
    try:
        values = {f"py-unmount-{i}": os.urandom(VALUE) for i in range(KEYS)}
        for k, v in values.items():
            assert put_retrying(owner, k, v) == 0, k
        descs = reader.batch_get_replica_desc(list(values))
        disk_only = [k for k, reps in descs.items()
                     if reps and all(r.is_local_disk_replica() for r in reps)]
        in_memory = [k for k, reps in descs.items()
                     if any(r.is_memory_replica() for r in reps)]
        assert disk_only and in_memory
        assert owner.unmount_local_disk_segment() == 0
        for k in disk_only:
            assert reader.is_exist(k) == 0, k
        after = reader.batch_get_replica_desc(in_memory)
        for k in in_memory:
            assert after[k] and not any(r.is_local_disk_replica() for r in after[k]), k
            assert reader.get(k) == values[k], k
        # New puts get no copy: the tier takes no more work.
        assert put_retrying(owner, "py-unmount-late", b"x" * VALUE) == 0
        time.sleep(1)
        # (Evicted meanwhile, it is gone: no tier keeps it.)
        late = reader.batch_get_replica_desc(["py-unmount-late"]).get("py-unmount-late") or []
        assert not any(r.is_local_disk_replica() for r in late)
        assert owner.unmount_local_disk_segment(0) == 0
        assert reader.unmount_local_disk_segment() == 0, "no tier: nothing to do"
        start = time.monotonic()
        assert owner.unmount_local_disk_segment(grace_period_seconds=1) == 0
        assert time.monotonic() - start >= 1.0
    finally:
        reader.close()
        owner.close()


def test_unmount_local_disk_segment_without_a_tier():
    c = Cluster()
    try:
        s = MooncakeDistributedStore()
        assert s.setup("127.0.0.1", c.metadata, 4 * MiB, 16 * MiB, "tcp", "", c.master) == 0
        # No tier here: nothing to withdraw, as the reference's.
        assert s.unmount_local_disk_segment() == 0
        s.close()
        assert s.unmount_local_disk_segment() == -1, "closed"
    finally:
        assert c.stop() == 0
