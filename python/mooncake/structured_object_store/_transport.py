"""Store I/O of the bundle layer: chunk writes, range reads, cleanup.

Every call goes through the store's public methods, choosing the fastest the
store has: ``batch_put_from`` over the caller's memory (or a buffer-pool
lease) for writes, ``get_into`` / ``get_into_ranges`` / ``batch_get_into``
into the destination for reads, with ``put`` / ``get`` as the fallback for
stores that lack them. Memory the store reads or writes in place is
registered for the call and unregistered afterwards.
"""

from __future__ import annotations

import bisect
import copy
import ctypes
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

from ._types import (
    AUTO_PARALLEL_MIN_BYTES,
    AUTO_PARALLEL_MIN_CHUNKS,
    MISSING_OBJECT_ERROR,
    BundleTransferPolicy,
)

_DUPLICATE_REGISTRATION = -600
# Gathers this large are split between threads (memory bandwidth is shared,
# so a few threads are enough).
_THREADED_GATHER_BYTES = 8 << 20
_GATHER_THREADS = 4


def is_native_store(store: Any) -> bool:
    """Whether ``store`` is this package's store client (whose zero-copy
    calls accept any readable memory)."""
    try:
        from ..store import MooncakeDistributedStore
    except Exception:
        return False
    return isinstance(store, MooncakeDistributedStore)


def has(store: Any, name: str) -> bool:
    return callable(getattr(store, name, None))


def check_status(status: Any, operation: str, key: str) -> None:
    if isinstance(status, (int, np.integer)) and not isinstance(status, bool) and status < 0:
        raise RuntimeError(f"Mooncake {operation} failed for {key}: {int(status)}")


def call_write(fn: Any, *args: Any, config: Any = None, keys: int = 1) -> Any:
    """Calls a store write of ``keys`` keys with ``config`` (its one group id
    repeated per key) only when there is one, so stores whose writes take no
    config still work."""
    config = config_for_keys(config, keys)
    if config is None:
        return fn(*args)
    return fn(*args, config=config)


# The ReplicateConfig fields a copy of a write config carries over when the
# config itself cannot be copied.
_CONFIG_FIELDS = ("data_type", "group_ids", "nof_replica_num", "prefer_alloc_in_same_node",
                  "preferred_nof_segments", "preferred_segment", "preferred_segments",
                  "replica_num", "with_hard_pin", "with_soft_pin")


def copy_config(config: Any) -> Any:
    try:
        return copy.copy(config)
    except TypeError:
        pass
    try:
        out = type(config)()
    except Exception as exc:
        raise TypeError("structured object store config must be copyable or default-constructible") from exc
    for name in _CONFIG_FIELDS:
        if hasattr(config, name):
            value = getattr(config, name)
            setattr(out, name, list(value) if isinstance(value, list) else value)
    return out


def config_for_keys(config: Any, count: int) -> Any:
    """A write config whose group_ids has one entry per key written (the
    caller's config names at most one logical group)."""
    if config is None or count <= 0:
        return config
    ids = getattr(config, "group_ids", None)
    if ids is None:
        return config
    as_string = isinstance(ids, str)
    ids = [ids] if as_string else list(ids)
    if not ids:
        out = copy_config(config)
        out.group_ids = None
        return out
    if len(ids) != 1:
        raise ValueError("structured object store config.group_ids must contain exactly one "
                         "logical group id; it is expanded across internal Mooncake keys")
    if count == 1 and not as_string:
        return config
    out = copy_config(config)
    out.group_ids = [ids[0]] * count
    return out


def config_with_group(config: Any, group_id: str) -> Any:
    """``config`` (or a fresh ReplicateConfig) naming ``group_id``."""
    named = getattr(config_for_keys(config, 1), "group_ids", None)
    if named and named[0] and named[0] != group_id:
        raise ValueError("config.group_ids conflicts with the DataProto storage group")
    if config is None:
        try:
            from ..store import ReplicateConfig
            out = ReplicateConfig()
        except Exception:
            out = SimpleNamespace()
    else:
        out = copy_config(config)
    out.group_ids = [group_id]
    return out


def address(value: Any) -> int:
    """The address of a buffer's first byte (read-only buffers too)."""
    if isinstance(value, np.ndarray):
        return int(value.__array_interface__["data"][0])
    view = memoryview(value)
    if view.nbytes == 0:
        return 0
    return int(np.frombuffer(view.cast("B"), dtype=np.uint8).__array_interface__["data"][0])


