"""The public planning API."""

from ._planner.api import (
    plan_placement_transfer,
    plan_placement_transfer_to_local_target,
    plan_stored_transfer_to_target_placement,
)
from ._planner.contracts import (
    LogicalTransferOperation,
    LogicalTransferPlan,
    PipelineRouteGroup,
    PlacementExecutorPlan,
    PlanningLimits,
    TransferRegion,
)

__all__ = [
    "LogicalTransferPlan",
    "LogicalTransferOperation",
    "PlanningLimits",
    "PipelineRouteGroup",
    "PlacementExecutorPlan",
    "TransferRegion",
    "plan_placement_transfer",
    "plan_placement_transfer_to_local_target",
    "plan_stored_transfer_to_target_placement",
]
