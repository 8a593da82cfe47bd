"""One Mooncake Store workload over the public `mooncake.store` API only.

It runs unchanged on the reference package and on ours: it imports
`mooncake.store` from whatever interpreter runs it, talks to a master that is
already running, and prints JSON. For every value size it measures

- `put` and `get` (p50/p99 latency, ops/s, GB/s), every `get` verified;
- `put_batch` / `get_batch` with `--batch` keys per call (default 16), verified;
- `put_from` / `get_into` on a buffer registered with `register_buffer`, verified.

Topology is the caller's business: `--topology local` mounts a segment in this
client (`global_segment_size=--segment-size`); `--topology remote` mounts none
(`global_segment_size=0`), so a storage process started by the caller must
hold the data. `--force-tcp` sets `MC_STORE_MEMCPY=0` and `MC_FORCE_TCP=1`
before the store is created, which makes the reference move bytes over TCP even
inside one process; our implementation honours the same variables.

Each phase is bounded by time (`--seconds`), by count (`--max-iters`) and by
the bytes it may leave in the store (`--budget-fraction` of the segment), and
removes its keys (untimed) before the next phase. Timing covers only the store
call; verification happens outside the timed region, right after each call
(values are dropped, not kept). Before the first phase one untimed pass writes
and removes a phase's budget of the largest size, so that pages are warm
(`--no-touch` skips it).

    python store_bench.py --master 127.0.0.1:50051 --metadata http://127.0.0.1:8080/metadata \\
        --topology local --json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import platform
import statistics
import sys
import time
from pathlib import Path

KiB = 1 << 10
MiB = 1 << 20
DEFAULT_SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 4 * MiB]
STRIDE = 64  # distinct value per key: key i reads the pattern at offset (i * STRIDE) % WINDOW
WINDOW = 64 * KiB


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", required=True, help="master RPC address host:port")
    ap.add_argument("--metadata", required=True, help="metadata server, e.g. http://127.0.0.1:8080/metadata")
    ap.add_argument("--topology", choices=["local", "remote"], default="local")
    ap.add_argument("--segment-size", type=int, default=1536 * MiB,
                    help="segment this client mounts in the local topology (bytes)")
    ap.add_argument("--store-capacity", type=int, default=0,
                    help="bytes the store can hold (remote: the storage process's segment); "
                         "default: --segment-size")
    ap.add_argument("--local-buffer", type=int, default=64 * MiB, help="local_buffer_size (bytes)")
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=2.0, help="time budget per phase")
    ap.add_argument("--max-iters", type=int, default=2000)
    ap.add_argument("--min-iters", type=int, default=8)
    ap.add_argument("--budget-fraction", type=float, default=0.4,
                    help="fraction of the store a phase may fill (stays below eviction watermarks)")
    ap.add_argument("--force-tcp", action="store_true")
    ap.add_argument("--no-touch", dest="touch", action="store_false",
                    help="skip the untimed pass that writes the phase budget once before measuring")
    ap.add_argument("--ops", default="put,get,put_batch,get_batch,put_from,get_into")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="write results here (default: stdout)")
    ap.add_argument("--chart", help="draw GB/s and p50 by op and size here as SVG (default: next to --json)")
    return ap.parse_args(argv)


def stats(lat_ns: list[int], bytes_per_call: int, items_per_call: int) -> dict:
    lat_ns = sorted(lat_ns)
    n = len(lat_ns)
    total_s = sum(lat_ns) / 1e9
    p99_idx = min(n - 1, max(0, int(round(0.99 * n)) - 1))
    return {
        "n": n,
        "p50_us": round(statistics.median(lat_ns) / 1e3, 2),
        "p99_us": round(lat_ns[p99_idx] / 1e3, 2),
        "mean_us": round(total_s / n * 1e6, 2),
        "ops_s": round(n * items_per_call / total_s, 1),
        "gb_s": round(n * bytes_per_call / total_s / 1e9, 4),
    }


class Bench:
    def __init__(self, args: argparse.Namespace):
        from mooncake.store import MooncakeDistributedStore

        self.args = args
        self.store = MooncakeDistributedStore()
        seg = args.segment_size if args.topology == "local" else 0
        rc = self.store.setup("127.0.0.1", args.metadata, seg, args.local_buffer, "tcp", "", args.master)
        if rc != 0:
            raise SystemExit(f"setup failed: {rc}")
        self.capacity = args.store_capacity or args.segment_size
        self.pattern = os.urandom(max(DEFAULT_SIZES + [int(s) for s in args.sizes.split(",")]) + WINDOW)
        self.pattern_mv = memoryview(self.pattern)
        self.results: list[dict] = []
        self.run_id = f"{os.getpid()}-{time.time_ns()}"

    def expected(self, i: int, size: int) -> memoryview:
        off = (i * STRIDE) % WINDOW
        return self.pattern_mv[off:off + size]

    def expected_bytes(self, i: int, size: int) -> bytes:
        """The same bytes as `expected`, as a `bytes` copy: comparing bytes
        with bytes is a memcmp (~0.1 ms per MiB), while comparing with a
        memoryview goes item by item (~3 ms per MiB), which would make every
        call follow milliseconds of busy verification."""
        off = (i * STRIDE) % WINDOW
        return self.pattern[off:off + size]

    def key(self, op: str, size: int, i: int) -> str:
        return f"bench/{self.run_id}/{op}/{size}/{i}"

    def iters(self, size: int, per_call: int) -> int:
        by_bytes = int(self.capacity * self.args.budget_fraction) // (size * per_call)
        return max(1, min(self.args.max_iters, by_bytes))

    def timed_loop(self, count: int, call, check=None) -> tuple[list[int], int]:
        """Run call(i) up to `count` times within the time budget; return latencies, calls made.

        `check(i, answer)` sees each answer outside the timed region, right
        away: values are verified and dropped as a user would, not kept
        alive (hundreds of MiB of results would make the timing measure the
        kernel handing out fresh pages rather than the store)."""
        lat: list[int] = []
        deadline = time.perf_counter() + self.args.seconds
        for i in range(count):
            t0 = time.perf_counter_ns()
            answer = call(i)
            lat.append(time.perf_counter_ns() - t0)
            if check is not None:
                check(i, answer)
            del answer
            if i + 1 >= self.args.min_iters and time.perf_counter() > deadline:
                break
        return lat, len(lat)

    def record(self, op: str, size: int, lat: list[int], per_call: int, errors: int, verify_errors: int) -> None:
        row = {"op": op, "size": size, "batch": per_call, **stats(lat, size * per_call, per_call),
               "errors": errors, "verify_errors": verify_errors}
        self.results.append(row)
        print(f"  {op:<10} {size:>8} B  n={row['n']:<5} p50={row['p50_us']:>9.1f}us p99={row['p99_us']:>9.1f}us "
              f"{row['ops_s']:>10.0f} ops/s {row['gb_s']:>7.3f} GB/s err={errors} bad={verify_errors}",
              file=sys.stderr, flush=True)

    def cleanup(self) -> None:
        # This run's keys only (digits, '-', '/': nothing to escape), forced
        # (a reader's lease would keep some):
        # `remove_all(True)` is an admin call on our master, and a cleanup
        # that silently left the store full would measure eviction instead.
        n = self.store.remove_by_regex(f"^bench/{self.run_id}/", True)
        if n < 0:
            raise SystemExit(f"cleanup: remove_by_regex returned {n}")

    def warmup(self, size: int) -> None:
        k = self.key("warm", size, 0)
        for _ in range(3):
            self.store.put(k, self.expected(0, size))
            self.store.get(k)
            self.store.remove(k, True)

    # ---- phases ------------------------------------------------------------
    def bytes_api(self, size: int, ops: set[str]) -> None:
        st = self.store
        errors = [0]
        count = self.iters(size, 1)

        def put(i: int) -> None:
            if st.put(self.key("kv", size, i), self.expected(i, size)) != 0:
                errors[0] += 1

        lat, done = self.timed_loop(count, put)
        if "put" in ops:
            self.record("put", size, lat, 1, errors[0], 0)
        if "get" in ops:
            miss, bad = [0], [0]

            def get(i: int):
                return st.get(self.key("kv", size, i % done))

            def check(i: int, v) -> None:
                if len(v) != size:
                    miss[0] += 1
                elif v != self.expected_bytes(i % done, size):
                    bad[0] += 1

            lat, n = self.timed_loop(max(count, done), get, check)
            self.record("get", size, lat, 1, miss[0], bad[0])
        self.cleanup()

    def batch_api(self, size: int, ops: set[str]) -> None:
        st, b = self.store, self.args.batch
        count = self.iters(size, b)
        errors = [0]

        def keys(j: int) -> list[str]:
            return [self.key("batch", size, j * b + x) for x in range(b)]

        def put_batch(j: int) -> None:
            vals = [self.expected(j * b + x, size) for x in range(b)]
            if st.put_batch(keys(j), vals) != 0:
                errors[0] += 1

        lat, done = self.timed_loop(count, put_batch)
        if "put_batch" in ops:
            self.record("put_batch", size, lat, b, errors[0], 0)
        if "get_batch" in ops:
            miss, bad = [0], [0]

            def get_batch(j: int):
                return st.get_batch(keys(j % done))

            def check(j: int, vals) -> None:
                j %= done
                for x, v in enumerate(vals):
                    miss[0] += len(v) != size
                    bad[0] += v != self.expected_bytes(j * b + x, size)

            lat, _ = self.timed_loop(max(count, done), get_batch, check)
            self.record("get_batch", size, lat, b, miss[0], bad[0])
        self.cleanup()

    def zero_copy(self, size: int, ops: set[str]) -> None:
        st = self.store
        src_len = size + WINDOW
        region = mmap.mmap(-1, src_len + size)
        base = ctypes.addressof(ctypes.c_char.from_buffer(region))
        region[:src_len] = self.pattern[:src_len]
        if st.register_buffer(base, src_len + size) != 0:
            raise SystemExit("register_buffer failed")
        dst = base + src_len
        try:
            count = self.iters(size, 1)
            errors = [0]

            def put_from(i: int) -> None:
                if st.put_from(self.key("zc", size, i), base + (i * STRIDE) % WINDOW, size) != 0:
                    errors[0] += 1

            lat, done = self.timed_loop(count, put_from)
            if "put_from" in ops:
                self.record("put_from", size, lat, 1, errors[0], 0)
            if "get_into" in ops:
                errors[0] = 0
                bad = [0]
                lat_all: list[int] = []
                deadline = time.perf_counter() + self.args.seconds
                for i in range(max(count, done)):
                    k = i % done
                    t0 = time.perf_counter_ns()
                    rc = st.get_into(self.key("zc", size, k), dst, size)
                    lat_all.append(time.perf_counter_ns() - t0)
                    if rc != size:
                        errors[0] += 1
                    elif region[src_len:src_len + size] != self.expected_bytes(k, size):
                        bad[0] += 1
                    if i + 1 >= self.args.min_iters and time.perf_counter() > deadline:
                        break
                self.record("get_into", size, lat_all, 1, errors[0], bad[0])
        finally:
            self.cleanup()
            st.unregister_buffer(base)
            try:
                region.close()
            except BufferError:
                pass  # a ctypes view still points into it; the process exits soon anyway

    def touch_store(self, size: int) -> None:
        """Write (untimed) as much as one phase may, then remove it.

        The first write to a page of a segment costs a page fault, and on a VM
        whose host hands memory out lazily that alone can be ~7 us per 4 KiB
        (0.6 GB/s). Both systems reuse freed space, so after this pass every
        phase measures the store on warm memory, as in a long-running
        deployment, instead of the first touch of each page."""
        for i in range(self.iters(size, 1)):
            self.store.put(self.key("touch", size, i), self.expected(i, size))
        self.cleanup()

    def run(self) -> dict:
        ops = set(self.args.ops.split(","))
        sizes = [int(s) for s in self.args.sizes.split(",")]
        self.cleanup()
        if self.args.touch:
            self.touch_store(max(sizes))
        for size in sizes:
            print(f"size {size}:", file=sys.stderr, flush=True)
            self.warmup(size)
            if ops & {"put", "get"}:
                self.bytes_api(size, ops)
            if ops & {"put_batch", "get_batch"}:
                self.batch_api(size, ops)
            if ops & {"put_from", "get_into"}:
                self.zero_copy(size, ops)
        import mooncake.store as ms

        return {
            "label": self.args.label,
            "topology": self.args.topology,
            "force_tcp": self.args.force_tcp,
            "batch": self.args.batch,
            "seconds_per_phase": self.args.seconds,
            "mooncake_store_module": getattr(ms, "__file__", "?"),
            "python": platform.python_version(),
            "results": self.results,
        }


def chart_path(args: argparse.Namespace) -> Path | None:
    import chart

    return chart.path_for(args.chart, args.json)


def draw(report: dict, path: Path) -> Path:
    """GB/s and p50 of every op, grouped by value size."""
    import chart

    results = report["results"]
    ops = list(dict.fromkeys(r["op"] for r in results))
    sizes = sorted({r["size"] for r in results})
    by = {(r["op"], r["size"]): r for r in results}

    def series(field: str) -> dict:
        return {op: [by[(op, s)][field] if (op, s) in by else None for s in sizes] for op in ops}

    groups = [size_label(s) for s in sizes]
    mode = "forced TCP" if report.get("force_tcp") else "default"
    name = f"{report.get('label') or 'store_bench'}, {report['topology']}, {mode}"
    return chart.write(path, [chart.grouped_bars("throughput", "GB/s", groups, series("gb_s")),
                              chart.grouped_bars("p50 latency per call", "µs", groups, series("p50_us"))],
                       title=name)


def size_label(n: int) -> str:
    return f"{n >> 20} MiB" if n >= MiB and n % MiB == 0 else f"{n >> 10} KiB" if n % 1024 == 0 else f"{n} B"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.force_tcp:
        os.environ["MC_STORE_MEMCPY"] = "0"
        os.environ["MC_FORCE_TCP"] = "1"
    bench = Bench(args)
    try:
        report = bench.run()
    finally:
        bench.store.close()
    text = json.dumps(report, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    path = chart_path(args)
    if path:
        print(f"chart: {draw(report, path)}", file=sys.stderr)
    sys.stdout.flush()
    os._exit(0)  # the reference's close()/atexit can take seconds; results are written


if __name__ == "__main__":
    sys.exit(main())
