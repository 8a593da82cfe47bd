"""Column codecs for DataProto ``non_tensor_batch`` object arrays.

A column (one value per row, ``None`` for a null row) is stored as a few
flat payloads, each one member of the stage's structured object:

==================  ============================================================
codec               payloads
==================  ============================================================
``ndarray``         ``values`` (one number per row), ``nulls``
``typed_ragged``    see :mod:`._typed` (rows of numbers of any rank; rows
                    come back as arrays, or lists if given as lists)
``ragged_tensor``   ``values`` (all rows' elements), ``offsets``, ``nulls``;
                    the rows' shapes are in the metadata
``utf8_ragged``     ``values`` (UTF-8 bytes), ``offsets``, ``nulls``
``bytes_ragged``    ``values``, ``offsets``, ``nulls``
``msgpack_ragged``  ``values`` (one msgpack document per row), ``offsets``
==================  ============================================================

``offsets`` has rows + 1 int64 entries; ``nulls`` one uint8 per row.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from . import _recursive, _tensors, _typed
from ._inference import _choose_leaf_codec, _is_null


def _msgpack() -> Any:
    try:
        import msgpack
    except ImportError as exc:  # pragma: no cover - declared as a dependency
        raise RuntimeError("the msgpack_ragged codec needs the msgpack package") from exc
    return msgpack


def _offsets(lengths: Sequence[int]) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _nulls(values: Sequence[Any]) -> np.ndarray:
    return np.fromiter((_is_null(v) for v in values), dtype=np.uint8, count=len(values))


def _check_offsets(offsets: np.ndarray, rows: int, total: int) -> None:
    if len(offsets) != rows + 1:
        raise ValueError(f"ragged payload offsets length {len(offsets)} does not match {rows} rows")
    if len(offsets) and (offsets[0] != 0 or offsets[-1] != total or np.any(np.diff(offsets) < 0)):
        raise ValueError("ragged payload offsets are not monotone over the values")


def _encode_msgpack_ragged_values(name: str, values: Sequence[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    packer = _msgpack()
    try:
        blobs = [packer.packb(v, use_bin_type=True) for v in values]
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"unsupported structured non-tensor field {name}: unable to infer a safe codec "
                         f"for its values ({exc})") from exc
    payload = {"values": np.frombuffer(b"".join(blobs), dtype=np.uint8),
               "offsets": _offsets([len(b) for b in blobs])}
    return payload, {}


def _decode_msgpack_ragged_values(payload: Mapping[str, Any], rows: int) -> list[Any]:
    data = bytes(np.asarray(payload["values"], dtype=np.uint8))
    offsets = np.asarray(payload["offsets"], dtype=np.int64)
    _check_offsets(offsets, rows, len(data))
    packer = _msgpack()
    return [packer.unpackb(data[offsets[i]: offsets[i + 1]], raw=False, strict_map_key=False)
            for i in range(rows)]


def choose_codec(name: str, values: list[Any]) -> str:
    decision = _choose_leaf_codec(values)
    codec = decision.codec
    if codec == "ragged_tensor" and not decision.accepted:
        raise ValueError(f"non-tensor field {name} has tensors of mixed tensor dtypes: {decision.reason}")
    if codec == "ragged_tensor":
        dtype = next(v.dtype for v in values if not _is_null(v))
        if str(dtype) == "torch.bfloat16":
            # As the reference: ragged tensor columns go through NumPy,
            # which has no bfloat16.
            raise ValueError(f"non-tensor field {name}: ragged tensors of torch.bfloat16 are not supported")
    if not decision.accepted:
        return "msgpack_ragged"
    if codec == "ragged_tensor" and any(not _is_null(v) and v.ndim == 0 for v in values):
        return "msgpack_ragged" if not any(_tensors.is_tensor(v) for v in values) else codec
    return codec


def encode_column(name: str, values: list[Any], codec: str = "auto",
                  options: Mapping[str, Any] = {}) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(codec, payloads, metadata) for a column; ``codec`` "auto" infers it."""
    if codec == "auto" and _recursive.wants_recursive(values):
        payload, metadata = _recursive.encode(name, values, encode_column)
        return "structured_recursive", payload, metadata
    if codec == "auto":
        codec = choose_codec(name, values)
    elif codec == "structured_recursive":
        payload, metadata = _recursive.encode(name, values, encode_column)
        return codec, payload, metadata
    elif codec == "ragged_tensor_dict":
        return codec, *_ragged_tensor_dict(name, values, options)
    nulls = _nulls(values)
    present = [v for v in values if not _is_null(v)]
    if codec == "ndarray":
        dtype = (np.dtype(options["dtype"]) if options.get("dtype") else
                 np.result_type(*[np.asarray(v).dtype for v in present]) if present else np.dtype(np.int64))
        out = np.zeros(len(values), dtype=dtype)
        for i, v in enumerate(values):
            if not nulls[i]:
                out[i] = v
        return codec, {"values": out, "nulls": nulls}, {"dtype": dtype.str}
    if codec == "typed_ragged":
        payload, metadata = _typed._encode_typed_ragged_values(values, options.get("dtype"))
        return codec, payload, metadata
    if codec == "ragged_tensor":
        torch = _tensors.torch_module()
        dtype = present[0].dtype if present else getattr(torch, str(options.get("dtype", "float32"))
                                                         .removeprefix("torch."))
        shapes = [None if _is_null(v) else list(v.shape) for v in values]
        parts = [v.detach().cpu().contiguous().reshape(-1) for v in present]
        data = torch.cat(parts) if parts else torch.empty(0, dtype=dtype)
        lengths = [0 if s is None else int(np.prod(s, dtype=np.int64)) for s in shapes]
        return codec, {"values": data, "offsets": _offsets(lengths), "nulls": nulls}, \
            {"dtype": str(dtype), "shapes": shapes}
    if codec in ("utf8_ragged", "bytes_ragged"):
        blobs = [b"" if _is_null(v) else (v.encode("utf-8") if codec == "utf8_ragged" else bytes(v))
                 for v in values]
        return codec, {"values": np.frombuffer(b"".join(blobs), dtype=np.uint8),
                       "offsets": _offsets([len(b) for b in blobs]), "nulls": nulls}, {}
    if codec != "msgpack_ragged":
        raise ValueError(f"unsupported non-tensor codec {codec!r} for field {name}")
    payload, meta = _encode_msgpack_ragged_values(name, values)
    return "msgpack_ragged", payload, meta


