"""What the ranks of tests/python/test_pg.py run: each case is a function
of (rank, world) that checks its results itself and raises on a mismatch.
Kept apart from the test module so spawned ranks import only this."""

from __future__ import annotations

import os
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from mooncake import pg

DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
    torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.float8_e4m3fn,
]


def vals(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Small exact values, different per rank and position."""
    base = torch.arange(n, dtype=torch.int64) % 3 + rank + 1
    if dtype == torch.bool:
        return (base + rank) % 2 == 0
    if dtype.is_complex:
        return torch.complex(base.float(), -base.float()).to(dtype)
    return base.to(dtype)


def expect_reduce(world: int, n: int, dtype: torch.dtype, op) -> torch.Tensor:
    ts = [vals(r, n, dtype) for r in range(world)]
    calc = torch.float32 if dtype == torch.float8_e4m3fn else dtype
    ts = [t.to(calc) for t in ts]
    acc = ts[0].clone()
    for t in ts[1:]:
        if op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            acc = acc + t if dtype != torch.bool else acc | t
        elif op == dist.ReduceOp.PRODUCT:
            acc = acc * t if dtype != torch.bool else acc & t
        elif op == dist.ReduceOp.MIN:
            acc = torch.minimum(acc, t)
        elif op == dist.ReduceOp.MAX:
            acc = torch.maximum(acc, t)
    if op == dist.ReduceOp.AVG:
        acc = acc / world
    return acc.to(dtype)


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}")


def ops_for(dtype):
    if dtype.is_complex:  # torch allows SUM and AVG only
        return [dist.ReduceOp.SUM, dist.ReduceOp.AVG]
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    if dtype.is_floating_point or dtype.is_complex:
        ops.append(dist.ReduceOp.AVG)
    return ops


# -- priority cases ------------------------------------------------------


def case_all_reduce(rank, world):
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for n in (1, 7, 5000):
                t = vals(rank, n, dtype)
                dist.all_reduce(t, op=op)
                same(t, expect_reduce(world, n, dtype, op), f"all_reduce {dtype} {op} n={n}")
    # Non-contiguous (a transposed view) and multi-round (the test's slots
    # are 64 KiB) tensors, on the reduce-scatter + all-gather schedule.
    base = vals(rank, 4 * 6, torch.float32).reshape(4, 6)
    t = base.t()
    assert not t.is_contiguous()
    dist.all_reduce(t)
    same(t, expect_reduce(world, 24, torch.float32, dist.ReduceOp.SUM).reshape(4, 6).t(), "non-contiguous")
    n = (300 << 10) + 13
    t = vals(rank, n, torch.float32)
    dist.all_reduce(t)
    same(t, expect_reduce(world, n, torch.float32, dist.ReduceOp.SUM), "large all_reduce")
    t = vals(rank, n, torch.bfloat16)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    same(t, expect_reduce(world, n, torch.bfloat16, dist.ReduceOp.MAX), "large bf16 max")
    t = vals(rank, 5, torch.int32)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait()
    assert work.is_completed() and pg.get_local_success(work)
    assert pg.get_failed_ranks_hint(work).tolist() == [0] * world
    same(t, expect_reduce(world, 5, torch.int32, dist.ReduceOp.SUM), "async")
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG)
    except ValueError as exc:
        assert "AVG" in str(exc)
    else:
        raise AssertionError("AVG of an integer tensor was accepted")


def case_broadcast_gather(rank, world):
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64):
        for root in range(world):
            t = vals(rank, 300, dtype)
            dist.broadcast(t, src=root)
            same(t, vals(root, 300, dtype), f"broadcast {dtype} from {root}")
        outs = [torch.zeros(1000, dtype=dtype) for _ in range(world)]
        dist.all_gather(outs, vals(rank, 1000, dtype))
        for r in range(world):
            same(outs[r], vals(r, 1000, dtype), f"all_gather {dtype} from {r}")
        out = torch.zeros(world * 1000, dtype=dtype)
        dist.all_gather_into_tensor(out, vals(rank, 1000, dtype))
        same(out, torch.cat([vals(r, 1000, dtype) for r in range(world)]), f"all_gather_into_tensor {dtype}")
    # Multi-round, non-contiguous output.
    n = 40_000
    out = torch.zeros(n, world).t()
    dist.all_gather_into_tensor(out, vals(rank, n, torch.float32))
    same(out, torch.stack([vals(r, n, torch.float32) for r in range(world)]), "all_gather into a transposed view")
    t = vals(rank, 40_000, torch.float64)
    dist.broadcast(t, src=world - 1)
    same(t, vals(world - 1, 40_000, torch.float64), "large broadcast")


def case_reduce_scatter_barrier(rank, world):
    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.float16):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            for n in (1, 17, 30_000):
                inp = torch.cat([vals(rank, n, dtype) + q for q in range(world)]) if dtype != torch.bool else None
                out = torch.zeros(n, dtype=dtype)
                dist.reduce_scatter_tensor(out, inp, op=op)
                want = expect_reduce(world, n, dtype, op) + (rank if op == dist.ReduceOp.MAX else rank * world)
                same(out, want.to(dtype), f"reduce_scatter_tensor {dtype} {op} n={n}")
    outs = torch.zeros(8)
    ins = [vals(rank, 8, torch.float32) * (q + 1) for q in range(world)]
    dist.reduce_scatter(outs, ins)
    same(outs, expect_reduce(world, 8, torch.float32, dist.ReduceOp.SUM) * (rank + 1), "reduce_scatter list")
    for _ in range(20):
        dist.barrier()


def case_send_recv(rank, world):
    if world == 1:
        return
    peer = rank ^ 1
    if peer >= world:
        return
    big = vals(rank, (3 << 20) // 4 + 11, torch.float32)
    if rank % 2 == 0:
        # Out of tag order: the receiver asks for tag 2 first.
        dist.send(vals(rank, 10, torch.float32), dst=peer, tag=1)
        dist.send(vals(rank, 20, torch.bfloat16), dst=peer, tag=2)
        dist.send(big, dst=peer, tag=3)
        back = torch.zeros(6, 4).t()
        dist.recv(back, src=peer, tag=9)
        same(back, vals(peer, 24, torch.int64).reshape(6, 4).t().float(), "recv into a transposed view")
    else:
        a = torch.zeros(20, dtype=torch.bfloat16)
        dist.recv(a, src=peer, tag=2)
        same(a, vals(peer, 20, torch.bfloat16), "tag 2")
        b = torch.zeros(10)
        dist.recv(b, src=peer, tag=1)
        same(b, vals(peer, 10, torch.float32), "tag 1")
        c = torch.zeros_like(big)
        work = dist.irecv(c, src=peer, tag=3)
        work.wait()
        same(c, vals(peer, c.numel(), torch.float32), "large message")
        dist.send(vals(rank, 24, torch.int64).reshape(6, 4).t().float(), dst=peer, tag=9)


def case_reinit(rank, world, port):
    """Destroy and init again on the same store, twice."""
    for i in range(2):
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=120))
        dist.init_process_group("mooncake-cpu", store=store, rank=rank, world_size=world)
        t = torch.tensor([rank + i])
        dist.all_reduce(t)
        assert t.item() == sum(range(world)) + i * world, t
        dist.destroy_process_group()


# -- priority 2 ------------------------------------------------------------


def case_all_to_all(rank, world):
    inp = torch.arange(world * 3, dtype=torch.float32) + 100 * rank
    out = torch.zeros(world * 3)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(rank * 3, rank * 3 + 3, dtype=torch.float32) + 100 * r for r in range(world)])
    same(out, want, "all_to_all_single equal")
    # Variable splits: rank r sends (r + q) % 3 rows of 2 columns to rank q.
    in_splits = [(rank + q) % 3 for q in range(world)]
    out_splits = [(r + rank) % 3 for r in range(world)]
    inp = torch.cat([torch.full((s, 2), float(rank * 10 + q)) for q, s in enumerate(in_splits)])
    out = torch.zeros(sum(out_splits), 2)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    want = torch.cat([torch.full((s, 2), float(r * 10 + rank)) for r, s in enumerate(out_splits)])
    same(out, want, "all_to_all_single variable")
    ins = [torch.full((q + 1,), rank * 100 + q, dtype=torch.int32) for q in range(world)]
    outs = [torch.zeros(rank + 1, dtype=torch.int32) for _ in range(world)]
    dist.all_to_all(outs, ins)
    for r in range(world):
        same(outs[r], torch.full((rank + 1,), r * 100 + rank, dtype=torch.int32), f"all_to_all from {r}")
    big_in = vals(rank, world * 50_000, torch.float32)
    big_out = torch.zeros_like(big_in)
    dist.all_to_all_single(big_out, big_in)
    want = torch.cat([vals(r, world * 50_000, torch.float32)[rank * 50_000 : (rank + 1) * 50_000] for r in range(world)])
    same(big_out, want, "large all_to_all_single")


def case_rooted(rank, world):
    for root in range(world):
        t = torch.zeros(3, dtype=torch.int32)
        scatter_list = [torch.full((3,), q + 10 * root, dtype=torch.int32) for q in range(world)] if rank == root else None
        dist.scatter(t, scatter_list, src=root)
        same(t, torch.full((3,), rank + 10 * root, dtype=torch.int32), "scatter")
        gl = [torch.zeros(2) for _ in range(world)] if rank == root else None
        dist.gather(torch.full((2,), float(rank)), gl, dst=root)
        if rank == root:
            for r in range(world):
                same(gl[r], torch.full((2,), float(r)), "gather")
        t = vals(rank, 33, torch.float32)
        dist.reduce(t, dst=root)
        if rank == root:
            same(t, expect_reduce(world, 33, torch.float32, dist.ReduceOp.SUM), "reduce")


def case_batch_p2p(rank, world):
    if world == 1:
        return
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    # Larger than the mailbox both ways: a blocking send would deadlock.
    send = vals(rank, (6 << 20) // 4, torch.float32)
    recv = torch.zeros_like(send)
    ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(recv, vals(prv, send.numel(), torch.float32), "batch_isend_irecv ring")
    # group_dst / group_src in a subgroup without rank 0 (torch sorts a
    # group's ranks: group rank = rank - 1), or the whole world of 2.
    ranks = list(range(1, world)) if world > 2 else [0, 1]
    sub = dist.new_group(ranks)
    if rank in ranks:
        me = dist.get_group_rank(sub, rank)
        assert me == ranks.index(rank)
        if me == 0:
            dist.send(torch.tensor([7.0]), group_dst=1, group=sub)
        elif me == 1:
            t = torch.zeros(1)
            dist.recv(t, group_src=0, group=sub)
            assert t.item() == 7.0
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=sub)
        assert t.item() == sum(ranks)
        t = torch.zeros(1) if me else torch.tensor([5.0])
        dist.broadcast(t, group_src=0, group=sub)
        assert t.item() == 5.0
    # A subgroup of the even ranks only.
    evens = list(range(0, world, 2))
    g = dist.new_group(evens)
    if rank in evens:
        t = torch.tensor([rank])
        dist.all_reduce(t, group=g)
        assert t.item() == sum(evens), t
        if len(evens) > 1:
            w = [dist.P2POp(dist.isend, torch.tensor([rank]), group_peer=(evens.index(rank) + 1) % len(evens), group=g),
                 dist.P2POp(dist.irecv, t, group_peer=(evens.index(rank) - 1) % len(evens), group=g)]
            for x in dist.batch_isend_irecv(w):
                x.wait()
            assert t.item() == evens[(evens.index(rank) - 1) % len(evens)]


def case_batch_many(rank, world):
    """Many isend/irecv with every peer in one batch, receives listed
    before the sends and tags out of order, some larger than a mailbox
    (1 MiB in these tests): each has its Work, and all complete."""
    if world == 1:
        return
    peers = [p for p in range(world) if p != rank]
    sizes = [3, (3 << 20) // 4, 1]
    recvs = {(p, i): torch.zeros(n, dtype=torch.float32) for p in peers for i, n in enumerate(sizes)}
    ops = [dist.P2POp(dist.irecv, recvs[(p, i)], p, tag=i) for p in peers for i in reversed(range(len(sizes)))]
    ops += [dist.P2POp(dist.isend, vals(rank * 10 + i, n, torch.float32), p, tag=i)
            for p in peers for i, n in enumerate(sizes)]
    works = dist.batch_isend_irecv(ops)
    assert len(works) == len(ops)
    for w in works:
        assert w.wait() and pg.get_local_success(w)
    for (p, i), t in recvs.items():
        same(t, vals(p * 10 + i, sizes[i], torch.float32), f"batch from {p} tag {i}")


def case_batch_together(rank, world):
    """A batch's operations towards different peers are under way at once:
    rank 0's batch sends ranks 1 and 2 more than a mailbox holds each;
    rank 1 reads rank 0's only after rank 2 has read its own and passed a
    word on. Issued one after the other, rank 0's send to rank 2 would
    wait behind the one to rank 1, and the three ranks would hang."""
    if world < 3:
        return
    big = (3 << 20) // 4
    if rank == 0:
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, vals(1, big, torch.float32), 1),
                                        dist.P2POp(dist.isend, vals(2, big, torch.float32), 2)])
        for w in works:
            assert w.wait() and pg.get_local_success(w)
    elif rank in (1, 2):
        got = torch.zeros(big)
        if rank == 1:
            t = torch.zeros(1)
            dist.recv(t, src=2)
            assert t.item() == 5.0, t
        dist.recv(got, src=0)
        same(got, vals(rank, big, torch.float32), "the large message")
        if rank == 2:
            dist.send(torch.tensor([5.0]), dst=1)
    dist.barrier()


def _wait_dead(rank_gone: int) -> None:
    """Until this rank sees ``rank_gone``'s process gone (what the
    reference's tests wait for with an event)."""
    deadline = time.monotonic() + 60
    while pg.get_peer_state(dist.group.WORLD, [rank_gone])[0]:
        if time.monotonic() > deadline:
            raise AssertionError(f"rank {rank_gone} still seen alive after 60 s")
        time.sleep(0.01)


def _allgather_reduce_scatter(active: int, pos: int) -> None:
    """The reference's _run_allgather_reduce_scatter: output sizes follow
    the active ranks, and ``pos`` is this rank's place among them."""
    out = torch.zeros(active, dtype=torch.int32)
    dist.all_gather_into_tensor(out, torch.tensor([pos + 1], dtype=torch.int32))
    assert out.tolist() == list(range(1, active + 1)), out
    rs = torch.zeros(1, dtype=torch.int32)
    dist.reduce_scatter_tensor(rs, torch.arange(1, active + 1, dtype=torch.int32))
    assert rs.item() == (pos + 1) * active, rs


def case_failed_rank(rank, world):
    """The last rank dies after the first collectives (auto-deactivation,
    the default): the survivors' next operations complete without a hang,
    report it, sum the live ranks only, and go on as a smaller group."""
    gone = world - 1
    t = torch.tensor([rank], dtype=torch.int32)
    dist.all_reduce(t)
    assert t.item() == sum(range(world))
    _allgather_reduce_scatter(world, rank)
    epoch = pg.get_current_epoch(dist.group.WORLD)
    if rank == gone:
        os._exit(0)
    _wait_dead(gone)
    started = time.monotonic()
    t = torch.tensor([rank + 1], dtype=torch.int32)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert t.item() == world * (world + 1) // 2 - world, t
    assert not pg.get_local_success(work)
    hint = [0] * world
    hint[gone] = 1
    assert pg.get_failed_ranks_hint(work).tolist() == hint, pg.get_failed_ranks_hint(work)
    assert pg.get_active_ranks(dist.group.WORLD).tolist() == [1] * (world - 1) + [0]
    assert pg.get_current_epoch(dist.group.WORLD) > epoch
    # Auto-sync applied the failure already.
    assert pg.sync_after_failure(dist.group.WORLD).status == pg.SyncAfterFailureStatus.NoPending
    # The next ones run on the survivors and succeed.
    t = torch.tensor([rank + 1], dtype=torch.int32)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert pg.get_local_success(work) and t.item() == world * (world + 1) // 2 - world
    _allgather_reduce_scatter(world - 1, rank)
    dist.barrier()
    w = dist.irecv(torch.zeros(1), src=gone)
    w.wait()
    assert not pg.get_local_success(w)
    w = dist.isend(torch.zeros(1), dst=gone)
    w.wait()
    assert not pg.get_local_success(w)
    if world > 2:
        peer = 1 - rank if rank < 2 else 0
        resp = pg.deactivate_ranks(dist.group.WORLD, [peer])
        assert resp.status == pg.ProposalStatus.Rejected and "alive" in resp.reject_reason, resp
    elapsed = time.monotonic() - started
    assert elapsed < 60, f"failure took {elapsed:.1f} s to surface"


def case_large_failed(rank, world):
    """A large all_reduce (over TCP, the schedule that sends each peer only
    its part) with the last rank killed: the survivors' operation fails
    and reports it without a hang, and the next ones sum the live ranks."""
    gone = world - 1
    n = (1 << 20) + 3
    t = torch.full((n,), float(rank + 1))
    dist.all_reduce(t)
    assert bool((t == world * (world + 1) / 2).all()), t
    if rank == gone:
        os._exit(0)
    _wait_dead(gone)
    started = time.monotonic()
    t = torch.full((n,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert not pg.get_local_success(work)
    assert pg.get_failed_ranks_hint(work).tolist()[gone] == 1
    for _ in range(2):
        t = torch.full((n,), float(rank + 1))
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        assert pg.get_local_success(work)
        assert bool((t == (world - 1) * world / 2).all()), t
    elapsed = time.monotonic() - started
    assert elapsed < 60, f"failure took {elapsed:.1f} s to surface"


def case_manual_evict(rank, world):
    """The reference's manual deactivation with auto_deactivate and
    auto_sync off, rounds 1-3: a dead rank stays active and fails every
    operation until the survivors sync and deactivate it."""
    broken = 1
    group = dist.group.WORLD
    expected_all = world * (world + 1) // 2
    t = torch.tensor([rank + 1], dtype=torch.int32)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert t.item() == expected_all and pg.get_local_success(work)
    assert pg.get_failed_ranks_hint(work).tolist() == [0] * world
    assert pg.get_active_ranks(group).tolist() == [1] * world
    if rank == broken:
        os._exit(0)
    _wait_dead(broken)
    expected_reduced = expected_all - (broken + 1)
    hint = [0] * world
    hint[broken] = 1
    for _ in range(2):
        t = torch.tensor([rank + 1], dtype=torch.int32)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        assert t.item() == expected_reduced, t
        assert not pg.get_local_success(work)
        assert pg.get_failed_ranks_hint(work).tolist() == hint
        assert pg.get_active_ranks(group).tolist() == [1] * world
    resp = pg.sync_after_failure(group)
    assert resp.status in (pg.SyncAfterFailureStatus.Reconciled, pg.SyncAfterFailureStatus.NoPending)
    assert resp.status == pg.SyncAfterFailureStatus.Reconciled
    assert not pg.get_peer_state(group, [broken])[0]
    assert pg.get_active_ranks(group).tolist() == [1] * world
    epoch = pg.get_current_epoch(group)
    resp = pg.deactivate_ranks(group, [broken])
    assert resp.status in (pg.ProposalStatus.Applied, pg.ProposalStatus.AppliedWithDroppedRanks), resp
    assert resp.status != pg.ProposalStatus.AppliedWithDroppedRanks or set(resp.dropped_ranks) == {broken}
    assert pg.get_current_epoch(group) == epoch + 1
    want = [1] * world
    want[broken] = 0
    assert pg.get_active_ranks(group).tolist() == want
    t = torch.tensor([rank + 1], dtype=torch.int32)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert t.item() == expected_reduced and pg.get_local_success(work)
    # A dead root is refused with a clear error rather than waited for.
    try:
        dist.broadcast(torch.zeros(1), src=broken)
    except ValueError as exc:
        assert "not an active rank" in str(exc)
    else:
        raise AssertionError("broadcast from a deactivated root was accepted")


def case_p2p_fault(rank, world):
    """The reference's P2P fault detection: a point-to-point all-to-all,
    healthy, then with rank 1 dead: the operations with it fail (and only
    those), and auto-sync has applied the new view when they complete."""
    broken = 1

    def p2p_all_to_all():
        ops, got = [], []
        for p in range(world):
            if p == rank:
                continue
            r = torch.empty(1, dtype=torch.int64)
            ops.append(dist.P2POp(dist.isend, torch.tensor([rank]), peer=p))
            ops.append(dist.P2POp(dist.irecv, r, peer=p))
            got.append((p, r))
        works = dist.batch_isend_irecv(ops)
        for w in works:
            w.wait()
        return works, got

    works, got = p2p_all_to_all()
    for w in works:
        assert pg.get_local_success(w)
        assert pg.get_failed_ranks_hint(w).tolist() == [0] * world
    assert all(r.item() == p for p, r in got)
    dist.barrier()
    if rank == broken:
        os._exit(0)
    _wait_dead(broken)
    works, got = p2p_all_to_all()
    peers = [p for p in range(world) if p != rank]
    for w, peer in zip(works, [p for p in peers for _ in range(2)]):
        hint = [0] * world
        if peer == broken:
            hint[broken] = 1
            assert not pg.get_local_success(w)
        else:
            assert pg.get_local_success(w)
        assert pg.get_failed_ranks_hint(w).tolist() == hint
    assert all(r.item() == p for p, r in got if p != broken)
    want = [1] * world
    want[broken] = 0
    assert pg.get_active_ranks(dist.group.WORLD).tolist() == want


def case_transport(rank, world):
    """The group runs over the transport MOONCAKE_PG_TRANSPORT names."""
    want = os.environ.get("MOONCAKE_PG_TRANSPORT", "shm")
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    got = getattr(backend, "_transport", None)
    assert got == want, f"transport {got!r}, expected {want!r}"
    t = torch.ones(3)
    dist.all_reduce(t)
    same(t, torch.full((3,), float(world)), "all_reduce")


def case_tcp_growable(rank, world):
    """Over TCP a group may reserve ranks to grow into, as over shared
    memory: it reports the ranks it has and runs on them."""
    g = dist.new_group(list(range(world)), backend="mooncake-cpu",
                       pg_options=pg.MooncakeBackendOptions(world + 1))
    assert dist.get_world_size(g) == world
    assert pg.get_active_ranks(g).tolist() == [1] * world + [0]
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    same(t, torch.full((2,), float(world)), "all_reduce on the growable group")


OPTIONS = {
    "manual_evict": lambda world: pg.MooncakeBackendOptions(world, False, False, False),
    "failed_rank": lambda world: pg.MooncakeBackendOptions(world),
}


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def rank_main(rank, world, port, cases, results):
    os.environ.setdefault("MOONCAKE_PG_SLOT_BYTES", str(64 << 10))
    os.environ.setdefault("MOONCAKE_PG_MAILBOX_BYTES", str(1 << 20))
    torch.set_num_threads(1)
    try:
        for name in cases:
            if name == "reinit":
                CASES[name](rank, world, port)
                continue
            store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=120))
            options = OPTIONS[name](world) if name in OPTIONS else None
            dist.init_process_group(
                "mooncake-cpu", store=store, rank=rank, world_size=world,
                timeout=timedelta(seconds=120), pg_options=options,
            )
            try:
                CASES[name](rank, world)
            finally:
                dist.destroy_process_group()
        results.put((rank, "ok"))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, traceback.format_exc()))


