"""Tensor (de)serialization for the tensor calls of ``MooncakeDistributedStore``.

An object holding a tensor is ``[TensorMetadata][tensor bytes]`` in the
reference's layout (version 1): a 304-byte little-endian header, then the
elements in C order. Shards written by the ``*_with_tp`` calls carry the full
tensor's shape and the shard's place in the split as well.

Everything here works on ``memoryview`` s; torch is needed only to turn a
tensor into bytes or bytes into a tensor (:func:`torch_module`).
"""

from __future__ import annotations

import ctypes
import struct
import sys
from math import prod
from typing import Any, NamedTuple, Optional, Sequence

HEADER_SIZE = 304
MAX_DIMS = 8

_MAGIC = b"NOOM"
_VERSION = 1
# magic, version, header size, dtype, ndim, layout, data offset, data bytes
_HEAD = struct.Struct("<4sHHiiQQQ")
_SHAPE = struct.Struct("<8q")
_GLOBAL_SHAPE_AT = 40
_LOCAL_SHAPE_AT = 104
_AXES_AT = 168
# axis count (u32 + padding), then up to four axes: kind, index in the
# caller's list, rank, size, split dim (-1: none), expert/stage id, shard
# extent along the split dim
_AXIS_COUNT = struct.Struct("<Q")
_AXIS = struct.Struct("<iiiiiiq")
MAX_AXES = 4
# The axis kinds the header and the shard keys know, by their header codes.
AXIS_KINDS = {"dp": 0, "tp": 1, "ep": 2, "pp": 3}

# A shard manifest: magic, version, size, dtype, ndim, split dim, shard
# count, two reserved words, then the full tensor's shape.
_MANIFEST = struct.Struct("<4sHHiiiiii")
_MANIFEST_MAGIC = b"NAMW"
MANIFEST_SIZE = 96

LAYOUT_WHOLE = 0
LAYOUT_SHARD = 1

# The reference's dtype numbers: code -> (torch attribute name, item size).
DTYPES = {
    0: ("float32", 4),
    1: ("float64", 8),
    2: ("int8", 1),
    3: ("uint8", 1),
    4: ("int16", 2),
    5: ("uint16", 2),
    6: ("int32", 4),
    7: ("uint32", 4),
    8: ("int64", 8),
    9: ("uint64", 8),
    10: ("bool", 1),
    11: ("float16", 2),
    12: ("bfloat16", 2),
    13: ("float8_e4m3fn", 1),
    14: ("float8_e5m2", 1),
}
CODES = {name: code for code, (name, _) in DTYPES.items()}
CODES["half"] = CODES["float16"]
CODES["float"] = CODES["float32"]
CODES["double"] = CODES["float64"]


class Meta(NamedTuple):
    """What a header says about the bytes after it."""

    dtype: int
    shape: tuple
    data_offset: int
    data_bytes: int


def loaded_torch():
    """The ``torch`` module if this process has imported it, else None.

    Without torch imported no object can be a tensor, so the put calls answer
    INVALID_PARAMS for anything they are given, as the reference does, instead
    of importing torch (seconds) or demanding it."""
    return sys.modules.get("torch")


