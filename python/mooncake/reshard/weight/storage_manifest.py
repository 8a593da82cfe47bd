"""A weight generation committed to the Store: tensors, and where each
fragment's bytes sit in which payload object."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Optional, Union

from ..contracts import ResourceId, ResourceKind, RevisionId, StoredFragmentId, TensorId
from ..geometry import boxes_exactly_cover
from .serde import _axis_from_wire, _axis_to_wire
from .types import (
    TensorDescriptor,
    _normalize_aliases,
    _require_integer,
    _require_integer_tuple,
    _require_manifest_items,
    _require_nonempty_string,
    _require_sequence,
    _require_u64,
    validate_fragment_geometry,
)

_MANIFEST_FIELDS = frozenset({
    "resource_kind", "namespace", "resource_id", "revision", "weight_generation",
    "group_id", "manifest_key", "tensors", "fragments", "created_at",
})
_TENSOR_FIELDS = frozenset({
    "tensor_id", "global_shape", "dtype", "itemsize", "layer_id", "expert_id",
    "layout_fingerprint", "shard_dims", "parallel_axes",
})
_FRAGMENT_FIELDS = frozenset({
    "fragment_id", "tensor_id", "global_offset", "local_shape", "object_key",
    "object_offset", "nbytes", "aliases",
})
_HEX = set("0123456789abcdef")


@dataclass(frozen=True)
class StoredManifestIdentity:
    """A manifest's Store location plus the digest of its content."""

    namespace: str
    resource_id: ResourceId
    revision: RevisionId
    weight_generation: int
    group_id: str
    manifest_key: str
    content_sha256: str

    def __post_init__(self) -> None:
        for name in ("namespace", "resource_id", "revision", "group_id", "manifest_key", "content_sha256"):
            _require_nonempty_string(getattr(self, name), name)
        _require_u64(self.weight_generation, "weight_generation")
        if len(self.content_sha256) != 64 or not set(self.content_sha256) <= _HEX:
            raise ValueError("content_sha256 must be a SHA-256 hex digest")


@dataclass(frozen=True)
class StoredFragment:
    """A tensor box stored as ``nbytes`` at ``object_offset`` of one object."""

    fragment_id: StoredFragmentId
    tensor_id: TensorId
    global_offset: tuple[int, ...]
    local_shape: tuple[int, ...]
    object_key: str
    object_offset: int
    nbytes: int
    aliases: tuple[TensorId, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "global_offset", _require_integer_tuple(self.global_offset, "global_offset", minimum=0)
        )
        object.__setattr__(
            self, "local_shape", _require_integer_tuple(self.local_shape, "local_shape", minimum=1)
        )
        for name in ("fragment_id", "tensor_id", "object_key"):
            _require_nonempty_string(getattr(self, name), name)
        _require_integer(self.object_offset, "object_offset", minimum=0)
        _require_integer(self.nbytes, "nbytes", minimum=1)
        group = _normalize_aliases(self.aliases)
        object.__setattr__(self, "aliases", group)
        if group:
            if len(group) < 2:
                raise ValueError("alias group must contain at least two tensor IDs")
            if self.tensor_id not in group:
                raise ValueError("alias group must contain the fragment tensor_id")


def _alias_key(t: TensorDescriptor) -> tuple[object, ...]:
    return (t.global_shape, t.dtype, t.itemsize, t.shard_dims, t.parallel_axes,
            t.layer_id, t.expert_id, t.layout_fingerprint)


def _check_fragments(tensors: Sequence[TensorDescriptor], fragments: Sequence[StoredFragment]) -> None:
    by_id: dict[str, TensorDescriptor] = {}
    for t in tensors:
        if t.tensor_id in by_id:
            raise ValueError(f"duplicate tensor_id: {t.tensor_id}")
        by_id[t.tensor_id] = t
    seen: set[str] = set()
    for f in fragments:
        if f.fragment_id in seen:
            raise ValueError(f"duplicate fragment_id: {f.fragment_id}")
        seen.add(f.fragment_id)
        tensor = by_id.get(f.tensor_id)
        if tensor is None:
            raise ValueError(f"unknown tensor_id: {f.tensor_id}")
        validate_fragment_geometry(
            tensor,
            fragment_id=f.fragment_id,
            global_offset=f.global_offset,
            local_shape=f.local_shape,
            nbytes=f.nbytes,
        )


