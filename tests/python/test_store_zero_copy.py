"""Zero-copy calls: registered buffers, pool memory, plain process memory
(served through a copy, as the reference accepts it), and bad pointers that
must come back as codes, never crashes."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from mooncake.store import MooncakeHostMemAllocator

INVALID_PARAMS, OBJECT_NOT_FOUND = -600, -704


def buf(n):
    a = np.zeros(n, np.uint8)
    return a, a.ctypes.data


@pytest.fixture(scope="module")
def reg(store):
    """A registered 1 MiB buffer."""
    a, p = buf(1 << 20)
    assert store.register_buffer(p, a.nbytes) == 0
    yield a, p
    assert store.unregister_buffer(p) == 0


def test_register_codes(store):
    a, p = buf(8192)
    assert store.register_buffer(p, 8192) == 0
    assert store.register_buffer(p, 8192) == INVALID_PARAMS
    assert store.register_buffer(p + 4096, 100) == INVALID_PARAMS, "inside a registered range"
    assert store.unregister_buffer(p) == 0
    assert store.unregister_buffer(p) == INVALID_PARAMS
    assert store.unregister_buffer(12345) == INVALID_PARAMS
    assert store.register_buffer(p, 0) == INVALID_PARAMS
    assert store.register_buffer(0, 4096) == INVALID_PARAMS
    assert store.register_buffer(16, 4096) == INVALID_PARAMS, "unmapped"
    with pytest.raises(TypeError):
        store.register_buffer(p, -1)


def test_put_from_get_into(store, reg):
    a, p = reg
    data = os.urandom(4096)
    a[:4096] = np.frombuffer(data, np.uint8)
    assert store.put_from("zc1", p, 4096) == 0
    assert store.get("zc1") == data
    assert store.get_into("zc1", p + 8192, 8192) == 4096, "a larger buffer gets the object size"
    assert bytes(a[8192:8192 + 4096]) == data
    assert store.get_into("zc1", p + 8192, 100) == INVALID_PARAMS, "smaller than the object"
    assert store.get_into("missing", p, 4096) == OBJECT_NOT_FOUND
    assert store.get_into("zc1", p, 0) == INVALID_PARAMS
    with pytest.raises(TypeError):
        store.get_into("zc1", "notanint", 10)
    with pytest.raises(TypeError):
        store.put_from("zc1", p, -1)
    assert store.put_from(key="zc-kw", buffer_ptr=p, size=10, config=None) == 0
    assert store.get_into(key="zc-kw", buffer_ptr=p + 20000, size=10) == 10
    assert store.put_from("zc0", p, 0) == 0, "the reference accepts size 0"
    # put of an existing key keeps the value; upsert replaces value and size
    a[:8] = 7
    assert store.put_from("zc1", p, 8) == 0
    assert store.get("zc1") == data
    assert store.upsert_from("zc1", p, 8) == 0
    assert store.get("zc1") == bytes([7] * 8)


def test_past_the_registered_end(store, reg):
    a, p = reg
    end = p + a.nbytes
    # reading into a range that runs past the registered buffer writes only the object
    assert store.put("small", b"s" * 100) == 0
    assert store.get_into("small", end - 200, 1 << 40) == 100
    assert bytes(a[-200:-100]) == b"s" * 100


def test_unregistered_memory_works_through_a_copy(store):
    src = (ctypes.c_char * 5000)(*([b"q"] * 5000))
    dst = (ctypes.c_char * 5000)()
    assert store.put_from("unreg", ctypes.addressof(src), 5000) == 0
    assert store.get_into("unreg", ctypes.addressof(dst), 5000) == 5000
    assert dst.raw == b"q" * 5000
    assert store.batch_get_into(["unreg"], [ctypes.addressof(dst)], [10]) == [INVALID_PARAMS]


def test_bad_pointers_are_codes(store):
    assert store.put("bp", b"x" * 4096) == 0
    for ptr in (0, 16, 4096, (1 << 64) - 4096):
        assert store.put_from("bp-new", ptr, 4096) == INVALID_PARAMS
        assert store.get_into("bp", ptr, 4096) == INVALID_PARAMS
        assert store.upsert_from("bp", ptr, 4096) == INVALID_PARAMS
    assert store.batch_put_from(["a", "b"], [0, 16], [10, 10]) == [INVALID_PARAMS] * 2
    assert store.batch_get_into(["bp"], [16], [4096]) == [INVALID_PARAMS]
    code = ctypes.cast(ctypes.pythonapi.Py_IncRef, ctypes.c_void_p).value
    assert store.get_into("bp", code, 4096) == INVALID_PARAMS, "read-only memory"
    assert store.is_exist("bp-new") == 0


def test_batches(store, reg):
    a, p = reg
    a[100_000:100_000 + 3000] = np.arange(3000) % 251
    keys = ["zb1", "zb2", "zb3"]
    ptrs = [p + 100_000, p + 101_000, p + 102_000]
    assert store.batch_put_from(keys, ptrs, [1000] * 3) == [0, 0, 0]
    got = [p + 200_000, p + 201_000, p + 202_000]
    assert store.batch_get_into(keys + ["missing"], got + [p + 203_000], [1000] * 4) == [1000, 1000, 1000, OBJECT_NOT_FOUND]
    assert bytes(a[200_000:203_000]) == bytes(a[100_000:103_000])
    assert store.batch_put_from(keys, ptrs[:1], [1]) == [INVALID_PARAMS] * 3
    assert store.batch_get_into(keys, ptrs, [1]) == [INVALID_PARAMS] * 3
    assert store.batch_upsert_from(["zb1", "zbn"], ptrs[:2], [10, 10]) == [0, 0]
    assert store.get_size("zb1") == 10
    assert store.batch_get_into(["zb2"], [p + 300_000], [10]) == [INVALID_PARAMS]


def test_multi_buffers(store, reg):
    a, p = reg
    a[400_000:400_300] = 5
    assert store.batch_put_from_multi_buffers(["mb1"], [[p + 400_000, p + 400_100]], [[100, 200]]) == [0]
    assert store.get_size("mb1") == 300
    assert store.batch_get_into_multi_buffers(["mb1"], [[p + 500_000, p + 600_000]], [[100, 200]]) == [300]
    assert bytes(a[500_000:500_100]) == bytes([5] * 100) and bytes(a[600_000:600_200]) == bytes([5] * 200)
    assert store.batch_get_into_multi_buffers(["mb1"], [[p + 500_000]], [[100]]) == [INVALID_PARAMS]
    assert store.batch_put_from_multi_buffers(["mb2"], [[p, p]], [[1]]) == [INVALID_PARAMS]
    assert store.batch_put_from_multi_buffers(["mb3"], [[16]], [[100]]) == [INVALID_PARAMS]
    assert store.batch_get_into_multi_buffers(["mb1"], [[16, 32]], [[100, 200]]) == [INVALID_PARAMS]
    assert store.batch_put_from_multi_buffers(["a", "b"], [[p]], [[1]]) == [INVALID_PARAMS] * 2


def test_put_from_with_metadata(store, reg):
    a, p = reg
    a[700_000:700_100] = 1
    a[710_000:710_016] = 2
    assert store.put_from_with_metadata("meta1", p + 700_000, p + 710_000, 100, 16) == 0
    assert store.get("meta1") == bytes([2] * 16 + [1] * 100)
    assert store.put_from_with_metadata("meta2", 16, p, 100, 16) == INVALID_PARAMS


def test_get_into_ranges(store, reg):
    a, p = reg
    assert store.put("r1", bytes(range(64))) == 0
    assert store.put("r2", bytes(range(100, 164))) == 0
    dst = p + 800_000
    res = store.get_into_ranges([dst], [["r1", "r2"]], [[[0, 10], [100]]], [[[0, 5], [0]]], [[[4, 4], [8]]])
    assert res == [[[4, 4], [8]]]
    assert bytes(a[800_000:800_004]) == bytes(range(4))
    assert bytes(a[800_010:800_014]) == bytes(range(5, 9))
    assert bytes(a[800_100:800_108]) == bytes(range(100, 108))
    res = store.get_into_ranges([dst], [["r1", "missing"]], [[[0], [10]]], [[[0], [0]]], [[[4], [4]]])
    assert res[0][0] == [4] and res[0][1][0] < 0
    assert store.get_into_ranges([dst], [["r1"]], [[[0, 1]]], [[[0]]], [[[4]]]) == [[[INVALID_PARAMS, INVALID_PARAMS]]]
    assert store.get_into_ranges([dst], [["r1"]], [[[0]]], [[[60]]], [[[10]]])[0][0][0] < 0, "past the object end"
    assert store.get_into_ranges([], [], [], [], []) == []
    plain = np.zeros(64, np.uint8)
    assert store.get_into_ranges([plain.ctypes.data], [["r1"]], [[[0]]], [[[0]]], [[[4]]])[0][0][0] < 0, "unregistered"


def test_mem_pool(store):
    p = store.alloc_from_mem_pool(4096)
    if p == 0:
        pytest.skip("no staging pool")
    ctypes.memset(p, 9, 4096)
    assert store.put_from("pool1", p, 4096) == 0
    assert store.get("pool1") == bytes([9] * 4096)


def test_host_mem_allocator(store):
    alloc = MooncakeHostMemAllocator()
    p = alloc.alloc(1 << 16)
    assert p != 0 and p % 4096 == 0
    assert store.register_buffer(p, 1 << 16) == 0
    ctypes.memset(p, 3, 100)
    assert store.put_from("hostmem", p, 100) == 0
    assert store.get_into("hostmem", p + 4096, 100) == 100
    assert ctypes.string_at(p + 4096, 100) == bytes([3] * 100)
    # still registered: freeing would unmap memory the store writes into
    assert alloc.free(p) == -1
    assert ctypes.string_at(p, 100) == bytes([3] * 100), "still mapped"
    assert store.unregister_buffer(p) == 0
    assert alloc.free(p) == 0
    assert alloc.free(p) == -1
    with pytest.raises(RuntimeError):
        alloc.alloc(0)
    with pytest.raises(TypeError):
        alloc.alloc(-1)


def test_host_mem_free_waits_for_every_registration(cluster, store):
    from conftest import new_store

    alloc = MooncakeHostMemAllocator()
    p = alloc.alloc(1 << 16)
    other = new_store(cluster, segment=0, local_buffer=1 << 20)
    try:
        assert store.register_buffer(p, 1 << 16) == 0
        assert other.register_buffer(p + 4096, 4096) == 0
        assert store.unregister_buffer(p) == 0
        assert alloc.free(p) == -1, "the other store still has part of it"
    finally:
        other.close()  # closing forgets its registrations
    assert alloc.free(p) == 0


def test_every_copy_path_reads_and_writes_plain_memory(store):
    """Unregistered memory goes through the checked copy helpers on each
    call that has one; bad pointers never reach them."""
    n = 3000
    a = (ctypes.c_char * n)(*([b"a"] * n))
    m = (ctypes.c_char * 16)(*([b"m"] * 16))
    pa, pm = ctypes.addressof(a), ctypes.addressof(m)
    assert store.batch_put_from(["cp1", "cp2"], [pa, pa + 1000], [1000, 1000]) == [0, 0]
    assert store.put_from_with_metadata("cp3", pa, pm, 100, 16) == 0
    assert store.get("cp3") == b"m" * 16 + b"a" * 100
    assert store.batch_put_from_multi_buffers(["cp4"], [[pm, pa]], [[16, 10]]) == [0]
    assert store.get("cp4") == b"m" * 16 + b"a" * 10

    out = (ctypes.c_char * n)()
    po = ctypes.addressof(out)
    assert store.batch_get_into(["cp1", "cp2"], [po, po + 1000], [1000, 1000]) == [1000, 1000]
    assert out.raw[:2000] == b"a" * 2000
    ctypes.memset(po, 0, n)
    assert store.batch_get_into_multi_buffers(["cp4"], [[po, po + 100]], [[6, 20]]) == [26]
    assert out.raw[:6] == b"m" * 6 and out.raw[100:120] == b"m" * 10 + b"a" * 10
    assert out.raw[6:100] == bytes(94), "nothing written between the parts"

    for bad in (0, 16, (1 << 64) - 4096):
        assert store.put_from_with_metadata("cp-bad", pa, bad, 100, 16) == INVALID_PARAMS
        assert store.batch_put_from_multi_buffers(["cp-bad"], [[pa, bad]], [[10, 10]]) == [INVALID_PARAMS]
        assert store.batch_get_into_multi_buffers(["cp4"], [[po, bad]], [[6, 20]]) == [INVALID_PARAMS]
    code = ctypes.cast(ctypes.pythonapi.Py_IncRef, ctypes.c_void_p).value
    assert store.batch_get_into_multi_buffers(["cp4"], [[code]], [[26]]) == [INVALID_PARAMS], "read-only"
    assert store.is_exist("cp-bad") == 0
