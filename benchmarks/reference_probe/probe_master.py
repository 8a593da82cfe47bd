"""Probe the master's HTTP endpoints (admin/metrics port and embedded metadata server).

Starts a master, a store client with a segment holding a few keys, then GETs
every endpoint and records status and body. Usage:

    /work/refvenv/bin/python benchmarks/reference_probe/probe_master.py --out ref_master.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import mcproc  # noqa: E402


def request(method: str, url: str, body: bytes | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    from mooncake.store import MooncakeDistributedStore

    system = mcproc.System("self", Path(sys.executable).parent)
    work = Path(tempfile.mkdtemp(prefix="probe_master_"))
    master = mcproc.start_master(system, work)
    out: list[dict] = []
    try:
        st = MooncakeDistributedStore()
        assert st.setup("127.0.0.1", master.metadata_server, 64 << 20, 16 << 20, "tcp", "", master.address) == 0
        seg = st.get_hostname()
        for k in ("alpha", "beta", "gamma/δ"):
            assert st.put(k, k.encode() * 10) == 0
        st.get("alpha")
        admin = master.admin_url
        meta = master.metadata_server
        for method, url, body in [
            ("GET", f"{admin}/health", None),
            ("GET", f"{admin}/metrics/summary", None),
            ("GET", f"{admin}/query_key?key=alpha", None),
            ("GET", f"{admin}/query_key?key=missing", None),
            ("GET", f"{admin}/query_key", None),
            ("GET", f"{admin}/batch_query_keys?keys=alpha,missing", None),
            ("GET", f"{admin}/batch_query_keys", None),
            ("GET", f"{admin}/get_all_keys", None),
            ("GET", f"{admin}/get_all_segments", None),
            ("GET", f"{admin}/query_segment?segment={seg}", None),
            ("GET", f"{admin}/query_segment?segment=nosuch:1", None),
            ("GET", f"{admin}/nosuch", None),
            ("POST", f"{admin}/health", b""),
            ("GET", f"{meta}?key=nosuch", None),
            ("GET", f"{meta}", None),
            ("PUT", f"{meta}?key=probe/k", b'{"x":1}'),
            ("GET", f"{meta}?key=probe/k", None),
            ("PUT", f"{meta}?key=probe/k", b"overwritten"),
            ("GET", f"{meta}?key=probe/k", None),
            ("DELETE", f"{meta}?key=probe/k", None),
            ("DELETE", f"{meta}?key=probe/k", None),
            ("GET", f"{meta}?key=probe/k", None),
            ("POST", f"{meta}?key=probe/k", b"x"),
            ("GET", f"{meta}?key=mooncake/ram/{seg}", None),
        ]:
            status, text = request(method, url, body)
            rec = {"method": method, "path": url.split(str(master.metrics_port), 1)[-1]
                   if str(master.metrics_port) in url else url.split(str(master.http_port), 1)[-1],
                   "status": status, "body": text[:1500]}
            out.append(rec)
            print(f"{method} {rec['path']} -> {status} {text[:120]!r}", file=sys.stderr)
        status, text = request("GET", f"{admin}/metrics")
        names = sorted({m.group(1) for m in re.finditer(r"^# TYPE (\S+) (\S+)", text, re.M)})
        types = dict(re.findall(r"^# TYPE (\S+) (\S+)", text, re.M))
        out.append({"method": "GET", "path": "/metrics", "status": status,
                    "metric_names": [f"{n} ({types[n]})" for n in names],
                    "sample": "\n".join(text.splitlines()[:40])})
        st.close()
    finally:
        master.stop()
    text = json.dumps(out, indent=1, ensure_ascii=False)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
