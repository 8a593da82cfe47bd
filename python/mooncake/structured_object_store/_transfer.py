"""``MooncakeBundleTransfer``: the structured object API over one store."""

from __future__ import annotations

import uuid
from typing import Any, Literal, Mapping, Optional, Sequence

import numpy as np

from ..dataproto_ref import MooncakeDataProtoRef, RemoteBundleRef
from . import _dataproto
from ._bundle import BundleStore, normalize_key_prefix, validate_chunk_bytes, validate_policy
from ._structured import StructuredLayer
from ._transport import Transport
from ._types import (
    DEFAULT_BUNDLE_CHUNK_BYTES,
    WRAPPED_OBJECT_KEY,
    BundleTransferPolicy,
    FieldSchema,
    StructuredObjectPayload,
    StructuredObjectReadSpec,
    StructuredObjectResult,
)


def _new_group_id(config: Any) -> Optional[str]:
    """The storage group of a new batch: the one the config names, a fresh
    opaque one when it names none, None when it names "" (ungrouped)."""
    raw = getattr(config, "group_ids", None)
    if raw is None or (not isinstance(raw, str) and not _group_list(raw)):
        _group_id(config)
        return f"structured-{uuid.uuid4().hex}"
    group = _group_id(config)
    return group if group else None


def _group_list(raw: Any) -> list:
    try:
        return list(raw)
    except TypeError:
        raise ValueError("structured object store config.group_ids must contain strings") from None


def _group_id(config: Any) -> Optional[str]:
    """The one logical group id a write config names (None: ungrouped)."""
    raw = getattr(config, "group_ids", None)
    if raw is None:
        return None
    if isinstance(raw, str):
        ids = [raw]
    else:
        try:
            ids = list(raw)
        except TypeError:
            raise ValueError("structured object store config.group_ids must contain strings") from None
    if len(ids) > 1:
        raise ValueError("structured object store config.group_ids must contain exactly one "
                         "logical group id; it is expanded across internal Mooncake keys")
    if ids and not isinstance(ids[0], str):
        raise ValueError("structured object store config.group_ids must contain strings")
    return ids[0] if ids and ids[0] else None


