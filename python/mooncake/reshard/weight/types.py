"""Model-weight tensor descriptors, parallel axes and logical fragments."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from math import prod
from typing import Literal, Optional, TypeVar, Union

from ..contracts import PlacementFragmentId, TensorId
from ..contracts import RuntimeBindingFragment as RuntimeBindingFragment  # noqa: F401 (re-exported)
from ..contracts.fragments import row_major_strides

_U64_MAX = (1 << 64) - 1
ParallelAxisKind = Literal["dp", "pp", "ep", "tp"]
SplitAxisKind = Literal["ep", "tp"]
# Canonical order of a tensor's axes (outermost first).
_AXIS_ORDER: dict[str, int] = {"dp": 0, "pp": 1, "ep": 2, "tp": 3}
_T = TypeVar("_T")


def _require_nonempty_string(value: object, name: str) -> str:
    if type(value) is not str or not value:
        raise ValueError(f"{name} must be a non-empty string")
    return value


def _require_integer(value: object, name: str, *, minimum: Optional[int] = None) -> int:
    if type(value) is not int:
        raise ValueError(f"{name} must be an integer")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}")
    return value


def _require_u64(value: object, name: str, *, minimum: int = 0) -> int:
    number = _require_integer(value, name, minimum=minimum)
    if number > _U64_MAX:
        raise ValueError(f"{name} must fit in an unsigned 64-bit integer")
    return number


def _require_sequence(value: object, name: str) -> Sequence[object]:
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Sequence):
        raise ValueError(f"{name} must be a sequence")
    return value


def _require_integer_tuple(value: object, name: str, *, minimum: int) -> tuple[int, ...]:
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Sequence):
        raise ValueError(f"{name} must contain integers")
    return tuple(_require_integer(item, name, minimum=minimum) for item in value)


def require_manifest_items(value: object, name: str, item_type: type[_T]) -> tuple[_T, ...]:
    items = tuple(_require_sequence(value, name))
    if not all(isinstance(item, item_type) for item in items):
        raise ValueError(f"{name} must contain {item_type.__name__}")
    return items  # type: ignore[return-value]


def require_sha256_digest(value: object, name: str) -> None:
    digest = _require_nonempty_string(value, name)
    if len(digest) != 64 or not set(digest) <= set("0123456789abcdef"):
        raise ValueError(f"{name} must be a lowercase SHA-256 digest")


def canonical_strides_bytes(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Byte strides of a C-contiguous view of ``shape``."""

    return row_major_strides(tuple(shape), itemsize)


def canonical_digest(content: object) -> str:
    """SHA-256 of the compact, key-sorted JSON form: the identity of every
    canonical record in this package."""

    encoded = json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()


def _check_axis_kind(kind: object) -> None:
    _require_nonempty_string(kind, "parallel axis kind")
    if kind not in _AXIS_ORDER:
        raise ValueError(f"unsupported parallel axis kind: {kind}")


@dataclass(frozen=True)
class ParallelRank:
    """A participant's coordinates on the four parallel axes; used for
    routing only (the boxes define the sharding)."""

    dp: int = 0
    tp: int = 0
    pp: int = 0
    ep: int = 0

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "ep"):
            _require_integer(getattr(self, name), f"parallel rank {name}", minimum=0)


@dataclass(frozen=True)
class SplitAxis:
    """The ranks of ``kind`` partition the tensor along ``dim``."""

    kind: SplitAxisKind
    dim: int

    def __post_init__(self) -> None:
        _check_axis_kind(self.kind)
        if self.kind not in ("ep", "tp"):
            raise ValueError(f"{self.kind} cannot use split semantics")
        _require_integer(self.dim, "split axis dim", minimum=0)
        if self.kind == "ep" and self.dim != 0:
            raise ValueError("EP must split the leading logical expert dimension")


@dataclass(frozen=True)
class ReplicatedAxis:
    """Every rank of ``kind`` holds a complete copy."""

    kind: ParallelAxisKind

    def __post_init__(self) -> None:
        _check_axis_kind(self.kind)