def _dict_keys(name: str, options: Mapping[str, Any]) -> list[str]:
    keys = options.get("keys")
    keys = [] if keys is None else list(keys)
    for key in keys:
        if not isinstance(key, str) or not key or any(c in key for c in "./\\["):
            raise ValueError(f"ragged_tensor_dict field {name}: key {key!r} must not contain "
                             "'.', '/', '\\' or '[' and must not be empty")
    return keys


def _ragged_tensor_dict(name: str, values: list[Any], options: Mapping[str, Any]):
    """Rows of ``{key: tensor}`` (or None): one ragged_tensor column per
    key, plus which keys each row has."""
    declared = _dict_keys(name, options)
    seen: list[str] = list(declared)
    for row in values:
        if row is None:
            continue
        if not isinstance(row, Mapping):
            raise TypeError(f"ragged_tensor_dict field {name}: rows must be dicts or None")
        for key in row:
            if not isinstance(key, str) or not key or any(c in key for c in "./\\["):
                raise ValueError(f"ragged_tensor_dict field {name}: key {key!r} must not contain "
                                 "'.', '/', '\\' or '[' and must not be empty")
            if declared and key not in declared:
                raise ValueError(f"ragged_tensor_dict field {name}: keys not declared in the schema: {key!r}")
            if row[key] is None:
                raise TypeError(f"ragged_tensor_dict field {name}: key {key!r} holds an explicit None")
            if key not in seen:
                seen.append(key)
    payload: dict[str, Any] = {"rows": _nulls(values)}
    meta: dict[str, Any] = {"keys": seen, "parts": {}}
    for key in seen:
        column = [None if row is None else row.get(key) for row in values]
        codec, parts, part_meta = encode_column(f"{name}.{key}", column, "ragged_tensor",
                                                {"dtype": "float32"})
        payload[f"{key}.data"] = parts["values"]
        payload[f"{key}.offsets"] = parts["offsets"]
        payload[f"{key}.nulls"] = parts["nulls"]
        meta["parts"][key] = part_meta
    return payload, meta


def decode_column(codec: str, payload: Mapping[str, Any], rows: int, metadata: Mapping[str, Any]) -> list[Any]:
    if codec == "msgpack_ragged":
        return _decode_msgpack_ragged_values(payload, rows)
    if codec == "typed_ragged":
        return _typed._decode_typed_ragged_values(payload, rows, metadata)
    if codec == "structured_recursive":
        return _recursive.decode(payload, rows, metadata, decode_column)
    if codec == "ragged_tensor_dict":
        absent = np.asarray(payload["rows"], dtype=np.uint8)
        out: list[Any] = [None if absent[r] else {} for r in range(rows)]
        for key in metadata.get("keys", []):
            column = decode_column("ragged_tensor", {"values": payload[f"{key}.data"],
                                                     "offsets": payload[f"{key}.offsets"],
                                                     "nulls": payload[f"{key}.nulls"]},
                                   rows, metadata["parts"][key])
            for r, value in enumerate(column):
                if value is not None and out[r] is not None:
                    out[r][key] = value
        return out
    nulls = np.asarray(payload["nulls"], dtype=np.uint8)
    if len(nulls) != rows:
        raise ValueError(f"{codec} payload has {len(nulls)} null flags for {rows} rows")
    if codec == "ndarray":
        values = np.asarray(payload["values"]).tolist()
        return [None if nulls[i] else values[i] for i in range(rows)]
    offsets = np.asarray(payload["offsets"], dtype=np.int64)
    data = payload["values"]
    _check_offsets(offsets, rows, len(data))
    out: list[Any] = []
    if codec == "ragged_tensor":
        shapes = metadata.get("shapes", [])
        for i in range(rows):
            out.append(None if nulls[i] else data[offsets[i]: offsets[i + 1]].reshape(shapes[i]).clone())
        return out
    raw = bytes(np.asarray(data, dtype=np.uint8))
    for i in range(rows):
        blob = raw[offsets[i]: offsets[i + 1]]
        out.append(None if nulls[i] else (blob.decode("utf-8") if codec == "utf8_ragged" else blob))
    return out


def encode_with_schema(name: str, values: Any, schema: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A column encoded as its FieldSchema says: the codec named (``auto``:
    inferred), null rows refused when the schema is not nullable."""
    values = list(values)
    if not schema.nullable and any(_is_null(v) for v in values):
        raise ValueError(f"field {name} is not nullable but has null rows")
    codec = schema.codec or "auto"
    try:
        return encode_column(name, values, codec, schema.metadata)
    except Exception as exc:
        if codec == "auto" or str(exc).startswith("failed to encode"):
            raise
        raise type(exc)(f"failed to encode field {name!r} with codec {codec}: {exc}") from exc


def object_array(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out
