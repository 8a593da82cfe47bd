"""Point-to-point work threads: one per peer and direction.

A send blocks while its peer's mailbox is full, and a receive until its
peer has written; with one thread per peer, the operations of a batch
(``batch_isend_irecv``) towards different peers are all under way at
once, and one slow or full peer holds up only its own. Per peer, the
operations still run in the order they were issued, as messages between
two ranks must be matched in order.

A receive is a ``Shared`` operation: its peer's thread runs it, unless
the thread that waits for it gets there first (a blocking ``recv`` is an
``irecv`` waited on at once): then it runs in the waiting thread, and
the hand-offs to the peer's thread and back cost nothing on the way.
The peer's thread still holds it, so a receive nobody waits for yet makes
progress all the same (a peer's send may be waiting for it).
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
        self._shared: dict[int, Shared] = {}
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

    def submit_shared(self, peer: int, fn, *args) -> Shared:
        """``fn(*args)`` as a ``Shared`` operation of ``peer``."""
        op = Shared(fn, args, self._shared.get(peer))
        self._shared[peer] = op
        self.submit(peer, op.run_in_thread)
        return op

    def drain(self) -> None:
        """Until what every thread was given has ended."""
        for pool in list(self._pools.values()):
            pool.submit(lambda: None).result()

    def shutdown(self, wait: bool) -> None:
        for pool in list(self._pools.values()):
            pool.shutdown(wait=wait, cancel_futures=not wait)


class Shared:
    """One operation of a peer, run by whichever comes first: the peer's
    thread or the thread that waits for it; either way only once the
    operation issued before it for that peer has ended."""

    def __init__(self, fn, args, prev: Shared | None):
        self._fn, self._args, self._prev = fn, args, prev
        self._lock = threading.Lock()
        self._taken = False
        self._ended = threading.Event()
        self._value = None
        self._error: BaseException | None = None

    def _take(self) -> bool:
        with self._lock:
            taken, self._taken = self._taken, True
        return not taken

    def _run(self) -> None:
        prev, self._prev = self._prev, None
        if prev is not None:
            prev._ended.wait()
        try:
            self._value = self._fn(*self._args)
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self._error = exc
        finally:
            self._ended.set()

    def run_in_thread(self) -> None:
        if self._take():
            self._run()

    def done(self) -> bool:
        return self._ended.is_set()

    def result(self):
        if self._take():
            self._run()
        else:
            self._ended.wait()
        if self._error is not None:
            raise self._error
        return self._value
