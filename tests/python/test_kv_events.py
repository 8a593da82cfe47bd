"""KV events of the master, read the way routers read them: a pyzmq SUB socket
and msgspec's msgpack decoder (as vLLM's and SGLang's consumers do)."""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq

import procs
from conftest import Cluster, new_store

STORED_KEYS = [
    "event_id", "timestamp", "event_type", "type", "model_name", "block_size",
    "additional_salt", "lora_name", "tenant_id", "backend_id", "group_id", "medium",
    "dp_rank", "object_key", "seq_hashes", "block_hashes", "base_block_idx",
    "parent_hash", "token_ids", "parent_block_hash",
]
REMOVED_KEYS = STORED_KEYS[:17]


@pytest.fixture(scope="module")
def events():
    """A master publishing on a free port, a subscriber to it, and a store."""
    port = procs.free_port()
    cluster = Cluster(
        "--enable_kv_events=true",
        f"--kv_events_bind_endpoint=tcp://{procs.LOOPBACK}:{port}",
        "--kv_events_backend_id=pool-test",
    )
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 200)
    sub.connect(f"tcp://{procs.LOOPBACK}:{port}")
    store = new_store(cluster)
    try:
        yield store, sub
    finally:
        store.close()
        sub.close(linger=0)
        ctx.destroy(linger=0)  # closes what a failed assertion left open
        assert cluster.stop() == 0, cluster.proc.output()


def subscribed(store, sub) -> None:
    """Puts probe keys until one's event arrives: a PUB socket drops what it
    sends before the subscription reaches it."""
    deadline = time.monotonic() + 20
    n = 0
    while time.monotonic() < deadline:
        n += 1
        assert store.put(f"{900000 + n}", b"p") == 0
        try:
            sub.recv_multipart()
        except zmq.Again:
            continue
        while True:  # drain the rest of the probes' batches
            try:
                sub.recv_multipart()
            except zmq.Again:
                return
    pytest.fail("no KV event reached the subscriber")


def receive(sub, want: int, timeout: float = 10.0) -> list[tuple[int, list]]:
    """Batches (seq, events) until `want` events arrived."""
    out, got = [], 0
    deadline = time.monotonic() + timeout
    while got < want and time.monotonic() < deadline:
        try:
            topic, seq, payload = sub.recv_multipart()
        except zmq.Again:
            continue
        assert topic == b""
        assert len(seq) == 8
        ts, evs, dp_rank = msgspec.msgpack.decode(payload)
        assert isinstance(ts, int) and ts > 0 and dp_rank == 0
        out.append((int.from_bytes(seq, "big"), evs))
        got += len(evs)
    assert got == want, out
    return out


def test_stored_and_removed_events_decode_as_routers_read_them(events):
    store, sub = events
    subscribed(store, sub)
    key = "123456789"
    assert store.put(key, b"x" * 4096) == 0
    assert store.remove(key) == 0
    batches = receive(sub, 2)
    evs = [e for _, e in batches for e in e]
    stored, removed = evs
    assert list(stored) == STORED_KEYS
    assert list(removed) == REMOVED_KEYS
    assert stored["event_type"] == "stored" and stored["type"] == "BlockStored"
    assert removed["event_type"] == "removed" and removed["type"] == "BlockRemoved"
    for e in (stored, removed):
        assert e["backend_id"] == "pool-test"
        assert e["tenant_id"] == "default"
        assert e["medium"] == "cpu"
        assert e["object_key"] == key
        assert e["seq_hashes"] == [123456789]
        assert e["block_hashes"] == [123456789]
        assert e["model_name"] is None and e["dp_rank"] is None
    assert stored["base_block_idx"] == 0 and removed["base_block_idx"] is None
    assert removed["event_id"] > stored["event_id"]
    seqs = [s for s, _ in batches]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_a_put_of_an_existing_key_and_batch_remove_publish_nothing(events):
    store, sub = events
    subscribed(store, sub)
    keys = ["0x10", "0x11"]
    assert store.put_batch(keys, [b"a", b"b"]) == 0
    first = receive(sub, 2)
    hashes = sorted(e["seq_hashes"][0] for _, evs in first for e in evs)
    assert hashes == [16, 17]
    # The reference publishes nothing for these: the put fails, and
    # batch_remove is silent. A later single remove proves the stream is live.
    store.put("0x10", b"again")
    assert all(r == 0 for r in store.batch_remove(keys))
    assert store.put("42", b"z") == 0
    (seq, evs), = receive(sub, 1)
    assert [e["event_type"] for e in evs] == ["stored"]
    assert evs[0]["seq_hashes"] == [42]
    assert seq == max(s for s, _ in first) + 1


def test_replay_endpoint_resends_missed_batches():
    """A consumer that saw a gap asks the master's replay endpoint (vLLM's
    protocol, a DEALER as vLLM's and the Conductor's consumers use) and gets
    the missed batches byte for byte, then the end marker."""
    port, replay_port = procs.free_port(), procs.free_port()
    cluster = Cluster(
        "--enable_kv_events=true",
        f"--kv_events_bind_endpoint=tcp://{procs.LOOPBACK}:{port}",
        f"--kv_events_replay_endpoint=tcp://{procs.LOOPBACK}:{replay_port}",
        "--kv_events_backend_id=pool-replay",
    )
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 200)
    sub.connect(f"tcp://{procs.LOOPBACK}:{port}")
    store = new_store(cluster)
    try:
        subscribed(store, sub)
        live = []
        for i in range(5):
            assert store.put(f"{0x5000 + i}", b"v") == 0
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    _topic, seq, payload = sub.recv_multipart()
                    live.append((int.from_bytes(seq, "big"), payload))
                    break
                except zmq.Again:
                    continue
        assert len(live) == 5
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, 10_000)
        dealer.connect(f"tcp://{procs.LOOPBACK}:{replay_port}")
        start = live[1][0]
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        got = []
        while True:
            empty, seq, payload = dealer.recv_multipart()
            assert empty == b""
            if int.from_bytes(seq, "big", signed=True) == -1:
                assert payload == b""
                break
            got.append((int.from_bytes(seq, "big"), payload))
        assert got == live[1:]
        event = msgspec.msgpack.decode(got[0][1])[1][0]
        assert event["object_key"] == str(0x5001) and event["event_type"] == "stored"
        dealer.close(linger=0)
    finally:
        store.close()
        sub.close(linger=0)
        ctx.destroy(linger=0)  # closes what a failed assertion left open
        assert cluster.stop() == 0, cluster.proc.output()
