"""The unified parallel tensor calls (``*_tensor_with_parallelism*``,
``ParallelAxis``, ``TensorParallelism``, ``ReadTarget``) with real PyTorch.

Objects are checked byte for byte against the reference's layout (names,
headers, manifests), so that either package reads what the other wrote; the
file also runs against the reference package (MOONCAKE_TEST_CLUSTER, see
conftest.py), where it passed except for the cases marked ours-only.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import threading
from dataclasses import dataclass

import pytest

if os.environ.get("MOONCAKE_TEST_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

import mooncake.store as ms

OURS = importlib.util.find_spec("mooncake._mooncake") is not None
INVALID_PARAMS = -600
HEADER = 304


@dataclass
class Part:
    rank: int
    size: int
    split_dim: int


def axis(kind, rank, size, split_dim=None, expert_id=None, stage_id=None):
    a = ms.ParallelAxis()
    a.kind, a.rank, a.size, a.split_dim = kind, rank, size, split_dim
    if expert_id is not None:
        a.expert_id = expert_id
    if stage_id is not None:
        a.stage_id = stage_id
    return a


def par(*axes):
    p = ms.TensorParallelism()
    p.axes = list(axes)
    return p


def target(mode, parallelism=None):
    t = ms.ReadTarget()
    t.mode = mode
    t.parallelism = parallelism
    return t


def tp(rank, size, split_dim):
    return par(axis("tp", rank, size, split_dim))


def dp_tp(dp_rank, tp_rank, tp_size, split_dim):
    return par(axis("dp", dp_rank, 2), axis("tp", tp_rank, tp_size, split_dim))


def ramp(*shape, dtype=torch.float32):
    n = 1
    for d in shape:
        n *= d
    return torch.arange(n, dtype=torch.float32).reshape(shape).to(dtype)


def header(raw: bytes):
    """(dtype, ndim, layout, data bytes, global shape, local shape, axes)."""
    _magic, _ver, _hsize, dtype, ndim, layout, _flags, _off, nbytes = struct.unpack_from("<4sHHiiIIQQ", raw, 0)
    gshape = struct.unpack_from("<8q", raw, 40)[:ndim]
    lshape = struct.unpack_from("<8q", raw, 104)[:ndim]
    count = struct.unpack_from("<I", raw, 168)[0]
    axes = [struct.unpack_from("<iiiiiiq", raw, 176 + 32 * i) for i in range(count)]
    return dtype, ndim, layout, nbytes, gshape, lshape, axes


def manifest(raw: bytes):
    magic, ver, size, dtype, ndim, split, count = struct.unpack_from("<4sHHiiii", raw, 0)
    shape = struct.unpack_from("<8q", raw, 32)[:ndim]
    return magic, ver, size, dtype, split, count, shape


_n = [0]


@pytest.fixture
def key():
    _n[0] += 1
    return f"par-{os.getpid()}-{_n[0]}"


# ---- the classes ------------------------------------------------------------------


def test_classes_defaults_and_checks():
    a = ms.ParallelAxis()
    assert (a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id) == ("", 0, 1, None, None, None)
    with pytest.raises(TypeError):
        a.kind = 1
    with pytest.raises(TypeError):
        a.rank = "0"
    t = ms.ReadTarget()
    assert (t.mode, t.parallelism) == ("as_stored", None)
    t.mode = "FULL"
    assert t.mode == "full"
    with pytest.raises(RuntimeError):
        t.mode = "bogus"
    assert ms.TensorParallelism().axes == []


def test_axes_are_copied_in_and_shared_out():
    a = axis("tp", 0, 2, 0)
    p = par(a)
    a.rank = 1
    assert p.axes[0].rank == 0
    p.axes[0].rank = 1
    assert p.axes[0].rank == 1
    t = target("shard", p)
    p.axes[0].rank = 0
    assert t.parallelism.axes[0].rank == 1


# ---- what is stored where ---------------------------------------------------------


def test_single_tp_axis_stores_the_callers_shard_and_a_manifest(store, key):
    x = ramp(4, 6)
    assert store.put_tensor_with_parallelism(key, x[:, :2].contiguous(), tp(0, 3, 1)) == 0
    raw = store.get(f"{key}_tp_0")
    assert header(raw) == (0, 2, 1, 32, (4, 6), (4, 2), [(1, 0, 0, 3, 1, 0, 2)])
    assert manifest(store.get(f"{key}__parallelism_manifest")) == (b"NAMW", 1, 96, 0, 1, 3, (4, 6))
    assert store.is_exist(key) == 0
    # The legacy TP read finds it.
    assert torch.equal(store.get_tensor_with_tp(key, tp_rank=0, tp_size=3), x[:, :2])


def test_multi_axis_names_and_headers(store, key):
    x = ramp(4, 6)
    # Axes in any order: the name lists them dp, tp, ep, pp; the header keeps
    # the caller's order.
    p = par(axis("pp", 0, 2, stage_id=4), axis("tp", 1, 2, 0))
    assert store.put_tensor_with_parallelism(key, x, p) == 0
    raw = store.get(f"{key}__tp_1of2_sd0__pp_0of2_sid4")
    assert header(raw) == (0, 2, 1, 48, (4, 6), (2, 6), [(3, 0, 0, 2, -1, 4, 0), (1, 1, 1, 2, 0, 0, 2)])
    assert raw[HEADER:] == x[2:].contiguous().numpy().tobytes()
    assert manifest(store.get(f"{key}__parallelism_manifest")) == (b"NAMW", 1, 96, 0, 0, 2, (4, 6))
    p = par(axis("tp", 0, 3, 1), axis("dp", 1, 2))
    assert store.put_tensor_with_parallelism(key + "b", x, p) == 0
    assert header(store.get(f"{key}b__dp_1of2__tp_0of3_sd1"))[6] == [(1, 0, 0, 3, 1, 0, 2), (0, 1, 1, 2, -1, 0, 0)]
    p = par(axis("ep", 1, 2, expert_id=5))
    assert store.put_tensor_with_parallelism(key + "c", x, p) == 0
    raw = store.get(f"{key}c__ep_1of2_eid5")
    assert header(raw) == (0, 2, 1, 96, (4, 6), (4, 6), [(2, 0, 1, 2, -1, 5, 0)])
    assert store.is_exist(f"{key}c__parallelism_manifest") == 0
    all4 = par(axis("pp", 0, 2, stage_id=1), axis("ep", 1, 2, expert_id=9), axis("tp", 1, 2, 0), axis("DP", 1, 3))
    assert store.put_tensor_with_parallelism(key + "d", x, all4) == 0
    assert store.is_exist(f"{key}d__dp_1of3__tp_1of2_sd0__ep_1of2_eid9__pp_0of2_sid1") == 1


def test_writer_partitions(store, key):
    x = ramp(4, 6)
    for rank in range(2):
        assert store.put_tensor_with_parallelism(key, x, writer_partition=Part(rank, 2, 1)) == 0
    raw = store.get(f"{key}__writer_1of2_sd1")
    assert header(raw) == (0, 2, 1, 48, (4, 6), (4, 3), [(1, 0, 1, 2, 1, 0, 3)])
    assert manifest(store.get(f"{key}__writer_manifest")) == (b"NAMW", 1, 96, 0, 1, 2, (4, 6))
    assert torch.equal(store.get_tensor_with_parallelism(key, target("full")), x)
    assert torch.equal(store.get_tensor_with_parallelism(key, target("shard", tp(1, 2, 1))), x[:, 3:])
    # A tuple is not a partition; a partition and a parallelism together are refused.
    assert store.put_tensor_with_parallelism(key + "t", x, writer_partition=(0, 2, 1)) == INVALID_PARAMS
    assert store.put_tensor_with_parallelism(key + "t", x, tp(0, 2, 1), writer_partition=Part(0, 2, 1)) == INVALID_PARAMS
    assert store.put_tensor_with_parallelism(key + "t", x, writer_partition=Part(0, 4, 1)) == INVALID_PARAMS
    assert store.get_tensor_with_parallelism(key + "t", target("full")) is None


def test_whole_and_non_tp_layouts(store, key):
    x = ramp(3, 5)
    assert store.put_tensor_with_parallelism(key, x) == 0
    assert torch.equal(store.get_tensor(key), x)
    for t in (None, target("as_stored"), target("full")):
        assert torch.equal(store.get_tensor_with_parallelism(key, t), x)
    assert store.get_tensor_with_parallelism(key, target("shard", tp(0, 3, 0))) is None
    assert store.put_tensor_with_parallelism(key + "d", x, par(axis("dp", 1, 2))) == 0
    got = store.get_tensor_with_parallelism(key + "d", target("shard", par(axis("dp", 1, 2))))
    assert torch.equal(got, x)
    assert store.get_tensor_with_parallelism(key + "d", target("shard", par(axis("dp", 0, 2)))) is None
    assert store.get_tensor_with_parallelism(key + "d", target("full", par(axis("dp", 1, 2)))) is None


@pytest.mark.parametrize(
    "axes",
    [
        [],
        [("dp", 0, 2, 0)],  # only TP splits
        [("tp", 0, 2, None)],  # TP needs a split dim
        [("tp", 0, 2, 2)],  # beyond ndim
        [("tp", 0, 2, -1)],
        [("tp", 0, 0, 0)],
        [("dp", 2, 2, None)],  # rank out of range
        [("dp", -1, 2, None)],
        [("ep", 0, 2, None)],  # EP needs an expert id
        [("pp", 0, 2, None)],  # PP needs a stage id
        [("xx", 0, 2, None)],
        [("dp", 0, 2, None), ("dp", 1, 2, None)],
        [("dp", 0, 2, None), ("tp", 0, 4, 1)],  # 6 does not split in 4
    ],
)
def test_invalid_layouts_store_nothing(store, key, axes):
    p = par(*(axis(k, r, s, d) for k, r, s, d in axes))
    assert store.put_tensor_with_parallelism(key, ramp(4, 6), p) == INVALID_PARAMS
    assert store.is_exist(f"{key}__parallelism_manifest") == 0
    assert store.get_tensor_with_parallelism(key, target("shard", p)) is None


def test_bad_tensors_and_zero_dim(store, key):
    if OURS:  # the reference raises AttributeError for a list
        assert store.put_tensor_with_parallelism(key, [1, 2], tp(0, 2, 0)) == INVALID_PARAMS
    assert store.put_tensor_with_parallelism(key, torch.tensor(3.0), tp(0, 2, 0)) == INVALID_PARAMS
    assert store.put_tensor_with_parallelism(key, torch.tensor(3.0), par(axis("dp", 0, 2))) == 0


# ---- reads ------------------------------------------------------------------------


@pytest.mark.parametrize("shape,split", [((8, 12), 0), ((8, 12), 1), ((4, 6, 8), 1), ((4, 6, 8), 2)])
def test_full_and_cut_reads_of_tp_shards(store, key, shape, split):
    x = ramp(*shape)
    for rank, shard in enumerate(x.chunk(2, split)):
        assert store.put_tensor_with_parallelism(key, shard.contiguous(), tp(rank, 2, split)) == 0
    for read_size in (1, 2, 4):
        if shape[split] % read_size:
            continue
        t = target("full", tp(read_size - 1, read_size, split))
        assert torch.equal(store.get_tensor_with_parallelism(key, t), x)
        for rank in range(read_size):
            got = store.get_tensor_with_parallelism(key, target("shard", tp(rank, read_size, split)))
            assert torch.equal(got, x.chunk(read_size, split)[rank])
    # A size the dim does not split into, another split dim, a rank out of
    # range, no parallelism: nothing. (For the first, the reference returns
    # the stored rank-0 shard, which is not the shard asked for.)
    if OURS:
        assert store.get_tensor_with_parallelism(key, target("shard", tp(0, 5, split))) is None
    other = (split + 1) % len(shape)
    assert store.get_tensor_with_parallelism(key, target("full", tp(0, 2, other))) is None
    assert store.get_tensor_with_parallelism(key, target("full", tp(2, 2, split))) is None
    assert store.get_tensor_with_parallelism(key, target("shard")) is None
    assert store.get_tensor_with_parallelism(key, target("full")) is None
    assert store.get_tensor_with_parallelism(key) is None


def test_multi_axis_reads_select_by_the_other_axes(store, key):
    x = ramp(6, 8)
    for dp_rank, data in ((0, x), (1, x + 100)):
        for rank in range(4):
            assert store.put_tensor_with_parallelism(key, data, dp_tp(dp_rank, rank, 4, 1)) == 0
    for dp_rank, data in ((0, x), (1, x + 100)):
        # Axis order of the target does not matter.
        t = par(axis("tp", 3, 4, 1), axis("dp", dp_rank, 2))
        assert torch.equal(store.get_tensor_with_parallelism(key, target("full", t)), data)
        got = store.get_tensor_with_parallelism(key, target("shard", dp_tp(dp_rank, 1, 2, 1)))
        assert torch.equal(got, data[:, 4:])
    assert store.get_tensor_with_parallelism(key, target("full", tp(0, 4, 1))) is None


def test_missing_shard_reads_none(store, key):
    x = ramp(4, 6)
    assert store.put_tensor_with_parallelism(key, x[:, :2].contiguous(), tp(0, 3, 1)) == 0
    assert store.get_tensor_with_parallelism(key, target("shard", tp(1, 3, 1))) is None
    assert store.get_tensor_with_parallelism(key, target("full", tp(0, 3, 1))) is None
    if OURS:  # the reference returns the stored TP-3 shard, which is not TP-2 rank 0
        assert store.get_tensor_with_parallelism(key, target("shard", tp(0, 2, 1))) is None


@pytest.mark.skipif(not OURS, reason="the reference returns the stored shard whatever the target's split dim")
def test_shard_of_another_split_dim_is_not_returned(store, key):
    x = ramp(4, 6)
    assert store.put_tensor_with_parallelism(key, x[:, :3].contiguous(), tp(0, 2, 1)) == 0
    assert store.get_tensor_with_parallelism(key, target("shard", tp(0, 2, 0))) is None
    assert torch.equal(store.get_tensor_with_parallelism(key, target("shard", tp(0, 2, 1))), x[:, :3])


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "bool", "int64", "float16"])
def test_cut_and_full_keep_every_dtype(store, key, name):
    dtype = getattr(torch, name)
    x = (ramp(4, 8) % 5 > 1) if dtype == torch.bool else (ramp(4, 8) % 13).to(dtype)
    for rank in range(4):
        assert store.put_tensor_with_parallelism(key, x, dp_tp(0, rank, 4, 1)) == 0
    full = store.get_tensor_with_parallelism(key, target("full", dp_tp(0, 0, 4, 1)))
    assert full.dtype == dtype and torch.equal(full.view(torch.uint8), x.view(torch.uint8))
    half = store.get_tensor_with_parallelism(key, target("shard", dp_tp(0, 1, 2, 1)))
    assert torch.equal(half.view(torch.uint8), x[:, 4:].contiguous().view(torch.uint8))


def test_into_reads_write_header_and_data(store, key, buf):
    x = ramp(4, 6)
    for rank, shard in enumerate(x.chunk(2, 1)):
        assert store.put_tensor_with_parallelism(key, shard.contiguous(), tp(rank, 2, 1)) == 0
    got = store.get_tensor_with_parallelism_into(key, buf.ptr, buf.size, target("full", tp(0, 2, 1)))
    assert torch.equal(got, x) and got.data_ptr() == buf.ptr + HEADER
    assert header(bytes(buf.mem[:HEADER]))[:6] == (0, 2, 0, 96, (4, 6), (4, 6))
    got[0, 0] = 42.0
    assert bytes(buf.mem[HEADER : HEADER + 4]) == struct.pack("<f", 42.0)
    got = store.get_tensor_with_parallelism_into(key, buf.ptr, buf.size, target("shard", tp(1, 3, 1)))
    assert torch.equal(got, x[:, 2:4])
    assert header(bytes(buf.mem[:HEADER])) == (0, 2, 1, 32, (4, 6), (4, 2), [(1, 0, 1, 3, 1, 0, 2)])
    got = store.get_tensor_with_parallelism_into(key, buf.ptr, buf.size, target("shard", tp(1, 2, 1)))
    assert torch.equal(got, x[:, 3:])
    # Exactly big enough works; one byte short, a null pointer: None.
    full = target("full", tp(0, 2, 1))
    assert store.get_tensor_with_parallelism_into(key, buf.ptr, HEADER + 96, full) is not None
    assert store.get_tensor_with_parallelism_into(key, buf.ptr, HEADER + 95, full) is None
    assert store.get_tensor_with_parallelism_into(key, buf.ptr, HEADER + 47, target("shard", tp(1, 2, 1))) is None
    assert store.get_tensor_with_parallelism_into(key, 0, buf.size, full) is None


def test_batch_calls(store, key, buf):
    keys = [key + "a", key + "b"]
    xs = [ramp(4, 8), ramp(8, 4) + 7]
    ps = [dp_tp(1, 0, 2, 1), dp_tp(1, 0, 2, 0)]
    assert store.batch_put_tensor_with_parallelism(keys, xs, ps) == [0, 0]
    ps = [dp_tp(1, 1, 2, 1), dp_tp(1, 1, 2, 0)]
    assert store.batch_put_tensor_with_parallelism(keys, xs, ps) == [0, 0]
    fulls = store.batch_get_tensor_with_parallelism(keys, [target("full", p) for p in ps])
    assert all(torch.equal(g, x) for g, x in zip(fulls, xs))
    ptrs = [buf.ptr, buf.ptr + (1 << 19)]
    got = store.batch_get_tensor_with_parallelism_into(keys, ptrs, [1 << 19] * 2, [target("shard", p) for p in ps])
    assert torch.equal(got[0], xs[0][:, 4:]) and torch.equal(got[1], xs[1][4:])
    # One item invalid: it alone fails.
    bad = [dp_tp(0, 0, 2, 1), dp_tp(0, 0, 3, 1)]
    assert store.batch_put_tensor_with_parallelism([key + "c", key + "d"], xs, bad) == [0, INVALID_PARAMS]
    # Lengths that differ, or both descriptions: every item fails.
    assert store.batch_put_tensor_with_parallelism(keys, xs[:1]) == [INVALID_PARAMS] * 2
    assert store.batch_put_tensor_with_parallelism(keys, xs, [None]) == [INVALID_PARAMS] * 2
    parts = [Part(0, 2, 0)] * 2
    assert store.batch_put_tensor_with_parallelism(keys, xs, ps, writer_partitions=parts) == [INVALID_PARAMS] * 2
    assert store.batch_get_tensor_with_parallelism(keys, [None]) == [None, None]
    assert store.batch_get_tensor_with_parallelism_into(keys, ptrs[:1], [1 << 19]) == [None, None]
    assert store.batch_put_tensor_with_parallelism([], []) == []
    assert store.batch_get_tensor_with_parallelism([]) == []


def test_upsert_replaces_shards_and_manifest(store, key):
    x = ramp(4, 8)
    for rank in range(2):
        assert store.put_tensor_with_parallelism(key, x, dp_tp(0, rank, 2, 1)) == 0
        assert store.put_tensor_with_parallelism(key, x + 1, dp_tp(0, rank, 2, 1)) == 0  # put keeps
    assert torch.equal(store.get_tensor_with_parallelism(key, target("full", dp_tp(0, 0, 2, 1))), x)
    # 6 rows do not split in 4: refused, nothing replaced.
    assert store.upsert_tensor_with_parallelism(key, ramp(6, 4), dp_tp(0, 0, 4, 0)) == INVALID_PARAMS
    assert manifest(store.get(f"{key}__parallelism_manifest")) == (b"NAMW", 1, 96, 0, 1, 2, (4, 8))
    y = ramp(8, 4) - 3
    for rank in range(4):
        assert store.upsert_tensor_with_parallelism(key, y, dp_tp(0, rank, 4, 0)) == 0
    assert manifest(store.get(f"{key}__parallelism_manifest")) == (b"NAMW", 1, 96, 0, 0, 4, (8, 4))
    assert torch.equal(store.get_tensor_with_parallelism(key, target("full", dp_tp(0, 0, 2, 0))), y)
    assert store.batch_upsert_tensor_with_parallelism([key + "w"], [y], writer_partitions=[Part(0, 1, 1)]) == [0]
    assert torch.equal(store.get_tensor_with_parallelism(key + "w", target("full")), y)


def test_from_buffers_store_every_tp_rank(store, key, buf):
    x = ramp(4, 6)
    assert store.put_tensor(key + "seed", x) == 0
    assert store.get_tensor_into(key + "seed", buf.ptr, buf.size) is not None
    size = HEADER + 96
    assert store.put_tensor_with_parallelism_from(key, buf.ptr, size, tp(0, 2, 1)) == 0
    assert [store.is_exist(f"{key}_tp_{r}") for r in range(2)] == [1, 1]
    assert torch.equal(store.get_tensor_with_tp(key, tp_rank=1, tp_size=2), x[:, 3:])
    assert store.put_tensor_with_parallelism_from(key + "m", buf.ptr, size, dp_tp(0, 1, 2, 0)) == 0
    assert store.is_exist(f"{key}m__dp_0of2__tp_0of2_sd0") == 1
    assert torch.equal(store.get_tensor_with_parallelism(key + "m", target("full", dp_tp(0, 1, 2, 0))), x)
    assert store.upsert_tensor_with_parallelism_from(key + "w", buf.ptr, size, writer_partition=Part(1, 2, 0)) == 0
    assert store.batch_put_tensor_with_parallelism_from([key + "v"], [buf.ptr], [size], writer_partitions=[Part(0, 2, 0)]) == [0]
    assert torch.equal(store.get_tensor_with_parallelism(key + "w", target("shard", tp(1, 2, 0))), x[2:])
    assert store.put_tensor_with_parallelism_from(key + "x", buf.ptr, size - 1, tp(0, 2, 1)) == INVALID_PARAMS
    assert store.put_tensor_with_parallelism_from(key + "x", buf.ptr, size, dp_tp(0, 0, 4, 1)) == INVALID_PARAMS
    assert store.batch_upsert_tensor_with_parallelism_from([key + "y"], [buf.ptr], [size]) == [0]
    assert torch.equal(store.get_tensor(key + "y"), x)


def test_zero_size_tensors(store, key):
    x = torch.empty((4, 0, 3))
    for rank in range(2):
        assert store.put_tensor_with_parallelism(key, x, dp_tp(0, rank, 2, 0)) == 0
    full = store.get_tensor_with_parallelism(key, target("full", dp_tp(0, 0, 2, 0)))
    assert full is not None and tuple(full.shape) == (4, 0, 3)
    shard = store.get_tensor_with_parallelism(key, target("shard", dp_tp(0, 3, 4, 0)))
    assert shard is not None and tuple(shard.shape) == (1, 0, 3)


def test_concurrent_writers_and_readers(store, key):
    x = ramp(16, 16, 16)
    errors = []

    def write(i):
        for rank in range(4):
            if store.put_tensor_with_parallelism(f"{key}-{i}", x + i, dp_tp(0, rank, 4, i % 3)) != 0:
                errors.append(("put", i, rank))

    def read(i):
        for rank in range(2):
            got = store.get_tensor_with_parallelism(f"{key}-{i}", target("shard", dp_tp(0, rank, 2, i % 3)))
            if got is None or not torch.equal(got, (x + i).chunk(2, i % 3)[rank]):
                errors.append(("get", i, rank))

    for fn in (write, read):
        threads = [threading.Thread(target=fn, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
