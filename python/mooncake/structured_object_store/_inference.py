"""Structure and codec inference for columns of structured rows.

A column is a list of row values: one value per row, ``None`` for a null row.
:func:`infer_structure` walks such a column and splits it into *nodes* (the
dicts and lists that give the rows their shape) and *leaves* (columns of plain
values), and :func:`_choose_leaf_codec` picks, for each leaf, the encoding
that stores it compactly:

==================  ==========================================================
codec               leaf values
==================  ==========================================================
``ragged_tensor``   torch tensors of one dtype (any shapes, any ranks)
``typed_ragged``    numeric sequences (lists/tuples of numbers, 1-d numeric
                    arrays; values of several dtypes share the widest)
``bytes_ragged``    ``bytes``-like values
``utf8_ragged``     ``str`` values
``ndarray``         numeric scalars (one value per row)
``msgpack_ragged``  anything else that msgpack can hold (dicts, mixed lists);
                    also the fallback for values it cannot hold
==================  ==========================================================

A decision is *accepted* when the codec can hold every non-null value of the
leaf; a rejected decision names the codec that was tried and why it does not
fit (tensors of several dtypes, an object msgpack cannot hold, no values at
all), so a writer knows to fall back to a generic serializer for that leaf.

Paths name where a leaf sits in a row: ``root.key`` for a dict entry,
``root[i]`` for the i-th item of a list. A dict key containing ``.``, ``[``
or ``\\`` is escaped with a backslash (:func:`_escape_key`), so every path
reads back to one position. A row that lacks a key has :data:`MISSING` in
that key's leaf, which keeps "key absent" apart from "key present with the
value ``None``".

The bundle transfer that stores these columns lives beside this module in
:mod:`mooncake.structured_object_store`.
"""

from __future__ import annotations

import numbers
import sys
from dataclasses import dataclass, field
from typing import Any, List, Optional

__all__ = [
    "MISSING",
    "MAX_DEPTH",
    "LeafDecision",
    "LeafPlan",
    "StructureNode",
    "infer_structure",
]

#: How deep dicts and lists may nest in a row before inference gives up.
MAX_DEPTH = 32

# Integers msgpack can hold: int64 and uint64.
_MSGPACK_INT_MIN = -(1 << 63)
_MSGPACK_INT_MAX = (1 << 64) - 1


class _Missing:
    """The type of :data:`MISSING`; there is only one instance."""

    _instance: Optional["_Missing"] = None

    def __new__(cls) -> "_Missing":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<MISSING>"

    def __reduce__(self):
        return (_Missing, ())


#: Marks a row whose dict has no entry for a leaf's key (a ``None`` there
#: means the entry exists and holds ``None``).
MISSING = _Missing()


@dataclass
class LeafDecision:
    """The codec chosen for one leaf; ``accepted`` says whether it holds every
    value, ``reason`` why not (empty when accepted)."""

    codec: str
    accepted: bool
    reason: str = ""


@dataclass
class LeafPlan:
    """One leaf column: its path, its values (one per row, ``None`` or
    :data:`MISSING` where the row has none) and the codec decision."""

    path: str
    values: List[Any]
    decision: LeafDecision


@dataclass
class StructureNode:
    """A dict or list level of the rows at ``path``.

    ``children`` are the dict keys (first-seen order) or the list positions
    (``0 .. max length - 1``); ``lengths`` holds each row's list length (0 for
    a row without a list); ``row_mask`` tells, per row, whether it holds the
    container (False for a null row).
    """

    path: str
    node_type: str
    children: List[Any] = field(default_factory=list)
    row_mask: List[bool] = field(default_factory=list)
    lengths: Optional[List[int]] = None


def _escape_key(key: str) -> str:
    """``key`` with ``\\``, ``.`` and ``[`` escaped by a backslash, so that it
    can be one component of a leaf path."""
    return key.replace("\\", "\\\\").replace(".", "\\.").replace("[", "\\[")


def _is_null(value: Any) -> bool:
    return value is None or value is MISSING


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_np_generic(value: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.generic)


def _is_ndarray(value: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def _is_number(value: Any) -> bool:
    """A Python bool, int or float an int64/uint64/float64 array can hold."""
    if isinstance(value, bool):
        return True
    if isinstance(value, numbers.Integral):
        return _MSGPACK_INT_MIN <= int(value) <= _MSGPACK_INT_MAX
    return isinstance(value, numbers.Real)


def _is_numeric_scalar(value: Any) -> bool:
    if isinstance(value, (bool, numbers.Integral, numbers.Real)) and not _is_np_generic(value):
        return _is_number(value)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.generic):
        return value.dtype.kind in "biuf"
    return False


