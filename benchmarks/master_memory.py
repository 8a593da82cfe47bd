"""Master memory per object: fill a store with N small objects, read the master's RSS.

Starts a `mooncake_master` from the given system, one store client (this
interpreter must import that system's `mooncake.store`; run it with the
system's python) that mounts a segment big enough for all objects, writes N
objects of `--size` bytes with `batch_put_from` from one registered buffer,
and reports (master RSS after − RSS before) / N, plus the master's own
`master_key_count`. Usage:

    /work/refvenv/bin/python benchmarks/master_memory.py --objects 1000000 --json mem.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import chart  # noqa: E402
import mcproc  # noqa: E402


def draw(report: dict, path: Path) -> Path:
    """The master's RSS before and after the fill, and per object."""
    mib = 1 << 20
    rss = [("before", report["master_rss_before"] / mib), ("after", report["master_rss_after"] / mib)]
    per = [("per object", report["rss_bytes_per_object"])]
    title = f"master RSS, {report['objects_requested']} objects of {report['object_size']} B"
    return chart.write(path, [chart.bars(title, "MiB", rss), chart.bars("RSS per object", "bytes", per)])


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--json")
    ap.add_argument("--chart", help="draw the master's RSS here as SVG (default: next to --json)")
    args = ap.parse_args()
    from mooncake.store import MooncakeDistributedStore

    system = mcproc.System("self", Path(sys.executable).parent)
    work = Path(tempfile.mkdtemp(prefix="master_mem_"))
    master = mcproc.start_master(system, work)
    pid = master.proc.popen.pid
    segment = int(args.objects * args.size * 1.3) + (64 << 20)  # stay below the eviction watermark
    st = MooncakeDistributedStore()
    try:
        rc = st.setup("127.0.0.1", master.metadata_server, segment, 64 << 20, "tcp", "", master.address)
        if rc != 0:
            raise SystemExit(f"setup failed: {rc}")
        time.sleep(1.0)
        before = rss_bytes(pid)
        src = mmap.mmap(-1, args.size)
        src[:] = os.urandom(args.size)
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(src))
        assert st.register_buffer(ptr, args.size) == 0
        t0 = time.time()
        failed = 0
        for start in range(0, args.objects, args.batch):
            n = min(args.batch, args.objects - start)
            rcs = st.batch_put_from([f"mem/{i:08d}" for i in range(start, start + n)], [ptr] * n, [args.size] * n)
            failed += sum(1 for r in rcs if r != 0)
            if (start // args.batch) % 200 == 0:
                print(f"{start} objects, master RSS {rss_bytes(pid) >> 20} MiB", file=sys.stderr, flush=True)
        fill_s = time.time() - t0
        time.sleep(2.0)
        after = rss_bytes(pid)
        _, metrics = mcproc.http_get(f"{master.admin_url}/metrics")
        m = re.search(r"^master_key_count (\d+)", metrics, re.M)
        keys = int(m.group(1)) if m else None
        stored = (keys or args.objects - failed)
        report = {
            "objects_requested": args.objects, "object_size": args.size, "failed_puts": failed,
            "master_key_count": keys, "fill_seconds": round(fill_s, 1),
            "master_rss_before": before, "master_rss_after": after,
            "rss_bytes_per_object": round((after - before) / max(1, stored), 1),
            "segment_bytes": segment,
        }
    finally:
        st.close()
        master.stop()
    text = json.dumps(report, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n")
    path = chart.path_for(args.chart, args.json)
    if path:
        print(f"chart: {draw(report, path)}", file=sys.stderr)
    print(text)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