def torch_module():
    """The ``torch`` module, for building a tensor out of stored bytes; a clear
    ``ImportError`` when it is missing."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "mooncake tensor calls need PyTorch, which is not installed "
            "(pip install torch); the byte calls (put/get/put_from/...) work without it"
        ) from e
    return torch


def _shape_array(shape: Sequence[int]) -> bytes:
    return _SHAPE.pack(*shape, *([-1] * (MAX_DIMS - len(shape))))


def encode(
    dtype: int,
    shape: Sequence[int],
    global_shape: Optional[Sequence[int]] = None,
    shard: Optional[tuple] = None,
    axes: Optional[Sequence[tuple]] = None,
) -> bytes:
    """The header for a tensor of ``dtype`` and ``shape`` (``()`` for a 0-d
    tensor: ndim 0, one element). For a TP shard pass the full tensor's
    ``global_shape`` and ``shard = (rank, size, split_dim)``; for any other
    shard the layout ``axes``, each ``(kind, rank, size, split_dim, tag)``
    (``split_dim`` -1 when the axis does not split, ``tag`` the expert or
    stage id or 0). A header with axes has the shard layout."""
    shape = tuple(shape)
    if shard is not None:
        rank, size, split_dim = shard
        axes = [(AXIS_KINDS["tp"], rank, size, split_dim, 0)]
    nbytes = prod(shape) * DTYPES[dtype][1]
    out = bytearray(HEADER_SIZE)
    layout = LAYOUT_SHARD if axes else LAYOUT_WHOLE
    _HEAD.pack_into(out, 0, _MAGIC, _VERSION, HEADER_SIZE, dtype, len(shape), layout, HEADER_SIZE, nbytes)
    out[_GLOBAL_SHAPE_AT : _GLOBAL_SHAPE_AT + _SHAPE.size] = _shape_array(global_shape or shape)
    out[_LOCAL_SHAPE_AT : _LOCAL_SHAPE_AT + _SHAPE.size] = _shape_array(shape)
    if axes:
        _AXIS_COUNT.pack_into(out, _AXES_AT, len(axes))
        for index, (kind, rank, size, split_dim, tag) in enumerate(axes):
            # A splitting axis records the shard's extent along its dimension.
            extent = shape[split_dim] if split_dim >= 0 else 0
            _AXIS.pack_into(out, _AXES_AT + 8 + index * _AXIS.size, kind, index, rank, size, split_dim, tag, extent)
    return bytes(out)


def layout_of(buf: memoryview):
    """``(global shape, axes)`` of a header that :func:`decode` accepted:
    the axes as ``(kind, rank, size, split_dim, tag)``."""
    ndim = _HEAD.unpack_from(buf, 0)[4]
    global_shape = tuple(_SHAPE.unpack_from(buf, _GLOBAL_SHAPE_AT)[:ndim])
    count = min(struct.unpack_from("<I", buf, _AXES_AT)[0], MAX_AXES)
    axes = []
    for i in range(count):
        kind, _index, rank, size, split_dim, tag, _extent = _AXIS.unpack_from(buf, _AXES_AT + 8 + i * _AXIS.size)
        axes.append((kind, rank, size, split_dim, tag))
    return global_shape, axes


def encode_manifest(dtype: int, global_shape: Sequence[int], split_dim: int, size: int) -> bytes:
    """The manifest of a tensor stored as ``size`` uniform shards along
    ``split_dim``: what a reader needs to put the full tensor back together
    (or cut it another way) without reading a shard first."""
    out = bytearray(MANIFEST_SIZE)
    _MANIFEST.pack_into(out, 0, _MANIFEST_MAGIC, _VERSION, MANIFEST_SIZE, dtype, len(global_shape), split_dim, size, 0, 0)
    out[_MANIFEST.size :] = _shape_array(global_shape)
    return bytes(out)


def decode_manifest(buf) -> Optional[tuple]:
    """``(dtype, global shape, split_dim, size)`` of a manifest, or None when
    the bytes are not one."""
    buf = memoryview(buf)
    if len(buf) < MANIFEST_SIZE:
        return None
    magic, version, size_field, dtype, ndim, split_dim, size, _r0, _r1 = _MANIFEST.unpack_from(buf, 0)
    if magic != _MANIFEST_MAGIC or version != _VERSION or size_field != MANIFEST_SIZE:
        return None
    if dtype not in DTYPES or not 0 < ndim <= MAX_DIMS or not 0 <= split_dim < ndim or size < 1:
        return None
    shape = tuple(_SHAPE.unpack_from(buf, _MANIFEST.size)[:ndim])
    if any(d < 0 for d in shape) or shape[split_dim] % size:
        return None
    return dtype, shape, split_dim, size


def decode(buf: memoryview) -> Optional[Meta]:
    """Parses and checks the header at the start of ``buf``; None when it is
    not a complete tensor object."""
    if len(buf) < HEADER_SIZE:
        return None
    magic, version, header_size, dtype, ndim, _layout, offset, nbytes = _HEAD.unpack_from(buf, 0)
    if magic != _MAGIC or version != _VERSION or header_size != HEADER_SIZE:
        return None
    if dtype not in DTYPES or not 0 <= ndim <= MAX_DIMS:
        return None
    shape = _SHAPE.unpack_from(buf, _LOCAL_SHAPE_AT)[:ndim]
    if any(d < 0 for d in shape) or prod(shape) * DTYPES[dtype][1] != nbytes:
        return None
    if offset < HEADER_SIZE or offset + nbytes > len(buf):
        return None
    return Meta(dtype, tuple(shape), offset, nbytes)


def split(meta: Meta, data: memoryview, tp_size: int, split_dim: int):
    """Uniform TP shards of a tensor: for each rank, its shape and the byte
    pieces (views into ``data``, no copy) that make up its C-order bytes.
    None when the split is not uniform or ``split_dim`` is out of range."""
    shape = meta.shape
    if tp_size < 1 or not 0 <= split_dim < len(shape) or shape[split_dim] % tp_size:
        return None
    chunk = shape[split_dim] // tp_size
    inner = prod(shape[split_dim + 1 :]) * DTYPES[meta.dtype][1]
    outer = prod(shape[:split_dim])
    row = shape[split_dim] * inner
    piece = chunk * inner
    shard_shape = shape[:split_dim] + (chunk,) + shape[split_dim + 1 :]
    shards = []
    for rank in range(tp_size):
        start = rank * piece
        if split_dim == 0:
            pieces = [data[start : start + piece]]
        else:
            pieces = [data[o * row + start : o * row + start + piece] for o in range(outer)]
        shards.append((shard_shape, pieces))
    return shards


def shard_key(key: str, rank: int) -> str:
    return f"{key}_tp_{rank}"


def memory_at(ptr: int, size: int) -> memoryview:
    """A writable view of ``size`` bytes at address ``ptr`` (which the caller
    vouches for: memory the store just validated or wrote)."""
    if size == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_ubyte * size).from_address(ptr)).cast("B")


class Source(NamedTuple):
    """A tensor's bytes, borrowed: keep ``owner`` alive while using ``data``."""

    dtype: int
    shape: tuple
    data: memoryview
    owner: Any


