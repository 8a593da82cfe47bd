"""The Work objects the backend's operations return."""

from __future__ import annotations

import concurrent.futures

import torch
import torch.distributed as dist
from torch.futures import Future


class Ready:
    """A future already resolved to ``value`` (what a send made in the
    caller's thread hands to its Work's confirmation)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def done(self) -> bool:
        return True

    def result(self):
        return self.value


class MooncakeWork(dist.Work):
    """One operation: done already (collectives run in the caller) or
    running on the backend's send/receive thread (point-to-point).

    A failure does not raise from ``wait``: like the reference, survivors
    of a dead rank go on, and ``get_local_success`` /
    ``get_failed_ranks_hint`` tell what happened. Misuse (a bad argument)
    raises when the operation is issued.
    """

    def __init__(
        self,
        result=None,
        *,
        future: concurrent.futures.Future | None = None,
        failed: list[int] | None = None,
        group_size: int = 0,
        source: int = -1,
        confirm=None,
    ):
        super().__init__()
        self._result = result
        self._future = future
        self._failed = sorted(set(failed or []))
        self._group_size = group_size
        self._source = source
        # Called with the future's result; it completes the operation (a
        # send waits there for its peer to read it).
        self._confirm = confirm
        self._error: BaseException | None = None
        self._settled = future is None

    def _settle(self) -> None:
        if self._settled:
            return
        try:
            out = self._future.result()
            if self._confirm is not None:
                self._confirm(out)
                out = None
        except Exception as exc:  # noqa: BLE001 - kept for exception()
            failed = getattr(exc, "mooncake_failed_ranks", None)
            if failed is None:
                self._error = exc
            else:
                self._failed = sorted(set(failed))
        else:
            if out is not None:
                self._source = out
        self._settled = True

    def wait(self, timeout=None) -> bool:
        self._settle()
        if self._error is not None:
            raise self._error
        return not self._failed

    def is_completed(self) -> bool:
        return self._settled or (self._confirm is None and self._future.done())

    def is_success(self) -> bool:
        self._settle()
        return self._error is None and not self._failed

    def exception(self):
        self._settle()
        return self._error

    def source_rank(self) -> int:
        self._settle()
        return self._source

    def result(self):
        self.wait()
        return self._result

    def get_future(self) -> Future:
        fut: Future = Future()
        self._settle()
        if self._error is not None:
            fut.set_exception(self._error)
        else:
            fut.set_result(self._result)
        return fut

    def local_success(self) -> bool:
        self._settle()
        return self._error is None and not self._failed

    def failed_ranks_hint(self) -> torch.Tensor:
        self._settle()
        hint = torch.zeros(self._group_size, dtype=torch.int32)
        for r in self._failed:
            if r < self._group_size:
                hint[r] = 1
        return hint
