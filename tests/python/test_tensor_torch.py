"""Every tensor call of MooncakeDistributedStore with real PyTorch tensors.

The expected values are the reference package's, measured by running the
same calls on it (docs/reference-behaviour.md, "Tensor calls with real
torch"). scripts/test-python.sh installs torch and sets
MOONCAKE_TEST_REQUIRE_TORCH=1, so in CI a missing torch fails this module
instead of skipping it.
"""

from __future__ import annotations

import ctypes
import os
import struct

import pytest

if os.environ.get("MOONCAKE_TEST_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

import importlib.util

from mooncake.store import ReplicateConfig

# The file also runs against the reference package (MOONCAKE_TEST_CLUSTER, see
# conftest.py); cases where the reference crashes are checked on ours only.
OURS = importlib.util.find_spec("mooncake._mooncake") is not None

INVALID_PARAMS, FILE_NOT_FOUND = -600, -1100
HEADER = 304

# (torch dtype name, the reference's dtype code in the header)
DTYPES = [
    ("float32", 0), ("float64", 1), ("int8", 2), ("uint8", 3), ("int16", 4), ("uint16", 5),
    ("int32", 6), ("uint32", 7), ("int64", 8), ("uint64", 9), ("bool", 10), ("float16", 11),
    ("bfloat16", 12), ("float8_e4m3fn", 13), ("float8_e5m2", 14),
]


def sample(dtype, shape=(2, 3)):
    n = 1
    for d in shape:
        n *= d
    base = torch.arange(n, dtype=torch.float32).reshape(shape) % 7
    return base > 2 if dtype == torch.bool else base.to(dtype)


def same_bits(a, b) -> bool:
    """Equal dtype, shape and bytes (NaN-safe; works for fp8 and bool)."""
    if a is None or b is None or a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    return bytes(a.contiguous().view(torch.uint8).numpy()) == bytes(b.contiguous().view(torch.uint8).numpy())


# ---- put / get --------------------------------------------------------------


@pytest.mark.parametrize("name,code", DTYPES)
def test_every_dtype_round_trips_bit_exact(store, name, code):
    dtype = getattr(torch, name)
    t = sample(dtype)
    key = f"tt-dtype-{name}"
    assert store.put_tensor(key, t) == 0
    got = store.get_tensor(key)
    assert same_bits(got, t)
    raw = store.get(key)
    assert len(raw) == HEADER + t.numel() * t.element_size()
    assert struct.unpack_from("<4sHHii", raw, 0) == (b"NOOM", 1, HEADER, code, 2)


@pytest.mark.parametrize("name", ["complex64", "complex128", "float8_e4m3fnuz", "float8_e5m2fnuz"])
def test_dtypes_the_reference_cannot_store_are_invalid_params(store, name):
    if not hasattr(torch, name):
        pytest.skip(f"this torch has no {name}")
    t = torch.zeros(3, dtype=torch.float32).to(getattr(torch, name))
    assert store.put_tensor(f"tt-bad-{name}", t) == INVALID_PARAMS
    assert store.is_exist(f"tt-bad-{name}") == 0


def test_fp8_keeps_its_bits(store):
    t = torch.tensor([0.5, -1.0, 448.0, 0.0]).to(torch.float8_e4m3fn)
    assert store.put_tensor("tt-fp8", t) == 0
    got = store.get_tensor("tt-fp8")
    assert got.dtype == torch.float8_e4m3fn
    assert torch.equal(got.view(torch.uint8), t.view(torch.uint8))


@pytest.mark.parametrize("shape", [(0,), (1,), (5,), (0, 3), (3, 0), (2, 0, 3), (1,) * 8, (2,) * 8, (4096,), (64, 64, 16)])
def test_shapes_round_trip(store, shape):
    n = 1
    for d in shape:
        n *= d
    t = torch.arange(n, dtype=torch.float32).reshape(shape)
    key = "tt-shape-" + "x".join(map(str, shape))
    assert store.put_tensor(key, t) == 0
    got = store.get_tensor(key)
    assert tuple(got.shape) == shape and got.dtype == torch.float32 and torch.equal(got, t)
    assert store.get_size(key) == HEADER + 4 * n


def test_zero_dim_tensor_is_stored_as_ndim_0_and_read_back_1d(store):
    assert store.put_tensor("tt-0d", torch.tensor(2.5)) == 0
    raw = store.get("tt-0d")
    # The reference's bytes: ndim 0, every shape slot -1, one 4-byte element.
    assert struct.unpack_from("<4sHHiiQQQ", raw, 0) == (b"NOOM", 1, HEADER, 0, 0, 0, HEADER, 4)
    assert struct.unpack_from("<8q", raw, 40) == (-1,) * 8
    assert struct.unpack_from("<8q", raw, 104) == (-1,) * 8
    assert len(raw) == HEADER + 4
    got = store.get_tensor("tt-0d")
    assert tuple(got.shape) == (1,) and got.item() == 2.5


def test_more_than_8_dims_is_invalid_params(store):
    assert store.put_tensor("tt-9d", torch.zeros((1,) * 9)) == INVALID_PARAMS
    assert store.is_exist("tt-9d") == 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(12, dtype=torch.int32).reshape(3, 4).t(),
        lambda: torch.arange(24, dtype=torch.int64).reshape(4, 6)[:, ::2],
        lambda: torch.arange(3, dtype=torch.float32).reshape(3, 1).expand(3, 4),
        lambda: torch.arange(100, dtype=torch.float32)[10:20],
        lambda: torch.arange(120, dtype=torch.float32).reshape(2, 3, 4, 5).to(memory_format=torch.channels_last),
    ],
    ids=["transposed", "strided", "expanded", "offset", "channels_last"],
)
def test_non_contiguous_tensors_are_stored_in_c_order(store, make):
    t = make()
    assert not t.is_contiguous() or t.storage_offset() > 0
    assert store.put_tensor("tt-nc", t) == 0
    got = store.get_tensor("tt-nc")
    assert got.is_contiguous() and torch.equal(got, t)
    assert bytes(store.get("tt-nc")[HEADER:]) == bytes(t.contiguous().view(torch.uint8).numpy())
    assert store.remove("tt-nc", force=True) == 0


