"""N-D logical boxes shared by the reshard planners.

A box is ``(global_offset, local_shape)``. The checks run in Rust
(``mooncake._mooncake.reshard_*``): intervals by a sort, rectangles by a
sweep with a counting segment tree, higher ranks by an exact sweep that
gives up (ValueError) after ``_MAX_HIGH_DIMENSIONAL_PAIRWISE_COMPARISONS``
comparisons rather than run unbounded.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

from .._mooncake import reshard_boxes_exactly_cover, reshard_boxes_overlap

_MAX_HIGH_DIMENSIONAL_PAIRWISE_COMPARISONS = 1_000_000

Box = tuple[tuple[int, ...], tuple[int, ...]]


class LogicalBox(Protocol):
    @property
    def global_offset(self) -> tuple[int, ...]: ...

    @property
    def local_shape(self) -> tuple[int, ...]: ...


class OverlapRegion(Protocol):
    @property
    def overlap_offset(self) -> tuple[int, ...]: ...

    @property
    def overlap_shape(self) -> tuple[int, ...]: ...


def box_contains(
    outer_offset: tuple[int, ...],
    outer_shape: tuple[int, ...],
    inner_offset: tuple[int, ...],
    inner_shape: tuple[int, ...],
) -> bool:
    """Whether the inner box lies wholly inside the outer one."""

    if not (len(outer_offset) == len(outer_shape) == len(inner_offset) == len(inner_shape)):
        raise ValueError("zip() arguments have different lengths")
    return all(
        ob <= ib and ib + ie <= ob + oe
        for ob, oe, ib, ie in zip(outer_offset, outer_shape, inner_offset, inner_shape)
    )


def _budget() -> int:
    return min(max(0, int(_MAX_HIGH_DIMENSIONAL_PAIRWISE_COMPARISONS)), (1 << 64) - 1)


def _native(call, *args):
    # Coordinates are unsigned 64-bit in Rust: no addressable tensor has
    # more, and a negative one is no box.
    try:
        return call(*args)
    except OverflowError as error:
        raise ValueError("box coordinates must be integers in [0, 2**64)") from error


def boxes_overlap(boxes: Sequence[Box]) -> bool:
    """Whether any two boxes share a cell."""

    return _native(reshard_boxes_overlap, [(tuple(o), tuple(s)) for o, s in boxes], _budget())


def boxes_exactly_cover(
    container_offset: tuple[int, ...],
    container_shape: tuple[int, ...],
    boxes: Sequence[Box],
) -> bool:
    """Whether the boxes lie inside the container, do not overlap, and add up
    to its volume."""

    return _native(
        reshard_boxes_exactly_cover,
        (tuple(container_offset), tuple(container_shape)),
        [(tuple(o), tuple(s)) for o, s in boxes],
        _budget(),
    )


def regions_exactly_cover(target: LogicalBox, regions: Iterable[OverlapRegion]) -> bool:
    """Whether the regions' overlap boxes tile ``target`` exactly."""

    return boxes_exactly_cover(
        target.global_offset,
        target.local_shape,
        [(r.overlap_offset, r.overlap_shape) for r in regions],
    )


__all__ = [
    "LogicalBox",
    "OverlapRegion",
    "box_contains",
    "boxes_exactly_cover",
    "boxes_overlap",
    "regions_exactly_cover",
]
