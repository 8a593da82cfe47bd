"""``mooncake.structured_object_store``: bundles, structured objects, read
specs and DataProto stages, over an in-memory stand-in store (which counts
the calls the layer makes) and over the real store of the test cluster.

The cases make the same calls and assertions as the reference package's own
test file, which CI cannot fetch."""

from __future__ import annotations

import ctypes
import json
import threading

import numpy as np
import pytest

pytest.importorskip("msgpack")

import mooncake.structured_object_store as sos
from mooncake.structured_object_store import (
    BundleTransferPolicy,
    FieldSchema,
    MooncakeBundleTransfer,
    RemoteBundleRef,
    StructuredObjectPayload,
    StructuredObjectReadSpec,
    export_dataproto_ref,
    import_dataproto_ref,
    raw_destination,
    tensor_object_buffer,
)


class Batch:
    def __init__(self, batch=None, non_tensor_batch=None, meta_info=None):
        self.batch = batch or {}
        self.non_tensor_batch = non_tensor_batch or {}
        self.meta_info = meta_info or {}

    @classmethod
    def from_dict(cls, batch, non_tensor_batch=None, meta_info=None):
        return cls(batch, non_tensor_batch, meta_info)


class Config:
    def __init__(self, group_ids, replica_num=1):
        self.group_ids = group_ids
        self.replica_num = replica_num