@contextmanager
def registered(store: Any, regions: Sequence[tuple[int, int]]) -> Iterator[None]:
    """Registers ``(ptr, size)`` regions for the block (each once; one the
    store already knows is left as it is)."""
    done: list[int] = []
    can = has(store, "register_buffer") and has(store, "unregister_buffer")
    try:
        if can:
            for ptr, size in dict.fromkeys(r for r in regions if r[1] > 0):
                if ptr in done:
                    continue
                status = store.register_buffer(ptr, size)
                if status == _DUPLICATE_REGISTRATION:
                    continue
                check_status(status, "register_buffer", hex(ptr))
                done.append(ptr)
        yield
    finally:
        for ptr in done:
            store.unregister_buffer(ptr)


def split(view: memoryview, chunk_bytes: int) -> list[memoryview]:
    return [view[i : i + chunk_bytes] for i in range(0, view.nbytes, chunk_bytes)]


def gather_into(parts: Sequence[Any], dst_ptr: int) -> None:
    """Copies ``parts`` one after the other to ``dst_ptr`` (natively, on
    several threads, when the extension is there)."""
    arrays = [np.frombuffer(memoryview(p).cast("B"), dtype=np.uint8) if not isinstance(p, np.ndarray) else p
              for p in parts]
    arrays = [a for a in arrays if a.nbytes]
    if not arrays:
        return
    # Looked up on the package, where callers may swap it.
    from . import _concat_arrays_into as concat
    if concat is not None:
        arrays = [np.ascontiguousarray(a) for a in arrays]
        total = sum(a.nbytes for a in arrays)
        if total >= _THREADED_GATHER_BYTES and getattr(concat, "__module__", "").startswith("mooncake"):
            wrote = concat(arrays, dst_ptr, total, 0, len(arrays), _GATHER_THREADS)
        else:
            wrote = concat(arrays, dst_ptr, total, 0, len(arrays))
        if wrote != total:
            raise RuntimeError(f"native fast-copy wrote {wrote} bytes, expected {total}")
        return
    offset = 0
    for a in arrays:
        ctypes.memmove(dst_ptr + offset, address(np.ascontiguousarray(a)), a.nbytes)
        offset += a.nbytes


class _Sized:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def sizes_as_lengths(sizes: Sequence[int]) -> list:
    return [_Sized(n) for n in sizes]


