"""Resource-neutral manifest protocols: what any reusable resource (model
weights now, KV cache later) exposes for identity and lifetime fencing."""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from .ids import LeaseId, PlacementId, ResourceId, RuntimeInstanceId


class ResourceKind(str, Enum):
    """Which kind of resource a manifest describes."""

    MODEL_WEIGHT = "model_weight"
    KV_CACHE = "kv_cache"


class ResourceManifest(Protocol):
    @property
    def resource_id(self) -> ResourceId: ...

    @property
    def resource_kind(self) -> ResourceKind: ...


class PlacementManifest(ResourceManifest, Protocol):
    """An address-free logical layout of a resource."""

    @property
    def placement_id(self) -> PlacementId: ...

    @property
    def digest(self) -> str: ...


class RuntimeBindingManifest(ResourceManifest, Protocol):
    """Where a placement lives in one runtime, fenced by generation and lease."""

    @property
    def placement_id(self) -> PlacementId: ...

    @property
    def placement_digest(self) -> str: ...

    @property
    def instance_id(self) -> RuntimeInstanceId: ...

    @property
    def generation(self) -> int: ...

    @property
    def lease_id(self) -> LeaseId: ...


class StoredResourceManifest(ResourceManifest, Protocol):
    """Metadata of a resource persisted in the Store."""

    namespace: str
    group_id: str
    manifest_key: str
    created_at: str


def validate_resource_binding_identity(
    placement: PlacementManifest,
    binding: RuntimeBindingManifest,
) -> None:
    """Refuse a binding that attests another placement than ``placement``."""

    checks = (
        (placement.resource_kind, binding.resource_kind,
         "placement and runtime binding resource_kind differ"),
        (placement.resource_id, binding.resource_id,
         "placement and runtime binding resource_id differ"),
        (placement.placement_id, binding.placement_id,
         "placement_id and runtime binding placement_id differ"),
        (placement.digest, binding.placement_digest,
         "placement digest and runtime binding placement digest differ"),
    )
    for ours, theirs, message in checks:
        if ours != theirs:
            raise ValueError(message)
