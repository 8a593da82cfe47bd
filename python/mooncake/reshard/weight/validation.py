"""Checks across fragments: geometry, alias groups, per-axis coverage, and
runtime address ranges."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import product

from ..contracts import RuntimeBindingFragment, RuntimeInstanceId, TensorId
from ..geometry import boxes_exactly_cover, boxes_overlap
from .topology import ParallelTopology
from .types import (
    OwnershipAxis,
    ParallelRank,
    PlacementFragment,
    ReplicatedAxis,
    SplitAxis,
    TensorDescriptor,
    validate_fragment_geometry,
)

Coordinates = tuple[tuple[str, int], ...]


def _coords(rank: ParallelRank, kinds: Sequence[str]) -> Coordinates:
    return tuple((kind, getattr(rank, kind)) for kind in kinds)


def _at(rank: ParallelRank, coordinates: Coordinates) -> bool:
    return all(getattr(rank, kind) == value for kind, value in coordinates)


def _kinds(tensor: TensorDescriptor, axis_type: type) -> tuple[str, ...]:
    return tuple(a.kind for a in tensor.parallel_axes if isinstance(a, axis_type))


def _validate_fragments(
    tensors: Sequence[TensorDescriptor],
    fragments: Sequence[PlacementFragment],
    *,
    require_complete_alias_groups: bool = False,
) -> None:
    by_id: dict[TensorId, TensorDescriptor] = {}
    for tensor in tensors:
        if tensor.tensor_id in by_id:
            raise ValueError(f"duplicate tensor_id: {tensor.tensor_id}")
        by_id[tensor.tensor_id] = tensor
    seen_ids: set[str] = set()
    seen_boxes: set[tuple[object, ...]] = set()
    for fragment in fragments:
        if fragment.fragment_id in seen_ids:
            raise ValueError(f"duplicate fragment_id: {fragment.fragment_id}")
        seen_ids.add(fragment.fragment_id)
        key = (fragment.tensor_id, fragment.rank, fragment.global_offset, fragment.local_shape)
        if key in seen_boxes:
            raise ValueError(
                f"duplicate logical fragment for tensor and parallel rank: {fragment.fragment_id}"
            )
        seen_boxes.add(key)
        tensor = by_id.get(fragment.tensor_id)
        if tensor is None:
            raise ValueError(f"unknown tensor_id: {fragment.tensor_id}")
        validate_fragment_geometry(
            tensor,
            fragment_id=fragment.fragment_id,
            global_offset=fragment.global_offset,
            local_shape=fragment.local_shape,
            nbytes=fragment.nbytes,
        )
    if require_complete_alias_groups:
        _validate_alias_groups(by_id, fragments)
    groups: dict[tuple[str, ParallelRank], list[PlacementFragment]] = {}
    for fragment in fragments:
        groups.setdefault((fragment.tensor_id, fragment.rank), []).append(fragment)
    for group in groups.values():
        if len(group) > 1 and boxes_overlap([(f.global_offset, f.local_shape) for f in group]):
            raise ValueError("logical fragment boxes overlap for tensor and parallel rank")


def _validate_alias_groups(
    tensors: Mapping[TensorId, TensorDescriptor],
    fragments: Sequence[PlacementFragment],
) -> None:
    """Only the whole placement sees every tensor: every member of an alias
    group must exist and every fragment of every member must declare the
    same group."""

    declared: dict[TensorId, set[tuple[TensorId, ...]]] = {}
    for fragment in fragments:
        declared.setdefault(fragment.tensor_id, set()).add(fragment.aliases)
    for group in sorted({f.aliases for f in fragments if f.aliases}):
        unknown = sorted(set(group) - set(tensors))
        if unknown:
            raise ValueError(f"alias group references unknown tensor: {unknown[0]}")
        for member in group:
            if declared.get(member, set()) != {group}:
                raise ValueError(
                    f"alias group is not declared consistently for tensor: {member}"
                )


def _validate_complete_weight_placement(
    tensors: Sequence[TensorDescriptor],
    fragments: Sequence[PlacementFragment],
    *,
    topology: ParallelTopology,
) -> None:
    if not tensors:
        raise ValueError("global weight placement must contain tensors")
    if not fragments:
        raise ValueError("global weight placement must contain fragments")
    by_tensor: dict[TensorId, list[PlacementFragment]] = {}
    for fragment in fragments:
        by_tensor.setdefault(fragment.tensor_id, []).append(fragment)
    for tensor in tensors:
        own = by_tensor.get(tensor.tensor_id)
        if not own:
            raise ValueError(f"global placement tensor is not fully covered: {tensor.tensor_id}")
        _validate_tensor_axes(tensor, own, topology)


def _validate_tensor_axes(
    tensor: TensorDescriptor,
    fragments: Sequence[PlacementFragment],
    topology: ParallelTopology,
) -> None:
    """Each declared owner holds, on every replica the topology gives it, a
    complete tiling whose split ranks own their declared dimensions."""

    _validate_undeclared_axes(tensor, fragments, topology)
    owner_kinds = _kinds(tensor, OwnershipAxis)
    replica_kinds = _kinds(tensor, ReplicatedAxis)
    for owner in sorted({_coords(f.rank, owner_kinds) for f in fragments}):
        held = [f for f in fragments if _coords(f.rank, owner_kinds) == owner]
        expected = {
            _coords(p.rank, replica_kinds) for p in topology.participants if _at(p.rank, owner)
        }
        if {_coords(f.rank, replica_kinds) for f in held} != expected:
            raise ValueError(
                "global placement tensor is not fully covered: missing or unexpected "
                f"replicated-axis participant for {tensor.tensor_id}"
            )
        for replica in sorted(expected):
            tiling = [f for f in held if _coords(f.rank, replica_kinds) == replica]
            if not boxes_exactly_cover(
                (0,) * len(tensor.global_shape),
                tensor.global_shape,
                [(f.global_offset, f.local_shape) for f in tiling],
            ):
                raise ValueError(
                    f"global placement tensor is not fully covered: {tensor.tensor_id}"
                )
            _validate_split_participants(tensor, tiling, topology, owner + replica)
            _validate_split_geometry(tensor, tiling)


def _validate_undeclared_axes(
    tensor: TensorDescriptor,
    fragments: Sequence[PlacementFragment],
    topology: ParallelTopology,
) -> None:
    """An active axis the tensor does not declare may only vary in lockstep
    with a declared one (TP and EP mapped onto the same workers); DP and PP
    must always be declared."""

    declared = tuple(a.kind for a in tensor.parallel_axes)
    varying = tuple(k for k in declared if len({getattr(f.rank, k) for f in fragments}) > 1)
    for kind in ("dp", "pp", "ep", "tp"):
        if kind in declared or getattr(topology, f"{kind}_size") == 1:
            continue
        values = {getattr(f.rank, kind) for f in fragments}
        if kind in ("dp", "pp") or len(values) <= 1:
            raise ValueError(
                "global placement tensor requires explicit parallel semantics "
                f"for active undeclared {kind} axis: {tensor.tensor_id}"
            )
        if not varying:
            raise ValueError(
                f"global placement tensor varies across undeclared {kind} axis: {tensor.tensor_id}"
            )
        seen: dict[Coordinates, int] = {}
        for f in fragments:
            if seen.setdefault(_coords(f.rank, varying), getattr(f.rank, kind)) != getattr(
                f.rank, kind
            ):
                raise ValueError(
                    "global placement tensor varies independently across undeclared "
                    f"{kind} axis: {tensor.tensor_id}"
                )


def _merged(intervals: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for begin, end in sorted(set(intervals)):
        if out and begin <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((begin, end))
    return out


def _validate_split_geometry(tensor: TensorDescriptor, fragments: Sequence[PlacementFragment]) -> None:
    """Split ranks must form a Cartesian grid, and on each split dimension
    the ranks' merged intervals must tile it in order."""

    axes = [a for a in tensor.parallel_axes if isinstance(a, SplitAxis)]
    if not axes:
        return
    values = [sorted({getattr(f.rank, a.kind) for f in fragments}) for a in axes]
    seen = {tuple(getattr(f.rank, a.kind) for a in axes) for f in fragments}
    if seen != set(product(*values)):
        raise ValueError(
            "non-Cartesian split-axis participant mapping cannot prove "
            f"rank-to-dimension ownership: {tensor.tensor_id}"
        )
    for axis in axes:
        by_rank: dict[int, list[tuple[int, int]]] = {}
        for f in fragments:
            begin = f.global_offset[axis.dim]
            by_rank.setdefault(getattr(f.rank, axis.kind), []).append(
                (begin, begin + f.local_shape[axis.dim])
            )
        owned = sorted((b, e, r) for r, spans in by_rank.items() for b, e in _merged(spans))
        cursor = 0
        for begin, end, _ in owned:
            if begin != cursor:
                break
            cursor = end
        else:
            if cursor == tensor.global_shape[axis.dim]:
                continue
        raise ValueError(
            "split-axis rank geometry conflicts with declared dimension: "
            f"{tensor.tensor_id}: {axis.kind} -> dim {axis.dim}"
        )


