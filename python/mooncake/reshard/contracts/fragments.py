"""The physical view a runtime binds to one logical placement fragment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .ids import PlacementFragmentId, RuntimeFragmentId

U64_MAX = (1 << 64) - 1


def _int(value: object, name: str, minimum: int = 0) -> int:
    if type(value) is not int:
        raise ValueError(f"{name} must be an integer")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}")
    return value


def _u64(value: object, name: str, minimum: int = 0) -> int:
    number = _int(value, name, minimum)
    if number > U64_MAX:
        raise ValueError(f"{name} must fit in an unsigned 64-bit integer")
    return number


def _ints(values: object, name: str, minimum: int) -> tuple[int, ...]:
    if type(values) not in (tuple, list):
        raise ValueError(f"{name} must be a tuple or list")
    return tuple(
        _int(value, f"{name}[{index}]", minimum)
        for index, value in enumerate(values)  # type: ignore[arg-type]
    )


def _address_range(address: object, nbytes: object) -> None:
    start = _u64(address, "address", 1)
    length = _u64(nbytes, "nbytes", 1)
    if start + length > U64_MAX:
        raise ValueError("address range must fit in an unsigned 64-bit integer")


def row_major_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Byte strides of a C-contiguous array of ``shape``."""

    strides = [0] * len(shape)
    step = itemsize
    for dim in range(len(shape) - 1, -1, -1):
        strides[dim] = step
        step *= shape[dim]
    return tuple(strides)


@dataclass(frozen=True)
class RuntimeBindingFragment:
    """A contiguous view (address, shape, byte strides) inside one
    allocation of one worker, bound to a placement fragment."""

    placement_fragment_id: PlacementFragmentId
    fragment_id: RuntimeFragmentId
    address: int
    nbytes: int
    worker_id: str
    endpoint: str
    device: str
    itemsize: int
    local_shape: tuple[int, ...]
    strides_bytes: tuple[int, ...]
    storage_address: int
    storage_nbytes: int
    storage_offset_bytes: int
    # The framework object that keeps the allocation alive: process-local,
    # so it takes no part in equality and is not pickled.
    owner: Optional[object] = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("placement_fragment_id", "fragment_id", "worker_id", "endpoint", "device"):
            value = getattr(self, name)
            if type(value) is not str or not value:
                raise ValueError(f"{name} must be a non-empty string")
        _address_range(self.address, self.nbytes)
        _int(self.itemsize, "runtime itemsize", 1)
        shape = _ints(self.local_shape, "runtime local_shape", 1)
        strides = _ints(self.strides_bytes, "runtime strides_bytes", 0)
        if len(strides) != len(shape):
            raise ValueError("runtime stride rank differs from local_shape")
        if any(extent > 1 and stride == 0 for extent, stride in zip(shape, strides)):
            raise ValueError("runtime stride must be positive for non-singleton dimensions")
        # A stride over an extent-1 dimension is never used: store the
        # canonical one so equal views compare equal.
        canonical = row_major_strides(shape, self.itemsize)
        strides = tuple(c if extent == 1 else s for extent, s, c in zip(shape, strides, canonical))
        object.__setattr__(self, "local_shape", shape)
        object.__setattr__(self, "strides_bytes", strides)
        _address_range(self.storage_address, self.storage_nbytes)
        _u64(self.storage_offset_bytes, "storage_offset_bytes")
        if self.storage_address + self.storage_offset_bytes > U64_MAX:
            raise ValueError("normalized runtime address must fit in 64 bits")
        if self.address != self.storage_address + self.storage_offset_bytes:
            raise ValueError("runtime address must equal storage_address plus storage_offset_bytes")
        if self.storage_offset_bytes + self.nbytes > self.storage_nbytes:
            raise ValueError("runtime view exceeds storage allocation bounds")

    def __reduce__(self):
        # The owner stays behind: another process must bind afresh under its
        # own allocation guard before it may move bytes.
        fields = (
            self.placement_fragment_id, self.fragment_id, self.address, self.nbytes,
            self.worker_id, self.endpoint, self.device, self.itemsize, self.local_shape,
            self.strides_bytes, self.storage_address, self.storage_nbytes,
            self.storage_offset_bytes,
        )
        return (type(self), fields)