@dataclass(frozen=True)
class OwnershipAxis:
    """Only the ranks of ``kind`` that declare fragments hold the tensor."""

    kind: ParallelAxisKind

    def __post_init__(self) -> None:
        _check_axis_kind(self.kind)


ParallelAxis = Union[SplitAxis, ReplicatedAxis, OwnershipAxis]


@dataclass(frozen=True)
class TensorDescriptor:
    """One logical tensor: identity, global shape, dtype and how the
    parallel axes shard it."""

    tensor_id: TensorId
    global_shape: tuple[int, ...]
    dtype: str
    itemsize: int
    shard_dims: tuple[int, ...]
    layout_fingerprint: str
    parallel_axes: tuple[ParallelAxis, ...]
    layer_id: Optional[int] = None
    expert_id: Optional[int] = None

    def __post_init__(self) -> None:
        shape = _require_integer_tuple(self.global_shape, "global_shape", minimum=1)
        if not shape:
            raise ValueError("global_shape must not be empty")
        object.__setattr__(self, "global_shape", shape)
        _require_nonempty_string(self.tensor_id, "tensor_id")
        _require_nonempty_string(self.dtype, "dtype")
        _require_integer(self.itemsize, "itemsize", minimum=1)
        dims = _require_integer_tuple(self.shard_dims, "shard_dims", minimum=0)
        if len(set(dims)) != len(dims):
            raise ValueError("shard_dims must not contain duplicates")
        if list(dims) != sorted(dims):
            raise ValueError("shard_dims must be sorted")
        if any(dim >= len(shape) for dim in dims):
            raise ValueError("shard_dims contains an out-of-range dimension")
        object.__setattr__(self, "shard_dims", dims)
        raw = _require_sequence(self.parallel_axes, "TensorDescriptor parallel_axes")
        if not all(isinstance(a, (SplitAxis, ReplicatedAxis, OwnershipAxis)) for a in raw):
            raise ValueError("TensorDescriptor parallel_axes must contain explicit axis values")
        axes = tuple(sorted(raw, key=lambda a: _AXIS_ORDER[a.kind]))  # type: ignore[union-attr]
        kinds = [a.kind for a in axes]
        if len(set(kinds)) != len(kinds):
            raise ValueError("parallel_axes must not contain duplicate kinds")
        split_dims = [a.dim for a in axes if isinstance(a, SplitAxis)]
        if len(set(split_dims)) != len(split_dims):
            raise ValueError("split axes must not share a dimension")
        if any(dim >= len(shape) for dim in split_dims):
            raise ValueError("split axis dimension is out of range")
        if tuple(sorted(split_dims)) != dims:
            raise ValueError("parallel axis split dimensions conflict with shard_dims")
        object.__setattr__(self, "parallel_axes", axes)
        for name in ("layer_id", "expert_id"):
            if getattr(self, name) is not None:
                _require_integer(getattr(self, name), name, minimum=0)
        if self.expert_id is not None and any(
            isinstance(a, SplitAxis) and a.kind == "ep" for a in axes
        ):
            raise ValueError("an individually allocated expert requires explicit EP ownership")
        _require_nonempty_string(self.layout_fingerprint, "layout_fingerprint")


def validate_fragment_geometry(
    tensor: TensorDescriptor,
    *,
    fragment_id: str,
    global_offset: tuple[int, ...],
    local_shape: tuple[int, ...],
    nbytes: int,
) -> None:
    """A fragment's box must have the tensor's rank, lie inside it, and
    ``nbytes`` must be its cells times the item size."""

    rank = len(tensor.global_shape)
    if len(global_offset) != rank or len(local_shape) != rank:
        raise ValueError(f"fragment rank mismatch: {fragment_id}")
    if any(o + e > total for o, e, total in zip(global_offset, local_shape, tensor.global_shape)):
        raise ValueError(f"fragment is out of bounds: {fragment_id}")
    expected = prod(local_shape) * tensor.itemsize
    if nbytes != expected:
        raise ValueError(
            f"fragment byte size mismatch: {fragment_id}: expected {expected}, got {nbytes}"
        )


