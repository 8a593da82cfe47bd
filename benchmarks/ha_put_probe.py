"""4 KiB put latency and throughput, plain and replicated, as a Python user sees it, for any package.

Per system (a venv whose `python` imports `mooncake.store` and whose `bin`
holds `mooncake_master`): one plain `mooncake_master`, and three
`mooncake_master --enable_ha=true --enable_oplog=true` on one etcd started
by the script (a cluster id of their own). Each setup gets one Python client
process (`MooncakeDistributedStore`, P2PHANDSHAKE metadata, TCP) that
mounts its own segment (`--segment`, 256 MiB) and puts with
`preferred_segment` set to it, so every put lands in the client's own
memory and only the master path differs; the replicated client reaches
the leader through `etcd://127.0.0.1:PORT`. The get set is hard-pinned.

With `--clients 1,4,8,16`, each setup gets as many client processes as the
largest count (the first mounts `--segment`, the others `--extra-segment`);
a phase with N clients sends its command to the first N, which start
together (one CLOCK_MONOTONIC instant) and put distinct keys; their
latencies are pooled and their puts/s summed (the group commit shows as the
replicated setup's aggregate growing with N).

Everything is up at once. In each round every (system, setup) runs one put
phase in turn (the order rotates from round to round): `--seconds` of
`store.put(key, value)` with distinct keys and 4 KiB values, in slices of
`--slice` seconds; between two slices the client removes what it put,
untimed. Only the `put` call is timed (`time.perf_counter_ns`); puts/s is
the puts over the wall time of the slices (the Python loop included). Then a
get phase: `--get-seconds` of `store.get` over 256 keys put once at start
(verified byte for byte, outside the timing).

Each put phase also reports the CPU the rest of the machine took while it
ran, in cores (from /proc: all busy time less that of the processes the
probe started): other jobs on a shared machine show there.

Prints a JSON line per phase, then Markdown tables: every round, the
medians over rounds, and the ratios per round (replicated / plain within a
system, ours / reference within a setup).

    python benchmarks/ha_put_probe.py --system ours=/work/perfvenv/t9e \\
        --system reference=/work/ref-venv --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mcproc  # noqa: E402
from failover_probe import start_etcd, start_ha_master  # noqa: E402

# One client. Commands on stdin, one JSON object a line; each answer is one
# stdout line starting with "@@" (a library may print other lines).
WORKER_PY = r"""
import gc, json, os, sys, time
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
master, segment, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
SIZE, POOL, GETS = 4096, 8192, 256
store = MooncakeDistributedStore()
rc = store.setup("127.0.0.1", "P2PHANDSHAKE", segment, 16 << 20, "tcp", "", master)
if rc != 0:
    print("@@" + json.dumps({"error": "setup %d" % rc}), flush=True)
    sys.exit(1)
# Every put lands in this client's own segment: only the master path is
# measured, not a transfer to another client.
cfg = ReplicateConfig()
cfg.preferred_segment = store.get_hostname()
blob = os.urandom(SIZE * POOL)
values = [blob[i * SIZE:(i + 1) * SIZE] for i in range(POOL)]
# The get set is hard-pinned (both packages have the flag): the put
# phases' churn must not evict it.
pinned = ReplicateConfig()
pinned.preferred_segment = cfg.preferred_segment
pinned.with_hard_pin = True
for j in range(GETS):
    rc = store.put("%s-get-%d" % (tag, j), values[j], pinned)
    if rc != 0:
        print("@@" + json.dumps({"error": "put of the get set: %d" % rc}), flush=True)
        sys.exit(1)
