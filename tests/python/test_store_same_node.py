"""`ReplicateConfig.prefer_alloc_in_same_node` (the writer's host first), as
the reference's calls take it: the multi-buffer put with one replica and put
sessions take it; the other byte and zero-copy writes answer -600 ("not
supported"), and so does a multi-buffer put asking for more replicas."""

from __future__ import annotations

import ctypes
import os
import time

from mooncake.store import ReplicateConfig

INVALID = -600


def tag(name):
    return f"{name}-{os.getpid()}-{time.monotonic_ns()}"


def same_node(replicas=1):
    c = ReplicateConfig()
    c.prefer_alloc_in_same_node = True
    c.replica_num = replicas
    return c


def test_calls_that_refuse_it(store):
    buf = (ctypes.c_ubyte * (1 << 20))()
    p = ctypes.addressof(buf)
    assert store.register_buffer(p, 1 << 20) == 0
    c = same_node()
    try:
        assert store.put(tag("a"), b"x" * 10, c) == INVALID
        assert store.upsert(tag("a"), b"x" * 10, c) == INVALID
        assert store.put_batch([tag("b")], [b"y"], c) == INVALID
        assert store.upsert_batch([tag("b")], [b"y"], c) == INVALID
        assert store.put_from(tag("c"), p, 4096, c) == INVALID
        assert store.upsert_from(tag("c"), p, 4096, c) == INVALID
        assert store.batch_put_from([tag("d")], [p], [4096], c) == [INVALID]
        assert store.batch_upsert_from([tag("d")], [p], [4096], c) == [INVALID]
        assert store.put_parts(tag("e"), b"x", b"y", config=c) == INVALID
        assert store.batch_put_from_multi_buffers([tag("f")], [[p]], [[4096]], same_node(2)) == [INVALID]
    finally:
        assert store.unregister_buffer(p) == 0


def test_calls_that_take_it(store):
    buf = (ctypes.c_ubyte * (1 << 20))()
    p = ctypes.addressof(buf)
    ctypes.memmove(p, os.urandom(8192), 8192)
    assert store.register_buffer(p, 1 << 20) == 0
    try:
        k = tag("m")
        assert store.batch_put_from_multi_buffers([k], [[p, p + 4096]], [[4096, 4096]], same_node()) == [0]
        # The one segment here is the writer's own: the object is there.
        desc = store.get_replica_desc(k)
        assert desc[0].is_memory_replica()
        assert store.batch_get_into_multi_buffers([k], [[p + 8192]], [[8192]]) == [8192]
        assert bytes(buf[8192:16384]) == bytes(buf[:8192])
        assert store.batch_put_session_start([tag("s")], [4096], same_node()) == [0]
    finally:
        assert store.unregister_buffer(p) == 0
