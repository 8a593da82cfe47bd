"""The planning entry points."""

from __future__ import annotations

from typing import Optional

from ...contracts import ParticipantId
from ..manifest import WeightPlacementManifest
from ..storage_manifest import WeightManifest
from .contracts import LogicalTransferPlan, PlanningLimits
from .core import _collect_placements, _logical_transfer_plan, _plan_transfer


def _same_generation(source: object, target: WeightPlacementManifest) -> None:
    for name in ("resource_id", "revision", "weight_generation"):
        if getattr(source, name) != getattr(target, name):
            raise ValueError(f"source and target {name} differ")


def plan_placement_transfer(
    source_placement: WeightPlacementManifest,
    target_placement: WeightPlacementManifest,
    *,
    planning_limits: Optional[PlanningLimits] = None,
) -> LogicalTransferPlan:
    """The plan that fills every target fragment from a complete source
    placement of the same weight generation."""

    source_tensors, source_fragments = _collect_placements((source_placement,), "source")
    target_tensors, target_fragments = _collect_placements((target_placement,), "target")
    _same_generation(source_placement, target_placement)
    transfer = _plan_transfer(
        source_placement.resource_id,
        source_placement.revision,
        source_tensors,
        source_fragments,
        target_tensors,
        target_fragments,
        planning_limits=planning_limits,
    )
    return _logical_transfer_plan(
        transfer,
        source_tensors=source_tensors,
        target_tensors=target_tensors,
        source_placement=source_placement,
        source_manifest=None,
        target_placement=target_placement,
    )


def plan_placement_transfer_to_local_target(
    source_placement: WeightPlacementManifest,
    target_placement: WeightPlacementManifest,
    target_participant_id: Optional[ParticipantId] = None,
    *,
    planning_limits: Optional[PlanningLimits] = None,
) -> LogicalTransferPlan:
    """The plan for one target participant (the only one when omitted)."""

    source_tensors, source_fragments = _collect_placements((source_placement,), "source")
    if target_participant_id is None:
        if target_placement.topology.world_size != 1:
            raise ValueError("target_participant_id is required for a multi-participant target")
        target_participant_id = target_placement.parts[0].participant_id
    part = next((p for p in target_placement.parts if p.participant_id == target_participant_id), None)
    if part is None:
        raise ValueError(f"unknown target participant: {target_participant_id}")
    target_tensors = {t.tensor_id: t for t in part.tensors}
    _same_generation(source_placement, target_placement)
    transfer = _plan_transfer(
        source_placement.resource_id,
        source_placement.revision,
        source_tensors,
        source_fragments,
        target_tensors,
        list(part.fragments),
        local_target=True,
        planning_limits=planning_limits,
    )
    plan = _logical_transfer_plan(
        transfer,
        source_tensors=source_tensors,
        target_tensors=target_tensors,
        source_placement=source_placement,
        source_manifest=None,
        target_placement=target_placement,
        target_participant_ids=frozenset({target_participant_id}),
    )
    if len(plan.target_executors) != 1:
        raise ValueError("local target placement must describe exactly one executor")
    return plan


def plan_stored_transfer_to_target_placement(
    source_manifest: WeightManifest,
    target_placement: WeightPlacementManifest,
    *,
    planning_limits: Optional[PlanningLimits] = None,
) -> LogicalTransferPlan:
    """The plan that fills a target placement from a committed Store manifest."""

    target_tensors, target_fragments = _collect_placements((target_placement,), "target")
    _same_generation(source_manifest, target_placement)
    source_tensors = {t.tensor_id: t for t in source_manifest.tensors}
    transfer = _plan_transfer(
        source_manifest.resource_id,
        source_manifest.revision,
        source_tensors,
        source_manifest.fragments,
        target_tensors,
        target_fragments,
        planning_limits=planning_limits,
    )
    return _logical_transfer_plan(
        transfer,
        source_tensors=source_tensors,
        target_tensors=target_tensors,
        source_placement=None,
        source_manifest=source_manifest,
        target_placement=target_placement,
    )


__all__ = [
    "plan_placement_transfer",
    "plan_placement_transfer_to_local_target",
    "plan_stored_transfer_to_target_placement",
]
