"""Copy and move tasks, and replica clearing, through the Python API: two
storage processes (`mooncake_client`) execute the tasks the master assigns
them; a pure client creates and follows them. Every wait is bounded."""

from __future__ import annotations

import os
import time

import pytest

from conftest import storage_cluster
from mooncake.store import QueryTaskResponse, ReplicateConfig, TaskStatus, TaskType

MiB = 1 << 20


@pytest.fixture(scope="module")
def task_cluster():
    with storage_cluster("--default_kv_lease_ttl=50", "--client_ttl=2") as (client, nodes):
        segments = [n.proc.wait_for_line(r"segment (\S+)").group(1) for n in nodes]
        yield client, nodes, segments


def pinned(segment: str) -> ReplicateConfig:
    cfg = ReplicateConfig()
    cfg.preferred_segment = segment
    return cfg


def segments_of(store, key: str) -> list[str]:
    return sorted(d.get_memory_descriptor().buffer_descriptor.transport_endpoint for d in store.get_replica_desc(key))


def finished(store, task_id, timeout: float = 30.0) -> QueryTaskResponse:
    deadline = time.monotonic() + timeout
    while True:
        resp, code = store.query_task(task_id)
        assert code == 0 and resp is not None
        if resp.status in (TaskStatus.SUCCESS, TaskStatus.FAILED):
            return resp
        assert time.monotonic() < deadline, f"task {task_id} never finished: {resp!r}"
        time.sleep(0.02)


def test_copy_then_move(task_cluster):
    client, nodes, (a, b) = task_cluster
    value = os.urandom(2 * MiB + 3)
    assert client.put("copied", value, pinned(a)) == 0

    task, code = client.create_copy_task("copied", [b])
    assert code == 0 and task != (0, 0)
    assert isinstance(task, tuple) and len(task) == 2 and all(isinstance(x, int) for x in task)
    resp = finished(client, task)
    assert resp.status == TaskStatus.SUCCESS and resp.message == ""
    assert resp.id == task and resp.type == TaskType.REPLICA_COPY
    assert resp.created_at_ms_epoch > 1_600_000_000_000
    assert resp.last_updated_at_ms_epoch >= resp.created_at_ms_epoch
    assert resp.assigned_client != (0, 0)
    assert repr(resp).startswith(f"QueryTaskResponse(id={task[0]}-{task[1]}, type=0, status=3, created_at=")
    assert segments_of(client, "copied") == sorted([a, b])
    assert client.get("copied") == value

    moved = os.urandom(MiB)
    assert client.put("moved", moved, pinned(a)) == 0
    task, code = client.create_move_task("moved", a, b)
    assert code == 0
    resp = finished(client, task)
    assert (resp.status, resp.type) == (TaskStatus.SUCCESS, TaskType.REPLICA_MOVE)
    assert segments_of(client, "moved") == [b]
    assert client.get("moved") == moved


def test_task_errors(task_cluster):
    client, _, (a, b) = task_cluster
    assert client.put("err-k", b"x" * 100, pinned(a)) == 0
    assert client.create_copy_task("missing", [b]) == ((0, 0), -704)
    assert client.create_copy_task("err-k", ["nosuch:1"]) == ((0, 0), -600)
    assert client.create_move_task("err-k", a, "nosuch:1") == ((0, 0), -600)
    assert client.create_move_task("missing", a, b) == ((0, 0), -704)
    # b holds no replica to move
    task, code = client.create_move_task("err-k", b, a)
    assert task == (0, 0) and code < 0
    assert client.query_task((0, 0)) == (None, -1400)
    assert client.query_task((2**64 - 1, 12345)) == (None, -1400)


def test_batch_replica_clear(task_cluster):
    client, _, (a, b) = task_cluster
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    assert client.put("clr1", b"one", cfg) == 0
    assert client.put("clr2", b"two", cfg) == 0
    assert client.batch_replica_clear([]) == []
    assert client.batch_replica_clear(["missing"], "nosuch:1") == []

    def clear_until(keys, segment=""):
        deadline = time.monotonic() + 30
        while True:
            got = client.batch_replica_clear(keys, segment)
            if got:
                return got
            assert time.monotonic() < deadline, "leases never expired"
            time.sleep(0.02)

    # only a's replica of clr1 goes
    assert clear_until(["clr1"], a) == ["clr1"]
    assert segments_of(client, "clr1") == [b]
    # every replica: the objects go (clr1 is leased by the read above for a while)
    cleared = set()
    while len(cleared) < 2:
        cleared.update(clear_until(["clr1", "clr2", "missing"]))
    assert cleared == {"clr1", "clr2"}
    assert client.is_exist("clr1") == 0 and client.is_exist("clr2") == 0


def test_closed_store_reports_errors(task_cluster):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    task, code = s.create_copy_task("k", ["x"])
    assert task == (0, 0) and code < 0
    assert s.query_task((1, 2))[0] is None
    assert s.batch_replica_clear(["k"]) == []
