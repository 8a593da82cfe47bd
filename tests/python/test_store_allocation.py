"""`--allocation_strategy=local_first` with stores on two hosts (the
loopback aliases 127.0.0.2 and 127.0.0.3 stand for two machines): each
store's single-replica puts land on its own host's segment. With `random`
the same puts land on either host."""

from __future__ import annotations

from conftest import Cluster
from mooncake.store import MooncakeDistributedStore

MiB = 1 << 20
KEYS = 24


def hosts_of(store, keys):
    descs = store.batch_get_replica_desc(keys)
    return {
        r.get_memory_descriptor().buffer_descriptor.transport_endpoint.rsplit(":", 1)[0]
        for k in keys for r in descs[k]
    }


def run(strategy):
    c = Cluster(f"--allocation_strategy={strategy}")
    stores = []
    try:
        for host in ("127.0.0.2", "127.0.0.3"):
            s = MooncakeDistributedStore()
            assert s.setup(host, c.metadata, 16 * MiB, 16 * MiB, "tcp", "", c.master) == 0
            stores.append((host, s))
        placed = {}
        for host, s in stores:
            keys = [f"{host}-{i}" for i in range(KEYS)]
            for k in keys:
                assert s.put(k, b"v" * 4096) == 0
                assert s.get(k) == b"v" * 4096
            placed[host] = hosts_of(s, keys)
        return placed
    finally:
        for _, s in stores:
            s.close()
        assert c.stop() == 0


def test_local_first_puts_on_the_writers_host():
    placed = run("local_first")
    assert placed == {"127.0.0.2": {"127.0.0.2"}, "127.0.0.3": {"127.0.0.3"}}


def test_random_puts_on_either_host():
    placed = run("random")
    assert placed["127.0.0.2"] == placed["127.0.0.3"] == {"127.0.0.2", "127.0.0.3"}


def test_ssd_free_ratio_first_without_tiers_places_as_random():
    # No owner has an SSD tier: every segment scores 1, as the reference's.
    placed = run("ssd_free_ratio_first")
    assert placed["127.0.0.2"] == placed["127.0.0.3"] == {"127.0.0.2", "127.0.0.3"}