def test_requires_grad_tensor_is_stored_detached(store):
    assert store.put_tensor("tt-grad", torch.ones(4, requires_grad=True)) == 0
    got = store.get_tensor("tt-grad")
    assert not got.requires_grad and torch.equal(got, torch.ones(4))


def test_bad_values_are_invalid_params(store):
    for i, value in enumerate([[1, 2], torch.zeros(3).numpy(), None, torch.zeros(3).to_sparse(), torch.empty(3, device="meta")]):
        assert store.put_tensor(f"tt-badv-{i}", value) == INVALID_PARAMS
        assert store.is_exist(f"tt-badv-{i}") == 0
    assert store.put_tensor("", torch.zeros(3)) == INVALID_PARAMS
    with pytest.raises(TypeError):
        store.put_tensor(5, torch.zeros(3))


def test_existing_key_keeps_the_first_tensor(store):
    assert store.put_tensor("tt-first", torch.zeros(3)) == 0
    assert store.put_tensor("tt-first", torch.ones(5)) == 0
    assert torch.equal(store.get_tensor("tt-first"), torch.zeros(3))


def test_get_of_missing_or_non_tensor_is_none(store):
    assert store.put("tt-raw400", b"x" * 400) == 0
    assert store.put("tt-raw10", b"x" * 10) == 0
    for key in ["tt-missing", "tt-raw400", "tt-raw10", ""]:
        assert store.get_tensor(key) is None


