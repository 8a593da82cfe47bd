"""The planner: for every target fragment, the source boxes that fill it.

Per tensor, one Rust call (``reshard_match``) indexes the distinct source
boxes on their most selective dimension and returns, for every target box,
the overlapping source boxes with each overlap's strided byte geometry.
Python then picks which replica of a box to read (DP replica, declared
owner) and builds the checked plan objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ...._mooncake import reshard_match
from ...contracts import ParticipantId, PlacementFragmentId, ResourceId, RevisionId, TensorId
from ...geometry import _native, boxes_exactly_cover
from ..placement import WeightPlacementManifest
from ..storage_manifest import StoredFragment, WeightManifest
from ..types import ParallelRank, PlacementFragment, TensorDescriptor
from . import geometry
from .contracts import LogicalTransferOperation, LogicalTransferPlan, PlacementExecutorPlan, PlanningLimits
from .fragments import LogicalSourceFragment, LogicalTargetFragment
from .ownership import (
    _validate_local_target_inventory,
    _validate_target_coverage,
    complete_dp_owned_source_owners,
    complete_parallel_source_replicas,
    has_dp_ownership,
    parallel_tensor_owner,
)
from .validation import _validate_tensor_compatibility, _validate_tensor_sets, _validate_tensor_subset


@dataclass(frozen=True)
class _PlannedTransfer:
    resource_id: ResourceId
    revision: RevisionId
    operations: tuple[LogicalTransferOperation, ...]
    planning_limits: PlanningLimits


def _collect_placements(
    manifests: Sequence[WeightPlacementManifest], label: str
) -> tuple[dict[TensorId, TensorDescriptor], list[PlacementFragment]]:
    if not manifests:
        raise ValueError(f"{label} placement manifests must not be empty")
    if len(manifests) != 1:
        raise ValueError(f"{label} requires one complete WeightPlacementManifest")
    manifest = manifests[0]
    if not isinstance(manifest, WeightPlacementManifest):
        raise ValueError(f"{label} placement manifests must be WeightPlacementManifest")
    tensors = {t.tensor_id: t for t in manifest.tensors}
    seen: set[PlacementFragmentId] = set()
    for f in manifest.fragments:
        if f.placement_fragment_id in seen:
            raise ValueError(f"duplicate {label} placement fragment: {f.placement_fragment_id}")
        seen.add(f.placement_fragment_id)
    return tensors, list(manifest.fragments)


def _executor_plans(
    placement: WeightPlacementManifest,
    operations: Sequence[LogicalTransferOperation],
    side: str,
    participant_ids: Optional[frozenset[ParticipantId]] = None,
) -> tuple[PlacementExecutorPlan, ...]:
    """One executor per participant whose fragments some operation uses."""

    used: set[PlacementFragmentId] = set()
    for op in operations:
        fragment = getattr(op, side)
        if not isinstance(fragment, PlacementFragment):
            raise ValueError(f"placement executor operation {side} is not a placement")
        used.add(fragment.placement_fragment_id)
    plans: list[PlacementExecutorPlan] = []
    ranks: set[ParallelRank] = set()
    for part in placement.parts:
        if participant_ids is not None and part.participant_id not in participant_ids:
            continue
        if not part.fragments:
            continue
        if part.rank in ranks:
            raise ValueError(f"duplicate {side} placement executor rank: {part.rank}")
        ranks.add(part.rank)
        ids = tuple(sorted(f.placement_fragment_id for f in part.fragments))
        if used.isdisjoint(ids):
            continue
        plans.append(
            PlacementExecutorPlan(
                placement_id=placement.placement_id,
                participant_id=part.participant_id,
                rank=part.rank,
                placement_fragment_ids=ids,
            )
        )
    plans.sort(key=lambda e: (e.rank.dp, e.rank.pp, e.rank.ep, e.rank.tp))
    return tuple(plans)


class _SourceChooser:
    """Which replica of a source box a target reads: for placement sources,
    the fragment of the DP replica assigned to the target's DP rank (or the
    declared owner of a DP-owned tensor); for stored sources, the first."""

    def __init__(
        self,
        source_tensors: dict[TensorId, TensorDescriptor],
        placed: Sequence[PlacementFragment],
        target_fragments: Sequence[LogicalTargetFragment],
    ) -> None:
        self.parallel = bool(placed)
        self.tensors = source_tensors
        self.replicas = complete_parallel_source_replicas(source_tensors, placed) if placed else {}
        self.dp_owners = complete_dp_owned_source_owners(source_tensors, placed) if placed else {}
        dp_ranks = sorted(self.replicas)
        self.dp_for_target = (
            {dp: dp_ranks[dp % len(dp_ranks)] for dp in {f.rank.dp for f in target_fragments}}
            if placed and dp_ranks
            else {}
        )

    def pick(self, group: Sequence[LogicalSourceFragment], target: LogicalTargetFragment) -> Optional[LogicalSourceFragment]:
        if not self.parallel:
            return group[0]
        tensor = self.tensors[target.tensor_id]
        if has_dp_ownership(tensor):
            owner = self.dp_owners[target.tensor_id]
            dp = None
        else:
            dp = self.dp_for_target[target.rank.dp]
            owner = self.replicas[dp][target.tensor_id]
        for f in group:
            if (
                isinstance(f, PlacementFragment)
                and (dp is None or f.rank.dp == dp)
                and parallel_tensor_owner(tensor, f) == owner
            ):
                return f
        return None


def _plan_transfer(
    resource_id: ResourceId,
    revision: RevisionId,
    source_tensors: dict[TensorId, TensorDescriptor],
    source_fragments: Sequence[LogicalSourceFragment],
    target_tensors: dict[TensorId, TensorDescriptor],
    target_fragments: Sequence[LogicalTargetFragment],
    *,
    local_target: bool = False,
    planning_limits: Optional[PlanningLimits] = None,
) -> _PlannedTransfer:
    limits = planning_limits or PlanningLimits()
    if local_target:
        _validate_tensor_subset(source_tensors, target_tensors)
        _validate_local_target_inventory(target_tensors, target_fragments)
    else:
        _validate_tensor_sets(source_tensors, target_tensors)
        _validate_target_coverage(target_tensors, target_fragments)
    placed = [f for f in source_fragments if isinstance(f, PlacementFragment)]
    stored = [f for f in source_fragments if isinstance(f, StoredFragment)]
    if not source_fragments or len(placed) + len(stored) != len(source_fragments) or (placed and stored):
        raise ValueError("source fragments mix placement and stored locations")
    chooser = _SourceChooser(source_tensors, placed, target_fragments)

    # Replicas of one box form a group, read in a stable order.
    groups: dict[TensorId, dict[tuple[tuple[int, ...], tuple[int, ...]], list[LogicalSourceFragment]]] = {}
    for f in source_fragments:
        groups.setdefault(f.tensor_id, {}).setdefault((f.global_offset, f.local_shape), []).append(f)
    for per_tensor in groups.values():
        for group in per_tensor.values():
            group.sort(key=geometry._source_sort_key)

    targets = sorted(target_fragments, key=lambda f: f.fragment_id)
    targets_by_tensor: dict[TensorId, list[LogicalTargetFragment]] = {}
    for t in targets:
        targets_by_tensor.setdefault(t.tensor_id, []).append(t)
    matches: dict[PlacementFragmentId, list[tuple[int, tuple[int, ...], tuple[int, ...], tuple[object, ...]]]] = {}
    group_lists: dict[TensorId, list[list[LogicalSourceFragment]]] = {}
    for tensor_id, tensor_targets in targets_by_tensor.items():
        tensor = target_tensors[tensor_id]
        boxes = list(groups.get(tensor_id, {}))
        group_lists[tensor_id] = [groups[tensor_id][box] for box in boxes] if boxes else []
        if not boxes or tensor_id not in source_tensors:
            continue
        found = _native(
            reshard_match, boxes, [(t.global_offset, t.local_shape) for t in tensor_targets], tensor.itemsize
        )
        for t, hits in zip(tensor_targets, found):
            matches[t.placement_fragment_id] = hits

    operations: list[LogicalTransferOperation] = []
    lowered = 0
    for target in targets:
        tensor = target_tensors[target.tensor_id]
        source_tensor = source_tensors.get(target.tensor_id)
        if source_tensor is None:
            raise ValueError(f"missing source tensor: {target.tensor_id}")
        _validate_tensor_compatibility(source_tensor, tensor)
        chosen = []
        for index, offset, shape, region in matches.get(target.placement_fragment_id, ()):
            source = chooser.pick(group_lists[target.tensor_id][index], target)
            if source is None:
                continue
            if len(operations) + len(chosen) + 1 > limits.max_transfer_regions:
                raise ValueError(
                    f"logical transfer plan exceeds max_transfer_regions: {limits.max_transfer_regions}"
                )
            chosen.append((tuple(offset), tuple(shape), source, region))
        chosen.sort(key=lambda c: (c[0], c[1], c[2].fragment_id))
        if not boxes_exactly_cover(target.global_offset, target.local_shape, [(o, s) for o, s, _, _ in chosen]):
            raise ValueError(f"target fragment is not fully covered: {target.fragment_id}")
        for offset, shape, source, region in chosen:
            base_s, base_t, inner, counts, s_strides, t_strides = region
            op = geometry._transfer_region(
                tensor, source, target, offset, shape,
                (base_s, base_t, inner, tuple(counts), tuple(s_strides), tuple(t_strides)),
            )
            if op.segment_count > limits.max_segments_per_region:
                raise ValueError(
                    "logical transfer region exceeds max_segments_per_region: "
                    f"{op.segment_count} > {limits.max_segments_per_region}"
                )
            if lowered + op.segment_count > limits.max_total_lowered_segments:
                raise ValueError(
                    "logical transfer plan exceeds max_total_lowered_segments: "
                    f"{lowered + op.segment_count} > {limits.max_total_lowered_segments}"
                )
            lowered += op.segment_count
            operations.append(op)
    operations.sort(
        key=lambda op: (op.target.fragment_id, op.target_base_offset, op.source.fragment_id, op.source_base_offset)
    )
    return _PlannedTransfer(resource_id, revision, tuple(operations), limits)


def _logical_transfer_plan(
    transfer: _PlannedTransfer,
    *,
    source_tensors: dict[TensorId, TensorDescriptor],
    target_tensors: dict[TensorId, TensorDescriptor],
    source_placement: Optional[WeightPlacementManifest],
    source_manifest: Optional[WeightManifest],
    target_placement: WeightPlacementManifest,
    source_participant_ids: Optional[frozenset[ParticipantId]] = None,
    target_participant_ids: Optional[frozenset[ParticipantId]] = None,
) -> LogicalTransferPlan:
    ops = transfer.operations
    return LogicalTransferPlan(
        resource_id=transfer.resource_id,
        revision=transfer.revision,
        source_placement=source_placement,
        target_placement=target_placement,
        source_tensors=tuple(sorted(source_tensors.values(), key=lambda t: t.tensor_id)),
        target_tensors=tuple(sorted(target_tensors.values(), key=lambda t: t.tensor_id)),
        operations=ops,
        source_manifest=source_manifest,
        planning_limits=transfer.planning_limits,
        source_executors=(
            _executor_plans(source_placement, ops, "source", source_participant_ids)
            if source_placement is not None
            else ()
        ),
        target_executors=_executor_plans(target_placement, ops, "target", target_participant_ids),
    )


