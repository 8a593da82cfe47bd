"""Probe a system's SSD tier: put a working set several times the memory
segment through a plain client, then read every acknowledged key back.

Starts a master with `--enable_offload=true` (plus `--offload_on_evict=true`
with `--mode evict`), one `mooncake_client --enable_offload=true` owning the
memory segment and the tier directory, and a plain Python client with no
segment of its own, so every disk-only read goes through the owner. Prints one
JSON line: acknowledged, read back byte-exact, missing, wrong, puts rejected
with -200 (retried), wall times.

    python benchmarks/tier_probe.py --venv /work/ref-venv --mode put \
        --bucket-keys 500 --bucket-bytes 268435456
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mcproc  # noqa: E402

CLIENT_PY = r"""
import json, random, sys, time
from mooncake.store import MooncakeDistributedStore
cfg = json.loads(sys.argv[1])
store = MooncakeDistributedStore()
rc = store.setup("127.0.0.1", cfg["metadata"], 0, 64 << 20, "tcp", "", cfg["master"])
assert rc == 0, rc
rng = random.Random(cfg["seed"])
sizes = [rng.randint(256 << 10, 1 << 20) for _ in range(cfg["keys"])]
acked, rejected, failed, unattempted = [], 0, 0, 0
t0 = time.monotonic()
for i, size in enumerate(sizes):
    if time.monotonic() - t0 > cfg["put_budget"]:
        unattempted = len(sizes) - i
        break
    key = f"tier-probe-{i}"
    value = random.Random(i).randbytes(size)
    for attempt in range(200):
        rc = store.put(key, value)
        if rc == -200:
            rejected += 1
            time.sleep(0.05)
            continue
        break
    if rc == 0:
        acked.append(i)
    else:
        failed += 1
put_s = time.monotonic() - t0
time.sleep(cfg["settle"])
try:  # page cache dropped for the reads (needs root; skipped otherwise)
    import os
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
    dropped = True
except OSError:
    dropped = False
# Disk-only reads, timed call by call (the check of the bytes comes after):
# half of the keys with no memory replica one `get` at a time, the other
# half in `get_batch`es of 16.
def on_disk_only(descs):
    return bool(descs) and not any(d.is_memory_replica() for d in descs)
