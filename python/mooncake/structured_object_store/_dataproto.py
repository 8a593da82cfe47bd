"""DataProto batches as stage-level structured objects.

A stage (the rollout, a reward model, ...) writes one structured object
whose members are ``batch.<field>`` (tensors, arrays) and
``non_tensor_batch.<field>`` (arrays; object columns through the codecs of
:mod:`._codecs`, one member per payload); its metadata carries
``{"dataproto": {"stage", "namespace", "partition", "batch_size",
"meta_info", "encoded_non_tensor"}}``. A :class:`MooncakeDataProtoRef` maps
each field to its stage and member, so appending a stage adds fields without
rewriting the others, and a reader fetches only the fields and rows it asks
for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Sequence

import numpy as np

from ..dataproto_ref import (
    MooncakeDataProtoRef,
    StructuredFieldLocation,
    import_dataproto_ref,
    is_dataproto_ref_handle,
)
from . import _codecs, _tensors
from ._bundle import validate_key_segment
from ._transport import config_with_group
from ._structured import CheckedRows, encode_field, field_specs
from ._types import _TensorObjectBufferPayload
from ._types import STRUCTURED_FIELD_SPECS_KEY, FieldSchema, StructuredMemberSlice, StructuredObjectPayload

SECTIONS = ("batch", "non_tensor_batch")


def resolve_ref(ref: Any) -> MooncakeDataProtoRef:
    if isinstance(ref, MooncakeDataProtoRef):
        return ref
    if is_dataproto_ref_handle(ref):
        return import_dataproto_ref(ref)
    raise TypeError(f"expected a MooncakeDataProtoRef or its handle, got {type(ref).__name__}")


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        if hasattr(value, "keys") and hasattr(value, "__getitem__"):  # TensorDict and friends
            return {k: value[k] for k in value.keys()}
        raise TypeError(f"DataProto {what} must be a mapping, got {type(value).__name__}")
    return dict(value)


def split_dataproto(data: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(batch, non_tensor_batch, meta_info) of a DataProto-like object or of
    a mapping with those keys."""
    if isinstance(data, Mapping):
        envelope = data and not (set(data) - {"batch", "non_tensor_batch", "meta_info"}) and all(
            v is None or isinstance(v, Mapping) for v in data.values())
        if envelope:
            parts = (data.get("batch"), data.get("non_tensor_batch"), data.get("meta_info"))
        else:  # a plain dict: its entries are batch fields
            parts = (data, None, None)
    elif all(hasattr(data, a) for a in ("batch", "non_tensor_batch", "meta_info")):
        parts = (data.batch, data.non_tensor_batch, data.meta_info)
    else:
        raise TypeError(f"expected a DataProto-like object, got {type(data).__name__}")
    batch, non_tensor, meta = (_mapping(p, w) for p, w in zip(parts, ("batch", "non_tensor_batch", "meta_info")))
    for name in list(batch) + list(non_tensor):
        if not isinstance(name, str):
            raise TypeError("DataProto field names must be strings")
        validate_key_segment(name, "field name")
    both = set(batch) & set(non_tensor)
    if both:
        raise ValueError(f"DataProto batch and non_tensor_batch field names overlap: {sorted(both)}")
    return batch, non_tensor, meta


def _rows_of(name: str, value: Any) -> int:
    if isinstance(value, _TensorObjectBufferPayload):
        return len(value)  # a TypeError naming batch_size when it has none
    shape = getattr(value, "shape", None)
    if shape is not None:
        if len(shape) == 0:
            raise ValueError(f"DataProto field {name} must have a batch dimension")
        return int(shape[0])
    try:
        return len(value)
    except TypeError:
        raise TypeError(f"DataProto field {name} must be an array, tensor or sequence") from None


