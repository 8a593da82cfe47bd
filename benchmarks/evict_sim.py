"""Simulate the master's victim orders on a request trace
(`shared/traces/*.jsonl`) and print the block hit rate of each at several
cache sizes, beside the ideal LRU and Belady's optimum.

The replay rule is `trace_replay.py`'s: a request looks its blocks up, the
leading blocks found are hits (and are read), and the missing ones are put.
The master's orders run in rounds as the master does: when a put finds the
cache full, one round frees `--ratio` of the capacity, taking the lowest
ranks first. The clock counts uses (reads and puts), one tick each.

- `lru`: `--eviction_policy=lru`, the oldest use first (ties cannot
  happen: the order is exact).
- `frequency`: `--eviction_policy=frequency` (`master/state/frequency.rs`):
  each read since the put (up to 3) ranks a block as if used later by half
  the age of the last round's boundary.
- `s3fifo`: S3-FIFO (a small FIFO of 10%, a main FIFO with 2-bit
  frequencies, a ghost queue), one victim at a time, for comparison.
- `ideal_lru`: one victim at a time, `trace_replay.ideal_lru_hits`.
- `belady`: evicts the block whose next lookup is furthest (an upper
  bound for orders that admit every put).

    python benchmarks/evict_sim.py --requests 2000 --sizes 512,1024,2048
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trace_replay  # noqa: E402

MAX_READS = 3


def replay(requests: list[list[int]], cache) -> float:
    """Block hit rate of `cache` (has/read/put) under the replay rule."""
    hits = blocks = 0
    for ids in requests:
        n = 0
        while n < len(ids) and cache.has(ids[n]):
            n += 1
        for i in ids[:n]:
            cache.read(i)
        hits += n
        blocks += len(ids)
        for j in range(n, len(ids)):
            if j > n and cache.has(ids[j]):
                continue
            cache.put(ids[j])
    return hits / max(1, blocks)


class Rounds:
    """The master's rounds: a put into a full cache frees `ratio` of it,
    lowest rank first; rank = (last use + per_read * reads). `per_read` is
    0 for LRU, else half the age of the last round's boundary."""

    def __init__(self, capacity: int, ratio: float, frequency: bool):
        self.capacity, self.batch = capacity, max(1, int(ratio * capacity))
        self.frequency, self.per_read, self.now = frequency, 0, 0
        self.used: dict[int, int] = {}
        self.reads: dict[int, int] = {}

    def has(self, k: int) -> bool:
        return k in self.used

    def read(self, k: int) -> None:
        self.now += 1
        self.used[k] = self.now
        self.reads[k] = min(MAX_READS, self.reads[k] + 1)

    def put(self, k: int) -> None:
        self.now += 1
        self.used[k] = self.now
        self.reads[k] = 0
        if len(self.used) > self.capacity:
            w = self.per_read
            rank = lambda k: (self.used[k] + w * self.reads[k], self.used[k])  # noqa: E731
            victims = heapq.nsmallest(self.batch, self.used, key=rank)
            boundary = rank(victims[-1])[0]
            for v in victims:
                del self.used[v], self.reads[v]
            if self.frequency:
                self.per_read = max(0, self.now - boundary) // 2


class S3Fifo:
    def __init__(self, capacity: int):
        self.small_cap = max(1, capacity // 10)
        self.main_cap = capacity - self.small_cap
        self.small: OrderedDict[int, None] = OrderedDict()
        self.main: OrderedDict[int, None] = OrderedDict()
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.freq: dict[int, int] = {}

    def has(self, k: int) -> bool:
        return k in self.small or k in self.main

    def read(self, k: int) -> None:
        self.freq[k] = min(3, self.freq[k] + 1)

    def put(self, k: int) -> None:
        if k in self.ghost:
            del self.ghost[k]
            self.main[k] = None
        else:
            self.small[k] = None
        self.freq[k] = 0
        while len(self.small) + len(self.main) > self.small_cap + self.main_cap:
            if len(self.small) >= self.small_cap:
                self._evict_small()
            else:
                self._evict_main()

    def _evict_small(self) -> None:
        k, _ = self.small.popitem(last=False)
        if self.freq[k] > 0:
            self.freq[k] = 0
            self.main[k] = None
            if len(self.main) > self.main_cap:
                self._evict_main()
        else:
            del self.freq[k]
            self.ghost[k] = None
            if len(self.ghost) > self.main_cap:
                self.ghost.popitem(last=False)

    def _evict_main(self) -> None:
        while self.main:
            k, _ = self.main.popitem(last=False)
            if self.freq[k] > 0:
                self.freq[k] -= 1
                self.main[k] = None
            else:
                del self.freq[k]
                return


def belady(requests: list[list[int]], capacity: int) -> float:
    """Hit rate when the block looked up furthest ahead goes first."""
    lookups = [i for ids in requests for i in ids]
    nxt = [0] * len(lookups)
    seen: dict[int, int] = {}
    for p in range(len(lookups) - 1, -1, -1):
        nxt[p] = seen.get(lookups[p], 1 << 60)
        seen[lookups[p]] = p
    cache: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    hits = blocks = p = 0
    for ids in requests:
        n = 0
        while n < len(ids) and ids[n] in cache:
            n += 1
        hits += n
        blocks += len(ids)
        for i in ids:
            if i not in cache and len(cache) >= capacity:
                while True:
                    neg, k = heapq.heappop(heap)
                    if cache.get(k) == -neg:
                        del cache[k]
                        break
            cache[i] = nxt[p]
            heapq.heappush(heap, (-nxt[p], i))
            p += 1
    return hits / max(1, blocks)


def run(requests: list[list[int]], capacity: int, ratio: float, with_belady: bool) -> dict:
    ideal_hits, ideal_blocks = trace_replay.ideal_lru_hits(requests, capacity)
    row = {
        "capacity_blocks": capacity,
        "lru": replay(requests, Rounds(capacity, ratio, False)),
        "frequency": replay(requests, Rounds(capacity, ratio, True)),
        "s3fifo": replay(requests, S3Fifo(capacity)),
        "ideal_lru": ideal_hits / max(1, ideal_blocks),
    }
    if with_belady:
        row["belady"] = belady(requests, capacity)
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=None, help="trace file (default: shared/traces/conversation_trace.jsonl)")
    p.add_argument("--requests", type=int, default=1 << 30, help="first N requests (default: all)")
    p.add_argument("--sizes", default="4096,8192,16384,32768", help="cache sizes in blocks")
    p.add_argument("--ratio", type=float, default=0.05, help="share of the cache one round frees")
    p.add_argument("--no-belady", action="store_true")
    args = p.parse_args(argv)
    trace = Path(args.trace or trace_replay.default_trace())
    requests = trace_replay.load_requests(trace, args.requests)
    unique = len({i for r in requests for i in r})
    for size in (int(s) for s in args.sizes.split(",")):
        row = run(requests, size, args.ratio, not args.no_belady)
        print(json.dumps({"trace": trace.name, "requests": len(requests), "unique_blocks": unique, **row}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
