"""Structured objects: JSON metadata plus typed members over a bundle.

The metadata blob holds the caller's metadata, ``layout`` (default
``structured``) and, under ``__mooncake_structured_fields__``, how each
member is encoded: ``ndarray`` (dtype string and shape), ``torch_tensor``
(torch dtype, shape, element size) or ``bytes``. Reads materialize whole
members or rows of them (axis 0: a slice, a step, or a list of indices),
into fresh arrays, buffer-pool leases, or destinations the caller gives;
the row reads ask the store for exactly the bytes of those rows.
"""

from __future__ import annotations

import ctypes
import json
import threading
import weakref
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from . import _tensors
from ._bundle import BundleStore, decode_json, encode_json, validate_key_segment
from ._transport import address
from ._types import (
    STRUCTURED_FIELD_SPECS_KEY,
    StructuredMemberSlice,
    StructuredObjectReadSpec,
    StructuredObjectResult,
    _DirectCopyPayload,
    _MultiBufferPayload,
    _PoolBackedNdarray,
    _PoolLeaseOwner,
    _RawDestinationBuffer,
    _TensorObjectBufferPayload,
    _TensorPayload,
)


def normalize_metadata(metadata: Any) -> dict[str, Any]:
    if not isinstance(metadata, Mapping):
        raise TypeError("structured metadata must be a mapping")
    out = dict(metadata)
    if STRUCTURED_FIELD_SPECS_KEY in out:
        raise ValueError(f"structured metadata key {STRUCTURED_FIELD_SPECS_KEY!r} is reserved")
    if not isinstance(out.get("layout", "structured"), str):
        raise ValueError("structured metadata layout must be a string")
    out.setdefault("layout", "structured")
    return out


def encode_field(value: Any) -> tuple[dict[str, Any], Any]:
    """(member spec, what the bundle stores) for one member."""
    if isinstance(value, _TensorObjectBufferPayload):
        return {"encoding": "torch_tensor"}, value
    if isinstance(value, _TensorPayload):
        return _tensors.tensor_spec(value.tensor), value
    if isinstance(value, (_DirectCopyPayload, _MultiBufferPayload)):
        if value.dtype is not None and value.shape is not None:
            return {"encoding": "ndarray", "dtype": value.dtype, "shape": list(value.shape)}, value
        return {"encoding": "bytes"}, value
    if _tensors.is_tensor(value):
        if getattr(value, "is_nested", False):
            return _tensors.encode_nested(value)
        return _tensors.tensor_spec(value), _TensorPayload(value)
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError("object arrays cannot be stored as raw members")
        array = np.ascontiguousarray(value)
        return {"encoding": "ndarray", "dtype": array.dtype.str, "shape": list(array.shape)}, \
            array.reshape(-1).view(np.uint8)
    return {"encoding": "bytes"}, value