def test_get_tensor_returns_an_independent_writable_copy(store):
    assert store.put_tensor("tt-copy", torch.arange(4, dtype=torch.float32)) == 0
    got = store.get_tensor("tt-copy")
    got[0] = 100
    assert store.get_tensor("tt-copy").tolist() == [0.0, 1.0, 2.0, 3.0]


def test_batch_put_and_get(store):
    ts = [torch.arange(4, dtype=torch.float32), torch.ones(2, 2, dtype=torch.bfloat16), torch.empty(0, 3)]
    assert store.batch_put_tensor(["tb1", "tb2", "tb3"], ts) == [0, 0, 0]
    got = store.batch_get_tensor(["tb1", "tb-missing", "tb2", "tb3"])
    assert got[1] is None
    assert all(same_bits(g, t) for g, t in zip([got[0], got[2], got[3]], ts))
    assert store.batch_put_tensor(["tbm1", "tbm2"], ts[:1]) == [INVALID_PARAMS] * 2
    assert store.batch_put_tensor([], []) == [] and store.batch_get_tensor([]) == []
    assert store.batch_put_tensor(["tbo1", "tbo2"], [torch.zeros(2), "x"]) == [0, INVALID_PARAMS]
    assert store.batch_put_tensor(["tbd", "tbd"], [torch.zeros(2), torch.ones(3)]) == [0, 0]
    assert torch.equal(store.get_tensor("tbd"), torch.zeros(2)), "first of duplicate keys wins"
    assert store.batch_put_tensor(["tb1"], [torch.zeros(9)]) == [0]
    assert torch.equal(store.get_tensor("tb1"), ts[0]), "an existing key is kept"


def test_pub_and_upsert(store):
    cfg = ReplicateConfig()
    t = torch.arange(6, dtype=torch.int16)
    assert store.pub_tensor("tpu1", t, cfg) == 0 and store.pub_tensor("tpu2", t) == 0
    assert store.upsert_tensor("tup1", t) == 0
    assert store.upsert_tensor("tup1", torch.ones(3, 3)) == 0
    assert torch.equal(store.get_tensor("tup1"), torch.ones(3, 3)), "upsert replaces, even with another shape"
    assert store.upsert_pub_tensor("tup1", t, cfg) == 0
    assert store.batch_pub_tensor(["tbp1", "tbp2"], [t, t], cfg) == [0, 0]
    assert store.batch_upsert_tensor(["tbp1", "tbu2"], [torch.zeros(1), t]) == [0, 0]
    assert store.batch_upsert_pub_tensor(["tbp1"], [t], cfg) == [0]
    assert torch.equal(store.get_tensor("tbp1"), t)
    zero = ReplicateConfig()
    zero.replica_num = 0
    assert store.pub_tensor("tpu3", t, zero) == INVALID_PARAMS


# ---- reading into preallocated buffers ------------------------------------------


def test_get_tensor_into_views_the_buffer(store, buf):
    t = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    assert store.put_tensor("tgi", t) == 0
    n = HEADER + t.numel() * 4
    got = store.get_tensor_into("tgi", buf.at(0), n)
    assert torch.equal(got, t) and got.data_ptr() == buf.at(HEADER)
    got = store.get_tensor_into("tgi", buf.at(4096), 4096)
    assert torch.equal(got, t) and got.data_ptr() == buf.at(4096 + HEADER)
    got[0, 0] = 42
    assert ctypes.cast(buf.at(4096 + HEADER), ctypes.POINTER(ctypes.c_float))[0] == 42.0
    assert store.get_tensor_into("tgi", buf.at(8192), n - 1) is None, "buffer one byte short"
    assert store.get_tensor_into("tgi-missing", buf.at(0), 4096) is None
    assert store.get_tensor_into("tgi", 0, 4096) is None
    assert store.put("tgi-raw", b"y" * 500) == 0
    assert store.get_tensor_into("tgi-raw", buf.at(12288), 4096) is None
    assert store.put_tensor("tgi0", torch.empty(2, 0)) == 0
    got = store.get_tensor_into("tgi0", buf.at(16384), 4096)
    assert tuple(got.shape) == (2, 0) and got.dtype == torch.float32


