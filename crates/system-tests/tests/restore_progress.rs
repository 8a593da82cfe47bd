//! A `mooncake_master` restoring a large snapshot answers on its HTTP port
//! while it restores: `/metrics` shows `master_snapshot_restore_objects`
//! climbing below `master_snapshot_restore_objects_expected`, `/health`
//! says it is not ready and the data endpoints answer 503; once restored,
//! the count reaches the total and the master serves.
//!
//! The snapshot is written with the library (a state machine filled in
//! process, encoded as the master's snapshot thread would). Waits are
//! bounded hang guards, never speed checks.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, MasterPorts, Proc, MASTER};
use mooncake_store::master::durable::snapshot::format::{encode, SnapshotMeta};
use mooncake_store::master::durable::snapshot::store::{snapshot_name, LocalStore, SnapshotStore};
use mooncake_store::master::{MasterConfig, MasterService};
use mooncake_store::types::{ReplicaPolicy, SegmentInfo};

/// Enough objects that the restore takes many publishing steps (one per
/// 4096 objects) for a scraper to see.
const OBJECTS: u64 = 200_000;

/// Writes a snapshot of `OBJECTS` objects where a master with
/// `MOONCAKE_SNAPSHOT_LOCAL_PATH=<dir>/snapshots` restores from.
fn write_snapshot(dir: &Path) {
    let service = MasterService::new(&MasterConfig::default());
    let seg = SegmentInfo {
        name: "restore-test".into(),
        base: 1 << 40,
        size: 1 << 44,
        transport_endpoint: "127.0.0.1:1".into(),
    };
    service.mount_segment(1, &seg, 1).unwrap();
    let cfg = ReplicaPolicy::default();
    for i in 0..OBJECTS {
        let key = format!("restore/{i:09}");
        service.put_start(1, &key, 4096, &cfg, false, 1).unwrap();
        service.put_end(1, &key, 1).unwrap();
    }
    let meta = SnapshotMeta {
        seq: 7,
        term: 0,
        now: 1,
    };
    let bytes = encode(&service, meta);
    let store =
        LocalStore::new(dir.join("snapshots/mooncake_master_snapshot/mooncake_cluster")).unwrap();
    store.put(&snapshot_name(7), &bytes).unwrap();
}

/// (status, body) of `GET path`, or None while nothing answers.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split(' ').nth(1)?.parse().ok()?;
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Some((status, body))
}

fn sample(body: &str, name: &str) -> Option<u64> {
    body.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
}

#[test]
fn metrics_show_a_restore_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    write_snapshot(dir.path());
    let (rpc, http) = (free_port(), free_port());
    let log = std::fs::File::create(dir.path().join("master.log")).unwrap();
    let mut master = Proc(
        Command::new(&*MASTER)
            .args(
                MasterPorts {
                    rpc,
                    metrics: http,
                    ..MasterPorts::ANY
                }
                .args(),
            )
            .args([
                "--rpc_address=127.0.0.1",
                "--metrics_host=127.0.0.1",
                "--enable_snapshot_restore=true",
            ])
            .env("MOONCAKE_SNAPSHOT_LOCAL_PATH", dir.path().join("snapshots"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );

    // Scrape until the master serves; record what was seen on the way.
    let mut partial = Vec::new();
    let mut restoring_health = None;
    let mut restoring_data = None;
    let deadline = Instant::now() + Duration::from_secs(600);
    let done = loop {
        assert!(Instant::now() < deadline, "the restore did not finish");
        if let Some(status) = master.0.try_wait().unwrap() {
            let log = std::fs::read_to_string(dir.path().join("master.log")).unwrap_or_default();
            panic!("master exited ({status}):\n{log}");
        }
        let Some((200, body)) = get(http, "/metrics") else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let objects = sample(&body, "master_snapshot_restore_objects");
        let expected = sample(&body, "master_snapshot_restore_objects_expected");
        if let (Some(o), Some(OBJECTS)) = (objects, expected) {
            if o < OBJECTS {
                partial.push(o);
                if restoring_health.is_none() {
                    restoring_health = get(http, "/health");
                    restoring_data = get(http, "/get_all_keys");
                }
            }
        }
        // The full service exports the families of a running master.
        if body.contains("master_key_count") {
            break body;
        }
    };

    assert!(
        partial.iter().any(|&o| o > 0),
        "no progress between 0 and {OBJECTS} was seen during the restore: {partial:?}"
    );
    assert!(
        partial.windows(2).all(|w| w[0] <= w[1]),
        "progress never goes back: {partial:?}"
    );
    let (status, body) = restoring_health.expect("/health answered during the restore");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("\"service_ready\":false"), "{body}");
    let (status, body) = restoring_data.expect("/get_all_keys answered during the restore");
    assert_eq!(status, 503, "{body}");

    assert_eq!(
        sample(&done, "master_snapshot_restore_objects"),
        Some(OBJECTS)
    );
    assert_eq!(
        sample(&done, "master_snapshot_restore_objects_expected"),
        Some(OBJECTS)
    );
    assert_eq!(sample(&done, "master_key_count"), Some(OBJECTS));
    let (status, body) = get(http, "/health").unwrap();
    assert_eq!(status, 200, "{body}");
}
