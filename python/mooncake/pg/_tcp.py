"""The TCP transport for ranks on different hosts: the native
``TcpGroup`` (``crates/mooncake-pg/src/tcp``) runs the shared-memory
group's interface over a TCP mesh, with its own threads reading the peers'
frames and every send and wait running with the GIL released. This module
chooses the transport and makes a rank's group and address; the
rendezvous itself (``_backend``, ``_grow``) is the same as shared memory's.
"""

from __future__ import annotations

import os
import socket

from .. import _mooncake

_native = _mooncake.pg


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


def new_group(rank: int, size: int, slot_bytes: int):
    """This rank's slots for ``size`` ranks and a listener that takes peers
    in for as long as the group lives; peers attach to it with
    ``attach(rank, address(group), pid, nonce, timeout_s)``."""
    return _native.tcp_group(rank, size, slot_bytes)


def address(group) -> str:
    """``"<host> <port>"``: where peers dial ``group``."""
    return f"{local_address()} {group.port}"
