"""DataProto refs and their JSON transport handles.

A DataProto ref names a batch whose fields live in structured objects in the
store: each *stage* (the rollout, the reward model, ...) wrote one bundle,
found through its manifest key, and each field is a member of one stage's
bundle, in its ``batch`` (tensors) or ``non_tensor_batch`` section. The ref
holds no bytes, so it can be handed to another process as a JSON document
(:func:`export_dataproto_ref`) and read back there
(:func:`import_dataproto_ref`); that document is what schedulers and the
:class:`~mooncake.dataproto_catalog.DataProtoCatalog` pass around.

Handle layout (version 1; version 2 adds a required ``storage_group_id``,
which version 1 may carry too)::

    {"type": "mooncake_dataproto_ref", "version": 1, "kind": "bundle_stages",
     "batch_size": N, "namespace": str, "partition": str,
     "global_indexes": [int, ...] | null,
     "stage_refs": {stage: {"manifest_key": str}},
     "field_index": {field: {"stage": stage, "member": str,
                             "section": "batch" | "non_tensor_batch"}},
     "meta_info": {...}, "encoded_non_tensor": {...}}

Unknown top-level entries are ignored on import, so older readers accept
newer handles. A malformed handle raises ``ValueError`` naming what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

__all__ = [
    "DATAPROTO_REF_HANDLE_TYPE",
    "DATAPROTO_REF_HANDLE_VERSION",
    "MooncakeDataProtoRef",
    "RemoteBundleRef",
    "StructuredFieldLocation",
    "export_dataproto_ref",
    "export_ref",
    "import_dataproto_ref",
    "import_ref",
    "is_dataproto_ref_handle",
]

DATAPROTO_REF_HANDLE_TYPE = "mooncake_dataproto_ref"
DATAPROTO_REF_HANDLE_VERSION = 1
_VERSIONS = (1, 2)
_KIND = "bundle_stages"
_SECTIONS = ("batch", "non_tensor_batch")
_GROUP = "storage_group_id"


@dataclass
class RemoteBundleRef:
    """A bundle of named buffers in the store, found through its manifest."""

    manifest_key: str
    manifest: dict[str, Any]


@dataclass(frozen=True)
class StructuredFieldLocation:
    """Where a field sits: which stage's bundle, which member, which section."""

    stage: str
    member: str
    section: Literal["batch", "non_tensor_batch"]


@dataclass
class MooncakeDataProtoRef:
    """A DataProto batch by reference: stages, field locations, metadata."""

    batch_size: int
    stage_refs: dict[str, RemoteBundleRef]
    field_index: dict[str, StructuredFieldLocation]
    meta_info: dict[str, Any]
    namespace: str = "default"
    partition: str = "default"
    global_indexes: Optional[list[int]] = None
    encoded_non_tensor: dict[str, Any] = field(default_factory=dict)
    _storage_group_id: Optional[str] = field(default=None, repr=False)


