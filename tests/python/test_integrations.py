"""The call patterns of the serving integrations, replayed against a real
master: SGLang's HiCache Mooncake backend, vLLM's Mooncake store connector,
LMCache's mooncakestore connector and vllm-ascend's Mooncake pool backend.

Each test makes the calls its integration makes, in its order, with its
argument shapes (read from those projects' sources): how it sets up, what it
registers, how it names and batches keys, and which return values it acts
on. NumPy buffers stand for the torch tensors they register; what matters
to the store is the address and length. Every read is checked byte for
byte."""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import new_store
from mooncake.engine import TransferEngine
from mooncake.store import MooncakeDistributedStore, ReplicateConfig

MiB = 1 << 20


def tag(name):
    return f"{name}-{os.getpid()}-{time.monotonic_ns()}"


class HostPool:
    """A page-first host KV pool: `pages` pages of K then V, `page` bytes each."""

    def __init__(self, pages, page, seed):
        self.page = page
        self.mem = np.random.default_rng(seed).integers(0, 256, size=2 * pages * page, dtype=np.uint8)
        self.ptr = self.mem.ctypes.data
        self.size = self.mem.nbytes

    def k(self, i):
        return self.ptr + 2 * i * self.page

    def v(self, i):
        return self.k(i) + self.page

    def bytes(self, addr, n):
        off = addr - self.ptr
        return self.mem[off:off + n].tobytes()


