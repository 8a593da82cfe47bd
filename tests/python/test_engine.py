"""mooncake.engine.TransferEngine against the reference's observable behaviour:
return codes, argument errors, and transfers between engines in this process
and in another process, over P2PHANDSHAKE and HTTP metadata servers."""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time

import numpy as np
import pytest

import procs
from pymeta import PyMetadataServer
from mooncake.engine import Read, TransferEngine, TransferNotify, TransferOpcode, Write

MB = 1 << 20


_names = {}


def make_engine(metadata="P2PHANDSHAKE"):
    """An engine on loopback. With P2PHANDSHAKE its segment is named
    host:rpc_port; with a metadata server, by the local_hostname given (which
    must then be unique, so it carries a free port), as in the reference."""
    e = TransferEngine()
    local = "127.0.0.1" if metadata == "P2PHANDSHAKE" else f"127.0.0.1:{procs.free_port()}"
    assert e.initialize(local, metadata, "tcp", "") == 0
    _names[id(e)] = None if metadata == "P2PHANDSHAKE" else local
    return e


def name_of(e):
    return _names.get(id(e)) or f"127.0.0.1:{e.get_rpc_port()}"


@pytest.fixture(scope="module")
def pair():
    """Two engines of this process, each with a 1 MiB managed buffer."""
    a, b = make_engine(), make_engine()
    ba, bb = a.allocate_managed_buffer(MB), b.allocate_managed_buffer(MB)
    assert ba and bb
    yield a, b, ba, bb
    a.free_managed_buffer(ba, MB)
    b.free_managed_buffer(bb, MB)


def poll_notifies(engine, want=1, rounds=200):
    got = []
    for _ in range(rounds):
        got += [(n.name, n.msg) for n in engine.get_notifies()]
        if len(got) >= want:
            break
        time.sleep(0.02)
    return got


# ---- types -------------------------------------------------------------


def test_opcode_enum_like_the_reference():
    assert list(TransferOpcode.__members__) == ["Read", "Write"]
    assert int(TransferOpcode.Read) == 0 and int(TransferOpcode.Write) == 1
    assert TransferOpcode(1) == TransferOpcode.Write == Write
    assert TransferOpcode.READ == Read and TransferOpcode.WRITE == Write
    assert TransferOpcode.Write.name == "Write" and TransferOpcode.Write.value == 1
    assert TransferEngine.TransferOpcode is TransferOpcode
    with pytest.raises(ValueError):
        TransferOpcode(7)


def test_notify_fields():
    n = TransferNotify()
    assert (n.name, n.msg) == ("", "")
    n = TransferNotify("done", "chunk 1")
    assert (n.name, n.msg) == ("done", "chunk 1")
    n.msg = "changed"
    assert n.msg == "changed"


# ---- lifecycle and buffers ---------------------------------------------------


def test_calls_before_initialize_fail_cleanly():
    e = TransferEngine()
    assert e.get_rpc_port() == 0
    assert e.allocate_managed_buffer(100) == 0
    assert e.register_memory(1 << 40, 10) == -1
    assert e.transfer_sync_write("127.0.0.1:1", 0, 0, 1) == -1
    assert e.transfer_submit_write("127.0.0.1:1", 0, 0, 1) == 0
    assert e.batch_transfer_async_write("127.0.0.1:1", [0], [0], [1]) == 0
    assert e.transfer_check_status(1) == -1
    assert e.get_first_buffer_address("x") == 0
    assert e.get_notifies() == []
    with pytest.raises(ValueError):
        e.get_engine()


def test_initialize_again_replaces_the_engine():
    e = make_engine()
    first = e.get_rpc_port()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "mlx5_0") == 0
    assert e.get_rpc_port() > 0
    assert first > 0


def test_initialize_bad_metadata_server_fails():
    e = TransferEngine()
    assert e.initialize("127.0.0.1", f"http://127.0.0.1:{procs.free_port()}/metadata", "tcp", "") != 0
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "no_such_protocol", "") != 0


def test_initialize_ext_names_the_backend(metadata_server):
    e = TransferEngine()
    host_port = metadata_server.split("//")[1].split("/")[0]
    # A bare host:port with type "http" is the HTTP server's /metadata endpoint.
    assert e.initialize_ext("127.0.0.1", metadata_server, "tcp", "", "http") == 0
    assert e.get_rpc_port() > 0
    assert host_port