def test_get_tensor_into_unregistered_memory(store):
    # The reference reads into any valid memory, registered or not.
    mem = (ctypes.c_ubyte * 4096)()
    p = ctypes.addressof(mem)
    t = torch.arange(8, dtype=torch.int64)
    assert store.put_tensor("tgu", t) == 0
    got = store.get_tensor_into("tgu", p, 4096)
    assert torch.equal(got, t) and got.data_ptr() == p + HEADER


def test_batch_get_tensor_into(store, buf):
    t = torch.arange(8, dtype=torch.int32)
    assert store.batch_put_tensor(["tbgi1", "tbgi2"], [t, t * 2]) == [0, 0]
    got = store.batch_get_tensor_into(["tbgi1", "tbgi-missing", "tbgi2"], [buf.at(0), buf.at(4096), buf.at(8192)], [4096] * 3)
    assert torch.equal(got[0], t) and got[1] is None and torch.equal(got[2], t * 2)
    assert got[0].data_ptr() == buf.at(HEADER) and got[2].data_ptr() == buf.at(8192 + HEADER)
    # As in the reference: one code per key when the lists do not line up.
    assert store.batch_get_tensor_into(["tbgi1", "tbgi2"], [buf.at(0)], [4096]) == [INVALID_PARAMS] * 2
    assert store.batch_get_tensor_into(["tbgi1", "tbgi2"], [buf.at(0), 0], [4096, 4096]) == [INVALID_PARAMS] * 2
    assert store.batch_get_tensor_into(["tbgi1"], [buf.at(0)], [10]) == [None]
    assert store.batch_get_tensor_into([], [], []) == []


def test_put_tensor_from_serialized_buffers(store, buf):
    t = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    assert store.put_tensor("tpf", t) == 0
    n = store.get_into("tpf", buf.at(0), 4096)
    assert n == HEADER + 64
    assert store.put_tensor_from("tpf2", buf.at(0), n) == 0
    assert torch.equal(store.get_tensor("tpf2"), t)
    for ptr, size in [(buf.at(0), n - 1), (buf.at(0), n + 1), (buf.at(1), n), (0, n), (buf.at(0), 0)]:
        assert store.put_tensor_from("tpf-bad", ptr, size) == INVALID_PARAMS
    if OURS:  # an unmapped pointer: the reference segfaults
        assert store.put_tensor_from("tpf-bad", 16, n) == INVALID_PARAMS
    assert store.is_exist("tpf-bad") == 0
    mem = (ctypes.c_ubyte * 4096)()
    ctypes.memmove(ctypes.addressof(mem), buf.at(0), n)
    assert store.put_tensor_from("tpf-unreg", ctypes.addressof(mem), n) == 0
    # One bad buffer fails the whole batch, as in the reference.
    assert store.batch_put_tensor_from(["tpf9", "tpf10"], [buf.at(0), buf.at(1)], [n, n]) == [INVALID_PARAMS] * 2
    assert store.is_exist("tpf9") == 0
    assert store.batch_put_tensor_from(["tpf11", "tpf12"], [buf.at(0)], [n]) == [INVALID_PARAMS] * 2
    assert store.batch_put_tensor_from([], [], []) == []
    assert store.batch_put_tensor_from(["tpf13", "tpf14"], [buf.at(0), buf.at(0)], [n, n]) == [0, 0]
    assert store.upsert_tensor_from("tpf2", buf.at(0), n) == 0
    assert store.batch_upsert_tensor_from(["tpf2", "tpf15"], [buf.at(0), buf.at(0)], [n, n]) == [0, 0]
    assert store.batch_upsert_tensor_from(["tpf2", "tpf16"], [buf.at(0), 0], [n, n]) == [INVALID_PARAMS] * 2


# ---- tensor parallelism ---------------------------------------------------------


