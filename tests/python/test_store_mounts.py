"""Segments mounted and unmounted while a store runs: memory allocated for
it, or a file mapped from a path; objects placed in them are served (also
to another client) until the unmount, which the master sees at once; bad
sizes, paths and ids answer -1 and change nothing."""

from __future__ import annotations

import json
import os
import urllib.request

from mooncake.store import ReplicateConfig

from conftest import new_store

MB = 1 << 20


def segments(cluster):
    url = f"http://127.0.0.1:{cluster.metrics_port}/get_segments_detail"
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"] == "application/json; charset=utf-8"
        return {s["segment_name"]: s for s in json.loads(r.read())["segments"]}


def into(segment):
    c = ReplicateConfig()
    c.preferred_segment = segment
    return c


def test_allocate_mount_serve_and_free(cluster, store):
    before = segments(cluster)
    r = store.allocate_and_mount_segment(32 * MB)
    assert r["ret"] == 0 and r["allocated_size"] == 32 * MB, r
    (seg,) = r["segment_ids"]
    now = segments(cluster)
    assert set(now) == set(before) | {seg}
    assert now[seg]["size_bytes"] == 32 * MB and now[seg]["status"] == "OK"

    value = os.urandom(MB)
    assert store.put("mnt-a", value, into(seg)) == 0
    assert segments(cluster)[seg]["allocator_used_bytes"] == MB, "placed in the new segment"
    assert store.get("mnt-a") == value
    other = new_store(cluster)
    try:
        assert other.get("mnt-a") == value, "another client reads it through the engine"
    finally:
        other.close()

    assert store.unmount_and_free_segment([seg]) == 0
    assert seg not in segments(cluster)
    assert store.get("mnt-a") == b"", "its objects left with it"
    assert store.unmount_and_free_segment([seg]) == -1, "already gone"
    assert store.put("mnt-b", b"still works") == 0
    assert store.get("mnt-b") == b"still works"


def test_bad_allocations_and_ids(cluster, store):
    before = segments(cluster)
    for size in (0, 1 << 50):
        r = store.allocate_and_mount_segment(size)
        assert (r["ret"], r["segment_ids"], r["allocated_size"]) == (-1, [], 0), size
    r = store.allocate_and_mount_segment(MB, protocol="rdma")
    assert r["ret"] == -1, "an unsupported transport is refused, not ignored"
    assert store.unmount_segment(["nope"]) == -1
    assert store.unmount_segment([store.get_hostname()]) == -1, "setup segments stay"
    assert segments(cluster).keys() == before.keys()


def test_mount_a_file(cluster, store, tmp_path):
    path = f"/dev/shm/mooncake-test-mount-{os.getpid()}"
    with open(path, "wb") as f:
        f.truncate(8 * MB)
    try:
        assert store.mount_segment("/nonexistent/x", 8 * MB)["ret"] == -1
        assert store.mount_segment(path, 8 * MB, 4096)["ret"] == -1, "runs past the file"
        assert store.mount_segment(path, 0)["ret"] == -1
        r = store.mount_segment(path, 4 * MB, 4 * MB)
        assert r["ret"] == 0, r
        (seg,) = r["segment_ids"]
        assert segments(cluster)[seg]["size_bytes"] == 4 * MB
        value = b"file-backed!" * 1000
        assert store.put("mnt-file", value, into(seg)) == 0
        assert store.get("mnt-file") == value
        with open(path, "rb") as f:
            data = f.read()
        assert value in data[4 * MB:], "the bytes live in the file's mapped range"
        assert value not in data[:4 * MB]
        assert store.unmount_and_free_segment([seg]) == -1, "not an allocated segment"
        assert store.unmount_segment([seg], grace_period_seconds=1) == 0
        assert seg not in segments(cluster), "the master forgets it at once"
        assert store.get("mnt-file") == b""
    finally:
        os.unlink(path)


def test_close_unmounts_what_was_mounted(cluster):
    s = new_store(cluster)
    r = s.allocate_and_mount_segment(16 * MB)
    assert r["ret"] == 0
    (seg,) = r["segment_ids"]
    assert seg in segments(cluster)
    s.close()
    assert seg not in segments(cluster)