def _validate_split_participants(
    tensor: TensorDescriptor,
    fragments: Sequence[PlacementFragment],
    topology: ParallelTopology,
    fixed: Coordinates,
) -> None:
    kinds = _kinds(tensor, SplitAxis)
    if not kinds:
        return
    expected = {_coords(p.rank, kinds) for p in topology.participants if _at(p.rank, fixed)}
    actual = {_coords(f.rank, kinds) for f in fragments}
    full_ranges = all(
        {dict(c)[kind] for c in expected} == set(range(getattr(topology, f"{kind}_size")))
        for kind in kinds
    )
    if not full_ranges or actual != expected:
        raise ValueError(
            "global placement tensor is not fully covered: missing or unexpected "
            f"split-axis participant for {tensor.tensor_id}"
        )


def _alias_key(tensor: TensorDescriptor) -> tuple[object, ...]:
    return (
        tensor.global_shape,
        tensor.dtype,
        tensor.itemsize,
        tensor.shard_dims,
        tensor.parallel_axes,
        tensor.layer_id,
        tensor.expert_id,
        tensor.layout_fingerprint,
    )


def _declared_alias(
    left: tuple[PlacementFragment, RuntimeBindingFragment],
    right: tuple[PlacementFragment, RuntimeBindingFragment],
    tensors: Mapping[TensorId, TensorDescriptor],
) -> bool:
    """Two bindings may share bytes only as members of one declared alias
    group with the same box and descriptor."""

    (lp, lb), (rp, rb) = left, right
    return (
        lb.address == rb.address
        and lb.nbytes == rb.nbytes
        and len(lp.aliases) >= 2
        and lp.aliases == rp.aliases
        and lp.tensor_id in lp.aliases
        and rp.tensor_id in lp.aliases
        and lp.global_offset == rp.global_offset
        and lp.local_shape == rp.local_shape
        and _alias_key(tensors[lp.tensor_id]) == _alias_key(tensors[rp.tensor_id])
    )


