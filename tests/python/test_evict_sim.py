"""The eviction-policy simulator (`benchmarks/evict_sim.py`): its LRU agrees
with the replay's ideal LRU where they must, Belady bounds the others, and
the frequency order keeps the gain docs/benchmarks.md reports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import evict_sim  # noqa: E402
import trace_replay  # noqa: E402

TRACE = Path(trace_replay.default_trace())


def test_lru_one_victim_a_round_is_the_ideal_lru():
    reqs = [[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3]]
    lru = evict_sim.replay(reqs, evict_sim.Rounds(4, 0.25, frequency=False))
    assert lru == 2 / 11 == trace_replay.ideal_lru_hits(reqs, 4)[0] / 11


def test_a_read_outweighs_newer_puts_only_under_frequency():
    # Fill 4; putting 5 evicts 1, used 4 ticks before: a read is worth 2
    # ticks. Read 2, then put 6 to 9: lru evicts 2 (the oldest use) at 9,
    # frequency ranks it 2 ticks later and evicts 6 instead.
    reqs = [[1], [2], [3], [4], [5], [2], [6], [7], [8], [9], [2]]
    lru = evict_sim.replay(reqs, evict_sim.Rounds(4, 0.25, frequency=False))
    freq = evict_sim.replay(reqs, evict_sim.Rounds(4, 0.25, frequency=True))
    assert (lru, freq) == (1 / 11, 2 / 11)


@pytest.mark.skipif(not TRACE.exists(), reason=f"no trace at {TRACE}")
def test_on_the_trace_frequency_beats_lru_and_belady_bounds_all():
    reqs = trace_replay.load_requests(TRACE, 2000)
    row = evict_sim.run(reqs, 2048, 0.05, with_belady=True)
    assert row["frequency"] > row["lru"], row
    for k in ("lru", "frequency", "s3fifo", "ideal_lru"):
        assert row[k] <= row["belady"], (k, row)