def host_main(rank: int, world: int, host: str, port: int, cases: list[str]) -> int:
    """One rank run as its own program (``python -c``), for ranks placed in
    separate network namespaces: rank 0 serves the store at ``host`` (port 0:
    a free one, printed for the others), the others reach it at
    ``host:port``. Exit status 0 when every case passed."""
    torch.set_num_threads(1)
    os.environ.setdefault("MOONCAKE_PG_SLOT_BYTES", str(64 << 10))
    try:
        store = dist.TCPStore(host, port, world, is_master=rank == 0, wait_for_workers=False,
                              timeout=timedelta(seconds=120))
        if rank == 0:
            print(f"store-port {store.port}", flush=True)
        for name in cases:
            prefixed = dist.PrefixStore(f"case-{name}", store)
            dist.init_process_group("mooncake-cpu", store=prefixed, rank=rank, world_size=world,
                                    timeout=timedelta(seconds=120))
            try:
                CASES[name](rank, world)
            finally:
                dist.destroy_process_group()
        # Rank 0 serves the store: it leaves once every rank is done.
        store.add("finished", 1)
        if rank == 0:
            deadline = time.monotonic() + 120
            while int(store.add("finished", 0)) < world and time.monotonic() < deadline:
                time.sleep(0.1)
        print("ok", flush=True)
        return 0
    except BaseException:  # noqa: BLE001 - reported on stderr
        traceback.print_exc()
        return 1
