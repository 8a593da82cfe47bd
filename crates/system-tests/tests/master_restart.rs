//! A single `mooncake_master` with the local write-ahead log and local
//! snapshots, killed with -9 and restarted on the same directories:
//! every acknowledged put comes back byte-exact (before and after the
//! last snapshot), acknowledged removes stay removed, and the storage
//! client keeps its segment without mounting it again.
//!
//! Waits are bounded hang guards, never speed checks.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{
    code, eventually, free_port, metadata_server, spawn_until_line, value, MasterPorts, Proc,
    MASTER, STORAGE,
};
use mooncake_common::ErrorCode;
use mooncake_store::client::{Client, ClientConfig};

fn master(port: u16, dir: &Path, client_ttl: u32) -> Proc {
    let ports = MasterPorts {
        rpc: port,
        ..MasterPorts::ANY
    };
    master_with(ports, dir, client_ttl, &[])
}

fn master_with(ports: MasterPorts, dir: &Path, client_ttl: u32, extra: &[String]) -> Proc {
    let mut args = ports.args();
    args.extend([
        "--rpc_address=127.0.0.1".into(),
        "--metrics_host=127.0.0.1".into(),
        format!("--client_ttl={client_ttl}"),
        "--default_kv_lease_ttl=50".into(),
        "--enable_oplog=true".into(),
        "--enable_snapshot=true".into(),
        "--enable_snapshot_restore=true".into(),
        "--snapshot_interval_seconds=1".into(),
        "--snapshot_retention_count=2".into(),
        format!("--wal_dir={}", dir.join("wal").display()),
    ]);
    args.extend(extra.iter().cloned());
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log_path = dir.join(format!("master-{n}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut p = Proc(
        Command::new(&*MASTER)
            .args(&args)
            .env("MOONCAKE_SNAPSHOT_LOCAL_PATH", dir.join("snapshots"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    eventually("the master listens", || {
        if let Some(status) = p.0.try_wait().unwrap() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!("master exited ({status}):\n{log}");
        }
        std::net::TcpStream::connect(("127.0.0.1", ports.rpc)).is_ok()
    });
    p
}

fn snapshots(dir: &Path) -> Vec<String> {
    let dir = dir.join("snapshots/mooncake_master_snapshot/mooncake_cluster");
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("snapshot-"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A store client of the master on `port`, with a segment of
/// `segment` bytes (0: none) and a local buffer of `buffer`.
fn client(port: u16, metadata: &str, segment: u64, buffer: u64) -> Client {
    Client::setup(&ClientConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata.to_string(),
        global_segment_size: segment,
        local_buffer_size: buffer,
        protocol: "tcp".into(),
        device_name: String::new(),
        master_server_address: format!("127.0.0.1:{port}"),
        ..ClientConfig::default()
    })
    .unwrap()
}

#[test]
fn kill_9_and_restart_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (_meta, metadata) = metadata_server();
    let mut m = master(port, dir.path(), 5);
    let client = client(port, &metadata, 64 << 20, 32 << 20);

    let key = |i: usize| format!("obj-{i}");
    for i in 0..200 {
        let v = value(&key(i), 4096 + i);
        client.put(&key(i), &v, &Default::default()).unwrap();
    }
    for i in 0..20 {
        client.remove(&key(i), false).unwrap();
    }
    // A snapshot covers those; the next ones are only in the log.
    let first = snapshots(dir.path());
    eventually("a snapshot after the first puts", || {
        let now = snapshots(dir.path());
        !now.is_empty() && now != first
    });
    for i in 200..400 {
        let v = value(&key(i), 4096 + i);
        client.put(&key(i), &v, &Default::default()).unwrap();
    }
    for i in 200..210 {
        client.remove(&key(i), false).unwrap();
    }

    m.kill9();
    let _m = master(port, dir.path(), 5);

    // The client's heartbeat reaches the restarted master, which knows it:
    // its segment is served again, nothing was remounted.
    eventually("objects readable after the restart", || {
        client.get(&key(399)).is_ok()
    });
    for i in 0..400 {
        let removed = i < 20 || (200..210).contains(&i);
        let got = client.get(&key(i));
        if removed {
            assert_eq!(code(got), ErrorCode::OBJECT_NOT_FOUND, "{}", key(i));
        } else {
            assert_eq!(got.unwrap(), value(&key(i), 4096 + i), "{}", key(i));
        }
    }
    // And the restarted master takes new writes as before.
    client
        .put("after", b"restart", &Default::default())
        .unwrap();
    assert_eq!(client.get("after").unwrap(), b"restart");
}

#[test]
fn segments_of_an_owner_that_does_not_come_back_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (_meta, metadata) = metadata_server();
    let mut m = master(port, dir.path(), 1);
    // The owner: a storage process contributing the only segment.
    let (mut owner, _) = spawn_until_line(
        &STORAGE,
        &[
            format!("--master_server_address=127.0.0.1:{port}"),
            format!("--metadata_server={metadata}"),
            "--host=127.0.0.1".into(),
            "--port=0".into(),
            "--global_segment_size=16MB".into(),
        ],
        "mooncake_client ready",
    );
    let writer = client(port, &metadata, 0, 16 << 20);
    let v = value("orphan", 8192);
    writer.put("orphan", &v, &Default::default()).unwrap();
    assert_eq!(writer.get("orphan").unwrap(), v);
    m.kill9();
    owner.kill9();
    let _m = master(port, dir.path(), 1);
    // Never served while unverified; dropped once the owner's TTL ran out.
    eventually("the orphan's object is dropped", || {
        let r = writer.get("orphan");
        assert!(r.is_err(), "served bytes of a segment nobody verified");
        code(r) == ErrorCode::OBJECT_NOT_FOUND
    });
}

/// With the master's embedded HTTP metadata server, a restart loses every
/// transfer-engine descriptor; the owners publish theirs again, so a
/// client started after the restart opens the existing segment and reads
/// the objects on it.
#[test]
fn a_new_client_opens_existing_segments_after_a_restart_with_the_embedded_metadata_server() {
    let dir = tempfile::tempdir().unwrap();
    let (port, meta_port) = (free_port(), free_port());
    let embedded = [
        "--enable_http_metadata_server=true".to_string(),
        "--http_metadata_server_host=127.0.0.1".into(),
    ];
    let ports = MasterPorts {
        rpc: port,
        metadata: meta_port,
        ..MasterPorts::ANY
    };
    let metadata = format!("http://127.0.0.1:{meta_port}/metadata");
    let mut m = master_with(ports, dir.path(), 5, &embedded);
    let (_owner, _) = spawn_until_line(
        &STORAGE,
        &[
            format!("--master_server_address=127.0.0.1:{port}"),
            format!("--metadata_server={metadata}"),
            "--host=127.0.0.1".into(),
            "--port=0".into(),
            "--global_segment_size=16MB".into(),
        ],
        "mooncake_client ready",
    );
    let pure = |metadata: &str| client(port, metadata, 0, 16 << 20);
    let writer = pure(&metadata);
    let v = value("on-the-owner", 8192);
    writer.put("on-the-owner", &v, &Default::default()).unwrap();
    drop(writer);

    m.kill9();
    let _m = master_with(ports, dir.path(), 5, &embedded);
    let reader = pure(&metadata);
    eventually(
        "a new client reads through the owner's segment",
        || match reader.get("on-the-owner") {
            Ok(got) => {
                assert_eq!(got, v, "wrong bytes");
                true
            }
            Err(_) => false,
        },
    );
}

/// Object groups come back from the snapshot and from the log: after a
/// kill -9, an upsert naming another group than an object's is still
/// refused, one naming its own is taken.
#[test]
fn a_restart_keeps_object_groups() {
    use mooncake_store::types::{ReplicaPolicy, WriteOptions};
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (_meta, metadata) = metadata_server();
    let mut m = master(port, dir.path(), 5);
    let client = client(port, &metadata, 16 << 20, 16 << 20);
    let group = |g: &str| ReplicaPolicy {
        group_ids: Some(vec![g.into()]),
        ..ReplicaPolicy::default()
    };
    client.put("in-snapshot", b"v1", &group("snap")).unwrap();
    let first = snapshots(dir.path());
    eventually("a snapshot after the first put", || {
        let now = snapshots(dir.path());
        !now.is_empty() && now != first
    });
    client.put("in-log", b"v1", &group("log")).unwrap();

    m.kill9();
    let _m = master(port, dir.path(), 5);
    eventually("objects readable after the restart", || {
        client.get("in-log").is_ok()
    });
    for (key, own, other) in [("in-snapshot", "snap", "log"), ("in-log", "log", "snap")] {
        let refused = client.put(key, b"v2", WriteOptions::upsert(&group(other)));
        assert_eq!(code(refused), ErrorCode::INVALID_PARAMS, "{key}");
        assert_eq!(client.get(key).unwrap(), b"v1", "{key}");
        client
            .put(key, b"v3", WriteOptions::upsert(&group(own)))
            .unwrap();
        assert_eq!(client.get(key).unwrap(), b"v3", "{key}");
    }
}
