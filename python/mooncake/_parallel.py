"""Unified parallel tensor IO: ``ParallelAxis``, ``TensorParallelism``,
``ReadTarget`` and the ``*_tensor_with_parallelism*`` calls of
``MooncakeDistributedStore``.

A tensor is stored whole, or as shards that a :class:`TensorParallelism` (an
ordered list of dp/tp/ep/pp axes) identifies. Objects use the reference's
names and tensor layout, so either package reads what the other wrote:

* ``key`` -- the whole tensor (no parallelism);
* ``key_tp_{rank}`` -- a shard of a single TP axis (the legacy
  ``*_with_tp`` name);
* ``key__{axis}__{axis}...`` -- any other layout, one component per axis in
  dp, tp, ep, pp order: ``{kind}_{rank}of{size}`` followed by ``_sd{split
  dim}``, ``_eid{expert id}`` and ``_sid{stage id}`` when set;
* ``key__writer_{rank}of{size}_sd{dim}`` -- a writer partition's shard;
* ``key__parallelism_manifest`` / ``key__writer_manifest`` -- the full
  tensor's dtype and shape and how it was cut (96 bytes), which lets a
  reader rebuild the full tensor or cut it for another TP size.

Writes: a single TP axis takes the caller's shard (its full shape is the
shard's shape times the TP size); a layout with TP and other axes takes the
full tensor and stores the shard of the TP rank; a layout without TP stores
the full tensor under the layout's name; a writer partition ``(rank, size,
split_dim)`` (any object with those attributes) stores that shard of a full
tensor. The ``_from`` forms read a serialized full tensor and store every TP
rank's shard. A split must be uniform. Bad input answers ``-600`` and stores
nothing.

Reads (``ReadTarget.mode``): ``as_stored`` the object under ``key``;
``shard`` the shard the target's parallelism names, cut from the stored
shards when the target's TP size differs from the stored one; ``full`` the
whole tensor, put back together from the TP shards (the target's non-TP axes
select which; its TP rank and size do not matter, its split dim must match)
or, without a parallelism, the whole object or the writer partitions. A read
that cannot be answered returns None.
"""

from __future__ import annotations

from math import prod
from typing import Any, List, NamedTuple, Optional

from . import _tensor

INVALID_PARAMS = -600

MODES = ("as_stored", "shard", "full")

__all__ = ["ParallelAxis", "TensorParallelism", "ReadTarget", "ParallelTensorCalls"]


def _int_or_none(name: str, value) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None, not {type(value).__name__}")
    return value


def _int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return value


class ParallelAxis:
    """One axis of a shard's identity: ``kind`` (``"dp"``, ``"tp"``,
    ``"ep"`` or ``"pp"``, any case), ``rank`` of ``size``, the ``split_dim``
    a TP axis cuts (None for the others), and the ``expert_id`` an EP axis
    and the ``stage_id`` a PP axis need. Fields are checked when the axis is
    used, not when set."""

    __slots__ = ("_kind", "_rank", "_size", "_split_dim", "_expert_id", "_stage_id")

    def __init__(self) -> None:
        self._kind = ""
        self._rank = 0
        self._size = 1
        self._split_dim: Optional[int] = None
        self._expert_id: Optional[int] = None
        self._stage_id: Optional[int] = None

    @property
    def kind(self) -> str:
        return self._kind

    @kind.setter
    def kind(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"kind must be a str, not {type(value).__name__}")
        self._kind = value

    @property
    def rank(self) -> int:
        return self._rank

    @rank.setter
    def rank(self, value: int) -> None:
        self._rank = _int("rank", value)

    @property
    def size(self) -> int:
        return self._size

    @size.setter
    def size(self, value: int) -> None:
        self._size = _int("size", value)

    @property
    def split_dim(self) -> Optional[int]:
        return self._split_dim

    @split_dim.setter
    def split_dim(self, value: Optional[int]) -> None:
        self._split_dim = _int_or_none("split_dim", value)

    @property
    def expert_id(self) -> Optional[int]:
        return self._expert_id

    @expert_id.setter
    def expert_id(self, value: Optional[int]) -> None:
        self._expert_id = _int_or_none("expert_id", value)

    @property
    def stage_id(self) -> Optional[int]:
        return self._stage_id

    @stage_id.setter
    def stage_id(self, value: Optional[int]) -> None:
        self._stage_id = _int_or_none("stage_id", value)

    def _copy(self) -> "ParallelAxis":
        out = ParallelAxis()
        for name in self.__slots__:
            setattr(out, name, getattr(self, name))
        return out

    def __repr__(self) -> str:
        extra = "".join(
            f", {n}={getattr(self, n)}" for n in ("split_dim", "expert_id", "stage_id") if getattr(self, n) is not None
        )
        return f"ParallelAxis(kind={self._kind!r}, rank={self._rank}, size={self._size}{extra})"