names = [f"tier-probe-{i}" for i in acked]
descs = store.batch_get_replica_desc(names) if names else {}
disk_only = [i for i, k in zip(acked, names) if on_disk_only(descs.get(k))]
singles, batched = disk_only[: len(disk_only) // 2], disk_only[len(disk_only) // 2:]
single_ns, single_bytes, disk_bad = 0, 0, 0
for i in singles:
    t = time.perf_counter_ns()
    got = store.get(f"tier-probe-{i}")
    single_ns += time.perf_counter_ns() - t
    single_bytes += len(got)
    disk_bad += got != random.Random(i).randbytes(sizes[i])
batch_ns, batch_bytes = 0, 0
for b in range(0, len(batched), 16):
    group = batched[b:b + 16]
    t = time.perf_counter_ns()
    values = store.get_batch([f"tier-probe-{i}" for i in group])
    batch_ns += time.perf_counter_ns() - t
    batch_bytes += sum(len(v) for v in values)
    disk_bad += sum(v != random.Random(i).randbytes(sizes[i]) for i, v in zip(group, values))
ok, missing, wrong = 0, 0, 0
t1 = time.monotonic()
for i in acked:
    got = store.get(f"tier-probe-{i}")
    if not got:
        missing += 1
    elif got == random.Random(i).randbytes(sizes[i]):
        ok += 1
    else:
        wrong += 1
get_s = time.monotonic() - t1
acked_bytes = sum(sizes[i] for i in acked)
print(json.dumps(dict(keys=cfg["keys"], acked=len(acked), failed=failed, rejected_200=rejected,
                      acked_keys=acked, page_cache_dropped=dropped,
                      disk_only=len(disk_only), disk_only_wrong=disk_bad,
                      disk_get_mb_s=round(single_bytes / max(single_ns, 1) * 1e3, 1),
                      disk_get_batch16_mb_s=round(batch_bytes / max(batch_ns, 1) * 1e3, 1),
                      put_mb_s=round(acked_bytes / put_s / 1e6, 1),
                      get_mb_s=round(acked_bytes / max(get_s, 1e-9) / 1e6, 1),
                      unattempted_after_budget=unattempted,
                      read_ok=ok, missing=missing, wrong=wrong, put_s=round(put_s, 2),
                      get_s=round(get_s, 2), bytes=sum(sizes))))
store.close()
"""

# After a restart of the storage process: how long until the first
# acknowledged key is readable (from the spawn), and how many come back.
RESTART_PY = r"""
import json, random, sys, time
from mooncake.store import MooncakeDistributedStore
cfg = json.loads(sys.argv[1])
store = MooncakeDistributedStore()
rc = store.setup("127.0.0.1", cfg["metadata"], 0, 64 << 20, "tcp", "", cfg["master"])
assert rc == 0, rc
rng = random.Random(cfg["seed"])
sizes = [rng.randint(256 << 10, 1 << 20) for _ in range(cfg["keys"])]
acked = cfg["acked"]
first = None
deadline = time.time() + cfg["wait"]
while acked and time.time() < deadline:
    if store.get(f"tier-probe-{acked[0]}"):
        first = time.time() - cfg["spawned_at"]
        break
    time.sleep(0.01)
ok = sum(1 for i in acked if store.get(f"tier-probe-{i}") == random.Random(i).randbytes(sizes[i]))
print(json.dumps(dict(first_readable_s=None if first is None else round(first, 2),
                      recovered=ok, of=len(acked))))
store.close()
"""


def dd_rates(directory: Path) -> dict:
    """`dd` direct write (fdatasync) and direct read of 2 GiB in `directory`."""
    f = directory / "dd-probe.tmp"

    def rate(argv):
        out = subprocess.run(argv, capture_output=True, text=True)
        line = out.stderr.strip().splitlines()[-1]
        bytes_, secs = int(line.split()[0]), float(line.split(",")[-2].split()[0])
        return round(bytes_ / secs / 1e6, 1)

    try:
        w = rate(["dd", "if=/dev/zero", f"of={f}", "bs=8M", "count=256", "oflag=direct",
                  "conv=fdatasync"])
        r = rate(["dd", f"if={f}", "of=/dev/null", "bs=8M", "iflag=direct"])
    finally:
        f.unlink(missing_ok=True)
    return dict(dd_direct_write_mb_s=w, dd_direct_read_mb_s=r)


def draw(result: dict, path: Path) -> Path:
    """Keys acknowledged, read back, missing, wrong; put and get MB/s."""
    import chart

    keys = [(k, result.get(k)) for k in ("acked", "read_ok", "missing", "wrong", "rejected_200")]
    if "restart" in result:
        keys.append((f"recovered after {result['restart']['how']}", result["restart"].get("recovered")))
    rates = [("put", result.get("put_mb_s")), ("get", result.get("get_mb_s"))]
    title = f"{result['system']}, {result['mode']}: keys of {result['keys']}"
    return chart.write(path, [chart.bars(title, "keys", keys), chart.bars("rates", "MB/s", rates)])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", required=True, help="venv holding mooncake_master, mooncake_client, python")
    ap.add_argument("--mode", choices=["put", "evict"], default="put")
    ap.add_argument("--keys", type=int, default=409)
    ap.add_argument("--segment", default="64MB")
    ap.add_argument("--bucket-keys", type=int, default=None)
    ap.add_argument("--bucket-bytes", type=int, default=None)
    ap.add_argument("--heartbeat", type=int, default=1)
    ap.add_argument("--settle", type=float, default=15.0, help="seconds between the last put and the reads")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--put-budget", type=float, default=300.0,
                    help="seconds of putting; keys not reached by then are reported, not put")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--restart", choices=["none", "term", "kill"], default="none",
                    help="then stop the storage process (SIGTERM or SIGKILL), start it again on "
                         "the same directory at once and time the first readable key")
    ap.add_argument("--restart-wait", type=float, default=60.0)
    ap.add_argument("--dd", action="store_true", help="also measure dd O_DIRECT in the tier directory")
    ap.add_argument("--chart", help="draw the key counts and rates here as SVG")
    args = ap.parse_args()

    # A SIGTERM (e.g. from `timeout`) still stops the processes we started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    system = mcproc.System.from_venv(Path(args.venv).name, args.venv)
    work = Path(tempfile.mkdtemp(prefix="tier-probe-", dir="/tmp"))
    tier_dir = work / "tier"
    tier_dir.mkdir()
    master_extra = ["--enable_offload=true"]
    if args.mode == "evict":
        master_extra.append("--offload_on_evict=true")
    master = mcproc.start_master(system, work, master_extra)
    env = {
        "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": str(tier_dir),
        "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR": "bucket_storage_backend",
        "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": str(args.heartbeat),
    }
    if args.bucket_keys is not None:
        env["MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT"] = str(args.bucket_keys)
    if args.bucket_bytes is not None:
        env["MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES"] = str(args.bucket_bytes)
    port = mcproc.free_port()
    argv = [system.exe("mooncake_client"),
            *mcproc.storage_client_flags(master, port, args.segment), "--enable_offload=true"]
    storage = mcproc._spawn("storage", argv, work, system.env(env))
    try:
        mcproc.wait_tcp(port, 30, storage.popen)
        time.sleep(1.0)
        cfg = dict(master=master.address, metadata=master.metadata_server, keys=args.keys,
                   seed=args.seed, settle=args.settle, put_budget=args.put_budget)
        out = subprocess.run([system.python, "-c", CLIENT_PY, json.dumps(cfg)], env=system.env(),
                             capture_output=True, text=True, timeout=1800)
        line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
        if out.returncode != 0 or not line:
            print(out.stderr[-4000:], file=sys.stderr)
            return 1
        result = json.loads(line)
        files = list(tier_dir.rglob("*"))
        result.update(system=system.name, mode=args.mode, bucket_keys=args.bucket_keys,
                      bucket_bytes=args.bucket_bytes, tier_files=len(files),
                      tier_bytes=sum(f.stat().st_size for f in files if f.is_file()))
        acked = result.pop("acked_keys")
        if args.restart != "none":
            if args.restart == "kill":
                os.killpg(storage.popen.pid, signal.SIGKILL)
                storage.popen.wait()
            else:
                storage.stop()
            spawned_at = time.time()
            storage = mcproc._spawn("storage-restarted", argv, work, system.env(env))
            rcfg = dict(cfg, acked=acked, spawned_at=spawned_at, wait=args.restart_wait)
            out = subprocess.run([system.python, "-c", RESTART_PY, json.dumps(rcfg)],
                                 env=system.env(), capture_output=True, text=True, timeout=1800)
            line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}"
            result["restart"] = dict(json.loads(line), how=args.restart)
        if args.dd:
            result.update(dd_rates(tier_dir))
        print(json.dumps(result))
        if args.chart:
            print(f"chart: {draw(result, Path(args.chart))}", file=sys.stderr)
    finally:
        storage.stop()
        master.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory: {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