def test_managed_buffers(pair):
    a, _, ba, _ = pair
    assert a.allocate_managed_buffer(0) != 0
    assert a.allocate_managed_buffer(1 << 50) == 0
    assert a.allocate_managed_buffer(1 << 45) == 0, "more than the machine has"
    with pytest.raises(TypeError):
        a.allocate_managed_buffer(-1)
    x = a.allocate_managed_buffer(4096)
    assert x % 4096 == 0
    assert a.read_bytes_from_buffer(x, 16) == bytes(16), "managed memory starts zeroed"
    assert a.free_managed_buffer(x, 4096) == 0
    assert a.free_managed_buffer(x, 4096) == 0, "the reference returns 0 for unknown buffers too"


def test_write_and_read_bytes(pair):
    a, _, ba, _ = pair
    assert a.write_bytes_to_buffer(ba, b"hello world", 11) == 0
    assert a.read_bytes_from_buffer(ba, 11) == b"hello world"
    assert a.write_bytes_to_buffer(ba, "str ok", 6) == 0
    assert a.read_bytes_from_buffer(ba, 6) == b"str ok"
    assert a.write_bytes_to_buffer(ba, bytearray(b"ba"), 2) == 0
    assert a.write_bytes_to_buffer(ba, b"xy", 6) == 0, "`length` bytes are written: the data, then zeros"
    assert a.read_bytes_from_buffer(ba, 7) == b"xy\0\0\0\0w"
    assert a.read_bytes_from_buffer(ba, 0) == b""
    # plain process memory (not managed) works as well
    arr = np.zeros(64, np.uint8)
    assert a.write_bytes_to_buffer(arr.ctypes.data, b"\x01\x02", 2) == 0
    assert a.read_bytes_from_buffer(arr.ctypes.data, 2) == b"\x01\x02"


def test_bad_addresses_never_crash(pair):
    a, _, _, _ = pair
    for addr in (0, 8, 4096, (1 << 64) - 16):
        assert a.write_bytes_to_buffer(addr, b"x" * 8, 8) == -1
        with pytest.raises(ValueError):
            a.read_bytes_from_buffer(addr, 8)
    code = ctypes.cast(ctypes.pythonapi.Py_IncRef, ctypes.c_void_p).value
    assert a.write_bytes_to_buffer(code, b"x", 1) == -1, "read-only code pages"
    with pytest.raises(TypeError):
        a.write_bytes_to_buffer(-1, b"x", 1)
    with pytest.raises(TypeError):
        a.write_bytes_to_buffer(1, 123, 1)
    with pytest.raises(TypeError):
        a.read_bytes_from_buffer(1, -1)


def test_register_memory_codes(pair):
    a, _, _, _ = pair
    arr = np.zeros(8192, np.uint8)
    p = arr.ctypes.data
    assert a.register_memory(p, 4096) == 0
    assert a.register_memory(p, 4096) == -7, "overlap"
    assert a.unregister_memory(p) == 0
    assert a.unregister_memory(p) == -3, "not registered"
    assert a.register_memory(p, 0) == -1, "zero length"
    assert a.register_memory(8, 4096) == -1, "not memory of this process"
    assert a.register_memory(0, 4096) == -1, "null (the reference says 0)"
    assert a.batch_register_memory([p, p + 4096], [1024, 1024]) == 0
    assert a.batch_unregister_memory([p, p + 4096]) == 0
    assert a.batch_register_memory([p], [1, 2]) == -1, "length mismatch"
    assert a.unregister_memory(p) == -3, "a refused batch registers nothing"
    assert a.batch_unregister_memory([p]) == -3
    assert a.register_memory(p, 4096, "cpu:0") == 0
    assert a.unregister_memory(p) == 0


