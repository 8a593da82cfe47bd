"""Weight resharding between parallel layouts (``mooncake.reshard``).

``mooncake.reshard.contracts`` holds the resource-neutral identities and
protocols; ``mooncake.reshard.weight`` the model-weight manifests (tensor,
pipeline and expert-parallel placements, stored manifests, runtime
bindings) and the address-free planner that turns a source and a target
placement into strided byte copies. The geometry and the copies run in
Rust (``mooncake._mooncake.reshard_*``, crate ``mooncake-reshard``).
"""

from .contracts import (
    PlacementManifest,
    ResourceKind,
    ResourceManifest,
    RuntimeBindingManifest,
)

__all__ = [
    "ResourceKind",
    "ResourceManifest",
    "PlacementManifest",
    "RuntimeBindingManifest",
]
