"""Point-to-point work threads: one per peer and direction.

A send blocks while its peer's mailbox is full, and a receive until its
peer has written; with one thread per peer, the operations of a batch
(``batch_isend_irecv``) towards different peers are all under way at
once, and one slow or full peer holds up only its own. Per peer, the
operations still run in the order they were issued, as messages between
two ranks must be matched in order.
"""

from __future__ import annotations

import concurrent.futures
import threading


class Channels:
    """Single-thread executors keyed by peer, made when first used (a
    thread waiting for work costs no CPU)."""

    def __init__(self, name: str):
        self._name = name
        self._pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
        self._last: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()

    def idle(self, peer: int) -> bool:
        """Whether everything given for ``peer`` has ended (the caller may
        then act for it in its own thread without passing anything)."""
        last = self._last.get(peer)
        return last is None or last.done()

    def submit(self, peer: int, fn, *args) -> concurrent.futures.Future:
        pool = self._pools.get(peer)
        if pool is None:
            with self._lock:
                pool = self._pools.get(peer)
                if pool is None:
                    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"{self._name}-{peer}")
                    self._pools[peer] = pool
        fut = self._last[peer] = pool.submit(fn, *args)
        return fut

    def drain(self) -> None:
        """Until what every thread was given has ended."""
        for pool in list(self._pools.values()):
            pool.submit(lambda: None).result()

    def shutdown(self, wait: bool) -> None:
        for pool in list(self._pools.values()):
            pool.shutdown(wait=wait, cancel_futures=not wait)
