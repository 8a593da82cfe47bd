#!/usr/bin/env python3
"""Distributes one object from a publisher to N consumers with the P2P Store
(`p2p-store-example` processes on this machine, one etcd) and reports the
time until the last consumer has it and what the publisher uploaded.

    cargo build --release -p mooncake-p2p-store
    python3 benchmarks/p2p_store_bench.py --etcd 127.0.0.1:2379 \
        --bin target/release/p2p-store-example --size-mb 1024 --consumers 1 2 4

The time runs from starting the consumers' processes to the last one's
`Object retrieval done` (the byte check after it is not counted).
Consumers keep serving until the last one is done (as nodes of a real
distribution do), then all are stopped. Every consumer checks every byte
against the publisher's pattern. The publisher's upload is the sum of what
the consumers report having read from it (`bytes_from`), in copies of the
object: 1.0 means it sent each shard once.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    def __init__(self, bin_path, etcd, cmd, name, size_mb, shard_mb, extra=()):
        self.server = f"127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            [bin_path, f"--cmd={cmd}", f"--metadata_server={etcd}",
             f"--local_server_name={self.server}", f"--name={name}",
             f"--file_size_mb={size_mb}", f"--shard_size_mb={shard_mb}",
             "--idle_seconds=3600", *extra],
            stdout=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.stamps: dict[str, float] = {}
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.stamps.setdefault(line.split(":")[0], time.monotonic())
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.lines.append("<exit>")
            self.cond.notify_all()

    def wait_for(self, prefix: str, timeout: float = 600) -> str:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                    if line == "<exit>":
                        raise RuntimeError(f"{self.server} exited: {self.lines}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.server}: no {prefix!r} in {self.lines}")
                self.cond.wait(left)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def run(args, consumers: int) -> dict:
    name = f"bench-{os.getpid()}-{time.time_ns()}/model"
    pub = Node(args.bin, args.etcd, "trainer", name, args.size_mb, args.shard_mb)
    nodes = []
    try:
        pub.wait_for("Object registration done")
        start = time.monotonic()
        nodes = [Node(args.bin, args.etcd, "inferencer", name, args.size_mb, args.shard_mb,
                      ["--hold_seconds=3600", f"--parallel={args.parallel}"])
                 for _ in range(consumers)]
        uploaded, own, last = 0, [], start
        for n in nodes:
            n.wait_for("verified ")
            done = n.wait_for("Object retrieval done")
            own.append(int(done.split("duration (ms) ")[1].split()[0]))
            last = max(last, n.stamps["Object retrieval done"])
            from_line = n.wait_for("bytes_from")
            for kv in from_line.split()[1:]:
                seg, count = kv.rsplit("=", 1)
                if seg == pub.server:
                    uploaded += int(count)
        wall = last - start
    finally:
        for n in nodes:
            n.stop()
        pub.stop()
    size = args.size_mb << 20
    return {"consumers": consumers, "wall_s": wall, "slowest_s": max(own) / 1000,
            "upload_copies": uploaded / size, "upload_gib": uploaded / (1 << 30)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--etcd", required=True)
    p.add_argument("--bin", required=True, help="p2p-store-example")
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--shard-mb", type=int, default=64)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--consumers", type=int, nargs="+", default=[1, 2, 4])
    args = p.parse_args()
    print(f"| object | consumers | time to the last copy (s) | slowest consumer's own (s) "
          f"| publisher upload (GiB) | copies |")
    print("|---|---|---|---|---|---|")
    for n in args.consumers:
        r = run(args, n)
        print(f"| {args.size_mb} MiB | {n} | {r['wall_s']:.2f} | {r['slowest_s']:.2f} "
              f"| {r['upload_gib']:.2f} | {r['upload_copies']:.2f} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
