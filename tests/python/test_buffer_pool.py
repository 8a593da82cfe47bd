"""`mooncake.BufferPool`: leases of a store's local buffer (and overflow
regions registered for them) that the zero-copy calls use in place."""

import gc
import threading

import pytest

from conftest import new_store
from mooncake import BufferPool, RegisteredBufferPool
from mooncake.store import BufferLease, MooncakeDistributedStore

MIB = 1 << 20
LOCAL = 4 * MIB


@pytest.fixture(scope="module")
def store(cluster):
    """A store whose local buffer (what pools lease from) is 4 MiB."""
    s = new_store(cluster, segment=32 * MIB, local_buffer=LOCAL)
    yield s
    s.remove_all(force=True)
    s.close()


@pytest.fixture
def pool(store):
    p = BufferPool(store)
    yield p
    p.close()


def small_pool(store, **kw):
    """One lease at a time, of at most 4096 bytes each."""
    return BufferPool(store, min_size_class=4096, max_size_class=4096, alignment=4096,
                      max_regions=1, **kw)


def test_exports():
    import mooncake.store

    assert BufferPool is RegisteredBufferPool is mooncake.store.BufferPool
    assert mooncake.store.RegisteredBufferLease is BufferLease


def test_lease_of_the_local_buffer_round_trips_through_put_from_and_get_into(store, pool):
    data = bytes(range(256)) * 40
    with pool.acquire(len(data)) as src, pool.acquire(len(data)) as dst:
        assert (src.size, len(src.buffer), src.ptr % 64) == (len(data), len(data), 0)
        assert not src.overflow and not src.buffer.readonly
        src.buffer[:] = data
        assert store.put_from("bp/local", src.ptr, len(data)) == 0
        assert store.get("bp/local") == data
        assert store.get_into("bp/local", dst.ptr, dst.size) == len(data)
        assert bytes(dst.buffer) == data
    assert pool.stats() == {"acquired": 2, "released": 2, "local": 2, "overflow": 0,
                             "oversize": 0, "waits": 0, "leases": 0, "bytes": 0}


def test_batch_calls_use_several_leases(store, pool):
    leases = [pool.acquire(1000 + i) for i in range(4)]
    keys = [f"bp/batch{i}" for i in range(4)]
    for i, lease in enumerate(leases):
        lease.buffer[:] = bytes([i + 1]) * lease.size
    assert store.batch_put_from(keys, [l.ptr for l in leases], [l.size for l in leases]) == [0] * 4
    for lease in leases:
        lease.buffer[:] = bytes(lease.size)
    got = store.batch_get_into(keys, [l.ptr for l in leases], [l.size for l in leases])
    assert got == [l.size for l in leases]
    assert [bytes(l.buffer) for l in leases] == [bytes([i + 1]) * (1000 + i) for i in range(4)]
    for lease in leases:
        lease.release()


def test_overflow_region_when_the_local_buffer_is_full(store, pool):
    whole = pool.acquire(LOCAL)
    assert not whole.overflow
    extra = pool.acquire(1000, block=False)
    # Its size class (64 KiB by default), aligned as asked (8 MiB by default).
    assert extra.overflow and extra.region_len == 64 * 1024 and extra.ptr % (8 * MIB) == 0
    whole.release()
    extra.buffer[:] = b"o" * 1000
    assert store.put_from("bp/overflow", extra.ptr, 1000) == 0
    extra.buffer[:] = bytes(1000)
    assert store.get_into("bp/overflow", extra.ptr, 1000) == 1000
    assert bytes(extra.buffer) == b"o" * 1000
    ptr = extra.ptr
    extra.release()
    # Unregistered with the lease: the store no longer uses it in place.
    assert store.unregister_buffer(ptr) != 0
    assert pool.stats()["overflow"] == 1 and pool.stats()["bytes"] == 0


def test_size_classes_and_oversize_requests(store):
    pool = BufferPool(store, min_size_class=4096, max_size_class=64 * 1024, alignment=4096)
    whole = pool.acquire(LOCAL)
    a, b, c = pool.acquire(5000), pool.acquire(64 * 1024), pool.acquire(64 * 1024 + 1)
    assert [x.overflow for x in (a, b, c)] == [True] * 3
    assert [x.region_len for x in (a, b, c)] == [8192, 64 * 1024, 64 * 1024 + 1]
    assert pool.stats()["oversize"] == 2  # the whole local buffer, and c
    assert pool.stats()["bytes"] == LOCAL + 8192 + 64 * 1024 + 64 * 1024 + 1
    for x in (whole, a, b, c):
        x.release()
    pool.close()


@pytest.mark.parametrize("size", [0, 1, 128 * 1024 + 1])
def test_any_size_including_zero(pool, size):
    with pool.acquire(size) as lease:
        assert lease.size == len(lease.buffer) == size