def _validate_runtime_binding_address_ranges(
    *,
    instance_id: RuntimeInstanceId,
    tensors: Sequence[TensorDescriptor],
    placements: Sequence[PlacementFragment],
    bindings: Sequence[RuntimeBindingFragment],
) -> None:
    by_tensor = {t.tensor_id: t for t in tensors}
    placement_of = {p.placement_fragment_id: p for p in placements}
    spaces: dict[tuple[str, str, str], list[tuple[PlacementFragment, RuntimeBindingFragment]]] = {}
    for b in bindings:
        spaces.setdefault((instance_id, b.worker_id, b.device), []).append(
            (placement_of[b.placement_fragment_id], b)
        )
    for space, pairs in spaces.items():
        open_views: list[tuple[PlacementFragment, RuntimeBindingFragment]] = []
        for pair in sorted(pairs, key=lambda item: item[1].address):
            start = pair[1].address
            open_views = [o for o in open_views if o[1].address + o[1].nbytes > start]
            for other in open_views:
                if not _declared_alias(other, pair, by_tensor):
                    raise ValueError(
                        "runtime binding address ranges overlap: "
                        f"{other[1].fragment_id} and {pair[1].fragment_id} in {space}"
                    )
            open_views.append(pair)
        open_allocations: list[RuntimeBindingFragment] = []
        for b in sorted((b for _, b in pairs), key=lambda b: b.storage_address):
            open_allocations = [
                o for o in open_allocations if o.storage_address + o.storage_nbytes > b.storage_address
            ]
            for other in open_allocations:
                # Views into one allocation name it identically.
                if (other.storage_address, other.storage_nbytes) != (
                    b.storage_address,
                    b.storage_nbytes,
                ):
                    raise ValueError(
                        "runtime binding storage allocation ranges overlap: "
                        f"{other.fragment_id} and {b.fragment_id} in {space}"
                    )
            open_allocations.append(b)