gc.disable()
clock = time.perf_counter_ns
counter = 0
def put_phase(seconds, slice_s, start_at):
    global counter
    lat, wall, errors = [], 0, 0
    # CLOCK_MONOTONIC is one clock for every process of the machine: the
    # clients of a phase start together.
    while time.monotonic() < start_at:
        time.sleep(min(0.01, max(0.0, start_at - time.monotonic())))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        keys = []
        t_start = clock()
        t_stop = t_start + int(slice_s * 1e9)
        i = 0
        while i < POOL:
            key = "%s-%d" % (tag, counter)
            counter += 1
            v = values[i]
            t0 = clock()
            rc = store.put(key, v, cfg)
            t1 = clock()
            i += 1
            if rc == 0:
                lat.append(t1 - t0)
                keys.append(key)
            else:
                errors += 1
            if t1 >= t_stop:
                break
        wall += clock() - t_start
        for key in keys:
            store.remove(key)
    return {"lat": lat, "wall_ns": wall, "errors": errors}
def get_phase(seconds):
    lat, wrong, missing, j = [], 0, 0, 0
    end = time.monotonic() + seconds
    t_begin = clock()
    while time.monotonic() < end:
        key = "%s-get-%d" % (tag, j % GETS)
        t0 = clock()
        got = store.get(key)
        t1 = clock()
        lat.append(t1 - t0)
        if not got:
            missing += 1
        elif got != values[j % GETS]:
            wrong += 1
        j += 1
    return {"lat": lat, "wall_ns": clock() - t_begin, "wrong": wrong, "missing": missing}
