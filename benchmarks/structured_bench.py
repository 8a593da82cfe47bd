#!/usr/bin/env python3
"""Structured put/get of a DataProto-like batch through
``mooncake.structured_object_store``, on our package and on the reference's,
each over its own master on this machine.

    python3 benchmarks/structured_bench.py --venv ours=.venv-test --venv ref=/work/venv-ref

The batch: ``--fields`` arrays of mixed dtypes (int64, int32, float32,
float16, bool, uint8) with ``--rows`` rows, ``--mib`` MiB in all. Each venv
runs, in a process of its own against a master of its own (P2P handshake,
TCP): ``put_dataproto``, a full ``get_dataproto``, a row slice (half the
rows) and an index selection (a quarter of the rows, shuffled), each
``--repeat`` times, median reported (each put removed before the next, so
all find the segment equally empty); every read is checked byte for byte.
``memcpy`` is one copy of the batch's bytes in the same process (NumPy
``copyto`` into a buffer written before), the bound for the data movement.
Numbers are GB/s of the batch's (or the selected rows') bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

DTYPES = ["int64", "int32", "float32", "float16", "bool", "uint8"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"master exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"master did not listen on {port}")


def make_batch(np, fields: int, rows: int, mib: int) -> dict:
    per_field = mib * 1024 * 1024 // fields
    rng = np.random.default_rng(7)
    batch = {}
    for i in range(fields):
        dtype = np.dtype(DTYPES[i % len(DTYPES)])
        width = max(1, per_field // (rows * dtype.itemsize))
        raw = rng.integers(0, 255, size=rows * width * dtype.itemsize, dtype=np.uint8)
        batch[f"f{i:02d}_{dtype.name}"] = raw.view(dtype).reshape(rows, width)
    return batch


def child(args) -> None:
    import numpy as np
    from mooncake.store import MooncakeDistributedStore
    from mooncake.structured_object_store import MooncakeBundleTransfer

    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 1024 << 20, 512 << 20, "tcp", "",
                     f"127.0.0.1:{args.master_port}")
    if rc != 0:
        raise SystemExit(f"store setup failed: {rc}")
    transfer = MooncakeBundleTransfer(store, key_prefix=f"bench{os.getpid()}")
    batch = make_batch(np, args.fields, args.rows, args.mib)
    total = sum(a.nbytes for a in batch.values())
    data = {"batch": batch, "non_tensor_batch": {}, "meta_info": {"step": 1}}
    rows = args.rows
    half = slice(rows // 4, rows // 4 + rows // 2)
    picks = np.random.default_rng(1).permutation(rows)[: rows // 4].tolist()
    out: dict = {"bytes": total, "fields": len(batch)}

    def same(a, b) -> bool:  # bytewise: random bytes make NaNs
        return a.shape == b.shape and np.array_equal(np.ascontiguousarray(a).view(np.uint8),
                                                     np.ascontiguousarray(b).view(np.uint8))

    def timed(fn, repeat):
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    dst = np.empty(total, dtype=np.uint8)
    dst[:] = 1
    flat = [a.reshape(-1).view(np.uint8) for a in batch.values()]

    def memcpy():
        offset = 0
        for a in flat:
            np.copyto(dst[offset: offset + a.nbytes], a)
            offset += a.nbytes

    out["memcpy"] = total / timed(memcpy, args.repeat) / 1e9
    # Each put is removed before the next (untimed), so every put finds the
    # segment as empty as the first; one untimed round first touches it.
    transfer.cleanup_dataproto(transfer.put_dataproto(data))
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        ref = transfer.put_dataproto(data)
        times.append(time.perf_counter() - t)
        transfer.cleanup_dataproto(ref)
    out["put"] = total / statistics.median(times) / 1e9
    ref = transfer.put_dataproto(data)

    got = {}

    def get_all():
        got["all"] = transfer.get_dataproto(ref)

    out["get"] = total / timed(get_all, args.repeat) / 1e9
    for name, value in batch.items():
        assert same(got["all"]["batch"][name], value), name

    def get_slice():
        got["slice"] = transfer.get_dataproto(ref, rows=half)

    out["get_slice"] = total / 2 / timed(get_slice, args.repeat) / 1e9
    for name, value in batch.items():
        assert same(got["slice"]["batch"][name], value[half]), name

    def get_rows():
        got["rows"] = transfer.get_dataproto(ref, rows=picks)

    out["get_rows"] = total / 4 / timed(get_rows, args.repeat) / 1e9
    for name, value in batch.items():
        assert same(got["rows"]["batch"][name], value[picks]), name
    transfer.cleanup_dataproto(ref)
    store.close()
    print("RESULT " + json.dumps(out), flush=True)


def run_venv(label: str, venv: Path, args) -> dict:
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="mc-structured-bench-"))
    master = subprocess.Popen(
        [str(venv / "bin" / "mooncake_master"), f"--port={port}", f"--metrics_port={free_port()}"],
        cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, master)
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        proc = subprocess.run(
            [str(venv / "bin" / "python"), __file__, "--child", "--master-port", str(port),
             "--fields", str(args.fields), "--rows", str(args.rows), "--mib", str(args.mib),
             "--repeat", str(args.repeat)],
            cwd=work, env=env, capture_output=True, text=True, timeout=1800)
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise RuntimeError(f"{label}: no result\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    finally:
        master.terminate()
        master.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--venv", action="append", default=[], help="label=path of a venv with mooncake")
    p.add_argument("--fields", type=int, default=36)
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--master-port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    results = {}
    for spec in args.venv or ["ours=.venv-test"]:
        label, _, path = spec.partition("=")
        results[label] = run_venv(label, Path(path).absolute(), args)
    cols = ["memcpy", "put", "get", "get_slice", "get_rows"]
    print(f"batch: {args.fields} fields, {args.rows} rows, {args.mib} MiB; GB/s, median of {args.repeat}")
    print("| run | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for label, r in results.items():
        print(f"| {label} | " + " | ".join(f"{r[c]:.2f}" for c in cols) + " |")


if __name__ == "__main__":
    main()
