"""Segments and the local buffer on huge pages (`MC_STORE_USE_HUGEPAGE`,
`MC_STORE_HUGEPAGE_SIZE`, as the reference reads them): taken from the
host's HugeTLB pool, never quietly from small pages; bad sizes and an empty
pool fail setup with a code. Sizing the pool needs root."""

from __future__ import annotations

import os

import pytest

from conftest import Cluster

MiB = 1 << 20
NR = "/proc/sys/vm/nr_hugepages"


def free_huge_pages() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("HugePages_Free:"):
            return int(line.split()[1])
    return 0


@pytest.fixture
def pool():
    """24 more 2 MiB pages in the pool for the test, given back after."""
    if os.geteuid() != 0:
        pytest.skip("needs root to size the HugeTLB pool")
    old = open(NR).read().strip()
    with open(NR, "w") as f:
        f.write(str(int(old) + 24))
    try:
        yield
    finally:
        with open(NR, "w") as f:
            f.write(old)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    assert c.stop() == 0, c.proc.output()


def setup(cluster, segment=16 * MiB, buffer=16 * MiB):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    return s, s.setup("127.0.0.1", cluster.metadata, segment, buffer, "tcp", "", cluster.master)


def test_segment_and_buffer_come_from_the_pool(cluster, pool, monkeypatch):
    monkeypatch.setenv("MC_STORE_USE_HUGEPAGE", "1")
    monkeypatch.setenv("MC_STORE_HUGEPAGE_SIZE", "2MB")
    before = free_huge_pages()
    store, rc = setup(cluster)
    assert rc == 0
    try:
        value = os.urandom(3 * MiB)
        assert store.put("huge-k", value) == 0
        assert store.get("huge-k") == value
        # The value's pages in the segment and the staging buffer's are
        # huge pages now (the background population may take more).
        assert free_huge_pages() <= before - 2, (before, free_huge_pages())
    finally:
        store.close()


@pytest.mark.parametrize("size", ["3MB", "4KB", "huge", ""])
def test_a_size_pages_do_not_come_in_fails_setup(cluster, monkeypatch, size):
    monkeypatch.setenv("MC_STORE_USE_HUGEPAGE", "true")
    monkeypatch.setenv("MC_STORE_HUGEPAGE_SIZE", size)
    store, rc = setup(cluster)
    assert rc == -600
    store.close()


def test_an_empty_pool_fails_setup_instead_of_small_pages(cluster, monkeypatch):
    if free_huge_pages() > 0:
        pytest.skip("the host has free huge pages")
    monkeypatch.setenv("MC_STORE_USE_HUGEPAGE", "1")
    store, rc = setup(cluster)
    assert rc != 0
    store.close()
    # Without the variable the same setup works.
    monkeypatch.delenv("MC_STORE_USE_HUGEPAGE")
    store, rc = setup(cluster)
    assert rc == 0
    store.close()