class TensorParallelism:
    """An ordered list of :class:`ParallelAxis` naming a shard. Setting
    ``axes`` stores copies; the list read back holds the stored axes, so
    changing one of them changes this parallelism."""

    __slots__ = ("_axes",)

    def __init__(self) -> None:
        self._axes: List[ParallelAxis] = []

    @property
    def axes(self) -> List[ParallelAxis]:
        return list(self._axes)

    @axes.setter
    def axes(self, value) -> None:
        axes = list(value)
        for a in axes:
            if not isinstance(a, ParallelAxis):
                raise TypeError(f"axes must hold ParallelAxis objects, not {type(a).__name__}")
        self._axes = [a._copy() for a in axes]

    def _copy(self) -> "TensorParallelism":
        out = TensorParallelism()
        out.axes = self._axes
        return out

    def __repr__(self) -> str:
        return f"TensorParallelism(axes={self._axes!r})"


class ReadTarget:
    """What a read returns: ``mode`` ``"as_stored"`` (default), ``"shard"``
    or ``"full"`` (any case; another value raises RuntimeError, as in the
    reference) and, for ``shard`` and TP ``full`` reads, the ``parallelism``
    (stored as a copy)."""

    __slots__ = ("_mode", "_parallelism")

    def __init__(self) -> None:
        self._mode = "as_stored"
        self._parallelism: Optional[TensorParallelism] = None

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"mode must be a str, not {type(value).__name__}")
        mode = value.lower()
        if mode not in MODES:
            raise RuntimeError(f"Unsupported ReadTarget mode {value!r} (one of {', '.join(MODES)})")
        self._mode = mode

    @property
    def parallelism(self) -> Optional[TensorParallelism]:
        return self._parallelism

    @parallelism.setter
    def parallelism(self, value: Optional[TensorParallelism]) -> None:
        if value is not None and not isinstance(value, TensorParallelism):
            raise TypeError(f"parallelism must be a TensorParallelism or None, not {type(value).__name__}")
        self._parallelism = None if value is None else value._copy()

    def __repr__(self) -> str:
        return f"ReadTarget(mode={self._mode!r}, parallelism={self._parallelism!r})"


# ---- layouts -----------------------------------------------------------------


class _Axis(NamedTuple):
    kind: str
    code: int
    rank: int
    size: int
    split: int  # -1: the axis does not split the tensor
    expert: Optional[int]
    stage: Optional[int]

    def component(self) -> str:
        out = f"{self.kind}_{self.rank}of{self.size}"
        if self.split >= 0:
            out += f"_sd{self.split}"
        if self.expert is not None:
            out += f"_eid{self.expert}"
        if self.stage is not None:
            out += f"_sid{self.stage}"
        return out

    def header(self) -> tuple:
        tag = self.expert if self.expert is not None else (self.stage if self.stage is not None else 0)
        return (self.code, self.rank, self.size, self.split, tag)


