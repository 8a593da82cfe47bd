"""The TCP transport for ranks on different hosts: the native
``TcpGroup`` (``crates/mooncake-pg/src/tcp``) runs the shared-memory
group's interface over a TCP mesh, with its own threads reading the peers'
frames and every send and wait running with the GIL released. This module
chooses the transport and sets the mesh up through the store.
"""

from __future__ import annotations

import os
import socket

from .. import _mooncake

_native = _mooncake.pg
TcpGroup = _native.TcpGroup


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


def rendezvous(store, key, rank: int, size: int, slot_bytes: int, timeout_s: float) -> TcpGroup:
    """Publishes this rank's address under ``key(rank)``, connects to every
    peer's."""
    group = TcpGroup(rank, size, slot_bytes)
    store.set(key(rank), f"{local_address()} {group.port}")
    peers = []
    for peer in range(size):
        if peer != rank:
            host, port = store.get(key(peer)).decode().rsplit(" ", 1)
            peers.append((peer, host, int(port)))
    try:
        group.connect_all(peers, timeout_s)
    except BaseException:
        group.close()
        raise
    return group
