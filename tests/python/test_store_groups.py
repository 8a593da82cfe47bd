"""Object groups (`ReplicateConfig.group_ids`, one group per key; `""` keeps
a key ungrouped): a batch names one group per key, a key stays in the group
it was put in, and a read of one member (`exist`, `get_replica_list`)
leases the whole group. The same calls pass on the reference."""

from __future__ import annotations

import os
import time

from mooncake.store import ReplicateConfig

INVALID = -600
HAS_LEASE = -706


def tag(name):
    return f"{name}-{os.getpid()}-{time.monotonic_ns()}"


def grouped(*groups):
    c = ReplicateConfig()
    c.group_ids = list(groups)
    return c


def test_a_batch_names_one_group_per_key(store):
    a, b = tag("a"), tag("b")
    g = tag("g")
    assert store.put_batch([a, b], [b"1", b"2"], grouped(g)) == INVALID
    assert store.upsert_batch([a, b], [b"1", b"2"], grouped(g, g, g)) == INVALID
    assert store.is_exist(a) == 0 and store.is_exist(b) == 0
    assert store.put_batch([a, b], [b"1", b"2"], grouped(g, "")) == 0
    assert store.get(a) == b"1" and store.get(b) == b"2"
    # A single put takes a list of one.
    assert store.put(tag("c"), b"3", grouped(g, g)) == INVALID
    assert store.put(tag("c"), b"3", grouped(g)) == 0


def test_a_key_stays_in_its_group(store):
    k = tag("k")
    g, h = tag("g"), tag("h")
    assert store.put(k, b"v1", grouped(g)) == 0
    assert store.upsert(k, b"v2", grouped(h)) == INVALID
    assert store.upsert(k, b"v2", grouped("")) == INVALID
    assert store.get(k) == b"v1"
    assert store.upsert(k, b"v3", grouped(g)) == 0
    # No group named: the object keeps its own.
    assert store.upsert(k, b"v4") == 0
    assert store.upsert(k, b"v5", grouped(h)) == INVALID
    assert store.get(k) == b"v4"
    # An ungrouped object cannot join one by upsert either.
    u = tag("u")
    assert store.put(u, b"x") == 0
    assert store.upsert(u, b"y", grouped(g)) == INVALID
    assert store.upsert_batch([u], [b"y"], grouped(g)) == INVALID
    # Once removed, the key may be put in another group (the reads above
    # leased it).
    assert store.remove(k, force=True) == 0
    assert store.put(k, b"v6", grouped(h)) == 0
    assert store.get(k) == b"v6"


def test_a_read_of_one_member_leases_the_group(store):
    g = tag("g")
    a, b, c, d = tag("a"), tag("b"), tag("c"), tag("d")
    assert store.put_batch([a, b, c], [b"1", b"2", b"3"], grouped(g, g, g)) == 0
    assert store.put(d, b"4") == 0
    # Freshly put and unread: removable.
    assert store.remove(d) == 0
    assert store.is_exist(a) == 1
    # The exist check on `a` leased `b` and `c`.
    assert store.remove(b) == HAS_LEASE
    assert store.remove(c) == HAS_LEASE
    assert store.remove(b, force=True) == 0

    g2 = tag("g2")
    e, f = tag("e"), tag("f")
    assert store.put_batch([e, f], [b"5", b"6"], grouped(g2, g2)) == 0
    assert len(store.get_replica_desc(e)) >= 1
    assert store.remove(f) == HAS_LEASE
    # A remove takes only its member; the others stay readable.
    assert store.remove(f, force=True) == 0
    assert store.get(e) == b"5"
    assert store.is_exist(f) == 0
