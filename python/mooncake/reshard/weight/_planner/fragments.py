"""Which fragments the logical planner reads and writes: placement boxes or
Store object ranges as sources, placement boxes as targets. Never runtime
addresses."""

from __future__ import annotations

from typing import Union

from ..._typing import TypeAlias
from ..manifest import PlacementFragment
from ..storage_manifest import StoredFragment

LogicalSourceFragment: TypeAlias = Union[PlacementFragment, StoredFragment]
LogicalTargetFragment: TypeAlias = PlacementFragment
GeometryFragment: TypeAlias = Union[PlacementFragment, StoredFragment]

__all__ = ["GeometryFragment", "LogicalSourceFragment", "LogicalTargetFragment"]