def from_tensor(torch, tensor) -> Optional[Source]:
    """The bytes of a CPU copy of ``tensor`` in C order, without copying when
    it is already a contiguous CPU tensor. None for a non-tensor (always, when
    ``torch`` is None), an unsupported dtype, more than 8 dimensions or a
    tensor without plain strided data (sparse, ``meta``)."""
    if torch is None or not isinstance(tensor, torch.Tensor):
        return None
    code = CODES.get(str(tensor.dtype).rsplit(".", 1)[-1])
    if code is None:
        return None
    try:
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    shape = tuple(t.shape)
    if len(shape) > MAX_DIMS:
        return None
    nbytes = t.numel() * t.element_size()
    return Source(code, shape, memory_at(t.data_ptr(), nbytes), t)


def to_tensor(torch, meta: Meta, buf, offset: int = 0):
    """A tensor over ``meta.data_bytes`` bytes of ``buf`` at ``offset +
    meta.data_offset`` (sharing, not copying, the memory; the tensor keeps
    ``buf`` alive)."""
    dtype = getattr(torch, DTYPES[meta.dtype][0])
    # A 0-d tensor comes back with shape (1,), as from the reference.
    shape = meta.shape or (1,)
    count = prod(shape)
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype, count=count, offset=offset + meta.data_offset).reshape(shape)
