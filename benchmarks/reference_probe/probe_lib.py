"""Tiny probe runner: evaluate expressions, record exactly what came back.

Each probe is a Python expression (optionally preceded by statements) run in a
shared namespace. A record keeps the result's type and repr, or the
exception's type and message, so two implementations can be diffed line by
line (`diff_probes.py`).

Some calls crash the interpreter (the reference segfaults on a few bad
inputs). So a group of probes runs in a child process that streams one JSON
line per probe to a file, writing a "start" line before each call. When the
child dies, the driver (`run_groups`) records a crash for the probe that had
started, and replays the group from scratch with that probe skipped, on fresh
servers, so every other probe still gets an answer from the same state.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

_MAX_REPR = 300


def describe(value: Any) -> dict[str, Any]:
    if isinstance(value, (bytes, bytearray)):
        head = bytes(value[:32])
        return {"type": type(value).__name__, "len": len(value),
                "repr": repr(head) + ("..." if len(value) > 32 else "")}
    r = repr(value)
    if len(r) > _MAX_REPR:
        r = r[:_MAX_REPR] + "..."
    out: dict[str, Any] = {"type": type(value).__name__, "repr": r}
    if isinstance(value, (list, tuple, dict)):
        out["len"] = len(value)
    return out


class Prober:
    """Runs probes of one group inside the child process."""

    def __init__(self, group: str, ns: dict[str, Any], jsonl: Path, skip: set[int]):
        self.group = group
        self.ns = ns
        self.skip = skip
        self.index = 0
        self.out = open(jsonl, "a", buffering=1)

    def _emit(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()

    def run(self, expr: str, pre: str = "", note: str = "") -> Any:
        idx = self.index
        self.index += 1
        if idx in self.skip:
            return None
        rec: dict[str, Any] = {"group": self.group, "index": idx, "expr": expr}
        if pre:
            rec["pre"] = pre
        if note:
            rec["note"] = note
        self._emit({"start": idx, **{k: v for k, v in rec.items() if k in ("expr", "pre", "note")}})
        t0 = time.perf_counter()
        value = None
        try:
            if pre:
                exec(pre, self.ns)
            value = eval(expr, self.ns)
            rec["result"] = describe(value)
        except Exception as e:  # noqa: BLE001 - recording every failure is the point
            rec["raises"] = type(e).__name__
            rec["message"] = str(e)[:_MAX_REPR]
        rec["ms"] = round((time.perf_counter() - t0) * 1000, 2)
        self._emit(rec)
        shown = rec["result"]["repr"] if "result" in rec else f"{rec['raises']}: {rec['message']}"
        print(f"[{self.group}] {expr} -> {shown}", file=sys.stderr, flush=True)
        return value


def run_groups(groups: list[str], child_argv: Callable[[str, Path, set[int]], list[str]],
               servers: Callable[[str], Any], workdir: Path, timeout: float = 300) -> list[dict[str, Any]]:
    """Run each group in a child; on a crash, note it and replay without that probe.

    `servers(group)` starts fresh servers and returns an object with `.stop()` and
    whatever `child_argv(group, jsonl, skip)` needs to build the command line.
    """
    records: list[dict[str, Any]] = []
    for group in groups:
        skip: set[int] = set()
        crashes: dict[int, dict[str, Any]] = {}
        for attempt in range(50):
            jsonl = workdir / f"{group}.{attempt}.jsonl"
            srv = servers(group)
            try:
                argv = child_argv(group, jsonl, skip, srv)
                try:
                    cp = subprocess.run(argv, timeout=timeout, stdout=subprocess.DEVNULL,
                                        stderr=open(workdir / f"{group}.{attempt}.stderr", "wb"))
                    rc: int | str = cp.returncode
                except subprocess.TimeoutExpired:
                    rc = f"timeout after {timeout}s"
            finally:
                srv.stop()
            lines = [json.loads(ln) for ln in jsonl.read_text().splitlines()] if jsonl.exists() else []
            done = {r["index"]: r for r in lines if "index" in r}
            started = [r["start"] for r in lines if "start" in r]
            if rc == 0:
                merged = {**done, **crashes}
                records += [merged[i] for i in sorted(merged)]
                break
            last = started[-1] if started else None
            if last is None or last in done:
                raise RuntimeError(f"group {group}: child failed ({rc}) outside a probe; see {workdir}")
            tail = (workdir / f"{group}.{attempt}.stderr").read_text(errors="replace").strip().splitlines()[-3:]
            how = f"signal {-rc}" if isinstance(rc, int) and rc < 0 else f"exit {rc}"
            info = next(r for r in reversed(lines) if r.get("start") == last)
            crashes[last] = {"group": group, "index": last,
                             **{k: v for k, v in info.items() if k in ("expr", "pre", "note")},
                             "crash": how, "stderr_tail": tail}
            skip.add(last)
            print(f"[{group}] probe #{last} crashed the interpreter ({how}); replaying without it",
                  file=sys.stderr, flush=True)
        else:
            raise RuntimeError(f"group {group}: too many crashes")
    return records


def dump(records: list[dict[str, Any]], path: str | None) -> None:
    text = json.dumps(records, indent=1)
    if path:
        Path(path).write_text(text + "\n")
    else:
        print(text)
