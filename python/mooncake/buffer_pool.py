"""``mooncake.BufferPool``: leases of memory the store can move in place.

A pool lends pieces of a set-up store's local buffer (``local_buffer_size`` at
setup; memory the transfer engine already knows), so a lease works with
``put_from`` / ``get_into`` and their batch forms without
``register_buffer``. When the local buffer has no room, a lease is an
overflow region allocated for it, aligned to ``alignment`` and registered
with the store until the lease is released.

The pool bounds what it lends: ``max_bytes`` in all (0: twice the local
buffer; never less than the local buffer) and ``max_regions`` leases at once.
Beyond that ``acquire`` waits for a release (``block``/``timeout``, or the
pool's ``block_on_exhaustion``/``default_timeout``) or raises
``RuntimeError``.

Size classes shape overflow regions: a request of at most ``max_size_class``
bytes gets a region of the smallest ``min_size_class * 2**k`` that holds it
(fewer distinct sizes for the allocator to keep apart); a larger one gets
exactly its size. Local-buffer leases take exactly their size (on 64-byte
boundaries).

A :class:`BufferLease` has ``ptr``, ``size`` and ``buffer`` (a writable
``memoryview`` of ``size`` bytes); ``release()`` (or leaving its ``with``
block, or dropping it) gives the memory back. It refuses while a view of
``buffer`` is alive; afterwards ``ptr`` raises ``RuntimeError`` and
``buffer`` ``BufferError``.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Dict, Optional

from ._mooncake import MooncakeDistributedStore as _Store
from ._mooncake import _PoolMemory

__all__ = ["BufferLease", "BufferPool", "RegisteredBufferLease", "RegisteredBufferPool"]

_U64 = 1 << 64


def _count(name: str, value) -> int:
    """``value`` as a size or count: an int in ``[0, 2**64)``, else TypeError."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _U64:
        raise TypeError(f"{name} must be a non-negative integer below 2**64, got {value!r}")
    return value


class BufferLease(_PoolMemory):
    """Memory lent by a :class:`BufferPool` (see the module's description)."""

    _pool: Optional["BufferPool"] = None

    @property
    def buffer(self) -> memoryview:
        """The lease's ``size`` bytes, writable; views keep the lease alive."""
        return memoryview(self)

    def release(self) -> None:
        """Gives the memory back to the pool; a second call does nothing.
        ``RuntimeError`` while a view of ``buffer`` is alive."""
        if _PoolMemory.release(self):
            pool, self._pool = self._pool, None
            if pool is not None:
                pool._returned(self)

    def __enter__(self) -> "BufferLease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        # A dropped lease has no view left (each view holds a reference).
        try:
            self.release()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __repr__(self) -> str:
        where = "overflow" if self.overflow else "local buffer"
        return f"<BufferLease {self.size} bytes in the {where}>"


