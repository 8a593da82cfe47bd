"""Torch tensor members: through the store's tensor calls where it has them,
else as raw bytes with the dtype and shape in the member's spec."""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Mapping, Optional

import numpy as np

from ._transport import Transport, call_write, check_status, has, is_native_store, registered
from ._types import BundleTransferPolicy, _TensorObjectBufferPayload, _TensorPayload


def torch_module() -> Any:
    return sys.modules.get("torch")


def is_tensor(value: Any) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(value, torch.Tensor)


def tensor_spec(tensor: Any) -> dict[str, Any]:
    return {"encoding": "torch_tensor", "dtype": str(tensor.dtype), "shape": list(tensor.shape),
            "element_size": int(tensor.element_size())}


def parse_dtype(name: str) -> Any:
    torch = torch_module()
    if torch is None:
        import torch  # noqa: F811 - a torch member needs torch to be read
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unsupported torch dtype {name!r}")
    return dtype


def _numpy_view(tensor: Any) -> np.ndarray:
    """The tensor's bytes as a uint8 array (no copy for a contiguous CPU tensor)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.numel() == 0:
        return np.empty(0, dtype=np.uint8)
    torch = torch_module()
    flat = t.reshape(-1).view(torch.uint8) if t.element_size() else t.reshape(-1)
    return flat.numpy()


def tensor_bytes(value: Any) -> tuple[Any, bytes]:
    """(data bytes, store tensor header or b"") of a tensor member that the
    store's tensor calls do not take."""
    if isinstance(value, _TensorPayload):
        header = b""
        from . import _has_tensor_codec_helpers  # on the package, where callers may swap it

        serialize = getattr(_store_module(), "_serialize_tensor", None)
        if not _has_tensor_codec_helpers():
            return None, b""
        if serialize is not None:
            try:
                header = bytes(serialize(value.tensor)[0])
            except (TypeError, ValueError):
                header = b""  # a dtype the store's encoding lacks: raw bytes only
        return _numpy_view(value.tensor), header
    return memoryview(ctypes.string_at(value.ptr, value.size)), b""


def _store_module() -> Any:
    try:
        from .. import store
    except Exception:  # the extension is missing in a source checkout
        return None
    return store


def has_tensor_codec_helpers() -> bool:
    """Whether the store module has its tensor encoding helpers."""
    store = _store_module()
    return callable(getattr(store, "_serialize_tensor", None)) and \
        callable(getattr(store, "_deserialize_tensor", None))


def torch_save_bytes(tensor: Any) -> bytes:
    import io

    torch = torch_module()
    out = io.BytesIO()
    torch.save(tensor.detach().cpu().contiguous(), out)
    return out.getvalue()


def torch_load_bytes(blob: bytes) -> Any:
    import io

    return torch_module().load(io.BytesIO(blob), weights_only=True)


def put_tensor_payload(transport: Transport, key: str, value: Any,
                       policy: BundleTransferPolicy, config: Any) -> Optional[dict[str, Any]]:
    """Writes a tensor member with the store's tensor calls; None when the
    store has none (the caller then writes raw bytes)."""
    store = transport.store
    if isinstance(value, _TensorObjectBufferPayload):
        if has(store, "put_tensor_from"):
            with registered(store, [(value.ptr, value.size)]):
                if config is not None and has(store, "put_from"):
                    status = call_write(store.put_from, key, value.ptr, value.size, config=config)
                else:
                    status = store.put_tensor_from(key, value.ptr, value.size)
            check_status(status, "put_tensor_from", key)
            return {"key": key, "bytes": value.size, "kind": "tensor",
                    "chunks": [{"key": key, "bytes": value.size}]}
        if policy.copy_mode == "zero_copy":
            raise RuntimeError("zero-copy put of a tensor object buffer requires put_tensor_from")
        check_status(call_write(store.put, key, ctypes.string_at(value.ptr, value.size), config=config),
                     "put", key)
        return {"key": key, "bytes": value.size, "kind": "tensor",
                "chunks": [{"key": key, "bytes": value.size}]}
    tensor = value.tensor
    if policy.copy_mode == "zero_copy":
        raise ValueError("zero-copy put of a torch tensor needs a BufferPool tensor-object buffer "
                         "(tensor_object_buffer); a plain tensor is copied")
    if policy.copy_mode == "copy" or getattr(tensor, "device", None) is None:
        return None
    if config is not None and has(store, "pub_tensor"):
        status = call_write(store.pub_tensor, key, tensor, config=config)
        name = "pub_tensor"
    elif has(store, "put_tensor"):
        status = store.put_tensor(key, tensor)
        name = "put_tensor"
    else:
        return None
    check_status(status, name, key)
    nbytes = int(tensor.numel() * tensor.element_size())
    spec = {"key": key, "bytes": nbytes, "kind": "tensor", "chunks": [{"key": key, "bytes": nbytes}]}
    if is_native_store(store):
        # Our store keeps a fixed header before the data: the object's
        # size counts it, and rows are read past it.
        total = nbytes + HEADER_BYTES
        spec.update(bytes=total, data_offset=HEADER_BYTES, chunks=[{"key": key, "bytes": total}])
    return spec


