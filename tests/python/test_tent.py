"""MC_USE_TENT=1: the same mooncake.engine.TransferEngine over TENT, with
two paths per engine (127.0.0.1 and 127.0.0.2) configured by MC_TENT_CONF:
registered, unregistered (staged) and managed buffers, sync and async
transfers, notifies, and errors as codes."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

MB = 1 << 20
CONF = {
    "transports": {"tcp": {"addresses": ["127.0.0.1", "127.0.0.2"], "slice_size": 262144}},
    "metrics": {"http_port": 0, "report_interval_seconds": 0},
}


@pytest.fixture(scope="module")
def pair():
    saved = {k: os.environ.get(k) for k in ("MC_USE_TENT", "MC_TENT_CONF")}
    os.environ["MC_USE_TENT"] = "1"
    os.environ["MC_TENT_CONF"] = json.dumps(CONF)
    a, b = TransferEngine(), TransferEngine()
    try:
        assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    yield a, b


def test_registered_buffers_both_ways(pair):
    a, b = pair
    src = np.frombuffer(os.urandom(8 * MB), dtype=np.uint8).copy()
    dst = np.zeros(8 * MB, dtype=np.uint8)
    assert a.register_memory(src.ctypes.data, src.nbytes) == 0
    assert b.register_memory(dst.ctypes.data, dst.nbytes) == 0
    peer = f"127.0.0.1:{b.get_rpc_port()}"
    assert a.transfer_sync_write(peer, src.ctypes.data, dst.ctypes.data, src.nbytes) == 0
    assert np.array_equal(src, dst)
    dst[:] = 7
    assert a.transfer_sync_read(peer, src.ctypes.data, dst.ctypes.data, src.nbytes) == 0
    assert (src == 7).all()
    # Out of the peer's registered memory: an error code, nothing moved.
    assert a.transfer_sync_write(peer, src.ctypes.data, dst.ctypes.data + dst.nbytes, 16) < 0
    assert a.unregister_memory(src.ctypes.data) == 0
    assert b.unregister_memory(dst.ctypes.data) == 0


def test_unregistered_local_is_staged_and_async_and_notify(pair):
    a, b = pair
    dst = np.zeros(3 * MB, dtype=np.uint8)
    assert b.register_memory(dst.ctypes.data, dst.nbytes) == 0
    peer = f"127.0.0.1:{b.get_rpc_port()}"
    plain = np.frombuffer(os.urandom(3 * MB), dtype=np.uint8).copy()
    b.get_notifies()
    assert a.transfer_sync(peer, plain.ctypes.data, dst.ctypes.data, plain.nbytes,
                           TransferOpcode.Write, TransferNotify("tent", "done")) == 0
    assert np.array_equal(plain, dst)
    assert [(n.name, n.msg) for n in b.get_notifies()] == [("tent", "done")]
    back = np.zeros(3 * MB, dtype=np.uint8)
    bid = a.batch_transfer_async_read(peer, [back.ctypes.data], [dst.ctypes.data], [back.nbytes])
    assert bid > 0
    status = 0
    for _ in range(2000):
        status = a.transfer_check_status(bid)
        if status != 0:
            break
        time.sleep(0.01)
    assert status == 1
    assert np.array_equal(back, dst)
    assert a.transfer_check_status(bid) == -1, "a finished batch is forgotten"
    assert b.unregister_memory(dst.ctypes.data) == 0


def test_managed_buffers(pair):
    a, b = pair
    ba, bb = a.allocate_managed_buffer(2 * MB), b.allocate_managed_buffer(2 * MB)
    assert ba and bb
    payload = os.urandom(2 * MB)
    assert a.write_bytes_to_buffer(ba, payload, len(payload)) == 0
    assert a.transfer_sync_write(f"127.0.0.1:{b.get_rpc_port()}", ba, bb, len(payload)) == 0
    assert b.read_bytes_from_buffer(bb, len(payload)) == payload
    assert a.free_managed_buffer(ba, 2 * MB) == 0
    assert b.free_managed_buffer(bb, 2 * MB) == 0
