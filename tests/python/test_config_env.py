"""Configuration the integrations use: ReplicateConfig, MooncakeConfig (JSON
file or MOONCAKE_* variables) and the environment defaults of setup/init_all."""

from __future__ import annotations

import json

import pytest

from mooncake.mooncake_config import MooncakeConfig, parse_size
from mooncake.store import MooncakeDistributedStore, ObjectDataType, ReplicateConfig, SoftPinAction

MiB = 1 << 20


def test_replicate_config_fields_and_str():
    c = ReplicateConfig()
    assert (c.replica_num, c.with_hard_pin, c.with_soft_pin, c.preferred_segment, c.preferred_segments) == (1, False, False, "", [])
    assert c.prefer_alloc_in_same_node is False and c.soft_pin_action == SoftPinAction.PRESERVE
    assert c.soft_pin_ttl_ms is None and c.group_ids is None and c.data_type == ObjectDataType.UNKNOWN
    assert str(c) == (
        "ReplicateConfig: { replica_num: 1, nof_replica_num: 0, dfs_replica_num: 0, soft_pin_action: PRESERVE, "
        "soft_pin_ttl_ms: default, with_hard_pin: 0, preferred_segments: [], preferred_nof_segments: [], "
        "prefer_alloc_in_same_node: 0, data_type: UNKNOWN }"
    )
    c.replica_num = 3
    c.with_soft_pin = True
    c.with_hard_pin = 1
    c.preferred_segments = ("a:1", "b:2")
    c.preferred_segment = "x:1"
    c.soft_pin_ttl_ms = 5000
    c.data_type = ObjectDataType.KVCACHE
    assert c.soft_pin_action == SoftPinAction.ENABLE and c.with_hard_pin is True
    assert "soft_pin_ttl_ms: 5000" in str(c) and "preferred_segments: [a:1, b:2]" in str(c)
    assert "preferred_segment (deprecated): x:1" in str(c) and "data_type: KVCACHE" in str(c)
    for field, bad in [("replica_num", -1), ("replica_num", "two"), ("preferred_segments", "ab"), ("with_hard_pin", "yes"), ("group_ids", [1])]:
        with pytest.raises(TypeError):
            setattr(c, field, bad)
    with pytest.raises(AttributeError):
        c.no_such_field = 1
    assert ReplicateConfig(replica_num=2).replica_num == 2
    with pytest.raises(TypeError):
        ReplicateConfig(bogus=1)


def test_enums_like_pybind():
    assert int(SoftPinAction.ENABLE) == 1 and SoftPinAction(2) == SoftPinAction.DISABLE
    assert repr(ObjectDataType.KVCACHE) == "<ObjectDataType.KVCACHE: 1>" and str(ObjectDataType.KVCACHE) == "ObjectDataType.KVCACHE"
    assert ObjectDataType.KVCACHE.name == "KVCACHE" and ObjectDataType.KVCACHE.value == 1
    assert list(SoftPinAction.__members__) == ["PRESERVE", "ENABLE", "DISABLE"]
    import mooncake.store as ms

    assert ms.COMPLETE == ms.ReplicaStatus.COMPLETE and ms.KVCACHE == ObjectDataType.KVCACHE
    with pytest.raises(ValueError):
        SoftPinAction(9)


def test_sizes():
    assert parse_size("3GB") == 3 << 30 and parse_size("16 mb") == 16 * MiB and parse_size(5) == 5
    assert parse_size("0.5G") == 512 * MiB and parse_size("1024") == 1024
    for bad in ("", "abc", "10%", "5XB", True):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_mooncake_config_from_env(monkeypatch, tmp_path):
    for k in ("MOONCAKE_CONFIG_PATH", "MOONCAKE_MASTER"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError):
        MooncakeConfig.load_from_env()
    monkeypatch.setenv("MOONCAKE_MASTER", "10.0.0.1:50051")
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "TCP")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "3GB")
    monkeypatch.setenv("MOONCAKE_LOCAL_BUFFER_SIZE", "64 MB")
    cfg = MooncakeConfig.load_from_env()
    assert cfg.master_server_address == "10.0.0.1:50051" and cfg.protocol == "tcp"
    assert cfg.global_segment_size == 3 << 30 and cfg.local_buffer_size == 64 * MiB
    assert cfg.metadata_server == "P2PHANDSHAKE" and cfg.local_hostname == "localhost"
    path = tmp_path / "mc.json"
    path.write_text(json.dumps({"local_hostname": "node1", "metadata_server": "http://m:8080/metadata",
                                "master_server_address": "m:50051", "global_segment_size": "1GB",
                                "enable_ssd_offload": "false"}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    cfg = MooncakeConfig.load_from_env()
    assert (cfg.local_hostname, cfg.global_segment_size, cfg.enable_ssd_offload) == ("node1", 1 << 30, False)
    assert cfg.setup_args()["master_server_addr"] == "m:50051"
    path.write_text(json.dumps({"local_hostname": "node1"}))
    with pytest.raises(ValueError):
        MooncakeConfig.load_from_env()


def test_setup_from_mooncake_config_and_env(cluster, monkeypatch):
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
    monkeypatch.setenv("MOONCAKE_MASTER", cluster.master)
    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")
    monkeypatch.setenv("MOONCAKE_TE_META_DATA_SERVER", cluster.metadata)
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "16MB")
    monkeypatch.setenv("MOONCAKE_LOCAL_BUFFER_SIZE", "16MB")
    s = MooncakeDistributedStore()
    assert s.setup(**MooncakeConfig.load_from_env().setup_args()) == 0
    assert s.put("env-k", b"v") == 0 and s.get("env-k") == b"v"
    assert s.close() == 0
    # init_all reads the same variables for everything but protocol, device and size
    assert s.init_all("tcp", "", 16 * MiB) == 0
    assert s.get_hostname().startswith("127.0.0.1:")
    assert s.close() == 0
    # a dict without a master address falls back to MOONCAKE_MASTER
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": cluster.metadata, "global_segment_size": "16MB", "local_buffer_size": "16MB"}) == 0
    assert s.close() == 0


def test_empty_metadata_server_reads_mc_metadata_server(cluster, monkeypatch):
    from mooncake.engine import TransferEngine

    monkeypatch.setenv("MC_METADATA_SERVER", cluster.metadata)
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "", 16 * MiB, 16 * MiB, "tcp", "", cluster.master) == 0
    assert s.put("mc-env", b"v") == 0
    assert s.close() == 0
    import procs

    e = TransferEngine()
    name = f"127.0.0.1:{procs.free_port()}"
    assert e.initialize(name, "", "tcp", "") == 0
    buf = e.allocate_managed_buffer(4096)
    probe = TransferEngine()
    assert probe.initialize(f"127.0.0.1:{procs.free_port()}", cluster.metadata, "tcp", "") == 0
    assert probe.get_first_buffer_address(name) == buf, "published through MC_METADATA_SERVER"
