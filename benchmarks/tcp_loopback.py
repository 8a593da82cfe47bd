"""The physical limit of the PG's TCP transport on this host: a plain
socket copy over loopback, with the options the mesh uses.

    python benchmarks/tcp_loopback.py [--sizes 4K,64K,1M,16M,64M]

Two processes ping-pong one message of each size (`sendall` from one
buffer, `recv_into` another; TCP_NODELAY, 4 MiB socket buffers) and print
the median one-way time (half a round trip) and its bandwidth: what
`send_recv` between two ranks could at best reach.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import time

BUF = 4 << 20


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def tune(s: socket.socket) -> None:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUF)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUF)


def recv_exact(s: socket.socket, view: memoryview) -> None:
    while view:
        got = s.recv_into(view)
        if not got:
            raise ConnectionError("closed")
        view = view[got:]


def iters(size: int) -> int:
    return max(5, min(200, (512 << 20) // size))


def echo(port: int, sizes: list[int]) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    tune(s)
    for size in sizes:
        buf = bytearray(size)
        for _ in range(iters(size) + 1):
            recv_exact(s, memoryview(buf))
            s.sendall(buf)
    s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    sizes = [parse_size(x) for x in ap.parse_args().sizes.split(",")]
    lsock = socket.create_server(("127.0.0.1", 0))
    peer = mp.get_context("spawn").Process(target=echo, args=(lsock.getsockname()[1], sizes))
    peer.start()
    s, _ = lsock.accept()
    tune(s)
    print("| size | one-way ms | GB/s |")
    print("|---|---|---|")
    for size in sizes:
        out, back = bytearray(size), bytearray(size)
        times = []
        for i in range(iters(size) + 1):
            start = time.perf_counter()
            s.sendall(out)
            recv_exact(s, memoryview(back))
            if i:  # the first is a warm-up
                times.append((time.perf_counter() - start) / 2)
        sec = statistics.median(times)
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        print(f"| {label} | {sec * 1e3:.3f} | {size / sec / 1e9:.2f} |")
    s.close()
    peer.join()


if __name__ == "__main__":
    main()
