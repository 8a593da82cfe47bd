"""Failover of a replicated master as a Python user sees it, for any package.

Per run and system: a fresh etcd cluster id, three `mooncake_master
--enable_ha=true --enable_oplog=true` on one etcd, a Python process holding
the only segment, and a Python client without a segment that puts 32 KiB
values and reads earlier ones back in a loop (both through
`etcd://127.0.0.1:PORT`, P2PHANDSHAKE metadata). After a steady phase the
leader (the master the client is connected to) is stopped with kill -9 or
SIGTERM. Measured from the stop: the first put and the first get that start
after it and succeed. Then every acknowledged put is read back and checked
byte for byte. Prints a JSON line per run and a Markdown table.

    python benchmarks/failover_probe.py --system ours=/work/perfvenv/merged \
        --system reference=/work/ref-venv --runs 5
"""

from __future__ import annotations

import argparse
import contextlib
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

# The client loop. Each call is logged as "op start end rc index" with
# CLOCK_MONOTONIC times, which the driver shares (one clock per machine).
CLIENT_PY = r"""
import hashlib, random, sys, time
from mooncake.store import MooncakeDistributedStore
master, log_path, stop_path, verify_path = sys.argv[1:5]
def value(i):
    return hashlib.sha256(b"fo-%d" % i).digest() * 1024  # 32 KiB
store = MooncakeDistributedStore()
rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master)
assert rc == 0, rc
log = open(log_path, "w", buffering=1)
acked, i, rng = [], 0, random.Random(7)
import os
while not os.path.exists(stop_path):
    t0 = time.monotonic(); rc = store.put("fo-%d" % i, value(i)); t1 = time.monotonic()
    log.write("put %.6f %.6f %d %d\n" % (t0, t1, rc, i))
    if rc == 0:
        acked.append(i)
    i += 1
    if acked:
        j = rng.choice(acked)
        t0 = time.monotonic(); got = store.get("fo-%d" % j); t1 = time.monotonic()
        ok = 0 if got == value(j) else (-1 if not got else -999)
        log.write("get %.6f %.6f %d %d\n" % (t0, t1, ok, j))
    time.sleep(0.002)
lost, wrong = [], 0
for j in acked:
    got = store.get("fo-%d" % j)
    if got != value(j):
        if got:
            wrong += 1
        else:
            lost.append(j)
open(verify_path, "w").write("%d %d\n%s\n" % (len(acked), wrong, " ".join(map(str, lost))))
store.close()
"""


