"""Render probe records (JSON from probe_*.py) as markdown tables, one per group.

    python render_md.py store.json engine.json > tables.md
"""

import json
import re
import sys


def outcome(r: dict) -> str:
    if "crash" in r:
        return f"**CRASH** ({r['crash']})"
    if "raises" in r:
        msg = r["message"]
        cut = msg.find("incompatible ")
        if cut >= 0:  # pybind11's overload listing: the first sentence says it all
            msg = msg[: msg.find(".", cut) + 1]
        return f"raises `{r['raises']}`: {_addr(msg)}"
    res = r["result"]
    extra = f" (len {res['len']})" if "len" in res and res["type"] in ("bytes", "bytearray") else ""
    return f"`{_addr(res['repr'])}`{extra} ({res['type']})"


def _addr(text: str) -> str:
    """Object addresses differ on every run; hide them so tables diff cleanly."""
    return re.sub(r" at 0x[0-9a-f]+", "", text)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main() -> None:
    for path in sys.argv[1:]:
        records = json.load(open(path))
        group = None
        for r in records:
            if r["group"] != group:
                group = r["group"]
                print(f"\n#### `{group}`\n")
                print("| # | call | note | outcome | ms |")
                print("|---|---|---|---|---|")
            call = f"`{r['expr']}`"
            if r.get("pre"):
                call = f"`{r['pre']}` then " + call
            print(f"| {r['index']} | {cell(call)} | {cell(r.get('note', ''))} | {cell(outcome(r))} | {r.get('ms', '')} |")


if __name__ == "__main__":
    main()
