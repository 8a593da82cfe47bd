"""A numpy-backed stand-in for the few torch APIs mooncake's tensor calls use,
so the tensor paths run in CI where torch is not installed. The same tests run
against real torch when it is importable."""

from __future__ import annotations

import types

import numpy as np


class dtype:
    def __init__(self, name: str, np_dtype):
        self.name, self.np = name, np.dtype(np_dtype)
        self.itemsize = self.np.itemsize

    def __repr__(self):
        return "torch." + self.name


class _Device:
    type = "cpu"


class Tensor:
    """A tensor over a numpy array (sharing its memory)."""

    def __init__(self, array: np.ndarray, dt: dtype):
        self.a, self._dtype = array, dt

    dtype = property(lambda self: self._dtype)
    shape = property(lambda self: tuple(self.a.shape))
    device = _Device()

    def detach(self):
        return self

    def cpu(self):
        return self

    def contiguous(self):
        return self if self.a.flags["C_CONTIGUOUS"] else Tensor(np.ascontiguousarray(self.a), self._dtype)

    def numel(self):
        return int(self.a.size)

    def element_size(self):
        return self._dtype.itemsize

    def data_ptr(self):
        return self.a.ctypes.data

    def reshape(self, shape):
        return Tensor(self.a.reshape(shape), self._dtype)

    def narrow(self, dim, start, length):
        idx = [slice(None)] * self.a.ndim
        idx[dim] = slice(start, start + length)
        return Tensor(self.a[tuple(idx)], self._dtype)

    def numpy(self):
        return self.a


module = types.ModuleType("torch")
module.Tensor = Tensor
_DTYPES = {}
for _name, _np in [
    ("float32", "f4"), ("float64", "f8"), ("int8", "i1"), ("uint8", "u1"), ("int16", "i2"),
    ("uint16", "u2"), ("int32", "i4"), ("uint32", "u4"), ("int64", "i8"), ("uint64", "u8"),
    ("bool", "?"), ("float16", "f2"), ("bfloat16", "u2"), ("float8_e4m3fn", "u1"), ("float8_e5m2", "u1"),
]:
    _DTYPES[_name] = dtype(_name, _np)
    setattr(module, _name, _DTYPES[_name])
module.complex64 = dtype("complex64", "c8")


def _by_numpy(np_dtype) -> dtype:
    for d in _DTYPES.values():
        if d.np == np.dtype(np_dtype) and d.name not in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            return d
    return dtype(str(np.dtype(np_dtype)), np_dtype)


def from_numpy(a: np.ndarray) -> Tensor:
    return Tensor(a, _by_numpy(a.dtype))


def empty(shape, dtype):
    return Tensor(np.empty(shape, dtype.np), dtype)


def frombuffer(buffer, dtype, count=-1, offset=0):
    return Tensor(np.frombuffer(buffer, dtype=dtype.np, count=count, offset=offset), dtype)


module.from_numpy = from_numpy
module.empty = empty
module.frombuffer = frombuffer