def _check_aliases(tensors: Sequence[TensorDescriptor], fragments: Sequence[StoredFragment]) -> None:
    """Fragments of an alias group with one geometry must name every member,
    and the members must be the same tensor in all but name."""

    by_id = {t.tensor_id: t for t in tensors}
    groups: dict[tuple[object, ...], set[str]] = {}
    for f in fragments:
        if not f.aliases:
            continue
        unknown = sorted(set(f.aliases) - set(by_id))
        if unknown:
            raise ValueError(f"stored alias references unknown tensor: {unknown[0]}")
        key = (f.aliases, f.global_offset, f.local_shape, f.nbytes)
        groups.setdefault(key, set()).add(f.tensor_id)
    for key, members in groups.items():
        if members != set(key[0]):  # type: ignore[arg-type]
            raise ValueError("stored alias group is incomplete for fragment geometry")
        if len({_alias_key(by_id[m]) for m in members}) != 1:
            raise ValueError("stored alias tensor descriptors differ")


def _check_coverage(tensors: Sequence[TensorDescriptor], fragments: Sequence[StoredFragment]) -> None:
    seen: set[tuple[object, ...]] = set()
    by_tensor: dict[str, list[StoredFragment]] = {}
    for f in fragments:
        key = (f.tensor_id, f.global_offset, f.local_shape)
        if key in seen:
            raise ValueError(f"duplicate fragment geometry: {f.tensor_id}")
        seen.add(key)
        by_tensor.setdefault(f.tensor_id, []).append(f)
    for t in tensors:
        boxes = [(f.global_offset, f.local_shape) for f in by_tensor.get(t.tensor_id, [])]
        if not boxes_exactly_cover((0,) * len(t.global_shape), t.global_shape, boxes):
            raise ValueError(f"tensor is not fully covered: {t.tensor_id}")


def _check_object_ranges(fragments: Sequence[StoredFragment]) -> None:
    by_object: dict[str, list[StoredFragment]] = {}
    for f in fragments:
        by_object.setdefault(f.object_key, []).append(f)
    for key, items in by_object.items():
        ordered = sorted(items, key=lambda f: f.object_offset)
        for before, after in zip(ordered, ordered[1:]):
            if after.object_offset < before.object_offset + before.nbytes:
                raise ValueError(
                    "stored fragment object ranges overlap: "
                    f"{before.fragment_id} and {after.fragment_id} in {key}"
                )