def _is_numeric_sequence(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_number(item) for item in value)
    if _is_ndarray(value):
        return value.ndim == 1 and value.dtype.kind in "biuf"
    return False


def _msgpack_fits(value: Any, depth: int = 0) -> bool:
    """Whether msgpack holds ``value`` as it is (no custom hooks)."""
    if depth > MAX_DEPTH:
        return False
    if value is None or isinstance(value, (bool, float, str, bytes, bytearray, memoryview)):
        return True
    if isinstance(value, int):
        return _MSGPACK_INT_MIN <= value <= _MSGPACK_INT_MAX
    if isinstance(value, (list, tuple)):
        return all(_msgpack_fits(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(
            _msgpack_fits(k, depth + 1) and _msgpack_fits(v, depth + 1)
            for k, v in value.items()
        )
    return False


def _choose_leaf_codec(values: List[Any]) -> LeafDecision:
    """Chooses the codec for a leaf column (see the module's table); null
    values (``None``, :data:`MISSING`) are skipped."""
    present = [v for v in values if not _is_null(v)]
    if not present:
        return LeafDecision("msgpack_ragged", False, "no non-null values")
    if all(_is_tensor(v) for v in present):
        dtypes = {v.dtype for v in present}
        if len(dtypes) == 1:
            return LeafDecision("ragged_tensor", True)
        names = ", ".join(sorted(str(d) for d in dtypes))
        return LeafDecision("ragged_tensor", False, f"tensors of several dtypes: {names}")
    if all(isinstance(v, (bytes, bytearray, memoryview)) for v in present):
        return LeafDecision("bytes_ragged", True)
    if all(isinstance(v, str) for v in present):
        return LeafDecision("utf8_ragged", True)
    if all(_is_numeric_scalar(v) for v in present):
        return LeafDecision("ndarray", True)
    if all(_is_numeric_sequence(v) for v in present):
        return LeafDecision("typed_ragged", True)
    for row, value in enumerate(values):
        if not _is_null(value) and not _msgpack_fits(value):
            return LeafDecision(
                "msgpack_ragged",
                False,
                f"row {row}: msgpack cannot hold a {type(value).__name__}",
            )
    return LeafDecision("msgpack_ragged", True)


def _is_structured_list(value: Any) -> bool:
    """A list whose items give the rows more structure (dicts or lists)."""
    return isinstance(value, list) and any(isinstance(i, (dict, list)) for i in value)


def infer_structure(
    path: str,
    values: List[Any],
    leaves: List[LeafPlan],
    nodes: List[StructureNode],
    depth: int = 0,
) -> None:
    """Splits the column ``values`` at ``path`` into structure and leaves.

    Appends a :class:`StructureNode` to ``nodes`` for every dict or list level
    (parents before children) and a :class:`LeafPlan` to ``leaves`` for every
    column of plain values. A column is a dict level when every non-null
    value is a dict with string keys, a list level when every non-null value
    is a list and some hold dicts or lists; anything else is a leaf. Raises
    ``ValueError`` when rows nest deeper than :data:`MAX_DEPTH`.
    """
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: rows nest deeper than {MAX_DEPTH} levels")
    present = [v for v in values if not _is_null(v)]
    row_mask = [not _is_null(v) for v in values]

    if present and all(
        isinstance(v, dict) and all(isinstance(k, str) for k in v) for v in present
    ):
        keys: dict = {}
        for v in present:
            for k in v:
                keys.setdefault(k, None)
        nodes.append(StructureNode(path, "dict", list(keys), row_mask))
        for k in keys:
            column = [
                v.get(k, MISSING) if isinstance(v, dict) else None for v in values
            ]
            infer_structure(f"{path}.{_escape_key(k)}", column, leaves, nodes, depth + 1)
        return

    if present and all(isinstance(v, list) for v in present) and any(
        _is_structured_list(v) for v in present
    ):
        lengths = [len(v) if isinstance(v, list) else 0 for v in values]
        width = max(lengths)
        nodes.append(
            StructureNode(path, "list", list(range(width)), row_mask, lengths)
        )
        for i in range(width):
            column = [
                (v[i] if i < len(v) else MISSING) if isinstance(v, list) else None
                for v in values
            ]
            infer_structure(f"{path}[{i}]", column, leaves, nodes, depth + 1)
        return

    leaves.append(LeafPlan(path, list(values), _choose_leaf_codec(values)))
