"""A master with a cluster token: Python `setup()` joins with the token from
MOONCAKE_CLUSTER_TOKEN, and without it setup is refused."""

from __future__ import annotations

import os

import pytest

from conftest import Cluster

TOKEN = "py-cluster-secret"


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory):
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(TOKEN + "\n")
    c = Cluster(f"--cluster_token_file={path}")
    try:
        yield c
    finally:
        assert c.stop() == 0, c.proc.output()


def setup_store(cluster):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", cluster.metadata, 16 << 20, 16 << 20, "tcp", "", cluster.master)
    return s, rc


def test_setup_uses_the_token_from_the_environment(token_cluster, monkeypatch):
    monkeypatch.setenv("MOONCAKE_CLUSTER_TOKEN", TOKEN)
    s, rc = setup_store(token_cluster)
    assert rc == 0, rc
    try:
        assert s.put("tok-k", b"v" * 1000) == 0
        assert s.get("tok-k") == b"v" * 1000
        assert s.remove("tok-k", force=True) == 0
    finally:
        s.close()


def test_setup_without_the_token_is_refused(token_cluster, monkeypatch):
    monkeypatch.delenv("MOONCAKE_CLUSTER_TOKEN", raising=False)
    s, rc = setup_store(token_cluster)
    assert rc != 0
    monkeypatch.setenv("MOONCAKE_CLUSTER_TOKEN", "wrong")
    s, rc = setup_store(token_cluster)
    assert rc != 0
    assert os.environ["MOONCAKE_CLUSTER_TOKEN"] == "wrong"
