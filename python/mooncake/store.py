"""``mooncake.store``: the distributed KV-cache store client.

:class:`MooncakeDistributedStore` joins a cluster run by ``mooncake_master``
(``setup``), or talks to a ``mooncake_client`` on this host (``setup_dummy``),
and stores objects as bytes. The tensor calls (``put_tensor``,
``get_tensor``, ``*_with_tp``, ``*_with_parallelism`` with
:class:`ParallelAxis`, :class:`TensorParallelism` and :class:`ReadTarget`,
...) need PyTorch and store ``[TensorMetadata][tensor bytes]`` in the
reference's layout.
"""

from __future__ import annotations

import logging
import os
from typing import List, Optional

from . import _tensor
from ._parallel import ParallelAxis, ParallelTensorCalls, ReadTarget, TensorParallelism
from ._mooncake import (
    BufferHandle,
    Descriptor,
    DiskDescriptor,
    EngramStore,
    EngramStoreConfig,
    MemoryDescriptor,
    ObjectDataType,
    QueryTaskResponse,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    TaskStatus,
    TaskType,
)
from ._mooncake import MooncakeDistributedStore as _Store
from ._mooncake import MooncakeHostMemAllocator, bind_to_numa_node
from .buffer_pool import BufferLease, BufferPool, RegisteredBufferLease, RegisteredBufferPool

INVALID_PARAMS = -600

__all__ = [
    "BufferHandle",
    "BufferLease",
    "BufferPool",
    "Descriptor",
    "DiskDescriptor",
    "EngramStore",
    "EngramStoreConfig",
    "MemoryDescriptor",
    "MooncakeDistributedStore",
    "MooncakeHostMemAllocator",
    "ObjectDataType",
    "ParallelAxis",
    "QueryTaskResponse",
    "ReadTarget",
    "RegisteredBufferLease",
    "RegisteredBufferPool",
    "ReplicaDescriptor",
    "ReplicaStatus",
    "ReplicateConfig",
    "SoftPinAction",
    "TaskStatus",
    "TaskType",
    "TensorParallelism",
    "bind_to_numa_node",
]

# The reference also exports enum members at module level.
for _enum in (ReplicaStatus, ObjectDataType, TaskStatus, TaskType):
    for _name, _member in _enum.__members__.items():
        globals().setdefault(_name, _member)
del _enum, _name, _member


FILE_NOT_FOUND = -1100
_REQUIRED = object()

_log = logging.getLogger("mooncake.store")


def _shard_key(key: str, tp_rank: int, tp_size: int) -> str:
    """Where a rank's shard lives: ``key_tp_{rank}``, or ``key`` itself when
    ``tp_size <= 1`` (no split), as in the reference."""
    return key if tp_size <= 1 else _tensor.shard_key(key, tp_rank)


