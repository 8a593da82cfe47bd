"""The logical plan: transfer regions, executors, routes and limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from types import MappingProxyType
from typing import ClassVar, Generic, Iterable, Mapping, Optional, Sequence, TypeVar

from ...._mooncake import reshard_segments
from ..._typing import TypeAlias
from ...contracts import ParticipantId, PlacementFragmentId, PlacementId, ResourceId, RevisionId, TensorId
from ...geometry import box_contains
from ..manifest import ParallelRank, PlacementFragment, TensorDescriptor, WeightPlacementManifest
from ..storage_manifest import (
    StoredFragment,
    StoredManifestIdentity,
    WeightManifest,
    validate_weight_manifest_snapshot,
)
from .fragments import GeometryFragment, LogicalSourceFragment, LogicalTargetFragment
from .geometry import _derive_region_geometry, _fragment_itemsize, _validate_outer_strides

RuntimeTensorOwner = tuple[tuple[str, int], ...]
_S = TypeVar("_S", bound=GeometryFragment)
_T = TypeVar("_T", bound=GeometryFragment)


def _nonneg_or_none(value: object) -> bool:
    return value is None or (type(value) is int and value >= 0)


@dataclass(frozen=True)
class PipelineRouteGroup:
    """The operations that move weights from one source pipeline stage to
    one target stage."""

    source_pp: Optional[int]
    source_pipeline_stage_id: Optional[int]
    target_pp: int
    target_pipeline_stage_id: Optional[int]
    operation_indices: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "operation_indices", tuple(self.operation_indices))
        if not _nonneg_or_none(self.source_pp):
            raise ValueError("pipeline route source_pp must be non-negative")
        if type(self.target_pp) is not int or self.target_pp < 0:
            raise ValueError("pipeline route target_pp must be non-negative")
        for name in ("source_pipeline_stage_id", "target_pipeline_stage_id"):
            if not _nonneg_or_none(getattr(self, name)):
                raise ValueError(f"pipeline route {name} must be non-negative")
        if any(type(i) is not int or i < 0 for i in self.operation_indices):
            raise ValueError("pipeline route indices must be non-negative integers")
        if len(set(self.operation_indices)) != len(self.operation_indices):
            raise ValueError("pipeline route has duplicate operation indices")


@dataclass(frozen=True)
class PlanningLimits:
    """Bounds that make planning and lowering fail instead of growing without
    limit: regions per plan, runs per region, runs per plan."""

    max_transfer_regions: int = 1_000_000
    max_segments_per_region: int = 1_000_000
    max_total_lowered_segments: int = 10_000_000

    def __post_init__(self) -> None:
        for name in ("max_transfer_regions", "max_segments_per_region", "max_total_lowered_segments"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"planning limit {name} must be a positive integer")


def _int_tuple(value: object, name: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes, bytearray)):
        raise ValueError(f"transfer region {name} must contain integers")
    try:
        items = tuple(value)  # type: ignore[call-overload]
    except TypeError as error:
        raise ValueError(f"transfer region {name} must contain integers") from error
    if any(type(item) is not int for item in items):
        raise ValueError(f"transfer region {name} must contain integers")
    return items


@dataclass(frozen=True)
class TransferRegion(Generic[_S, _T]):
    """One overlap box of a tensor moving from ``source`` to ``target``:
    ``inner_bytes`` contiguous bytes at each base offset, repeated over
    ``outer_loop_counts`` with each side's byte strides. Construction
    re-derives the geometry and refuses anything but the canonical one."""

    tensor_id: TensorId
    source: _S
    target: _T
    overlap_offset: tuple[int, ...]
    overlap_shape: tuple[int, ...]
    source_base_offset: int
    target_base_offset: int
    inner_bytes: int
    outer_loop_counts: tuple[int, ...]
    source_strides: tuple[int, ...]
    target_strides: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("overlap_offset", "overlap_shape", "outer_loop_counts", "source_strides", "target_strides"):
            object.__setattr__(self, name, _int_tuple(getattr(self, name), name))
        if not self.tensor_id:
            raise ValueError("transfer region tensor_id must not be empty")
        if self.source.tensor_id != self.tensor_id or self.target.tensor_id != self.tensor_id:
            raise ValueError("transfer region tensor mismatch")
        rank = len(self.overlap_offset)
        if rank == 0 or {len(self.overlap_shape), len(self.source.global_offset), len(self.target.global_offset)} != {rank}:
            raise ValueError("transfer region logical rank mismatch")
        if min(self.overlap_offset) < 0 or min(self.overlap_shape) <= 0:
            raise ValueError("transfer region logical box is invalid")
        for side in ("source", "target"):
            fragment = getattr(self, side)
            if not box_contains(fragment.global_offset, fragment.local_shape, self.overlap_offset, self.overlap_shape):
                raise ValueError(f"transfer region exceeds {side} logical fragment")
        for name in ("source_base_offset", "target_base_offset", "inner_bytes"):
            if type(getattr(self, name)) is not int:
                raise ValueError(f"transfer region {name} must be an integer")
        if self.source_base_offset < 0 or self.target_base_offset < 0:
            raise ValueError("transfer region base offsets must be non-negative")
        if self.inner_bytes <= 0:
            raise ValueError("transfer region inner_bytes must be positive")
        if not len(self.outer_loop_counts) == len(self.source_strides) == len(self.target_strides):
            raise ValueError("transfer region outer loop rank mismatch")
        if any(c <= 0 for c in self.outer_loop_counts):
            raise ValueError("transfer region outer loop counts must be positive")
        if any(s < 0 for s in self.source_strides + self.target_strides):
            raise ValueError("transfer region strides must be non-negative")
        itemsize = _fragment_itemsize(self.source)
        if _fragment_itemsize(self.target) != itemsize:
            raise ValueError("transfer region source and target itemsize differ")
        base_s, base_t, inner, counts, s_strides, t_strides = _derive_region_geometry(
            self.source, self.target, self.overlap_offset, self.overlap_shape
        )
        if self.total_bytes != prod(self.overlap_shape) * itemsize:
            raise ValueError("transfer region loop geometry does not match overlap")
        if self.source_base_offset != base_s:
            raise ValueError("transfer region source base offset is inconsistent")
        if self.target_base_offset != base_t:
            raise ValueError("transfer region target base offset is inconsistent")
        if (self.inner_bytes, self.outer_loop_counts, self.source_strides, self.target_strides) != (
            inner, counts, s_strides, t_strides,
        ):
            raise ValueError("transfer region loop geometry is not canonical")
        _validate_outer_strides(self.outer_loop_counts, self.source_strides, self.inner_bytes, "source")
        _validate_outer_strides(self.outer_loop_counts, self.target_strides, self.inner_bytes, "target")
        self.validate_bounds()

    @property
    def segment_count(self) -> int:
        return prod(self.outer_loop_counts)

    @property
    def total_bytes(self) -> int:
        return self.inner_bytes * self.segment_count

    # The one-loop view older callers use.
    @property
    def source_offset(self) -> int:
        return self.source_base_offset

    @property
    def target_offset(self) -> int:
        return self.target_base_offset

    @property
    def nbytes(self) -> int:
        return self.inner_bytes

    @property
    def repeat(self) -> int:
        return self.segment_count

    def _single_stride(self, strides: tuple[int, ...], side: str) -> int:
        if len(strides) > 1:
            raise ValueError(f"N-D transfer region has multiple {side} strides")
        return strides[0] if strides else 0

    @property
    def source_stride(self) -> int:
        return self._single_stride(self.source_strides, "source")

    @property
    def target_stride(self) -> int:
        return self._single_stride(self.target_strides, "target")

    def _end(self, base: int, strides: tuple[int, ...]) -> int:
        return base + self.inner_bytes + sum((c - 1) * s for c, s in zip(self.outer_loop_counts, strides))

    def validate_bounds(self) -> None:
        if self._end(self.source_base_offset, self.source_strides) > self.source.nbytes:
            raise ValueError("transfer region exceeds source fragment")
        if self._end(self.target_base_offset, self.target_strides) > self.target.nbytes:
            raise ValueError("transfer region exceeds target fragment")

    @property
    def _native(self) -> tuple[int, int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        return (
            self.source_base_offset,
            self.target_base_offset,
            self.inner_bytes,
            self.outer_loop_counts,
            self.source_strides,
            self.target_strides,
        )

    def iter_segments(self, *, max_segments: int) -> Iterable[tuple[int, int, int]]:
        """The contiguous runs as (source offset, target offset, bytes)."""

        if type(max_segments) is not int or max_segments <= 0:
            raise ValueError("max_segments must be a positive integer")
        if self.segment_count > max_segments:
            raise ValueError(f"transfer region exceeds max_segments: {self.segment_count} > {max_segments}")
        return iter(reshard_segments(self._native, min(max_segments, (1 << 64) - 1)))


LogicalTransferRegion: TypeAlias = TransferRegion[LogicalSourceFragment, LogicalTargetFragment]
LogicalTransferOperation: TypeAlias = LogicalTransferRegion


@dataclass(frozen=True)
class PlacementExecutorPlan:
    """One participant that runs its side of the plan, and its fragments."""

    placement_id: PlacementId
    participant_id: ParticipantId
    rank: ParallelRank
    placement_fragment_ids: tuple[PlacementFragmentId, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "placement_fragment_ids", tuple(self.placement_fragment_ids))
        if not self.placement_id or not self.participant_id or not self.placement_fragment_ids:
            raise ValueError("placement executor identifiers must not be empty")
        if len(set(self.placement_fragment_ids)) != len(self.placement_fragment_ids):
            raise ValueError("placement executor has duplicate fragment IDs")


ExecutorKey: TypeAlias = tuple[PlacementId, ParticipantId, ParallelRank, tuple[PlacementFragmentId, ...]]


def _executor_key(e: PlacementExecutorPlan) -> ExecutorKey:
    return (e.placement_id, e.participant_id, e.rank, e.placement_fragment_ids)


@dataclass(frozen=True)
class _OperationViews:
    source_indices: Mapping[ExecutorKey, tuple[int, ...]]
    target_indices: Mapping[ExecutorKey, tuple[int, ...]]
    pipeline_routes: tuple[PipelineRouteGroup, ...]


def _indices_by_executor(
    operations: Sequence[LogicalTransferOperation],
    executors: Sequence[PlacementExecutorPlan],
    side: str,
) -> Mapping[ExecutorKey, tuple[int, ...]]:
    found: dict[ExecutorKey, list[int]] = {}
    by_fragment: dict[PlacementFragmentId, list[ExecutorKey]] = {}
    for e in executors:
        key = _executor_key(e)
        if key in found:
            raise ValueError("transfer plan has duplicate executor projection key")
        found[key] = []
        for fid in e.placement_fragment_ids:
            by_fragment.setdefault(fid, []).append(key)
    for index, op in enumerate(operations):
        fragment = getattr(op, side)
        if isinstance(fragment, PlacementFragment):
            for key in by_fragment.get(fragment.placement_fragment_id, ()):
                found[key].append(index)
    return MappingProxyType({k: tuple(v) for k, v in found.items()})


def _pipeline_routes(operations: Sequence[LogicalTransferOperation]) -> tuple[PipelineRouteGroup, ...]:
    routes: dict[tuple[Optional[int], Optional[int], int, Optional[int]], list[int]] = {}
    for index, op in enumerate(operations):
        placed = isinstance(op.source, PlacementFragment)
        key = (
            op.source.rank.pp if placed else None,  # type: ignore[union-attr]
            op.source.pipeline_stage_id if placed else None,  # type: ignore[union-attr]
            op.target.rank.pp,
            op.target.pipeline_stage_id,
        )
        routes.setdefault(key, []).append(index)

    def order(key: tuple[Optional[int], Optional[int], int, Optional[int]]) -> tuple[int, ...]:
        return tuple(-1 if v is None else v for v in key)

    return tuple(
        PipelineRouteGroup(
            source_pp=key[0],
            source_pipeline_stage_id=key[1],
            target_pp=key[2],
            target_pipeline_stage_id=key[3],
            operation_indices=tuple(indices),
        )
        for key, indices in sorted(routes.items(), key=lambda item: order(item[0]))
    )


def _canonical_tensor_catalog(tensors: Sequence[TensorDescriptor]) -> tuple[TensorDescriptor, ...]:
    return tuple(sorted(tensors, key=lambda t: t.tensor_id))


@dataclass(frozen=True)
class LogicalTransferPlan:
    """An address-free reshard plan: the regions that fill every selected
    target fragment exactly once, from one source (a placement or a stored
    manifest), with per-executor projections and pipeline routes."""

    _operation_views: ClassVar[_OperationViews]

    resource_id: ResourceId
    revision: RevisionId
    source_placement: Optional[WeightPlacementManifest]
    target_placement: WeightPlacementManifest
    source_tensors: tuple[TensorDescriptor, ...]
    target_tensors: tuple[TensorDescriptor, ...]
    operations: tuple[LogicalTransferOperation, ...]
    source_manifest: Optional[WeightManifest] = None
    planning_limits: PlanningLimits = field(default_factory=PlanningLimits)
    source_executors: tuple[PlacementExecutorPlan, ...] = ()
    target_executors: tuple[PlacementExecutorPlan, ...] = ()
    source_manifest_identity: Optional[StoredManifestIdentity] = field(init=False)

    def __post_init__(self) -> None:
        for name in ("source_tensors", "target_tensors", "operations", "source_executors", "target_executors"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.resource_id or not self.revision:
            raise ValueError("logical transfer plan identifiers must not be empty")
        if not isinstance(self.target_placement, WeightPlacementManifest):
            raise ValueError("logical transfer plan target placement is invalid")
        if not isinstance(self.planning_limits, PlanningLimits):
            raise ValueError("logical transfer plan planning_limits is invalid")
        limits = self.planning_limits
        if len(self.operations) > limits.max_transfer_regions:
            raise ValueError("logical transfer plan exceeds max_transfer_regions")
        if self.source_placement is not None and not isinstance(self.source_placement, WeightPlacementManifest):
            raise ValueError("logical transfer plan source placement is invalid")
        if self.source_manifest is not None and not isinstance(self.source_manifest, WeightManifest):
            raise ValueError("logical transfer plan source manifest is invalid")
        if (self.source_placement is None) == (self.source_manifest is None):
            raise ValueError("logical transfer plan requires exactly one source provenance")
        identity = None
        if self.source_manifest is not None:
            manifest = validate_weight_manifest_snapshot(self.source_manifest)
            object.__setattr__(self, "source_manifest", manifest)
            identity = manifest.manifest_identity
        object.__setattr__(self, "source_manifest_identity", identity)
        for side, placement in (("source", self.source_placement), ("target", self.target_placement)):
            if placement is not None and (placement.resource_id, placement.revision) != (self.resource_id, self.revision):
                raise ValueError(f"logical transfer plan {side} placement identity differs")
        generation = self.target_placement.weight_generation
        if self.source_placement is not None and self.source_placement.weight_generation != generation:
            raise ValueError("logical transfer plan source and target weight_generation differs")
        if self.source_manifest is not None and (
            self.source_manifest.resource_id,
            self.source_manifest.revision,
            self.source_manifest.weight_generation,
        ) != (self.resource_id, self.revision, generation):
            raise ValueError("logical transfer plan source manifest identity differs")
        from_placement = self.source_placement is not None
        lowered = 0
        for op in self.operations:
            if not isinstance(op, TransferRegion):
                raise ValueError("logical transfer plan requires a canonical transfer operation")
            if not isinstance(op.target, PlacementFragment):
                raise ValueError("logical transfer plan target must be a placement")
            if from_placement and not isinstance(op.source, PlacementFragment):
                raise ValueError("logical transfer plan source must be a placement")
            if not from_placement and not isinstance(op.source, StoredFragment):
                raise ValueError("logical transfer plan source has no placement")
            op.validate_bounds()
            if op.segment_count > limits.max_segments_per_region:
                raise ValueError("logical transfer plan exceeds max_segments_per_region")
            lowered += op.segment_count
            if lowered > limits.max_total_lowered_segments:
                raise ValueError("logical transfer plan exceeds max_total_lowered_segments")
        if not all(isinstance(e, PlacementExecutorPlan) for e in self.source_executors + self.target_executors):
            raise ValueError("logical transfer plan has invalid canonical executor metadata")
        self.validate_source_manifest_snapshot()
        object.__setattr__(
            self,
            "_operation_views",
            _OperationViews(
                source_indices=_indices_by_executor(self.operations, self.source_executors, "source"),
                target_indices=_indices_by_executor(self.operations, self.target_executors, "target"),
                pipeline_routes=_pipeline_routes(self.operations),
            ),
        )
        from .validation import _validate_logical_target_coverage

        _validate_logical_target_coverage(self)
        self.validate_source_placement_snapshot()

    @property
    def total_bytes(self) -> int:
        return sum(op.total_bytes for op in self.operations)

    @property
    def source_placement_id(self) -> Optional[PlacementId]:
        return None if self.source_placement is None else self.source_placement.placement_id

    @property
    def target_placement_id(self) -> PlacementId:
        return self.target_placement.placement_id

    def validate_source_manifest_snapshot(self) -> None:
        """Refuse a stored source that no longer matches what was planned."""

        if self.source_manifest is None:
            if self.source_manifest_identity is not None:
                raise ValueError("logical plan has unexpected source manifest identity")
            return
        manifest = validate_weight_manifest_snapshot(self.source_manifest)
        if self.source_manifest_identity != manifest.manifest_identity:
            raise ValueError("logical plan source manifest identity differs")
        if self.source_tensors != _canonical_tensor_catalog(manifest.tensors):
            raise ValueError("logical plan source tensor catalog differs")
        stored = {f.fragment_id: f for f in manifest.fragments}
        for op in self.operations:
            if not isinstance(op.source, StoredFragment) or stored.get(op.source.fragment_id) != op.source:
                raise ValueError("logical plan and source manifest fragment snapshots differ")

    def validate_source_placement_snapshot(self) -> None:
        """Refuse executor projections that contradict the source placement."""

        if self.source_placement is None:
            return
        from .validation import _validate_logical_source_placement

        _validate_logical_source_placement(self)

    @property
    def pipeline_routes(self) -> tuple[PipelineRouteGroup, ...]:
        return self._operation_views.pipeline_routes

    def operation_indices_for_executor(self, executor: PlacementExecutorPlan, side: str) -> tuple[int, ...]:
        if side not in ("source", "target"):
            raise ValueError(f"invalid executor side: {side}")
        executors = self.source_executors if side == "source" else self.target_executors
        if executor not in executors:
            raise ValueError(f"{side} executor is not part of this logical plan")
        views = self._operation_views
        table = views.source_indices if side == "source" else views.target_indices
        return table.get(_executor_key(executor), ())

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_operation_views"}

    def __setstate__(self, state: dict[str, object]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        self.__post_init__()


__all__ = [
    "LogicalTransferPlan",
    "PlanningLimits",
    "PipelineRouteGroup",
    "PlacementExecutorPlan",
    "RuntimeTensorOwner",
    "LogicalTransferOperation",
    "LogicalTransferRegion",
    "TransferRegion",
]
