"""Each benchmark script draws its chart from the report it writes (the
report shapes below are the scripts' own; the trace replay's real tiny run
is in test_trace_replay.py). The drawings parse as SVG and carry one mark
per number reported."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import compare  # noqa: E402
import first_fill  # noqa: E402
import master_memory  # noqa: E402
import store_bench  # noqa: E402
import tier_probe  # noqa: E402

NS = "{http://www.w3.org/2000/svg}"


def marks(path: Path) -> list[tuple[str | None, str | None, float]]:
    root = ET.parse(path).getroot()
    assert root.tag == f"{NS}svg"
    out = []
    for e in root.iter():
        if e.get("class") in ("bar", "point"):
            out.append((e.get("data-series"), e.get("data-label"), float(e.get("data-value"))))
    return out


def texts(path: Path) -> list[str]:
    return [t.text or "" for t in ET.parse(path).getroot().iter(f"{NS}text")]


def store_report(scale: float, topology: str = "local") -> dict:
    rows = [{"op": op, "size": size, "batch": 1, "n": 10, "p50_us": 10.0 * scale, "p99_us": 20.0,
             "mean_us": 11.0, "ops_s": 1000.0, "gb_s": scale * size / 4096, "errors": 0, "verify_errors": 0}
            for op in ("put", "get") for size in (4096, 1 << 20)]
    return {"label": "", "topology": topology, "force_tcp": False, "batch": 16, "seconds_per_phase": 1,
            "results": rows}


def test_store_bench_draws_gb_s_and_p50_by_op_and_size(tmp_path):
    args = store_bench.parse_args(["--master", "m", "--metadata", "x", "--json", str(tmp_path / "run.json")])
    path = store_bench.chart_path(args)
    assert path == tmp_path / "run.svg"
    store_bench.draw(store_report(1.0), path)
    got = marks(path)
    assert len(got) == 8  # 2 ops x 2 sizes, GB/s and p50
    assert ("get", "1 MiB", 256.0) in got
    assert "1 MiB" in texts(path) and "put" in texts(path)


def test_first_fill_draws_both_phases(tmp_path):
    out = {"size": 1 << 20, "count": 8, "segment_size": 1 << 30, "memcpy_gb_s": 20.0, "delay": 0.0,
           "first": {"put": 0.5, "put_from": 0.8, "get": 2.0, "get_into": 3.0},
           "warm": {"put": 2.0, "put_from": 2.5, "get": 2.5, "get_into": 3.5}}
    path = first_fill.draw(out, tmp_path / "first_fill.svg")
    got = marks(path)
    assert ("first", "put", 0.5) in got and ("warm", "get_into", 3.5) in got
    assert len(got) == 8
    assert any("memcpy 20.00 GB/s" in t for t in texts(path))


def test_master_memory_draws_rss(tmp_path):
    report = {"objects_requested": 1000, "object_size": 4096, "failed_puts": 0, "master_key_count": 1000,
              "fill_seconds": 1.0, "master_rss_before": 10 << 20, "master_rss_after": 30 << 20,
              "rss_bytes_per_object": 20971.5, "segment_bytes": 1 << 30}
    path = master_memory.draw(report, tmp_path / "m.svg")
    assert [v for _, _, v in marks(path)] == [10.0, 30.0, 20971.5]


def test_tier_probe_draws_counts_and_rates(tmp_path):
    result = {"system": "ours", "mode": "put", "keys": 409, "acked": 400, "read_ok": 399, "missing": 1,
              "wrong": 0, "rejected_200": 3, "put_mb_s": 100.0, "get_mb_s": 300.0,
              "restart": {"how": "kill", "recovered": 398, "of": 400, "first_readable_s": 1.0}}
    path = tier_probe.draw(result, tmp_path / "t.svg")
    got = {label: v for _, label, v in marks(path)}
    assert got["acked"] == 400 and got["read_ok"] == 399 and got["recovered after kill"] == 398
    assert got["put"] == 100.0 and got["get"] == 300.0


def test_compare_draws_store_te_and_trace(tmp_path):
    trace = [{"system": n, "tier": t, "requests": 10, "hit_rate": 0.5, "ideal_lru_hit_rate": 0.6,
              "lookup_ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0}} for n in ("reference", "ours")
             for t in ("none", "ssd")]
    te = [{"op": op, "block_size": b, "threads": 2, "gb_s": 1.0} for op in ("read", "write")
          for b in (64 << 10, 1 << 20)]
    results = {"systems": {
        "reference": {"store": {"local/default": store_report(1.0)}, "te": te, "trace": trace[:2]},
        "ours": {"store": {"local/default": store_report(4.0)}, "te": te, "te_tcp": te, "trace": trace[2:]},
    }, "redis": [{"op": "get", "size": 4096, "gb_s": 0.02}, {"op": "put", "size": 4096, "gb_s": 0.01}]}
    path = compare.chart(results, ["reference", "ours"], tmp_path / "compare.svg")
    got = marks(path)
    points = [m for m in got if m[0] and m[0].endswith((" get", " put")) and m[1] is None]
    assert ("ours get", None, 1024.0) in points  # 4.0 x 1 MiB / 4096
    assert ("redis get", None, 0.02) in points
    assert len([m for m in got if m[0] == "ours forced TCP"]) == 4
    assert len([m for m in got if m[0] == "hit rate"]) == 4
    assert "local/default" in texts(path)
    assert compare.chart({"systems": {"reference": {}}}, ["reference"], tmp_path / "none.svg") is None