class FakeStore:
    """Bytes in a dict, with the store's call shapes, counting calls."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.tensors: dict[str, object] = {}
        self.registered: set[int] = set()
        self.calls: dict[str, int] = {}
        self.configs: list = []
        self.lock = threading.Lock()

    def _count(self, name):
        with self.lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    def put(self, key, value, config=None):
        self._count("put")
        self.configs.append(config)
        self.objects[key] = bytes(value)
        return 0

    def get(self, key):
        self._count("get")
        return self.objects[key]

    def remove(self, key, force=False):
        self._count("remove")
        self.objects.pop(key, None)
        self.tensors.pop(key, None)
        return 0

    def batch_remove(self, keys, force=False):
        self._count("batch_remove")
        return [self.remove(k, force) for k in keys]

    def batch_put_from(self, keys, ptrs, sizes, config=None):
        self._count("batch_put_from")
        self.configs.append(config)
        for key, ptr, size in zip(keys, ptrs, sizes):
            self.objects[key] = ctypes.string_at(ptr, size)
        return [0] * len(keys)

    def put_tensor_from(self, key, ptr, size):
        self._count("put_tensor_from")
        self.objects[key] = ctypes.string_at(ptr, size)
        return 0

    def register_buffer(self, ptr, size):
        self._count("register_buffer")
        if ptr in self.registered:
            return -600
        self.registered.add(ptr)
        return 0

    def unregister_buffer(self, ptr):
        self._count("unregister_buffer")
        self.registered.remove(ptr)
        return 0

    def get_into(self, key, ptr, size):
        self._count("get_into")
        data = self.objects[key]
        if len(data) > size:
            return -1
        ctypes.memmove(ptr, data, len(data))
        return len(data)

    def batch_get_into(self, keys, ptrs, sizes):
        self._count("batch_get_into")
        return [self.get_into(k, p, s) for k, p, s in zip(keys, ptrs, sizes)]

    def get_into_ranges(self, ptrs, all_keys, all_dst, all_src, all_sizes):
        self._count("get_into_ranges")
        out = []
        for base, keys, dsts, srcs, sizes in zip(ptrs, all_keys, all_dst, all_src, all_sizes):
            per = []
            for key, dst, src, size in zip(keys, dsts, srcs, sizes):
                data = self.objects[key]
                got = []
                for d, s, n in zip(dst, src, size):
                    if s + n > len(data):
                        got.append(-1)
                        continue
                    ctypes.memmove(base + d, data[s: s + n], n)
                    got.append(n)
                per.append(got)
            out.append(per)
        return out

    def put_tensor(self, key, tensor):
        self._count("put_tensor")
        self.tensors[key] = tensor.detach().clone()
        self.objects[key] = b""
        return 0

    def pub_tensor(self, key, tensor, config=None):
        self._count("pub_tensor")
        self.configs.append(config)
        return self.put_tensor(key, tensor)

    def get_tensor(self, key):
        self._count("get_tensor")
        return self.tensors[key].clone()


class PlainStore(FakeStore):
    """Only put/get/remove."""

    batch_put_from = register_buffer = unregister_buffer = put_tensor_from = None
    get_into = batch_get_into = get_into_ranges = batch_remove = None
    put_tensor = pub_tensor = get_tensor = None


class Lease:
    def __init__(self, pool, size):
        self.pool, self._buf = pool, ctypes.create_string_buffer(max(size, 1))
        self.ptr = ctypes.addressof(self._buf)
        self.done = False

    def release(self):
        if not self.done:
            self.done = True
            self.pool.released += 1


class Pool:
    def __init__(self):
        self.sizes, self.released = [], 0

    def acquire(self, size):
        self.sizes.append(size)
        return Lease(self, size)


def make(store=None, **kw):
    store = store or FakeStore()
    return store, MooncakeBundleTransfer(store, key_prefix="t", **kw)


# ---- structured objects -------------------------------------------------


def test_defaults_and_roundtrip_metadata():
    assert sos.DEFAULT_BUNDLE_CHUNK_BYTES == 64 << 20
    assert sos.AUTO_PARALLEL_MIN_BYTES == sos.DEFAULT_BUNDLE_CHUNK_BYTES
    store, t = make()
    array = np.arange(12, dtype=np.int16).reshape(3, 4)
    ref = t.put_structured_object(StructuredObjectPayload({"type": "x"}, {"w": array, "raw": b"abc"}))
    result = t.materialize(t.read_spec(ref))
    assert result.metadata == {
        "layout": "structured", "type": "x",
        "__mooncake_structured_fields__": {
            "w": {"encoding": "ndarray", "dtype": array.dtype.str, "shape": [3, 4]},
            "raw": {"encoding": "bytes"},
        },
    }
    assert np.array_equal(result.objects["w"], array) and result.objects["w"].flags["C_CONTIGUOUS"]
    assert result.objects["raw"] == b"abc"
    assert store.registered == set()
    with pytest.raises(TypeError, match="requires buffers"):
        StructuredObjectPayload(metadata={})


def test_put_object_wraps_single_values():
    _store, t = make()
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(t.get_object(t.put_object(array)), array)
    got = t.get_object(t.put_object({"a": array, "b": b"xy"}))
    assert np.array_equal(got["a"], array) and got["b"] == b"xy"


def test_chunks_and_fallbacks():
    store, t = make(default_chunk_bytes=17)
    ref = t.put_bundle(b"meta", {"payload": bytes(range(128))})
    chunks = ref.manifest["buffers"]["payload"]["chunks"]
    assert len(chunks) > 1 and chunks[0]["bytes"] == 17
    plain, t2 = make(PlainStore())
    ref = t2.put_structured_object(StructuredObjectPayload(buffers={"p": bytes(range(128))}), chunk_bytes=17)
    assert t2.materialize(t2.read_spec(ref)).objects["p"] == bytes(range(128))
    assert plain.registered == set()
    with pytest.raises(RuntimeError, match="zero-copy put"):
        t2.put_structured_object(StructuredObjectPayload(buffers={"p": b"d"}),
                                 policy=BundleTransferPolicy(copy_mode="zero_copy"))
    store, t = make()
    t.put_structured_object(StructuredObjectPayload(buffers={"p": bytes(128)}), chunk_bytes=17,
                            policy=BundleTransferPolicy(copy_mode="copy"))
    assert "batch_put_from" not in store.calls and "register_buffer" not in store.calls


def test_member_selection_and_slices_read_only_their_bytes():
    store, t = make()
    array = np.arange(96, dtype=np.int16).reshape(12, 8)
    ref = t.put_structured_object(StructuredObjectPayload(buffers={"w": array, "raw": b"p"}), chunk_bytes=20)
    spec = t.read_spec(ref).select_members(["w"]).slice_member("w", axis=0, start=3, end=9)
    assert isinstance(spec, StructuredObjectReadSpec) and spec.member_slice("w").start == 3
    before = store.calls.get("get_into_ranges", 0)
    result = t.materialize(spec)
    assert list(result.objects) == ["w"]
    assert np.array_equal(result.objects["w"], array[3:9])
    assert store.calls["get_into_ranges"] == before + 1
    stepped = t.materialize(t.read_spec(ref).slice_member("w", axis=0, start=1, end=12, step=3))
    assert np.array_equal(stepped.objects["w"], array[1:12:3])
    plain, t2 = make(PlainStore())
    ref2 = t2.put_structured_object(StructuredObjectPayload(buffers={"w": array}), chunk_bytes=20)
    got = t2.materialize(t2.read_spec(ref2).slice_member("w", axis=0, start=3, end=9)).objects["w"]
    assert np.array_equal(got, array[3:9])


def test_destinations_and_errors():
    store, t = make()
    array = np.arange(96, dtype=np.float32).reshape(12, 8)
    ref = t.put_structured_object(StructuredObjectPayload(buffers={"w": array, "raw": b"abc"}), chunk_bytes=40)
    dest = np.empty((8, 8), dtype=np.float32)
    ptr = dest.ctypes.data
    assert store.register_buffer(ptr, dest.nbytes) == 0  # registered already: tolerated, kept
    got = t.materialize_into(t.read_spec(ref).slice_member("w", 0, 2, 10), {"w": dest})
    assert got.objects["w"] is dest and np.array_equal(dest, array[2:10]) and ptr in store.registered
    store.unregister_buffer(ptr)
    raw = ctypes.create_string_buffer(array.nbytes)
    got = t.materialize_into(t.read_spec(ref).select_members(["w"]),
                             {"w": raw_destination(ctypes.addressof(raw), array.nbytes, raw)})
    assert raw.raw == array.tobytes()
    spec = t.read_spec(ref)
    with pytest.raises(ValueError, match="axis=0"):
        t.materialize(spec.slice_member("w", axis=1, start=0, end=2))
    with pytest.raises(ValueError, match="step must be positive"):
        t.materialize(spec.slice_member("w", axis=0, start=0, end=2, step=0))
    with pytest.raises(ValueError, match="does not support slicing"):
        t.materialize(spec.slice_member("raw", axis=0, start=0, end=1))
    with pytest.raises(ValueError, match="shape mismatch"):
        t.materialize_into(spec.slice_member("w", 0, 1, 3), {"w": np.empty((3, 8), np.float32)})
    readonly = np.empty((2, 8), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        t.materialize_into(spec.slice_member("w", 0, 1, 3), {"w": readonly})
    with pytest.raises(ValueError, match="selected no members"):
        t.materialize(spec.select_members([]))


def test_pool_backed_reads_release_once():
    pool = Pool()
    store, t = make(buffer_pool=pool)
    array = np.arange(64, dtype=np.int16).reshape(8, 8)
    ref = t.put_structured_object(StructuredObjectPayload(buffers={"w": array}), chunk_bytes=32)
    pool.sizes.clear()
    released = pool.released
    result = t.materialize(t.read_spec(ref))
    assert np.array_equal(result.objects["w"], array)
    assert hasattr(result.objects["w"], "_mooncake_pool_owner")
    assert pool.sizes == [array.nbytes]
    MooncakeBundleTransfer.release_result(result.objects)
    MooncakeBundleTransfer.release_result(result.objects)
    assert pool.released == released + 1


def test_remove_cleanup_and_tampering():
    store, t = make()
    ref = t.put_bundle(b"meta", {"payload": b"data"})
    t.remove_bundle(ref)
    assert store.objects == {} and store.calls["batch_remove"] == 1

    class Failing(FakeStore):
        def put(self, key, value, config=None):
            if len(self.objects) == 2:
                raise RuntimeError("injected put failure")
            return super().put(key, value, config)

    failing, t2 = make(Failing())
    with pytest.raises(RuntimeError, match="injected put failure"):
        t2.put_bundle(b"meta", {"payload": b"data"}, chunk_bytes=2)
    assert failing.objects == {}

    ref = t.put_bundle(b"meta", {"payload": b"abcdef"}, chunk_bytes=2)
    tampered = json.loads(store.objects[ref.manifest_key])
    tampered["buffers"]["payload"]["chunks"] = [{"key": "other/object", "bytes": 6}]
    store.objects[ref.manifest_key] = json.dumps(tampered).encode()
    with pytest.raises(ValueError, match="namespace"):
        t.materialize(t.read_spec({"manifest_key": ref.manifest_key}))
    with pytest.raises(ValueError, match="manifest_key"):
        t.remove_bundle(RemoteBundleRef(manifest_key="t/other/manifest", manifest=ref.manifest))
    tampered = dict(ref.manifest, cleanup_keys=["other/object"])
    store.objects[ref.manifest_key] = json.dumps(tampered).encode()
    with pytest.raises(ValueError, match="cleanup_keys"):
        t.remove_bundle({"manifest_key": ref.manifest_key})


def test_invalid_arguments():
    _store, t = make()
    with pytest.raises(ValueError, match="chunk_bytes"):
        MooncakeBundleTransfer(FakeStore(), default_chunk_bytes=0)
    with pytest.raises(ValueError):
        MooncakeBundleTransfer(FakeStore(), key_prefix="")
    with pytest.raises(ValueError, match="max_inflight_put"):
        t.put_bundle(b"m", {"p": b"x"}, policy=BundleTransferPolicy(max_inflight_put=0))
    with pytest.raises(ValueError, match="partition"):
        t.put_bundle(b"m", {"p": b"x"}, partition="a/b")
    with pytest.raises(TypeError, match="mapping"):
        t.put_structured_object(StructuredObjectPayload(metadata=["x"], buffers={}))
    with pytest.raises(TypeError, match="JSON-serializable"):
        t.put_structured_object(StructuredObjectPayload(metadata={"bad": object()}, buffers={}))
    with pytest.raises(ValueError, match="reserved"):
        t.put_structured_object(StructuredObjectPayload({"__mooncake_structured_fields__": {}}, {"p": b"a"}))


def test_group_ids_expand_per_key():
    store, t = make()
    config = Config(["rollout"], replica_num=2)
    ref = t.put_structured_object(StructuredObjectPayload(buffers={"p": bytes(64)}), chunk_bytes=16,
                                  config=config)
    assert t.materialize(t.read_spec(ref)).objects["p"] == bytes(64)
    seen = [list(c.group_ids) for c in store.configs if c is not None]
    assert seen and all(set(ids) == {"rollout"} for ids in seen)
    assert config.group_ids == ["rollout"]
    expanded = sos._config_for_grouped_keys(config, 3)
    assert expanded is not config and expanded.group_ids == ["rollout"] * 3 and expanded.replica_num == 2
    with pytest.raises(ValueError, match="config.group_ids"):
        t.put_structured_object(StructuredObjectPayload(buffers={"p": b"x"}), config=Config(["a", "b"]))
    store, t = make()
    ref = t.put({"ids": np.arange(4)}, type="dict", config=Config(None, replica_num=2))
    group = ref._storage_group_id
    assert group.startswith("structured-") and export_dataproto_ref(ref)["storage_group_id"] == group
    assert all(list(c.group_ids) == [group] for c in store.configs)


# ---- DataProto ---------------------------------------------------------------


def test_dataproto_roundtrip_selection_and_view():
    _store, t = make()
    data = Batch({"input_ids": np.arange(12, dtype=np.int64).reshape(4, 3),
                  "mask": np.ones((4, 3), np.int32)},
                 {"reward": np.asarray([1.0, 0.0, 0.5, -1.0], np.float32)}, {"step": 7, "src": "u"})
    ref = t.put_dataproto(data, namespace="roll", partition="train", stage="rollout")
    assert ref.batch_size == 4 and set(ref.stage_refs) == {"rollout"}
    full = t.get_dataproto(ref, data_cls=Batch)
    assert np.array_equal(full.batch["input_ids"], data.batch["input_ids"])
    assert np.array_equal(full.non_tensor_batch["reward"], data.non_tensor_batch["reward"])
    assert full.meta_info == data.meta_info
    part = t.get_dataproto(ref, fields=["input_ids", "reward"], meta_info_keys=["step"])
    assert set(part["batch"]) == {"input_ids"} and part["meta_info"] == {"step": 7}
    view = t.dataproto_manifest_view(ref)
    assert view["batch_fields"]["input_ids"]["spec"]["shape"] == [4, 3]
    assert view["stages"]["rollout"]["dataproto"]["stage"] == "rollout"
    assert view["meta_info_keys"] == ["src", "step"]
    with pytest.raises(ValueError, match="fields cannot be combined"):
        t.get_dataproto(ref, fields=["input_ids"], batch_fields=["mask"])
    with pytest.raises(KeyError, match="unknown DataProto fields"):
        t.get_dataproto(ref, fields=["missing"])
    with pytest.raises(TypeError, match="cannot be constructed"):
        t.get_dataproto(ref, data_cls=type("Bad", (), {"__init__": lambda self: None}))


def test_dataproto_rows():
    store, t = make()
    ids = np.arange(48, dtype=np.int64).reshape(12, 4)
    text = np.asarray([f"p{i}" if i % 3 else None for i in range(12)], dtype=object)
    ref = t.put_dataproto(Batch({"ids": ids}, {"text": text}), chunk_bytes=40)
    for rows in (slice(1, 11, 3), [11, 3, 3, 0], [], [-1, 0], slice(None, None, 2)):
        got = t.get_dataproto(ref, rows=rows)
        assert np.array_equal(got["batch"]["ids"], ids[rows])
        assert got["non_tensor_batch"]["text"].tolist() == text[rows].tolist()
    dest = np.empty((2, 4), np.int64)
    assert t.get_dataproto(ref, batch_fields=["ids"], rows=[5, 6], destinations={"ids": dest})["batch"]["ids"] is dest
    assert np.array_equal(dest, ids[[5, 6]])
    with pytest.raises(IndexError, match="out of range"):
        t.get_dataproto(ref, rows=[12])
    with pytest.raises(TypeError, match="row indices"):
        t.get_dataproto(ref, rows=["0"])
    with pytest.raises(ValueError, match="step must be positive"):
        t.get_dataproto(ref, rows=slice(None, None, -1))
    with pytest.raises(ValueError, match="destination shape mismatch"):
        t.get_dataproto(ref, batch_fields=["ids"], rows=[0, 1, 2], destinations={"ids": np.empty((2, 4), np.int64)})


def test_dataproto_append_lineage_overwrite_and_cleanup():
    store, t = make()
    ref = t.put_dataproto(Batch({"ids": np.arange(4)}), stage="rollout")
    first = ref.stage_refs["rollout"].manifest_key
    ref = t.append_dataproto_fields(ref, Batch({"values": np.arange(4.0)}), stage="rollout")
    second = ref.stage_refs["rollout"].manifest_key
    ref = t.append_dataproto_fields(ref, Batch({"rewards": np.arange(4.0) * 2}), stage="rollout")
    manifest = sos._decode_manifest(store.objects[ref.stage_refs["rollout"].manifest_key])
    assert {first, second} <= set(manifest["cleanup_keys"])
    assert set(manifest["buffers"]) == {"batch.ids", "batch.values", "batch.rewards"}
    ref = t.append_dataproto_fields(ref, Batch({"critic": np.arange(4)}), stage="critic")
    got = t.get_dataproto(ref)["batch"]
    assert np.array_equal(got["rewards"], np.arange(4.0) * 2) and np.array_equal(got["critic"], np.arange(4))
    with pytest.raises(ValueError, match="already exist"):
        t.append_dataproto_fields(ref, Batch({"ids": np.arange(4)}), stage="x")
    with pytest.raises(ValueError, match="must include existing fields"):
        t.append_dataproto_fields(ref, Batch({"critic": np.arange(4), "ids": np.arange(4)}),
                                  stage="rollout", overwrite=True)
    old = ref.stage_refs["critic"].manifest_key
    ref = t.append_dataproto_fields(ref, Batch({"critic": np.arange(4) + 1}), stage="critic", overwrite=True)
    assert old not in store.objects
    assert np.array_equal(t.get_dataproto(ref)["batch"]["critic"], np.arange(4) + 1)
    with pytest.raises(ValueError, match="inconsistent batch sizes"):
        t.append_dataproto_fields(ref, Batch({"short": np.arange(3)}), stage="s")
    t.cleanup_dataproto(ref)
    assert store.objects == {}


def test_dataproto_object_codecs_and_handles():
    store, t = make()
    data = Batch({"ids": np.arange(4)}, {
        "text": np.asarray(["hello", None, "world", "moon"], dtype=object),
        "json": np.asarray([{"a": 1}, None, {"b": [2, 3]}, {"c": "x"}], dtype=object),
        "blob": np.asarray([b"a", None, bytearray(b"bc"), memoryview(b"def")], dtype=object),
        "nullable_int": np.asarray([1, None, 3, 4], dtype=object),
        "tokens": np.asarray([[1, 2], [3], [], [4, 5, 6]], dtype=object),
    }, {"scores": np.asarray([1, 2])})
    ref = t.put_dataproto(data)
    assert ref.encoded_non_tensor["json"]["codec"] == "msgpack_ragged"
    assert ref.encoded_non_tensor["text"]["codec"] == "utf8_ragged"
    other = MooncakeBundleTransfer(store, key_prefix="t")
    handle = json.loads(json.dumps(export_dataproto_ref(ref)))
    assert handle["meta_info"] == {"scores": [1, 2]}
    got = other.get_dataproto(import_dataproto_ref(handle))["non_tensor_batch"]
    assert got["text"].tolist() == ["hello", None, "world", "moon"]
    assert got["json"].tolist() == [{"a": 1}, None, {"b": [2, 3]}, {"c": "x"}]
    assert got["blob"].tolist() == [b"a", None, b"bc", b"def"]
    assert got["nullable_int"].tolist() == [1, None, 3, 4]
    assert got["tokens"].tolist() == [[1, 2], [3], [], [4, 5, 6]]
    rows = other.get_dataproto(handle, rows=[3, 0])["non_tensor_batch"]
    assert rows["text"].tolist() == ["moon", "hello"]
    payload, _meta = sos._encode_msgpack_ragged_values("json", [{"a": 1}, {"b": 2}])
    with pytest.raises(ValueError, match="offsets length"):
        sos._decode_msgpack_ragged_values(payload, 1)
    other.cleanup_dataproto(handle)
    assert store.objects == {}


def test_flat_dicts_and_envelopes():
    _store, t = make()
    ref = t.put({"ids": np.arange(6).reshape(3, 2), "uid": ["a", "b", "c"], "step": 3}, type="dict")
    got = t.get(ref, type="dict")
    assert np.array_equal(got["ids"], np.arange(6).reshape(3, 2))
    assert list(got["uid"]) == ["a", "b", "c"] and got["step"] == 3
    plain = t.get_dataproto(t.put_dataproto({"batch": np.arange(4), "meta_info": np.arange(4)}))
    assert np.array_equal(plain["batch"]["meta_info"], np.arange(4)) and plain["meta_info"] == {}
    with pytest.raises(ValueError, match="overlap"):
        t.put_dataproto({"batch": {"u": np.arange(2)}, "non_tensor_batch": {"u": np.asarray(["a", "b"])}})
    ref = t.put_dataproto({"batch": {"uid": np.arange(3)}, "meta_info": {"uid": "m"}})
    with pytest.raises(ValueError, match="Duplicate keys"):
        t.get(ref, type="dict")
    with pytest.raises(ValueError, match="unsupported Mooncake payload type"):
        t.put({}, type="other")
    with pytest.raises(TypeError, match="FieldSchema"):
        t.put({"a": np.arange(2)}, type="dict", field_schemas={"a": "ndarray"})
    assert FieldSchema("utf8_ragged").nullable


def test_torch_tensors_use_the_tensor_calls():
    torch = pytest.importorskip("torch")
    store, t = make()
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    got = t.get_object(t.put_object({"t": tensor, "s": torch.tensor(1.5), "b": torch.tensor([True, False])}))
    assert torch.equal(got["t"], tensor) and torch.equal(got["b"], torch.tensor([True, False]))
    assert store.calls["put_tensor"] == 3 and store.calls["get_tensor"] == 3
    plain, t2 = make(PlainStore())
    rows = torch.arange(24, dtype=torch.bfloat16).reshape(6, 4)
    ref = t2.put_dataproto(Batch({"x": rows}))
    for sel in (slice(1, 6, 2), [4, 1, 4], []):
        assert torch.equal(t2.get_dataproto(ref, rows=sel)["batch"]["x"], rows[sel])
    buffer = ctypes.create_string_buffer(b"tensor-bytes")
    ref = t.put_structured_object(StructuredObjectPayload(buffers={"t": tensor_object_buffer(
        ctypes.addressof(buffer), len(buffer.raw), buffer, batch_size=1)}),
        policy=BundleTransferPolicy(copy_mode="zero_copy"))
    assert ref.manifest["buffers"]["t"]["bytes"] == len(buffer.raw)
    assert store.calls["put_tensor_from"] == 1


def test_typed_ragged_rows_of_any_rank_and_schemas():
    pool = Pool()
    store, t = make(buffer_pool=pool)
    rows = [np.asarray(7, np.int32), np.arange(3, dtype=np.int32), None,
            np.arange(4, dtype=np.int32).reshape(2, 2)]
    ref = t.put({"values": rows}, type="dict",
                field_schemas={"values": FieldSchema("typed_ragged", metadata={"section": "non_tensor_batch"})})
    enc = ref.encoded_non_tensor["values"]
    assert enc["codec"] == "typed_ragged" and enc["metadata"]["physical_layout"] == "contiguous_flat"
    assert enc["payload_specs"]["data"]["shape"] == [8]
    assert 32 in pool.sizes and store.calls["batch_put_from"] > 0  # data gathered into a lease
    got = t.get(ref, type="dict")["values"]
    assert got[0].shape == () and got[2] is None and got[3].tolist() == [[0, 1], [2, 3]]
    picked = t.get_dataproto(ref, non_tensor_fields=["values"], rows=[3, 0])["non_tensor_batch"]["values"]
    assert picked[0].shape == (2, 2) and picked[1].tolist() == 7
    regular = [np.arange(6, dtype=np.int32).reshape(2, 3) + i for i in range(3)]
    payload, meta = sos._encode_typed_ragged_values(regular, np.int32)
    data = np.concatenate([a.reshape(-1) for a in payload["data"].arrays])
    decoded = sos._decode_typed_ragged_values({**payload, "data": data}, 3, meta)
    assert meta["shape_policy"] == "regular" and all(np.shares_memory(r, data) for r in decoded)
    assert sos._encode_typed_ragged_regular_ndarray_rows(regular[:1], np.int32) is None
    with pytest.raises(ValueError, match="declares section"):
        t.put_dataproto({"batch": {"x": np.arange(3)}},
                        field_schemas={"x": FieldSchema("ndarray", metadata={"section": "non_tensor_batch"})})
    with pytest.raises(ValueError, match="not nullable"):
        t.put_dataproto(Batch({"x": np.arange(2)}, {"s": np.asarray(["a", None], dtype=object)}),
                        field_schemas={"s": FieldSchema("auto", nullable=False)})
    with pytest.raises(AttributeError, match="failed to encode.*'s'.*utf8_ragged"):
        t.put_dataproto(Batch({"x": np.arange(1)}, {"s": np.asarray([object()], dtype=object)}),
                        field_schemas={"s": FieldSchema("utf8_ragged")})
    with pytest.raises(ValueError, match="unsupported structured non-tensor field"):
        t.put_dataproto(Batch(non_tensor_batch={"o": np.asarray([object(), None], dtype=object)}))


def test_nested_rows_keep_missing_keys_and_nulls():
    _store, t = make()
    samples = np.empty(4, dtype=object)
    samples[:] = [{"media": [b"a", b"bc"], "scores": np.asarray([1, 2]), "label": "x"},
                  {"label": None}, None, {"media": [], "scores": np.asarray([3]), "label": "y"}]
    ref = t.put_dataproto(Batch(non_tensor_batch={"s": samples}))
    assert ref.encoded_non_tensor["s"]["codec"] == "structured_recursive"
    got = t.get_dataproto(ref)["non_tensor_batch"]["s"]
    assert got[0]["media"] == [b"a", b"bc"] and got[0]["scores"].tolist() == [1, 2]
    assert got[1] == {"label": None} and got[2] is None and got[3]["media"] == []
    assert t.get_dataproto(ref, rows=[3, 1])["non_tensor_batch"]["s"][1] == {"label": None}
    view = t.dataproto_manifest_view(ref)["non_tensor_fields"]["s"]["spec"]
    assert view["metadata"]["nodes"] and any(n.endswith(".missing") for n in view["payload_members"])


def test_torch_columns_nested_tensors_and_fallbacks(monkeypatch):
    torch = pytest.importorskip("torch")
    _store, t = make()
    ragged = np.empty(3, dtype=object)
    ragged[:] = [torch.arange(2.0), None, torch.arange(3.0).reshape(3, 1)]
    ref = t.put_dataproto(Batch(non_tensor_batch={"r": ragged}))
    assert ref.encoded_non_tensor["r"]["metadata"]["dtype"] == "torch.float32"
    got = t.get_dataproto(ref)["non_tensor_batch"]["r"]
    assert torch.equal(got[2], ragged[2]) and got[1] is None
    mixed = np.empty(2, dtype=object)
    mixed[:] = [torch.arange(1.0), torch.arange(1)]
    with pytest.raises(ValueError, match="mixed tensor dtype"):
        t.put_dataproto(Batch(non_tensor_batch={"r": mixed}))
    mm = np.empty(3, dtype=object)
    mm[:] = [{"image": torch.ones(2, 2)}, None, {}]
    ref = t.put_dataproto(Batch(non_tensor_batch={"mm": mm}), field_schemas={
        "mm": FieldSchema("ragged_tensor_dict", metadata={"keys": ["image"]})})
    got = t.get_dataproto(ref, rows=[2, 0])["non_tensor_batch"]["mm"]
    assert got[0] == {} and torch.equal(got[1]["image"], torch.ones(2, 2))
    for row, error in (({"audio": torch.ones(1)}, "keys not declared"), ({"image": None}, "explicit None")):
        mm[:] = [row, None, None]
        with pytest.raises((ValueError, TypeError), match=error):
            t.put_dataproto(Batch(non_tensor_batch={"mm": mm}), field_schemas={
                "mm": FieldSchema("ragged_tensor_dict", metadata={"keys": ["image"]})})
    rows = [torch.arange(2), torch.arange(10, 14), torch.arange(20, 21)]
    ref = t.put_dataproto(Batch({"tok": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}))
    for sel, want in ((None, rows), ([2, 0], [rows[2], rows[0]]), ([], [])):
        got = t.get_dataproto(ref, rows=sel)["batch"]["tok"]
        assert got.is_nested and [r.tolist() for r in got.unbind()] == [r.tolist() for r in want]
    plain, t2 = make(PlainStore())
    tensor = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    ref = t2.put_dataproto(Batch({"x": tensor}))
    assert ref.stage_refs["default"].manifest["buffers"]["batch.x"]["data_offset"] > 0  # the store's header
    monkeypatch.setattr(sos, "_has_tensor_codec_helpers", lambda: False)
    ref = t2.put_dataproto(Batch({"x": tensor}))
    assert ref.stage_refs["default"].manifest["buffers"]["batch.x"]["format"] == "torch_save"
    assert torch.equal(t2.get_dataproto(ref, rows=[4, 1])["batch"]["x"], tensor[[4, 1]])
    with pytest.raises(ValueError, match="does not support destinations"):
        t2.get_dataproto(ref, rows=[1], destinations={"x": torch.empty(1, 4)})


# ---- the real store ------------------------------------------------------------


def test_real_store_dataproto_rows_and_cleanup(store):
    transfer = MooncakeBundleTransfer(store, key_prefix="structured-bundle-test")
    rng = np.random.default_rng(3)
    batch = {f"f{i}": rng.integers(0, 1000, size=(64, 5 + i)).astype(dt)
             for i, dt in enumerate(["int64", "int32", "float32", "float16", "bool", "uint8"])}
    text = np.asarray([f"row-{i}" for i in range(64)], dtype=object)
    ref = transfer.put_dataproto(Batch(batch, {"text": text}, {"step": 1}), chunk_bytes=1000)
    try:
        full = transfer.get_dataproto(ref)
        for name, value in batch.items():
            assert np.array_equal(full["batch"][name], value)
        picks = [63, 0, 17, 17, 5]
        rows = transfer.get_dataproto(ref, rows=picks)
        for name, value in batch.items():
            assert np.array_equal(rows["batch"][name], value[picks])
        assert rows["non_tensor_batch"]["text"].tolist() == text[picks].tolist()
        half = transfer.get_dataproto(ref, fields=["f2"], rows=slice(10, 50, 3))
        assert np.array_equal(half["batch"]["f2"], batch["f2"][10:50:3])
        handle = export_dataproto_ref(ref)
        other = MooncakeBundleTransfer(store, key_prefix="structured-bundle-test")
        assert np.array_equal(other.get_dataproto(handle)["batch"]["f0"], batch["f0"])
    finally:
        transfer.cleanup_dataproto(ref)
    keys = [k for k in (store.get_store_keys() if hasattr(store, "get_store_keys") else [])
            if k.startswith("structured-bundle-test/")]
    assert keys == []


def test_real_store_torch_rows(store):
    torch = pytest.importorskip("torch")
    transfer = MooncakeBundleTransfer(store, key_prefix="structured-bundle-torch")
    tensor = torch.arange(48, dtype=torch.float32).reshape(12, 4)
    ref = transfer.put_dataproto(Batch({"t": tensor}))
    try:
        assert torch.equal(transfer.get_dataproto(ref)["batch"]["t"], tensor)
        assert torch.equal(transfer.get_dataproto(ref, rows=[11, 2, 2])["batch"]["t"], tensor[[11, 2, 2]])
        assert torch.equal(transfer.get_dataproto(ref, rows=slice(3, 9))["batch"]["t"], tensor[3:9])
    finally:
        transfer.cleanup_dataproto(ref)
