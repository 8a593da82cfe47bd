"""Offload when memory is full: how fast puts reach the SSD tier.

Starts a master with `--enable_offload=true --offload_on_evict=true`, one
`mooncake_client --enable_offload=true` owning the memory segment and the
tier directory, and `--writers` plain Python clients (no segment) that put
1 MiB values until the working set is `--factor` times the segment. A `-200`
is retried after 20 ms and counted. While they put, the tier directory's
size is sampled every 100 ms: the offload rate is what landed on disk during
the put phase over that phase's time. Then every acknowledged key is read
back and checked byte for byte, and `dd oflag=direct` writes 2 GiB in the
same directory (the floor). Prints one JSON line.

    python benchmarks/offload_full.py --venv /work/venv-ours --segment 256MB
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mcproc  # noqa: E402
from tier_probe import dd_rates  # noqa: E402

# Values: an 8-byte index, then a slice of one random block chosen by the
# index, so building one costs a slice, not a random generator.
WRITER_PY = r"""
import json, os, random, sys, time
from mooncake.store import MooncakeDistributedStore
cfg = json.loads(sys.argv[1])
store = MooncakeDistributedStore()
rc = store.setup("127.0.0.1", cfg["metadata"], 0, 16 << 20, "tcp", "", cfg["master"])
assert rc == 0, rc
block = random.Random(cfg["seed"]).randbytes(2 * cfg["size"])
def value(i):
    off = (i * 4099) % cfg["size"]
    return i.to_bytes(8, "little") + block[off:off + cfg["size"] - 8]
keys = range(cfg["first"], cfg["first"] + cfg["count"])
if cfg["phase"] == "put":
    acked, rejected, failed, waited, unattempted = [], 0, 0, 0.0, 0
    t0 = time.monotonic()
    for n, i in enumerate(keys):
        if time.monotonic() - t0 > cfg["put_budget"]:
            unattempted = len(keys) - n
            break
        v = value(i)
        for attempt in range(1000):
            rc = store.put(f"of-{i}", v)
            if rc == -200:
                rejected += 1
                t = time.monotonic()
                time.sleep(0.02)
                waited += time.monotonic() - t
                continue
            break
        if rc == 0:
            acked.append(i)
        else:
            failed += 1
    print(json.dumps(dict(acked=acked, rejected_200=rejected, failed=failed, unattempted=unattempted,
                          retry_wait_s=round(waited, 2), put_s=round(time.monotonic() - t0, 3),
                          start=t0, end=time.monotonic())))
else:
    ok, missing, wrong = 0, 0, 0
    for i in cfg["acked"]:
        got = store.get(f"of-{i}")
        if not got:
            missing += 1
        elif got == value(i):
            ok += 1
        else:
            wrong += 1
    print(json.dumps(dict(read_ok=ok, missing=missing, wrong=wrong)))
store.close()
"""


def dir_bytes(d: Path) -> int:
    total = 0
    for f in d.rglob("*"):
        try:
            if f.is_file():
                total += f.stat().st_size
        except OSError:
            pass
    return total


def run_writers(system, cfg: dict, writers: int, per: int, phase: str, extra: dict | None = None):
    procs = []
    for w in range(writers):
        c = dict(cfg, first=w * per, count=per, phase=phase, **(extra or {}))
        if phase == "get":
            c["acked"] = extra["acked"][w]
        procs.append(subprocess.Popen([system.python, "-c", WRITER_PY, json.dumps(c)],
                                      env=system.env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=3600)
        if p.returncode != 0 or not out.strip():
            raise RuntimeError(f"writer failed ({p.returncode}): {err[-3000:]}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", required=True, help="venv holding mooncake_master, mooncake_client, python")
    ap.add_argument("--segment", default="256MB")
    ap.add_argument("--segment-bytes", type=int, default=256 << 20)
    ap.add_argument("--factor", type=float, default=4.0, help="working set / segment")
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--bucket-keys", type=int, default=None)
    ap.add_argument("--heartbeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--put-budget", type=float, default=300.0,
                    help="seconds each writer puts; keys not reached by then are reported")
    ap.add_argument("--master-flag", action="append", default=[])
    args = ap.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    system = mcproc.System.from_venv(Path(args.venv).name, args.venv)
    work = Path(tempfile.mkdtemp(prefix="offload-full-", dir="/tmp"))
    tier_dir = work / "tier"
    tier_dir.mkdir()
    master = mcproc.start_master(system, work, ["--enable_offload=true", "--offload_on_evict=true",
                                                *args.master_flag])
    env = {
        "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": str(tier_dir),
        "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR": "bucket_storage_backend",
        "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": str(args.heartbeat),
    }
    if args.bucket_keys is not None:
        env["MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT"] = str(args.bucket_keys)
    port = mcproc.free_port()
    argv = [system.exe("mooncake_client"),
            *mcproc.storage_client_flags(master, port, args.segment), "--enable_offload=true"]
    storage = mcproc._spawn("storage", argv, work, system.env(env))
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            samples.append((time.monotonic(), dir_bytes(tier_dir)))
            time.sleep(0.1)

    try:
        mcproc.wait_tcp(port, 30, storage.popen)
        time.sleep(1.0)
        total = int(args.segment_bytes * args.factor) // args.size
        per = total // args.writers
        cfg = dict(master=master.address, metadata=master.metadata_server, size=args.size,
                   seed=args.seed, put_budget=args.put_budget)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.monotonic()
        puts = run_writers(system, cfg, args.writers, per, "put")
        t1 = time.monotonic()
        time.sleep(args.settle)
        stop.set()
        sampler.join()
        acked = [p["acked"] for p in puts]
        n_acked = sum(len(a) for a in acked)
        during = [b for t, b in samples if t <= t1]
        landed = (during[-1] - during[0]) if during else 0
        # The offload phase: from the first byte on disk to the end of the puts.
        first = next((t for t, b in samples if b > (during[0] if during else 0)), t1)
        offload_s = max(t1 - first, 1e-9)
        gets = run_writers(system, cfg, args.writers, per, "get", dict(acked=acked))
        result = dict(system=system.name, writers=args.writers, segment=args.segment,
                      working_set_mb=round(total * args.size / 1e6), acked=n_acked,
                      rejected_200=sum(p["rejected_200"] for p in puts),
                      failed=sum(p["failed"] for p in puts),
                      unattempted=sum(p["unattempted"] for p in puts),
                      retry_wait_s=round(sum(p["retry_wait_s"] for p in puts), 2),
                      put_s=round(t1 - t0, 2),
                      put_mb_s=round(n_acked * args.size / (t1 - t0) / 1e6, 1),
                      tier_mb_during_puts=round(landed / 1e6, 1),
                      offload_s=round(offload_s, 2),
                      offload_mb_s=round(landed / offload_s / 1e6, 1),
                      tier_mb_final=round(dir_bytes(tier_dir) / 1e6, 1),
                      read_ok=sum(g["read_ok"] for g in gets),
                      missing=sum(g["missing"] for g in gets),
                      wrong=sum(g["wrong"] for g in gets))
        # The storage client's own account of its offload rounds.
        result["offload_rounds_log"] = [l.split("offload rounds")[-1].strip()[:300]
                                        for l in storage.log_tail(400).splitlines()
                                        if "offload rounds" in l][-3:]
        result.update(dd_rates(tier_dir))
        result["offload_of_dd"] = round(result["offload_mb_s"] / result["dd_direct_write_mb_s"], 3)
        print(json.dumps(result))
    finally:
        stop.set()
        storage.stop()
        master.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