print("@@" + json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "put":
        out = put_phase(cmd["seconds"], cmd["slice"], cmd.get("start_at", 0.0))
    elif cmd["op"] == "get":
        out = get_phase(cmd["seconds"])
    else:
        break
    print("@@" + json.dumps(out), flush=True)
store.close()
"""


class Worker:
    def __init__(self, system: mcproc.System, setup: str, master: str, workdir: Path, segment: int,
                 env: dict[str, str] | None = None, index: int = 0):
        self.system, self.setup = system, setup
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"client-{setup}-{index}.log"
        log = open(self.log_path, "wb")
        tag = f"hp{os.getpid()}{setup[0]}{index}"
        self.popen = subprocess.Popen(
            [system.python, "-c", WORKER_PY, master, str(segment), tag],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=system.env(env),
            cwd=workdir, start_new_session=True, text=True)
        log.close()
        ready = self.read()
        if "error" in ready:
            raise RuntimeError(f"{system.name} {setup} client: {ready['error']}")

    def read(self) -> dict:
        while True:
            line = self.popen.stdout.readline()
            if not line:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.system.name} {self.setup} client exited:\n{tail}")
            if line.startswith("@@"):
                return json.loads(line[2:])

    def send(self, **cmd) -> None:
        self.popen.stdin.write(json.dumps(cmd) + "\n")
        self.popen.stdin.flush()

    def call(self, **cmd) -> dict:
        self.send(**cmd)
        return self.read()

    def stop(self) -> None:
        try:
            self.popen.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.popen.stdin.close()
            self.popen.wait(timeout=15)
        except Exception:
            pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait()


def busy_ticks() -> int:
    """CPU ticks spent by the whole machine so far (every state but idle and iowait)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(f) - f[3] - f[4]


def group_ticks(pgids: set[int]) -> int:
    """CPU ticks spent so far by every process in the process groups `pgids`."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[2]) in pgids:
            total += int(f[11]) + int(f[12])
    return total


def retried(start, attempts: int = 3):
    """`start()`, again if it fails: a port picked free may be taken by
    someone's outgoing connection before the master binds it."""
    for i in range(attempts):
        try:
            return start()
        except RuntimeError:
            if i == attempts - 1:
                raise


def pct(sorted_ns: list[int], q: float) -> float:
    idx = min(len(sorted_ns) - 1, max(0, int(round(q * len(sorted_ns))) - 1))
    return sorted_ns[idx] / 1e3


def summarize(outs: list[dict]) -> dict:
    """One phase of one or more clients that ran at once: their latencies
    pooled, and puts/s summed over the clients (each client's puts over the
    wall time of its own slices)."""
    lat = sorted(x for out in outs for x in out["lat"])
    if not lat:
        return {"n": 0}
    rate = sum(len(out["lat"]) / (out["wall_ns"] / 1e9) for out in outs if out["wall_ns"] > 0)
    return {"n": len(lat), "p50_us": round(statistics.median(lat) / 1e3, 1), "p99_us": round(pct(lat, 0.99), 1),
            "ops_s": round(rate)}


def run_phase(workers: list["Worker"], clients: int, **cmd) -> list[dict]:
    """The same command to the first `clients` workers, started together."""
    group = workers[:clients]
    start_at = time.monotonic() + 0.3
    for w in group:
        w.send(start_at=start_at, **cmd)
    return [w.read() for w in group]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", action="append", required=True, help="name=venv (the first is 'ours' in ratios)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0, help="put phase length")
    ap.add_argument("--slice", type=float, default=0.25, help="seconds between two untimed removals")
    ap.add_argument("--get-seconds", type=float, default=1.0, help="get phase length (0: none; one client only)")
    ap.add_argument("--segment", type=int, default=256 << 20, help="bytes the first client of a setup mounts")
    ap.add_argument("--clients", default="1",
                    help="comma-separated client process counts, each a put phase per setup and round (e.g. 1,4,8,16)")
    ap.add_argument("--extra-segment", type=int, default=64 << 20,
                    help="bytes each further client mounts (with --clients above 1)")
    ap.add_argument("--workdir", help="keep every process's log here (default: a temporary directory, removed)")
    args = ap.parse_args()
    counts = sorted({int(c) for c in args.clients.split(",") if c.strip()})
    if not counts or counts[0] < 1:
        ap.error("--clients needs positive counts")
    systems = [mcproc.System.from_venv(*s.split("=", 1)) for s in args.system]
    tmp = Path(args.workdir or tempfile.mkdtemp(prefix="ha-put-probe-"))
    tmp.mkdir(parents=True, exist_ok=True)
    setups = ["plain", "ha"]
    etcd, etcd_port = start_etcd(tmp)
    masters: list[mcproc.Master] = []
    workers: dict[tuple[str, str], list[Worker]] = {}
    rows = []
    try:
        for system in systems:
            wd = tmp / system.name
            plain = retried(lambda: mcproc.start_master(system, wd / "plain"))
            masters.append(plain)
            cluster = f"hp-{system.name}-{os.getpid()}"
            flags = ["--enable_ha=true", "--enable_oplog=true", f"--etcd_endpoints=127.0.0.1:{etcd_port}",
                     f"--cluster_id={cluster}"]
            for m in range(3):
                masters.append(retried(lambda: start_ha_master(system, wd / f"m{m}", flags, first=(m == 0))))
            targets = {"plain": (plain.address, None),
                       "ha": (f"etcd://127.0.0.1:{etcd_port}", {"MC_STORE_CLUSTER_ID": cluster})}
            for setup, (master, env) in targets.items():
                workers[(system.name, setup)] = [
                    Worker(system, setup, master, wd, args.segment if i == 0 else args.extra_segment, env=env, index=i)
                    for i in range(counts[-1])]
        order = [(s.name, setup) for s in systems for setup in setups]
        ours = {os.getpgrp(), etcd.pid, *(m.proc.popen.pid for m in masters),
                *(w.popen.pid for ws in workers.values() for w in ws)}
        hz = os.sysconf("SC_CLK_TCK")
        print(f"# load average at start: {os.getloadavg()}", flush=True)
        for rnd in range(1, args.rounds + 1):
            k = (rnd - 1) % len(order)
            for clients in counts:
                for name, setup in order[k:] + order[:k]:
                    ws = workers[(name, setup)]
                    row = {"round": rnd, "system": name, "setup": setup, "clients": clients,
                           "load1": round(os.getloadavg()[0], 2)}
                    t0, b0, o0 = time.monotonic(), busy_ticks(), group_ticks(ours)
                    puts = run_phase(ws, clients, op="put", seconds=args.seconds, slice=args.slice)
                    # CPU the rest of the machine took meanwhile, in cores: other jobs.
                    others = (busy_ticks() - b0 - (group_ticks(ours) - o0)) / hz / (time.monotonic() - t0)
                    row["others_cores"] = round(max(0.0, others), 2)
                    row.update({"put_" + key: v for key, v in summarize(puts).items()},
                               put_errors=sum(p["errors"] for p in puts))
                    if args.get_seconds > 0 and clients == 1:
                        get = ws[0].call(op="get", seconds=args.get_seconds)
                        row.update({"get_" + key: v for key, v in summarize([get]).items()}, get_wrong=get["wrong"], get_missing=get["missing"])
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        print(f"# load average at end: {os.getloadavg()}", flush=True)
    finally:
        for ws in workers.values():
            for w in ws:
                w.stop()
        for m in masters:
            m.stop()
        os.killpg(etcd.pid, signal.SIGTERM)
        etcd.wait(timeout=30)
        if not args.workdir:
            shutil.rmtree(tmp, ignore_errors=True)
    report(rows, [s.name for s in systems], setups, counts)
    return 0


