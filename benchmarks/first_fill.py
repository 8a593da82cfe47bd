"""First fill of a fresh store, over the public `mooncake.store` API only.

A cache's first fill after start-up writes pages of the segment (and the
staging pool) that nothing touched yet. This sets up a fresh store with a
`--segment-size` segment, then right away (or after `--delay` seconds) puts
`--count` values of `--size` bytes (`put` and `put_from`), reads them back
(`get`, `get_into`, verified), removes them and does the same on the now
warm pages. The ceiling, measured in the same run, is a memcpy of the same
size into successive slots of a warm region as large as a phase's fill
(a put's destination is not in cache either). Runs unchanged on the reference package.

    python first_fill.py --master 127.0.0.1:50051 --metadata http://127.0.0.1:8080/metadata
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import sys
import time

MiB = 1 << 20


def minor_faults() -> int:
    """Page faults of this process so far that needed no I/O (fresh or
    reclaimed pages of the heap, of a segment, of a caller's buffer)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def gbps(nbytes: int, ns: int) -> float:
    return round(nbytes / ns, 3) if ns else 0.0


def memcpy_gbps(size: int, slots: int, reps: int = 200) -> tuple[float, float]:
    """(into a cold slot, between hot buffers) in GB/s.

    A put writes each value to a new place in a segment far larger than the
    cache, so the ceiling is a memcpy of `size` bytes into successive slots
    of a warm region as large as the fill (`slots` values). The copy
    between two buffers that stay in cache is reported next to it."""
    src = ctypes.create_string_buffer(os.urandom(size), size)
    region = ctypes.create_string_buffer(size * slots)
    base = ctypes.addressof(region)
    for i in range(slots):
        ctypes.memmove(base + i * size, src, size)
    t0 = time.perf_counter_ns()
    for i in range(reps):
        ctypes.memmove(base + (i % slots) * size, src, size)
    cold = gbps(size * reps, time.perf_counter_ns() - t0)
    t0 = time.perf_counter_ns()
    for _ in range(reps):
        ctypes.memmove(base, src, size)
    hot = gbps(size * reps, time.perf_counter_ns() - t0)
    del region
    return cold, hot


def fresh_memcpy_gbps(size: int, slots: int) -> float:
    """GB/s of copying `size` bytes once into each of `slots` slots of a new
    shared mapping: the first touch of every page, as in a segment that
    nothing has touched yet (the ceiling of a fill that starts at once)."""
    import mmap

    src = ctypes.create_string_buffer(os.urandom(size), size)
    region = mmap.mmap(-1, size * slots)
    view = (ctypes.c_char * (size * slots)).from_buffer(region)
    base = ctypes.addressof(view)
    t0 = time.perf_counter_ns()
    for i in range(slots):
        ctypes.memmove(base + i * size, src, size)
    out = gbps(size * slots, time.perf_counter_ns() - t0)
    del view
    region.close()
    return out


def run(args) -> dict:
    from mooncake.store import MooncakeDistributedStore

    value = os.urandom(args.size)
    buf = ctypes.create_string_buffer(args.size)
    addr = ctypes.addressof(buf)
    ctypes.memmove(buf, value, args.size)
    slots = max(args.count // 2, 1)
    cold, hot = memcpy_gbps(args.size, slots)
    out = {"size": args.size, "count": args.count, "segment_size": args.segment_size,
           "memcpy_gb_s": cold, "memcpy_hot_gb_s": hot,
           "memcpy_fresh_gb_s": fresh_memcpy_gbps(args.size, slots)}
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", args.metadata, args.segment_size, args.local_buffer, "tcp", "",
                     args.master)
    if rc != 0:
        raise SystemExit(f"setup failed: {rc}")
    if args.delay:
        time.sleep(args.delay)
    assert store.register_buffer(addr, args.size) == 0
    for phase in ("first", "warm"):
        keys = [f"ff/{os.getpid()}/{phase}/{i}" for i in range(args.count)]
        half = args.count // 2
        f0 = minor_faults()
        t0 = time.perf_counter_ns()
        for k in keys[:half]:
            assert store.put(k, value) == 0
        t1 = time.perf_counter_ns()
        f1 = minor_faults()
        for k in keys[half:]:
            assert store.put_from(k, addr, args.size) == 0
        t2 = time.perf_counter_ns()
        f2 = minor_faults()
        # Each get is timed on its own: the check of its bytes (a 1 MiB
        # compare, a third of a get's time) stays out of the rate.
        get_ns = 0
        for k in keys[:half]:
            g0 = time.perf_counter_ns()
            got = store.get(k)
            get_ns += time.perf_counter_ns() - g0
            assert got == value
            del got
        t3 = time.perf_counter_ns()
        f3 = minor_faults()
        for k in keys[half:]:
            assert store.get_into(k, addr, args.size) == args.size
        t4 = time.perf_counter_ns()
        f4 = minor_faults()
        assert ctypes.string_at(addr, args.size) == value
        n = half * args.size
        out[phase] = {"put": gbps(n, t1 - t0), "put_from": gbps(n, t2 - t1),
                      "get": gbps(n, get_ns), "get_into": gbps(n, t4 - t3)}
        # Minor page faults of this process per op (its heap, its own
        # segment in this local topology, the get_into buffer).
        out[f"{phase}_faults"] = {"put": f1 - f0, "put_from": f2 - f1, "get": f3 - f2, "get_into": f4 - f3}
        print(f"{phase:<6} " + " ".join(f"{k}={v:.2f} GB/s" for k, v in out[phase].items()),
              file=sys.stderr, flush=True)
        # Only this run's keys, forced: `remove_all(True)` is an admin call on
        # our master, and the warm phase must reuse the first phase's pages.
        n = store.remove_by_regex(f"^ff/{os.getpid()}/{phase}/", True)
        if n != args.count:
            raise SystemExit(f"cleanup removed {n} of {args.count}")
    store.close()
    print(f"memcpy {out['memcpy_gb_s']:.2f} GB/s into a cold slot, {out['memcpy_hot_gb_s']:.2f} GB/s hot, "
          f"{out['memcpy_fresh_gb_s']:.2f} GB/s into fresh pages", file=sys.stderr)
    return out


def draw(out: dict, path) -> object:
    """GB/s of each op, first fill against warm, with the memcpy ceiling in the title."""
    import chart

    ops = ["put", "put_from", "get", "get_into"]
    series = {phase: [out[phase].get(op) for op in ops] for phase in ("first", "warm") if phase in out}
    size = f"{out['size'] >> 20} MiB" if out["size"] % MiB == 0 else f"{out['size']} B"
    title = (f"{out['count']} x {size} after setup (delay {out.get('delay', 0):g} s); "
             f"memcpy {out['memcpy_gb_s']:.2f} GB/s")
    return chart.write(path, [chart.grouped_bars(title, "GB/s", ops, series)])


OPS = ("put", "put_from", "get", "get_into")


def run_system(system, workdir, delays=(0.0, 3.0), extra: list[str] | None = None) -> list[dict]:
    """This benchmark for one system of `compare.py` (an `mcproc.System`),
    once per delay, each on a fresh master and store."""
    import subprocess

    import mcproc

    out = []
    for delay in delays:
        wd = workdir / f"delay{delay:g}"
        master = mcproc.start_master(system, wd / "master")
        try:
            js = wd / "first_fill.json"
            argv = [system.python, os.path.abspath(__file__), "--master", master.address,
                    "--metadata", master.metadata_server, "--delay", str(delay), "--json", str(js)] + (extra or [])
            with open(wd / "first_fill.log", "wb") as errf:
                cp = subprocess.run(argv, env=system.env(), stdout=subprocess.DEVNULL, stderr=errf, timeout=600)
            if cp.returncode != 0:
                raise RuntimeError(f"first_fill failed ({cp.returncode}): "
                                   + (wd / "first_fill.log").read_text(errors="replace")[-800:])
            r = json.loads(js.read_text())
            r["delay"] = delay
            out.append(r)
        finally:
            master.stop()
    return out


def section(results: dict, names: list[str]) -> list[str]:
    """The first-fill table and its targets for `compare.py`'s report: every
    op of the first fill >= 60% of the memcpy into a cold slot and >= 1.5x
    the baseline (the first system), per delay."""
    rows = [(n, r) for n in names for r in results["systems"][n].get("first_fill", [])]
    if not rows:
        return []
    r0 = rows[0][1]
    lines = [f"\n### First fill (`first_fill.py`, {r0['count']} x {r0['size'] >> 20} MiB into a fresh "
             f"{r0['segment_size'] >> 20} MiB segment, then again on warm pages)\n",
             "| system | delay s | phase | " + " | ".join(OPS) + " | memcpy cold | memcpy hot | fresh pages |",
             "|---" * (6 + len(OPS)) + "|"]
    for n, r in rows:
        for phase in ("first", "warm"):
            vals = " | ".join(f"{r[phase][op]:.2f}" for op in OPS)
            lines.append(f"| {n} | {r['delay']:g} | {phase} | {vals} | {r['memcpy_gb_s']:.2f} | "
                         f"{r['memcpy_hot_gb_s']:.2f} | {r.get('memcpy_fresh_gb_s', 0):.2f} |")
    base, ours = names[0], names[-1]
    by = {(n, r["delay"]): r for n, r in rows}
    lines += ["\n(GB/s.) Targets, first phase:\n", "| delay s | worst op | of memcpy cold | met | "
              f"{ours}/{base} worst | met |", "|---|---|---|---|---|---|"]
    for (n, delay), r in sorted(by.items(), key=lambda kv: kv[0][1]):
        if n != ours:
            continue
        op = min(OPS, key=lambda o: r["first"][o])
        share = r["first"][op] / r["memcpy_gb_s"] if r["memcpy_gb_s"] else 0
        b = by.get((base, delay)) if base != ours else None
        if b:
            rop = min(OPS, key=lambda o: r["first"][o] / max(b["first"][o], 1e-9))
            rr = r["first"][rop] / max(b["first"][rop], 1e-9)
            rel = f"{rop} {rr:.2f} | {'yes' if rr >= 1.5 else '**no**'}"
        else:
            rel = "n/a | n/a"
        lines.append(f"| {delay:g} | {op} {r['first'][op]:.2f} | {share:.0%} | "
                     f"{'yes' if share >= 0.6 else '**no**'} | {rel} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", required=True)
    ap.add_argument("--metadata", required=True)
    ap.add_argument("--segment-size", type=int, default=1024 * MiB)
    ap.add_argument("--local-buffer", type=int, default=64 * MiB)
    ap.add_argument("--size", type=int, default=MiB)
    ap.add_argument("--count", type=int, default=512, help="values per phase (half put, half put_from)")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds between setup and the first put")
    ap.add_argument("--json")
    ap.add_argument("--chart", help="draw the GB/s here as SVG (default: next to --json)")
    args = ap.parse_args()
    out = run(args)
    out["delay"] = args.delay
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    else:
        print(json.dumps(out))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import chart

    path = chart.path_for(args.chart, args.json)
    if path:
        print(f"chart: {draw(out, path)}", file=sys.stderr)


if __name__ == "__main__":
    main()
