"""Byte geometry of one overlap between a source and a target fragment.

The work runs in Rust (``reshard_region``, ``reshard_match``): a region is
``inner_bytes`` contiguous bytes repeated over outer loops, with each side's
row-major byte strides; trailing dimensions both fragments hold whole fold
into the contiguous run.
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING, Optional

from ...._mooncake import reshard_region
from ...geometry import _native
from ..types import TensorDescriptor
from ..storage_manifest import StoredFragment
from .fragments import GeometryFragment, LogicalSourceFragment, LogicalTargetFragment

if TYPE_CHECKING:
    from .contracts import TransferRegion

RegionGeometry = tuple[int, int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def _fragment_itemsize(fragment: GeometryFragment) -> int:
    cells = prod(fragment.local_shape)
    if cells <= 0 or fragment.nbytes % cells != 0 or fragment.nbytes // cells <= 0:
        raise ValueError("transfer region fragment byte size is invalid")
    return fragment.nbytes // cells


def _validate_outer_strides(
    counts: tuple[int, ...], strides: tuple[int, ...], inner_bytes: int, side: str
) -> None:
    """Inner loops first: each stride must step past everything the loops
    inside it cover, or two runs would write the same bytes."""

    if len(counts) != len(strides):
        raise ValueError("zip() arguments have different lengths")
    span = inner_bytes
    for count, stride in zip(reversed(counts), reversed(strides)):
        if count > 1 and stride < span:
            raise ValueError(f"transfer region {side} strides overlap")
        span += (count - 1) * stride


def _overlap_box(
    source: GeometryFragment, target: GeometryFragment
) -> Optional[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The cells two fragments share, or None."""

    if len(source.global_offset) != len(target.global_offset):
        raise ValueError("zip() arguments have different lengths")
    begin = tuple(max(a, b) for a, b in zip(source.global_offset, target.global_offset))
    end = tuple(
        min(a + x, b + y)
        for a, x, b, y in zip(
            source.global_offset, source.local_shape, target.global_offset, target.local_shape
        )
    )
    shape = tuple(e - b for b, e in zip(begin, end))
    if any(extent <= 0 for extent in shape):
        return None
    return begin, shape


def _derive_region_geometry(
    source: GeometryFragment,
    target: GeometryFragment,
    overlap_offset: tuple[int, ...],
    overlap_shape: tuple[int, ...],
) -> RegionGeometry:
    itemsize = _fragment_itemsize(source)
    if _fragment_itemsize(target) != itemsize:
        raise ValueError("transfer region source and target itemsize differ")
    base_s, base_t, inner, counts, s_strides, t_strides = _native(
        reshard_region,
        (source.global_offset, source.local_shape),
        (target.global_offset, target.local_shape),
        (overlap_offset, overlap_shape),
        itemsize,
    )
    return base_s, base_t, inner, tuple(counts), tuple(s_strides), tuple(t_strides)


def _source_sort_key(fragment: LogicalSourceFragment) -> tuple[object, ...]:
    """Replicas of one box in a stable order: by rank, then ID."""

    if isinstance(fragment, StoredFragment):
        return (0, 0, 0, 0, fragment.object_key, fragment.fragment_id)
    rank = fragment.rank
    return (rank.dp, rank.pp, rank.ep, rank.tp, fragment.fragment_id)


def _transfer_region(
    tensor: TensorDescriptor,
    source: LogicalSourceFragment,
    target: LogicalTargetFragment,
    overlap_offset: tuple[int, ...],
    overlap_shape: tuple[int, ...],
    geometry: Optional[RegionGeometry] = None,
) -> "TransferRegion[LogicalSourceFragment, LogicalTargetFragment]":
    from .contracts import TransferRegion

    if _fragment_itemsize(source) != tensor.itemsize or _fragment_itemsize(target) != tensor.itemsize:
        raise ValueError("transfer region fragment itemsize differs from descriptor")
    if geometry is None:
        geometry = _derive_region_geometry(source, target, overlap_offset, overlap_shape)
    base_s, base_t, inner, counts, s_strides, t_strides = geometry
    return TransferRegion(
        tensor_id=tensor.tensor_id,
        source=source,
        target=target,
        overlap_offset=overlap_offset,
        overlap_shape=overlap_shape,
        source_base_offset=base_s,
        target_base_offset=base_t,
        inner_bytes=inner,
        outer_loop_counts=counts,
        source_strides=s_strides,
        target_strides=t_strides,
    )
