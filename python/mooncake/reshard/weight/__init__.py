"""Model-weight resharding: manifests and the address-free planner.

Framework adapters describe each participant's tensors and fragments
(``WeightPlacementPart``), a barrier assembles a ``WeightPlacementManifest``,
and ``plan_placement_transfer(source, target)`` returns the strided byte
copies (``TransferRegion``) that move a generation from one layout (say the
trainer's TP 2) to another (the rollout's TP 4);
``mooncake.reshard.weight.execute.execute_plan``
runs a plan between host buffers.
"""

from .manifest import (
    OwnershipAxis,
    ParallelRank,
    ParallelTopology,
    PlacementFragment,
    ReplicatedAxis,
    RuntimeBindingFragment,
    SplitAxis,
    TensorDescriptor,
    TopologyParticipant,
    WeightPlacementManifest,
    WeightPlacementPart,
    WeightRuntimeBindingManifest,
    validate_runtime_binding,
    validate_runtime_bindings,
)
from .planner import (
    LogicalTransferOperation,
    LogicalTransferPlan,
    PipelineRouteGroup,
    PlacementExecutorPlan,
    PlanningLimits,
    TransferRegion,
    plan_placement_transfer,
    plan_placement_transfer_to_local_target,
    plan_stored_transfer_to_target_placement,
)
from .serde import weight_placement_from_json, weight_placement_to_json
from .storage_manifest import StoredFragment, WeightManifest

__all__ = [
    "ParallelRank",
    "ParallelTopology",
    "PlacementFragment",
    "WeightPlacementManifest",
    "WeightPlacementPart",
    "RuntimeBindingFragment",
    "WeightRuntimeBindingManifest",
    "SplitAxis",
    "ReplicatedAxis",
    "OwnershipAxis",
    "TensorDescriptor",
    "TopologyParticipant",
    "validate_runtime_binding",
    "validate_runtime_bindings",
    "weight_placement_from_json",
    "weight_placement_to_json",
    "StoredFragment",
    "WeightManifest",
    "LogicalTransferPlan",
    "LogicalTransferOperation",
    "PipelineRouteGroup",
    "PlacementExecutorPlan",
    "PlanningLimits",
    "TransferRegion",
    "plan_placement_transfer",
    "plan_placement_transfer_to_local_target",
    "plan_stored_transfer_to_target_placement",
]
