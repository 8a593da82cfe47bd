"""``mooncake.structured_object_store``: how columns of structured rows are
split into dict/list nodes and leaves, and which codec each leaf gets.

The file also runs against the reference package's module (same names);
cases where the two choose differently are checked on ours only."""

from __future__ import annotations

import importlib.util
import os
import pickle

import numpy as np
import pytest

from mooncake.structured_object_store import MISSING, _choose_leaf_codec, _escape_key, infer_structure

if os.environ.get("MOONCAKE_TEST_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

OURS = importlib.util.find_spec("mooncake._mooncake") is not None


def codec(values):
    d = _choose_leaf_codec(values)
    return d.codec, d.accepted


def infer(values, root="r"):
    leaves, nodes = [], []
    infer_structure(root, values, leaves, nodes)
    return leaves, nodes


@pytest.mark.parametrize(
    "values,expected",
    [
        ([torch.tensor([1, 2]), torch.tensor([[3]])], ("ragged_tensor", True)),
        ([torch.zeros(2), None, torch.zeros(3, dtype=torch.float32)], ("ragged_tensor", True)),
        ([torch.zeros(2), torch.zeros(2, dtype=torch.int64)], ("ragged_tensor", False)),
        ([[1, 2, 3], [4.5], (6, 7)], ("typed_ragged", True)),
        ([np.arange(3), np.arange(2.0)], ("typed_ragged", True)),
        ([b"a", bytearray(b"b"), None], ("bytes_ragged", True)),
        (["a", None, "b", MISSING], ("utf8_ragged", True)),
        ([1, 2.0, True, np.int64(3), np.float32(1.5)], ("ndarray", True)),
        ([{"a": 1}, {"b": [1, "x", None]}], ("msgpack_ragged", True)),
        ([object()], ("msgpack_ragged", False)),
        ([1 + 2j], ("msgpack_ragged", False)),
        ([], (None, False)),
        ([None, MISSING], (None, False)),
    ],
)
def test_leaf_codecs(values, expected):
    got = codec(values)
    if expected[0] is None:
        assert got[1] is False
    else:
        assert got == expected


def test_a_late_value_msgpack_cannot_hold_rejects_the_leaf():
    d = _choose_leaf_codec([{"ok": i} for i in range(500)] + [object()])
    assert not d.accepted and d.codec == "msgpack_ragged"


@pytest.mark.skipif(not OURS, reason="the reference accepts a dict whatever it holds")
def test_values_inside_dicts_are_checked_too():
    d = _choose_leaf_codec([{"ok": i} for i in range(500)] + [{"bad": {1, 2}}])
    assert not d.accepted and d.codec == "msgpack_ragged" and "row 500" in d.reason
    assert codec([{"a": object()}]) == ("msgpack_ragged", False)


@pytest.mark.skipif(not OURS, reason="the reference rejects mixed scalars")
def test_mixed_json_scalars_are_msgpack():
    assert codec([1, "a", None, b"x"]) == ("msgpack_ragged", True)
    assert codec([2**64]) == ("msgpack_ragged", False)


def test_escape_key():
    assert [_escape_key(k) for k in ("x", "a.b", "a[0]", "a\\b", ".[\\")] == [
        "x", "a\\.b", "a\\[0]", "a\\\\b", "\\.\\[\\\\",
    ]


def test_dict_rows_become_a_node_with_one_leaf_per_key():
    leaves, nodes = infer([{"x": 1, "y": "a", "z.w": None}, {"x": 2, "y": "b"}, None])
    assert [(n.path, n.node_type, n.children, n.row_mask) for n in nodes] == [
        ("r", "dict", ["x", "y", "z.w"], [True, True, False]),
    ]
    by_path = {leaf.path: leaf for leaf in leaves}
    assert sorted(by_path) == ["r.x", "r.y", "r.z\\.w"]
    assert by_path["r.x"].values == [1, 2, None] and by_path["r.x"].decision.codec == "ndarray"
    z = by_path["r.z\\.w"].values
    assert z[0] is None and z[1] is MISSING and z[2] is None
    _, nodes = infer([{"x": 1}, {"x": 2}])
    assert nodes[0].row_mask == [True, True]


def test_lists_of_structures_become_positions():
    leaves, nodes = infer([[{"k": 1}, {"k": 5}], [{"k": 2}], None])
    assert [(n.path, n.node_type, n.children) for n in nodes] == [
        ("r", "list", [0, 1]), ("r[0]", "dict", ["k"]), ("r[1]", "dict", ["k"]),
    ]
    assert nodes[0].lengths == [2, 1, 0] and nodes[0].row_mask == [True, True, False]
    assert nodes[2].row_mask == [True, False, False]
    assert [(leaf.path, leaf.values) for leaf in leaves] == [("r[0].k", [1, 2, None]), ("r[1].k", [5, None, None])]
    # A list of plain numbers stays one leaf.
    leaves, nodes = infer([[1, 2], [3]])
    assert nodes == [] and leaves[0].decision.codec == "typed_ragged"


def test_nested_dicts_of_tensors():
    rows = [{"a": {"t": torch.arange(2)}}, {"a": {"t": torch.arange(3)}}, {"a": None}]
    leaves, nodes = infer(rows)
    assert [n.path for n in nodes] == ["r", "r.a"]
    assert leaves[0].path == "r.a.t" and leaves[0].decision.codec == "ragged_tensor"
    assert leaves[0].values[2] is None


def test_depth_limit():
    deep = 1
    for _ in range(40):
        deep = {"a": deep}
    with pytest.raises(ValueError):
        infer([deep])
    shallow = 1
    for _ in range(10):
        shallow = {"a": shallow}
    leaves, nodes = infer([shallow])
    assert len(nodes) == 10 and leaves[0].path == "r" + ".a" * 10


def test_missing_is_one_sentinel():
    assert repr(MISSING) == "<MISSING>" and MISSING is not None
    if OURS:
        assert pickle.loads(pickle.dumps(MISSING)) is MISSING
        assert type(MISSING)() is MISSING