def _as_non_tensor_array(name: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if _tensors.is_tensor(value):
        raise TypeError(f"non_tensor_batch field {name} must not be a tensor")
    return _codecs.object_array(list(value))


def _schema_section(name: str, schema: Any) -> Optional[str]:
    if not isinstance(schema, FieldSchema):
        raise TypeError(f"field schema for {name} must be a FieldSchema")
    section = schema.metadata.get("section")
    if section not in (None, "batch", "non_tensor_batch", "meta_info"):
        raise ValueError(f"field schema for {name} has unknown section {section!r}")
    return section


def put_stage(transfer: Any, base: Optional[MooncakeDataProtoRef], data: Any, *, namespace: str,
              partition: str, stage: str, chunk_bytes: Optional[int], policy: Any, overwrite: bool,
              config: Any, field_schemas: Optional[Mapping[str, Any]],
              group: Optional[str] = None) -> MooncakeDataProtoRef:
    validate_key_segment(stage, "stage")
    batch, non_tensor, meta = split_dataproto(data)
    schemas = dict(field_schemas or {})
    for name, schema in schemas.items():
        section = _schema_section(name, schema)
        if section == "batch" and name in non_tensor:
            raise ValueError(f"field schema for {name} declares section batch but the field is in non_tensor_batch")
        if section == "non_tensor_batch" and name in batch:
            raise ValueError(f"field schema for {name} declares section non_tensor_batch but the field is in batch")
    rows = {name: _rows_of(name, v) for name, v in {**batch, **non_tensor}.items()}
    sizes = set(rows.values())
    if base is not None:
        sizes.add(int(base.batch_size))
    if len(sizes) > 1:
        raise ValueError(f"DataProto fields have inconsistent batch sizes: {rows}")
    batch_size = sizes.pop() if sizes else 0
    if base is not None and not overwrite:
        clash = sorted(n for n in rows if n in base.field_index)
        if clash:
            raise ValueError(f"DataProto fields already exist: {clash}; pass overwrite=True")
    buffers: dict[str, Any] = {}
    index: dict[str, StructuredFieldLocation] = {}
    encoded: dict[str, Any] = {}
    for name, value in batch.items():
        buffers[f"batch.{name}"] = value
        index[name] = StructuredFieldLocation(stage, f"batch.{name}", "batch")
    for name, value in non_tensor.items():
        member = f"non_tensor_batch.{name}"
        index[name] = StructuredFieldLocation(stage, member, "non_tensor_batch")
        array = _as_non_tensor_array(name, value)
        schema = schemas.get(name)
        if schema is not None and schema.metadata.get("section") not in (None, "non_tensor_batch"):
            schema = None  # a schema for the meta_info entry of that name
        if schema is not None and schema.codec != "ndarray" and (
                schema.codec != "auto" or array.dtype.hasobject):
            codec, payload, metadata = _codecs.encode_with_schema(name, array, schema)
        elif not array.dtype.hasobject and array.dtype.kind in "biufcSUmM":
            if schema is not None and not schema.nullable:
                pass  # a plain array has no null rows
            buffers[member] = array
            continue
        else:
            if schema is not None:
                codec, payload, metadata = _codecs.encode_with_schema(name, array, schema)
            else:
                codec, payload, metadata = _codecs.encode_column(name, list(array))
        members, part_specs = {}, {}
        for part, part_value in payload.items():
            buffers[f"{member}.{part}"] = part_value
            members[part] = f"{member}.{part}"
            part_specs[part] = encode_field(part_value)[0]
        encoded[name] = {"codec": codec, "payload_members": members, "metadata": metadata,
                         "payload_specs": part_specs}
    stage_meta = {"stage": stage, "namespace": namespace, "partition": partition,
                  "batch_size": batch_size, "meta_info": meta, "encoded_non_tensor": encoded}
    ready, ready_specs, cleanup = None, None, []
    replace_stage = None
    if base is not None and stage in base.stage_refs and overwrite:
        # Overwriting a stage rewrites all of it: the old object goes once
        # the new one is in.
        old_fields = sorted(n for n, loc in base.field_index.items() if loc.stage == stage)
        missing = [n for n in old_fields if n not in rows]
        if missing:
            raise ValueError(f"overwriting stage {stage!r} must include existing fields {missing}")
        replace_stage = base.stage_refs[stage]
    elif base is not None and stage in base.stage_refs:
        # Same stage again: the new stage object lists the old one's members
        # that stay, and removes the old object's own keys with its cleanup.
        old_ref = base.stage_refs[stage]
        old_manifest, old_meta = transfer._structured.resolve(old_ref)
        # No field is replaced here (a clash without overwrite was refused
        # above), so every old member stays.
        ready = dict(old_manifest["buffers"])
        old_specs = field_specs(old_meta)
        ready_specs = {m: old_specs[m] for m in ready if m in old_specs}
        cleanup = list(old_manifest.get("cleanup_keys", []))
        cleanup += [c["key"] for c in old_manifest["meta"]["chunks"]]
        cleanup.append(transfer._bundles.manifest_key(old_ref, old_manifest))
        old_dp = old_meta.get("dataproto", {})
        kept = {n: e for n, e in old_dp.get("encoded_non_tensor", {}).items() if n not in rows}
        stage_meta["encoded_non_tensor"] = {**kept, **encoded}
        stage_meta["meta_info"] = {**old_dp.get("meta_info", {}), **meta}
    if not buffers and (base is None or stage not in base.stage_refs):
        # Only meta_info: the ref carries it, nothing is written.
        if base is None:
            return MooncakeDataProtoRef(batch_size=batch_size, stage_refs={}, field_index={},
                                        meta_info=dict(meta), namespace=namespace, partition=partition)
        return MooncakeDataProtoRef(batch_size=batch_size, stage_refs=dict(base.stage_refs),
                                    field_index=dict(base.field_index), meta_info={**base.meta_info, **meta},
                                    namespace=base.namespace, partition=base.partition,
                                    global_indexes=base.global_indexes,
                                    encoded_non_tensor=dict(base.encoded_non_tensor))
    if group is not None:
        config = config_with_group(config, group)
    stage_ref = transfer._structured.put(
        StructuredObjectPayload(metadata={"dataproto": stage_meta}, buffers=buffers), partition,
        chunk_bytes, policy, config=config, cleanup_keys=cleanup, ready=ready, ready_specs=ready_specs)
    if replace_stage is not None:
        transfer.remove_bundle(replace_stage)
    if base is None:
        return MooncakeDataProtoRef(batch_size=batch_size, stage_refs={stage: stage_ref}, field_index=index,
                                    meta_info=dict(meta), namespace=namespace, partition=partition,
                                    encoded_non_tensor=encoded)
    field_index = {n: loc for n, loc in base.field_index.items() if n not in index}
    field_index.update(index)
    enc = {n: e for n, e in base.encoded_non_tensor.items() if n not in index}
    enc.update(encoded)
    stages = dict(base.stage_refs)
    stages[stage] = stage_ref
    return MooncakeDataProtoRef(batch_size=batch_size, stage_refs=stages, field_index=field_index,
                                meta_info={**base.meta_info, **meta}, namespace=base.namespace,
                                partition=base.partition, global_indexes=base.global_indexes,
                                encoded_non_tensor=enc, _storage_group_id=base._storage_group_id)


def coerce_rows(rows: Any, batch_size: int) -> tuple[Optional[StructuredMemberSlice], Optional[list[int]], int]:
    """(slice, indices, output rows) of a row selection."""
    if rows is None:
        return None, None, batch_size
    if isinstance(rows, StructuredMemberSlice):
        if rows.axis != 0:
            raise ValueError("DataProto row slicing currently supports axis=0 only")
        if rows.step <= 0:
            raise ValueError("DataProto row slicing step must be positive")
        rows = slice(rows.start, rows.end, rows.step)
    if isinstance(rows, slice):
        start, stop, step = rows.indices(batch_size)
        if step <= 0:
            raise ValueError("DataProto row slicing step must be positive")
        return StructuredMemberSlice(0, start, stop, step), None, len(range(start, stop, step))
    if isinstance(rows, (str, bytes, bytearray)) or not isinstance(rows, (Sequence, np.ndarray)):
        raise TypeError("DataProto rows must be a slice, StructuredMemberSlice, or row index sequence")
    out = []
    for i in rows:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError("DataProto row indices must be integers")
        n = int(i) + batch_size if int(i) < 0 else int(i)
        if n < 0 or n >= batch_size:
            raise IndexError(f"DataProto row index {int(i)} out of range for {batch_size} rows")
        out.append(n)
    return None, CheckedRows(out, batch_size), len(out)


def select_fields(ref: MooncakeDataProtoRef, fields, batch_fields, non_tensor_fields) -> tuple[list, list]:
    if fields is not None and (batch_fields is not None or non_tensor_fields is not None):
        raise ValueError("fields cannot be combined with batch_fields or non_tensor_fields")
    for group in (fields, batch_fields, non_tensor_fields):
        if isinstance(group, str):
            raise TypeError("field selections must be sequences of names, not a string")
    if fields is not None:
        names = list(fields)
        _check_known(ref, names)
        return ([n for n in names if ref.field_index[n].section == "batch"],
                [n for n in names if ref.field_index[n].section == "non_tensor_batch"])
    if batch_fields is None and non_tensor_fields is None:
        return ([n for n, loc in ref.field_index.items() if loc.section == "batch"],
                [n for n, loc in ref.field_index.items() if loc.section == "non_tensor_batch"])
    batch, non_tensor = list(batch_fields or []), list(non_tensor_fields or [])
    _check_known(ref, batch + non_tensor)
    return batch, non_tensor


def _check_known(ref: MooncakeDataProtoRef, names: Sequence[str]) -> None:
    missing = [n for n in names if n not in ref.field_index]
    if missing:
        raise KeyError(f"unknown DataProto fields: {missing}")


def get_dataproto(transfer: Any, ref: Any, *, fields=None, batch_fields=None, non_tensor_fields=None,
                  meta_info_keys=None, data_cls=None, destinations=None, rows=None, flat=False) -> Any:
    ref = resolve_ref(ref)
    member_slice, indices, _count = coerce_rows(rows, int(ref.batch_size))
    batch_names, non_tensor_names = select_fields(ref, fields, batch_fields, non_tensor_fields)
    destinations = dict(destinations or {})
    for name in destinations:
        if name not in batch_names and name not in non_tensor_names:
            raise KeyError(f"destination for {name!r} names no selected field")
    out = {"batch": {}, "non_tensor_batch": {}}
    stages: dict[str, tuple[dict, dict]] = {}
    plain: dict[str, list] = {}

    def stage(name: str) -> tuple[dict, dict]:
        if name not in stages:
            manifest, metadata = transfer._structured.resolve(ref.stage_refs[name])
            stages[name] = (manifest, field_specs(metadata))
        return stages[name]

    for name in [*batch_names, *non_tensor_names]:
        loc = ref.field_index[name]
        manifest, specs = stage(loc.stage)
        section = out[loc.section]
        if name in ref.encoded_non_tensor:
            if name in destinations:
                raise ValueError(f"encoded non-tensor field {name} does not support destinations")
            enc = ref.encoded_non_tensor[name]
            payload = {part: transfer._structured.read_member(
                member, manifest["buffers"][member], specs.get(member, {"encoding": "bytes"}), None, None, None)
                for part, member in enc["payload_members"].items()}
            values = _codecs.decode_column(enc["codec"], payload, int(ref.batch_size), enc.get("metadata") or {})
            if indices is not None:
                values = [values[i] for i in indices]
            elif member_slice is not None:
                values = values[member_slice.start:member_slice.end:member_slice.step]
            section[name] = values if flat else _codecs.object_array(values)
            continue
        if loc.member not in manifest["buffers"]:
            raise ValueError(f"stage {loc.stage} has no member {loc.member}")
        plain.setdefault(loc.stage, []).append((name, loc))
    for stage_name, entries in plain.items():
        manifest, specs = stage(stage_name)
        # Every field of a stage in one store call, where the store allows.
        got = transfer._structured.read_members([
            (loc.member, manifest["buffers"][loc.member], specs.get(loc.member, {"encoding": "bytes"}),
             member_slice, indices, destinations.get(name)) for name, loc in entries])
        for name, loc in entries:
            out[loc.section][name] = got[loc.member]
    meta = dict(ref.meta_info)
    if meta_info_keys is not None:
        missing = [k for k in meta_info_keys if k not in meta]
        if missing:
            raise KeyError(f"DataProto meta_info keys not found: {missing}")
        meta = {k: meta[k] for k in meta_info_keys}
    return build_result(out["batch"], out["non_tensor_batch"], meta, data_cls)


def build_result(batch: dict, non_tensor: dict, meta: dict, data_cls: Any) -> Any:
    if data_cls is None or data_cls is dict:
        return {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": meta}
    from_dict = getattr(data_cls, "from_dict", None)
    if callable(from_dict):
        return from_dict(batch, non_tensor_batch=non_tensor, meta_info=meta)
    try:
        return data_cls(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)
    except TypeError as exc:
        raise TypeError(f"data_cls {getattr(data_cls, '__name__', data_cls)!r} cannot be constructed "
                        f"from batch, non_tensor_batch and meta_info: {exc}") from exc


def manifest_view(transfer: Any, ref: Any) -> dict[str, Any]:
    ref = resolve_ref(ref)
    stages, specs = {}, {}
    for name, stage_ref in ref.stage_refs.items():
        _manifest, metadata = transfer._structured.resolve(stage_ref)
        stages[name] = {k: v for k, v in metadata.items() if k != STRUCTURED_FIELD_SPECS_KEY}
        specs[name] = field_specs(metadata)
    view: dict[str, Any] = {"namespace": ref.namespace, "partition": ref.partition,
                            "batch_size": int(ref.batch_size), "stages": stages,
                            "batch_fields": {}, "non_tensor_fields": {},
                            "meta_info_keys": sorted(ref.meta_info)}
    for name, loc in ref.field_index.items():
        entry = {"stage": loc.stage, "member": loc.member, "section": loc.section,
                 "spec": specs[loc.stage].get(loc.member, {})}
        if name in ref.encoded_non_tensor:
            entry["spec"] = ref.encoded_non_tensor[name]
        view["batch_fields" if loc.section == "batch" else "non_tensor_fields"][name] = entry
    return view


def cleanup(transfer: Any, ref: Any) -> None:
    ref = resolve_ref(ref)
    error: Optional[BaseException] = None
    for stage_ref in ref.stage_refs.values():
        try:
            transfer.remove_bundle(stage_ref)
        except Exception as exc:  # remove the other stages before reporting
            error = error or exc
    if error is not None:
        raise error


def flat_dict_to_envelope(data: Any, field_schemas: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """A flat ``{name: value}`` dict as a DataProto envelope: arrays and
    tensors of the common row count go to batch, other row-aligned
    sequences to non_tensor_batch, everything else to meta_info."""
    if not isinstance(data, Mapping):
        raise TypeError(f"type='dict' needs a mapping, got {type(data).__name__}")
    schemas = dict(field_schemas or {})
    sections = {n: _schema_section(n, s) for n, s in schemas.items()}
    counts = {}
    for name, value in data.items():
        if sections.get(name) == "meta_info" or isinstance(value, (str, bytes, Mapping)):
            continue
        if _tensors.is_tensor(value) or isinstance(value, (np.ndarray, list, tuple)):
            if getattr(value, "ndim", 1) >= 1:
                counts[name] = _rows_of(name, value)
    rows = max(set(counts.values()), key=list(counts.values()).count) if counts else None
    env = {"batch": {}, "non_tensor_batch": {}, "meta_info": {}}
    for name, value in data.items():
        section = sections.get(name)
        if section is None:
            if counts.get(name) != rows or name not in counts:
                section = "meta_info"
            elif _tensors.is_tensor(value) or (isinstance(value, np.ndarray) and not value.dtype.hasobject):
                section = "batch"
            else:
                section = "non_tensor_batch"
        if section == "non_tensor_batch" and not isinstance(value, np.ndarray):
            value = _codecs.object_array(list(value))
        env[section][name] = value
    return env


def envelope_to_flat(result: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for section in ("batch", "non_tensor_batch", "meta_info"):
        for name, value in result[section].items():
            if name in out:
                raise ValueError(f"Duplicate keys when flattening the DataProto: {name!r}")
            out[name] = value
    return out

