//! Tenants on replicated HA masters (`--enable_ha --enable_oplog
//! --enable_multi_tenants`) on a real etcd: a `kill -9` of the leader, then
//! of every master at once, keeps each tenant's objects (the same key in
//! two tenants, two values), what each tenant is charged, and the quota
//! an admin set through the first leader (the masters share the policy
//! file, or keep the policies in etcd). Waits are bounded hang guards,
//! never speed checks.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::ha::{cluster, in_sync, leader, role, start_master_in, Master};
use common::{code, eventually, free_port, metadata_server, value, WAIT};
use mooncake_common::ErrorCode;
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::types::ReplicaPolicy;
use test_support::services;

const MIB: usize = 1 << 20;

/// One HTTP request with a JSON body; the status and the body answered.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let status = resp.split_whitespace().nth(1)?.parse().ok()?;
    let (_, body) = resp.split_once("\r\n\r\n")?;
    Some((status, body.to_string()))
}

/// A number of `tenant`'s entry in `m`'s quota table.
fn quota_field(m: &Master, tenant: &str, name: &str) -> Option<u64> {
    let path = format!("/api/v1/tenant_quotas?tenant_id={tenant}");
    let (status, body) = http(m.http, "GET", &path, "")?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["data"][name].as_u64()
}

/// A store client of `tenant` holding a segment of `segment` bytes.
fn client_of(tenant: &str, master: &str, cluster: &str, metadata: &str, segment: u64) -> Client {
    Client::setup(&ClientConfig {
        cluster_id: cluster.to_string(),
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata.to_string(),
        global_segment_size: segment,
        local_buffer_size: 32 << 20,
        protocol: "tcp".into(),
        device_name: String::new(),
        master_server_address: master.to_string(),
        tenant_id: tenant.into(),
        ..ClientConfig::default()
    })
    .unwrap()
}

/// What each tenant holds and is charged, through `leader`.
fn assert_tenants_kept(leader: &Master, a: &Client, b: &Client, what: &str) {
    // The leader serves the objects once the segment's owner is heard
    // from, and each client once it has found the leader (a call made
    // under the last term is refused, and the client looks again).
    eventually(&format!("{what}: a reads its key"), || {
        a.get("k").ok() == Some(value("a", 4096))
    });
    eventually(&format!("{what}: b reads its key"), || {
        b.get("k").ok() == Some(value("b", 8192))
    });
    assert_eq!(a.get("only-a").unwrap(), value("only-a", MIB), "{what}");
    assert_eq!(code(b.get("only-a")), ErrorCode::OBJECT_NOT_FOUND, "{what}");
    assert_eq!(
        quota_field(leader, "a", "charged_bytes"),
        Some(4096 + MIB as u64),
        "{what}"
    );
    assert_eq!(
        quota_field(leader, "b", "charged_bytes"),
        Some(8192),
        "{what}"
    );
    assert_eq!(
        quota_field(leader, "c", "requested_quota_bytes"),
        Some(3 << 20),
        "{what}: the quota set through the first leader"
    );
    // Admission goes on: b's quota is 8 MiB.
    let big = vec![7u8; 9 * MIB];
    assert_eq!(
        code(b.put("big", &big, &ReplicaPolicy::default())),
        ErrorCode::TENANT_QUOTA_EXCEEDED,
        "{what}"
    );
    assert_eq!(code(b.get("big")), ErrorCode::OBJECT_NOT_FOUND, "{what}");
}

const POLICIES: &str =
    "version: 1\ntenants:\n  - name: a\n    quota: 8MB\n  - name: b\n    quota: 8MB\n";

/// The masters share the policy file.
#[test]
fn a_failover_and_a_restart_keep_every_tenants_objects_and_charges() {
    let etcd = services::etcd();
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("quotas.yaml");
    std::fs::write(&policy, POLICIES).unwrap();
    let uri = format!("--tenant_quota_connector_uri={}", policy.display());
    let flags = ["--enable_multi_tenants=true", uri.as_str()];
    failover_and_restart(&etcd.addr, "tenants", &dir, &flags);
}

/// The policies live in etcd, as the reference's etcd connector keeps
/// them (under a key of the cluster, none at first).
#[test]
fn with_the_etcd_connector_too() {
    let etcd = services::etcd();
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("--tenant_quota_connector_uri={}", etcd.addr);
    let flags = [
        "--enable_multi_tenants=true",
        "--tenant_quota_connector_type=etcd",
        uri.as_str(),
    ];
    failover_and_restart(&etcd.addr, "tenants-etcd", &dir, &flags);
}

fn failover_and_restart(etcd: &str, test: &str, dir: &tempfile::TempDir, flags: &[&str]) {
    let cluster = cluster(test);
    let (_meta, metadata) = metadata_server();
    let snaps = dir.path().join("ha");
    std::fs::create_dir(&snaps).unwrap();
    let ports: Vec<(u16, u16)> = (0..2).map(|_| (free_port(), free_port())).collect();
    let start = |i: usize| {
        start_master_in(
            etcd,
            &cluster,
            ports[i].0,
            ports[i].1,
            30,
            Some(snaps.as_path()),
            flags,
        )
    };
    let mut masters = vec![start(0)];
    masters[0].up.recv_timeout(WAIT).expect("A leads");
    masters.push(start(1));
    eventually("B in sync", || in_sync(&masters[0]) == 1);

    let master = format!("etcd://{etcd}");
    // Through the first leader (for the file, the quotas it holds already).
    for t in ["a", "b"] {
        let body = format!("{{\"requested_quota_bytes\":{}}}", 8 << 20);
        let path = format!("/api/v1/tenant_quotas?tenant_id={t}");
        let (status, answer) = http(masters[0].http, "PUT", &path, &body).unwrap();
        assert_eq!(status, 200, "{answer}");
    }
    let a = client_of("a", &master, &cluster, &metadata, 64 << 20);
    let b = client_of("b", &master, &cluster, &metadata, 0);
    let cfg = ReplicaPolicy::default();
    a.put("k", &value("a", 4096), &cfg).unwrap();
    b.put("k", &value("b", 8192), &cfg).unwrap();
    a.put("only-a", &value("only-a", MIB), &cfg).unwrap();
    let body = format!("{{\"requested_quota_bytes\":{}}}", 3 << 20);
    let (status, answer) = http(
        masters[0].http,
        "PUT",
        "/api/v1/tenant_quotas?tenant_id=c",
        &body,
    )
    .unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_tenants_kept(&masters[0], &a, &b, "before");

    masters[0].proc.kill9();
    eventually("B leads", || role(&masters[1]).as_deref() == Some("leader"));
    assert_tenants_kept(&masters[1], &a, &b, "after a failover");

    // A comes back as a standby; then every master goes at once and comes
    // back from its log on disk.
    masters[0] = start(0);
    eventually("A in sync", || in_sync(&masters[1]) == 1);
    for m in &mut masters {
        m.proc.kill9();
    }
    let restarted: Vec<Master> = (0..2).map(start).collect();
    let l = leader(&restarted);
    assert_tenants_kept(&restarted[l], &a, &b, "after a restart of every master");
}
