"""Run the same benchmarks on several Mooncake implementations and compare them.

A *system* is a venv (or any directory with `bin/`) holding `mooncake_master`,
`mooncake_client`, `transfer_engine_bench` and a `python` that imports
`mooncake.store`. The reference and ours ship the same binary names, so every
system is driven identically:

1. Store workload (`store_bench.py`) per topology and transport mode:
   - `local`: master + the measuring client, which mounts the segment;
   - `remote`: master + a storage process (`mooncake_client`, or a Python
     process holding a segment if the system has no `mooncake_client`) + the
     measuring client with `global_segment_size=0`;
   - modes `default` and `tcp` (`MC_STORE_MEMCPY=0 MC_FORCE_TCP=1` for every
     process of the run).
2. `transfer_engine_bench` over TCP: target + initiator, block sizes 64 KiB and
   1 MiB, read and write, `--threads=2`.
3. Once per run, a Redis baseline (`redis-server` from PATH, `redis-py` in the
   driver's interpreter): plain SET/GET of the same value sizes.

Prints a table of ours/reference ratios per case (the first `--system` is the
baseline), writes `compare.json`, `compare.md` and `compare.svg` (throughput by value
size, the Transfer Engine and the trace replay, drawn by `chart.py`) to `--out`. Example (reference only, then both):

    python benchmarks/compare.py --system reference=/work/refvenv --out bench_out
    python benchmarks/compare.py --system reference=/work/refvenv --system ours=.venv --out bench_out

The driver's interpreter needs `redis` and `numpy` (see `--tools-venv`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import mcproc  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 4 * MiB]
SEGMENT = 1536 * MiB
TCP_ENV = {"MC_STORE_MEMCPY": "0", "MC_FORCE_TCP": "1"}
REFERENCE_PACKAGE = "mooncake-transfer-engine-non-cuda"


def log(msg: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", action="append", default=[],
                    help="NAME=VENV_DIR (repeatable; the first is the baseline). Default: reference=/work/refvenv")
    ap.add_argument("--install-reference", metavar="VENV",
                    help=f"create VENV and pip install {REFERENCE_PACKAGE} into it if it is missing")
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--topologies", default="local,remote")
    ap.add_argument("--modes", default="default,tcp", help="default and/or tcp (forced TCP)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--seconds", type=float, default=1.0, help="time budget per store_bench phase")
    ap.add_argument("--te-duration", type=int, default=3)
    ap.add_argument("--storage", choices=["auto", "client", "python"], default="auto",
                    help="remote storage process: mooncake_client, a Python process (storage_holder.py), "
                         "or auto (mooncake_client when the system has it)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="store_bench rounds; systems alternate within a round, medians are reported")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: store,te,first_fill,memcpy,redis")
    ap.add_argument("--trace-replay", action="store_true",
                    help="also replay the conversation trace (trace_replay.py), memory only and with the SSD tier")
    ap.add_argument("--trace-requests", type=int, default=12031)
    ap.add_argument("--trace-block-bytes", type=int, default=16 << 10)
    ap.add_argument("--trace-segment-mib", type=int, default=256)
    ap.add_argument("--trace-tier-mib", type=int, default=768)
    return ap.parse_args()


def run_trace_replay(system: mcproc.System, args: argparse.Namespace) -> list[dict]:
    """The trace replay, memory only and memory + SSD tier."""
    import trace_replay

    out = []
    for tier in ("none", "ssd"):
        argv = ["--venv", str(system.bin_dir.parent), "--name", system.name, "--tier", tier,
                "--requests", str(args.trace_requests), "--block-bytes", str(args.trace_block_bytes),
                "--segment-mib", str(args.trace_segment_mib), "--tier-mib", str(args.trace_tier_mib)]
        ns = trace_replay.parse(argv)
        r = trace_replay.run(ns)
        log(f"{system.name} trace replay ({tier}): {json.dumps(r)}")
        out.append(r)
    return out


def trace_section(results: dict, names: list[str]) -> list[str]:
    rows = [r for n in names for r in results["systems"][n].get("trace", [])]
    if not rows:
        return []
    r0 = rows[0]
    lines = [f"\n### Trace replay (`trace_replay.py`, {r0['requests']} requests of the conversation trace, "
             f"blocks of {fmt_size(r0['block_bytes'])}, unique blocks {r0['unique_blocks']})\n",
             "| system | tier | unique / capacity | block hit rate | ideal LRU | requests/s | "
             "lookup p50 ms | p90 ms | p99 ms | -200 retries |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        q = r["lookup_ms"]
        lines.append(f"| {r['system']} | {r['tier']} | {r['unique_over_capacity']} | {r['hit_rate']:.4f} | "
                     f"{r['ideal_lru_hit_rate']:.4f} | {r['requests_per_s']} | {q['p50']} | {q['p90']} | "
                     f"{q['p99']} | {r['rejected_puts']} |")
    return lines


# ---------------------------------------------------------------- store workload
def run_store_bench(system: mcproc.System, topology: str, mode: str, args: argparse.Namespace,
                    workdir: Path) -> dict:
    env = dict(TCP_ENV) if mode == "tcp" else {}
    master = mcproc.start_master(system, workdir / "master", env=env)
    storage = None
    try:
        if topology == "remote":
            if args.storage == "client" or (args.storage == "auto" and system.has("mooncake_client")):
                storage = mcproc.start_storage_client(system, master, workdir / "storage", str(SEGMENT), env=env)
            else:
                storage = mcproc.start_storage_python(system, master, workdir / "storage", SEGMENT, env=env)
        out = workdir / "store_bench.json"
        argv = [system.python, str(HERE / "store_bench.py"), "--master", master.address,
                "--metadata", master.metadata_server, "--topology", topology,
                "--segment-size", str(SEGMENT), "--sizes", args.sizes,
                "--seconds", str(args.seconds), "--label", f"{system.name}/{topology}/{mode}", "--json", str(out)]
        if mode == "tcp":
            argv.append("--force-tcp")
        log(f"{system.name}: store_bench {topology}/{mode}")
        with open(workdir / "store_bench.log", "wb") as errf:
            cp = subprocess.run(argv, env=system.env(env), stdout=subprocess.DEVNULL, stderr=errf, timeout=1200)
        if cp.returncode != 0 or not out.exists():
            tail = (workdir / "store_bench.log").read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(f"store_bench failed ({cp.returncode}):\n" + "\n".join(tail))
        report = json.loads(out.read_text())
        report["command"] = " ".join(argv)
        return report
    finally:
        if storage:
            storage.stop()
        master.stop()


def merge_rounds(reports: list[dict]) -> dict:
    """One report whose numbers are the per-case medians over rounds."""
    import statistics

    merged = dict(reports[0])
    merged["rounds"] = len(reports)
    rows = []
    for r0 in reports[0]["results"]:
        same = [r for rep in reports for r in rep["results"] if r["op"] == r0["op"] and r["size"] == r0["size"]]
        row = dict(r0)
        for f in ("p50_us", "p99_us", "mean_us", "ops_s", "gb_s"):
            row[f] = statistics.median(r[f] for r in same)
        for f in ("n", "errors", "verify_errors"):
            row[f] = sum(r[f] for r in same)
        rows.append(row)
    merged["results"] = rows
    return merged


# ---------------------------------------------------------------- transfer engine
TE_RE = re.compile(r"throughput\s+([0-9.]+)\s*(GB|GiB|Gb|MB|MiB|Mb|KB|KiB|Kb)/s")
UNIT = {"GB": 1.0, "GiB": 1.073741824, "Gb": 0.125, "MB": 1e-3, "MiB": 1.048576e-3, "Mb": 1.25e-4,
        "KB": 1e-6, "KiB": 1.024e-6, "Kb": 1.25e-7}


def run_te_bench(system: mcproc.System, args: argparse.Namespace, workdir: Path,
                 extra_env: dict | None = None) -> list[dict]:
    results = []
    env = {"GLOG_minloglevel": "0", **(extra_env or {})}  # the result line is logged at INFO
    master = mcproc.start_master(system, workdir / "master")
    try:
        for block in (64 * KiB, 1 * MiB):
            for op in ("read", "write"):
                tport, iport = mcproc.free_port(), mcproc.free_port()
                common = ["--protocol=tcp", f"--metadata_server={master.metadata_server}",
                          "--buffer_size=268435456"]
                target = mcproc._spawn(f"te_target_{block}_{op}",
                                       [system.exe("transfer_engine_bench"), "--mode=target",
                                        f"--local_server_name=127.0.0.1:{tport}", *common],
                                       workdir, system.env(env), preexec_fn=mcproc.normal_priority)
                try:
                    time.sleep(2.0)  # the target publishes its segment to the metadata server
                    argv = [system.exe("transfer_engine_bench"), "--mode=initiator",
                            f"--local_server_name=127.0.0.1:{iport}", f"--segment_id=127.0.0.1:{tport}",
                            f"--operation={op}", f"--block_size={block}", "--threads=2",
                            f"--duration={args.te_duration}", *common]
                    log(f"{system.name}: transfer_engine_bench {op} {block}")
                    init = mcproc._spawn(f"te_initiator_{block}_{op}", argv, workdir, system.env(env),
                                         preexec_fn=mcproc.normal_priority)
                    try:
                        rc = init.popen.wait(timeout=args.te_duration + 60)
                    except subprocess.TimeoutExpired:
                        rc = None
                    finally:
                        init.stop()  # the whole group: a shim's binary child too
                    text = init.log_path.read_text(errors="replace")
                    m = TE_RE.search(text)
                    results.append({"op": op, "block_size": block, "threads": 2,
                                    "gb_s": round(float(m.group(1)) * UNIT[m.group(2)], 4) if m else None,
                                    "rc": rc, "command": " ".join(argv)})
                finally:
                    target.stop()
    finally:
        master.stop()
    return results


# ---------------------------------------------------------------- redis baseline
def run_redis(args: argparse.Namespace, workdir: Path) -> list[dict]:
    import redis

    sys.path.insert(0, str(HERE))
    from store_bench import stats

    server = shutil.which("redis-server")
    if not server:
        log("redis-server not on PATH: skipping the Redis baseline")
        return []
    port = mcproc.free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    proc = mcproc._spawn("redis", [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--maxmemory", "0"], workdir, dict(os.environ))
    results = []
    try:
        mcproc.wait_tcp(port, 15, proc.popen)
        r = redis.Redis(host="127.0.0.1", port=port)
        for size in [int(s) for s in args.sizes.split(",")]:
            pattern = os.urandom(size + 64 * KiB)
            mv = memoryview(pattern)
            count = max(8, min(2000, int(SEGMENT * 0.4) // size))
            lat, deadline = [], time.perf_counter() + args.seconds
            for i in range(count):
                off = (i * 64) % (64 * KiB)
                t0 = time.perf_counter_ns()
                r.set(f"bench/{size}/{i}", mv[off:off + size])
                lat.append(time.perf_counter_ns() - t0)
                if i >= 7 and time.perf_counter() > deadline:
                    break
            done = len(lat)
            results.append({"op": "put", "size": size, **stats(lat, size, 1)})
            lat, bad, deadline = [], 0, time.perf_counter() + args.seconds
            for i in range(max(count, done)):
                t0 = time.perf_counter_ns()
                v = r.get(f"bench/{size}/{i % done}")
                lat.append(time.perf_counter_ns() - t0)
                off = ((i % done) * 64) % (64 * KiB)
                bad += v != pattern[off:off + size]  # bytes vs bytes: a memcmp
                if i >= 7 and time.perf_counter() > deadline:
                    break
            results.append({"op": "get", "size": size, **stats(lat, size, 1), "verify_errors": bad})
            r.flushall()
            log(f"redis {size}: put {results[-2]['p50_us']}us get {results[-1]['p50_us']}us")
    finally:
        proc.stop()
    return results


# ---------------------------------------------------------------- memcpy ceiling
def run_memcpy(args: argparse.Namespace) -> list[dict]:
    """memcpy bandwidth of this machine for the store's large sizes: copies from
    one warm buffer into successive slots of a warm 512 MiB region, as a store
    moving values into a segment does (numpy's copyto is a plain memcpy)."""
    import numpy as np

    region = np.ones(512 * MiB, dtype=np.uint8)  # touched: warm pages
    out = []
    for size in (1 * MiB, 4 * MiB):
        src = np.full(size, 7, dtype=np.uint8)
        slots = len(region) // size
        lat = []
        deadline = time.perf_counter() + args.seconds
        i = 0
        while i < 64 or time.perf_counter() < deadline:
            off = (i % slots) * size
            t0 = time.perf_counter_ns()
            np.copyto(region[off:off + size], src)
            lat.append(time.perf_counter_ns() - t0)
            i += 1
        lat.sort()
        out.append({"size": size, "p50_us": lat[len(lat) // 2] / 1e3,
                    "gb_s": round(size * len(lat) / sum(lat), 3)})
        log(f"memcpy {size}: {out[-1]['gb_s']} GB/s")
    return out


# The performance targets: (label, topology/mode, ops, sizes, metric, bound).
# metric "p50_us": ours/reference p50 must be <= bound; "gb_s": ours/reference
# throughput (items for batches) must be >= bound.
TARGETS = [
    ("4 KiB put and get p50 <= 1/3 of the reference (local)", "local/default", ("put", "get"), (4 * KiB,), "p50_us", 1 / 3),
    ("4 KiB put and get p50 <= 1/3 of the reference (remote)", "remote/default", ("put", "get"), (4 * KiB,), "p50_us", 1 / 3),
    ("1/4 MiB put (put, put_batch, put_from) >= 5x", "remote/default", ("put", "put_batch", "put_from"),
     (MiB, 4 * MiB), "gb_s", 5.0),
    ("1/4 MiB get (get, get_batch, get_into) >= 2x", "remote/default", ("get", "get_batch", "get_into"),
     (MiB, 4 * MiB), "gb_s", 2.0),
    ("batch-16 4 KiB put/get >= 2x ops/s", "remote/default", ("put_batch", "get_batch"), (4 * KiB,), "gb_s", 2.0),
    ("forced TCP: every case >= 1.5x", "remote/tcp", ("put", "get", "put_batch", "get_batch", "put_from", "get_into"),
     tuple(SIZES), "gb_s", 1.5),
]


def targets_section(results: dict, names: list[str]) -> list[str]:
    base, ours = names[0], names[-1]
    if len(names) < 2 or "store" not in results["systems"][base] or "store" not in results["systems"][ours]:
        return []
    a, b = store_rows(results["systems"][ours]), store_rows(results["systems"][base])
    lines = ["\n### Targets (ours/reference in this run, remote topology unless noted)\n",
             "| target | worst case | its ratio | met |", "|---|---|---|---|"]
    for label, key, ops, sizes, metric, bound in TARGETS:
        worst = None
        for op in ops:
            for size in sizes:
                ra, rb = a.get((key, op, size)), b.get((key, op, size))
                if not ra or not rb or not ra.get(metric) or not rb.get(metric):
                    continue
                r = ra[metric] / rb[metric]
                score = r if metric == "gb_s" else -r
                if worst is None or score < worst[0]:
                    worst = (score, f"{op} {fmt_size(size)}", r)
        if worst is None:
            lines.append(f"| {label} | - | n/a | n/a |")
            continue
        _, case, r = worst
        met = r >= bound if metric == "gb_s" else r <= bound
        lines.append(f"| {label} | {case} | {r:.2f} | {'yes' if met else '**no**'} |")
    memcpy = {m["size"]: m["gb_s"] for m in results.get("memcpy", [])}
    for size in (MiB, 4 * MiB):
        if size not in memcpy:
            continue
        worst = None
        for op in ("put", "get", "put_from", "get_into"):
            r = a.get(("remote/default", op, size))
            if r and (worst is None or r["gb_s"] < worst[1]):
                worst = (op, r["gb_s"])
        if worst:
            share = worst[1] / memcpy[size]
            lines.append(f"| remote same-host {fmt_size(size)} >= 50% of memcpy ({memcpy[size]:.1f} GB/s) | "
                         f"{worst[0]} {worst[1]:.2f} GB/s | {share:.0%} | {'yes' if share >= 0.5 else '**no**'} |")
    return lines


# ---------------------------------------------------------------- report
def fmt_size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "n/a"
    return f"{a / b:.2f}"


def store_rows(report: dict) -> dict[tuple, dict]:
    rows = {}
    for key, rep in report["store"].items():
        for r in rep["results"]:
            rows[(key, r["op"], r["size"])] = r
    return rows


def build_table(results: dict, names: list[str]) -> str:
    base = names[0]
    lines = []
    lines.append("### Store (`store_bench.py`)\n")
    head = ["case", "size"]
    for n in names:
        head += [f"{n} p50 µs", f"{n} GB/s", f"{n} ops/s"]
    for n in names[1:]:
        head += [f"{n}/{base} p50", f"{n}/{base} GB/s"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    per = {n: store_rows(results["systems"][n]) for n in names if "store" in results["systems"][n]}
    keys = sorted({k for rows in per.values() for k in rows},
                  key=lambda k: (k[0], ["put", "get", "put_batch", "get_batch", "put_from", "get_into"].index(k[1])
                                 if k[1] in ["put", "get", "put_batch", "get_batch", "put_from", "get_into"] else 9,
                                 k[2]))
    for k in keys:
        row = [f"{k[0]} {k[1]}", fmt_size(k[2])]
        for n in names:
            r = per.get(n, {}).get(k)
            row += [f"{r['p50_us']:.0f}", f"{r['gb_s']:.3f}", f"{r['ops_s']:.0f}"] if r else ["-", "-", "-"]
        for n in names[1:]:
            a, b = per.get(n, {}).get(k), per.get(base, {}).get(k)
            row += [ratio(a and a["p50_us"], b and b["p50_us"]), ratio(a and a["gb_s"], b and b["gb_s"])]
        lines.append("| " + " | ".join(row) + " |")
    if any("te" in results["systems"][n] for n in names):
        lines.append("\n### Transfer Engine (`transfer_engine_bench --protocol=tcp`, --threads=2)\n")
        lines.append("(`forced TCP`: the same run with `MC_FORCE_TCP=1`; without it ours moves "
                     "same-host bytes through shared memory.)\n")
        cols = [(n, "te", f"{n} GB/s") for n in names]
        cols += [(n, "te_tcp", f"{n} forced TCP GB/s") for n in names[1:]]
        head = ["op", "block"] + [c[2] for c in cols] + [f"{c[2].replace(' GB/s', '')}/{base}" for c in cols[1:]]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for op in ("read", "write"):
            for block in (64 * KiB, MiB):
                vals = {}
                for n, part, _ in cols:
                    for r in results["systems"][n].get(part, []):
                        if r["op"] == op and r["block_size"] == block:
                            vals[(n, part)] = r["gb_s"]
                row = [op, fmt_size(block)] + [str(vals.get((n, p), "-")) for n, p, _ in cols]
                row += [ratio(vals.get((n, p)), vals.get((base, "te"))) for n, p, _ in cols[1:]]
                lines.append("| " + " | ".join(row) + " |")
    lines += targets_section(results, names)
    lines += trace_section(results, names)
    import first_fill

    lines += first_fill.section(results, names)
    if results.get("memcpy"):
        lines.append("\n### memcpy ceiling (numpy copyto into a warm 512 MiB region)\n")
        lines.append("| size | p50 µs | GB/s |")
        lines.append("|---|---|---|")
        for m in results["memcpy"]:
            lines.append(f"| {fmt_size(m['size'])} | {m['p50_us']:.0f} | {m['gb_s']:.2f} |")
    if results.get("redis"):
        lines.append("\n### Redis baseline (redis-py SET/GET, one connection)\n")
        lines.append("| op | size | p50 µs | p99 µs | GB/s | ops/s |")
        lines.append("|---|---|---|---|---|---|")
        for r in results["redis"]:
            lines.append(f"| {r['op']} | {fmt_size(r['size'])} | {r['p50_us']:.0f} | {r['p99_us']:.0f} | "
                         f"{r['gb_s']:.3f} | {r['ops_s']:.0f} |")
    return "\n".join(lines) + "\n"


def chart(results: dict, names: list[str], path: Path) -> Path | None:
    """Store GB/s by value size for each run (both systems, redis where it applies), the
    Transfer Engine's GB/s and the trace replay, as one SVG (`chart.py`)."""
    import chart as svg

    per = {n: store_rows(results["systems"][n]) for n in names if "store" in results["systems"][n]}
    runs = sorted({k[0] for rows in per.values() for k in rows})
    sizes = sorted({k[2] for rows in per.values() for k in rows})
    panels = []
    for run in runs:
        series = {}
        for n in names:
            for op in ("get", "put"):
                ys = [per.get(n, {}).get((run, op, s), {}).get("gb_s") for s in sizes]
                if any(ys):
                    series[f"{n} {op}"] = ys
        if results.get("redis") and run.endswith("/default"):
            for op in ("get", "put"):
                series[f"redis {op}"] = [next((r["gb_s"] for r in results["redis"]
                                               if r["op"] == op and r["size"] == s), None) for s in sizes]
        panels.append(svg.lines(run, "GB/s (single-threaded Python client)", [fmt_size(s) for s in sizes],
                                series, log_y=True))
    te = [(n, part) for n in names for part in ("te", "te_tcp") if results["systems"][n].get(part)]
    if te:
        cases = [(op, block) for op in ("read", "write") for block in (64 * KiB, MiB)]
        series = {f"{n}{' forced TCP' if part == 'te_tcp' else ''}":
                  [next((r["gb_s"] for r in results["systems"][n][part]
                         if r["op"] == op and r["block_size"] == block), None) for op, block in cases]
                  for n, part in te}
        panels.append(svg.grouped_bars("transfer_engine_bench --protocol=tcp", "GB/s",
                                       [f"{op} {fmt_size(b)}" for op, b in cases], series))
    trace = [r for n in names for r in results["systems"][n].get("trace", [])]
    if trace:
        import trace_replay

        panels += trace_replay.charts(trace)
    if not panels:
        return None
    return svg.write(path, panels, title="Mooncake Store: ours and the reference", columns=2)


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        model = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
        info["cpu"] = model
        mem = next(ln.split(":", 1)[1].strip() for ln in open("/proc/meminfo") if ln.startswith("MemTotal"))
        info["memory"] = mem
        info["loadavg_at_start"] = open("/proc/loadavg").read().split()[:3]
    except (OSError, StopIteration):
        pass
    return info


def ensure_reference(venv: str) -> None:
    py = Path(venv) / "bin" / "python"
    if (Path(venv) / "bin" / "mooncake_master").exists():
        return
    log(f"installing {REFERENCE_PACKAGE} into {venv}")
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", REFERENCE_PACKAGE], check=True)


def main() -> int:
    args = parse_args()
    if args.install_reference:
        ensure_reference(args.install_reference)
    specs = args.system or ["reference=/work/refvenv"]
    systems = []
    for spec in specs:
        name, _, path = spec.partition("=")
        systems.append(mcproc.System.from_venv(name, path))
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    skip = set(args.skip.split(",")) - {""}
    results: dict = {"machine": machine(), "argv": sys.argv, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "systems": {}}
    for system in systems:
        results["systems"][system.name] = {"bin_dir": str(system.bin_dir)}
    if "store" not in skip:
        # Rounds alternate the systems so that load drift on a shared machine hits both alike.
        for rnd in range(args.repeat):
            for system in systems:
                res = results["systems"][system.name]
                for topology in args.topologies.split(","):
                    for mode in args.modes.split(","):
                        key = f"{topology}/{mode}"
                        wd = out / "runs" / system.name / f"round{rnd}" / topology / mode
                        try:
                            rep = run_store_bench(system, topology, mode, args, wd)
                            res.setdefault("store_rounds", {}).setdefault(key, []).append(rep)
                        except Exception as e:  # noqa: BLE001 - one failed case must not hide the others
                            log(f"{system.name} {key} failed: {e}")
                            res.setdefault("errors", []).append(f"store {key}: {e}")
                (out / "compare.json").write_text(json.dumps(results, indent=1) + "\n")
        for system in systems:
            res = results["systems"][system.name]
            res["store"] = {k: merge_rounds(v) for k, v in res.get("store_rounds", {}).items()}
    for system in systems:
        res = results["systems"][system.name]
        if "te" not in skip:
            try:
                res["te"] = run_te_bench(system, args, out / "runs" / system.name / "te")
                if system is not systems[0]:
                    # `--protocol=tcp` on one host: the reference always uses
                    # TCP; ours picks shared memory unless told not to.
                    res["te_tcp"] = run_te_bench(system, args, out / "runs" / system.name / "te_tcp",
                                                 extra_env=TCP_ENV)
            except Exception as e:  # noqa: BLE001
                log(f"{system.name} transfer_engine_bench failed: {e}")
                res.setdefault("errors", []).append(f"te: {e}")
        (out / "compare.json").write_text(json.dumps(results, indent=1) + "\n")
    if "first_fill" not in skip:
        import first_fill

        for system in systems:
            res = results["systems"][system.name]
            try:
                log(f"{system.name}: first_fill")
                res["first_fill"] = first_fill.run_system(system, out / "runs" / system.name / "first_fill")
            except Exception as e:  # noqa: BLE001
                log(f"{system.name} first fill failed: {e}")
                res.setdefault("errors", []).append(f"first_fill: {e}")
        (out / "compare.json").write_text(json.dumps(results, indent=1) + "\n")
    if args.trace_replay:
        for system in systems:
            res = results["systems"][system.name]
            try:
                res["trace"] = run_trace_replay(system, args)
            except Exception as e:  # noqa: BLE001
                log(f"{system.name} trace replay failed: {e}")
                res.setdefault("errors", []).append(f"trace: {e}")
        (out / "compare.json").write_text(json.dumps(results, indent=1) + "\n")
    if "memcpy" not in skip:
        try:
            results["memcpy"] = run_memcpy(args)
        except ImportError as e:
            log(f"no memcpy ceiling: {e}")
    if "redis" not in skip:
        try:
            results["redis"] = run_redis(args, out / "runs" / "redis")
        except Exception as e:  # noqa: BLE001
            log(f"redis baseline failed: {e}")
            results["redis_error"] = str(e)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    (out / "compare.json").write_text(json.dumps(results, indent=1) + "\n")
    names = [s.name for s in systems]
    table = build_table(results, names)
    (out / "compare.md").write_text(table)
    drawn = chart(results, names, out / "compare.svg")
    if drawn:
        log(f"chart: {drawn}")
    print(table)
    log(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
