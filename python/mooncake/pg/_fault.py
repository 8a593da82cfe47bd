"""A test-only fault hook for the ``mooncake-cpu`` data plane.

It exists so tests can make a rank's data path fail, stall or refuse a
peer the way a broken link would (the reference injects the same faults
with an ``LD_PRELOAD`` shim over its transfer engine). It is off unless
``MOONCAKE_PG_TEST_FAULT`` is set when a group is created, and then the
backend does not consult it at all; production jobs must not set it.

The variable holds rules separated by ``;``; ranks are global ranks, ``N``
counts this process's transfers to that peer from 1:

- ``fail:SRC>DST@N``: on rank SRC, the Nth transfer to DST fails (without
  ``@N``: every one). The rank cannot deliver its part, so it leaves the
  group as ``deactivate_ranks`` on itself would: the operation completes
  unsuccessfully on it and, without it, on its peers; it comes back in
  place with ``join_group``.
- ``stall:SRC>DST@N=SECONDS``: that transfer starts SECONDS late.
- ``refuse:SRC>DST``: rank SRC does not map a process joining as DST
  (``get_peer_state`` reports it not ready; activating it drops it).

A transfer is one round of a collective (the rank's part, posted for its
live peers) or one point-to-point message.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time

ENV = "MOONCAKE_PG_TEST_FAULT"
KINDS = ("fail", "stall", "refuse")


@dataclasses.dataclass(frozen=True)
class Rule:
    kind: str
    src: int
    dst: int
    # None: every transfer to dst.
    nth: int | None = None
    stall_s: float = 0.0


def parse(spec: str) -> list[Rule]:
    """The rules of a ``MOONCAKE_PG_TEST_FAULT`` value; ``ValueError``
    naming the bad rule otherwise."""
    rules = []
    for raw in spec.split(";"):
        text = raw.strip()
        if not text:
            continue
        try:
            kind, _, rest = text.partition(":")
            if kind not in KINDS:
                raise ValueError(f"kind must be one of {', '.join(KINDS)}")
            rest, eq, secs = rest.partition("=")
            if (kind == "stall") != bool(eq):
                raise ValueError("a stall, and only a stall, takes =SECONDS")
            link, at, nth = rest.partition("@")
            if kind == "refuse" and at:
                raise ValueError("refuse takes no @N")
            src, gt, dst = link.partition(">")
            if not gt:
                raise ValueError("the link is SRC>DST")
            rule = Rule(kind, int(src), int(dst), int(nth) if at else None, float(secs) if eq else 0.0)
        except ValueError as exc:
            raise ValueError(f"{ENV}: bad rule {text!r}: {exc}") from None
        if rule.src < 0 or rule.dst < 0 or rule.src == rule.dst:
            raise ValueError(f"{ENV}: bad rule {text!r}: ranks must be distinct and non-negative")
        if rule.nth is not None and rule.nth < 1:
            raise ValueError(f"{ENV}: bad rule {text!r}: N counts from 1")
        if rule.stall_s < 0:
            raise ValueError(f"{ENV}: bad rule {text!r}: a stall cannot be negative")
        rules.append(rule)
    return rules


class TransferFailed(Exception):
    """This rank's transfers to ``ranks`` (group ranks) failed."""

    def __init__(self, ranks: list[int]):
        super().__init__(f"transfers to ranks {sorted(ranks)} failed (injected by {ENV})")
        self.ranks = sorted(ranks)


class Hook:
    """The rules of one process, with its transfer counts per peer."""

    def __init__(self, rules: list[Rule]):
        self.rules = rules
        self._lock = threading.Lock()
        self._sent: collections.Counter = collections.Counter()
        self.injected = 0

    def transfer(self, src: int, dsts: list[int]) -> list[int]:
        """Counts one transfer from ``src`` to each of ``dsts``; sleeps
        for the stalls due and returns the ``dsts`` whose transfer fails."""
        failed, stall = [], 0.0
        with self._lock:
            for dst in dsts:
                self._sent[dst] += 1
                n = self._sent[dst]
                for r in self.rules:
                    if r.src != src or r.dst != dst or r.kind == "refuse":
                        continue
                    if r.nth is not None and r.nth != n:
                        continue
                    self.injected += 1
                    if r.kind == "fail":
                        failed.append(dst)
                    else:
                        stall = max(stall, r.stall_s)
        if stall:
            time.sleep(stall)
        return failed

    def refuses(self, src: int, dst: int) -> bool:
        hit = any(r.kind == "refuse" and r.src == src and r.dst == dst for r in self.rules)
        if hit:
            with self._lock:
                self.injected += 1
        return hit


_hook: tuple[str, Hook] | None = None


def hook() -> Hook | None:
    """The process's hook, or None (the usual case) without the variable.
    One per value, so its counts span this process's groups."""
    global _hook
    spec = os.environ.get(ENV)
    if not spec:
        return None
    if _hook is None or _hook[0] != spec:
        _hook = (spec, Hook(parse(spec)))
    return _hook[1]


def injected_count() -> int:
    """How many faults the hook has injected in this process."""
    return _hook[1].injected if _hook is not None else 0
