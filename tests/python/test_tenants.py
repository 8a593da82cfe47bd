"""Multi-tenant mode (`--enable_multi_tenants`, docs/tenants.md): isolation,
admission and quotas, the admin API, defaults, policy files, restart and
dummy clients, as the reference behaves."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import pytest

import procs
from conftest import Cluster

MiB = 1 << 20
KiB = 1 << 10

TENANT_QUOTA_EXCEEDED = -1700
TENANT_NOT_REGISTERED = -1701
TENANT_NOT_EMPTY = -1702
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
UNAVAILABLE_IN_CURRENT_MODE = -1011


def policy_file(path, tenants):
    lines = ["version: 1", "tenants:"]
    for name, quota in tenants:
        lines += [f"  - name: {name}", f"    quota: {quota}"]
    if not tenants:
        lines[-1] = "tenants: []"
    path.write_text("\n".join(lines) + "\n")
    return path


class MtMaster:
    """A multi-tenant master on fixed ports, restartable on them."""

    def __init__(self, policy, *flags, env=None):
        self.env = env
        self.rpc_port = procs.free_port()
        self.http_port = procs.free_port()
        self.metrics_port = procs.free_port()
        self.policy = policy
        self.flags = flags
        self.master = f"{procs.LOOPBACK}:{self.rpc_port}"
        self.metadata = f"http://{procs.LOOPBACK}:{self.http_port}/metadata"
        self.admin = f"http://{procs.LOOPBACK}:{self.metrics_port}"
        self.start()

    def start(self):
        self.proc = procs.start(
            "mooncake_master",
            f"--rpc_port={self.rpc_port}",
            f"--rpc_address={procs.LOOPBACK}",
            "--enable_http_metadata_server=true",
            f"--http_metadata_server_host={procs.LOOPBACK}",
            f"--http_metadata_server_port={self.http_port}",
            f"--metrics_port={self.metrics_port}",
            "--enable_multi_tenants=true",
            "--tenant_quota_connector_type=file",
            f"--tenant_quota_connector_uri={self.policy}",
            *self.flags,
            env=self.env,
        )
        self.proc.wait_for_line(r"mooncake_master listening on rpc=", timeout=60)

    def stop(self) -> int:
        return self.proc.stop()


def store_as(cluster, tenant=None, segment=16 * MiB, as_dict=False):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    if as_dict:
        cfg = {"local_hostname": "127.0.0.1", "metadata_server": cluster.metadata,
               "global_segment_size": segment, "local_buffer_size": 16 * MiB,
               "protocol": "tcp", "master_server_address": cluster.master}
        if tenant is not None:
            cfg["tenant_id"] = tenant
        rc = s.setup(cfg)
    elif tenant is None:
        rc = s.setup("127.0.0.1", cluster.metadata, segment, 16 * MiB, "tcp", "", cluster.master)
    else:
        rc = s.setup("127.0.0.1", cluster.metadata, segment, 16 * MiB, "tcp", "",
                     cluster.master, tenant_id=tenant)
    assert rc == 0, rc
    return s


def http(method, url, body=None):
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture(scope="module")
def mt(tmp_path_factory):
    path = policy_file(tmp_path_factory.mktemp("tenants") / "quotas.yaml",
                       [("a", "8MB"), ("b", "8MB"), ("q", "1MB"), ("n-empty", "1MB")])
    m = MtMaster(path)
    # The storage: a 64 MiB segment of a tenant's client.
    owner = store_as(m, "a", segment=64 * MiB)
    try:
        yield m
    finally:
        owner.close()
        assert m.stop() == 0, m.proc.output()


def test_the_same_key_in_two_tenants_holds_two_values(mt):
    a, b, c = store_as(mt, "a", 0), store_as(mt, "b", 0), store_as(mt, "c", 0)
    try:
        assert a.put("iso-k", b"A" * 1000) == 0
        assert b.put("iso-k", b"B" * 2000) == 0
        assert a.get("iso-k") == b"A" * 1000
        assert b.get("iso-k") == b"B" * 2000
        assert a.get_size("iso-k") == 1000 and b.get_size("iso-k") == 2000
        # A tenant without the key (registered or not) does not see it.
        assert c.is_exist("iso-k") == 0
        assert c.get_size("iso-k") == OBJECT_NOT_FOUND
        assert c.get("iso-k") == b""
        assert a.batch_is_exist(["iso-k", "iso-x"]) == [1, 0]
        assert b.remove("iso-k", force=True) == 0
        assert a.get("iso-k") == b"A" * 1000
        assert b.is_exist("iso-k") == 0
        # Removals of many keys reach only the caller's tenant.
        assert b.put("iso-r1", b"x") == 0 and b.put("iso-r2", b"y") == 0
        assert b.remove_by_regex("^iso-") == 2
        assert a.is_exist("iso-k") == 1
        assert b.put("iso-z", b"z") == 0
        assert b.remove_all(force=True) == 1
        # So do replica clears, their keys answered as the caller named them.
        assert b.put("iso-k", b"B") == 0
        assert b.batch_replica_clear(["iso-k", "iso-none"], "") == ["iso-k"]
        assert b.is_exist("iso-k") == 0
        assert a.get("iso-k") == b"A" * 1000
        assert a.remove("iso-k", force=True) == 0
    finally:
        for s in (a, b, c):
            s.close()


def test_writes_need_a_registered_tenant(mt):
    default, nobody, bad = store_as(mt, None, 0), store_as(mt, "nobody", 0), store_as(mt, "_bad", 0)
    try:
        # `default` is not special: it has no policy here.
        assert default.put("reg-k", b"v") == TENANT_NOT_REGISTERED
        assert nobody.put("reg-k", b"v") == TENANT_NOT_REGISTERED
        assert bad.put("reg-k", b"v") == TENANT_NOT_REGISTERED
        assert bad.get_size("reg-k") == INVALID_PARAMS
        assert bad.remove("reg-k") == INVALID_PARAMS
        assert bad.remove_by_regex("reg") == INVALID_PARAMS
        assert bad.remove_all(force=True) == 0
        assert nobody.get_size("reg-k") == OBJECT_NOT_FOUND
    finally:
        for s in (default, nobody, bad):
            s.close()


def test_quotas_evict_the_tenants_own_objects_then_refuse(mt):
    q = store_as(mt, "q", 0)
    try:
        first = os.urandom(600 * KiB)
        assert q.put("quota-1", first) == 0
        # Over the quota: q's own unread object makes room.
        assert q.put("quota-2", os.urandom(600 * KiB)) == 0
        assert q.is_exist("quota-1") == 0 and q.is_exist("quota-2") == 1
        # Larger than the whole quota: refused, nothing stored.
        assert q.put("quota-big", os.urandom(2 * MiB)) == TENANT_QUOTA_EXCEEDED
        assert q.is_exist("quota-big") == 0
        # A batch stores what fits.
        assert q.remove_all(force=True) >= 1
        values = [os.urandom(400 * KiB) for _ in range(3)]
        rc = q.put_batch(["qb-1", "qb-2", "qb-3"], values)
        assert rc == TENANT_QUOTA_EXCEEDED, rc
        assert [q.is_exist(k) for k in ["qb-1", "qb-2", "qb-3"]] == [1, 1, 0]
        _, body = http("GET", f"{mt.admin}/api/v1/tenant_quotas?tenant_id=q")
        assert body["data"]["charged_bytes"] == 800 * KiB
        metrics = urllib.request.urlopen(f"{mt.admin}/metrics", timeout=30).read().decode()
        assert 'mooncake_tenant_quota_charged_bytes{tenant_id="q"} 819200' in metrics
        assert 'mooncake_tenant_quota_reject_total{tenant_id="q",reason="quota_exceeded"}' in metrics
        assert 'mooncake_tenant_quota_evict_bytes_total{tenant_id="q"}' in metrics
        assert q.remove_all(force=True) == 2
    finally:
        q.close()


def test_admin_api(mt):
    api = f"{mt.admin}/api/v1/tenant_quotas"
    status, body = http("GET", api)
    assert status == 200 and body["success"]
    names = {t["tenant_id"] for t in body["data"]}
    assert {"a", "b", "q"} <= names
    status, body = http("GET", f"{api}?tenant_id=a")
    assert status == 200
    a = body["data"]
    assert a["requested_quota_bytes"] == 8 * MiB and a["effective_quota_bytes"] == 8 * MiB
    assert a["has_explicit_policy"] and not a["admission_closed"] and not a["over_quota"]
    assert http("GET", f"{api}?tenant_id=unknown")[0] == 404
    body_of(400, INVALID_PARAMS, http("GET", f"{api}?tenant_id=_x"))
    # A new tenant: its writes are admitted, and the policy file keeps it.
    n = store_as(mt, "n", 0)
    try:
        assert n.put("adm-k", b"v") == TENANT_NOT_REGISTERED
        status, body = http("PUT", f"{api}?tenant_id=n", {"requested_quota_bytes": MiB})
        assert status == 200 and body["data"]["requested_quota_bytes"] == MiB, body
        assert "name: \"n\"" in mt.policy.read_text()
        assert n.put("adm-k", b"v") == 0
        for bad in [b"{", {"requested_quota_bytes": 0}, {"requested_quota_bytes": -1},
                    {"requested_quota_bytes": 1 << 63}, {"other": 1}]:
            status, body = http("PUT", f"{api}?tenant_id=n", bad)
            assert (status, body["error_code"]) == (400, INVALID_PARAMS), bad
        assert http("PUT", api, {"requested_quota_bytes": 1})[0] == 400
        status, body = http("DELETE", f"{api}?tenant_id=n")
        assert (status, body["error_code"]) == (409, TENANT_NOT_EMPTY)
        assert n.remove("adm-k") == 0
        status, body = http("DELETE", f"{api}?tenant_id=n")
        assert status == 200 and body["success"], body
        assert n.put("adm-k", b"v") == TENANT_NOT_REGISTERED
        assert "name: \"n\"" not in mt.policy.read_text()
        status, body = http("DELETE", f"{api}?tenant_id=never")
        assert (status, body["error_code"]) == (404, OBJECT_NOT_FOUND)
        status, body = http("DELETE", f"{api}?tenant_id=n-empty")
        assert status == 200
    finally:
        n.close()


def body_of(status, code, answer):
    got_status, body = answer
    assert got_status == status and body["error_code"] == code, answer
    return body


def test_the_admin_api_needs_multi_tenant_mode():
    c = Cluster()
    try:
        url = f"http://{procs.LOOPBACK}:{c.metrics_port}/api/v1/tenant_quotas"
        status, body = http("GET", url)
        assert (status, body["error_code"]) == (409, UNAVAILABLE_IN_CURRENT_MODE)
        # The tenant is ignored: every client sees the default namespace.
        a, b = store_as(c, "a"), store_as(c, "b", 0)
        try:
            assert a.put("off-k", b"v") == 0
            assert b.get("off-k") == b"v"
        finally:
            b.close()
            a.close()
    finally:
        assert c.stop() == 0


def test_setup_dict_and_the_environment_name_the_tenant(mt, monkeypatch):
    from mooncake.mooncake_config import MooncakeConfig

    a = store_as(mt, "a", 0, as_dict=True)
    b = store_as(mt, "b", 0)
    try:
        assert a.put("dict-k", b"from-a") == 0
        assert b.is_exist("dict-k") == 0
        assert a.remove("dict-k") == 0
    finally:
        a.close()
        b.close()
    monkeypatch.setenv("MOONCAKE_MASTER", mt.master)
    monkeypatch.setenv("MOONCAKE_TENANT_ID", "team-x")
    assert MooncakeConfig.load_from_env().tenant_id == "team-x"


@pytest.mark.parametrize("text, ok", [
    ("version: 1\ntenants: []\n", True),
    ("version: 1\ntenants:\n  - name: a\n    quota: 1GB\n", True),
    ("version: 2\ntenants: []\n", False),
    ("tenants: []\n", False),
    ("version: 1\ntenants:\n  - name: a\n    quota: 1gb\n", False),
    ("version: 1\ntenants:\n  - name: a\n    quota: 0\n", False),
    ("version: 1\ntenants:\n  - name: a\n    quota: 9223372036854775808\n", False),
    ("version: 1\ntenants:\n  - name: _a\n    quota: 1\n", False),
    ("version: 1\ntenants:\n  - name: a\n    quota: 1\n  - name: a\n    quota: 2\n", False),
    ("version: [\n", False),
])
def test_policy_files_are_checked_at_start(tmp_path, text, ok):
    path = tmp_path / "q.yaml"
    path.write_text(text)
    p = procs.start("mooncake_master", f"--rpc_port={procs.free_port()}",
                    f"--rpc_address={procs.LOOPBACK}", f"--metrics_port={procs.free_port()}",
                    "--enable_multi_tenants=true", f"--tenant_quota_connector_uri={path}")
    try:
        if ok:
            p.wait_for_line(r"mooncake_master listening on rpc=", timeout=60)
        else:
            assert p.p.wait(60) != 0, p.output()
            assert "tenant" in p.output().lower(), p.output()
    finally:
        p.stop()


@pytest.mark.parametrize("flags", [
    ["--tenant_quota_connector_uri=/nonexistent/q.yaml"],
    ["--tenant_quota_connector_uri="],
    ["--tenant_quota_connector_type=s3", "--tenant_quota_connector_uri=bucket"],
    # An etcd that does not answer (nothing listens on a free port).
    ["--tenant_quota_connector_type=etcd", "--tenant_quota_connector_uri=127.0.0.1:{port}"],
])
def test_a_missing_policy_or_unknown_connector_stops_the_start(flags):
    flags = [f.format(port=procs.free_port()) for f in flags]
    p = procs.start("mooncake_master", f"--rpc_port={procs.free_port()}",
                    f"--metrics_port={procs.free_port()}", "--enable_multi_tenants=true", *flags)
    try:
        assert p.p.wait(120) != 0, p.output()
    finally:
        p.stop()


def test_a_restart_keeps_every_tenants_objects_and_quotas(tmp_path):
    path = policy_file(tmp_path / "q.yaml", [("a", "8MB"), ("b", "8MB")])
    m = MtMaster(path, "--enable_oplog=true", "--enable_snapshot=true",
                 "--enable_snapshot_restore=true", f"--wal_dir={tmp_path / 'wal'}",
                 "--client_ttl=30",
                 env={"MOONCAKE_SNAPSHOT_LOCAL_PATH": str(tmp_path / "snapshots")})
    a = b = None
    try:
        a, b = store_as(m, "a", 32 * MiB), store_as(m, "b", 0)
        assert a.put("rs-k", b"A" * 4096) == 0
        assert b.put("rs-k", b"B" * 8192) == 0
        api = f"{m.admin}/api/v1/tenant_quotas"
        assert http("PUT", f"{api}?tenant_id=c", {"requested_quota_bytes": 3 * MiB})[0] == 200
        assert m.stop() == 0
        m.start()
        status, body = http("GET", f"{api}?tenant_id=b")
        assert status == 200 and body["data"]["charged_bytes"] == 8192, body
        assert http("GET", f"{api}?tenant_id=c")[1]["data"]["requested_quota_bytes"] == 3 * MiB
        # Restored segments serve once their owner is heard from again.
        deadline = time.monotonic() + 60
        while a.get("rs-k") != b"A" * 4096 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert a.get("rs-k") == b"A" * 4096
        assert b.get("rs-k") == b"B" * 8192
    finally:
        for s in (a, b):
            if s is not None:
                s.close()
        m.stop()


def test_dummy_clients_act_as_their_mooncake_clients_tenant(mt):
    from mooncake.store import MooncakeDistributedStore

    port = procs.free_port()
    rc = procs.start("mooncake_client", f"--master_server_address={mt.master}",
                     f"--metadata_server={mt.metadata}", f"--host={procs.LOOPBACK}",
                     f"--port={port}", "--global_segment_size=16 MB", "--protocol=tcp",
                     "--tenant_id=b")
    d = MooncakeDistributedStore()
    a, b = store_as(mt, "a", 0), store_as(mt, "b", 0)
    try:
        rc.wait_for_line(r"mooncake_client ready", timeout=60)
        assert d.setup_dummy(16 * MiB, 16 * MiB, f"{procs.LOOPBACK}:{port}") == 0
        assert d.put("dummy-t", b"from-dummy") == 0
        assert b.get("dummy-t") == b"from-dummy"
        assert a.is_exist("dummy-t") == 0
        assert b.remove("dummy-t", force=True) == 0
    finally:
        d.close()
        a.close()
        b.close()
        assert rc.stop() == 0, rc.output()