class _Layout(NamedTuple):
    """A checked parallelism: its axes in the caller's order."""

    axes: tuple

    @property
    def tp(self) -> Optional[_Axis]:
        return next((a for a in self.axes if a.kind == "tp"), None)

    def with_tp(self, rank: int, size: int) -> "_Layout":
        return _Layout(tuple(a._replace(rank=rank, size=size) if a.kind == "tp" else a for a in self.axes))

    def object_key(self, key: str) -> str:
        if len(self.axes) == 1 and self.axes[0].kind == "tp":
            return _tensor.shard_key(key, self.axes[0].rank)
        return key + "".join("__" + a.component() for a in sorted(self.axes, key=lambda a: a.code))

    def header_axes(self) -> list:
        return [a.header() for a in self.axes]


def _layout(parallelism, ndim: Optional[int]) -> Optional[_Layout]:
    """The checked layout of ``parallelism``, or None when it is not one: 1 to
    4 axes of distinct known kinds, ``0 <= rank < size``, a split dim on the
    TP axis only (below ``ndim`` when known), an expert id on EP and a stage
    id on PP axes."""
    if not isinstance(parallelism, TensorParallelism):
        return None
    axes = parallelism._axes
    if not 1 <= len(axes) <= _tensor.MAX_AXES:
        return None
    out, seen = [], set()
    for a in axes:
        kind = a.kind.lower()
        if kind not in _tensor.AXIS_KINDS or kind in seen:
            return None
        seen.add(kind)
        if a.size < 1 or not 0 <= a.rank < a.size:
            return None
        if kind == "tp":
            if a.split_dim is None or a.split_dim < 0 or (ndim is not None and a.split_dim >= ndim):
                return None
        elif a.split_dim is not None:
            return None
        if (kind == "ep" and a.expert_id is None) or (kind == "pp" and a.stage_id is None):
            return None
        split = a.split_dim if kind == "tp" else -1
        out.append(_Axis(kind, _tensor.AXIS_KINDS[kind], a.rank, a.size, split, a.expert_id, a.stage_id))
    return _Layout(tuple(out))


def _writer_partition(part, ndim: int) -> Optional[tuple]:
    """``(rank, size, split_dim)`` of a writer partition (an object with
    those int attributes, as the reference reads them), or None."""
    try:
        rank, size, split = (getattr(part, n) for n in ("rank", "size", "split_dim"))
    except AttributeError:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, size, split)):
        return None
    if size < 1 or not 0 <= rank < size or not 0 <= split < ndim:
        return None
    return rank, size, split


def _manifest_key(key: str) -> str:
    return key + "__parallelism_manifest"


def _writer_manifest_key(key: str) -> str:
    return key + "__writer_manifest"


def _writer_key(key: str, rank: int, size: int, split: int) -> str:
    return f"{key}__writer_{rank}of{size}_sd{split}"


