"""The TCP transport: the shared-memory group's interface over a TCP mesh,
for ranks on different hosts.

Every rank keeps a local copy of each peer's two collective slots and
control words. Posting a round's word sends, before the word, the bytes
this rank wrote into that round's slot (the range the plane touched), so
a peer that sees the word reads a complete slot from its copy. The
collective schedules are the same as over shared memory: a slot is only
rewritten after every peer posted Done for it, and TCP keeps the order,
so a copy is never overwritten while its reader still needs it.
Point-to-point messages travel as frames into the receiver's inbox; the
receiver acknowledges each one it reads (a send completes when its peer
has read it, as with the mailboxes).

A peer is dead when its connection ends without the goodbye a rank
sends when it closes its group: a killed process's sockets are
closed by its kernel at once; a host that vanishes is found by TCP
keepalive (``KEEPALIVE_S``) or the retransmission timeout of unacknowledged
data (``TCP_USER_TIMEOUT``), whichever applies.
"""

from __future__ import annotations

import collections
import ctypes
import os
import socket
import struct
import threading
import time

import torch

from .. import _mooncake

_native = _mooncake.pg
# kind, flag, slot, value, tag, offset, length
_HEADER = struct.Struct("<BBHIqQQ")
_WORD, _MSG, _ACK, _BYE = 1, 2, 3, 4
FLAGS = 5
ARRIVE, REDUCED = 0, 1
# A dead host is found within about idle + count x interval seconds.
KEEPALIVE_S = (2, 1, 3)


def transport(store, key, rank: int, size: int) -> str:
    """``"tcp"`` or ``"shm"``: ``MOONCAKE_PG_TRANSPORT`` when set, else
    TCP when the ranks are not all on this host (every rank publishes its
    host's identity and reads all of them, so all choose alike)."""
    chosen = forced()
    if chosen:
        return chosen
    me = host_identity()
    store.set(key(rank), me)
    hosts = {store.get(key(r)).decode() for r in range(size)}
    return "shm" if hosts == {me} else "tcp"


def forced() -> str | None:
    """The transport ``MOONCAKE_PG_TRANSPORT`` names, if any."""
    chosen = os.environ.get("MOONCAKE_PG_TRANSPORT", "").strip().lower()
    if chosen and chosen not in ("tcp", "shm"):
        raise ValueError(f"MOONCAKE_PG_TRANSPORT={chosen!r}: expected 'tcp' or 'shm'")
    return chosen or None


def host_identity() -> str:
    """What ranks sharing ``/dev/shm`` and their processes share: the
    host's boot and its name."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()} {boot}"


def local_address() -> str:
    """The address peers reach this rank at: ``MOONCAKE_PG_HOST``, else
    this host name's address."""
    host = os.environ.get("MOONCAKE_PG_HOST")
    if host:
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _reached(cur: int, target: int) -> bool:
    return ((cur - target) & 0xFFFFFFFF) < 0x80000000


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = KEEPALIVE_S
    for opt, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, (idle + interval * count) * 1000)


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    while view:
        got = sock.recv_into(view)
        if not got:
            raise ConnectionError("peer closed")
        view = view[got:]