class Transport:
    """Moves bytes between memory and one store."""

    def __init__(self, store: Any, buffer_pool: Any = None) -> None:
        self.store = store
        self.pool = buffer_pool

    # ---- writes ----------------------------------------------------------

    def put_chunks(
        self,
        keys: Sequence[str],
        chunks: Sequence[memoryview],
        policy: BundleTransferPolicy,
        config: Any = None,
    ) -> None:
        """Writes each chunk under its key; raises on the first failure (the
        caller removes what was written)."""
        if not keys:
            return
        store = self.store
        if policy.copy_mode == "zero_copy":
            raise RuntimeError("zero-copy put requires tensor-object buffers")
        if policy.copy_mode == "auto" and has(store, "batch_put_from"):
            if self.pool is not None and has(self.pool, "acquire"):
                self._put_through_pool(keys, chunks, policy, config)
                return
            if is_native_store(store):
                # One call for every chunk: the store copies each value into
                # its segment (faster here than its zero-copy path, which
                # moves the bytes through the transfer engine).
                status = call_write(store.put_batch, list(keys), list(chunks), config=config, keys=len(keys))
                check_status(status, "put_batch", keys[0])
                return
        written: list[str] = []
        try:
            self._each(keys, lambda key, chunk: (check_status(
                call_write(store.put, key, chunk, config=config), "put", key), written.append(key)),
                chunks, policy)
        except BaseException:
            self.remove_keys(written, strict=False)
            raise

    def resolve_put_mode(self, groups: Sequence[Sequence[Any]], policy: BundleTransferPolicy) -> str:
        """``batch`` (one call) or ``parallel`` (calls on several threads)
        for chunks made of ``groups`` of buffers."""
        if policy.put_mode in ("batch", "parallel"):
            return policy.put_mode
        threads = min(int(policy.max_inflight_put), len(groups))
        if threads < 2 or len(groups) < AUTO_PARALLEL_MIN_CHUNKS:
            return "batch"
        total = sum(len(b) if not isinstance(b, memoryview) else b.nbytes for g in groups for b in g)
        return "parallel" if total >= AUTO_PARALLEL_MIN_BYTES else "batch"

    _resolve_buffer_group_put_mode = resolve_put_mode

    def put_gathered(self, keys: Sequence[str], pieces: Sequence[Sequence[Any]],
                     policy: BundleTransferPolicy, config: Any = None) -> None:
        """Writes chunk ``i`` as the concatenation of ``pieces[i]``, each
        gathered straight into a pool lease and sent from there."""
        store, written = self.store, []
        try:
            for key, parts in zip(keys, pieces):
                size = sum(memoryview(p).nbytes for p in parts)
                lease = self.pool.acquire(size)
                try:
                    gather_into(parts, int(lease.ptr))
                    status = call_write(store.batch_put_from, [key], [int(lease.ptr)], [size],
                                        config=config)
                    written.append(key)
                    check_status(list(status)[0], "batch_put_from", key)
                finally:
                    lease.release()
        except BaseException:
            self.remove_keys(written, strict=False)
            raise

    def _put_through_pool(self, keys, chunks, policy, config) -> None:
        for key, chunk in zip(keys, chunks):
            lease = self.pool.acquire(chunk.nbytes)
            try:
                gather_into([chunk], int(lease.ptr))
                self._batch_put([key], [int(lease.ptr)], [chunk.nbytes], policy, config)
            finally:
                lease.release()

    def _batch_put(self, keys, ptrs, sizes, policy, config) -> None:
        store = self.store
        threads = max(1, int(policy.max_inflight_put))
        parallel = self.resolve_put_mode([[s] for s in sizes_as_lengths(sizes)], policy) == "parallel"
        if parallel and threads > 1 and len(keys) > 1:
            groups = [list(range(i, len(keys), threads)) for i in range(min(threads, len(keys)))]

            def run(group: list[int]) -> list[int]:
                return list(call_write(store.batch_put_from, [keys[i] for i in group],
                                       [ptrs[i] for i in group], [sizes[i] for i in group],
                                       config=config, keys=len(group)))

            with ThreadPoolExecutor(len(groups)) as pool:
                results = list(pool.map(run, groups))
            statuses = [0] * len(keys)
            for group, res in zip(groups, results):
                for i, s in zip(group, res):
                    statuses[i] = s
        else:
            statuses = list(call_write(store.batch_put_from, keys, ptrs, sizes, config=config, keys=len(keys)))
        if len(statuses) != len(keys):
            raise RuntimeError("Mooncake batch_put_from returned the wrong number of results")
        for key, status in zip(keys, statuses):
            check_status(status, "batch_put_from", key)

    @staticmethod
    def _each(keys, fn, chunks, policy: BundleTransferPolicy) -> None:
        threads = max(1, int(policy.max_inflight_put))
        if threads > 1 and len(keys) > 1 and policy.put_mode != "batch":
            with ThreadPoolExecutor(min(threads, len(keys))) as pool:
                for f in [pool.submit(fn, k, c) for k, c in zip(keys, chunks)]:
                    f.result()
            return
        for key, chunk in zip(keys, chunks):
            fn(key, chunk)

    # ---- reads -------------------------------------------------------------

    def read_bytes(self, spec: Mapping[str, Any]) -> bytes:
        """A whole payload as bytes."""
        total = int(spec["bytes"])
        chunks = spec["chunks"]
        if total == 0:
            return b""
        store = self.store
        if has(store, "batch_get_into") and has(store, "register_buffer"):
            buf = bytearray(total)
            base = address(buf)
            keys, ptrs, sizes, offset = [], [], [], 0
            for chunk in chunks:
                keys.append(chunk["key"])
                ptrs.append(base + offset)
                sizes.append(int(chunk["bytes"]))
                offset += int(chunk["bytes"])
            with registered(store, [(base, total)]):
                results = store.batch_get_into(keys, ptrs, sizes)
            for key, size, got in zip(keys, sizes, results):
                if got != size:
                    raise RuntimeError(f"Mooncake batch_get_into failed for {key}: {got}")
            return bytes(buf)
        return b"".join(self._get(chunk) for chunk in chunks)

    def _get(self, chunk: Mapping[str, Any]) -> bytes:
        data = self.store.get(chunk["key"])
        if data is None or len(data) != int(chunk["bytes"]):
            got = None if data is None else len(data)
            raise RuntimeError(f"Mooncake get failed for {chunk['key']}: got {got} bytes, "
                               f"expected {chunk['bytes']}")
        return bytes(data)

    def read_ranges_into(
        self,
        spec: Mapping[str, Any],
        ranges: Sequence[tuple[int, int, int]],
        dst_ptr: int,
        dst_size: int,
        pre_registered: bool = False,
        whole_chunk_get: bool = True,
    ) -> None:
        """Copies payload bytes ``[src, src + n)`` to ``dst_ptr + dst`` for
        every ``(src, n, dst)`` in ``ranges``."""
        self.read_many([(spec, ranges)], dst_ptr, dst_size, pre_registered, whole_chunk_get)

    def read_many(
        self,
        requests: Sequence[tuple[Mapping[str, Any], Sequence[tuple[int, int, int]]]],
        dst_ptr: int,
        dst_size: int,
        pre_registered: bool = False,
        whole_chunk_get: bool = True,
    ) -> None:
        """``read_ranges_into`` for several payloads into one destination,
        in one store call where the store allows it."""
        parts: dict[str, list[np.ndarray]] = {}
        sizes_of: dict[str, int] = {}
        for spec, ranges in requests:
            self._pieces(spec, ranges, parts, sizes_of)
        # key -> (k, 3) int64: offset in the chunk, length, destination offset
        per_key = {k: (v[0] if len(v) == 1 else np.concatenate(v)) for k, v in parts.items()}
        per_key = {k: v for k, v in per_key.items() if len(v)}
        if not per_key:
            return
        store = self.store
        regions = [] if pre_registered else [(dst_ptr, dst_size)]
        if whole_chunk_get and len(per_key) == 1 and has(store, "get_into") and has(store, "register_buffer"):
            ((key, pieces),) = per_key.items()
            if len(pieces) == 1 and pieces[0, 0] == 0 and pieces[0, 1] == sizes_of[key]:
                size = int(pieces[0, 1])
                with registered(store, regions):
                    got = store.get_into(key, dst_ptr + int(pieces[0, 2]), size)
                if got != size:
                    raise RuntimeError(f"Mooncake get_into failed for {key}: {got}")
                return
        if has(store, "get_into_ranges") and has(store, "register_buffer"):
            keys = list(per_key)
            with registered(store, regions):
                results = store.get_into_ranges(
                    [dst_ptr], [keys],
                    [[per_key[k][:, 2].tolist() for k in keys]],
                    [[per_key[k][:, 0].tolist() for k in keys]],
                    [[per_key[k][:, 1].tolist() for k in keys]],
                )
            for key, got in zip(keys, results[0]):
                want = per_key[key][:, 1]
                if len(got) != len(want) or not np.array_equal(np.asarray(got, dtype=np.int64), want):
                    bad = next((r for r, n in zip(got, want.tolist()) if r != n), None)
                    raise RuntimeError(f"Mooncake get_into_ranges failed for {key}: {bad}")
            return
        for key, pieces in per_key.items():
            data = self._get({"key": key, "bytes": sizes_of[key]})
            for src, n, dst in pieces.tolist():
                ctypes.memmove(dst_ptr + dst, data[src: src + n], n)

    @staticmethod
    def _pieces(spec, ranges, parts, sizes_of) -> None:
        """Splits payload ranges into per-chunk pieces (offset in the chunk,
        length, destination offset), as int64 (k, 3) arrays per key."""
        chunks = spec["chunks"]
        sizes = np.asarray([int(c["bytes"]) for c in chunks], dtype=np.int64)
        for chunk, size in zip(chunks, sizes.tolist()):
            sizes_of[chunk["key"]] = size
        r = np.array(ranges, dtype=np.int64).reshape(-1, 3)
        if not len(r):
            return
        if r[:, 1].min() <= 0:
            r = r[r[:, 1] > 0]
            if not len(r):
                return
        if r[:, 0].min() < 0 or (r[:, 0] + r[:, 1]).max() > int(sizes.sum()):
            raise ValueError("structured read range is outside the payload")
        if len(chunks) == 1:
            parts.setdefault(chunks[0]["key"], []).append(r)
            return
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        ends = (starts + sizes).tolist()
        starts = starts.tolist()
        for src, n, dst in r.tolist():
            i = bisect.bisect_right(ends, src)
            while n > 0:
                take = min(n, ends[i] - src)
                parts.setdefault(chunks[i]["key"], []).append(
                    np.asarray([[src - starts[i], take, dst]], dtype=np.int64))
                src, n, dst = src + take, n - take, dst + take
                i += 1

    # ---- removal -----------------------------------------------------------

    def remove_keys(self, keys: Sequence[str], strict: bool) -> None:
        """Removes ``keys``; a key already gone is fine. With ``strict`` the
        first failure is raised after every key was tried."""
        keys = list(dict.fromkeys(keys))
        if not keys:
            return
        store = self.store
        left = keys
        if has(store, "batch_remove"):
            try:
                results = list(store.batch_remove(keys, True))
                left = [k for k, r in zip(keys, results) if r not in (0, MISSING_OBJECT_ERROR)]
            except Exception:
                left = keys
        error: Optional[BaseException] = None
        for key in left:
            try:
                status = store.remove(key, True)
            except TypeError:
                status = store.remove(key)
            except Exception as exc:  # keep going: remove what can be removed
                error = error or exc
                continue
            if isinstance(status, int) and status < 0 and status != MISSING_OBJECT_ERROR:
                error = error or RuntimeError(f"Mooncake remove failed for {key}: {status}")
        if strict and error is not None:
            raise error
