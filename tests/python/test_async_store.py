"""mooncake.async_store: every store method has an ``async_`` coroutine twin
that runs it in the event loop's executor (as the reference's does)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import threading

import pytest

from mooncake.async_store import MooncakeDistributedStoreAsync
from mooncake.store import MooncakeDistributedStore

INVALID_PARAMS = -600


@pytest.fixture(scope="module")
def astore(cluster):
    s = MooncakeDistributedStoreAsync()
    assert s.setup("127.0.0.1", cluster.metadata, 64 << 20, 64 << 20, "tcp", "", cluster.master) == 0
    yield s
    s.remove_all(force=True)
    s.close()


def run(coro):
    return asyncio.run(coro)


def test_it_is_a_store_with_the_sync_methods_unchanged(astore):
    assert isinstance(astore, MooncakeDistributedStore)
    assert astore.put("as-sync", b"v") == 0 and astore.get("as-sync") == b"v"


def test_every_public_method_has_a_coroutine_twin(astore):
    for name in ("put", "get", "put_batch", "get_batch", "is_exist", "batch_is_exist", "remove", "remove_all",
                 "remove_by_regex", "get_into", "put_from", "register_buffer", "put_tensor", "get_tensor",
                 "batch_get_tensor_with_tp_into", "setup", "close", "health_check"):
        twin = getattr(astore, f"async_{name}")
        assert asyncio.iscoroutinefunction(twin), name


def test_bytes_calls(astore):
    async def main():
        assert await astore.async_put("as-k", b"Hello async") == 0
        assert await astore.async_get("as-k") == b"Hello async"
        keys = [f"as-b{i}" for i in range(10)]
        values = [f"value_{i}_{'x' * i}".encode() for i in range(10)]
        assert await astore.async_put_batch(keys, values) == 0, "one int, as put_batch"
        assert await astore.async_get_batch(keys) == values
        assert await astore.async_batch_is_exist(["as-k", "as-missing", "as-k"]) == [1, 0, 1]
        assert await astore.async_is_exist("as-missing") == 0
        assert await astore.async_get("as-missing") == b""
        assert await astore.async_remove("as-k", force=True) == 0
        assert await astore.async_is_exist("as-k") == 0
        assert await astore.async_remove_by_regex("^as-b", force=True) == 10
        data = os.urandom(4 << 20)
        assert await astore.async_put("as-big", data) == 0
        assert await astore.async_get("as-big") == data

    run(main())


def test_many_calls_overlap_and_all_complete(astore):
    async def main():
        keys = [f"as-c{i}" for i in range(64)]
        codes = await asyncio.gather(*(astore.async_put(k, k.encode() * 100) for k in keys))
        assert codes == [0] * len(keys)
        values = await asyncio.gather(*(astore.async_get(k) for k in keys))
        assert values == [k.encode() * 100 for k in keys]

    run(main())


def test_calls_run_off_the_loop_thread(cluster):
    seen = []

    class Recording(MooncakeDistributedStoreAsync):
        def where(self, tag):
            seen.append((tag, threading.get_ident()))
            return tag

    async def main():
        loop_thread = threading.get_ident()
        s = Recording()
        assert await s.async_where("x") == "x"
        assert seen[0][0] == "x" and seen[0][1] != loop_thread
        # the twin of a subclass method is made once and kept on the instance
        assert "async_where" in vars(s) and s.async_where is s.async_where

    run(main())


def test_errors_surface_when_awaited(astore):
    async def main():
        call = astore.async_put("as-k", "not bytes")  # no error until awaited
        with pytest.raises(TypeError):
            await call
        with pytest.raises(TypeError):
            await astore.async_get()

    run(main())


def test_missing_or_non_callable_names_raise_attribute_error(astore):
    with pytest.raises(AttributeError, match=r"has no attribute 'async_no_such_call' \(nor 'no_such_call'\)"):
        astore.async_no_such_call
    with pytest.raises(AttributeError, match="has no attribute 'no_such_call'"):
        astore.no_such_call
    astore.some_value = 3
    with pytest.raises(AttributeError, match="'some_value' is not callable"):
        astore.async_some_value
    assert not hasattr(astore, "async_no_such_call")


def test_tensor_calls(astore):
    torch = pytest.importorskip("torch")

    async def main():
        t = torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16)
        assert await astore.async_put_tensor("as-t", t) == 0
        assert torch.equal(await astore.async_get_tensor("as-t"), t)
        assert await astore.async_put_tensor_with_tp("as-tp", t, tp_size=4, split_dim=1) == 0
        shards = await asyncio.gather(*(astore.async_get_tensor_with_tp("as-tp", tp_rank=r, tp_size=4) for r in range(4)))
        assert torch.equal(torch.cat(shards, dim=1), t)
        keys = [f"as-bt{i}" for i in range(4)]
        assert await astore.async_batch_put_tensor_with_tp(keys, [t] * 4, tp_size=2) == [0] * 4
        by_rank = await asyncio.gather(*(astore.async_batch_get_tensor_with_tp(keys, tp_rank=r, tp_size=2) for r in range(2)))
        for i in range(4):
            assert torch.equal(torch.cat([by_rank[0][i], by_rank[1][i]]), t)
        size = 1 << 20
        mem = (ctypes.c_ubyte * (2 * size))()
        p = ctypes.addressof(mem)
        assert await astore.async_register_buffer(p, 2 * size) == 0
        try:
            got = await astore.async_get_tensor_into("as-t", p, size)
            assert torch.equal(got, t) and got.data_ptr() == p + 304
            got = await astore.async_batch_get_tensor_with_tp_into(["as-tp", "as-missing"], [p, p + size], [size, size], tp_rank=2, tp_size=4)
            assert torch.equal(got[0], t.chunk(4, 1)[2]) and got[1] is None
        finally:
            assert await astore.async_unregister_buffer(p) == 0

    run(main())