def test_host_mem_free_refuses_memory_an_engine_registered():
    from mooncake.store import MooncakeHostMemAllocator

    e = make_engine()
    alloc = MooncakeHostMemAllocator()
    p, q = alloc.alloc(1 << 16), alloc.alloc(1 << 16)
    assert e.register_memory(p, 1 << 16) == 0
    assert e.batch_register_memory([q], [4096]) == 0
    assert alloc.free(p) == -1 and alloc.free(q) == -1
    assert e.unregister_memory(p) == 0
    assert alloc.free(p) == 0
    assert e.batch_unregister_memory([q]) == 0
    assert alloc.free(q) == 0


def test_topology_is_json(pair):
    a = pair[0]
    topo = json.loads(a.get_local_topology())
    assert "cpu:0" in topo and topo["cpu:0"] == [[], []]
    assert json.loads(a.get_local_topology("mlx5_0")) == topo


# ---- transfers inside this process ------------------------------------------


def test_first_buffer_address(pair):
    a, b, ba, bb = pair
    assert a.get_first_buffer_address(name_of(b)) == bb
    assert a.get_first_buffer_address(name_of(a)) == ba
    assert a.get_first_buffer_address(f"127.0.0.1:{procs.free_port()}") == 0
    assert a.get_first_buffer_address("no-such-host-xyz:1") == 0


def test_sync_write_and_read_both_ways(pair):
    a, b, ba, bb = pair
    payload = os.urandom(300_000)
    assert a.write_bytes_to_buffer(ba, payload, len(payload)) == 0
    assert a.transfer_sync_write(name_of(b), ba, bb, len(payload)) == 0
    assert b.read_bytes_from_buffer(bb, len(payload)) == payload
    assert b.write_bytes_to_buffer(bb + 500_000, b"from b", 6) == 0
    assert a.transfer_sync_read(name_of(b), ba + 500_000, bb + 500_000, 6) == 0
    assert a.read_bytes_from_buffer(ba + 500_000, 6) == b"from b"
    assert b.transfer_sync_read(name_of(a), bb + 600_000, ba, 100) == 0
    assert b.read_bytes_from_buffer(bb + 600_000, 100) == payload[:100]
    assert a.transfer_sync_write(name_of(b), ba, bb, 0) == 0


def test_transfer_to_own_segment(pair):
    a, _, ba, _ = pair
    assert a.write_bytes_to_buffer(ba, b"self", 4) == 0
    assert a.transfer_sync_write(name_of(a), ba, ba + 4096, 4) == 0
    assert a.read_bytes_from_buffer(ba + 4096, 4) == b"self"


def test_transfer_sync_with_opcode_and_notify(pair):
    a, b, ba, bb = pair
    b.get_notifies()
    assert a.write_bytes_to_buffer(ba, b"op", 2) == 0
    assert a.transfer_sync(name_of(b), ba, bb + 100, 2, TransferOpcode.Write) == 0
    assert b.read_bytes_from_buffer(bb + 100, 2) == b"op"
    assert a.transfer_sync(name_of(b), ba + 10, bb + 100, 2, TransferOpcode.Read, TransferNotify("n1", "m1")) == 0
    assert a.read_bytes_from_buffer(ba + 10, 2) == b"op"
    assert [(n.name, n.msg) for n in b.get_notifies()] == [("n1", "m1")], "delivered when transfer_sync returns"
    assert b.get_notifies() == []
    with pytest.raises(TypeError):
        a.transfer_sync(name_of(b), ba, bb, 2, 1)


def test_batch_sync(pair):
    a, b, ba, bb = pair
    chunks = [os.urandom(1000) for _ in range(4)]
    for i, c in enumerate(chunks):
        assert a.write_bytes_to_buffer(ba + i * 4096, c, len(c)) == 0
    locals_ = [ba + i * 4096 for i in range(4)]
    remotes = [bb + 200_000 + i * 1000 for i in range(4)]
    assert a.batch_transfer_sync_write(name_of(b), locals_, remotes, [1000] * 4) == 0
    assert b.read_bytes_from_buffer(bb + 200_000, 4000) == b"".join(chunks)
    back = [ba + 300_000 + i * 1000 for i in range(4)]
    assert a.batch_transfer_sync_read(name_of(b), back, remotes, [1000] * 4) == 0
    assert a.read_bytes_from_buffer(ba + 300_000, 4000) == b"".join(chunks)
    b.get_notifies()
    assert a.batch_transfer_sync(name_of(b), back[:1], remotes[:1], [10], TransferOpcode.Write, TransferNotify("batch", "x")) == 0
    assert poll_notifies(b) == [("batch", "x")]
    assert a.batch_transfer_sync_write(name_of(b), [], [], []) == 0
    assert a.batch_transfer_sync_write(name_of(b), locals_, remotes[:1], [1000] * 4) == -1


