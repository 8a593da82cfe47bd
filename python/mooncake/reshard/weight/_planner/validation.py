"""Consistency of a logical plan with its placements, and of source and
target tensor catalogs."""

from __future__ import annotations

from typing import Sequence

from ...contracts import ParticipantId, PlacementFragmentId, TensorId
from ...geometry import regions_exactly_cover
from ..manifest import PlacementFragment, TensorDescriptor, WeightPlacementManifest
from .contracts import LogicalTransferOperation, LogicalTransferPlan, PlacementExecutorPlan


def _participants_of_operations(
    placement: WeightPlacementManifest,
    operations: Sequence[LogicalTransferOperation],
    side: str,
) -> tuple[set[ParticipantId], dict[PlacementFragmentId, list[LogicalTransferOperation]]]:
    """Which participants the operations touch on ``side``; every fragment
    an operation names must be the placement's own, unchanged."""

    owner = {f.placement_fragment_id: (part, f) for part in placement.parts for f in part.fragments}
    touched: set[ParticipantId] = set()
    by_fragment: dict[PlacementFragmentId, list[LogicalTransferOperation]] = {}
    for op in operations:
        fragment = getattr(op, side)
        if not isinstance(fragment, PlacementFragment):
            raise ValueError(f"logical transfer operation {side} must be a placement")
        held = owner.get(fragment.placement_fragment_id)
        # IDs are unique within a placement: one comparison per operation.
        if held is None or held[1] != fragment:
            raise ValueError(f"logical plan and {side} placement fragment snapshots differ")
        part = held[0]
        touched.add(part.participant_id)
        by_fragment.setdefault(fragment.placement_fragment_id, []).append(op)
    return touched, by_fragment


def _check_executors(
    plan: LogicalTransferPlan,
    placement: WeightPlacementManifest,
    executors: Sequence[PlacementExecutorPlan],
    side: str,
) -> set[ParticipantId]:
    noun = "target" if side == "target" else "source"
    parts = {p.participant_id: p for p in placement.parts}
    seen: set[ParticipantId] = set()
    for e in executors:
        if e.placement_id != placement.placement_id:
            raise ValueError(f"logical {noun} executor placement differs from {noun}")
        if e.participant_id in seen:
            raise ValueError(f"logical plan has duplicate {noun} executor participant")
        seen.add(e.participant_id)
        part = parts.get(e.participant_id)
        if part is None or e.rank != part.rank:
            raise ValueError(f"logical {noun} executor differs from {noun} placement")
        if e.placement_fragment_ids != tuple(sorted(f.placement_fragment_id for f in part.fragments)):
            raise ValueError(f"logical {noun} executor fragments differ from {noun} placement")
        if not plan.operation_indices_for_executor(e, side):
            raise ValueError(f"logical {noun} executor operations differ from {noun} placement")
    return seen


def _validate_logical_target_coverage(plan: LogicalTransferPlan) -> None:
    """Every fragment of every target executor is written exactly once."""

    target = plan.target_placement
    touched, by_fragment = _participants_of_operations(target, plan.operations, "target")
    if not plan.target_executors:
        raise ValueError("logical plan has no target executor metadata")
    seen = _check_executors(plan, target, plan.target_executors, "target")
    parts = {p.participant_id: p for p in target.parts}
    selected: dict[PlacementFragmentId, PlacementFragment] = {}
    catalog: dict[TensorId, TensorDescriptor] = {}
    for e in plan.target_executors:
        part = parts[e.participant_id]
        selected.update({f.placement_fragment_id: f for f in part.fragments})
        for t in part.tensors:
            if catalog.setdefault(t.tensor_id, t) != t:
                raise ValueError("logical target tensor catalog differs from placement")
    if seen != touched:
        raise ValueError("logical target executors differ from planned operations")
    if plan.target_tensors != tuple(sorted(catalog.values(), key=lambda t: t.tensor_id)):
        raise ValueError("logical target tensor catalog differs from placement")
    for fid, fragment in selected.items():
        if not regions_exactly_cover(fragment, by_fragment.get(fid, ())):
            raise ValueError(f"logical target fragment is not fully covered: {fid}")


def _validate_logical_source_placement(plan: LogicalTransferPlan) -> None:
    """Source executors must match the source placement and the operations."""

    source = plan.source_placement
    if source is None:
        return
    if plan.source_tensors != source.tensors:
        raise ValueError("logical plan source tensor catalog differs from placement")
    if not plan.source_executors:
        raise ValueError("logical plan has no source executor metadata")
    touched, _ = _participants_of_operations(source, plan.operations, "source")
    seen = _check_executors(plan, source, plan.source_executors, "source")
    if seen != touched:
        raise ValueError("logical source executors differ from planned operations")


def _validate_tensor_compatibility(source: TensorDescriptor, target: TensorDescriptor) -> None:
    """Planning copies bytes: both sides must be the same tensor layout."""

    if source.layout_fingerprint != target.layout_fingerprint:
        raise ValueError(f"layout mismatch for tensor {source.tensor_id}")
    fields = ("global_shape", "dtype", "itemsize", "layer_id", "expert_id")
    if any(getattr(source, f) != getattr(target, f) for f in fields):
        raise ValueError(f"tensor descriptor mismatch: {source.tensor_id}")


def _validate_tensor_sets(
    source_tensors: dict[TensorId, TensorDescriptor],
    target_tensors: dict[TensorId, TensorDescriptor],
) -> None:
    missing = sorted(set(source_tensors) - set(target_tensors))
    if missing:
        raise ValueError(f"target manifests are missing tensors: {', '.join(missing)}")
    _validate_tensor_subset(source_tensors, target_tensors)


def _validate_tensor_subset(
    source_tensors: dict[TensorId, TensorDescriptor],
    target_tensors: dict[TensorId, TensorDescriptor],
) -> None:
    unknown = sorted(set(target_tensors) - set(source_tensors))
    if unknown:
        raise ValueError(f"target manifests contain unknown tensors: {', '.join(unknown)}")