def is_dataproto_ref_handle(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") == DATAPROTO_REF_HANDLE_TYPE


def _json(value: Any) -> Any:
    """`value` as plain JSON types (NumPy scalars and arrays become numbers
    and lists); anything JSON cannot hold is a TypeError."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    tolist = getattr(value, "tolist", None)  # NumPy arrays and scalars
    if callable(tolist) and type(value).__module__ == "numpy":
        return _json(tolist())
    raise TypeError(
        f"DataProto ref handles hold only JSON values, got {type(value).__name__}"
    )


def export_dataproto_ref(ref: MooncakeDataProtoRef) -> dict[str, Any]:
    """The JSON transport handle of `ref`."""
    if not isinstance(ref, MooncakeDataProtoRef):
        raise TypeError(f"expected MooncakeDataProtoRef, got {type(ref).__name__}")
    handle: dict[str, Any] = {
        "type": DATAPROTO_REF_HANDLE_TYPE,
        "version": DATAPROTO_REF_HANDLE_VERSION,
        "kind": _KIND,
        "batch_size": int(ref.batch_size),
        "namespace": ref.namespace,
        "partition": ref.partition,
        "global_indexes": _json(ref.global_indexes),
        "stage_refs": {s: {"manifest_key": r.manifest_key} for s, r in ref.stage_refs.items()},
        "field_index": {
            name: {"stage": loc.stage, "member": loc.member, "section": loc.section}
            for name, loc in ref.field_index.items()
        },
        "meta_info": _json(ref.meta_info),
        "encoded_non_tensor": _json(ref.encoded_non_tensor),
    }
    if ref._storage_group_id is not None:
        handle[_GROUP] = ref._storage_group_id
    json.dumps(handle, ensure_ascii=False)  # proves it serializes
    return handle


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"DataProto ref handle {what} must be a mapping")
    return value


def _name(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def import_dataproto_ref(handle: Mapping[str, Any]) -> MooncakeDataProtoRef:
    """The ref a transport handle describes (no store access)."""
    if not is_dataproto_ref_handle(handle):
        raise ValueError("not a Mooncake DataProto ref handle")
    raw_version = handle.get("version", -1)
    try:
        version = int(raw_version)
    except (TypeError, ValueError):
        version = -1
    if version not in _VERSIONS:
        raise ValueError(f"unsupported DataProto ref handle version: {raw_version!r}")
    if handle.get("kind") != _KIND:
        raise ValueError(f"unsupported DataProto ref handle kind: {handle.get('kind')!r}")

    stages: dict[str, RemoteBundleRef] = {}
    for stage, raw in _mapping(handle.get("stage_refs"), "stage_refs").items():
        key = _mapping(raw, f"stage_refs[{stage!r}]").get("manifest_key")
        if not (_name(stage) and _name(key)):
            raise ValueError(
                "DataProto ref handle stages need non-empty string names and manifest_key values"
            )
        stages[stage] = RemoteBundleRef(manifest_key=key, manifest={})

    fields: dict[str, StructuredFieldLocation] = {}
    for name, raw in _mapping(handle.get("field_index"), "field_index").items():
        loc = _mapping(raw, f"field_index[{name!r}]")
        section, stage, member = loc.get("section"), loc.get("stage"), loc.get("member")
        if section not in _SECTIONS:
            raise ValueError(f"invalid DataProto field section: {section!r}")
        if not (_name(name) and _name(stage) and _name(member)):
            raise ValueError("DataProto ref handle field locations must be non-empty strings")
        if stage not in stages:
            raise ValueError(f"DataProto ref handle field {name!r} names unknown stage {stage!r}")
        fields[name] = StructuredFieldLocation(stage=stage, member=member, section=section)

    group = handle.get(_GROUP)
    if (version == 2 and group is None) or (group is not None and not _name(group)):
        raise ValueError("DataProto ref handle has an invalid storage_group_id")

    indexes = handle.get("global_indexes")
    if indexes is not None:
        if not isinstance(indexes, list) or any(
            isinstance(i, bool) or not isinstance(i, int) for i in indexes
        ):
            raise ValueError("DataProto ref handle global_indexes must be a list of integers or null")
        indexes = list(indexes)

    try:
        batch_size = int(handle["batch_size"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("DataProto ref handle needs an integer batch_size") from None
    return MooncakeDataProtoRef(
        batch_size=batch_size,
        stage_refs=stages,
        field_index=fields,
        meta_info=dict(_mapping(handle.get("meta_info", {}), "meta_info")),
        namespace=str(handle.get("namespace", "default")),
        partition=str(handle.get("partition", "default")),
        global_indexes=indexes,
        encoded_non_tensor=dict(
            _mapping(handle.get("encoded_non_tensor", {}), "encoded_non_tensor")
        ),
        _storage_group_id=group,
    )


export_ref = export_dataproto_ref
import_ref = import_dataproto_ref
