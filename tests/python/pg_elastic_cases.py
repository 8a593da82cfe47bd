"""What the processes of tests/python/test_pg_elastic.py run: the
reference's elastic recovery and extension scenarios (its
mooncake-pg/tests/test_pg_elastic.py), with the same calls and assertions.
Each worker is ``fn(proc, port, events)`` and raises on a mismatch; kept
apart from the test module so spawned processes import only this."""

from __future__ import annotations

import os
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from mooncake import _mooncake, pg
from mooncake.pg import _fault

BROKEN = 1


def init(rank, world, port, *, max_group_size=None, is_extension=False, auto=True):
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    opts = pg.MooncakeBackendOptions(max_group_size or world, is_extension, auto, auto)
    dist.init_process_group("mooncake-cpu", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=120), pg_options=opts)
    return dist.group.WORLD


def wait_until(pred, what, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def summed(value, group=None):
    t = torch.tensor([value], dtype=torch.int32)
    dist.all_reduce(t, group=group)
    return int(t.item())


def gather_scatter(active, rank):
    """The reference's _run_allgather_reduce_scatter: sizes follow the
    active ranks."""
    out = torch.zeros(active, dtype=torch.int32)
    dist.all_gather_into_tensor(out, torch.tensor([rank + 1], dtype=torch.int32))
    assert out.tolist() == list(range(1, active + 1)), out
    rs = torch.zeros(1, dtype=torch.int32)
    dist.reduce_scatter_tensor(rs, torch.arange(1, active + 1, dtype=torch.int32))
    assert rs.item() == (rank + 1) * active, rs


def ping_pong(rank, peer):
    send, recv = torch.tensor([rank], dtype=torch.int64), torch.empty(1, dtype=torch.int64)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)])
    for w in works:
        w.wait()
    assert all(pg.get_local_success(w) for w in works), "P2P with the peer failed"
    assert recv.item() == peer, recv


def recover(group, ranks):
    wait_until(lambda: all(pg.get_peer_state(group, ranks)), f"ranks {ranks} ready")
    resp = pg.recover_ranks(group, ranks)
    assert resp.status == pg.ProposalStatus.Applied, resp


# -- extension: 3 primaries (max_group_size 4) and rank 3 joining -----------
def extension(proc, port, events):
    (extend,) = events
    world, joiner = 4, 3
    if proc < joiner:
        group = init(proc, 3, port, max_group_size=world)
        # max_group_size only reserves: the visible size is the active one.
        assert dist.get_world_size() == 3
        assert summed(proc + 1) == 6
        gather_scatter(3, proc)
        assert pg.get_active_ranks(group).tolist() == [1, 1, 1, 0]
        assert not pg.get_peer_state(group, [joiner])[0]
        epoch = pg.get_current_epoch(group)
        if proc == 0:
            extend.set()
        recover(group, [joiner])
        assert dist.get_world_size() == world
        assert pg.get_current_epoch(group) > epoch
        assert pg.get_active_ranks(group).tolist() == [1, 1, 1, 1]
        # Asking again for an active rank, or for one out of range, is refused.
        resp = pg.recover_ranks(group, [joiner])
        assert resp.status == pg.ProposalStatus.Rejected and "active already" in resp.reject_reason, resp
        resp = pg.activate_ranks(group, [world])
        assert resp.status == pg.ProposalStatus.Rejected and "out of valid range" in resp.reject_reason, resp
    else:
        assert extend.wait(60)
        group = init(joiner, world, port, is_extension=True)
        # Before join_group it runs alone, with the size it declared.
        assert dist.get_world_size() == world
        assert summed(joiner + 1) == joiner + 1
        assert pg.get_active_ranks(group).tolist() == [0, 0, 0, 1]
        pg.join_group(group)
        assert dist.get_world_size() == world
    assert summed(proc + 1) == 10
    gather_scatter(world, proc)
    dist.barrier()
    # P2P both ways between the joiner and a primary.
    if proc in (2, joiner):
        ping_pong(proc, 5 - proc)
    dist.barrier()


