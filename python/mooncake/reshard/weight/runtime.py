"""Where one participant's fragments live at runtime, fenced by instance,
generation and lease."""

from __future__ import annotations

from dataclasses import dataclass

from ..contracts import (
    LeaseId,
    ParticipantId,
    PlacementId,
    ResourceId,
    ResourceKind,
    RevisionId,
    RuntimeBindingFragment,
    RuntimeInstanceId,
)
from .types import (
    _require_nonempty_string,
    _require_u64,
    require_manifest_items,
    require_sha256_digest,
)


@dataclass(frozen=True)
class WeightRuntimeBindingManifest:
    resource_id: ResourceId
    placement_id: PlacementId
    placement_digest: str
    instance_id: RuntimeInstanceId
    generation: int
    lease_id: LeaseId
    revision: RevisionId
    participant_id: ParticipantId
    fragments: tuple[RuntimeBindingFragment, ...]

    @property
    def resource_kind(self) -> ResourceKind:
        return ResourceKind.MODEL_WEIGHT

    def __post_init__(self) -> None:
        for name in ("resource_id", "placement_id", "instance_id", "lease_id", "revision", "participant_id"):
            _require_nonempty_string(getattr(self, name), name)
        require_sha256_digest(self.placement_digest, "placement_digest")
        _require_u64(self.generation, "generation")
        items = require_manifest_items(
            self.fragments, "WeightRuntimeBindingManifest fragments", RuntimeBindingFragment
        )
        items = tuple(sorted(items, key=lambda f: f.placement_fragment_id))
        object.__setattr__(self, "fragments", items)
        if len({f.placement_fragment_id for f in items}) != len(items):
            raise ValueError("duplicate placement fragment in runtime binding")
        if len({f.fragment_id for f in items}) != len(items):
            raise ValueError("duplicate runtime fragment_id in runtime binding")


__all__ = ["WeightRuntimeBindingManifest"]
