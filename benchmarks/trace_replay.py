"""Replay a request trace (`shared/traces/*.jsonl`, one request a line with
its prefix blocks `hash_ids`) through `MooncakeDistributedStore`.

Requests run in trace order. Each looks its blocks up (`batch_is_exist`,
then `batch_get_into` of the prefix found), counts the leading blocks it
got as hits, and puts the blocks it is missing. Blocks are `--block-bytes`
each (scaled down from a model's 512-token KV block so the unique blocks
are several times the memory). One storage client owns the memory segment
(`mooncake_client`, with the SSD tier in `--tier ssd`), and the replaying
client has no segment of its own.

The script also computes the hit rate an ideal LRU cache of the same total
capacity (memory, plus the tier's limit) would reach on the same requests,
and, from the master's metrics sampled during the replay, how many blocks
the system actually held once full (keys, and memory and tier bytes in
blocks) with the ideal LRU hit rate at that capacity.

Prints one JSON line: requests, blocks looked up, block hit rate, the ideal
LRU hit rate, requests/s, lookup latency quantiles (ms), puts rejected with
-200 and retried.

    python benchmarks/trace_replay.py --venv .venv --tier ssd \\
        --requests 2000 --block-bytes 65536 --segment-mib 64 --tier-mib 192
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mcproc  # noqa: E402


def default_trace() -> str:
    """`shared/traces/conversation_trace.jsonl` beside the checkout (or its
    parent: worktrees live one level down), or `$MOONCAKE_TRACE`."""
    if os.environ.get("MOONCAKE_TRACE"):
        return os.environ["MOONCAKE_TRACE"]
    repo = Path(__file__).resolve().parents[1]
    for up in (repo.parent, repo.parent.parent):
        p = up / "shared/traces/conversation_trace.jsonl"
        if p.exists():
            return str(p)
    return str(repo.parent / "shared/traces/conversation_trace.jsonl")

REPLAY_PY = r"""
import ctypes, json, sys, time
from mooncake.store import MooncakeDistributedStore
cfg = json.loads(sys.argv[1])
B = cfg["block_bytes"]
store = MooncakeDistributedStore()
rc = store.setup("127.0.0.1", cfg["metadata"], 0, cfg["local_buffer"], "tcp", "", cfg["master"])
assert rc == 0, rc
most = max(len(r) for r in cfg["requests"])
buf = (ctypes.c_char * (most * B))()
base = ctypes.addressof(buf)
assert store.register_buffer(base, most * B) == 0
def block(i):
    return i.to_bytes(8, "little") * (B // 8)
hits = blocks = rejected = failed_puts = wrong = 0
lat = []
t0 = time.perf_counter()
for ids in cfg["requests"]:
    keys = [f"blk-{i}" for i in ids]
    t = time.perf_counter()
    exist = store.batch_is_exist(keys)
    n = 0
    while n < len(keys) and exist[n] == 1:
        n += 1
    if n:
        got = store.batch_get_into(keys[:n], [base + j * B for j in range(n)], [B] * n)
        ok = 0
        while ok < n and got[ok] == B:
            ok += 1
        n = ok
    lat.append(time.perf_counter() - t)
    if cfg["verify"] and n:
        if any(buf[j * B:(j + 1) * B] != block(ids[j]) for j in range(n)):
            wrong += 1
    hits += n
    blocks += len(keys)
    for j in range(n, len(keys)):
        if j > n and exist[j] == 1:
            continue
        for _ in range(2000):
            rc = store.put(keys[j], block(ids[j]))
            if rc != -200:
                break
            rejected += 1
            time.sleep(0.002)
        if rc not in (0, -704):  # -704: OBJECT_ALREADY_EXISTS
            failed_puts += 1
elapsed = time.perf_counter() - t0
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3 if lat else 0.0
print(json.dumps({"hits": hits, "blocks": blocks, "seconds": elapsed,
                  "lookup_ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99)},
                  "rejected_puts": rejected, "failed_puts": failed_puts,
                  "wrong_requests": wrong}))
store.close()
"""


def load_requests(trace: Path, limit: int) -> list[list[int]]:
    out = []
    with open(trace) as f:
        for line in f:
            if len(out) >= limit:
                break
            line = line.strip()
            if line:
                out.append(json.loads(line)["hash_ids"])
    return out


def ideal_lru_hits(requests: list[list[int]], capacity_blocks: int) -> tuple[int, int]:
    """(hit blocks, blocks) of an LRU cache of `capacity_blocks` under the
    replay's rule: the leading blocks found are hits, the missing ones are
    inserted."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = blocks = 0
    for ids in requests:
        n = 0
        while n < len(ids) and ids[n] in cache:
            cache.move_to_end(ids[n])
            n += 1
        hits += n
        blocks += len(ids)
        for i in ids[n:]:
            if i in cache:
                cache.move_to_end(i)
                continue
            cache[i] = None
            if len(cache) > capacity_blocks:
                cache.popitem(last=False)
    return hits, blocks


# Objects with a memory copy, objects with a tier copy, and their bytes.
HELD_METRICS = ("master_key_count", "file_cache_nums_", "master_allocated_bytes",
                "master_allocated_file_size_bytes")


def metric_values(text: str) -> dict[str, float]:
    """The unlabelled samples of `HELD_METRICS` in a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in HELD_METRICS:
            try:
                out[name] = float(value.split()[0])
            except (ValueError, IndexError):
                pass
    return out


class HeldSampler:
    """Samples what the system holds (keys, memory and tier bytes) from the
    master's metrics every `period` s while the replay runs: the capacity it
    actually uses, to compare with the one it was given."""

    def __init__(self, url: str, period: float = 0.2):
        self.url, self.period = url, period
        self.samples: list[dict[str, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.period):
            try:
                status, body = mcproc.http_get(self.url, timeout=2.0)
            except OSError:
                continue
            if status == 200:
                v = metric_values(body)
                if "master_key_count" in v:
                    self.samples.append(v)

    def __enter__(self) -> "HeldSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def steady(self) -> list[dict[str, float]]:
        """Samples from the first one holding 90% of the most blocks seen on:
        the filling phase says nothing about the capacity in use."""
        if not self.samples:
            return []
        most = max(held_blocks(s) for s in self.samples)
        first = next(i for i, s in enumerate(self.samples) if held_blocks(s) >= 0.9 * most)
        return self.samples[first:]


def held_blocks(sample: dict[str, float]) -> float:
    """Blocks held: those with a memory copy plus those with a tier copy.
    Exact when the tier is exclusive (`--offload-on-evict`: an object leaves
    memory once its copy is durable); with copies at put end, objects in
    both count twice."""
    return sample["master_key_count"] + sample.get("file_cache_nums_", 0)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def held_report(steady: list[dict[str, float]], keys: float, ideal: float, B: int) -> dict:
    """What the system held once full (means of the master's samples):
    blocks, and memory and tier bytes in blocks; the ideal LRU's hit rate at
    that many blocks. Nothing when the master published no samples."""
    if not steady:
        return {"held_samples": 0}
    return {
        "held_blocks": round(keys, 1),
        "held_memory_blocks": round(mean([h.get("master_allocated_bytes", 0) for h in steady]) / B, 1),
        "held_tier_blocks": round(mean([h.get("master_allocated_file_size_bytes", 0) for h in steady]) / B, 1),
        "held_samples": len(steady),
        "ideal_lru_hit_rate_at_held": round(ideal, 4),
    }


def run(args: argparse.Namespace) -> dict:
    system = mcproc.System.from_venv(args.name, args.venv)
    requests = load_requests(Path(args.trace or default_trace()), args.requests)
    unique = len({i for r in requests for i in r})
    B = args.block_bytes
    seg = args.segment_mib << 20
    tier = (args.tier_mib << 20) if args.tier == "ssd" else 0
    work = Path(tempfile.mkdtemp(prefix="trace-replay-"))
    procs = []
    try:
        master_flags = ["--default_kv_lease_ttl=50"]
        env = {}
        if args.tier == "ssd":
            master_flags.append("--enable_offload=true")
            if args.offload_on_evict:
                master_flags.append("--offload_on_evict=true")
            tier_dir = work / "tier"
            tier_dir.mkdir()
            env = {
                "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": str(tier_dir),
                "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR": "bucket_storage_backend",
                "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": str(tier),
                "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE": str(tier),
                "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY": "lru",
                "MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES": str(64 << 20),
                "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": "1",
            }
        master = mcproc.start_master(system, work, master_flags)
        procs.append(master)
        port = mcproc.free_port()
        argv = [system.exe("mooncake_client"), *mcproc.storage_client_flags(master, port, str(seg))]
        if args.tier == "ssd":
            argv.append("--enable_offload=true")
        storage = mcproc._spawn("storage", argv, work, system.env(env))
        procs.append(storage)
        try:
            mcproc.wait_tcp(port, 60.0, storage.popen)
        except Exception:
            raise RuntimeError(f"storage client did not start:\n{storage.log_tail()}")
        cfg = {"master": master.address, "metadata": master.metadata_server,
               "block_bytes": B, "local_buffer": max(64 << 20, 4 * B * 64),
               "requests": requests, "verify": args.verify}
        cfg_file = work / "replay.json"
        cfg_file.write_text(json.dumps(cfg))
        with HeldSampler(f"{master.admin_url}/metrics") as held:
            out = subprocess.run(
                [system.python, "-c", REPLAY_PY.replace("sys.argv[1]", f"open({str(cfg_file)!r}).read()")],
                env=system.env(), capture_output=True, text=True, timeout=args.timeout)
        if out.returncode != 0:
            raise RuntimeError(f"replay failed ({out.returncode}):\n{out.stderr[-3000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(work, ignore_errors=True)
    capacity_blocks = (seg + tier) // B
    ideal_hits, ideal_blocks = ideal_lru_hits(requests, capacity_blocks)
    steady = held.steady()
    held_keys = mean([held_blocks(h) for h in steady])
    eff_hits, eff_blocks = ideal_lru_hits(requests, int(held_keys)) if steady else (0, 0)
    return {
        "system": system.name, "tier": args.tier, "offload_on_evict": args.offload_on_evict,
        "requests": len(requests),
        "unique_blocks": unique, "block_bytes": B,
        "unique_over_capacity": round(unique * B / (seg + tier), 2),
        "hit_rate": round(r["hits"] / max(1, r["blocks"]), 4),
        "ideal_lru_hit_rate": round(ideal_hits / max(1, ideal_blocks), 4),
        "capacity_blocks": capacity_blocks,
        **held_report(steady, held_keys, eff_hits / max(1, eff_blocks), B),
        "requests_per_s": round(len(requests) / r["seconds"], 1),
        "lookup_ms": {k: round(v, 3) for k, v in r["lookup_ms"].items()},
        "rejected_puts": r["rejected_puts"], "failed_puts": r["failed_puts"],
        "wrong_requests": r["wrong_requests"],
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--venv", required=True, help="venv holding the system's mooncake package and binaries")
    p.add_argument("--name", default="ours", help="the system's name in the report")
    p.add_argument("--trace", default=None, help="trace file (default: shared/traces/conversation_trace.jsonl)")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--block-bytes", type=int, default=64 << 10)
    p.add_argument("--segment-mib", type=int, default=64)
    p.add_argument("--tier", choices=["none", "ssd"], default="none")
    p.add_argument("--tier-mib", type=int, default=192)
    p.add_argument("--offload-on-evict", action="store_true",
                   help="copy to the tier at eviction (exclusive) instead of at put end")
    p.add_argument("--verify", action="store_true", help="check every block read byte-exact")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--chart", help="draw the hit rates and lookup latency here as SVG")
    return p.parse_args(argv)


def charts(results: list[dict]) -> list:
    """Hit rate against the ideal LRU's, and lookup latency, per run (system and tier)."""
    import chart

    runs = [f"{r['system']} {'memory' if r['tier'] == 'none' else 'memory + SSD'}" for r in results]
    hits = {"hit rate": [100 * r["hit_rate"] for r in results],
            "ideal LRU": [100 * r["ideal_lru_hit_rate"] for r in results]}
    lookup = {q: [r["lookup_ms"].get(q) for r in results] for q in ("p50", "p90", "p99")}
    return [chart.grouped_bars("trace replay: block hit rate", "%", runs, hits),
            chart.grouped_bars("trace replay: lookup latency", "ms", runs, lookup)]


def draw(results: list[dict], path: str | Path) -> Path:
    import chart

    return chart.write(path, charts(results), title=f"trace replay, {results[0]['requests']} requests")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    r = run(args)
    print(json.dumps(r))
    if args.chart:
        print(f"chart: {draw([r], args.chart)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