def encode_fields(metadata: Any, fields: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    meta = normalize_metadata(metadata)
    specs: dict[str, Any] = {}
    encoded: dict[str, Any] = {}
    for name, value in fields.items():
        validate_key_segment(name, "buffer name")
        specs[name], encoded[name] = encode_field(value)
    if specs:
        meta[STRUCTURED_FIELD_SPECS_KEY] = specs
    return meta, encoded


def field_specs(metadata: Mapping[str, Any]) -> dict[str, Any]:
    specs = metadata.get(STRUCTURED_FIELD_SPECS_KEY, {})
    if not isinstance(specs, Mapping):
        raise ValueError("structured field specs must be a mapping")
    return dict(specs)


_META_CACHE_ENTRIES = 256


class CheckedRows(list):
    """Row indices already checked and normalized against ``rows`` rows
    (a DataProto read checks them once for all its fields)."""

    def __init__(self, values: Sequence[int], rows: int) -> None:
        super().__init__(values)
        self.rows = rows


def row_positions(member_slice: Optional[StructuredMemberSlice], indices: Optional[Sequence[int]],
                  rows: int) -> Optional[list[int]]:
    """The rows a read wants (None: all), validated against ``rows``."""
    if isinstance(indices, CheckedRows) and indices.rows == rows:
        return indices
    if indices is not None:
        picked = np.asarray(indices, dtype=np.int64).reshape(-1)
        if picked.size and (picked.min() < -rows or picked.max() >= rows):
            bad = next(int(i) for i in picked.tolist() if i < -rows or i >= rows)
            raise IndexError(f"row index {bad} is out of range for {rows} rows")
        return (picked % rows if rows else picked).tolist()
    if member_slice is None:
        return None
    if member_slice.axis != 0:
        raise ValueError(f"structured member slices support only axis=0, got axis={member_slice.axis}")
    if member_slice.step <= 0:
        raise ValueError("structured member slice step must be positive")
    return list(range(*slice(member_slice.start, member_slice.end, member_slice.step).indices(rows)))


def row_ranges(positions: Sequence[int], row_bytes: int) -> np.ndarray:
    """(source offset, length, destination offset) rows of an int64 array,
    one per run of consecutive rows (a run is one range)."""
    rows = np.asarray(positions, dtype=np.int64).reshape(-1)
    if rows.size == 0 or row_bytes == 0:
        return np.empty((0, 3), dtype=np.int64)
    starts = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.concatenate(([0], starts))
    lengths = np.diff(np.concatenate((starts, [rows.size])))
    out = np.empty((starts.size, 3), dtype=np.int64)
    out[:, 0] = rows[starts] * row_bytes
    out[:, 1] = lengths * row_bytes
    out[:, 2] = starts * row_bytes
    return out


def shifted(ranges: Any, src: int = 0, dst: int = 0) -> np.ndarray:
    """``ranges`` as an int64 (k, 3) array, moved by ``src`` / ``dst``."""
    out = np.array(ranges, dtype=np.int64).reshape(-1, 3)
    out[:, 0] += src
    out[:, 2] += dst
    return out


class StructuredLayer:
    def __init__(self, bundles: BundleStore) -> None:
        self.bundles = bundles
        self.transport = bundles.transport
        self._meta_cache: dict[tuple, bytes] = {}
        self._lock = threading.Lock()

    def put(self, payload: Any, partition: str, chunk_bytes: Optional[int], policy: Any,
            config: Any = None, cleanup_keys: Sequence[str] = (),
            ready: Optional[Mapping[str, Any]] = None, ready_specs: Optional[Mapping[str, Any]] = None):
        metadata, buffers = encode_fields(payload.metadata, payload.buffers)
        if ready_specs:
            metadata.setdefault(STRUCTURED_FIELD_SPECS_KEY, {}).update(ready_specs)
        return self.bundles.put_bundle(encode_json(metadata, "structured metadata"), buffers, partition,
                                       chunk_bytes, policy, config=config, cleanup_keys=cleanup_keys,
                                       ready_buffers=ready)

    def resolve(self, ref: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        manifest = self.bundles.resolve_manifest(ref)
        # A bundle's metadata never changes (each put is a new object id),
        # so repeated reads of one bundle fetch it once.
        key = (manifest["object_id"], json.dumps(manifest["meta"], sort_keys=True))
        with self._lock:
            blob = self._meta_cache.get(key)
        if blob is None:
            blob = self.bundles.read_meta(manifest)
            with self._lock:
                self._meta_cache[key] = blob
                while len(self._meta_cache) > _META_CACHE_ENTRIES:
                    self._meta_cache.pop(next(iter(self._meta_cache)))
        return manifest, decode_json(blob, "structured metadata")

    def materialize_into(self, spec: StructuredObjectReadSpec,
                         destinations: Optional[Mapping[str, Any]]) -> StructuredObjectResult:
        if not isinstance(spec, StructuredObjectReadSpec):
            raise TypeError("materialize needs a StructuredObjectReadSpec")
        if spec.member_names is not None and not spec.member_names:
            raise ValueError("structured read spec selected no members")
        manifest, metadata = self.resolve(spec.ref)
        buffers = manifest["buffers"]
        names = list(buffers) if spec.member_names is None else list(spec.member_names)
        for name in names:
            if name not in buffers:
                raise KeyError(f"structured object has no member {name!r}")
        specs = field_specs(metadata)
        slices = dict(spec.member_slices)
        destinations = destinations or {}
        objects = self.read_members([(name, buffers[name], specs.get(name, {"encoding": "bytes"}),
                                      slices.get(name), None, destinations.get(name)) for name in names])
        return StructuredObjectResult(metadata=metadata, objects=objects)

    def read_members(self, items: Sequence[tuple]) -> dict[str, Any]:
        """Reads members ``(name, payload, field spec, slice, indices,
        destination)``. The arrays among them that have no destination share
        one fresh buffer (or one pool lease), filled by one store call."""
        out: dict[str, Any] = {}
        batched = []
        for item in items:
            name, payload, field_spec, member_slice, indices, destination = item
            plan = None
            if destination is None and field_spec.get("encoding") == "ndarray":
                plan = self._ndarray_plan(name, payload, field_spec, member_slice, indices)
            if plan is None or len(items) == 1:
                out[name] = self.read_member(*item)
            else:
                batched.append((name, payload, plan))
                out[name] = None
        if batched:
            self._read_batched(batched, out)
        return out

    def _read_batched(self, batched: list, out: dict) -> None:
        offsets, total = [], 0
        for _name, _payload, (dtype, shape, _ranges) in batched:
            offsets.append(total)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            total += (nbytes + 63) // 64 * 64  # each member 64-byte aligned
        pool = self.transport.pool
        if pool is not None and total:
            owner = _PoolLeaseOwner(pool.acquire(total))
            base = _PoolBackedNdarray(owner, np.dtype(np.uint8), (total,))
            ptr = int(owner.lease.ptr)
        else:
            base = _fresh_bytes(total)
            ptr = address(base) if total else 0
        requests = []
        for (name, payload, (dtype, shape, ranges)), offset in zip(batched, offsets):
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            out[name] = base[offset: offset + nbytes].view(dtype).reshape(shape)
            requests.append((payload, shifted(ranges, dst=offset)))
        if total:
            self.transport.read_many(requests, ptr, total)

    def read_member(self, name: str, payload: Mapping[str, Any], field_spec: Mapping[str, Any],
                    member_slice: Optional[StructuredMemberSlice], indices: Optional[Sequence[int]],
                    destination: Any) -> Any:
        encoding = field_spec.get("encoding", "bytes")
        if encoding == "ndarray":
            return self._read_ndarray(name, payload, field_spec, member_slice, indices, destination)
        if encoding == "torch_tensor":
            return self._read_tensor(name, payload, field_spec, member_slice, indices, destination)
        if encoding != "bytes":
            raise ValueError(f"unsupported structured field encoding {encoding!r} for member {name}")
        if member_slice is not None or indices is not None:
            raise ValueError(f"structured member {name} does not support slicing (bytes encoding)")
        if destination is not None:
            raise ValueError(f"structured member {name} does not support destinations (bytes encoding)")
        pool, size = self.transport.pool, int(payload["bytes"])
        if pool is not None and size:
            # Into a lease, as arrays are: the caller gives it back with
            # release_result.
            owner = _PoolLeaseOwner(pool.acquire(size))
            out = _PoolBackedNdarray(owner, np.dtype(np.uint8), (size,))
            self.transport.read_ranges_into(payload, [(0, size, 0)], int(owner.lease.ptr), size)
            return out
        return self.transport.read_bytes(payload)

    # ---- ndarray -------------------------------------------------------------

    def _ndarray_plan(self, name, payload, field_spec, member_slice, indices):
        """(dtype, output shape, ranges) of an ndarray member read."""
        dtype_s, shape = field_spec.get("dtype"), field_spec.get("shape")
        if not isinstance(dtype_s, str) or not isinstance(shape, list):
            raise ValueError(f"structured ndarray field {name} is missing dtype or shape")
        dtype = np.dtype(dtype_s)
        shape = tuple(int(d) for d in shape)
        if dtype.itemsize * int(np.prod(shape, dtype=np.int64)) != int(payload["bytes"]):
            raise ValueError(f"structured ndarray field {name} size does not match its payload")
        if member_slice is None and indices is None:
            return dtype, shape, [(0, int(payload["bytes"]), 0)]
        if not shape:
            raise ValueError(f"structured member {name} is 0-d and does not support slicing")
        positions = row_positions(member_slice, indices, shape[0])
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        return dtype, (len(positions), *shape[1:]), row_ranges(positions, row_bytes)

    def _read_ndarray(self, name, payload, field_spec, member_slice, indices, destination):
        dtype, out_shape, ranges = self._ndarray_plan(name, payload, field_spec, member_slice, indices)
        out, ptr, size, pre = self._ndarray_destination(name, destination, dtype, out_shape)
        if size:
            self.transport.read_ranges_into(payload, ranges, ptr, size, pre_registered=pre)
        return out

    def _ndarray_destination(self, name, destination, dtype, shape):
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if destination is None:
            pool = self.transport.pool
            if pool is not None and nbytes > 0:
                owner = _PoolLeaseOwner(pool.acquire(nbytes))
                out = _PoolBackedNdarray(owner, dtype, shape)
                return out, int(owner.lease.ptr), nbytes, False
            out = _fresh_bytes(nbytes).view(dtype).reshape(shape)
            return out, address(out) if nbytes else 0, nbytes, False
        if isinstance(destination, _RawDestinationBuffer):
            if destination.size < nbytes:
                raise ValueError(f"raw destination for {name} is too small: {destination.size} < {nbytes}")
            return destination, destination.ptr, nbytes, destination.pre_registered
        if _tensors.is_tensor(destination):
            ptr, size = _tensors.tensor_destination(destination, _torch_dtype_of(dtype), shape)
            return destination, ptr, size, False
        if not isinstance(destination, np.ndarray):
            raise TypeError(f"destination for {name} must be an ndarray, tensor or raw_destination")
        if destination.shape != tuple(shape) or destination.dtype != dtype:
            raise ValueError(f"destination shape mismatch for {name}: got {destination.shape} "
                             f"{destination.dtype}, expected {tuple(shape)} {dtype}")
        if not destination.flags.writeable:
            raise ValueError(f"destination for {name} must be writeable")
        if not destination.flags.c_contiguous:
            raise ValueError(f"destination for {name} must be C-contiguous")
        return destination, address(destination), nbytes, False

    # ---- tensors -------------------------------------------------------------

    def _check_tensor_header(self, name, payload, base, field_spec) -> None:
        """Reads the store tensor header in front of a raw tensor member and
        checks it against the member's spec."""
        header = bytearray(base)
        self.transport.read_ranges_into(payload, [(0, base, 0)], address(header), base,
                                        whole_chunk_get=False)
        _check_header(name, bytes(header), field_spec)

    def _read_tensor(self, name, payload, field_spec, member_slice, indices, destination):
        if payload.get("format") == "torch_save":
            if destination is not None:
                raise ValueError(f"torch_save tensor member {name} does not support destinations")
            tensor = _tensors.torch_load_bytes(self.transport.read_bytes(payload))
            positions = row_positions(member_slice, indices, int(tensor.shape[0])) \
                if (member_slice is not None or indices is not None) else None
            return tensor if positions is None else tensor[positions]
        if field_spec.get("nested"):
            if destination is not None:
                raise ValueError(f"nested tensor member {name} does not support destinations")
            rows = _tensors.decode_nested_rows(self.transport.read_bytes(payload), field_spec)
            positions = row_positions(member_slice, indices, len(rows))
            return _tensors.nested_from_rows([rows[i] for i in positions] if positions is not None else rows,
                                             field_spec)
        if isinstance(destination, (_TensorObjectBufferPayload, _RawDestinationBuffer)):
            # Tensor-codec bytes straight into the caller's memory.
            if member_slice is not None or indices is not None:
                raise ValueError(f"structured member {name}: a raw tensor destination takes the whole member")
            size = int(payload["bytes"])
            if destination.size < size:
                raise ValueError(f"destination for {name} is too small: {destination.size} < {size}")
            pre = getattr(destination, "pre_registered", False)
            self.transport.read_ranges_into(payload, [(0, size, 0)], destination.ptr, size,
                                            pre_registered=pre, whole_chunk_get=False)
            if "dtype" in field_spec and payload.get("kind") == "tensor":
                # A tensor the store's tensor calls wrote: header and data.
                return _tensors.tensor_over(destination.ptr, size, destination)
            return destination
        if payload.get("kind") == "tensor" and "data_offset" in payload and "dtype" in field_spec:
            pass  # raw ranges past the store's tensor header, below
        elif payload.get("kind") == "tensor":
            tensor = _tensors.get_tensor(self.transport, payload)
            if member_slice is not None or indices is not None:
                positions = row_positions(member_slice, indices, int(tensor.shape[0]))
                tensor = tensor[positions] if indices is not None else tensor[
                    member_slice.start:member_slice.end:member_slice.step]
                if indices is None and positions is not None and len(positions) != int(tensor.shape[0]):
                    tensor = tensor[: len(positions)]
            if destination is not None:
                _tensors.tensor_destination(destination, tensor.dtype, tuple(tensor.shape))
                destination.copy_(tensor)
                return destination
            return tensor
        torch_dtype = _tensors.parse_dtype(str(field_spec.get("dtype")))
        shape = tuple(int(d) for d in field_spec.get("shape", []))
        base = int(payload.get("data_offset", 0))
        if member_slice is None and indices is None:
            out_shape, ranges = shape, [(base, int(payload["bytes"]) - base, 0)]
        else:
            rows, row_bytes = _tensors.tensor_row_layout(field_spec)
            positions = row_positions(member_slice, indices, rows)
            out_shape = (len(positions), *shape[1:])
            ranges = shifted(row_ranges(positions, row_bytes), src=base)
        if base and payload.get("kind") != "tensor":
            self._check_tensor_header(name, payload, base, field_spec)
        torch = _tensors.torch_module()
        if destination is None:
            out = torch.empty(out_shape, dtype=torch_dtype)
        else:
            out = destination
        ptr, size = _tensors.tensor_destination(out, torch_dtype, out_shape)
        if size:
            self.transport.read_ranges_into(payload, ranges, ptr, size)
        return out


class _Recycler:
    """Read buffers that come back when the arrays over them are gone.

    A fresh buffer costs a page fault per 4 KiB page on its first write,
    which is most of a read's time; a buffer whose arrays were collected
    is handed out again instead (up to ``limit`` bytes kept)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.free: dict[int, list] = {}
        self.kept = 0
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        if nbytes < _RECYCLE_MIN:
            return np.empty(nbytes, dtype=np.uint8)
        size = -(-nbytes // _RECYCLE_STEP) * _RECYCLE_STEP
        with self.lock:
            spare = self.free.get(size)
            raw = spare.pop() if spare else None
            if raw is not None:
                self.kept -= size
        if raw is None:
            raw = bytearray(size)  # zeroed, so already faulted in
        out = np.frombuffer(memoryview(raw), dtype=np.uint8)
        weakref.finalize(out, self._give_back, raw, size)
        return out[:nbytes]

    def _give_back(self, raw: bytearray, size: int) -> None:
        with self.lock:
            if self.kept + size <= self.limit:
                self.free.setdefault(size, []).append(raw)
                self.kept += size


_RECYCLE_MIN = 1 << 20
_RECYCLE_STEP = 1 << 20
_RECYCLER = _Recycler(512 << 20)


def _check_header(name: str, header: bytes, field_spec: Mapping[str, Any]) -> None:
    """Checks a store tensor header against the member's spec (the data
    after it is not read here)."""
    from .. import _tensor

    try:
        magic, _v, size, dtype, ndim, _layout, offset, nbytes = _tensor._HEAD.unpack_from(header, 0)
        shape = list(_tensor._SHAPE.unpack_from(header, _tensor._LOCAL_SHAPE_AT)[:ndim])
        dtype_name = _tensor.DTYPES[dtype][0]
    except Exception:
        raise ValueError(f"structured tensor member {name} has a corrupt header") from None
    if magic != _tensor._MAGIC or size != len(header) or offset != len(header):
        raise ValueError(f"structured tensor member {name} has a corrupt header")
    if f"torch.{dtype_name}" != field_spec.get("dtype") or shape != list(field_spec.get("shape", [])):
        raise ValueError(f"structured tensor member {name}: its header says {dtype_name} {shape}, "
                         f"the object's metadata {field_spec.get('dtype')} {field_spec.get('shape')}")


def _fresh_bytes(nbytes: int) -> np.ndarray:
    """A uint8 buffer for a read's results (recycled where possible)."""
    return _RECYCLER.take(nbytes)


def _torch_dtype_of(dtype: np.dtype) -> Any:
    torch = _tensors.torch_module()
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def copy_bytes_into(data: bytes, ptr: int) -> None:
    ctypes.memmove(ptr, data, len(data))