def report(rows: list[dict], names: list[str], setups: list[str], counts: list[int]) -> None:
    label = {"plain": "1 master", "ha": "3 masters, --enable_ha --enable_oplog"}
    print("\n| round | system | 4 KiB put | clients | n | p50 µs | p99 µs | puts/s | get p50 µs | put errors"
          " | gets missing / wrong | others' CPU (cores) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['round']} | {r['system']} | {label[r['setup']]} | {r['clients']} | {r['put_n']}"
              f" | {r.get('put_p50_us', '-')} | {r.get('put_p99_us', '-')} | {r.get('put_ops_s', 0)}"
              f" | {r.get('get_p50_us', '-')} | {r['put_errors']}"
              f" | {r.get('get_missing', '-')} / {r.get('get_wrong', '-')} | {r['others_cores']} |")

    def med(name, setup, clients, key):
        v = [r[key] for r in rows
             if r["system"] == name and r["setup"] == setup and r["clients"] == clients and key in r]
        return statistics.median(v) if v else float("nan")

    print("\n| median over rounds | 4 KiB put | clients | p50 µs | p99 µs | puts/s | get p50 µs |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        for setup in setups:
            for c in counts:
                print(f"| {name} | {label[setup]} | {c} | {med(name, setup, c, 'put_p50_us'):.1f}"
                      f" | {med(name, setup, c, 'put_p99_us'):.1f} | {med(name, setup, c, 'put_ops_s'):.0f}"
                      f" | {med(name, setup, c, 'get_p50_us'):.1f} |")

    by = {(r["round"], r["system"], r["setup"], r["clients"]): r for r in rows}
    rounds = sorted({r["round"] for r in rows})
    print("\n| ratio | clients | per round | median |")
    print("|---|---|---|---|")

    def ratio_row(title, clients, pairs, key, pct_fmt):
        vals = []
        for a, b in pairs:
            if a in by and b in by and by[b].get(key) and by[a].get(key):
                vals.append(by[a][key] / by[b][key])
        fmt = (lambda x: f"{x * 100:.0f}%") if pct_fmt else (lambda x: f"{x:.2f}×")
        if vals:
            print(f"| {title} | {clients} | {', '.join(fmt(v) for v in vals)} | {fmt(statistics.median(vals))} |")

    for c in counts:
        for name in names:
            ratio_row(f"{name}: replicated / plain, put p50", c,
                      [((i, name, "ha", c), (i, name, "plain", c)) for i in rounds], "put_p50_us", False)
            ratio_row(f"{name}: replicated / plain, puts/s", c,
                      [((i, name, "ha", c), (i, name, "plain", c)) for i in rounds], "put_ops_s", True)
        if len(names) > 1:
            a, b = names[0], names[1]
            for setup in setups:
                ratio_row(f"{a} / {b}, {label[setup]}, put p50", c,
                          [((i, a, setup, c), (i, b, setup, c)) for i in rounds], "put_p50_us", False)
                ratio_row(f"{a} / {b}, {label[setup]}, puts/s", c,
                          [((i, a, setup, c), (i, b, setup, c)) for i in rounds], "put_ops_s", True)


if __name__ == "__main__":
    sys.exit(main())