@pytest.mark.parametrize("split_dim", [0, 1, 2])
def test_tp_shards_on_every_dim(store, split_dim):
    t = torch.arange(4 * 6 * 2, dtype=torch.int32).reshape(4, 6, 2)
    key = f"ttp{split_dim}"
    assert store.put_tensor_with_tp(key, t, tp_rank=0, tp_size=2, split_dim=split_dim) == 0
    assert store.is_exist(key) == 0, "only the shards are stored"
    for rank, want in enumerate(t.chunk(2, split_dim)):
        got = store.get_tensor_with_tp(key, tp_rank=rank, tp_size=2, split_dim=split_dim)
        assert got.is_contiguous() and torch.equal(got, want)
        raw = store.get(f"{key}_tp_{rank}")
        # the shard's header: layout 1, global and local shapes, one TP axis
        assert struct.unpack_from("<Q", raw, 16) == (1,)
        assert struct.unpack_from("<3q", raw, 40) == (4, 6, 2)
        assert struct.unpack_from("<3q", raw, 104) == tuple(want.shape)
        assert struct.unpack_from("<QIIIIIIQ", raw, 168) == (1, 1, 0, rank, 2, split_dim, 0, want.shape[split_dim])


def test_tp_size_one_or_less_stores_the_whole_tensor(store):
    t = torch.arange(10, dtype=torch.int32).reshape(5, 2)
    for i, tp_size in enumerate([1, 0, -1]):
        key = f"ttw{i}"
        assert store.put_tensor_with_tp(key, t, tp_size=tp_size) == 0
        assert store.is_exist(key) == 1 and store.is_exist(f"{key}_tp_0") == 0
        for get_size in (1, 0, -3):
            assert torch.equal(store.get_tensor_with_tp(key, tp_rank=0, tp_size=get_size), t)
    assert store.get_tensor_with_tp("ttw0", tp_rank=0, tp_size=2) is None


def test_tp_uneven_or_impossible_splits_store_nothing(store):
    t = torch.arange(10, dtype=torch.int32).reshape(5, 2)
    e = torch.arange(8, dtype=torch.int32).reshape(4, 2)
    assert store.put_tensor_with_tp("ttu", t, tp_size=2) == INVALID_PARAMS
    assert store.put_tensor_with_tp("ttu3", t, tp_size=3) == INVALID_PARAMS
    assert store.put_tensor_with_tp("ttbig", e, tp_size=8) == INVALID_PARAMS
    assert store.put_tensor_with_tp("ttsd5", e, tp_size=2, split_dim=5) == INVALID_PARAMS
    assert store.put_tensor_with_tp("ttsdm", e, tp_size=2, split_dim=-1) == INVALID_PARAMS
    assert store.put_tensor_with_tp("tt0d", torch.tensor(3.0), tp_size=2) == INVALID_PARAMS
    for key in ["ttu", "ttu3", "ttbig", "ttsd5", "ttsdm", "tt0d"]:
        assert [store.is_exist(f"{key}_tp_{r}") for r in range(3)] == [0, 0, 0]


def test_tp_edge_ranks_and_odd_tensors(store):
    e = torch.arange(8, dtype=torch.int32).reshape(4, 2)
    assert store.put_tensor_with_tp("ttr", e, tp_rank=1, tp_size=2) == 0
    assert [store.is_exist(f"ttr_tp_{r}") for r in range(2)] == [1, 1], "every rank's shard is stored"
    assert store.get_tensor_with_tp("ttr", tp_rank=5, tp_size=2) is None
    assert store.get_tensor_with_tp("ttr", tp_rank=-1, tp_size=2) is None
    assert store.put_tensor_with_tp("ttz", torch.empty(2, 0, 3), tp_size=2) == 0
    for r in range(2):
        assert tuple(store.get_tensor_with_tp("ttz", tp_rank=r, tp_size=2).shape) == (1, 0, 3)
    nc = torch.arange(16).reshape(4, 4).t()
    assert store.put_tensor_with_tp("ttnc", nc, tp_size=2, split_dim=1) == 0
    for r, want in enumerate(nc.chunk(2, 1)):
        assert torch.equal(store.get_tensor_with_tp("ttnc", tp_rank=r, tp_size=2), want)


