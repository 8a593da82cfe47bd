"""Tensor calls of MooncakeDistributedStore: with real torch when it is
installed, otherwise with a numpy-backed stand-in (fake_torch.py); and a clear
ImportError when torch cannot be imported at all."""

from __future__ import annotations

import ctypes
import struct
import sys

import numpy as np
import pytest

from mooncake import _tensor

INVALID_PARAMS = -600

try:
    import torch as _real_torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


@pytest.fixture(params=["torch"] if HAVE_TORCH else ["fake"])
def torch(request, monkeypatch):
    if request.param == "torch":
        import torch

        return torch
    import fake_torch

    monkeypatch.setitem(sys.modules, "torch", fake_torch.module)
    return fake_torch.module


def make(torch, array):
    return torch.from_numpy(np.ascontiguousarray(array))


def as_np(t):
    return t.numpy() if hasattr(t, "numpy") else t.a


def test_without_torch_only_building_a_tensor_needs_it(store, monkeypatch):
    # As in the reference: no object is a tensor without torch (INVALID_PARAMS)
    # and a missing key is None; only turning stored bytes into a tensor
    # needs torch, and ours says so (the reference crashes or answers None).
    assert store.put("no-torch-tensor", _tensor.encode(0, (2,)) + bytes(8)) == 0
    monkeypatch.setitem(sys.modules, "torch", None)
    assert store.put_tensor("t", object()) == INVALID_PARAMS
    assert store.batch_put_tensor(["t"], [object()]) == [INVALID_PARAMS]
    assert store.put_tensor_with_tp("t", object(), tp_size=2) == INVALID_PARAMS
    assert store.pub_tensor("t", object()) == INVALID_PARAMS
    assert store.upsert_tensor("t", object()) == INVALID_PARAMS
    assert store.get_tensor("t") is None
    assert store.batch_get_tensor(["t"]) == [None]
    assert store.get_tensor_with_tp("t", tp_rank=0, tp_size=2) is None
    for call in (
        lambda: store.get_tensor("no-torch-tensor"),
        lambda: store.batch_get_tensor(["t", "no-torch-tensor"]),
    ):
        with pytest.raises(ImportError, match="PyTorch"):
            call()
    # the byte API does not need torch
    assert store.put("no-torch", b"x") == 0


def test_header_layout_matches_the_reference():
    h = _tensor.encode(6, (2, 3))
    assert len(h) == _tensor.HEADER_SIZE == 304
    assert struct.unpack_from("<4sHHii", h, 0) == (b"NOOM", 1, 304, 6, 2)
    assert struct.unpack_from("<QQQ", h, 16) == (0, 304, 24)
    assert struct.unpack_from("<8q", h, 40) == (2, 3, -1, -1, -1, -1, -1, -1)
    assert struct.unpack_from("<8q", h, 104) == (2, 3, -1, -1, -1, -1, -1, -1)
    assert h[168:] == bytes(136)
    shard = _tensor.encode(6, (2, 3), global_shape=(4, 3), shard=(1, 2, 0))
    assert struct.unpack_from("<Q", shard, 16) == (1,)
    assert struct.unpack_from("<8q", shard, 40)[:2] == (4, 3)
    assert struct.unpack_from("<8q", shard, 104)[:2] == (2, 3)
    assert struct.unpack_from("<QIIIIIIQ", shard, 168) == (1, 1, 0, 1, 2, 0, 0, 2)


def test_decode_rejects_garbage():
    assert _tensor.decode(memoryview(b"\0" * 400)) is None
    assert _tensor.decode(memoryview(b"x" * 10)) is None
    good = _tensor.encode(0, (4,)) + bytes(16)
    assert _tensor.decode(memoryview(good)) == _tensor.Meta(0, (4,), 304, 16)
    assert _tensor.decode(memoryview(good[:-1])) is None, "truncated data"


@pytest.mark.parametrize("np_dtype", ["float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool", "float16"])
def test_put_get_roundtrip(store, torch, np_dtype):
    arr = (np.arange(24) % 7).astype(np_dtype).reshape(2, 3, 4)
    key = f"tensor-{np_dtype}"
    assert store.put_tensor(key, make(torch, arr)) == 0
    got = store.get_tensor(key)
    assert str(got.dtype).endswith(np_dtype)
    assert tuple(got.shape) == (2, 3, 4)
    np.testing.assert_array_equal(as_np(got), arr)
    assert store.get_size(key) == 304 + arr.nbytes


def test_stored_bytes_are_header_plus_data(store, torch):
    arr = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert store.put_tensor("layout", make(torch, arr)) == 0
    raw = store.get("layout")
    assert raw[:304] == _tensor.encode(6, (2, 3))
    assert raw[304:] == arr.tobytes()


