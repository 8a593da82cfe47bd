"""The ``typed_ragged`` column codec: rows of numbers (lists, tuples, or
arrays of any rank, 0-d included) in one dtype.

All rows' elements lie back to back in ``data`` (``physical_layout``
``contiguous_flat``). Two shape policies:

- ``regular``: two or more rows, none null, all of one shape; ``row_shape``
  in the metadata is all a reader needs;
- ``ragged``: anything else; ``offsets`` (rows + 1 element offsets),
  ``nulls`` and, for array rows, ``ndims`` and ``dims`` give each row's
  extent and shape.

``data`` is written without an intermediate copy: a
:class:`~._types._DirectCopyPayload` that the put gathers (natively) straight
into the memory it sends from. Decoded rows are views of the read buffer.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ._types import _DirectCopyPayload

LAYOUT = "contiguous_flat"


def _null(value: Any) -> bool:
    from ._inference import _is_null

    return _is_null(value)


def _data_payload(flat: list, dtype: np.dtype, total: int) -> Any:
    from . import _concat_arrays_into

    if _concat_arrays_into is not None:
        return _DirectCopyPayload.from_flat_arrays(flat, dtype, total)
    return np.concatenate(flat) if flat else np.empty(0, dtype=dtype)


def _c_order(row: Any, dtype: np.dtype) -> np.ndarray:
    """``row`` as a C-ordered array of ``dtype``, keeping its rank (0-d too)."""
    a = np.asarray(row, dtype=dtype)
    return a if a.flags.c_contiguous else a.copy(order="C")


def _rows_dtype(present: list, dtype_hint: Any) -> np.dtype:
    if dtype_hint is not None:
        return np.dtype(dtype_hint)
    if not present:
        return np.dtype(np.int64)
    return np.result_type(*[np.asarray(v).dtype for v in present])


def _encode_typed_ragged_regular_ndarray_rows(rows: Sequence[Any], dtype: Any) -> Optional[tuple]:
    """The ``regular`` layout of ``rows``, or None when it does not apply
    (fewer than two rows, a null row, rows of different shapes, non-array
    rows)."""
    if len(rows) < 2 or any(_null(r) or not isinstance(r, np.ndarray) for r in rows):
        return None
    shape = rows[0].shape
    if any(r.shape != shape for r in rows):
        return None
    dtype = np.dtype(dtype)
    flat = [_c_order(r, dtype).reshape(-1) for r in rows]
    total = sum(a.size for a in flat)
    payload = {"data": _data_payload(flat, dtype, total)}
    return payload, {"dtype": dtype.str, "shape_policy": "regular", "physical_layout": LAYOUT,
                     "row_shape": list(shape), "rows_as": "ndarray"}


def _encode_typed_ragged_values(rows: Sequence[Any], dtype_hint: Any = None) -> tuple[dict, dict]:
    rows = list(rows)
    present = [r for r in rows if not _null(r)]
    dtype = _rows_dtype(present, dtype_hint)
    regular = _encode_typed_ragged_regular_ndarray_rows(rows, dtype)
    if regular is not None:
        return regular
    arrays = [None if _null(r) else _c_order(r, dtype) for r in rows]
    flat = [a.reshape(-1) for a in arrays if a is not None]
    lengths = [0 if a is None else a.size for a in arrays]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    nulls = np.fromiter((a is None for a in arrays), dtype=np.uint8, count=len(rows))
    payload: dict[str, Any] = {"data": _data_payload(flat, dtype, int(offsets[-1])),
                               "offsets": offsets, "nulls": nulls}
    as_list = bool(present) and all(isinstance(r, (list, tuple)) for r in present)
    if not as_list:
        payload["ndims"] = np.fromiter((0 if a is None else a.ndim for a in arrays), dtype=np.int8,
                                       count=len(rows))
        dims = [d for a in arrays if a is not None for d in a.shape]
        payload["dims"] = np.asarray(dims, dtype=np.int64)
    return payload, {"dtype": dtype.str, "shape_policy": "ragged", "physical_layout": LAYOUT,
                     "rows_as": "list" if as_list else "ndarray"}


def _decode_typed_ragged_values(payload: Mapping[str, Any], rows: int, metadata: Mapping[str, Any]) -> list:
    dtype = np.dtype(metadata.get("dtype", "<i8"))
    data = payload["data"]
    data = data if isinstance(data, np.ndarray) and data.dtype == dtype else \
        np.frombuffer(memoryview(data).cast("B"), dtype=dtype) if not isinstance(data, np.ndarray) else \
        data.reshape(-1).view(np.uint8).view(dtype)
    if metadata.get("shape_policy") == "regular":
        shape = tuple(int(d) for d in metadata.get("row_shape", []))
        per = int(np.prod(shape, dtype=np.int64))
        if data.size != per * rows:
            raise ValueError(f"typed_ragged data holds {data.size} elements, expected {per * rows}")
        block = data.reshape((rows, *shape))
        return [block[i] for i in range(rows)]
    offsets = np.asarray(payload["offsets"], dtype=np.int64)
    nulls = np.asarray(payload["nulls"], dtype=np.uint8)
    if len(offsets) != rows + 1 or len(nulls) != rows:
        raise ValueError(f"typed_ragged offsets length {len(offsets)} does not match {rows} rows")
    if offsets[-1] != data.size or np.any(np.diff(offsets) < 0):
        raise ValueError("typed_ragged offsets do not cover the data")
    as_list = metadata.get("rows_as") == "list"
    ndims = payload.get("ndims")
    dims = np.asarray(payload.get("dims", []), dtype=np.int64)
    out: list[Any] = []
    at = 0
    for i in range(rows):
        if nulls[i]:
            out.append(None)
            continue
        row = data[offsets[i]: offsets[i + 1]]
        if as_list:
            out.append(row.tolist())
            continue
        if ndims is not None:
            nd = int(ndims[i])
            row = row.reshape(tuple(int(d) for d in dims[at: at + nd]))
            at += nd
        out.append(row)
    return out
