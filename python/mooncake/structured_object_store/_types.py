"""The public value types of the structured object layer and its constants."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional, Sequence

import numpy as np

from ..dataproto_ref import RemoteBundleRef

#: Payloads are cut into store objects of at most this many bytes.
DEFAULT_BUNDLE_CHUNK_BYTES = 64 * 1024**2
#: A put of at least this many bytes (or AUTO_PARALLEL_MIN_CHUNKS chunks)
#: runs its chunks on several threads when the policy allows it.
AUTO_PARALLEL_MIN_BYTES = DEFAULT_BUNDLE_CHUNK_BYTES
AUTO_PARALLEL_MIN_CHUNKS = 8
#: What the store's remove answers for a key that is already gone.
MISSING_OBJECT_ERROR = -704
#: Where a structured object's metadata keeps how each member is encoded.
STRUCTURED_FIELD_SPECS_KEY = "__mooncake_structured_fields__"
WRAPPED_OBJECT_KEY = "__mooncake_wrapped_object__"


@dataclass(frozen=True)
class BundleTransferPolicy:
    """How a put moves its chunks: ``max_inflight_put`` threads,
    ``put_mode`` (``batch``: one batch call, ``parallel``: one put per chunk
    on the threads, ``auto``: batch unless the payload is large) and
    ``copy_mode`` (``zero_copy``: the store reads the caller's memory and
    fails when it cannot, ``copy``: plain ``put`` of copied bytes,
    ``auto``: zero-copy where the store allows it)."""

    max_inflight_put: int = 1
    put_mode: Literal["auto", "batch", "parallel"] = "auto"
    copy_mode: Literal["auto", "zero_copy", "copy"] = "auto"


@dataclass(frozen=True)
class FieldSchema:
    """Codec hint for one DataProto field; ``metadata["section"]`` pins the
    field to ``batch``, ``non_tensor_batch`` or ``meta_info``."""

    codec: str
    nullable: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, init=False)
class StructuredObjectPayload:
    """A structured object to store: JSON metadata plus named members."""

    metadata: Mapping[str, Any]
    buffers: Mapping[str, Any]

    def __init__(
        self,
        metadata: Optional[Mapping[str, Any]] = None,
        buffers: Optional[Mapping[str, Any]] = None,
    ) -> None:
        if buffers is None:
            raise TypeError("StructuredObjectPayload requires buffers")
        object.__setattr__(self, "metadata", {} if metadata is None else metadata)
        object.__setattr__(self, "buffers", buffers)


@dataclass
class StructuredObjectResult:
    """What a read returns: the object's metadata and its members."""

    metadata: dict[str, Any]
    objects: dict[str, Any]


@dataclass(frozen=True)
class StructuredMemberSlice:
    """Rows ``start:end:step`` of one member along ``axis`` (only 0)."""

    axis: int
    start: int
    end: int
    step: int = 1


@dataclass(frozen=True)
class StructuredObjectReadSpec:
    """A lazy read: which members, and which slice of each."""

    ref: RemoteBundleRef | Mapping[str, Any]
    member_names: tuple[str, ...] | None = None
    member_slices: tuple[tuple[str, StructuredMemberSlice], ...] = ()

    def select_members(self, names: Optional[Sequence[str]]) -> "StructuredObjectReadSpec":
        return StructuredObjectReadSpec(
            ref=self.ref,
            member_names=None if names is None else tuple(names),
            member_slices=self.member_slices,
        )

    def slice_member(
        self, name: str, axis: int, start: int, end: int, step: int = 1
    ) -> "StructuredObjectReadSpec":
        slices = dict(self.member_slices)
        slices[name] = StructuredMemberSlice(axis=axis, start=start, end=end, step=step)
        return StructuredObjectReadSpec(
            ref=self.ref, member_names=self.member_names, member_slices=tuple(slices.items())
        )

    def member_slice(self, name: str) -> StructuredMemberSlice | None:
        return dict(self.member_slices).get(name)


@dataclass(frozen=True)
class _TensorPayload:
    tensor: Any


@dataclass(frozen=True)
class _TensorObjectBufferPayload:
    """Bytes the store's tensor codec wrote (header and data) at ``ptr``."""

    ptr: int
    size: int
    owner: Any
    batch_size: int | None = None

    def __len__(self) -> int:
        if self.batch_size is None:
            raise TypeError("tensor object buffer requires batch_size for DataProto use")
        return self.batch_size


@dataclass(frozen=True)
class _MultiBufferPayload:
    """One member made of several buffers, stored as their concatenation."""

    buffers: tuple[memoryview, ...]
    owners: tuple[Any, ...] = ()
    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return sum(memoryview(b).nbytes for b in self.buffers)


@dataclass(frozen=True)
class _DirectCopyPayload:
    """Arrays gathered straight into the put's staging memory (one copy)."""

    arrays: list
    total_bytes: int
    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return self.total_bytes

    @staticmethod
    def from_flat_arrays(flat_arrays: list, dtype: Any, total_elems: int) -> "_DirectCopyPayload":
        return _DirectCopyPayload(
            arrays=flat_arrays,
            total_bytes=sum(a.nbytes for a in flat_arrays),
            dtype=np.dtype(dtype).str,
            shape=(int(total_elems),),
        )


@dataclass(frozen=True)
class _RawDestinationBuffer:
    ptr: int
    size: int
    owner: Any = None
    pre_registered: bool = False


class _PoolLeaseOwner:
    """Gives a buffer-pool lease back once, at release() or collection."""

    def __init__(self, lease: Any) -> None:
        self.lease = lease
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.lease.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass


class _PoolBackedNdarray(np.ndarray):
    """An array over a pool lease; views share the lease's owner, so the
    original must outlive them (release_result gives the lease back)."""

    def __new__(cls, owner: _PoolLeaseOwner, dtype: Any, shape: tuple[int, ...]):
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        nbytes = max(count * dtype.itemsize, 1)
        raw = (ctypes.c_uint8 * nbytes).from_address(owner.lease.ptr)
        flat = np.ctypeslib.as_array(raw)[: count * dtype.itemsize]
        array = flat.view(dtype).reshape(shape).view(cls)
        array._mooncake_pool_owner = owner
        return array

    def __array_finalize__(self, obj: Any) -> None:
        if obj is not None:
            self._mooncake_pool_owner = getattr(obj, "_mooncake_pool_owner", None)


def tensor_object_buffer(
    ptr: int, size: int, owner: Any = None, batch_size: int | None = None
) -> _TensorObjectBufferPayload:
    """A member given as tensor bytes the store's tensor codec wrote."""
    return _TensorObjectBufferPayload(ptr=int(ptr), size=int(size), owner=owner, batch_size=batch_size)


def raw_destination(
    ptr: int, size: int, owner: Any = None, *, pre_registered: bool = False
) -> _RawDestinationBuffer:
    """A read destination given as an address and size (``pre_registered``:
    the caller registered it with the store already)."""
    return _RawDestinationBuffer(ptr=int(ptr), size=int(size), owner=owner, pre_registered=pre_registered)