class BufferPool:
    """Leases of store memory; ``RegisteredBufferPool`` is the same class."""

    def __init__(
        self,
        store,
        max_bytes: int = 0,
        min_size_class: int = 64 * 1024,
        max_size_class: Optional[int] = None,
        alignment: int = 8 * 1024 * 1024,
        block_on_exhaustion: bool = True,
        default_timeout: Optional[float] = None,
        max_regions: Optional[int] = None,
        prewarm_size: Optional[int] = None,
        prewarm_count: int = 0,
    ) -> None:
        max_bytes = _count("max_bytes", max_bytes)
        min_size_class = _count("min_size_class", min_size_class)
        alignment = _count("alignment", alignment)
        if not isinstance(store, _Store):
            raise RuntimeError(
                f"BufferPool needs a MooncakeDistributedStore, got {type(store).__name__}"
            )
        local = store._local_buffer_size()
        if local is None:
            raise RuntimeError("MooncakeDistributedStore is not initialized")
        if min_size_class == 0 or alignment == 0:
            raise RuntimeError("min_size_class and alignment must be positive")
        if alignment < ctypes.sizeof(ctypes.c_void_p) or alignment & (alignment - 1):
            raise RuntimeError("alignment must be a power of two and at least sizeof(void*)")
        if local == 0:
            raise RuntimeError("BufferPool requires a store configured with a local buffer")
        self._store = store
        self._max_bytes = 2 * local if max_bytes == 0 else max(max_bytes, local)
        self._min_class = min_size_class
        self._max_class = (
            self._max_bytes if max_size_class is None else _count("max_size_class", max_size_class)
        )
        self._alignment = alignment
        self._block = bool(block_on_exhaustion)
        self._default_timeout = None if default_timeout is None else float(default_timeout)
        if self._default_timeout is not None and self._default_timeout < 0:
            raise RuntimeError("default_timeout must be non-negative")
        self._max_regions = None if max_regions is None else _count("max_regions", max_regions)
        self._cond = threading.Condition()
        self._closed = self._closing = False
        # Bytes and leases out, and those being allocated right now.
        self._bytes = self._leases = 0
        self._reserved_bytes = self._reserved = 0
        self._stats = dict.fromkeys(
            ("acquired", "released", "local", "overflow", "oversize", "waits"), 0
        )
        if prewarm_size is not None and _count("prewarm_count", prewarm_count) > 0:
            self.prewarm(prewarm_size, prewarm_count)

    # ---- leases --------------------------------------------------------

    def acquire(self, size: int, block: Optional[bool] = None,
                timeout: Optional[float] = None) -> BufferLease:
        """A lease of ``size`` bytes. When the pool's limits are reached it
        waits (``block``, default ``block_on_exhaustion``) up to ``timeout``
        seconds (default ``default_timeout``; ``None``: for ever), else
        raises ``RuntimeError``."""
        size = _count("size", size)
        wait = self._block if block is None else bool(block)
        limit = self._default_timeout if timeout is None else float(timeout)
        if limit is not None and limit < 0:
            raise RuntimeError("timeout must be non-negative")
        need = self._region_len(size)
        if need > self._max_bytes:
            raise RuntimeError("requested buffer size exceeds pool capacity")
        deadline = None if limit is None else time.monotonic() + limit
        with self._cond:
            while True:
                self._check_open()
                if self._has_room(need):
                    break
                if not wait:
                    raise RuntimeError("buffer pool is exhausted")
                self._stats["waits"] += 1
                if deadline is None:
                    self._cond.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RuntimeError("timed out waiting for buffer")
                    self._cond.wait(left)
            self._reserved_bytes += need
            self._reserved += 1
        # Allocating (and registering an overflow region) runs unlocked and
        # without the GIL; the reservation keeps the limits.
        try:
            lease = BufferLease.__new__(BufferLease, self._store, size, need, self._alignment)
        except BaseException:
            self._unreserve(need)
            raise
        with self._cond:
            self._reserved_bytes -= need
            self._reserved -= 1
            self._cond.notify_all()
            if self._closing or self._closed:
                _PoolMemory.release(lease)
                raise RuntimeError("buffer pool is closing")
            lease._pool = self
            self._bytes += lease.region_len
            self._leases += 1
            self._stats["acquired"] += 1
            self._stats["overflow" if lease.overflow else "local"] += 1
            self._stats["oversize"] += size > self._max_class
        return lease

    def buffer(self, size: int, block: Optional[bool] = None,
               timeout: Optional[float] = None) -> BufferLease:
        """:meth:`acquire`, named for ``with pool.buffer(n) as lease:``."""
        return self.acquire(size, block, timeout)

    def prewarm(self, size: int, count: int) -> None:
        """Faults in the local-buffer pages that ``count`` leases of ``size``
        bytes would use, so the first real leases do not pay for it. Only
        what fits in the local buffer at once is warmed (overflow regions
        are fresh memory each time, so warming one would not last)."""
        size, count = _count("size", size), _count("count", count)
        leases = []
        try:
            for _ in range(count):
                try:
                    lease = BufferLease.__new__(BufferLease, self._store, size)
                except RuntimeError:
                    break
                ctypes.memset(lease.ptr, 0, size)
                leases.append(lease)
        finally:
            for lease in leases:
                _PoolMemory.release(lease)

    def close(self) -> None:
        """Closes the pool (again: nothing). ``RuntimeError`` while leases are
        out; they stay usable then."""
        with self._cond:
            if self._closed:
                return
            self._closing = True
            self._cond.wait_for(lambda: self._reserved == 0)
            self._closing = False
            self._cond.notify_all()
            if self._leases:
                raise RuntimeError(
                    f"cannot close buffer pool with active leases ({self._leases} out)"
                )
            self._closed = True

    def stats(self) -> Dict[str, int]:
        """Counts since the pool was made (``acquired``, ``released``,
        ``local``, ``overflow``, ``oversize``: leases above
        ``max_size_class``, ``waits``) and what is out now (``leases``,
        ``bytes``)."""
        with self._cond:
            return dict(self._stats, leases=self._leases, bytes=self._bytes)

    # ---- internals -----------------------------------------------------

    def _region_len(self, size: int) -> int:
        """Bytes reserved for a request: its size class (see the module)."""
        size = max(size, 1)
        if size > self._max_class:
            return size
        cls = self._min_class
        while cls < size:
            cls <<= 1
        return min(cls, max(size, self._max_class))

    def _has_room(self, need: int) -> bool:
        used = self._bytes + self._reserved_bytes
        if need > self._max_bytes - used:
            return False
        return self._max_regions is None or self._leases + self._reserved < self._max_regions

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("buffer pool is closed")
        if self._closing:
            raise RuntimeError("buffer pool is closing")

    def _unreserve(self, need: int) -> None:
        with self._cond:
            self._reserved_bytes -= need
            self._reserved -= 1
            self._cond.notify_all()

    def _returned(self, lease: BufferLease) -> None:
        with self._cond:
            self._bytes -= lease.region_len
            self._leases -= 1
            self._stats["released"] += 1
            self._cond.notify_all()


RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
