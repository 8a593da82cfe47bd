"""First fill of a fresh store, over the public `mooncake.store` API only.

A cache's first fill after start-up writes pages of the segment (and the
staging pool) that nothing touched yet. This sets up a fresh store with a
`--segment-size` segment, then right away (or after `--delay` seconds) puts
`--count` values of `--size` bytes (`put` and `put_from`), reads them back
(`get`, `get_into`, verified), removes them and does the same on the now
warm pages. A memcpy of the same size between warm buffers, measured in the
same run, is the ceiling. Runs unchanged on the reference package.

    python first_fill.py --master 127.0.0.1:50051 --metadata http://127.0.0.1:8080/metadata
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

MiB = 1 << 20


def gbps(nbytes: int, ns: int) -> float:
    return round(nbytes / ns, 3) if ns else 0.0


def memcpy_gbps(size: int, reps: int = 200) -> float:
    src = ctypes.create_string_buffer(os.urandom(size), size)
    dst = ctypes.create_string_buffer(size)
    ctypes.memmove(dst, src, size)
    t0 = time.perf_counter_ns()
    for _ in range(reps):
        ctypes.memmove(dst, src, size)
    return gbps(size * reps, time.perf_counter_ns() - t0)


def run(args) -> dict:
    from mooncake.store import MooncakeDistributedStore

    value = os.urandom(args.size)
    buf = ctypes.create_string_buffer(args.size)
    addr = ctypes.addressof(buf)
    ctypes.memmove(buf, value, args.size)
    out = {"size": args.size, "count": args.count, "segment_size": args.segment_size,
           "memcpy_gb_s": memcpy_gbps(args.size)}
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
        t0 = time.perf_counter_ns()
        for k in keys[:half]:
            assert store.put(k, value) == 0
        t1 = time.perf_counter_ns()
        for k in keys[half:]:
            assert store.put_from(k, addr, args.size) == 0
        t2 = time.perf_counter_ns()
        for k in keys[:half]:
            got = store.get(k)
            assert got == value
            del got
        t3 = time.perf_counter_ns()
        for k in keys[half:]:
            assert store.get_into(k, addr, args.size) == args.size
        t4 = time.perf_counter_ns()
        assert ctypes.string_at(addr, args.size) == value
        n = half * args.size
        out[phase] = {"put": gbps(n, t1 - t0), "put_from": gbps(n, t2 - t1),
                      "get": gbps(n, t3 - t2), "get_into": gbps(n, t4 - t3)}
        print(f"{phase:<6} " + " ".join(f"{k}={v:.2f} GB/s" for k, v in out[phase].items()),
              file=sys.stderr, flush=True)
        # Only this run's keys, forced: `remove_all(True)` is an admin call on
        # our master, and the warm phase must reuse the first phase's pages.
        n = store.remove_by_regex(f"^ff/{os.getpid()}/{phase}/", True)
        if n != args.count:
            raise SystemExit(f"cleanup removed {n} of {args.count}")
    store.close()
    print(f"memcpy {out['memcpy_gb_s']:.2f} GB/s", file=sys.stderr)
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
