"""Tensor and safetensors calls in a process where neither torch nor
safetensors can be imported: as in the reference, missing keys, non-tensor
objects and unreadable files give None or an error code, not ImportError."""

from __future__ import annotations

import importlib.util
import sys

import pytest

INVALID_PARAMS, FILE_NOT_FOUND = -600, -1100
OURS = importlib.util.find_spec("mooncake._mooncake") is not None


@pytest.fixture
def no_torch(monkeypatch):
    for name in ("torch", "safetensors", "safetensors.torch"):
        monkeypatch.setitem(sys.modules, name, None)


def test_safetensors_without_torch_or_safetensors(store, no_torch, tmp_path):
    assert store.put("nt-raw", b"x" * 400) == 0
    assert store.save_tensor_to_safetensor("nt-missing", str(tmp_path / "a.safetensors")) == FILE_NOT_FOUND
    assert store.save_tensor_to_safetensor("nt-raw", str(tmp_path / "b.safetensors")) == FILE_NOT_FOUND
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    for f in [str(tmp_path / "none.safetensors"), str(garbage), ""]:
        assert store.load_tensor_from_safetensor("nt-k", f) is None
    assert not (tmp_path / "a.safetensors").exists()


@pytest.mark.skipif(not OURS, reason="the reference crashes here (double free) when numpy is missing too")
def test_saving_a_stored_tensor_without_torch_is_invalid_params(store, no_torch, tmp_path):
    from mooncake import _tensor

    assert store.put("nt-tensor", _tensor.encode(0, (4,)) + bytes(16)) == 0
    assert store.save_tensor_to_safetensor("nt-tensor", str(tmp_path / "c.safetensors")) == INVALID_PARAMS
    assert not (tmp_path / "c.safetensors").exists()


def test_tensor_calls_without_torch(store, no_torch):
    assert store.put("nt-raw2", b"y" * 400) == 0
    assert store.get_tensor("nt-missing") is None
    assert store.get_tensor("nt-raw2") is None
    assert store.batch_get_tensor(["nt-missing", "nt-raw2"]) == [None, None]
    assert store.get_tensor_with_tp("nt-missing", tp_rank=0, tp_size=2) is None
    assert store.batch_get_tensor_with_tp(["nt-missing"], tp_rank=0, tp_size=2) == [None]
    for value in (object(), [1, 2], None):
        assert store.put_tensor("nt-obj", value) == INVALID_PARAMS
    assert store.batch_put_tensor(["nt-obj"], [object()]) == [INVALID_PARAMS]
    assert store.pub_tensor("nt-obj", object()) == INVALID_PARAMS
    assert store.upsert_tensor("nt-obj", object()) == INVALID_PARAMS
    assert store.put_tensor_with_tp("nt-obj", object(), tp_size=2) == INVALID_PARAMS
    assert store.is_exist("nt-obj") == 0
