"""Which source fragments a target may read: DP replicas, declared owners."""

from __future__ import annotations

from typing import Sequence

from ...contracts import TensorId
from ...geometry import boxes_exactly_cover
from ..manifest import OwnershipAxis, PlacementFragment, TensorDescriptor
from .contracts import RuntimeTensorOwner
from .fragments import LogicalSourceFragment, LogicalTargetFragment


def _covers(tensor: TensorDescriptor, fragments: Sequence[LogicalSourceFragment]) -> bool:
    """Whether the distinct boxes of ``fragments`` tile the whole tensor."""

    boxes = list(dict.fromkeys(
        (f.global_offset, f.local_shape) for f in fragments if f.tensor_id == tensor.tensor_id
    ))
    return boxes_exactly_cover((0,) * len(tensor.global_shape), tensor.global_shape, boxes)


def parallel_tensor_owner(tensor: TensorDescriptor, fragment: PlacementFragment) -> RuntimeTensorOwner:
    """The fragment's coordinates on the tensor's ownership axes."""

    return tuple(
        (a.kind, getattr(fragment.rank, a.kind))
        for a in tensor.parallel_axes
        if isinstance(a, OwnershipAxis)
    )


def has_dp_ownership(tensor: TensorDescriptor) -> bool:
    """Whether DP names the tensor's owner rather than a replica."""

    return any(isinstance(a, OwnershipAxis) and a.kind == "dp" for a in tensor.parallel_axes)


def _by_owner(tensor: TensorDescriptor, fragments: Sequence[PlacementFragment]) -> dict[RuntimeTensorOwner, list[PlacementFragment]]:
    out: dict[RuntimeTensorOwner, list[PlacementFragment]] = {}
    for f in fragments:
        out.setdefault(parallel_tensor_owner(tensor, f), []).append(f)
    return out


def complete_dp_owned_source_owners(
    source_tensors: dict[TensorId, TensorDescriptor],
    source_fragments: Sequence[PlacementFragment],
) -> dict[TensorId, RuntimeTensorOwner]:
    """The single complete declared owner of each DP-owned tensor; a
    missing, partial or second owner is refused."""

    owned = [t for t in source_tensors.values() if has_dp_ownership(t)]
    if not owned:
        return {}
    by_tensor: dict[str, list[PlacementFragment]] = {}
    for f in source_fragments:
        by_tensor.setdefault(f.tensor_id, []).append(f)
    result: dict[TensorId, RuntimeTensorOwner] = {}
    for tensor in owned:
        groups = _by_owner(tensor, by_tensor.get(tensor.tensor_id, []))
        complete = sorted(owner for owner, fs in groups.items() if _covers(tensor, fs))
        if not complete:
            raise ValueError(f"DP-owned source tensor has no complete declared owner: {tensor.tensor_id}")
        if len(complete) != 1 or len(groups) != 1:
            raise ValueError(f"DP-owned source tensor has ambiguous declared owners: {tensor.tensor_id}")
        result[tensor.tensor_id] = complete[0]
    return result


def _validate_target_coverage(
    target_tensors: dict[TensorId, TensorDescriptor],
    target_fragments: Sequence[LogicalTargetFragment],
) -> None:
    """Every DP replica of the target (or the declared owner of a DP-owned
    tensor) must hold each tensor whole."""

    if not target_fragments:
        raise ValueError("target manifests have no fragments")
    by_dp: dict[int, dict[str, list[PlacementFragment]]] = {}
    for f in target_fragments:
        by_dp.setdefault(f.rank.dp, {}).setdefault(f.tensor_id, []).append(f)
    for tensor in target_tensors.values():
        if has_dp_ownership(tensor):
            everywhere = [f for per in by_dp.values() for f in per.get(tensor.tensor_id, [])]
            groups = _by_owner(tensor, everywhere)
            if not groups or not all(_covers(tensor, fs) for fs in groups.values()):
                raise ValueError(f"target tensor is not fully covered by its DP owner: {tensor.tensor_id}")
            continue
        for dp in sorted(by_dp):
            groups = _by_owner(tensor, by_dp[dp].get(tensor.tensor_id, []))
            if not groups or not all(_covers(tensor, fs) for fs in groups.values()):
                raise ValueError(f"target tensor is not fully covered: {tensor.tensor_id}: dp={dp}")


def complete_parallel_source_replicas(
    source_tensors: dict[TensorId, TensorDescriptor],
    source_fragments: Sequence[PlacementFragment],
) -> dict[int, dict[TensorId, RuntimeTensorOwner]]:
    """For each DP rank whose fragments hold every replicated tensor whole,
    the owner to read each tensor from (the lowest complete one)."""

    tensors = [t for t in source_tensors.values() if not has_dp_ownership(t)]
    if not tensors:
        return {}
    by_dp: dict[int, dict[str, list[PlacementFragment]]] = {}
    for f in source_fragments:
        by_dp.setdefault(f.rank.dp, {}).setdefault(f.tensor_id, []).append(f)
    replicas: dict[int, dict[TensorId, RuntimeTensorOwner]] = {}
    for dp in sorted(by_dp):
        owners: dict[TensorId, RuntimeTensorOwner] = {}
        for tensor in tensors:
            groups = _by_owner(tensor, by_dp[dp].get(tensor.tensor_id, []))
            complete = [owner for owner, fs in groups.items() if _covers(tensor, fs)]
            if not groups or len(complete) != len(groups):
                break
            owners[tensor.tensor_id] = min(complete)
        else:
            replicas[dp] = owners
    if not replicas:
        raise ValueError("source manifests have no complete DP replica; tensors are not fully covered")
    return replicas


def _validate_local_target_inventory(
    target_tensors: dict[TensorId, TensorDescriptor],
    target_fragments: Sequence[LogicalTargetFragment],
) -> None:
    if not target_fragments:
        raise ValueError("local target manifest has no fragments")
    if len({f.rank for f in target_fragments}) != 1:
        raise ValueError("local target manifest must describe exactly one executor")
    missing = sorted(set(target_tensors) - {f.tensor_id for f in target_fragments})
    if missing:
        raise ValueError(f"local target manifest is missing fragments: {', '.join(missing)}")


__all__ = [
    "complete_dp_owned_source_owners",
    "complete_parallel_source_replicas",
    "has_dp_ownership",
    "parallel_tensor_owner",
]