def _normalize_aliases(value: object) -> tuple[TensorId, ...]:
    aliases = tuple(_require_sequence(value, "aliases"))
    if any(type(a) is not str or not a for a in aliases):
        raise ValueError("aliases must contain non-empty strings")
    if len(set(aliases)) != len(aliases):
        raise ValueError("aliases must not contain duplicates")
    return tuple(sorted(aliases))  # type: ignore[arg-type]


def _fragment_content(
    tensor_id: str,
    global_offset: tuple[int, ...],
    local_shape: tuple[int, ...],
    nbytes: int,
    rank: ParallelRank,
    pipeline_stage_id: Optional[int],
    aliases: tuple[str, ...],
) -> dict[str, object]:
    content: dict[str, object] = {
        "tensor_id": tensor_id,
        "global_offset": global_offset,
        "local_shape": local_shape,
        "nbytes": nbytes,
        "rank": asdict(rank),
        "aliases": aliases,
    }
    # Absent, not null, when unset: placements made before virtual stages
    # keep their identities.
    if pipeline_stage_id is not None:
        content["pipeline_stage_id"] = pipeline_stage_id
    return content


@dataclass(frozen=True, init=False)
class PlacementFragment:
    """An address-free box of one tensor held by one parallel rank."""

    tensor_id: TensorId
    global_offset: tuple[int, ...]
    local_shape: tuple[int, ...]
    nbytes: int
    rank: ParallelRank
    pipeline_stage_id: Optional[int]
    aliases: tuple[TensorId, ...]
    placement_fragment_id: PlacementFragmentId

    def __init__(
        self,
        tensor_id: TensorId,
        global_offset: tuple[int, ...],
        local_shape: tuple[int, ...],
        nbytes: int,
        rank: ParallelRank,
        pipeline_stage_id: Optional[int] = None,
        aliases: tuple[TensorId, ...] = (),
        placement_fragment_id: Optional[PlacementFragmentId] = None,
    ) -> None:
        offset = _require_integer_tuple(global_offset, "global_offset", minimum=0)
        shape = _require_integer_tuple(local_shape, "local_shape", minimum=1)
        _require_nonempty_string(tensor_id, "tensor_id")
        _require_u64(nbytes, "nbytes", minimum=1)
        if not isinstance(rank, ParallelRank):
            raise ValueError("rank must be a ParallelRank")
        if pipeline_stage_id is not None:
            _require_integer(pipeline_stage_id, "pipeline_stage_id", minimum=0)
        group = _normalize_aliases(aliases)
        if group:
            if len(group) < 2:
                raise ValueError("alias group must contain at least two tensor IDs")
            if tensor_id not in group:
                raise ValueError("alias group must contain the fragment tensor_id")
        if placement_fragment_id is None:
            content = _fragment_content(
                tensor_id, offset, shape, nbytes, rank, pipeline_stage_id, group
            )
            content["schema"] = "weight-placement-fragment"
            placement_fragment_id = PlacementFragmentId(f"sha256:{canonical_digest(content)}")
        else:
            _require_nonempty_string(placement_fragment_id, "placement_fragment_id")
        for name, value in (
            ("tensor_id", tensor_id),
            ("global_offset", offset),
            ("local_shape", shape),
            ("nbytes", nbytes),
            ("rank", rank),
            ("pipeline_stage_id", pipeline_stage_id),
            ("aliases", group),
            ("placement_fragment_id", placement_fragment_id),
        ):
            object.__setattr__(self, name, value)

    @property
    def fragment_id(self) -> PlacementFragmentId:
        return self.placement_fragment_id


# Names other modules of the package import.
_canonical_strides_bytes = canonical_strides_bytes
_require_manifest_items = require_manifest_items
_require_sha256_digest = require_sha256_digest
