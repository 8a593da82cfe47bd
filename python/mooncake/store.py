"""``mooncake.store``: the distributed KV-cache store client.

:class:`MooncakeDistributedStore` joins a cluster run by ``mooncake_master``
(``setup``), or talks to a ``mooncake_client`` on this host (``setup_dummy``),
and stores objects as bytes. The tensor calls (``put_tensor``,
``get_tensor``, ``*_with_tp``, ...) need PyTorch and store
``[TensorMetadata][tensor bytes]`` in the reference's layout.
"""

from __future__ import annotations

import os
from typing import List, Optional

from . import _tensor
from ._mooncake import (
    BufferHandle,
    Descriptor,
    DiskDescriptor,
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

INVALID_PARAMS = -600

__all__ = [
    "BufferHandle",
    "Descriptor",
    "DiskDescriptor",
    "MemoryDescriptor",
    "MooncakeDistributedStore",
    "MooncakeHostMemAllocator",
    "ObjectDataType",
    "QueryTaskResponse",
    "ReplicaDescriptor",
    "ReplicaStatus",
    "ReplicateConfig",
    "SoftPinAction",
    "TaskStatus",
    "TaskType",
    "bind_to_numa_node",
]

# The reference also exports enum members at module level.
for _enum in (ReplicaStatus, ObjectDataType, TaskStatus, TaskType):
    for _name, _member in _enum.__members__.items():
        globals().setdefault(_name, _member)
del _enum, _name, _member


def _tp_valid(tp_rank: int, tp_size: int) -> bool:
    return tp_size >= 1 and 0 <= tp_rank < tp_size


class MooncakeDistributedStore(_Store):
    """A Mooncake Store client. The byte calls are implemented in Rust; the
    tensor calls below are built on them."""

    __slots__ = ()

    # ---- tensors: put ---------------------------------------------------------

    def _put_tensors(self, keys, tensors, config=None, upsert=False) -> List[int]:
        torch = _tensor.torch_module()
        if len(keys) != len(tensors):
            return [INVALID_PARAMS] * len(keys)
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

    def _decode(self, torch, handle):
        if handle is None:
            return None
        meta = _tensor.decode(memoryview(handle))
        if meta is None:
            return None
        return _tensor.to_tensor(torch, meta, handle)

    def get_tensor(self, key: str):
        """The tensor stored under ``key``, or None."""
        torch = _tensor.torch_module()
        return self._decode(torch, self._get_owned(key))

    def batch_get_tensor(self, keys: List[str]) -> list:
        torch = _tensor.torch_module()
        return [self._decode(torch, h) for h in self._batch_get_owned(list(keys))]

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int):
        """Reads the object into the registered buffer and returns a tensor
        over that memory (no copy), or None."""
        torch = _tensor.torch_module()
        return self._into(torch, self.get_into(key, buffer_ptr, size), buffer_ptr)

    def batch_get_tensor_into(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> list:
        torch = _tensor.torch_module()
        got = self.batch_get_into(list(keys), list(buffer_ptrs), list(sizes))
        return [self._into(torch, n, p) for n, p in zip(got, buffer_ptrs)]

    def _into(self, torch, n: int, ptr: int):
        if n <= 0:
            return None
        view = _tensor.memory_at(ptr, n)
        meta = _tensor.decode(view)
        return None if meta is None else _tensor.to_tensor(torch, meta, view)

    # ---- tensors: zero-copy puts of serialized buffers ----------------------------

    def _put_serialized(self, keys, ptrs, sizes, upsert) -> List[int]:
        if not (len(keys) == len(ptrs) == len(sizes)):
            return [INVALID_PARAMS] * len(keys)
        ok = [self._serialized_meta(p, s) is not None for p, s in zip(ptrs, sizes)]
        codes = [0 if k else INVALID_PARAMS for k in ok]
        idx = [i for i, k in enumerate(ok) if k]
        if idx:
            call = self.batch_upsert_from if upsert else self.batch_put_from
            for i, c in zip(idx, call([keys[i] for i in idx], [ptrs[i] for i in idx], [sizes[i] for i in idx])):
                codes[i] = c
        return codes

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

    def _put_shards(self, keys, sources, config, tp_size, split_dim) -> List[int]:
        """Stores each source (dtype, shape, bytes) split into ``tp_size``
        uniform shards under ``key_tp_{rank}``; ``tp_size == 1`` stores the
        whole tensor under ``key``."""
        codes = [0] * len(keys)
        todo_keys, todo_parts, owners = [], [], []
        for i, (key, src) in enumerate(zip(keys, sources)):
            if src is None or tp_size < 1:
                codes[i] = INVALID_PARAMS
                continue
            meta = _tensor.Meta(src[0], tuple(src[1]), 0, len(src[2]))
            if tp_size == 1:
                todo_keys.append(key)
                todo_parts.append([_tensor.encode(meta.dtype, meta.shape), src[2]])
                owners.append(i)
                continue
            shards = _tensor.split(meta, src[2], tp_size, split_dim)
            if shards is None:
                codes[i] = INVALID_PARAMS
                continue
            for rank, (shape, pieces) in enumerate(shards):
                header = _tensor.encode(meta.dtype, shape, global_shape=meta.shape, shard=(rank, tp_size, split_dim))
                todo_keys.append(_tensor.shard_key(key, rank))
                todo_parts.append([header, *pieces])
                owners.append(i)
        if todo_keys:
            for i, c in zip(owners, self._batch_put_parts(todo_keys, todo_parts, config, False)):
                if c != 0 and codes[i] == 0:
                    codes[i] = c
        return codes

    def _tensor_sources(self, tensors):
        torch = _tensor.torch_module()
        out, keep = [], []
        for t in tensors:
            src = _tensor.from_tensor(torch, t)
            keep.append(src)
            out.append(None if src is None else (src.dtype, src.shape, src.data))
        return out, keep

    def put_tensor_with_tp(self, key: str, tensor, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> int:
        """Splits the tensor into ``tp_size`` uniform shards along
        ``split_dim`` and stores every shard as ``key_tp_{rank}``
        (``tp_rank`` is accepted for compatibility)."""
        src, _keep = self._tensor_sources([tensor])
        return self._put_shards([key], src, None, tp_size, split_dim)[0]

    def pub_tensor_with_tp(self, key: str, tensor, config: Optional[ReplicateConfig] = None, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> int:
        src, _keep = self._tensor_sources([tensor])
        return self._put_shards([key], src, config, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp(self, base_keys: List[str], tensors_list: list, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> List[int]:
        if len(base_keys) != len(tensors_list):
            return [INVALID_PARAMS] * len(base_keys)
        src, _keep = self._tensor_sources(tensors_list)
        return self._put_shards(list(base_keys), src, None, tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys: List[str], tensors_list: list, config: Optional[ReplicateConfig] = None, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> List[int]:
        if len(base_keys) != len(tensors_list):
            return [INVALID_PARAMS] * len(base_keys)
        src, _keep = self._tensor_sources(tensors_list)
        return self._put_shards(list(base_keys), src, config, tp_size, split_dim)

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
        return self._put_shards([key], self._serialized_sources([buffer_ptr], [size]), None, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp_from(self, base_keys: List[str], buffer_ptrs: List[int], sizes: List[int], tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> List[int]:
        if not (len(base_keys) == len(buffer_ptrs) == len(sizes)):
            return [INVALID_PARAMS] * len(base_keys)
        return self._put_shards(list(base_keys), self._serialized_sources(buffer_ptrs, sizes), None, tp_size, split_dim)

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0):
        """This rank's shard (``key_tp_{tp_rank}``), or the whole tensor when
        ``tp_size == 1``; None when missing."""
        torch = _tensor.torch_module()
        if not _tp_valid(tp_rank, tp_size):
            return None
        return self._decode(torch, self._get_owned(key if tp_size == 1 else _tensor.shard_key(key, tp_rank)))

    def batch_get_tensor_with_tp(self, base_keys: List[str], tp_rank: int = 0, tp_size: int = 1) -> list:
        torch = _tensor.torch_module()
        if not _tp_valid(tp_rank, tp_size):
            return [None] * len(base_keys)
        keys = [k if tp_size == 1 else _tensor.shard_key(k, tp_rank) for k in base_keys]
        return [self._decode(torch, h) for h in self._batch_get_owned(keys)]

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0):
        torch = _tensor.torch_module()
        if not _tp_valid(tp_rank, tp_size):
            return None
        k = key if tp_size == 1 else _tensor.shard_key(key, tp_rank)
        return self._into(torch, self.get_into(k, buffer_ptr, size), buffer_ptr)

    def batch_get_tensor_with_tp_into(self, base_keys: List[str], buffer_ptrs: List[int], sizes: List[int], tp_rank: int = 0, tp_size: int = 1) -> list:
        torch = _tensor.torch_module()
        if not _tp_valid(tp_rank, tp_size):
            return [None] * len(base_keys)
        keys = [k if tp_size == 1 else _tensor.shard_key(k, tp_rank) for k in base_keys]
        got = self.batch_get_into(keys, list(buffer_ptrs), list(sizes))
        return [self._into(torch, n, p) for n, p in zip(got, buffer_ptrs)]

    # ---- safetensors ------------------------------------------------------------

    def save_tensor_to_safetensor(self, key: str, file_name: Optional[str] = None) -> int:
        """Writes the tensor under ``key`` to a safetensors file (named
        ``key`` by default); 0 or a negative code."""
        tensor = self.get_tensor(key)
        if tensor is None:
            return -704
        try:
            from safetensors.torch import save_file
        except ImportError as e:
            raise ImportError("save_tensor_to_safetensor needs the safetensors package") from e
        try:
            save_file({key: tensor.contiguous()}, file_name or key)
        except Exception:
            return -1
        return 0

    def load_tensor_from_safetensor(self, key: Optional[str] = None, file_name: str = ""):
        """Loads a tensor from a safetensors file, stores it under ``key``
        (default: the file name) and returns it; None on failure."""
        try:
            from safetensors.torch import load_file
        except ImportError as e:
            raise ImportError("load_tensor_from_safetensor needs the safetensors package") from e
        if not file_name or not os.path.exists(file_name):
            return None
        tensors = load_file(file_name)
        if not tensors:
            return None
        name = key if key is not None else file_name
        tensor = tensors.get(name, next(iter(tensors.values())))
        return tensor if self.put_tensor(name, tensor) == 0 else None