def get_tensor(transport: Transport, spec: Mapping[str, Any]) -> Any:
    store = transport.store
    if not has(store, "get_tensor"):
        raise RuntimeError("store does not support get_tensor; cannot read a tensor member")
    tensor = store.get_tensor(spec["key"])
    if tensor is None:
        raise RuntimeError(f"Mooncake get_tensor failed for {spec['key']}")
    return tensor


def from_bytes(data: Any, field_spec: Mapping[str, Any]) -> Any:
    """A tensor from its raw bytes and its member spec."""
    torch = torch_module()
    if torch is None:
        import torch  # noqa: F811
    dtype = parse_dtype(str(field_spec.get("dtype")))
    shape = [int(d) for d in field_spec.get("shape", [])]
    raw = np.frombuffer(data, dtype=np.uint8).copy() if not isinstance(data, np.ndarray) else data
    flat = torch.from_numpy(raw)
    if flat.numel() == 0:
        return torch.empty(shape, dtype=dtype)
    return flat.view(dtype).reshape(shape)


try:
    from .._tensor import HEADER_SIZE as HEADER_BYTES
except Exception:  # pragma: no cover
    HEADER_BYTES = 0


def tensor_over(ptr: int, size: int, owner: Any) -> Any:
    """The tensor whose store encoding (header and data) is at ``ptr``."""
    from .. import _tensor

    torch = torch_module()
    if torch is None:
        import torch  # noqa: F811
    buf = _tensor.memory_at(ptr, size)
    meta = _tensor.decode(buf)
    if meta is None:
        raise ValueError("destination does not hold a tensor the store encoded")
    out = _tensor.to_tensor(torch, meta, buf).clone()
    return out


def encode_nested(value: Any) -> tuple[dict[str, Any], Any]:
    """A jagged nested tensor as two parts: its rows' elements back to back,
    and their shapes (int64: ndim, then the dims, per row)."""
    from ._types import _MultiBufferPayload

    torch = torch_module()
    if value.layout != torch.jagged:
        raise ValueError("structured nested tensor fields require torch.jagged layout")
    rows = [r.detach().cpu().contiguous() for r in value.unbind()]
    data = _numpy_view(torch.cat([r.reshape(-1) for r in rows])) if rows else np.empty(0, np.uint8)
    shapes = np.asarray([d for r in rows for d in (r.dim(), *r.shape)], dtype=np.int64)
    parts = (memoryview(data).cast("B"), memoryview(shapes.view(np.uint8)))
    spec = {"encoding": "torch_tensor", "dtype": str(value.dtype), "nested": True, "format": "tensor_parts",
            "part_bytes": [parts[0].nbytes, parts[1].nbytes], "rows": len(rows),
            "element_size": int(value.element_size())}
    return spec, _MultiBufferPayload(buffers=parts, owners=(data, shapes))


def decode_nested_rows(blob: bytes, spec: Mapping[str, Any]) -> list:
    torch = torch_module()
    data_bytes, shape_bytes = (int(n) for n in spec["part_bytes"])
    if len(blob) != data_bytes + shape_bytes:
        raise ValueError("nested tensor payload size does not match its parts")
    dtype = parse_dtype(spec["dtype"])
    raw = bytearray(blob[:data_bytes])
    flat = torch.frombuffer(raw, dtype=dtype) if data_bytes else torch.empty(0, dtype=dtype)
    shapes = np.frombuffer(blob[data_bytes:], dtype=np.int64)
    rows, at, offset = [], 0, 0
    for _ in range(int(spec.get("rows", 0))):
        nd = int(shapes[at])
        shape = tuple(int(d) for d in shapes[at + 1: at + 1 + nd])
        at += 1 + nd
        count = int(np.prod(shape, dtype=np.int64))
        rows.append(flat[offset: offset + count].reshape(shape))
        offset += count
    return rows


def nested_from_rows(rows: list, spec: Mapping[str, Any]) -> Any:
    torch = torch_module()
    if not rows:
        dtype = parse_dtype(spec["dtype"])
        return torch.nested.nested_tensor_from_jagged(torch.empty(0, dtype=dtype),
                                                      offsets=torch.zeros(1, dtype=torch.int64))
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def tensor_row_layout(field_spec: Mapping[str, Any]) -> tuple[int, int]:
    """(rows, bytes per row) of a raw tensor member."""
    shape = [int(d) for d in field_spec.get("shape", [])]
    if not shape:
        raise ValueError("a 0-d tensor member has no rows")
    itemsize = int(field_spec.get("element_size") or parse_dtype(field_spec["dtype"]).itemsize)
    return shape[0], int(np.prod(shape[1:], dtype=np.int64)) * itemsize


def tensor_destination(destination: Any, dtype: Any, shape: tuple[int, ...]) -> tuple[int, int]:
    """Address and size of a torch destination that fits ``shape``."""
    if tuple(destination.shape) != tuple(shape) or destination.dtype != dtype:
        raise ValueError(f"destination shape mismatch: got {tuple(destination.shape)} {destination.dtype}, "
                         f"expected {tuple(shape)} {dtype}")
    if destination.device.type != "cpu" or not destination.is_contiguous():
        raise ValueError("tensor destination must be a contiguous CPU tensor")
    return int(destination.data_ptr()), int(destination.numel() * destination.element_size())