def test_odd_tensors(store, torch):
    assert store.put_tensor("scalar", make(torch, np.array(7, np.int32))) == 0
    assert tuple(store.get_tensor("scalar").shape) == (1,), "0-d tensors come back 1-d, as in the reference"
    assert store.put_tensor("empty", make(torch, np.zeros((0, 3), np.float32))) == 0
    assert tuple(store.get_tensor("empty").shape) == (0, 3)
    strided = make(torch, np.arange(12, dtype=np.int64).reshape(3, 4))
    if hasattr(strided, "a"):
        strided = type(strided)(strided.a[:, ::2], strided.dtype)
    else:
        strided = strided[:, ::2]
    assert store.put_tensor("strided", strided) == 0
    np.testing.assert_array_equal(as_np(store.get_tensor("strided")), np.arange(12).reshape(3, 4)[:, ::2])


def test_bad_inputs(store, torch):
    assert store.put_tensor("nt", [1, 2]) == INVALID_PARAMS
    assert store.put_tensor("nt2", np.zeros(3)) == INVALID_PARAMS, "a numpy array is not a tensor"
    assert store.get_tensor("missing") is None
    assert store.put("raw", b"x" * 400) == 0
    assert store.get_tensor("raw") is None, "bytes that are not a tensor"
    assert store.batch_put_tensor(["a", "b"], [make(torch, np.zeros(1))]) == [INVALID_PARAMS] * 2


def test_batches_pub_and_upsert(store, torch):
    t = make(torch, np.arange(8, dtype=np.float32))
    assert store.batch_put_tensor(["bt1", "bt2"], [t, t]) == [0, 0]
    got = store.batch_get_tensor(["bt1", "missing", "bt2"])
    assert got[1] is None
    np.testing.assert_array_equal(as_np(got[0]), np.arange(8, dtype=np.float32))
    assert store.batch_put_tensor(["bt1", "bt3"], [t, t]) == [0, 0], "existing key: kept, still 0"
    from mooncake.store import ReplicateConfig

    cfg = ReplicateConfig()
    cfg.with_soft_pin = True
    assert store.pub_tensor("pub", t, cfg) == 0
    assert store.batch_pub_tensor(["pub2"], [t], cfg) == [0]
    t2 = make(torch, np.ones((2, 2), np.int64))
    assert store.upsert_tensor("pub", t2) == 0
    np.testing.assert_array_equal(as_np(store.get_tensor("pub")), np.ones((2, 2)))
    assert store.upsert_pub_tensor("pub", t, cfg) == 0
    assert store.batch_upsert_tensor(["pub", "newu"], [t2, t2]) == [0, 0]
    assert store.batch_upsert_pub_tensor(["pub"], [t], cfg) == [0]
    np.testing.assert_array_equal(as_np(store.get_tensor("pub")), np.arange(8))


@pytest.mark.parametrize("split_dim", [0, 1, 2])
def test_tensor_parallel_shards(store, torch, split_dim):
    arr = np.arange(4 * 6 * 2, dtype=np.int32).reshape(4, 6, 2)
    key = f"tp{split_dim}"
    assert store.put_tensor_with_tp(key, make(torch, arr), tp_rank=0, tp_size=2, split_dim=split_dim) == 0
    for rank, want in enumerate(np.split(arr, 2, axis=split_dim)):
        got = store.get_tensor_with_tp(key, tp_rank=rank, tp_size=2, split_dim=split_dim)
        np.testing.assert_array_equal(as_np(got), want)
        np.testing.assert_array_equal(as_np(store.get_tensor(f"{key}_tp_{rank}")), want)
    assert store.is_exist(key) == 0, "only the shards are stored"