class TcpGroup:
    """One rank's connections to its peers, with the calls the plane and
    the backend make on a shared-memory group."""

    def __init__(self, rank: int, size: int, slot_bytes: int, timeout_s: float):
        self.rank = rank
        self.size = size
        self.slot_bytes = slot_bytes
        self._timeout_s = timeout_s
        self._slots = [[torch.zeros(slot_bytes, dtype=torch.uint8) for _ in range(2)] for _ in range(size)]
        self._words = [[0] * FLAGS for _ in range(size)]
        self._dirty = [None, None]
        self._out: dict[int, socket.socket] = {}
        self._out_locks = collections.defaultdict(threading.Lock)
        self._inbox = collections.defaultdict(collections.deque)
        self._read = collections.Counter()
        self._sent = collections.Counter()
        self._acked = collections.Counter()
        self._dead: set[int] = set()
        self._cv = threading.Condition()
        self._closed = False
        self._listener = socket.create_server(("0.0.0.0", 0), backlog=max(size, 8))
        self.port = self._listener.getsockname()[1]

    # -- setup -----------------------------------------------------------
    def connect_all(self, addresses: dict[int, tuple[str, int]]) -> None:
        """Opens a connection to every peer and accepts one from each."""
        accepter = threading.Thread(target=self._accept, args=(len(addresses),), daemon=True)
        accepter.start()
        deadline = time.monotonic() + self._timeout_s
        for peer, (host, port) in sorted(addresses.items()):
            while True:
                try:
                    sock = socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.1))
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"mooncake-cpu: cannot reach rank {peer} at {host}:{port}: {exc}") from None
                    time.sleep(0.05)
            sock.settimeout(None)
            _tune(sock)
            sock.sendall(struct.pack("<I", self.rank))
            self._out[peer] = sock
        accepter.join(max(deadline - time.monotonic(), 0.0))
        if accepter.is_alive():
            raise RuntimeError("mooncake-cpu: peers did not connect back in time")

    def _accept(self, n: int) -> None:
        for _ in range(n):
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            _tune(sock)
            head = bytearray(4)
            _recv_exact(sock, memoryview(head))
            peer = struct.unpack("<I", head)[0]
            threading.Thread(target=self._reader, args=(peer, sock), daemon=True,
                             name=f"mooncake-pg-tcp-{peer}").start()

    def _reader(self, peer: int, sock: socket.socket) -> None:
        head = bytearray(_HEADER.size)
        try:
            while True:
                _recv_exact(sock, memoryview(head))
                kind, flag, slot, value, tag, off, n = _HEADER.unpack(head)
                if kind == _WORD:
                    if n:
                        _recv_exact(sock, memoryview(self._slots[peer][slot].numpy())[off : off + n])
                    with self._cv:
                        self._words[peer][flag] = value
                        self._cv.notify_all()
                elif kind == _MSG:
                    data = bytearray(n)
                    _recv_exact(sock, memoryview(data))
                    with self._cv:
                        self._inbox[peer].append((tag, data))
                        self._cv.notify_all()
                elif kind == _ACK:
                    with self._cv:
                        self._acked[peer] = off
                        self._cv.notify_all()
                elif kind == _BYE:
                    # The peer closed its group, its process lives on: it
                    # is not dead (as over shared memory, where its pid
                    # still runs); a wait for it times out.
                    sock.close()
                    return
                else:
                    raise ConnectionError(f"bad frame kind {kind}")
        except (OSError, ConnectionError):
            pass
        sock.close()
        with self._cv:
            self._dead.add(peer)
            self._cv.notify_all()

    def _send(self, peer: int, header: bytes, data=None) -> bool:
        """False when the peer is gone."""
        if peer in self._dead:
            return False
        try:
            with self._out_locks[peer]:
                sock = self._out[peer]
                sock.sendall(header)
                if data is not None and len(data):
                    sock.sendall(data)
            return True
        except OSError:
            with self._cv:
                self._dead.add(peer)
                self._cv.notify_all()
            return False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._listener.close()
        for peer in list(self._out):
            self._send(peer, _HEADER.pack(_BYE, 0, 0, 0, 0, 0, 0))
        for sock in self._out.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def connect(self, peer: int, path: str, pid: int) -> None:
        raise RuntimeError("mooncake-cpu over TCP cannot take in a rank after setup")

    # -- what the plane uses -------------------------------------------
    def connected(self, rank: int) -> bool:
        return 0 <= rank < self.size

    def slot_addr(self, rank: int, slot: int) -> int:
        return self._slots[rank][slot].data_ptr()

    def touch(self, slot: int, lo: int, hi: int) -> None:
        """This rank wrote bytes ``lo..hi`` of its slot: they go with the
        round's next post."""
        d = self._dirty[slot]
        self._dirty[slot] = (lo, hi) if d is None else (min(d[0], lo), max(d[1], hi))

    def clean(self, slot: int) -> None:
        self._dirty[slot] = None

    def post(self, flag: int, value: int) -> None:
        slot, data, lo = 0, None, 0
        if flag in (ARRIVE, REDUCED) and self._dirty[value & 1] is not None:
            slot = value & 1
            lo, hi = self._dirty[slot]
            data = memoryview(self._slots[self.rank][slot].numpy())[lo:hi]
        header = _HEADER.pack(_WORD, flag, slot, value, 0, lo, len(data) if data is not None else 0)
        with self._cv:
            self._words[self.rank][flag] = value
        for peer in self._out:
            self._send(peer, header, data)

    def flag(self, rank: int, flag: int) -> int:
        with self._cv:
            return self._words[rank][flag]

    def dead(self, ranks) -> list[int]:
        with self._cv:
            return [r for r in ranks if r in self._dead]

    def _wait_for(self, ready, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while not ready():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("timed out waiting for a peer rank")
                self._cv.wait(left)

    def wait(self, ranks, flag: int, value: int, timeout_s: float) -> list[int]:
        others = [r for r in ranks if r != self.rank]

        def settled():
            return all(_reached(self._words[r][flag], value) or r in self._dead for r in others)

        self._wait_for(settled, timeout_s)
        with self._cv:
            return [r for r in others if not _reached(self._words[r][flag], value)]

    # -- point to point ------------------------------------------------
    def _failure(self, peer: int):
        return _native.PeerFailure(f"ranks [{peer}] of the group are dead", [peer])

    def send(self, dst: int, tag: int, ptr: int, n: int, timeout_s: float) -> int:
        data = memoryview((ctypes.c_uint8 * n).from_address(ptr)) if n else None
        self._sent[dst] += 1
        if not self._send(dst, _HEADER.pack(_MSG, 0, 0, 0, tag, 0, n), data):
            raise self._failure(dst)
        return self._sent[dst]

    def try_send(self, dst: int, tag: int, ptr: int, n: int):
        # Small messages only: a large one may block on the socket, which
        # the caller's thread must not.
        if n > 64 << 10:
            return None
        return self.send(dst, tag, ptr, n, self._timeout_s)

    def wait_read(self, dst: int, end: int, timeout_s: float) -> None:
        self._wait_for(lambda: self._acked[dst] >= end or dst in self._dead, timeout_s)
        with self._cv:
            if self._acked[dst] < end:
                raise self._failure(dst)

    def recv_header(self, src: int, timeout_s: float) -> tuple[int, int]:
        self._wait_for(lambda: self._inbox[src] or src in self._dead, timeout_s)
        with self._cv:
            if not self._inbox[src]:
                raise self._failure(src)
            tag, data = self._inbox[src][0]
            return tag, len(data)

    def recv_body(self, src: int, ptr: int, n: int, timeout_s: float) -> None:
        with self._cv:
            _, data = self._inbox[src].popleft()
            self._read[src] += 1
            count = self._read[src]
        if n:
            ctypes.memmove(ptr, (ctypes.c_uint8 * n).from_buffer(data), n)
        self._send(src, _HEADER.pack(_ACK, 0, 0, 0, 0, count, 0))

    def pending(self, src: int) -> bool:
        with self._cv:
            return bool(self._inbox[src])


def rendezvous(store, key, rank: int, size: int, slot_bytes: int, timeout_s: float) -> TcpGroup:
    """Publishes this rank's address under ``key(rank)``, connects to every
    peer's."""
    group = TcpGroup(rank, size, slot_bytes, timeout_s)
    store.set(key(rank), f"{local_address()} {group.port}")
    addresses = {}
    for peer in range(size):
        if peer != rank:
            host, port = store.get(key(peer)).decode().rsplit(" ", 1)
            addresses[peer] = (host, int(port))
    try:
        group.connect_all(addresses)
    except BaseException:
        group.close()
        raise
    return group
