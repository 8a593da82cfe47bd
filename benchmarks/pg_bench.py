"""mooncake-cpu against torch's gloo on one host, interleaved.

    python benchmarks/pg_bench.py [--worlds 2,4] [--sizes 4K,64K,1M,16M,64M] [--ops all_reduce,...]

Every rank joins one gloo group and one mooncake-cpu group over the same
ranks; each (operation, size) is timed on both in alternation, so both see
the same machine load. Prints a Markdown table: the median time of one
operation on rank 0 and its bandwidth (tensor bytes / time; send/recv is a
one-way message, half of a ping-pong), then the CPU a rank burns while
blocked for a while in a receive, and while idle between operations.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

OPS = ["all_reduce", "all_gather_into_tensor", "broadcast", "all_to_all_single", "send_recv"]
BACKENDS = ["gloo", "mooncake-cpu"]
IDLE_S = 2.0


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def label(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def run_op(op: str, group, rank: int, world: int, t: torch.Tensor, out: torch.Tensor) -> None:
    if op == "all_reduce":
        dist.all_reduce(t, group=group)
    elif op == "all_gather_into_tensor":
        dist.all_gather_into_tensor(out, t, group=group)
    elif op == "broadcast":
        dist.broadcast(t, group_src=0, group=group)
    elif op == "all_to_all_single":
        dist.all_to_all_single(out[: t.numel()], t, group=group)
    elif op == "send_recv":
        if rank == 0:
            dist.send(t, group_dst=1, group=group)
            dist.recv(t, group_src=1, group=group)
        elif rank == 1:
            dist.recv(t, group_src=0, group=group)
            dist.send(t, group_dst=0, group=group)


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def idle_cpu(group, rank: int) -> tuple[float, float]:
    """CPU seconds per wall second of rank 1: blocked in a receive that
    rank 0 satisfies after IDLE_S, then idle (no operation) for IDLE_S."""
    t = torch.zeros(1)
    dist.barrier(group=group)
    blocked = idle = 0.0
    if rank == 0:
        time.sleep(IDLE_S)
        dist.send(t, group_dst=1, group=group)
    elif rank == 1:
        c0, w0 = cpu_s(), time.monotonic()
        dist.recv(t, group_src=0, group=group)
        blocked = (cpu_s() - c0) / (time.monotonic() - w0)
        c0, w0 = cpu_s(), time.monotonic()
        time.sleep(IDLE_S)
        idle = (cpu_s() - c0) / (time.monotonic() - w0)
    dist.barrier(group=group)
    return blocked, idle


def rank_main(rank: int, world: int, port: int, sizes: list[int], ops: list[str], results) -> None:
    from mooncake import pg  # noqa: F401 - registers mooncake-cpu

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    groups = {"gloo": dist.group.WORLD, "mooncake-cpu": dist.new_group(backend="mooncake-cpu")}
    rows = []
    for op in ops:
        for size in sizes:
            n = size // 4
            t = torch.ones(n)
            out = torch.empty(n * world)
            iters = max(3, min(30, (256 << 20) // (size * world)))
            times = {b: [] for b in BACKENDS}
            for b in BACKENDS:  # warm-up
                run_op(op, groups[b], rank, world, t, out)
            for _ in range(iters):
                for b in BACKENDS:
                    dist.barrier(group=groups[b])
                    start = time.perf_counter()
                    run_op(op, groups[b], rank, world, t, out)
                    times[b].append(time.perf_counter() - start)
            if rank == 0:
                for b in BACKENDS:
                    sec = statistics.median(times[b]) / (2 if op == "send_recv" else 1)
                    rows.append((op, size, b, sec))
    idle = {b: idle_cpu(groups[b], rank) for b in BACKENDS}
    if rank == 1:
        results.put(("idle", idle))
    if rank == 0:
        results.put(("rows", rows))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    ap.add_argument("--ops", default=",".join(OPS), help=f"a subset of {','.join(OPS)}")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    ops = args.ops.split(",")
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        ap.error(f"unknown operations {unknown}: choose from {','.join(OPS)}")
    ctx = mp.get_context("spawn")
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start", file=sys.stderr)
    print("| world | operation | size | gloo ms | gloo GB/s | mooncake-cpu ms | mooncake-cpu GB/s | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    idle_lines = []
    for world in [int(w) for w in args.worlds.split(",")]:
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
        results = ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(r, world, store.port, sizes, ops, results)) for r in range(world)]
        for p in procs:
            p.start()
        got = dict(results.get(timeout=3600) for _ in range(2))
        for p in procs:
            p.join()
        by = {}
        for op, size, b, sec in got["rows"]:
            by[(op, size, b)] = sec
        for op in ops:
            for size in sizes:
                g, m = by[(op, size, "gloo")], by[(op, size, "mooncake-cpu")]
                print(
                    f"| {world} | {op} | {label(size)} | {g * 1e3:.3f} | {size / g / 1e9:.2f} "
                    f"| {m * 1e3:.3f} | {size / m / 1e9:.2f} | {g / m:.2f}x |"
                )
        for b, (blocked, idle) in got["idle"].items():
            idle_lines.append(
                f"| {world} | {b} | {blocked * 100:.1f}% | {idle * 100:.1f}% |"
            )
    print()
    print("| world | backend | CPU of a rank blocked in recv | CPU of an idle rank |")
    print("|---|---|---|---|")
    print("\n".join(idle_lines))


if __name__ == "__main__":
    main()
