"""Per-call costs of small remote store calls, counted rather than timed.

Starts a master and a storage process (`mooncake_client`, 256 MiB segment)
of one venv, and a client without a segment that runs `--n` calls of each
op (`put`, `get`, `get_into`, `put_from`, 4 KiB by default) after `--warm`
untimed ones. Per op and per process it reports the CPU time
(`/proc/<pid>/task/*/schedstat`, exact) and the voluntary and involuntary
context switches (wake-ups) per call. Optionally:

- `--callgrind master,storage,client`: runs those processes under
  valgrind's callgrind (zeroed before and dumped after each op's calls:
  `callgrind.<process>.<pid>.<n>`, n = op number); read the instructions
  per call with `callgrind_annotate --inclusive=yes`. The client gets
  `pidfd_shim.c` preloaded (built with `cc`), so the same-host path works
  under valgrind 3.19;
- `--strace`: attaches `strace -c -f` to every process around each op's
  calls (`strace.<op>.<process>`): system calls per call.

`--spin 0` sets `MC_RPC_SPIN_US=0` in every process: no polling, so the
counts are those of the calls themselves (and deterministic). Nothing here
is specific to our package: it runs on any venv with `mooncake_master`,
`mooncake_client` and `mooncake.store`.

    python benchmarks/percall.py --venv VENV --out DIR --spin 0 --callgrind client
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OPS = ("put", "get", "get_into", "put_from")


def client_main(master: str, metadata: str, size: int) -> None:
    """The client process: runs `OP N` lines from stdin, answers `done OP secs`."""
    import ctypes

    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", metadata, 0, 64 << 20, "tcp", "", master)
    if rc != 0:
        raise SystemExit(f"setup failed: {rc}")
    buf = ctypes.create_string_buffer(size * 2)
    addr = ctypes.addressof(buf)
    if s.register_buffer(addr, size * 2) != 0:
        raise SystemExit("register_buffer failed")
    val = bytes((i * 7) & 0xFF for i in range(size))
    ctypes.memmove(addr, val, size)
    gen, last = 0, 0
    print("ready", flush=True)
    for line in sys.stdin:
        op, n = line.split()
        n = int(n)
        t = time.perf_counter()
        if op in ("put", "put_from"):
            gen += 1
            for i in range(n):
                r = s.put(f"k{gen}_{i}", val) if op == "put" else s.put_from(f"k{gen}_{i}", addr, size)
                if r != 0:
                    raise SystemExit(f"{op} failed: {r}")
            last = gen
        elif op == "get":
            for i in range(n):
                if s.get(f"k{last}_{i}") != val:
                    raise SystemExit("get returned other bytes")
        elif op == "get_into":
            for i in range(n):
                if s.get_into(f"k{last}_{i}", addr + size, size) != size:
                    raise SystemExit("get_into failed")
        else:
            raise SystemExit(f"unknown op {op}")
        print(f"done {op} {time.perf_counter() - t:.6f}", flush=True)
    s.close()


def task_sum(pid: int, read) -> tuple:
    """`read(task_dir)` summed over the threads of `pid` (threads that exit meanwhile are skipped)."""
    total = None
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            v = read(f"/proc/{pid}/task/{t}")
        except OSError:
            continue
        total = v if total is None else tuple(a + b for a, b in zip(total, v))
    return total


def ctx_switches(task: str) -> tuple:
    v = nv = 0
    with open(f"{task}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                v = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                nv = int(line.split()[1])
    return v, nv


def cpu_ns(task: str) -> tuple:
    with open(f"{task}/schedstat") as f:
        return (int(f.read().split()[0]),)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=1000, help="counted calls per op")
    ap.add_argument("--warm", type=int, default=200, help="untimed calls per op first")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--callgrind", default="", help="comma list of master,storage,client")
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--spin", help="MC_RPC_SPIN_US for every process")
    ap.add_argument("--client", nargs=3, metavar=("MASTER", "METADATA", "SIZE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:
        client_main(a.client[0], a.client[1], int(a.client[2]))
        return

    sys.path.insert(0, str(HERE))
    import mcproc

    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    system = mcproc.System.from_venv("system", a.venv)
    env = {"MC_STORE_PREFAULT": "0"}
    if a.spin is not None:
        env["MC_RPC_SPIN_US"] = a.spin
    wrapped = set(filter(None, a.callgrind.split(",")))
    shim = out / "pidfd_shim.so"
    if "client" in wrapped:
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(shim), str(HERE / "pidfd_shim.c"), "-ldl"],
                       check=True)

    def under(name: str) -> list[str]:
        if name not in wrapped:
            return []
        pre = ["env", f"LD_PRELOAD={shim}"] if name == "client" else []
        return pre + ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/callgrind.{name}.%p"]

    rpc, http, metrics = mcproc.free_port(), mcproc.free_port(), mcproc.free_port()
    mp = mcproc._spawn("master", [*under("master"), system.python, system.exe("mooncake_master"),
                                  *mcproc.master_flags(rpc, http, metrics)], out, system.env(env))
    sp = cl = None
    try:
        for p in (rpc, http, metrics):
            mcproc.wait_tcp(p, 120, mp.popen)
        master = mcproc.Master(mp, rpc, http, metrics)
        port = mcproc.free_port()
        sp = mcproc._spawn("storage", [*under("storage"), system.python, system.exe("mooncake_client"),
                                       *mcproc.storage_client_flags(master, port, str(256 << 20))],
                           out, system.env(env))
        mcproc.wait_tcp(port, 120, sp.popen)
        with open(out / "client.log", "wb") as log:
            cl = subprocess.Popen([*under("client"), system.python, __file__, "--venv", a.venv, "--out", a.out,
                                   "--client", master.address, master.metadata_server, str(a.size)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                  env=system.env(env), text=True)
        if cl.stdout.readline().strip() != "ready":
            raise SystemExit(f"client did not start; see {out / 'client.log'}")
        procs = {"master": mp.popen.pid, "storage": sp.popen.pid, "client": cl.pid}

        def run(op: str, n: int) -> float:
            cl.stdin.write(f"{op} {n}\n")
            cl.stdin.flush()
            answer = cl.stdout.readline().split()
            if not answer or answer[0] != "done":
                raise SystemExit(f"client failed during {op}; see {out / 'client.log'}")
            return float(answer[2])

        ops = a.ops.split(",")
        for op in ops:
            run(op, a.warm)
        report = {}
        for op in ops:
            for name in wrapped:
                subprocess.run(["callgrind_control", "-z", str(procs[name])], check=True, capture_output=True)
            tracers = []
            if a.strace:
                for name, pid in procs.items():
                    tracers.append(subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o",
                                                     str(out / f"strace.{op}.{name}")], stderr=subprocess.DEVNULL))
                time.sleep(1.0)  # attached to every thread
            c0 = {k: task_sum(p, ctx_switches) for k, p in procs.items()}
            u0 = {k: task_sum(p, cpu_ns) for k, p in procs.items()}
            secs = run(op, a.n)
            c1 = {k: task_sum(p, ctx_switches) for k, p in procs.items()}
            u1 = {k: task_sum(p, cpu_ns) for k, p in procs.items()}
            for t in tracers:
                t.send_signal(signal.SIGINT)
                t.wait()
            for name in wrapped:
                subprocess.run(["callgrind_control", "-d", op, str(procs[name])], check=True, capture_output=True)
            r = {"us_per_call": round(secs / a.n * 1e6, 2)}
            for k in procs:
                r[f"{k}_cpu_us"] = round((u1[k][0] - u0[k][0]) / 1e3 / a.n, 2)
                r[f"{k}_wakeups"] = round((c1[k][0] - c0[k][0]) / a.n, 3)
                r[f"{k}_preempted"] = round((c1[k][1] - c0[k][1]) / a.n, 3)
            report[op] = r
            print(op, json.dumps(r), flush=True)
        (out / "percall.json").write_text(json.dumps(report, indent=1))
    finally:
        if cl is not None:
            cl.stdin.close()
            try:
                cl.wait(timeout=120)
            except subprocess.TimeoutExpired:
                cl.kill()
        if sp is not None:
            sp.stop()
        mp.stop()


if __name__ == "__main__":
    main()