def start_etcd(workdir: Path) -> tuple[subprocess.Popen, int]:
    client, peer = mcproc.free_port(), mcproc.free_port()
    log = open(workdir / "etcd.log", "wb")
    proc = subprocess.Popen(
        ["etcd", "--data-dir", str(workdir / "etcd"), "--name", "probe",
         f"--listen-client-urls=http://127.0.0.1:{client}",
         f"--advertise-client-urls=http://127.0.0.1:{client}",
         f"--listen-peer-urls=http://127.0.0.1:{peer}",
         f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
         f"--initial-cluster=probe=http://127.0.0.1:{peer}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    mcproc.wait_tcp(client, 30, proc)
    return proc, client


def start_ha_master(system: mcproc.System, workdir: Path, flags: list[str], first: bool) -> mcproc.Master:
    """The first master leads: wait for its RPC port. A standby may open no
    port before it leads (the reference's opens none), so only check it is
    still running a moment later."""
    rpc, http, metrics = mcproc.free_port(), mcproc.free_port(), mcproc.free_port()
    argv = [system.exe("mooncake_master"), *mcproc.master_flags(rpc, http, metrics, flags)]
    proc = mcproc._spawn("master", argv, workdir, system.env())
    try:
        if first:
            mcproc.wait_tcp(rpc, 30, proc.popen)
        else:
            time.sleep(1.0)
            if proc.popen.poll() is not None:
                raise RuntimeError("exited")
    except Exception:
        proc.stop()
        raise RuntimeError(f"master did not start:\n{proc.log_tail()}")
    return mcproc.Master(proc, rpc, http, metrics)


def connected_ports(pid: int) -> set[int]:
    """Remote ports of the established TCP connections of process `pid`."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "01" and f[9] in inodes:  # ESTABLISHED
                ports.add(int(f[2].rsplit(":", 1)[1], 16))
    return ports


def read_log(path: Path) -> list[tuple[str, float, float, int, int]]:
    out = []
    for line in path.read_text().splitlines():
        f = line.split()
        if len(f) == 5:
            out.append((f[0], float(f[1]), float(f[2]), int(f[3]), int(f[4])))
    return out


def one_run(system: mcproc.System, etcd_port: int, workdir: Path, run: int, stop_sig: int,
            steady: float, after: float) -> dict:
    cluster = f"fo-{system.name}-{run}-{os.getpid()}"
    flags = ["--enable_ha=true", "--enable_oplog=true", f"--etcd_endpoints=127.0.0.1:{etcd_port}",
             f"--cluster_id={cluster}", "--client_ttl=10"]
    masters = []
    procs: list[mcproc.Proc] = []
    try:
        for m in range(3):
            masters.append(start_ha_master(system, workdir / f"m{m}", flags, first=(m == 0)))
        ha = f"etcd://127.0.0.1:{etcd_port}"
        # storage_holder takes the master address verbatim; the HA form finds the leader.
        ready = workdir / "holder.ready"
        argv = [system.python, str(mcproc.STORAGE_PY), "--master", ha, "--metadata", "P2PHANDSHAKE",
                "--segment", str(1 << 30), "--ready-file", str(ready)]
        storage = mcproc._spawn("holder", argv, workdir, system.env({"MC_STORE_CLUSTER_ID": cluster}))
        procs.append(storage)
        deadline = time.monotonic() + 60
        while not ready.exists():
            if storage.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"storage holder did not start:\n{storage.log_tail()}")
            time.sleep(0.05)
        log, stop, verify = workdir / "events.log", workdir / "client.stop", workdir / "client.verify"
        client = mcproc._spawn("client", [system.python, "-c", CLIENT_PY, ha, str(log), str(stop), str(verify)],
                               workdir, system.env({"MC_STORE_CLUSTER_ID": cluster}))
        procs.append(client)
        deadline = time.monotonic() + 60
        while not (log.exists() and log.stat().st_size > 0):
            if client.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"client did not start:\n{client.log_tail()}")
            time.sleep(0.05)
        time.sleep(steady)
        ports = connected_ports(client.popen.pid)
        leaders = [m for m in masters if m.rpc_port in ports]
        if len(leaders) != 1:
            raise RuntimeError(f"cannot tell the leader: client connected to {sorted(ports)}")
        leader = leaders[0]
        t_stop = time.monotonic()
        os.killpg(leader.proc.popen.pid, stop_sig)
        time.sleep(after)
        stop.touch()
        client.popen.wait(timeout=120)
        events = read_log(log)
        first = {}
        for op in ("put", "get"):
            ok = [end for (o, start, end, rc, _) in events if o == op and start >= t_stop and rc == 0]
            first[op] = round((min(ok) - t_stop) * 1000, 1) if ok else None
        before = sum(1 for (o, s, e, rc, _) in events if o == "put" and e < t_stop and rc == 0)
        errors_after = sum(1 for (o, s, e, rc, _) in events if s >= t_stop and rc != 0)
        wrong_during = sum(1 for (o, s, e, rc, _) in events if o == "get" and rc == -999)
        head, lost_line = verify.read_text().split("\n")[:2]
        acked, wrong = (int(x) for x in head.split())
        lost = [int(x) for x in lost_line.split()]
        put_end = {i: end for (o, start, end, rc, i) in events if o == "put" and rc == 0}
        lost_before = sum(1 for i in lost if put_end.get(i, t_stop) < t_stop)
        return {"system": system.name, "run": run, "signal": signal.Signals(stop_sig).name,
                "first_put_ms": first["put"], "first_get_ms": first["get"], "puts_before_stop": before, "failed_calls_after": errors_after,
                "acknowledged": acked, "lost": len(lost), "lost_acked_before_stop": lost_before, "wrong": wrong + wrong_during}
    finally:
        for p in procs:
            p.stop()
        for m in masters:
            m.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", action="append", required=True, help="name=venv")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--signals", default="KILL,TERM", help="comma-separated: KILL, TERM")
    ap.add_argument("--steady", type=float, default=3.0, help="seconds of load before the stop")
    ap.add_argument("--workdir", help="keep every process's log here (default: a temporary directory, removed)")
    ap.add_argument("--after", type=float, default=15.0, help="seconds of load after the stop")
    args = ap.parse_args()
    systems = [mcproc.System.from_venv(*s.split("=", 1)) for s in args.system]
    rows = []
    ap_tmp = args.workdir or tempfile.mkdtemp(prefix="failover-probe-")
    os.makedirs(ap_tmp, exist_ok=True)
    with contextlib.nullcontext(ap_tmp) as tmp:
        etcd, etcd_port = start_etcd(Path(tmp))
        try:
            for sig in args.signals.split(","):
                for run in range(args.runs):
                    for system in systems:  # interleaved: both systems see the same load
                        wd = Path(tmp) / f"{system.name}-{sig}-{run}"
                        try:
                            row = one_run(system, etcd_port, wd, run, getattr(signal, f"SIG{sig}"),
                                          args.steady, args.after)
                        except Exception as e:  # a run that cannot complete is reported, not hidden
                            row = {"system": system.name, "run": run, "signal": f"SIG{sig}", "error": str(e)[:400]}
                        print(json.dumps(row), flush=True)
                        rows.append(row)
        finally:
            os.killpg(etcd.pid, signal.SIGTERM)
            etcd.wait(timeout=30)
            if not args.workdir:
                shutil.rmtree(tmp, ignore_errors=True)
    print("\n| system | stop | runs | first put ms (median, max) | first get ms (median, max) | acknowledged | lost (of them acknowledged before the stop) | wrong |")
    print("|---|---|---|---|---|---|---|---|")
    for system in systems:
        for sig in args.signals.split(","):
            rs = [r for r in rows if r["system"] == system.name and r["signal"] == f"SIG{sig}" and "error" not in r]
            errs = sum(1 for r in rows if r["system"] == system.name and r["signal"] == f"SIG{sig}" and "error" in r)

            def stat(k):
                v = [r[k] for r in rs if r[k] is not None]
                none = len(rs) - len(v)
                s = f"{statistics.median(v):.0f}, {max(v):.0f}" if v else "-"
                return s + (f" ({none} never)" if none else "")
            print(f"| {system.name} | SIG{sig} | {len(rs)}" + (f" (+{errs} failed)" if errs else "")
                  + f" | {stat('first_put_ms')} | {stat('first_get_ms')} | {sum(r['acknowledged'] for r in rs)}"
                  f" | {sum(r['lost'] for r in rs)} ({sum(r['lost_acked_before_stop'] for r in rs)})"
                  f" | {sum(r['wrong'] for r in rs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
