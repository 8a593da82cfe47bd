"""Growing a mooncake-cpu group, with real torch and processes: extension
ranks joining, a killed or departed rank replaced by a new process, groups
grown together (the reference's elastic recovery and extension cases; the
workers are in pg_elastic_cases.py)."""

from __future__ import annotations

import os
import queue
import time
from datetime import timedelta

import pytest

if os.environ.get("MOONCAKE_TEST_REQUIRE_TORCH") == "1":
    import torch  # noqa: F401
else:
    pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import pg_elastic_cases  # noqa: E402

# Generous: five processes importing torch on a loaded two-core machine.
TIMEOUT_S = 300


def run(name: str, procs: int, events: int = 1, exits: tuple[int, ...] = (), silent: tuple[int, ...] = ()):
    """Runs worker `name` in `procs` processes; each must report success
    but the `silent` ones (killed on purpose). Event 0 is set once every
    process of `exits` has exited (the reference's process_exit_events)."""
    store = dist.TCPStore("127.0.0.1", 0, procs, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=TIMEOUT_S))
    ctx = mp.get_context("spawn")
    evs = [ctx.Event() for _ in range(events)]
    results = ctx.Queue()
    ps = [ctx.Process(target=pg_elastic_cases.proc_main, args=(name, i, store.port, evs, results))
          for i in range(procs)]
    for p in ps:
        p.start()
    got: dict[int, str] = {}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(got) < procs - len(silent):
            if exits and all(not ps[i].is_alive() for i in exits):
                evs[0].set()
            if time.monotonic() > deadline:
                raise AssertionError(f"processes {sorted(set(range(procs)) - set(got))} hung in {name}: {got}")
            try:
                proc, outcome = results.get(timeout=0.2)
            except queue.Empty:
                if all(not p.is_alive() for p in ps):
                    break
                continue
            got[proc] = outcome
    finally:
        for p in ps:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    for i in range(procs):
        if i not in silent:
            assert got.get(i) == "ok", f"process {i}: {got.get(i, 'no result (crashed?)')}"
    pids = {str(p.pid) for p in ps}
    leftovers = [f for f in os.listdir("/dev/shm") if f.startswith("mooncake-pg-") and f.split("-")[2] in pids]
    assert not leftovers, leftovers


@pytest.fixture(params=["shm", "tcp"])
def transport(request, monkeypatch):
    """Each case over shared memory and over the TCP mesh (on loopback, as
    for ranks on different hosts); the spawned processes inherit it."""
    monkeypatch.setenv("MOONCAKE_PG_TRANSPORT", request.param)
    if request.param == "tcp":
        monkeypatch.setenv("MOONCAKE_PG_HOST", "127.0.0.1")
    return request.param


def test_an_extension_rank_runs_alone_then_joins_the_group(transport):
    run("extension", 4)


def test_a_killed_rank_is_replaced_by_a_new_process(transport):
    run("replacement", 4, events=2, exits=(1,), silent=(1,))


def test_a_replacement_after_manual_deactivation(transport):
    run("replacement_manual", 4, events=2, exits=(1,), silent=(1,))


def test_a_rank_that_deactivated_itself_is_replaced(transport):
    run("replacement_graceful", 4, events=2, exits=(1,))


def test_several_groups_grow_together(transport):
    run("subgroups", 4)


# Faults injected by the test-only hook (MOONCAKE_PG_TEST_FAULT), the
# reference's LD_PRELOAD transfer-fault scenarios.
def test_inplace_rejoin_collective(transport):
    run("inplace_rejoin_collective", 2)


def test_inplace_rejoin_p2p(transport):
    run("inplace_rejoin_p2p", 2)


def test_a_stalled_transfer_delays_its_round(transport):
    run("stall", 2)


def test_a_refused_peer_cannot_be_activated(transport):
    run("refuse", 2, events=2)


def test_a_rank_dying_mid_all_reduce_leaves_the_survivors_the_live_sum(transport):
    run("midround_all_reduce", 3, silent=(2,))


@pytest.mark.parametrize("transport", ["tcp"], indirect=True)
def test_a_root_dying_mid_broadcast_leaves_the_tensor_untouched(transport):
    run("midround_broadcast", 3, silent=(2,))