# -- a killed rank replaced by a new process ----------------------------------
def replacement(proc, port, events, *, auto=True, graceful=False):
    gone, start = events
    world = 3
    rank = proc if proc < world else BROKEN
    if proc < world:
        group = init(rank, world, port, auto=auto)
        assert summed(rank + 1) == 6
        if rank == BROKEN:
            if graceful:
                resp = pg.deactivate_ranks(group, [rank])
                assert resp.status == pg.ProposalStatus.Applied, resp
                dist.destroy_process_group()
                return
            os._exit(0)
        assert gone.wait(60)
        if not auto:
            t = torch.tensor([rank + 1], dtype=torch.int32)
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            assert not pg.get_local_success(work) and t.item() == 4, t
            assert pg.sync_after_failure(group).status == pg.SyncAfterFailureStatus.Reconciled
            resp = pg.deactivate_ranks(group, [BROKEN])
            assert resp.status == pg.ProposalStatus.Applied, resp
        elif graceful:
            # The rank that left is out of the view without an operation.
            assert pg.get_active_ranks(group).tolist() == [1, 0, 1]
        gather_scatter(2, [0, 2].index(rank))
        assert summed(rank + 1) == 4
        assert not pg.get_peer_state(group, [BROKEN])[0]
        if rank == 0:
            start.set()
        recover(group, [BROKEN])
    else:
        assert start.wait(60)
        group = init(rank, world, port, is_extension=True, auto=auto)
        pg.join_group(group)
    assert dist.get_world_size() == world
    assert summed(rank + 1) == 6
    gather_scatter(world, rank)
    # The replacement's mailboxes start clean both ways.
    if rank in (0, BROKEN):
        ping_pong(rank, 1 - rank)
    dist.barrier()


def replacement_manual(proc, port, events):
    replacement(proc, port, events, auto=False)


def replacement_graceful(proc, port, events):
    replacement(proc, port, events, graceful=True)


# -- several groups grown at once ----------------------------------------------
def subgroups(proc, port, events):
    """WORLD and group_c grow from [0, 1] to [0..3]; group_a [0] takes 2,
    group_b [1] takes 3 (the reference's split-ranks layout)."""
    (extend,) = events
    O = pg.MooncakeBackendOptions  # noqa: E741,N806
    if proc < 2:
        world = init(proc, 2, port, max_group_size=4)
        ga = dist.new_group([0], backend="mooncake-cpu", pg_options=O(2))
        gb = dist.new_group([1], backend="mooncake-cpu", pg_options=O(2))
        gc = dist.new_group([0, 1], backend="mooncake-cpu", pg_options=O(4))
        assert summed(proc + 1) == 3 and summed(proc + 1, gc) == 3
        if proc == 0:
            extend.set()
        recover(world, [2, 3])
        recover(ga if proc == 0 else gb, [1])
        recover(gc, [2, 3])
    else:
        assert extend.wait(60)
        world = init(proc, 4, port, is_extension=True)
        ga = dist.new_group([0, 2], backend="mooncake-cpu", pg_options=O(2, True))
        gb = dist.new_group([1, 3], backend="mooncake-cpu", pg_options=O(2, True))
        gc = dist.new_group([0, 1, 2, 3], backend="mooncake-cpu", pg_options=O(4, True))
        assert summed(proc + 1) == proc + 1
        pg.join_group(world)
        pg.join_group(ga if proc == 2 else gb)
        pg.join_group(gc)
    assert summed(proc + 1) == 10
    assert summed(proc + 1, ga if proc in (0, 2) else gb) == (4 if proc in (0, 2) else 6)
    assert summed(proc + 1, gc) == 10


# -- faults injected by the test-only hook (mooncake.pg._fault) --------------
def rejoin_op(rank, op, verify):
    """The reference's _run_rejoin_operation, on two ranks."""
    if op == "collective":
        t = torch.tensor([rank + 1], dtype=torch.int32)
        works = [dist.all_reduce(t, async_op=True)]
        for w in works:
            w.wait()
        if verify:
            assert pg.get_local_success(works[0]), "collective failed locally"
            assert t.item() == 3, t
        return works
    peer = 1 - rank
    send, recv = torch.tensor([rank], dtype=torch.int64), torch.empty(1, dtype=torch.int64)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)])
    for w in works:
        w.wait()
    if verify:
        assert all(pg.get_local_success(w) for w in works), f"P2P with rank {peer} failed locally"
        assert recv.item() == peer, recv
    return works


def inplace_rejoin(proc, port, events, op):
    """Rank 1's second transfer to rank 0 fails (the reference fails its
    link 1->0 for one round); it leaves, then rejoins in the same process."""
    (started,) = events
    os.environ[_fault.ENV] = f"fail:{BROKEN}>0@2"
    group = init(proc, 2, port)
    rejoin_op(proc, op, verify=True)
    epoch = pg.get_current_epoch(group)
    if proc != BROKEN:
        assert started.wait(30), "timed out waiting for fault injection"
        rejoin_op(proc, op, verify=False)
        wait_until(lambda: pg.get_current_epoch(group) > epoch, "the post-failure group view")
        wait_until(lambda: pg.get_peer_state(group, [BROKEN])[0], "the original rank to become activatable")
        resp = pg.activate_ranks(group, [BROKEN])
        assert resp.status == pg.ProposalStatus.Applied, resp
    else:
        started.set()
        works = rejoin_op(proc, op, verify=False)
        assert not all(pg.get_local_success(w) for w in works), f"injected {op} unexpectedly succeeded"
        assert _fault.injected_count() == 1, _fault.injected_count()
        active = pg.get_active_ranks(group).tolist()
        assert active == [1, 0], f"the failed rank should be inactive before {op} completes: {active}"
        pg.join_group(group)
    rejoin_op(proc, op, verify=True)
    assert pg.get_active_ranks(group).tolist() == [1, 1]
    assert summed(proc + 1) == 3