@dataclass(frozen=True)
class WeightManifest:
    """The committed, address-free manifest of one stored weight
    generation; ``manifest_digest`` is the SHA-256 of :meth:`to_json`."""

    namespace: str
    resource_id: ResourceId
    revision: RevisionId
    weight_generation: int
    group_id: str
    manifest_key: str
    tensors: tuple[TensorDescriptor, ...]
    fragments: tuple[StoredFragment, ...]
    created_at: str
    manifest_digest: str = field(init=False)

    @property
    def resource_kind(self) -> ResourceKind:
        return ResourceKind.MODEL_WEIGHT

    def __post_init__(self) -> None:
        for name in ("namespace", "resource_id", "revision", "group_id", "manifest_key", "created_at"):
            _require_nonempty_string(getattr(self, name), name)
        object.__setattr__(
            self, "tensors", _require_manifest_items(self.tensors, "WeightManifest tensors", TensorDescriptor)
        )
        object.__setattr__(
            self, "fragments", _require_manifest_items(self.fragments, "WeightManifest fragments", StoredFragment)
        )
        _require_u64(self.weight_generation, "weight_generation")
        if self.manifest_key != f"{self.group_id}/manifest":
            raise ValueError("manifest_key does not belong to manifest group")
        prefix = f"{self.group_id}/payload/"
        if any(not f.object_key.startswith(prefix) for f in self.fragments):
            raise ValueError("payload object_key does not belong to manifest group")
        _check_fragments(self.tensors, self.fragments)
        _check_aliases(self.tensors, self.fragments)
        _check_coverage(self.tensors, self.fragments)
        _check_object_ranges(self.fragments)
        object.__setattr__(
            self, "manifest_digest", hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()
        )

    @property
    def manifest_identity(self) -> StoredManifestIdentity:
        return StoredManifestIdentity(
            namespace=self.namespace,
            resource_id=self.resource_id,
            revision=self.revision,
            weight_generation=self.weight_generation,
            group_id=self.group_id,
            manifest_key=self.manifest_key,
            content_sha256=self.manifest_digest,
        )

    def to_json(self) -> str:
        tensors = [
            {
                "tensor_id": t.tensor_id,
                "global_shape": t.global_shape,
                "dtype": t.dtype,
                "itemsize": t.itemsize,
                "layer_id": t.layer_id,
                "expert_id": t.expert_id,
                "layout_fingerprint": t.layout_fingerprint,
                "shard_dims": t.shard_dims,
                "parallel_axes": [_axis_to_wire(a) for a in t.parallel_axes],
            }
            for t in self.tensors
        ]
        return json.dumps(
            {
                "resource_kind": self.resource_kind.value,
                "namespace": self.namespace,
                "resource_id": self.resource_id,
                "revision": self.revision,
                "weight_generation": self.weight_generation,
                "group_id": self.group_id,
                "manifest_key": self.manifest_key,
                "tensors": tensors,
                "fragments": [asdict(f) for f in self.fragments],
                "created_at": self.created_at,
            },
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, value: Union[str, bytes, bytearray]) -> WeightManifest:
        from .serde import _load_object

        return cls.from_dict(_load_object(value, "weight manifest"))

    @classmethod
    def from_dict(cls, raw: Mapping[str, object]) -> WeightManifest:
        raw = _exact(raw, _MANIFEST_FIELDS, "weight manifest")
        if raw["resource_kind"] != ResourceKind.MODEL_WEIGHT.value:
            raise ValueError("weight manifest resource_kind must be model_weight")
        tensors = []
        for index, item in enumerate(_require_sequence(raw["tensors"], "WeightManifest tensors")):
            t = _exact(item, _TENSOR_FIELDS, "tensor descriptor")
            tensors.append(
                TensorDescriptor(
                    tensor_id=_require_nonempty_string(t["tensor_id"], "stored tensor tensor_id"),
                    global_shape=_require_integer_tuple(t["global_shape"], "stored tensor global_shape", minimum=1),
                    dtype=_require_nonempty_string(t["dtype"], "stored tensor dtype"),
                    itemsize=_require_integer(t["itemsize"], "stored tensor itemsize", minimum=1),
                    layer_id=_maybe(t["layer_id"], "stored tensor layer_id"),
                    expert_id=_maybe(t["expert_id"], "stored tensor expert_id"),
                    layout_fingerprint=_require_nonempty_string(
                        t["layout_fingerprint"], "stored tensor layout_fingerprint"
                    ),
                    shard_dims=_require_integer_tuple(t["shard_dims"], "stored tensor shard_dims", minimum=0),
                    parallel_axes=tuple(
                        _axis_from_wire(a, i)
                        for i, a in enumerate(
                            _require_sequence(t["parallel_axes"], f"stored tensor parallel_axes {index}")
                        )
                    ),
                )
            )
        fragments = []
        for item in _require_sequence(raw["fragments"], "WeightManifest fragments"):
            f = _exact(item, _FRAGMENT_FIELDS, "stored fragment")
            fragments.append(
                StoredFragment(
                    fragment_id=_require_nonempty_string(f["fragment_id"], "stored fragment fragment_id"),
                    tensor_id=_require_nonempty_string(f["tensor_id"], "stored fragment tensor_id"),
                    global_offset=_require_integer_tuple(f["global_offset"], "stored fragment global_offset", minimum=0),
                    local_shape=_require_integer_tuple(f["local_shape"], "stored fragment local_shape", minimum=1),
                    object_key=_require_nonempty_string(f["object_key"], "stored fragment object_key"),
                    object_offset=_require_integer(f["object_offset"], "stored fragment object_offset", minimum=0),
                    nbytes=_require_integer(f["nbytes"], "stored fragment nbytes", minimum=1),
                    aliases=tuple(
                        _require_nonempty_string(a, "stored fragment alias")
                        for a in _require_sequence(f["aliases"], "stored fragment aliases")
                    ),
                )
            )
        return cls(
            namespace=_require_nonempty_string(raw["namespace"], "namespace"),
            resource_id=_require_nonempty_string(raw["resource_id"], "resource_id"),
            revision=_require_nonempty_string(raw["revision"], "revision"),
            weight_generation=_require_u64(raw["weight_generation"], "weight_generation"),
            group_id=_require_nonempty_string(raw["group_id"], "group_id"),
            manifest_key=_require_nonempty_string(raw["manifest_key"], "manifest_key"),
            tensors=tuple(tensors),
            fragments=tuple(fragments),
            created_at=_require_nonempty_string(raw["created_at"], "created_at"),
        )


def _exact(value: object, fields: frozenset[str], label: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping) or any(type(k) is not str for k in value):
        raise ValueError(f"{label} must be a JSON object")
    if frozenset(value) != fields:
        raise ValueError(f"{label} schema fields do not match contract")
    return value


def _maybe(value: object, label: str) -> Optional[int]:
    return None if value is None else _require_integer(value, label, minimum=0)


def validate_weight_manifest_snapshot(manifest: WeightManifest) -> WeightManifest:
    """Rebuild a manifest (re-running every check) before a plan trusts it."""

    if not isinstance(manifest, WeightManifest):
        raise ValueError("weight manifest snapshot is invalid")
    try:
        return WeightManifest(
            namespace=manifest.namespace,
            resource_id=manifest.resource_id,
            revision=manifest.revision,
            weight_generation=manifest.weight_generation,
            group_id=manifest.group_id,
            manifest_key=manifest.manifest_key,
            tensors=manifest.tensors,
            fragments=manifest.fragments,
            created_at=manifest.created_at,
        )
    except (AttributeError, TypeError) as error:
        raise ValueError("weight manifest snapshot is invalid") from error