@pytest.mark.parametrize("size", [-1, 1.5, "1", None, 1 << 64])
def test_sizes_that_are_not_counts_are_type_errors(pool, size):
    with pytest.raises(TypeError):
        pool.acquire(size)


def test_sizes_beyond_the_pool_are_refused(pool):
    for size in ((1 << 64) - 1, 2 * LOCAL + 1):
        with pytest.raises(RuntimeError, match="exceeds pool capacity"):
            pool.acquire(size)
    assert pool.stats()["acquired"] == 0


def test_bad_pool_arguments(cluster, store):
    for kw, msg in [
        ({"alignment": 0}, "must be positive"),
        ({"min_size_class": 0}, "must be positive"),
        ({"alignment": 12345}, "power of two"),
        ({"alignment": 4}, "power of two"),
        ({"default_timeout": -1}, "non-negative"),
    ]:
        with pytest.raises(RuntimeError, match=msg):
            BufferPool(store, **kw)
    with pytest.raises(TypeError):
        BufferPool(store, max_bytes=-1)
    with pytest.raises(RuntimeError, match="MooncakeDistributedStore"):
        BufferPool(object())
    with pytest.raises(RuntimeError, match="not initialized"):
        BufferPool(MooncakeDistributedStore())
    no_local = new_store(cluster, segment=16 * MIB, local_buffer=0)
    try:
        with pytest.raises(RuntimeError, match="local buffer"):
            BufferPool(no_local)
    finally:
        no_local.close()
    with pytest.raises(RuntimeError, match="timeout must be non-negative"):
        BufferPool(store).acquire(1, timeout=-0.5)


def test_limits_refuse_or_time_out(store):
    pool = small_pool(store, block_on_exhaustion=False)
    held = pool.acquire(1)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire(1)
    with pytest.raises(RuntimeError, match="timed out waiting for buffer"):
        pool.acquire(1, block=True, timeout=0.05)
    held.release()
    pool.acquire(1).release()
    pool.close()
    # max_bytes below the local buffer is raised to it; beyond it the pool waits.
    pool = BufferPool(store, max_bytes=MIB, min_size_class=4096, block_on_exhaustion=False)
    held = pool.acquire(LOCAL)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire(1)
    held.release()
    pool.close()


def test_blocked_acquire_gets_the_released_lease(store):
    pool = small_pool(store)
    held = pool.acquire(1)
    got, started = [], threading.Event()

    def waiter():
        started.set()
        got.append(pool.acquire(1, timeout=30))

    t = threading.Thread(target=waiter)
    t.start()
    started.wait()
    while pool.stats()["waits"] == 0 and t.is_alive():  # blocked, not done
        t.join(0.01)
    assert not got
    held.release()
    t.join(30)
    assert len(got) == 1 and pool.stats()["leases"] == 1
    got[0].release()
    pool.close()


def test_release_is_once_and_checks_views(pool):
    lease = pool.acquire(4)
    view = lease.buffer
    view[:] = b"test"
    with pytest.raises(RuntimeError, match="exported views"):
        lease.release()
    assert lease.ptr and pool.stats()["leases"] == 1
    del view
    lease.release()
    lease.release()
    assert pool.stats()["released"] == 1
    with pytest.raises(RuntimeError, match="buffer lease is closed"):
        lease.ptr
    with pytest.raises(BufferError):
        lease.buffer
    assert lease.size == 4


def test_a_view_keeps_a_dropped_lease_alive(pool):
    view = pool.acquire(4).buffer
    gc.collect()
    assert pool.stats()["leases"] == 1
    view[:] = b"kept"
    assert bytes(view) == b"kept"
    del view
    gc.collect()
    assert pool.stats()["leases"] == 0


def test_close_with_leases_out(store):
    pool = BufferPool(store)
    lease = pool.acquire(1)
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    lease.buffer[0] = 7  # still usable
    lease.release()
    pool.close()
    pool.close()
    with pytest.raises(RuntimeError, match="buffer pool is closed"):
        pool.acquire(1)


def test_prewarm_leaves_nothing_out(store):
    pool = BufferPool(store, prewarm_size=MIB, prewarm_count=8)
    assert pool.stats()["leases"] == 0
    with pool.acquire(LOCAL) as whole:
        assert not whole.overflow
    pool.close()


def test_leases_outlive_their_store(cluster):
    s = new_store(cluster, segment=16 * MIB, local_buffer=LOCAL)
    pool = BufferPool(s, min_size_class=4096, alignment=4096)
    local = pool.acquire(100)
    overflow = pool.acquire(LOCAL)
    assert overflow.overflow
    local.buffer[:] = b"l" * 100
    assert s.close() == 0
    assert bytes(local.buffer) == b"l" * 100
    overflow.buffer[-1] = 1
    with pytest.raises(RuntimeError, match="not set up"):
        pool.acquire(1)
    local.release()
    overflow.release()
    pool.close()
