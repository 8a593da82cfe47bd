"""A small run of the trace replay benchmark (`benchmarks/trace_replay.py`)
against the installed package, so the script keeps working: a few hundred
requests of the conversation trace with tiny blocks, memory only and with
the SSD tier. Timings are not checked; the counts are, and the chart drawn
from them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import trace_replay  # noqa: E402

TRACE = Path(trace_replay.default_trace())
REQUESTS = 300


def test_ideal_lru_counts_leading_hits_and_evicts_the_least_recent():
    reqs = [[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3]]
    # Capacity 4: [1,2,3] misses 3; [1,2,4] hits 1,2; [5,6] evicts 3 and 1
    # (least recent); the last request misses at its first block.
    assert trace_replay.ideal_lru_hits(reqs, 4) == (2, 11)
    assert trace_replay.ideal_lru_hits(reqs, 100) == (2 + 3, 11)


@pytest.mark.skipif(not TRACE.exists(), reason=f"no trace at {TRACE}")
@pytest.mark.parametrize("tier", ["none", "ssd"])
def test_a_small_replay_runs_and_hits(tier, tmp_path):
    venv = Path(sys.prefix)
    args = trace_replay.parse([
        "--venv", str(venv), "--tier", tier, "--requests", str(REQUESTS),
        "--block-bytes", "4096", "--segment-mib", "2", "--tier-mib", "6", "--verify",
        "--timeout", "600",
    ])
    r = trace_replay.run(args)
    assert r["requests"] == REQUESTS
    assert r["unique_over_capacity"] > 1, r
    assert r["failed_puts"] == 0 and r["wrong_requests"] == 0, r
    assert 0 < r["hit_rate"] <= 1 and 0 < r["ideal_lru_hit_rate"] <= 1, r
    assert r["lookup_ms"]["p50"] > 0, r
    # Its chart: the hit rates and the three lookup quantiles of this run.
    import xml.etree.ElementTree as ET

    svg = ET.parse(trace_replay.draw([r], tmp_path / "trace.svg")).getroot()
    values = sorted(float(e.get("data-value")) for e in svg.iter() if e.get("class") == "bar")
    assert values == sorted([100 * r["hit_rate"], 100 * r["ideal_lru_hit_rate"], *r["lookup_ms"].values()])