def test_submit_and_check_status(pair):
    a, b, ba, bb = pair
    assert a.write_bytes_to_buffer(ba, b"async!", 6) == 0
    bid = a.transfer_submit_write(name_of(b), ba, bb + 700_000, 6)
    assert bid > 0
    status = 0
    for _ in range(1000):
        status = a.transfer_check_status(bid)
        if status != 0:
            break
        time.sleep(0.01)
    assert status == 1
    assert b.read_bytes_from_buffer(bb + 700_000, 6) == b"async!"
    assert a.transfer_check_status(bid) == -1, "a finished batch is freed"
    assert a.transfer_check_status(123456789) == -1


def test_batch_async(pair):
    a, b, ba, bb = pair
    assert b.write_bytes_to_buffer(bb + 800_000, b"0123456789", 10) == 0
    ids = [
        a.batch_transfer_async_read(name_of(b), [ba + 800_000], [bb + 800_000], [10]),
        a.batch_transfer_async(name_of(b), [ba + 810_000], [bb + 800_000], [10], TransferOpcode.Read),
        a.batch_transfer_async_write(name_of(b), [ba + 800_000], [bb + 820_000], [10]),
    ]
    assert all(i > 0 for i in ids)
    assert a.get_batch_transfer_status(ids) == 0
    assert a.read_bytes_from_buffer(ba + 810_000, 10) == b"0123456789"
    assert a.get_batch_transfer_status([]) == 0
    assert a.get_batch_transfer_status([987654321]) == -1
    assert a.batch_transfer_async_write(name_of(b), [ba], [bb, bb], [1]) == 0


def test_failures_are_codes_not_crashes(pair):
    a, b, ba, bb = pair
    dead = f"127.0.0.1:{procs.free_port()}"
    assert a.transfer_sync_write(dead, ba, bb, 8) == -1
    assert a.transfer_submit_write(dead, ba, bb, 8) == 0
    assert a.batch_transfer_async_write(dead, [ba], [bb], [8]) == 0
    assert a.transfer_sync_write(name_of(b), ba, 12345, 8) == -1, "remote range not registered"
    assert a.transfer_sync_write(name_of(b), ba, bb + MB - 4, 8) == -1, "remote range runs past the buffer"
    assert a.transfer_sync_write(name_of(b), 8, bb, 8) == -1, "local address is not memory"
    assert a.transfer_sync_read(name_of(b), ba + MB - 4, bb, 8) == -1, "local range runs past the buffer"
    with pytest.raises(TypeError):
        a.transfer_sync_write(name_of(b), ba, bb, -1)


def test_unregistered_local_memory_works_over_tcp(pair):
    """The reference's tcp transport accepts any valid local address."""
    a, b, _, bb = pair
    src = np.frombuffer(os.urandom(5000), np.uint8).copy()
    dst = np.zeros(5000, np.uint8)
    assert a.transfer_sync_write(name_of(b), src.ctypes.data, bb, 5000) == 0
    assert a.transfer_sync_read(name_of(b), dst.ctypes.data, bb, 5000) == 0
    assert (src == dst).all()
    # and the adopted ranges were let go: registering them now works
    assert a.register_memory(dst.ctypes.data, 5000) == 0
    assert a.unregister_memory(dst.ctypes.data) == 0


def test_blocking_calls_release_the_gil():
    """Engine `a` resolves `b` through a metadata server written in Python:
    the transfer can only finish if it let that server's thread run."""
    meta = PyMetadataServer()
    try:
        a, b = make_engine(meta.url), make_engine(meta.url)
        ba, bb = a.allocate_managed_buffer(4096), b.allocate_managed_buffer(4096)
        assert b.write_bytes_to_buffer(bb, b"gil", 3) == 0
        gets = meta.gets
        result = []
        t = threading.Thread(target=lambda: result.append(a.transfer_sync_read(name_of(b), ba, bb, 3)))
        t.start()
        t.join(60)
        assert result == [0]
        assert meta.gets > gets, "the peer was looked up through the Python server"
        assert a.read_bytes_from_buffer(ba, 3) == b"gil"
    finally:
        meta.close()