def test_tensor_parallel_edges(store, torch):
    arr = np.arange(10, dtype=np.int32).reshape(5, 2)
    assert store.put_tensor_with_tp("whole", make(torch, arr), tp_size=1) == 0
    assert store.is_exist("whole") == 1 and store.is_exist("whole_tp_0") == 0
    np.testing.assert_array_equal(as_np(store.get_tensor_with_tp("whole", tp_rank=0, tp_size=1)), arr)
    assert store.get_tensor_with_tp("whole", tp_rank=0, tp_size=2) is None
    assert store.put_tensor_with_tp("uneven", make(torch, arr), tp_size=2) == INVALID_PARAMS
    assert store.put_tensor_with_tp("baddim", make(torch, arr), tp_size=2, split_dim=5) == INVALID_PARAMS
    assert store.put_tensor_with_tp("negdim", make(torch, arr), tp_size=2, split_dim=-1) == INVALID_PARAMS
    assert store.put_tensor_with_tp("tp0", make(torch, arr), tp_size=0) == 0, "tp_size <= 1: the whole tensor"
    assert store.is_exist("tp0") == 1
    assert store.get_tensor_with_tp("whole", tp_rank=5, tp_size=2) is None
    even = make(torch, np.arange(8, dtype=np.int32).reshape(4, 2))
    assert store.batch_put_tensor_with_tp(["bx", "by"], [even, even], tp_size=2) == [0, 0]
    got = store.batch_get_tensor_with_tp(["bx", "nope"], tp_rank=1, tp_size=2)
    assert got[1] is None
    np.testing.assert_array_equal(as_np(got[0]), np.arange(4, 8).reshape(2, 2))
    assert store.pub_tensor_with_tp("pubtp", even, None, tp_rank=0, tp_size=4) == 0
    assert store.batch_pub_tensor_with_tp(["pubtp2"], [even], None, tp_size=2, split_dim=1) == [0]
    np.testing.assert_array_equal(as_np(store.get_tensor("pubtp2_tp_1")), np.arange(8).reshape(4, 2)[:, 1:])


def test_zero_copy_tensor_calls(store, torch):
    buf = np.zeros(1 << 16, np.uint8)
    p = buf.ctypes.data
    assert store.register_buffer(p, buf.nbytes) == 0
    try:
        arr = np.arange(16, dtype=np.float32).reshape(4, 4)
        assert store.put_tensor("zt", make(torch, arr)) == 0
        t = store.get_tensor_into("zt", p, 4096)
        np.testing.assert_array_equal(as_np(t), arr)
        assert t.data_ptr() == p + 304, "the tensor views the buffer"
        assert store.get_tensor_into("zt", p, 100) is None, "buffer too small"
        assert store.get_tensor_into("missing", p, 4096) is None
        got = store.batch_get_tensor_into(["zt", "missing"], [p + 8192, p + 16384], [4096, 4096])
        assert got[1] is None
        np.testing.assert_array_equal(as_np(got[0]), arr)
        # the buffer now holds [header][data]: store it back as is
        n = 304 + arr.nbytes
        assert store.put_tensor_from("zt-copy", p, n) == 0
        np.testing.assert_array_equal(as_np(store.get_tensor("zt-copy")), arr)
        assert store.put_tensor_from("zt-bad", p + 1, n) == INVALID_PARAMS
        assert store.put_tensor_from("zt-short", p, 100) == INVALID_PARAMS
        assert store.put_tensor_from("zt-wild", 16, n) == INVALID_PARAMS
        assert store.batch_put_tensor_from(["zf1", "zf2"], [p, p + 1], [n, n]) == [INVALID_PARAMS] * 2, "one bad buffer fails the batch"
        assert store.batch_put_tensor_from(["zf1", "zf2"], [p, p], [n, n]) == [0, 0]
        assert store.upsert_tensor_from("zt-copy", p, n) == 0
        assert store.batch_upsert_tensor_from(["zt-copy"], [p], [n]) == [0]
        # the same full tensor, split into shards straight from the buffer
        assert store.put_tensor_with_tp_from("ztp", p, n, tp_size=2, split_dim=1) == 0
        np.testing.assert_array_equal(as_np(store.get_tensor_with_tp("ztp", tp_rank=1, tp_size=2)), arr[:, 2:])
        assert store.batch_put_tensor_with_tp_from(["ztp2"], [p], [n], tp_size=4) == [0]
        t = store.get_tensor_with_tp_into("ztp2", p + 32768, 4096, tp_rank=3, tp_size=4)
        np.testing.assert_array_equal(as_np(t), arr[3:])
        got = store.batch_get_tensor_with_tp_into(["ztp2", "ztp"], [p + 40000, p + 50000], [4096, 4096], tp_rank=0, tp_size=2)
        np.testing.assert_array_equal(as_np(got[0]), arr[:1])
        np.testing.assert_array_equal(as_np(got[1]), arr[:, :2])
    finally:
        assert store.unregister_buffer(p) == 0


@pytest.mark.skipif(not HAVE_TORCH, reason="needs real torch")
def test_real_torch_dtypes(store):
    import torch

    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    assert store.put_tensor("bf16", t) == 0
    got = store.get_tensor("bf16")
    assert got.dtype == torch.bfloat16 and torch.equal(got, t)
    assert store.put_tensor("c64", torch.zeros(2, dtype=torch.complex64)) == INVALID_PARAMS