class MooncakeBundleTransfer:
    """Stores structured objects (metadata plus named members) and DataProto
    batches in a Mooncake store, and reads them back whole or in part."""

    def __init__(self, store: Any, key_prefix: str = "bundle",
                 default_chunk_bytes: int = DEFAULT_BUNDLE_CHUNK_BYTES, buffer_pool: Any = None) -> None:
        self.store = store
        self.key_prefix = normalize_key_prefix(key_prefix)
        self.default_chunk_bytes = validate_chunk_bytes(default_chunk_bytes)
        self._transport = Transport(store, buffer_pool)
        self._bundles = BundleStore(self._transport, self.key_prefix, self.default_chunk_bytes)
        self._structured = StructuredLayer(self._bundles)
        self._bundle_store = self._bundles

    # ---- bundles and structured objects ------------------------------------

    def put_bundle(self, meta: Any, buffers: Mapping[str, Any], partition: str = "default",
                   chunk_bytes: Optional[int] = None, policy: Optional[BundleTransferPolicy] = None,
                   max_inflight_put: Optional[int] = None, config: Any = None) -> RemoteBundleRef:
        """Stores raw metadata bytes and named byte buffers as one bundle."""
        if not isinstance(buffers, Mapping):
            raise TypeError("bundle buffers must be a mapping")
        _group_id(config)
        return self._bundles.put_bundle(meta, buffers, partition, chunk_bytes,
                                        validate_policy(policy, max_inflight_put), config=config)

    def remove_bundle(self, ref: RemoteBundleRef | Mapping[str, Any]) -> None:
        """Removes every store object of a bundle (its members, metadata,
        cleanup keys and manifest)."""
        self._bundles.remove_bundle(ref)

    def put_structured_object(self, payload: StructuredObjectPayload, partition: str = "default",
                              chunk_bytes: Optional[int] = None,
                              policy: Optional[BundleTransferPolicy] = None,
                              max_inflight_put: Optional[int] = None, config: Any = None) -> RemoteBundleRef:
        if not isinstance(payload, StructuredObjectPayload):
            raise TypeError("put_structured_object needs a StructuredObjectPayload")
        if not isinstance(payload.buffers, Mapping):
            raise TypeError("structured object buffers must be a mapping")
        _group_id(config)
        return self._structured.put(payload, partition, chunk_bytes,
                                    validate_policy(policy, max_inflight_put), config=config)

    def put_object(self, obj: Any, partition: str = "default", chunk_bytes: Optional[int] = None,
                   policy: Optional[BundleTransferPolicy] = None, max_inflight_put: Optional[int] = None,
                   config: Any = None) -> RemoteBundleRef:
        """Stores a mapping of members, or one array/tensor/bytes value."""
        if isinstance(obj, Mapping):
            payload = StructuredObjectPayload(metadata={}, buffers=obj)
        else:
            payload = StructuredObjectPayload(metadata={WRAPPED_OBJECT_KEY: True}, buffers={"value": obj})
        return self.put_structured_object(payload, partition, chunk_bytes, policy, max_inflight_put, config)

    def get_object(self, ref: RemoteBundleRef | Mapping[str, Any]) -> Any:
        result = self.materialize(self.read_spec(ref))
        if result.metadata.get(WRAPPED_OBJECT_KEY):
            return result.objects["value"]
        return result.objects

    def read_spec(self, ref: RemoteBundleRef | Mapping[str, Any]) -> StructuredObjectReadSpec:
        return StructuredObjectReadSpec(ref=ref)

    def materialize(self, spec: StructuredObjectReadSpec) -> StructuredObjectResult:
        return self._structured.materialize_into(spec, None)

    def materialize_into(self, spec: StructuredObjectReadSpec,
                         destinations: Optional[Mapping[str, Any]]) -> StructuredObjectResult:
        """Like materialize, writing members into the given destinations
        (arrays, tensors, raw_destination) where there is one."""
        return self._structured.materialize_into(spec, destinations)

    @staticmethod
    def release_result(result: Any) -> None:
        """Gives back the buffer-pool leases behind a read's arrays now
        (instead of when they are collected); safe to call twice."""
        seen_owners: set[int] = set()
        seen: set[int] = set()

        def visit(value: Any) -> None:
            owner = getattr(value, "_mooncake_pool_owner", None)
            if owner is not None:
                if id(owner) not in seen_owners:
                    seen_owners.add(id(owner))
                    owner.release()
                return
            if isinstance(value, StructuredObjectResult):
                value = value.objects
            if isinstance(value, Mapping):
                items = value.values()
            elif isinstance(value, (list, tuple)):
                items = value
            elif isinstance(value, np.ndarray) and value.dtype == object:
                items = value.flat
            elif all(hasattr(value, a) for a in ("batch", "non_tensor_batch")):
                items = [value.batch, value.non_tensor_batch]
            else:
                return
            if id(value) in seen:
                return
            seen.add(id(value))
            for item in items:
                visit(item)

        visit(result)

    # ---- DataProto ---------------------------------------------------------

    def put(self, data: Any, *, type: Literal["dataproto", "dict"] = "dataproto", namespace: str = "default",
            partition: str = "default", stage: str = "default", chunk_bytes: Optional[int] = None,
            policy: Optional[BundleTransferPolicy] = None, config: Any = None,
            field_schemas: Optional[Mapping[str, FieldSchema]] = None) -> MooncakeDataProtoRef:
        """Stores a DataProto-like object (``type="dataproto"``) or a flat
        dict (``type="dict"``) as one stage."""
        if type == "dataproto":
            envelope = data
        elif type == "dict":
            envelope = _dataproto.flat_dict_to_envelope(data, field_schemas)
        else:
            raise ValueError(f"unsupported Mooncake payload type: {type!r}")
        group = _new_group_id(config)
        ref = _dataproto.put_stage(self, None, envelope, namespace=namespace, partition=partition, stage=stage,
                                   chunk_bytes=chunk_bytes, policy=validate_policy(policy, None),
                                   overwrite=False, config=config, field_schemas=field_schemas, group=group)
        ref._storage_group_id = group
        return ref

    def get(self, ref: Any, *, type: Literal["dataproto", "dict"] = "dataproto",
            fields: Optional[Sequence[str]] = None, batch_fields: Optional[Sequence[str]] = None,
            non_tensor_fields: Optional[Sequence[str]] = None, meta_info_keys: Optional[Sequence[str]] = None,
            data_cls: Any = None, destinations: Optional[Mapping[str, Any]] = None, rows: Any = None) -> Any:
        """Reads a stored batch back, selecting fields, meta_info keys and
        rows (a slice, a StructuredMemberSlice or a list of indices)."""
        if type not in ("dataproto", "dict"):
            raise ValueError(f"unsupported Mooncake payload type: {type!r}")
        result = _dataproto.get_dataproto(
            self, ref, fields=fields, batch_fields=batch_fields, non_tensor_fields=non_tensor_fields,
            meta_info_keys=meta_info_keys, data_cls=dict if type == "dict" else data_cls,
            destinations=destinations, rows=rows, flat=type == "dict")
        return _dataproto.envelope_to_flat(result) if type == "dict" else result

    def put_dataproto(self, data: Any, *, namespace: str = "default", partition: str = "default",
                      stage: str = "default", chunk_bytes: Optional[int] = None,
                      policy: Optional[BundleTransferPolicy] = None,
                      field_schemas: Optional[Mapping[str, FieldSchema]] = None,
                      config: Any = None) -> MooncakeDataProtoRef:
        return self.put(data, type="dataproto", namespace=namespace, partition=partition, stage=stage,
                        chunk_bytes=chunk_bytes, policy=policy, config=config, field_schemas=field_schemas)

    def append_dataproto_fields(self, ref: Any, data: Any, *, stage: str, overwrite: bool = False,
                                chunk_bytes: Optional[int] = None,
                                policy: Optional[BundleTransferPolicy] = None,
                                field_schemas: Optional[Mapping[str, FieldSchema]] = None,
                                config: Any = None) -> MooncakeDataProtoRef:
        """Adds a stage's fields to a stored batch without rewriting the
        others; returns the new ref (the old one stays readable until the
        same stage is written again)."""
        base = _dataproto.resolve_ref(ref)
        named = _group_id(config)
        group = base._storage_group_id
        if group is not None and named is not None and named != group:
            raise ValueError("config.group_ids conflicts with the DataProto storage group")
        if group is None:
            group = named  # a handle without a group: the caller's, if any
        new = _dataproto.put_stage(self, base, data, namespace=base.namespace, partition=base.partition,
                                   stage=stage, chunk_bytes=chunk_bytes, policy=validate_policy(policy, None),
                                   overwrite=overwrite, config=config, field_schemas=field_schemas,
                                   group=group)
        new._storage_group_id = base._storage_group_id
        return new

    def dataproto_manifest_view(self, ref: Any) -> dict[str, Any]:
        """Where each field lives and how it is encoded, without reading data."""
        return _dataproto.manifest_view(self, ref)

    def get_dataproto(self, ref: Any, *, fields: Optional[Sequence[str]] = None,
                      batch_fields: Optional[Sequence[str]] = None,
                      non_tensor_fields: Optional[Sequence[str]] = None,
                      meta_info_keys: Optional[Sequence[str]] = None, data_cls: Any = None,
                      destinations: Optional[Mapping[str, Any]] = None, rows: Any = None) -> Any:
        return self.get(ref, fields=fields, batch_fields=batch_fields, non_tensor_fields=non_tensor_fields,
                        meta_info_keys=meta_info_keys, data_cls=data_cls, destinations=destinations, rows=rows)

    def cleanup_dataproto(self, ref: Any) -> None:
        """Removes every stage object of a stored batch."""
        _dataproto.cleanup(self, ref)