class MooncakeDistributedStore(ParallelTensorCalls, _Store):
    """A Mooncake Store client. The byte calls are implemented in Rust; the
    tensor calls below (and the unified parallel tensor calls of
    :class:`~mooncake._parallel.ParallelTensorCalls`) are built on them."""

    __slots__ = ()

    # ---- tensors: put ---------------------------------------------------------

    def _put_tensors(self, keys, tensors, config=None, upsert=False) -> List[int]:
        if len(keys) != len(tensors):
            return [INVALID_PARAMS] * len(keys)
        torch = _tensor.loaded_torch()
        codes = [INVALID_PARAMS] * len(keys)
        todo, parts, keep = [], [], []
        for i, tensor in enumerate(tensors):
            src = _tensor.from_tensor(torch, tensor)
            if src is None:
                continue
            keep.append(src)
            todo.append(i)
            parts.append([_tensor.encode(src.dtype, src.shape), src.data])
        if todo:
            for i, c in zip(todo, self._batch_put_parts([keys[i] for i in todo], parts, config, upsert)):
                codes[i] = c
        return codes

    def put_tensor(self, key: str, tensor) -> int:
        """Stores a tensor (any dtype torch and the reference share); 0 or a code."""
        return self._put_tensors([key], [tensor])[0]

    def pub_tensor(self, key: str, tensor, config: Optional[ReplicateConfig] = None) -> int:
        return self._put_tensors([key], [tensor], config)[0]

    def upsert_tensor(self, key: str, tensor) -> int:
        return self._put_tensors([key], [tensor], upsert=True)[0]

    def upsert_pub_tensor(self, key: str, tensor, config: Optional[ReplicateConfig] = None) -> int:
        return self._put_tensors([key], [tensor], config, upsert=True)[0]

    def batch_put_tensor(self, keys: List[str], tensors_list: list) -> List[int]:
        return self._put_tensors(list(keys), list(tensors_list))

    def batch_pub_tensor(self, keys: List[str], tensors_list: list, config: Optional[ReplicateConfig] = None) -> List[int]:
        return self._put_tensors(list(keys), list(tensors_list), config)

    def batch_upsert_tensor(self, keys: List[str], tensors_list: list) -> List[int]:
        return self._put_tensors(list(keys), list(tensors_list), upsert=True)

    def batch_upsert_pub_tensor(self, keys: List[str], tensors_list: list, config: Optional[ReplicateConfig] = None) -> List[int]:
        return self._put_tensors(list(keys), list(tensors_list), config, upsert=True)

    # ---- tensors: get ---------------------------------------------------------
    # Missing keys and bytes that are not a tensor give None without torch;
    # torch is imported only to build a tensor.

    def _decode(self, handle):
        if handle is None:
            return None
        meta = _tensor.decode(memoryview(handle))
        if meta is None:
            return None
        return _tensor.to_tensor(_tensor.torch_module(), meta, handle)

    def get_tensor(self, key: str):
        """The tensor stored under ``key`` (a copy this call owns), or None."""
        return self._decode(self._get_owned(key))

    def batch_get_tensor(self, keys: List[str]) -> list:
        return [self._decode(h) for h in self._batch_get_owned(list(keys))]

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int):
        """Reads the object into the registered buffer and returns a tensor
        over that memory (no copy), or None."""
        return self._into(self.get_into(key, buffer_ptr, size), buffer_ptr)

    def batch_get_tensor_into(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> list:
        """One tensor (or None) per key; when the lists differ in length or a
        pointer is null, INVALID_PARAMS for every key, as in the reference."""
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if not (len(keys) == len(buffer_ptrs) == len(sizes)) or 0 in buffer_ptrs:
            return [INVALID_PARAMS] * len(keys)
        got = self.batch_get_into(keys, buffer_ptrs, sizes)
        return [self._into(n, p) for n, p in zip(got, buffer_ptrs)]

    def _into(self, n: int, ptr: int):
        if n <= 0:
            return None
        view = _tensor.memory_at(ptr, n)
        meta = _tensor.decode(view)
        return None if meta is None else _tensor.to_tensor(_tensor.torch_module(), meta, view)

    # ---- tensors: zero-copy puts of serialized buffers ----------------------------

    def _put_serialized(self, keys, ptrs, sizes, upsert) -> List[int]:
        """Stores buffers laid out as ``[TensorMetadata][data]``. One bad
        buffer fails the whole batch (INVALID_PARAMS for every key), as in the
        reference."""
        if not (len(keys) == len(ptrs) == len(sizes)):
            return [INVALID_PARAMS] * len(keys)
        if not keys:
            return []
        if any(self._serialized_meta(p, n) is None for p, n in zip(ptrs, sizes)):
            return [INVALID_PARAMS] * len(keys)
        call = self.batch_upsert_from if upsert else self.batch_put_from
        return call(keys, ptrs, sizes)

    def _serialized_meta(self, ptr: int, size: int):
        """The header of a serialized tensor at ``ptr`` (``size`` bytes),
        after checking the memory is this process's."""
        if size < _tensor.HEADER_SIZE or not self._readable(ptr, size):
            return None
        meta = _tensor.decode(_tensor.memory_at(ptr, size))
        if meta is None or meta.data_offset + meta.data_bytes != size:
            return None
        return meta

    def _readable(self, ptr: int, size: int) -> bool:
        from ._mooncake import _readable

        return _readable(ptr, size)

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Stores a buffer laid out as ``[TensorMetadata][tensor data]``."""
        return self._put_serialized([key], [buffer_ptr], [size], False)[0]

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._put_serialized([key], [buffer_ptr], [size], True)[0]

    def batch_put_tensor_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[int]:
        return self._put_serialized(list(keys), list(buffer_ptrs), list(sizes), False)

    def batch_upsert_tensor_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[int]:
        return self._put_serialized(list(keys), list(buffer_ptrs), list(sizes), True)

    # ---- tensors: tensor parallelism ----------------------------------------------
    # ``tp_size <= 1`` means no split: the whole tensor under ``key``, as in the
    # reference. ``tp_rank`` of the put calls is accepted for compatibility:
    # every rank's shard is stored.

    def _put_shards(self, keys, sources, config, tp_size, split_dim) -> List[int]:
        """Stores each source (dtype, shape, bytes) split into ``tp_size``
        uniform shards under ``key_tp_{rank}``."""
        codes = [0] * len(keys)
        todo_keys, todo_parts, owners = [], [], []
        for i, (key, src) in enumerate(zip(keys, sources)):
            if src is None:
                codes[i] = INVALID_PARAMS
                continue
            meta = _tensor.Meta(src[0], tuple(src[1]), 0, len(src[2]))
            shards = _tensor.split(meta, src[2], tp_size, split_dim)
            if shards is None:
                codes[i] = INVALID_PARAMS
                continue
            for rank, (shape, pieces) in enumerate(shards):
                header = _tensor.encode(meta.dtype, shape, global_shape=meta.shape, shard=(rank, tp_size, split_dim))
                todo_keys.append(_tensor.shard_key(key, rank))
                todo_parts.append([header, *pieces])
                owners.append(i)
        self._put_owned(todo_keys, todo_parts, owners, codes, config, False)
        return codes

    def _put_owned(self, keys, parts, owners, codes, config, upsert) -> None:
        """Writes objects that belong to callers' entries (``owners[j]`` is the
        entry of ``keys[j]``); an entry keeps the first error of its objects."""
        if keys:
            for i, c in zip(owners, self._batch_put_parts(keys, parts, config, upsert)):
                if c != 0 and codes[i] == 0:
                    codes[i] = c

    def _tensor_sources(self, tensors):
        torch = _tensor.loaded_torch()
        out, keep = [], []
        for t in tensors:
            src = _tensor.from_tensor(torch, t)
            keep.append(src)
            out.append(None if src is None else (src.dtype, src.shape, src.data))
        return out, keep

    def put_tensor_with_tp(self, key: str, tensor, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> int:
        """Splits the tensor into ``tp_size`` uniform shards along
        ``split_dim`` and stores every shard as ``key_tp_{rank}``."""
        return self.pub_tensor_with_tp(key, tensor, None, tp_rank, tp_size, split_dim)

    def pub_tensor_with_tp(self, key: str, tensor, config: Optional[ReplicateConfig] = None, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> int:
        if tp_size <= 1:
            return self._put_tensors([key], [tensor], config)[0]
        src, _keep = self._tensor_sources([tensor])
        return self._put_shards([key], src, config, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp(self, base_keys: List[str], tensors_list: list, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> List[int]:
        return self.batch_pub_tensor_with_tp(base_keys, tensors_list, None, tp_rank, tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys: List[str], tensors_list: list, config: Optional[ReplicateConfig] = None, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> List[int]:
        base_keys, tensors_list = list(base_keys), list(tensors_list)
        if tp_size <= 1:
            return self._put_tensors(base_keys, tensors_list, config)
        if len(base_keys) != len(tensors_list):
            return [INVALID_PARAMS] * len(base_keys)
        src, _keep = self._tensor_sources(tensors_list)
        return self._put_shards(base_keys, src, config, tp_size, split_dim)

    def _serialized_sources(self, ptrs, sizes):
        out = []
        for p, s in zip(ptrs, sizes):
            meta = self._serialized_meta(p, s)
            if meta is None:
                out.append(None)
            else:
                data = _tensor.memory_at(p, s)[meta.data_offset : meta.data_offset + meta.data_bytes]
                out.append((meta.dtype, meta.shape, data))
        return out

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> int:
        """Like ``put_tensor_with_tp`` for a full tensor serialized in a buffer."""
        if tp_size <= 1:
            return self.put_tensor_from(key, buffer_ptr, size)
        return self._put_shards([key], self._serialized_sources([buffer_ptr], [size]), None, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp_from(self, base_keys: List[str], buffer_ptrs: List[int], sizes: List[int], tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> List[int]:
        base_keys, buffer_ptrs, sizes = list(base_keys), list(buffer_ptrs), list(sizes)
        if tp_size <= 1:
            return self.batch_put_tensor_from(base_keys, buffer_ptrs, sizes)
        if not (len(base_keys) == len(buffer_ptrs) == len(sizes)):
            return [INVALID_PARAMS] * len(base_keys)
        return self._put_shards(base_keys, self._serialized_sources(buffer_ptrs, sizes), None, tp_size, split_dim)

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0):
        """This rank's shard (``key_tp_{tp_rank}``), or the whole tensor when
        ``tp_size <= 1``; None when missing."""
        return self.get_tensor(_shard_key(key, tp_rank, tp_size))

    def batch_get_tensor_with_tp(self, base_keys: List[str], tp_rank: int = 0, tp_size: int = 1) -> list:
        return self.batch_get_tensor([_shard_key(k, tp_rank, tp_size) for k in base_keys])

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0):
        return self.get_tensor_into(_shard_key(key, tp_rank, tp_size), buffer_ptr, size)

    def batch_get_tensor_with_tp_into(self, base_keys: List[str], buffer_ptrs: List[int], sizes: List[int], tp_rank: int = 0, tp_size: int = 1) -> list:
        return self.batch_get_tensor_into([_shard_key(k, tp_rank, tp_size) for k in base_keys], buffer_ptrs, sizes)

    # ---- safetensors ------------------------------------------------------------
    # As in the reference, these answer with codes / None, not exceptions:
    # torch and safetensors are needed only once there is a tensor to write or
    # a file to read.

    def save_tensor_to_safetensor(self, key: str, file_name: Optional[str] = None) -> int:
        """Writes the tensor under ``key`` to a safetensors file (named
        ``key`` by default) holding it under the name ``key``. 0; -1100
        (FILE_NOT_FOUND) when ``key`` holds no tensor; -600 when the file
        cannot be written or torch or safetensors is not installed."""
        try:
            tensor = self.get_tensor(key)
        except ImportError as e:
            _log.error("save_tensor_to_safetensor(%r): %s", key, e)
            return INVALID_PARAMS
        if tensor is None:
            return FILE_NOT_FOUND
        try:
            from safetensors.torch import save_file

            save_file({key: tensor.contiguous()}, key if file_name is None else file_name)
        except Exception as e:  # the reference answers every failure with a code
            _log.error("save_tensor_to_safetensor(%r): %s: %s", key, type(e).__name__, e)
            return INVALID_PARAMS
        return 0

    def load_tensor_from_safetensor(self, key: Optional[str] = None, file_name: str = _REQUIRED):
        """Stores a tensor of a safetensors file under ``key`` (default: the
        file name) and returns it; None when the file cannot be read, holds no
        tensor or the put fails. The file's entry named ``key`` is taken, else
        its first entry. ``file_name`` is required (by keyword after a
        default ``key``)."""
        if file_name is _REQUIRED:
            raise TypeError("load_tensor_from_safetensor() missing required argument 'file_name'")
        if not file_name or not os.path.isfile(file_name):
            return None
        try:
            from safetensors.torch import load_file

            tensors = load_file(file_name)
        except Exception as e:
            _log.error("load_tensor_from_safetensor(%r): %s: %s", file_name, type(e).__name__, e)
            return None
        if not tensors:
            return None
        name = file_name if key is None else key
        tensor = tensors[key] if key is not None and key in tensors else next(iter(tensors.values()))
        return tensor if self.put_tensor(name, tensor) == 0 else None


def _serialize_tensor(tensor):
    """The store's encoding of ``tensor`` in two parts, as the reference's
    private helper of that name gives it (the structured-object layer writes
    the parts into one buffer): the header bytes, the address and size of
    the data, and the object that keeps the data alive."""
    src = _tensor.from_tensor(_tensor.torch_module(), tensor)
    if src is None:
        raise TypeError(f"cannot serialize {type(tensor).__name__} as a store tensor")
    return _tensor.encode(src.dtype, src.shape), src.owner.data_ptr(), len(src.data), src.owner


def _deserialize_tensor(payload):
    """The tensor a store encoding (header and data) holds, as a copy."""
    buf = bytearray(payload)
    meta = _tensor.decode(memoryview(buf))
    if meta is None:
        raise ValueError("payload is not a store-encoded tensor")
    return _tensor.to_tensor(_tensor.torch_module(), meta, buf)