def test_tp_batch_and_pub(store):
    e = torch.arange(8, dtype=torch.int32).reshape(4, 2)
    assert store.batch_put_tensor_with_tp(["tbx", "tby"], [e, e * 2], tp_size=2) == [0, 0]
    got = store.batch_get_tensor_with_tp(["tbx", "tb-missing", "tby"], tp_rank=1, tp_size=2)
    assert torch.equal(got[0], e[2:]) and got[1] is None and torch.equal(got[2], e[2:] * 2)
    assert store.batch_get_tensor_with_tp(["tbx"], tp_rank=0, tp_size=1) == [None], "no whole tensor under tbx"
    assert store.batch_put_tensor_with_tp(["tbm1", "tbm2"], [e], tp_size=2) == [INVALID_PARAMS] * 2
    assert store.batch_put_tensor_with_tp(["tbu1", "tbu2"], [e, torch.arange(5)], tp_size=2) == [0, INVALID_PARAMS]
    assert (store.is_exist("tbu1_tp_0"), store.is_exist("tbu2_tp_0")) == (1, 0)
    assert store.batch_put_tensor_with_tp(["tbw"], [torch.arange(5)], tp_size=1) == [0]
    assert store.is_exist("tbw") == 1
    assert store.pub_tensor_with_tp("tptp", e, ReplicateConfig(), tp_rank=0, tp_size=4) == 0
    assert [store.is_exist(f"tptp_tp_{r}") for r in range(4)] == [1, 1, 1, 1]
    assert store.batch_pub_tensor_with_tp(["tbptp"], [e], ReplicateConfig(), tp_size=2, split_dim=1) == [0]
    assert torch.equal(store.get_tensor("tbptp_tp_1"), e[:, 1:])


def test_tp_from_serialized_buffers_and_into(store, buf):
    t = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    assert store.put_tensor("ttf", t) == 0
    n = store.get_into("ttf", buf.at(0), 4096)
    assert store.put_tensor_with_tp_from("ttf2", buf.at(0), n, tp_size=2, split_dim=1) == 0
    assert torch.equal(store.get_tensor_with_tp("ttf2", tp_rank=1, tp_size=2), t[:, 2:])
    assert store.put_tensor_with_tp_from("ttf1", buf.at(0), n, tp_size=1) == 0
    assert torch.equal(store.get_tensor("ttf1"), t)
    assert store.batch_put_tensor_with_tp_from(["ttf3", "ttf4"], [buf.at(0), buf.at(1)], [n, n], tp_size=4) == [0, INVALID_PARAMS]
    assert store.batch_put_tensor_with_tp_from(["ttf5"], [buf.at(0), buf.at(0)], [n], tp_size=2) == [INVALID_PARAMS]
    got = store.get_tensor_with_tp_into("ttf3", buf.at(32768), 4096, tp_rank=3, tp_size=4)
    assert torch.equal(got, t[3:]) and got.data_ptr() == buf.at(32768 + HEADER)
    assert store.get_tensor_with_tp_into("ttf3", buf.at(32768), 100, tp_rank=3, tp_size=4) is None
    assert torch.equal(store.get_tensor_with_tp_into("ttf", buf.at(36864), 4096, tp_rank=0, tp_size=1), t)
    got = store.batch_get_tensor_with_tp_into(
        ["ttf3", "ttf2", "tt-missing"], [buf.at(40960), buf.at(45056), buf.at(49152)], [4096] * 3, tp_rank=0, tp_size=2
    )
    assert torch.equal(got[0], t[:1]) and torch.equal(got[1], t[:, :2]) and got[2] is None
    assert store.batch_get_tensor_with_tp_into(["ttf3", "ttf2"], [buf.at(0)], [4096], tp_rank=0, tp_size=2) == [INVALID_PARAMS] * 2


