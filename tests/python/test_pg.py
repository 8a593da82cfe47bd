"""The mooncake-cpu torch.distributed backend (mooncake.pg) with real
torch, ranks spawned as processes (world sizes 1, 2 and 4); the cases
themselves are in pg_cases.py."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time
from datetime import timedelta

import pytest

if os.environ.get("MOONCAKE_TEST_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import pg_cases  # noqa: E402

# Generous: four ranks importing torch on a loaded two-core machine.
SPAWN_TIMEOUT_S = 300


def run_ranks(world: int, *cases: str, dead: tuple[int, ...] = ()) -> None:
    """Runs `cases` on `world` spawned ranks; every rank but `dead` must
    report success, and none may hang."""
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=SPAWN_TIMEOUT_S))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=pg_cases.rank_main, args=(r, world, store.port, list(cases), results))
             for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, str] = {}
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    try:
        while len(got) < world - len(dead):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"ranks {sorted(set(range(world)) - set(got))} hung in {cases}")
            try:
                rank, outcome = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if all(not p.is_alive() for p in procs):
                    break
                continue
            got[rank] = outcome
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    for r in range(world):
        if r in dead:
            continue
        assert got.get(r) == "ok", f"rank {r} of {world}: {got.get(r, 'no result (crashed?)')}"
    # Segment files are named after their rank's pid; none may be left.
    pids = {str(p.pid) for p in procs}
    leftovers = [f for f in os.listdir("/dev/shm") if f.startswith("mooncake-pg-") and f.split("-")[2] in pids]
    assert not leftovers, leftovers


# One spawn per world size runs every case (starting torch in four ranks is
# most of the time a case takes on a loaded machine).
ALL_CASES = ("all_reduce", "broadcast_gather", "reduce_scatter_barrier", "send_recv",
             "all_to_all", "rooted", "batch_p2p", "batch_many", "batch_together", "reinit")


@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_operation_every_dtype(world):
    run_ranks(world, *ALL_CASES)


def test_a_killed_rank_fails_the_survivors_operations_without_a_hang():
    run_ranks(4, "failed_rank", dead=(3,))


def test_point_to_point_with_a_killed_rank_fails_only_towards_it():
    run_ranks(4, "p2p_fault", dead=(1,))


def test_manual_deactivation_of_a_dead_rank():
    run_ranks(3, "manual_evict", dead=(1,))


def test_import_without_torch_names_torch():
    code = "import sys; sys.modules['torch'] = None\nfrom mooncake import pg"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "torch" in r.stderr.split("ImportError", 1)[1]


def test_backend_is_registered_for_cpu():
    from mooncake import pg

    assert "MOONCAKE-CPU" in dist.Backend._plugins
    assert dist.Backend._plugins["MOONCAKE-CPU"].extended_api
    opts = pg.MooncakeBackendOptions(8, True, False, True)
    assert (opts.max_group_size, opts.is_extension, opts.auto_deactivate_on_failure) == (8, True, False)
    with pytest.raises(ValueError):
        pg.MooncakeBackendOptions(-1)
    check = pg._backend._check_options
    check(pg.MooncakeBackendOptions(4), 4)
    check(pg.MooncakeBackendOptions(4, False, False, False), 4)
    check(pg.MooncakeBackendOptions(8), 4)
    check(pg.MooncakeBackendOptions(4, True), 4)
    # What cannot make sense is refused, not ignored.
    for bad in (pg.MooncakeBackendOptions(2), pg.MooncakeBackendOptions(4, False, False, True)):
        with pytest.raises(ValueError):
            check(bad, 4)
    # No network device to choose: only "no filter" is honoured.
    pg.set_device_filter([])
    with pytest.raises(ValueError, match="no network device"):
        pg.set_device_filter(["mlx5_0"])
    assert {s.name for s in pg.ProposalStatus} == {"Applied", "AppliedWithDroppedRanks", "Rejected"}
    assert {"Reconciled", "NoPending"} <= {s.name for s in pg.SyncAfterFailureStatus}


@pytest.mark.parametrize("world", [2, 4])
def test_every_operation_over_tcp(world, monkeypatch):
    """The same cases with the segments' traffic over the TCP mesh (as for
    ranks on different hosts), on loopback."""
    monkeypatch.setenv("MOONCAKE_PG_TRANSPORT", "tcp")
    monkeypatch.setenv("MOONCAKE_PG_HOST", "127.0.0.1")
    run_ranks(world, "transport", "tcp_growable", *ALL_CASES)


@pytest.mark.parametrize("case,world,dead", [("failed_rank", 4, (3,)), ("p2p_fault", 4, (1,)),
                                             ("manual_evict", 3, (1,)), ("large_failed", 3, (2,))])
def test_a_killed_rank_over_tcp(case, world, dead, monkeypatch):
    """A peer's connection ending is its death: the survivors' operations
    fail as over shared memory, without a hang."""
    monkeypatch.setenv("MOONCAKE_PG_TRANSPORT", "tcp")
    monkeypatch.setenv("MOONCAKE_PG_HOST", "127.0.0.1")
    run_ranks(world, "transport", case, dead=dead)


def test_ranks_on_other_hosts_choose_tcp(monkeypatch):
    """Without MOONCAKE_PG_TRANSPORT, ranks all on this host share memory;
    one elsewhere (another host name or boot) makes the group use TCP; a
    bad value is refused with its text."""
    from mooncake.pg import _tcp

    def key(r):
        return f"host/{r}"

    monkeypatch.delenv("MOONCAKE_PG_TRANSPORT", raising=False)
    store = dist.HashStore()
    store.set(key(1), _tcp.host_identity())
    assert _tcp.transport(store, key, 0, 2) == "shm"
    store = dist.HashStore()
    store.set(key(1), "elsewhere " + _tcp.host_identity().split(" ", 1)[1])
    assert _tcp.transport(store, key, 0, 2) == "tcp"
    monkeypatch.setenv("MOONCAKE_PG_TRANSPORT", "tcp")
    assert _tcp.transport(dist.HashStore(), key, 0, 2) == "tcp"
    monkeypatch.setenv("MOONCAKE_PG_TRANSPORT", "rdma")
    with pytest.raises(ValueError, match="rdma"):
        _tcp.transport(dist.HashStore(), key, 0, 2)