class _Stored(NamedTuple):
    """How a tensor was cut: dtype, full shape, split dim, shard count and
    the object key of each rank's shard."""

    dtype: int
    shape: tuple
    split: int
    size: int
    key_of: Any

    def shard_shape(self) -> tuple:
        return self.shape[: self.split] + (self.shape[self.split] // self.size,) + self.shape[self.split + 1 :]


def _tp_matches(tp: _Axis):
    """A check that a stored shard's header names the TP shard ``tp``."""

    def check(view) -> bool:
        _shape, axes = _tensor.layout_of(view)
        found = next((a for a in axes if a[0] == _tensor.AXIS_KINDS["tp"]), None)
        return found is not None and tuple(found[1:4]) == (tp.rank, tp.size, tp.split)

    return check


def _write_plan(key: str, src, parallelism, part, whole_input: bool) -> Optional[list]:
    """The objects one write stores, as ``(key, parts)``; None when the
    request is invalid. ``whole_input``: the source is a full tensor even for
    a single TP axis, and every TP rank's shard is stored (the ``_from``
    forms)."""
    if src is None or (parallelism is not None and part is not None):
        return None
    dtype, shape, data = src
    shape = tuple(shape)
    meta = _tensor.Meta(dtype, shape, 0, len(data))
    if part is not None:
        wp = _writer_partition(part, len(shape))
        if wp is None:
            return None
        rank, size, split = wp
        shards = _tensor.split(meta, data, size, split)
        if shards is None:
            return None
        shard_shape, pieces = shards[rank]
        header = _tensor.encode(dtype, shard_shape, global_shape=shape, shard=wp)
        manifest = _tensor.encode_manifest(dtype, shape, split, size)
        return [(_writer_key(key, rank, size, split), [header, *pieces]), (_writer_manifest_key(key), [manifest])]
    if parallelism is None:
        return [(key, [_tensor.encode(dtype, shape), data])]
    layout = _layout(parallelism, len(shape))
    if layout is None:
        return None
    tp = layout.tp
    if tp is None:
        header = _tensor.encode(dtype, shape, global_shape=shape, axes=layout.header_axes())
        return [(layout.object_key(key), [header, data])]
    if len(layout.axes) == 1 and not whole_input:
        # The caller's shard of a tensor cut uniformly along the split dim.
        full = shape[: tp.split] + (shape[tp.split] * tp.size,) + shape[tp.split + 1 :]
        header = _tensor.encode(dtype, shape, global_shape=full, axes=layout.header_axes())
        manifest = _tensor.encode_manifest(dtype, full, tp.split, tp.size)
        return [(layout.object_key(key), [header, data]), (_manifest_key(key), [manifest])]
    shards = _tensor.split(meta, data, tp.size, tp.split)
    if shards is None:
        return None
    out = []
    for rank in range(tp.size) if whole_input else [tp.rank]:
        one = layout.with_tp(rank, tp.size)
        shard_shape, pieces = shards[rank]
        header = _tensor.encode(dtype, shard_shape, global_shape=shape, axes=one.header_axes())
        out.append((one.object_key(key), [header, *pieces]))
    out.append((_manifest_key(key), [_tensor.encode_manifest(dtype, shape, tp.split, tp.size)]))
    return out


def _per_item(n: int, values) -> Optional[list]:
    """``values`` as a list of ``n`` (``None`` -> ``n`` Nones), or None when
    it is not a sequence of that length."""
    if values is None:
        return [None] * n
    try:
        values = list(values)
    except TypeError:
        return None
    return values if len(values) == n else None


class ParallelTensorCalls:
    """The unified parallel tensor calls of ``MooncakeDistributedStore``
    (see the module's documentation for what is stored where)."""

    __slots__ = ()

    # ---- writes -------------------------------------------------------------------

    def _parallel_write(self, keys, srcs, parallelisms, parts, config, upsert, whole_input) -> List[int]:
        n = len(keys)
        parallelisms, parts = _per_item(n, parallelisms), _per_item(n, parts)
        if len(srcs) != n or parallelisms is None or parts is None:
            return [INVALID_PARAMS] * n
        if any(p is not None for p in parallelisms) and any(w is not None for w in parts):
            # Two descriptions of the same write: refused as a whole.
            return [INVALID_PARAMS] * n
        codes = [0] * n
        obj_keys, obj_parts, owners = [], [], []
        for i, (key, src, par, part) in enumerate(zip(keys, srcs, parallelisms, parts)):
            plan = _write_plan(key, src, par, part, whole_input)
            if plan is None:
                codes[i] = INVALID_PARAMS
                continue
            for k, p in plan:
                obj_keys.append(k)
                obj_parts.append(p)
                owners.append(i)
        self._put_owned(obj_keys, obj_parts, owners, codes, config, upsert)
        return codes

    def _parallel_put(self, keys, tensors, parallelisms, parts, config, upsert) -> List[int]:
        keys, tensors = list(keys), list(tensors)
        if len(keys) != len(tensors):
            return [INVALID_PARAMS] * len(keys)
        srcs, _keep = self._tensor_sources(tensors)
        return self._parallel_write(keys, srcs, parallelisms, parts, config, upsert, False)

    def _parallel_put_from(self, keys, ptrs, sizes, parallelisms, parts, config, upsert) -> List[int]:
        keys, ptrs, sizes = list(keys), list(ptrs), list(sizes)
        if not (len(keys) == len(ptrs) == len(sizes)):
            return [INVALID_PARAMS] * len(keys)
        srcs = self._serialized_sources(ptrs, sizes)
        return self._parallel_write(keys, srcs, parallelisms, parts, config, upsert, True)

    def put_tensor_with_parallelism(self, key: str, tensor, parallelism=None, config=None, writer_partition=None) -> int:
        """Stores ``tensor`` whole (no ``parallelism``), as the shard that
        ``parallelism`` names, or as the writer partition's shard; 0 or a
        code (-600 for an invalid request, nothing stored)."""
        return self._parallel_put([key], [tensor], [parallelism], [writer_partition], config, False)[0]

    def upsert_tensor_with_parallelism(self, key: str, tensor, parallelism=None, config=None, writer_partition=None) -> int:
        """``put_tensor_with_parallelism`` that replaces existing objects."""
        return self._parallel_put([key], [tensor], [parallelism], [writer_partition], config, True)[0]

    def batch_put_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None, config=None, writer_partitions=None) -> List[int]:
        """One code per key; lists of different lengths, or both
        ``parallelisms`` and ``writer_partitions``, fail every key."""
        return self._parallel_put(keys, tensors_list, parallelisms, writer_partitions, config, False)

    def batch_upsert_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None, config=None, writer_partitions=None) -> List[int]:
        return self._parallel_put(keys, tensors_list, parallelisms, writer_partitions, config, True)

    def put_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism=None, config=None, writer_partition=None) -> int:
        """Like ``put_tensor_with_parallelism`` for a full tensor serialized
        (``[TensorMetadata][data]``) in the buffer; with a TP axis every TP
        rank's shard is stored."""
        return self._parallel_put_from([key], [buffer_ptr], [size], [parallelism], [writer_partition], config, False)[0]

    def upsert_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism=None, config=None, writer_partition=None) -> int:
        return self._parallel_put_from([key], [buffer_ptr], [size], [parallelism], [writer_partition], config, True)[0]

    def batch_put_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes, parallelisms=None, config=None, writer_partitions=None) -> List[int]:
        return self._parallel_put_from(keys, buffer_ptrs, sizes, parallelisms, writer_partitions, config, False)

    def batch_upsert_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes, parallelisms=None, config=None, writer_partitions=None) -> List[int]:
        return self._parallel_put_from(keys, buffer_ptrs, sizes, parallelisms, writer_partitions, config, True)

    # ---- reads --------------------------------------------------------------------

    def get_tensor_with_parallelism(self, key: str, target=None):
        """The tensor ``target`` asks for (default: the object under
        ``key``), a copy the caller owns; None when it cannot be read."""
        return self._parallel_read(key, target, None)

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: int, size: int, target=None):
        """Like ``get_tensor_with_parallelism``, written into the buffer as
        ``[TensorMetadata][data]``; the tensor returned is over the buffer.
        None when it cannot be read or does not fit."""
        return self._parallel_read(key, target, (buffer_ptr, size))

    def batch_get_tensor_with_parallelism(self, keys, targets=None) -> list:
        """One tensor or None per key; a ``targets`` list of another length
        gives None for every key."""
        keys = list(keys)
        targets = _per_item(len(keys), targets)
        if targets is None:
            return [None] * len(keys)
        return [self._parallel_read(k, t, None) for k, t in zip(keys, targets)]

    def batch_get_tensor_with_parallelism_into(self, keys, buffer_ptrs, sizes, targets=None) -> list:
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        targets = _per_item(len(keys), targets)
        if targets is None or not (len(keys) == len(buffer_ptrs) == len(sizes)):
            return [None] * len(keys)
        return [self._parallel_read(k, t, (p, s)) for k, p, s, t in zip(keys, buffer_ptrs, sizes, targets)]

    def _parallel_read(self, key, target, into):
        if target is None:
            return self._read_object(key, None, into)
        if not isinstance(target, ReadTarget):
            return None
        p = target.parallelism
        if target.mode == "as_stored":
            return self._read_object(key, None, into)
        if target.mode == "shard":
            layout = None if p is None else _layout(p, None)
            if layout is None:
                return None
            tp = layout.tp
            if tp is None:
                return self._read_object(layout.object_key(key), None, into)
            got = self._read_object(layout.object_key(key), _tp_matches(tp), into)
            if got is None and len(layout.axes) == 1:
                got = self._read_object(_writer_key(key, tp.rank, tp.size, tp.split), _tp_matches(tp), into)
            if got is not None:
                return got
            stored = self._stored_layout(key, layout)
            if stored is None or stored.size == tp.size:
                return None
            return self._cut(stored, layout, into)
        # full
        if p is None:
            got = self._read_object(key, None, into)
            return got if got is not None else self._writer_whole(key, into)
        layout = _layout(p, None)
        if layout is None or layout.tp is None:
            return None
        stored = self._stored_layout(key, layout)
        return None if stored is None else self._whole(stored, into)

    def _read_object(self, obj_key, check, into):
        """The tensor stored under ``obj_key`` (read into the buffer for
        ``into``), if its header passes ``check``."""
        if into is None:
            handle = self._get_owned(obj_key)
            if handle is None:
                return None
            view = memoryview(handle)
            meta = _tensor.decode(view)
            if meta is None or (check is not None and not check(view)):
                return None
            return _tensor.to_tensor(_tensor.torch_module(), meta, handle)
        ptr, size = into
        if not ptr or size <= 0:
            return None
        n = self.get_into(obj_key, ptr, size)
        if n <= 0:
            return None
        view = _tensor.memory_at(ptr, n)
        meta = _tensor.decode(view)
        if meta is None or (check is not None and not check(view)):
            return None
        return _tensor.to_tensor(_tensor.torch_module(), meta, view)

    def _stored_layout(self, key, layout: _Layout) -> Optional[_Stored]:
        """How the TP shards under ``layout``'s other axes were cut: from the
        key's manifest, else from the header of the rank-0 shard of the
        target's TP size. None when neither says, or the split dim differs
        from the target's."""
        tp = layout.tp
        manifest, probe = self._batch_get_owned([_manifest_key(key), layout.with_tp(0, tp.size).object_key(key)])
        found = None if manifest is None else _tensor.decode_manifest(manifest)
        if found is None and probe is not None:
            view = memoryview(probe)
            meta = _tensor.decode(view)
            if meta is not None:
                shape, axes = _tensor.layout_of(view)
                axis = next((a for a in axes if a[0] == _tensor.AXIS_KINDS["tp"]), None)
                if axis is not None:
                    _kind, _rank, size, split, _tag = axis
                    if size >= 1 and 0 <= split < len(shape) and shape[split] % size == 0:
                        found = (meta.dtype, shape, split, size)
        if found is None:
            return None
        dtype, shape, split, size = found
        if split != tp.split:
            return None
        return _Stored(dtype, shape, split, size, lambda r: layout.with_tp(r, size).object_key(key))

    def _writer_whole(self, key, into):
        handle = self._get_owned(_writer_manifest_key(key))
        found = None if handle is None else _tensor.decode_manifest(handle)
        if found is None:
            return None
        dtype, shape, split, size = found
        return self._whole(_Stored(dtype, shape, split, size, lambda r: _writer_key(key, r, size, split)), into)

    def _rows(self, stored: _Stored, ranks) -> Optional[list]:
        """The shards of ``ranks`` as ``(outer, shard row bytes)`` uint8
        tensors (row: one index of the dims before the split dim), after
        checking each is the shard the layout says; None if one is not."""
        torch = _tensor.torch_module()
        expect = stored.shard_shape()
        outer = prod(stored.shape[: stored.split])
        row = prod(expect[stored.split :]) * _tensor.DTYPES[stored.dtype][1]
        handles = self._batch_get_owned([stored.key_of(r) for r in ranks])
        rows = []
        for handle in handles:
            meta = None if handle is None else _tensor.decode(memoryview(handle))
            if meta is None or meta.dtype != stored.dtype or meta.shape != expect:
                return None
            if outer * row == 0:
                rows.append(torch.empty((outer, row), dtype=torch.uint8))
            else:
                data = torch.frombuffer(handle, dtype=torch.uint8, count=outer * row, offset=meta.data_offset)
                rows.append(data.view(outer, row))
        return rows

    def _whole(self, stored: _Stored, into):
        rows = self._rows(stored, range(stored.size))
        if rows is None:
            return None
        header = _tensor.encode(stored.dtype, stored.shape)
        return self._emit(stored.dtype, stored.shape, header, rows, into)

    def _cut(self, stored: _Stored, layout: _Layout, into):
        """The target's TP shard cut from shards of another TP size: only
        the stored shards that overlap it are read."""
        tp = layout.tp
        full = stored.shape
        if full[tp.split] % tp.size:
            return None
        extent = full[tp.split] // tp.size
        inner = prod(full[tp.split + 1 :]) * _tensor.DTYPES[stored.dtype][1]
        src_row = (full[tp.split] // stored.size) * inner
        # The target's bytes within one row (one index of the dims before the
        # split dim) are [lo, hi); stored shard r holds [r, r + 1) * src_row.
        lo = tp.rank * extent * inner
        hi = lo + extent * inner
        if src_row == 0:
            first, last = 0, 1
        else:
            first, last = lo // src_row, max(-(-hi // src_row), lo // src_row + 1)
        rows = self._rows(stored, range(first, last))
        if rows is None:
            return None
        pieces = []
        for rank, row in zip(range(first, last), rows):
            start, end = max(lo, rank * src_row), min(hi, (rank + 1) * src_row)
            if end > start:
                pieces.append(row.narrow(1, start - rank * src_row, end - start))
        shape = full[: tp.split] + (extent,) + full[tp.split + 1 :]
        header = _tensor.encode(stored.dtype, shape, global_shape=full, axes=layout.header_axes())
        return self._emit(stored.dtype, shape, header, pieces, into)

    def _emit(self, dtype: int, shape: tuple, header: bytes, pieces: list, into):
        """A tensor of ``shape`` whose C-order bytes are the ``(outer, n)``
        uint8 ``pieces`` side by side: new memory, or ``[header][data]``
        written into the caller's buffer. Each byte is copied once."""
        torch = _tensor.torch_module()
        tdtype = getattr(torch, _tensor.DTYPES[dtype][0])
        nbytes = prod(shape) * _tensor.DTYPES[dtype][1]
        if into is None:
            if nbytes == 0:
                return torch.empty(shape, dtype=tdtype)
            if len(pieces) == 1 and pieces[0].is_contiguous():
                # One whole shard: its fetched memory is the tensor's.
                return pieces[0].reshape(-1).view(tdtype).reshape(shape)
            outer = pieces[0].shape[0]
            out = torch.empty((outer, nbytes // outer), dtype=torch.uint8)
            self._place(out, pieces)
            return out.reshape(-1).view(tdtype).reshape(shape)
        ptr, size = into
        total = _tensor.HEADER_SIZE + nbytes
        if not ptr or size < total or not self._writable(ptr, total):
            return None
        mem = _tensor.memory_at(ptr, total)
        mem[: _tensor.HEADER_SIZE] = header
        if nbytes:
            outer = pieces[0].shape[0]
            dst = torch.frombuffer(mem, dtype=torch.uint8, count=nbytes, offset=_tensor.HEADER_SIZE)
            self._place(dst.view(outer, nbytes // outer), pieces)
        return _tensor.to_tensor(torch, _tensor.decode(mem), mem)

    @staticmethod
    def _place(dst, pieces) -> None:
        """Copies the pieces into ``dst`` side by side (column ranges)."""
        at = 0
        for piece in pieces:
            width = piece.shape[1]
            dst.narrow(1, at, width).copy_(piece)
            at += width

    def _writable(self, ptr: int, size: int) -> bool:
        from ._mooncake import _writable

        return _writable(ptr, size)
