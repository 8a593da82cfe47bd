"""Builders of weight placements for the mooncake.reshard tests: model-like
tensor sets laid out by TP (split on a chosen dimension), DP (replicas), EP
(experts) and PP (layers by stage)."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Optional, Sequence

from mooncake.reshard.weight import (
    OwnershipAxis,
    ParallelRank,
    ParallelTopology,
    PlacementFragment,
    ReplicatedAxis,
    SplitAxis,
    TensorDescriptor,
    TopologyParticipant,
    WeightPlacementManifest,
)

RESOURCE = "demo-model"
REVISION = "step-7"
GENERATION = 3


@dataclass(frozen=True)
class Spec:
    """One tensor: shape, the TP split dimension (None: whole on every TP
    rank), and in PP layouts the stage that owns it (None: stage 0)."""

    name: str
    shape: tuple[int, ...]
    tp_dim: Optional[int] = 0
    stage: Optional[int] = None
    itemsize: int = 2


def descriptor(spec: Spec, *, dp: int, pp: int, fingerprint: str = "row-major") -> TensorDescriptor:
    axes: list[object] = []
    axes.append(SplitAxis(kind="tp", dim=spec.tp_dim) if spec.tp_dim is not None else ReplicatedAxis(kind="tp"))
    if dp > 1:
        axes.append(ReplicatedAxis(kind="dp"))
    if pp > 1:
        axes.append(OwnershipAxis(kind="pp"))
    return TensorDescriptor(
        tensor_id=spec.name,
        global_shape=spec.shape,
        dtype="float16" if spec.itemsize == 2 else f"u{spec.itemsize}",
        itemsize=spec.itemsize,
        shard_dims=() if spec.tp_dim is None else (spec.tp_dim,),
        layout_fingerprint=fingerprint,
        parallel_axes=tuple(axes),
    )


def participant_id(prefix: str, rank: ParallelRank) -> str:
    return f"{prefix}-d{rank.dp}-p{rank.pp}-t{rank.tp}-e{rank.ep}"


def topology(prefix: str, *, tp: int, dp: int = 1, pp: int = 1) -> ParallelTopology:
    ranks = [ParallelRank(dp=d, pp=p, tp=t) for d in range(dp) for p in range(pp) for t in range(tp)]
    return ParallelTopology(
        tp_size=tp,
        pp_size=pp,
        ep_size=1,
        dp_size=dp,
        participants=tuple(TopologyParticipant(participant_id(prefix, r), r) for r in ranks),
    )


def placement(
    specs: Sequence[Spec],
    *,
    tp: int,
    dp: int = 1,
    pp: int = 1,
    prefix: str = "worker",
    set_id: Optional[str] = None,
    generation: int = GENERATION,
    fingerprint: str = "row-major",
) -> WeightPlacementManifest:
    """Each tensor split evenly on its TP dimension (or whole on every TP
    rank), copied on every DP rank, held by its stage's PP rank."""

    topo = topology(prefix, tp=tp, dp=dp, pp=pp)
    tensors = [descriptor(s, dp=dp, pp=pp, fingerprint=fingerprint) for s in specs]
    fragments = []
    for spec in specs:
        stages = [spec.stage or 0] if pp > 1 else [0]
        for d in range(dp):
            for p in stages:
                for t in range(tp):
                    offset = [0] * len(spec.shape)
                    shape = list(spec.shape)
                    if spec.tp_dim is not None:
                        step = spec.shape[spec.tp_dim] // tp
                        offset[spec.tp_dim] = t * step
                        shape[spec.tp_dim] = step
                    fragments.append(
                        PlacementFragment(
                            tensor_id=spec.name,
                            global_offset=tuple(offset),
                            local_shape=tuple(shape),
                            nbytes=prod(shape) * spec.itemsize,
                            rank=ParallelRank(dp=d, pp=p, tp=t),
                        )
                    )
    return WeightPlacementManifest.from_fragments(
        resource_id=RESOURCE,
        revision=REVISION,
        weight_generation=generation,
        placement_set_id=set_id or f"{prefix}-tp{tp}-dp{dp}-pp{pp}",
        topology=topo,
        tensors=tuple(tensors),
        fragments=tuple(fragments),
    )


def global_bytes(spec: Spec, seed: int = 0) -> bytes:
    """A deterministic pattern for a whole tensor, distinct per tensor."""

    n = prod(spec.shape) * spec.itemsize
    base = sum(spec.name.encode()) + seed
    return bytes((base + i * 7 + i // 251) % 256 for i in range(n))


def fragment_bytes(spec: Spec, whole: bytes, fragment: PlacementFragment) -> bytes:
    """The C-contiguous bytes of ``fragment``'s box cut out of ``whole``."""

    shape = spec.shape
    item = spec.itemsize
    strides = [item] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    out = bytearray()

    def walk(dim: int, at: int) -> None:
        lo = fragment.global_offset[dim]
        if dim == len(shape) - 1:
            start = at + lo * item
            out.extend(whole[start : start + fragment.local_shape[dim] * item])
            return
        for i in range(lo, lo + fragment.local_shape[dim]):
            walk(dim + 1, at + i * strides[dim])

    walk(0, 0)
    return bytes(out)
