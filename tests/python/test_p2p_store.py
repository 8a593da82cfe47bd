"""mooncake.p2p_store against a real etcd (`MOONCAKE_TEST_ETCD`, which the
test script starts, or one started here): a publisher and two consumers in
one process, each with its own engine, byte-exact copies, the catalog, and
the errors of bad calls."""

import os
import time

import numpy as np
import pytest

import procs
from mooncake.p2p_store import DEFAULT_SHARD_SIZE, P2PStore, P2PStoreError

MB = 1 << 20


def node(etcd):
    return P2PStore(etcd, f"{procs.LOOPBACK}:{procs.free_port()}")


def unique(what):
    return f"py-{os.getpid()}-{time.time_ns()}/{what}"


def test_publish_and_replicate(etcd):
    pub, c1, c2 = node(etcd), node(etcd), node(etcd)
    name = unique("weights")
    data = np.random.default_rng(7).integers(0, 256, 6 * MB + 3, dtype=np.uint8)
    pub.register(name, [data.ctypes.data], [data.nbytes], max_shard_size=2 * MB)
    [info] = pub.list(name)
    assert info == {"name": name, "max_shard_size": 2 * MB,
                    "total_size": data.nbytes, "size_list": [data.nbytes]}

    out1 = np.zeros_like(data)
    r1 = c1.get_replica(name, [out1.ctypes.data], [out1.nbytes])
    assert np.array_equal(out1, data)
    assert r1["bytes_from"] == {pub.local_server_name: data.nbytes}

    # The second consumer reads the first one's copy, not the publisher's.
    out2 = np.zeros_like(data)
    r2 = c2.get_replica(name, [out2.ctypes.data], [out2.nbytes])
    assert np.array_equal(out2, data)
    assert r2["bytes_from"] == {c1.local_server_name: data.nbytes}
    assert r2["failed_holders"] == [] and r2["reread"] == 0

    pub.unregister(name)
    c1.delete_replica(name)
    c2.delete_replica(name)
    assert pub.list(name) == []
    for s in (pub, c1, c2):
        s.close()


def test_bad_calls_raise_with_codes(etcd):
    s = node(etcd)
    data = np.ones(MB, dtype=np.uint8)
    with pytest.raises(P2PStoreError) as e:
        s.get_replica(unique("missing"), [data.ctypes.data], [data.nbytes])
    assert e.value.args[1] == -704
    with pytest.raises(P2PStoreError) as e:
        s.register(unique("x"), [data.ctypes.data], [data.nbytes], max_shard_size=3 * MB)
    assert e.value.args[1] == -1
    with pytest.raises(P2PStoreError):
        s.register(unique("x"), [data.ctypes.data, 0], [data.nbytes])
    # An address that is not this process's memory is refused, not read.
    with pytest.raises(P2PStoreError):
        s.register(unique("x"), [8], [MB])
    with pytest.raises(P2PStoreError) as e:
        s.delete_replica(unique("never"))
    assert e.value.args[1] == -704
    with pytest.raises(P2PStoreError):
        P2PStore("P2PHANDSHAKE", "127.0.0.1:1")
    assert DEFAULT_SHARD_SIZE == 64 * MB
    s.close()