# ---- safetensors ----------------------------------------------------------------


@pytest.fixture
def safetensors():
    if os.environ.get("MOONCAKE_TEST_REQUIRE_TORCH") == "1":
        import safetensors.torch as st
    else:
        st = pytest.importorskip("safetensors.torch")
    return st


def test_safetensors_save_and_load(store, safetensors, tmp_path):
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert store.put_tensor("tst1", t) == 0
    f = str(tmp_path / "tst1.safetensors")
    assert store.save_tensor_to_safetensor("tst1", f) == 0
    assert list(safetensors.load_file(f)) == ["tst1"], "the file names the tensor after its key"
    assert torch.equal(store.load_tensor_from_safetensor("tst1-copy", f), t)
    assert torch.equal(store.get_tensor("tst1-copy"), t), "stored under the key given"
    assert torch.equal(store.load_tensor_from_safetensor(None, f), t)
    assert torch.equal(store.get_tensor(f), t), "no key: stored under the file name"
    assert torch.equal(store.load_tensor_from_safetensor(file_name=f), t)
    assert store.put_tensor("tst-existing", torch.zeros(1)) == 0
    assert torch.equal(store.load_tensor_from_safetensor("tst-existing", f), t)
    assert torch.equal(store.get_tensor("tst-existing"), torch.zeros(1)), "an existing key is kept"


def test_safetensors_entry_choice(store, safetensors, tmp_path):
    f = str(tmp_path / "multi.safetensors")
    safetensors.save_file({"b": torch.ones(2), "a": torch.zeros(3)}, f)
    assert torch.equal(store.load_tensor_from_safetensor("b", f), torch.ones(2)), "the entry named key"
    # otherwise the file's first entry (safetensors orders them by name)
    assert torch.equal(store.load_tensor_from_safetensor("zz", f), torch.zeros(3))
    assert torch.equal(store.load_tensor_from_safetensor(None, f), torch.zeros(3))


def test_safetensors_dtypes_and_layouts(store, safetensors, tmp_path):
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    for key, value in [("tst-bf16", t.to(torch.bfloat16)), ("tst-nc", t.t()), ("tst-bool", t > 2), ("tst-i64", t.long())]:
        assert store.put_tensor(key, value) == 0
        f = str(tmp_path / f"{key}.safetensors")
        assert store.save_tensor_to_safetensor(key, f) == 0
        assert same_bits(safetensors.load_file(f)[key], value.contiguous())


def test_safetensors_default_file_name_is_the_key(store, safetensors, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert store.put_tensor("tst-default", torch.ones(3)) == 0
    assert store.save_tensor_to_safetensor("tst-default") == 0
    assert (tmp_path / "tst-default").is_file()


def test_safetensors_failures_are_codes_and_none(store, safetensors, tmp_path):
    assert store.save_tensor_to_safetensor("tst-missing", str(tmp_path / "x.safetensors")) == FILE_NOT_FOUND
    assert store.put("tst-raw", b"z" * 400) == 0
    assert store.save_tensor_to_safetensor("tst-raw", str(tmp_path / "y.safetensors")) == FILE_NOT_FOUND
    assert store.put_tensor("tst-ok", torch.ones(2)) == 0
    assert store.save_tensor_to_safetensor("tst-ok", str(tmp_path / "no" / "dir" / "z.safetensors")) == INVALID_PARAMS
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"garbage")
    empty = str(tmp_path / "empty.safetensors")
    safetensors.save_file({}, empty)
    for f in [str(garbage), str(tmp_path / "none.safetensors"), "", empty, str(tmp_path)]:
        assert store.load_tensor_from_safetensor("tst-k", f) is None
    assert store.is_exist("tst-k") == 0
    with pytest.raises(TypeError):
        store.load_tensor_from_safetensor()