def inplace_rejoin_collective(proc, port, events):
    inplace_rejoin(proc, port, events, "collective")


def inplace_rejoin_p2p(proc, port, events):
    inplace_rejoin(proc, port, events, "p2p")


def stall(proc, port, events):
    """Rank 1's second transfer to rank 0 starts 3 s late: rank 0 waits
    for it, and the round completes."""
    os.environ[_fault.ENV] = "stall:1>0@2=3"
    init(proc, 2, port)
    assert summed(proc + 1) == 3
    t0 = time.monotonic()
    assert summed(proc + 1) == 3
    took = time.monotonic() - t0
    if proc == 0:
        assert took >= 1.5, took
    else:
        assert _fault.injected_count() == 1
    assert summed(proc + 1) == 3


def refuse(proc, port, events):
    """Rank 0 refuses the process joining as rank 1: it is never ready
    there, and activating it is refused."""
    published, done = events
    os.environ[_fault.ENV] = "refuse:0>1"
    if proc == 0:
        group = init(0, 1, port, max_group_size=2)
        assert published.wait(60)
        assert pg.get_peer_state(group, [1]) == [False]
        resp = pg.recover_ranks(group, [1])
        assert resp.status == pg.ProposalStatus.Rejected and "not ready" in resp.reject_reason, resp
        assert _fault.injected_count() >= 1
        assert pg.get_active_ranks(group).tolist() == [1, 0]
        assert summed(1) == 1
        done.set()
    else:
        init(1, 2, port, is_extension=True)
        published.set()
        assert done.wait(60)
        assert summed(2) == 2


def _exit_once_stalled():
    """Ends this process, without a goodbye, once the hook stalls one of
    its transfers (it sleeps there: a death mid-operation, at a known
    round)."""
    while _fault.injected_count() == 0:
        time.sleep(0.01)
    os._exit(0)


def _midround(proc, port):
    """Three ranks; rank 2 stalls before its part of the 4th round of the
    next 8-round operation (its 5th transfer to rank 0: one small
    all_reduce, then rounds 1-3) and dies there."""
    os.environ[_fault.ENV] = "stall:2>0@5=60"
    init(proc, 3, port)
    assert summed(proc + 1) == 6
    per = _mooncake.pg.block_elems(int(os.environ["MOONCAKE_PG_SLOT_BYTES"]), 4, 1)
    if proc == 2:
        threading.Thread(target=_exit_once_stalled, daemon=True).start()
    return per, 8 * per


def _failed_on_rank_2(work):
    assert not pg.get_local_success(work), "the operation met a death"
    assert pg.get_failed_ranks_hint(work).tolist() == [0, 0, 1], pg.get_failed_ranks_hint(work)


def midround_all_reduce(proc, port, events):
    """A rank dies mid-way through a large all_reduce: the rounds before
    sum the three ranks, the round it died in and the next ones the two
    survivors (they finish its part of that round: none keeps a
    survivor's own input), and the operation reports it."""
    per, n = _midround(proc, port)
    t = torch.full((n,), float(proc + 1))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    _failed_on_rank_2(work)
    want = torch.full((n,), 3.0)
    want[: 3 * per] = 6.0
    if not torch.equal(t, want):
        bad = (t != want).nonzero()[0].item()
        raise AssertionError(f"element {bad} (round {bad // per + 1}) is {t[bad].item()}, not {want[bad].item()}")
    t = torch.full((n,), float(proc + 1))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert pg.get_local_success(work) and bool((t == 3).all()), t


def midround_broadcast(proc, port, events):
    """A broadcast's root dies mid-way (over TCP): a receiver's tensor is
    left untouched, not partly written, and the operation reports it."""
    per, n = _midround(proc, port)
    t = torch.full((n,), float(proc + 1))
    work = dist.broadcast(t, src=2, async_op=True)
    work.wait()
    _failed_on_rank_2(work)
    assert bool((t == proc + 1).all()), f"{int((t != proc + 1).sum())} elements written"
    assert summed(proc + 1) == 3


WORKERS = {name: fn for name, fn in globals().items() if callable(fn) and name in (
    "extension", "replacement", "replacement_manual", "replacement_graceful", "subgroups",
    "inplace_rejoin_collective", "inplace_rejoin_p2p", "stall", "refuse", "midround_all_reduce",
    "midround_broadcast")}


def proc_main(name, proc, port, events, results):
    os.environ.setdefault("MOONCAKE_PG_SLOT_BYTES", str(64 << 10))
    os.environ.setdefault("MOONCAKE_PG_MAILBOX_BYTES", str(1 << 20))
    torch.set_num_threads(1)
    try:
        WORKERS[name](proc, port, events)
        results.put((proc, "ok"))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((proc, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
