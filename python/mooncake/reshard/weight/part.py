"""One participant's address-free share of a placement."""

from __future__ import annotations

from dataclasses import dataclass

from ..contracts import ParticipantId, PlacementSetId, ResourceId, RevisionId, TopologyId
from .types import (
    ParallelRank,
    PlacementFragment,
    TensorDescriptor,
    _require_nonempty_string,
    _require_u64,
    require_manifest_items,
)
from .validation import _validate_fragments


@dataclass(frozen=True)
class WeightPlacementPart:
    """The tensors and fragments one participant holds; a collection barrier
    assembles the parts into a :class:`WeightPlacementManifest`."""

    resource_id: ResourceId
    revision: RevisionId
    weight_generation: int
    placement_set_id: PlacementSetId
    topology_id: TopologyId
    participant_id: ParticipantId
    rank: ParallelRank
    tensors: tuple[TensorDescriptor, ...]
    fragments: tuple[PlacementFragment, ...]

    def __post_init__(self) -> None:
        for name in ("resource_id", "revision", "placement_set_id", "topology_id", "participant_id"):
            _require_nonempty_string(getattr(self, name), name)
        _require_u64(self.weight_generation, "weight_generation")
        if not isinstance(self.rank, ParallelRank):
            raise ValueError("placement part rank must be a ParallelRank")
        tensors = require_manifest_items(self.tensors, "WeightPlacementPart tensors", TensorDescriptor)
        fragments = require_manifest_items(
            self.fragments, "WeightPlacementPart fragments", PlacementFragment
        )
        if any(f.rank != self.rank for f in fragments):
            raise ValueError("placement part fragment rank differs from part rank")
        unused = sorted({t.tensor_id for t in tensors} - {f.tensor_id for f in fragments})
        if unused:
            raise ValueError(f"placement part contains an unreferenced tensor: {unused[0]}")
        object.__setattr__(self, "tensors", tuple(sorted(tensors, key=lambda t: t.tensor_id)))
        object.__setattr__(
            self, "fragments", tuple(sorted(fragments, key=lambda f: f.placement_fragment_id))
        )
        _validate_fragments(self.tensors, self.fragments)


__all__ = ["WeightPlacementPart"]
