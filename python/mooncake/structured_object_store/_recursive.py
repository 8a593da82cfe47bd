"""The ``structured_recursive`` column codec: rows of nested dicts and lists
whose leaves msgpack cannot hold as they are (tensors, arrays, bytes).

:func:`~._inference.infer_structure` splits the column into nodes (dict and
list levels) and leaf columns; each leaf is stored with the codec chosen for
it (:mod:`._codecs`) plus a ``missing`` flag per row, and each node with a
``state`` per row (0 present, 1 ``None``, 2 absent from its parent dict)
and, for lists, each row's ``lengths``. The metadata names the nodes (path,
type, children) and the leaves (path, codec, codec metadata, payloads)::

    {"nodes": [{"path", "type", "children"}], "leaves": [{"path", "codec",
     "metadata", "parts": [...]}]}

Payload names: ``n<i>.state``, ``n<i>.lengths``, ``l<i>.<part>``,
``l<i>.missing``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ._inference import MISSING, LeafPlan, StructureNode, _msgpack_fits, infer_structure

_PRESENT, _NULL, _ABSENT = 0, 1, 2


def wants_recursive(values: list) -> bool:
    """Whether rows have dict/list structure that msgpack cannot hold whole."""
    structured = [v for v in values if isinstance(v, (dict, list))]
    return bool(structured) and not all(v is None or _msgpack_fits(v) for v in values)


def _state(value: Any) -> int:
    return _ABSENT if value is MISSING else _NULL if value is None else _PRESENT


def encode(name: str, values: list, encode_column) -> tuple[dict[str, Any], dict[str, Any]]:
    leaves: list[LeafPlan] = []
    nodes: list[StructureNode] = []
    infer_structure("", values, leaves, nodes)
    payload: dict[str, Any] = {}
    node_specs, leaf_specs = [], []
    columns = _node_columns(values, nodes)
    for i, node in enumerate(nodes):
        payload[f"n{i}.state"] = np.fromiter((_state(v) for v in columns[i]), dtype=np.uint8,
                                              count=len(values))
        if node.node_type == "list":
            payload[f"n{i}.lengths"] = np.asarray(node.lengths, dtype=np.int64)
        node_specs.append({"path": node.path, "type": node.node_type, "children": list(node.children)})
    for i, leaf in enumerate(leaves):
        codec, parts, metadata = encode_column(f"{name}{leaf.path}",
                                               [None if v is MISSING else v for v in leaf.values])
        for part, value in parts.items():
            payload[f"l{i}.{part}"] = value
        payload[f"l{i}.missing"] = np.fromiter((v is MISSING for v in leaf.values), dtype=np.uint8,
                                               count=len(values))
        leaf_specs.append({"path": leaf.path, "codec": codec, "metadata": metadata, "parts": list(parts)})
    return payload, {"nodes": node_specs, "leaves": leaf_specs}


def _node_columns(values: list, nodes: list[StructureNode]) -> list[list]:
    """Each node's column (its value in every row), found by walking paths
    the way infer_structure built them (parents come before children)."""
    by_path: dict[str, list] = {"": values}
    out = []
    for node in nodes:
        column = by_path[node.path]
        out.append(column)
        for child in node.children:
            if node.node_type == "dict":
                from ._inference import _escape_key

                path = f"{node.path}.{_escape_key(child)}"
                by_path[path] = [v.get(child, MISSING) if isinstance(v, dict) else None for v in column]
            else:
                path = f"{node.path}[{child}]"
                by_path[path] = [(v[child] if child < len(v) else MISSING) if isinstance(v, list) else None
                                 for v in column]
    return out


def decode(payload: Mapping[str, Any], rows: int, metadata: Mapping[str, Any], decode_column) -> list:
    leaves: dict[str, list] = {}
    for i, spec in enumerate(metadata.get("leaves", [])):
        parts = {part: payload[f"l{i}.{part}"] for part in spec["parts"]}
        column = decode_column(spec["codec"], parts, rows, spec.get("metadata") or {})
        missing = np.asarray(payload[f"l{i}.missing"], dtype=np.uint8)
        if len(missing) != rows:
            raise ValueError(f"recursive leaf {spec['path']!r} has {len(missing)} rows, expected {rows}")
        leaves[spec["path"]] = [MISSING if missing[r] else column[r] for r in range(rows)]
    nodes = {}
    for i, spec in enumerate(metadata.get("nodes", [])):
        state = np.asarray(payload[f"n{i}.state"], dtype=np.uint8)
        lengths = payload.get(f"n{i}.lengths")
        nodes[spec["path"]] = (spec, state, None if lengths is None else np.asarray(lengths, dtype=np.int64))

    from ._inference import _escape_key

    def build(path: str, row: int) -> Any:
        if path in leaves:
            return leaves[path][row]
        if path not in nodes:
            return MISSING
        spec, state, lengths = nodes[path]
        if state[row] == _ABSENT:
            return MISSING
        if state[row] == _NULL:
            return None
        if spec["type"] == "dict":
            out = {}
            for key in spec["children"]:
                value = build(f"{path}.{_escape_key(key)}", row)
                if value is not MISSING:
                    out[key] = value
            return out
        return [build(f"{path}[{i}]", row) for i in range(int(lengths[row]))]

    return [None if (v := build("", r)) is MISSING else v for r in range(rows)]