def test_sglang_hicache(cluster):
    store = MooncakeDistributedStore()
    # setup(hostname, metadata, per-rank segment, 16 MiB local buffer,
    # protocol, device, master, engine=None): positional, as HiCache calls it.
    assert store.setup("127.0.0.1", cluster.metadata, 64 * MiB, 16 * MiB, "tcp", "", cluster.master, None) == 0
    try:
        # check_server: the master's admin port lists segments once one is mounted.
        url = f"http://127.0.0.1:{cluster.metrics_port}/get_all_segments"
        assert urllib.request.urlopen(url, timeout=5).read().decode() != ""
        # warmup
        wkey = "sglang_mooncake_store_warmup_key" + tag("w")
        value = bytes(4 * 1024)
        assert store.put(wkey, value) == 0
        assert store.is_exist(wkey) == 1
        assert store.get(wkey) == value

        pool = HostPool(pages=8, page=16 * 1024, seed=1)
        assert store.register_buffer(pool.ptr, pool.size) == 0
        rank = 0
        pages = [tag(f"page{i}") for i in range(4)]
        keys, ptrs, sizes = [], [], []
        for i, p in enumerate(pages):
            keys += [f"{p}_{rank}_k", f"{p}_{rank}_v"]
            ptrs += [pool.k(i), pool.v(i)]
            sizes += [pool.page, pool.page]

        # batch_set_v1: existence first, then only the missing keys.
        exist = store.batch_is_exist(keys)
        assert exist == [0] * len(keys)
        missing = [i for i, e in enumerate(exist) if e != 1]
        put = store.batch_put_from([keys[i] for i in missing], [ptrs[i] for i in missing], [sizes[i] for i in missing])
        assert put == [0] * len(missing)
        assert store.batch_is_exist(keys) == [1] * len(keys)
        # A second backup of the same pages finds them all and puts nothing.
        assert [i for i, e in enumerate(store.batch_is_exist(keys)) if e != 1] == []

        # batch_exists: the longest prefix of pages whose K and V both exist.
        probe = []
        for p in pages + [tag("absent")]:
            probe += [f"{p}_{rank}_k", f"{p}_{rank}_v"]
        res = store.batch_is_exist(probe)
        hit = next((i for i, e in enumerate(res) if e != 1), len(res)) // 2
        assert hit == len(pages)

        # batch_get_v1 into other pages of the pool: bytes read per key.
        dst = [pool.k(4 + i // 2) if i % 2 == 0 else pool.v(4 + i // 2) for i in range(len(keys))]
        got = store.batch_get_into(keys, dst, sizes)
        assert all(r > 0 for r in got) and got == sizes
        for src, d, n in zip(ptrs, dst, sizes):
            assert pool.bytes(src, n) == pool.bytes(d, n)

        # MLA with several buffers per object: batch_put_from_multi_buffers.
        mla = [f"{tag('mla')}__k"]
        assert store.batch_put_from_multi_buffers(mla, [[pool.k(0), pool.k(1)]], [[pool.page, pool.page]], ReplicateConfig()) == [0]
        assert store.batch_get_into_multi_buffers(mla, [[pool.k(6), pool.k(7)]], [[pool.page, pool.page]]) == [2 * pool.page]
        assert pool.bytes(pool.k(6), pool.page) == pool.bytes(pool.k(0), pool.page)
        assert pool.bytes(pool.k(7), pool.page) == pool.bytes(pool.k(1), pool.page)

        # A prefetch of a page nobody stored fails that key only.
        bad = store.batch_get_into([keys[0], tag("gone")], [pool.k(6), pool.k(7)], [pool.page, pool.page])
        assert bad[0] == pool.page and bad[1] < 0

        # clear(): objects read a moment ago are still leased and stay (the
        # reference's remove_all without force skips them too).
        assert store.remove_all() >= 0
        assert store.remove_all(force=True) >= 0
        assert store.batch_is_exist(keys) == [0] * len(keys)
        assert store.unregister_buffer(pool.ptr) == 0
    finally:
        store.close()


def test_vllm_store_connector(cluster):
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", cluster.metadata, 64 * MiB, 16 * MiB, "tcp", "", cluster.master) == 0
    try:
        # A FlashAttention-style cache (2, num_blocks, block): K and V are
        # two segments of one registered region.
        blocks, blen = 16, 8 * 1024
        cache = np.random.default_rng(2).integers(0, 256, size=2 * blocks * blen, dtype=np.uint8)
        base = cache.ctypes.data
        assert store.register_buffer(base, cache.nbytes) == 0
        seg = blocks * blen

        def kv(block):
            return [base + block * blen, base + seg + block * blen], [blen, blen]

        config = ReplicateConfig()
        config.preferred_segment = store.get_hostname()
        keys = [f"qwen@tp0@pcp0@dcp0@pp0@g0@{tag('h')}" for _ in range(4)]

        # lookup from the scheduler: nothing yet.
        assert store.batch_is_exist(keys) == [0] * 4
        # save: dedup by existence, then one multi-buffer put.
        missing = [i for i, e in enumerate(store.batch_is_exist(keys)) if e != 1]
        addrs = [kv(i)[0] for i in missing]
        sizes = [kv(i)[1] for i in missing]
        res = store.batch_put_from_multi_buffers([keys[i] for i in missing], addrs, sizes, config)
        assert [i for i, v in enumerate(res) if v < 0] == []
        assert store.batch_is_exist(keys) == [1] * 4

        # Tier logging: every key's first replica is in memory.
        descs = store.batch_get_replica_desc(keys)
        for k in keys:
            assert descs[k][0].is_memory_replica()
            assert not descs[k][0].is_disk_replica()

        # load into other blocks, rotated as a TP rank does.
        load_keys = keys[1:] + keys[:1]
        dst = [kv(8 + j) for j in range(4)]
        got = store.batch_get_into_multi_buffers(load_keys, [d[0] for d in dst], [d[1] for d in dst])
        assert got == [2 * blen] * 4
        for j, k in enumerate(load_keys):
            i = keys.index(k)
            for part in range(2):
                s, d = kv(i)[0][part] - base, dst[j][0][part] - base
                assert cache[d:d + blen].tobytes() == cache[s:s + blen].tobytes()

        # A load of a key that is gone fails that key only (its blocks are
        # recomputed), and its negative value is a store code.
        res = store.batch_get_into_multi_buffers([keys[0], tag("gone")], [kv(12)[0], kv(13)[0]], [kv(12)[1], kv(13)[1]])
        assert res[0] == 2 * blen and res[1] < 0

        # RESET over the lookup channel: remove_all(force=True) must succeed.
        assert store.remove_all(force=True) >= 4
        assert store.batch_is_exist(keys) == [0] * 4
    finally:
        store.close()


def test_lmcache_mooncakestore(cluster):
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", cluster.metadata, 64 * MiB, 16 * MiB, "tcp", "", cluster.master) == 0
    meta_len = 28  # RemoteMetadata: length, shape, dtype, format

    async def put(key, meta, kv):
        return await asyncio.to_thread(store.put_parts, key, meta, kv)

    async def get(key):
        buffer = await asyncio.to_thread(store.get_buffer, key)
        if buffer is None:
            return None
        view = memoryview(buffer)
        meta = bytes(view[:meta_len])
        kv = np.frombuffer(buffer, dtype=np.float16, offset=meta_len)
        return meta, kv.copy()

    async def run():
        keys = [tag(f"vllm@model@1@0@{i}") for i in range(8)]
        chunks = [np.random.default_rng(i).standard_normal(4096).astype(np.float16) for i in range(8)]
        metas = [len(c.tobytes()).to_bytes(4, "little") + bytes(meta_len - 4) for c in chunks]
        assert not store.is_exist(keys[0])
        rcs = await asyncio.gather(*(put(k, m, c.tobytes()) for k, m, c in zip(keys, metas, chunks)))
        assert rcs == [0] * 8
        assert all(store.is_exist(k) for k in keys)
        got = await asyncio.gather(*(get(k) for k in keys))
        for (meta, kv), m, c in zip(got, metas, chunks):
            assert meta == m and kv.tobytes() == c.tobytes()
        assert await get(tag("missing")) is None

    try:
        asyncio.run(run())
    finally:
        store.close()


def test_vllm_ascend_pool_backend(cluster):
    # _mooncake_setup_supports_ssd_offload(): the signature (or, for
    # bindings without one, the docstring) names enable_ssd_offload.
    setup = MooncakeDistributedStore.setup
    try:
        supports = "enable_ssd_offload" in inspect.signature(setup).parameters
    except (TypeError, ValueError):
        supports = "enable_ssd_offload" in (setup.__doc__ or "")
    assert supports

    # The backend shares one transfer engine with the rest of the worker and
    # names its segment after that engine's RPC port.
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    local_seg = f"127.0.0.1:{te.get_rpc_port()}"
    store = MooncakeDistributedStore()
    ret = store.setup(
        local_hostname=local_seg,
        metadata_server="P2PHANDSHAKE",
        global_segment_size=64 * MiB,
        local_buffer_size=16 * MiB,
        protocol="tcp",
        rdma_devices="",
        master_server_addr=cluster.master,
        engine=te.get_engine(),
    )
    assert ret == 0
    try:
        blocks, blen = 8, 4096
        mem = np.random.default_rng(3).integers(0, 256, size=blocks * blen, dtype=np.uint8)
        base = mem.ctypes.data
        # register_buffer goes to the shared engine, not the store.
        assert te.register_memory(base, mem.nbytes) == 0
        keys = [tag(f"ascend{i}") for i in range(3)]
        assert store.batch_is_exist(keys) == [0, 0, 0]
        config = ReplicateConfig()
        config.preferred_segment = local_seg
        # vllm-ascend's default (`prefer_alloc_in_same_node` true in its config).
        config.prefer_alloc_in_same_node = True
        addrs = [[base + i * blen] for i in range(3)]
        sizes = [[blen] for _ in range(3)]
        res = store.batch_put_from_multi_buffers(keys, addrs, sizes, config)
        assert [int(v) for v in res if v < 0] == []
        res = store.batch_get_into_multi_buffers(keys, [[base + (4 + i) * blen] for i in range(3)], sizes)
        assert list(res) == [blen] * 3
        for i in range(3):
            assert mem[(4 + i) * blen:(5 + i) * blen].tobytes() == mem[i * blen:(i + 1) * blen].tobytes()
        descs = store.batch_get_replica_desc(keys)
        assert all(d[0].is_memory_replica() for d in descs.values())
        assert te.unregister_memory(base) == 0
    finally:
        store.close()


def test_store_connector_threads_share_one_store(cluster):
    """vLLM runs one sending thread and several receiving threads over the
    same store object; LMCache calls it from asyncio worker threads."""
    store = new_store(cluster)
    try:
        buf = (ctypes.c_ubyte * (8 * MiB))()
        base = ctypes.addressof(buf)
        ctypes.memmove(base, os.urandom(4 * MiB), 4 * MiB)
        assert store.register_buffer(base, 8 * MiB) == 0
        keys = [tag(f"t{i}") for i in range(64)]
        blk = 64 * 1024

        def save(i):
            return store.batch_put_from([keys[i]], [base + i * blk], [blk])[0]

        def load(i):
            return store.batch_get_into([keys[i]], [base + 4 * MiB + i * blk], [blk])[0]

        with ThreadPoolExecutor(8) as ex:
            assert list(ex.map(save, range(64))) == [0] * 64
            assert list(ex.map(load, range(64))) == [blk] * 64
        assert bytes(buf[4 * MiB:8 * MiB]) == bytes(buf[:4 * MiB])
        assert [store.remove(k, force=True) for k in keys] == [0] * 64
    finally:
        store.close()