def test_parallel_transfers_from_threads(pair):
    a, b, ba, bb = pair
    errors = []

    def worker(i):
        off = i * 16_384
        data = bytes([i]) * 16_384
        for _ in range(20):
            if a.write_bytes_to_buffer(ba + off, data, len(data)) != 0:
                errors.append(("fill", i))
            if a.transfer_sync_write(name_of(b), ba + off, bb + off, len(data)) != 0:
                errors.append(("write", i))
            if b.read_bytes_from_buffer(bb + off, len(data)) != data:
                errors.append(("check", i))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []


# ---- another process ------------------------------------------------------------


@pytest.mark.parametrize("backend", ["p2p", "http", "p2p-tcp-only"])
def test_two_processes_move_data_both_ways(backend, metadata_server, monkeypatch):
    """Same-host engines map each other's managed (shared) memory; with
    MC_FORCE_TCP every byte crosses a socket instead."""
    metadata = metadata_server if backend == "http" else "P2PHANDSHAKE"
    force_tcp = backend.endswith("tcp-only")
    if force_tcp:
        monkeypatch.setenv("MC_FORCE_TCP", "1")
    me = make_engine(metadata)
    mine = me.allocate_managed_buffer(MB)
    peer = procs.JsonPeer(procs.python("peer_engine.py", metadata, str(procs.free_port())))
    try:
        hello = peer.recv()
        assert hello["rc"] == 0 and hello["addr"]
        theirs, their_name = hello["addr"], hello["name"]
        assert me.get_first_buffer_address(their_name) == theirs
        assert peer.call(op="first", target=name_of(me))["addr"] == mine

        # we write into the peer, then read back what the peer wrote itself
        out = os.urandom(200_000)
        assert me.write_bytes_to_buffer(mine, out, len(out)) == 0
        assert me.transfer_sync_write(their_name, mine, theirs, len(out)) == 0
        assert bytes.fromhex(peer.call(op="dump", off=0, len=len(out))["hex"]) == out
        theirs_data = os.urandom(1000)
        assert peer.call(op="fill", off=300_000, hex=theirs_data.hex())["rc"] == 0
        assert me.transfer_sync_read(their_name, mine + 300_000, theirs + 300_000, 1000) == 0
        assert me.read_bytes_from_buffer(mine + 300_000, 1000) == theirs_data

        # the peer writes into us and reads from us
        assert peer.call(op="transfer", write=True, target=name_of(me), off=300_000, remote=mine + 500_000, len=1000)["rc"] == 0
        assert me.read_bytes_from_buffer(mine + 500_000, 1000) == theirs_data
        assert peer.call(op="transfer", write=False, target=name_of(me), off=600_000, remote=mine, len=5000)["rc"] == 0
        assert bytes.fromhex(peer.call(op="dump", off=600_000, len=5000)["hex"]) == out[:5000]

        # a range outside our buffer is refused on our side
        assert peer.call(op="transfer", write=True, target=name_of(me), off=0, remote=mine + MB - 10, len=100)["rc"] != 0
    finally:
        peer.close()
    if force_tcp:
        # once the peer is gone, transfers to it fail instead of hanging
        assert me.transfer_sync_write(their_name, mine, theirs, 10) != 0
    me.free_managed_buffer(mine, MB)


def test_send_probe(pair):
    a, b, _, _ = pair
    assert a.send_probe(name_of(b)) == 0
    assert a.send_probe(f"127.0.0.1:{procs.free_port()}") == -200


def test_initialize_twice_with_the_same_name(metadata_server):
    e = TransferEngine()
    name = f"127.0.0.1:{procs.free_port()}"
    assert e.initialize(name, metadata_server, "tcp", "") == 0
    assert e.initialize(name, metadata_server, "tcp", "") == 0
    buf = e.allocate_managed_buffer(4096)
    other = make_engine(metadata_server)
    assert other.get_first_buffer_address(name) == buf
