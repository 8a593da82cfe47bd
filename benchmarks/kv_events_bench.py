"""What publishing KV events costs a put: 4 KiB puts against a master with
`--enable_kv_events` (a ZMQ subscriber draining it, as a router would) and
against one without, interleaved round by round.

    python benchmarks/kv_events_bench.py --venv VENV --rounds 5 --seconds 3

Both masters run from the same venv, each with one client process that
mounts its own segment and puts distinct keys that name a block hash
(`0x...`, so every put publishes a `stored` event carrying that hash). Only
the `put` call is timed; between slices the client removes what it put,
untimed (a `remove` publishes `removed` events, which the subscriber also
drains). Prints one JSON line per (round, setup) and a summary: p50 and p99
per setup (median over rounds) and the on/off ratio of the p50s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mcproc  # noqa: E402

CLIENT = r"""
import json, os, statistics, sys, time
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
master, meta, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = MooncakeDistributedStore()
assert store.setup("127.0.0.1", meta, 256 << 20, 64 << 20, "tcp", "", master) == 0
cfg = ReplicateConfig(); cfg.preferred_segment = store.get_hostname()
value = os.urandom(4096)
print("ready", flush=True)
for line in sys.stdin:
    rnd = int(line)
    lat, n, keys = [], 0, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(200):
            key = "0x%04x%012x" % (rnd, n)
            t = time.perf_counter_ns()
            rc = store.put(key, value, cfg)
            lat.append(time.perf_counter_ns() - t)
            assert rc == 0, rc
            keys.append(key)
            n += 1
        for k in keys:
            store.remove(k)
        keys.clear()
    lat.sort()
    print(json.dumps({"n": n, "p50_us": lat[len(lat) // 2] / 1e3,
                      "p99_us": lat[int(len(lat) * 0.99)] / 1e3}), flush=True)
"""


def drain(endpoint: str, stop: threading.Event, counts: dict) -> None:
    import zmq

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 100)
    sub.connect(endpoint)
    while not stop.is_set():
        try:
            sub.recv_multipart()
            counts["batches"] += 1
        except zmq.Again:
            pass
    sub.close(linger=0)
    ctx.term()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--master-bin", help="a mooncake_master to run instead of the venv's (both setups)")
    a = ap.parse_args()
    system = mcproc.System.from_venv("ours", a.venv)
    if a.master_bin:
        # Only the master changes: the clients keep the venv's package.
        exe = system.exe
        system.exe = lambda b: str(Path(a.master_bin).resolve()) if b == "mooncake_master" else exe(b)
    work = Path(tempfile.mkdtemp(prefix="kvev-bench-"))
    port = mcproc.free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    for d in ("off", "on"):
        (work / d).mkdir()
    masters = {
        "off": mcproc.start_master(system, work / "off"),
        "on": mcproc.start_master(system, work / "on", [
            "--enable_kv_events=true", f"--kv_events_bind_endpoint={endpoint}",
            "--kv_events_backend_id=bench"]),
    }
    stop, counts = threading.Event(), {"batches": 0}
    sub = threading.Thread(target=drain, args=(endpoint, stop, counts), daemon=True)
    sub.start()
    clients = {}
    try:
        for name, m in masters.items():
            p = subprocess.Popen([system.python, "-c", CLIENT, m.address, m.metadata_server, str(a.seconds)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=system.env())
            assert p.stdout.readline().strip() == "ready"
            clients[name] = p
        rows = {"off": [], "on": []}
        for rnd in range(a.rounds):
            order = ["off", "on"] if rnd % 2 == 0 else ["on", "off"]
            for name in order:
                p = clients[name]
                p.stdin.write(f"{rnd}\n")
                p.stdin.flush()
                r = json.loads(p.stdout.readline())
                r.update(round=rnd, setup=name, load1=round(os.getloadavg()[0], 2))
                rows[name].append(r)
                print(json.dumps(r), flush=True)
        p50 = {k: statistics.median(r["p50_us"] for r in v) for k, v in rows.items()}
        p99 = {k: statistics.median(r["p99_us"] for r in v) for k, v in rows.items()}
        print(json.dumps({"summary": True, "p50_us": p50, "p99_us": p99,
                          "on_over_off_p50": round(p50["on"] / p50["off"], 3),
                          "event_batches_received": counts["batches"]}), flush=True)
    finally:
        for p in clients.values():
            p.stdin.close()
            p.wait(30)
        stop.set()
        for m in masters.values():
            m.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
