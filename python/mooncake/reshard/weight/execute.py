"""Running a logical plan between host buffers.

``execute_plan(plan, sources, targets)`` moves the bytes of every region of
``plan``: ``sources`` maps each source fragment ID (a placement fragment's
``placement_fragment_id`` or a stored fragment's ``fragment_id``) to a
buffer with that fragment's C-contiguous bytes, ``targets`` maps each target
``placement_fragment_id`` to a writable buffer of the target fragment's
size. The copies run in Rust with the GIL released, split over ``nthreads``
threads by target buffer. Every buffer size and region bound is checked
before a byte moves; a target that overlaps another buffer is refused.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from ..._mooncake import reshard_copy
from ._planner.contracts import LogicalTransferPlan


def _bytes_view(buffer: object, what: str, nbytes: int, writable: bool) -> memoryview:
    try:
        view = memoryview(buffer)  # type: ignore[arg-type]
    except TypeError as error:
        raise TypeError(f"{what} must support the buffer protocol") from error
    if not view.c_contiguous:
        raise ValueError(f"{what} is not C-contiguous")
    if writable and view.readonly:
        raise ValueError(f"{what} is read-only")
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    if view.nbytes != nbytes:
        raise ValueError(f"{what} holds {view.nbytes} bytes, the fragment {nbytes}")
    return view


def execute_plan(
    plan: LogicalTransferPlan,
    sources: Mapping[str, object],
    targets: Mapping[str, object],
    *,
    nthreads: Optional[int] = None,
) -> int:
    """Copy every region of ``plan``; returns the bytes moved
    (``plan.total_bytes``)."""

    if not isinstance(plan, LogicalTransferPlan):
        raise ValueError("plan must be a LogicalTransferPlan")
    source_index: dict[str, int] = {}
    target_index: dict[str, int] = {}
    source_views: list[memoryview] = []
    target_views: list[memoryview] = []
    jobs = []
    for op in plan.operations:
        sid, tid = op.source.fragment_id, op.target.placement_fragment_id
        if sid not in source_index:
            if sid not in sources:
                raise KeyError(f"no source buffer for fragment {sid}")
            source_index[sid] = len(source_views)
            source_views.append(_bytes_view(sources[sid], f"source {sid}", op.source.nbytes, False))
        if tid not in target_index:
            if tid not in targets:
                raise KeyError(f"no target buffer for fragment {tid}")
            target_index[tid] = len(target_views)
            target_views.append(_bytes_view(targets[tid], f"target {tid}", op.target.nbytes, True))
        jobs.append((source_index[sid], target_index[tid], op._native))
    threads = nthreads if nthreads is not None else min(8, os.cpu_count() or 1)
    if type(threads) is not int or threads <= 0:
        raise ValueError("nthreads must be a positive integer")
    return reshard_copy(jobs, source_views, target_views, threads)


__all__ = ["execute_plan"]
