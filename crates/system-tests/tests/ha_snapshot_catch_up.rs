//! A standby with its log on disk (`--wal_dir`) and a snapshot directory
//! of its own that caught up from its leader's snapshot restarts its log
//! after that snapshot. Killed with `kill -9` before it takes a snapshot
//! of its own, it must still start again from its directories: the
//! leader's snapshot is stored there before the log restarts. Found by the
//! nemesis (a standby restarted after a fault, killed again): it failed
//! every start with DESERIALIZE_FAIL ("the replicated log starts after
//! entry N, but the newest snapshot is at M"), so the cluster was never
//! whole again.

mod common;

use std::path::Path;

use common::ha::{
    cluster, in_sync, mounted_client, put_keys, replication_field, role, start_master_in, Master,
};
use common::{eventually, free_port, WAIT};
use test_support::services;

fn start(etcd: &str, cluster: &str, ports: (u16, u16), dir: &Path, extra: &[&str]) -> Master {
    let wal = format!("--wal_dir={}", dir.join("wal").display());
    let mut args = vec![wal.as_str()];
    args.extend_from_slice(extra);
    start_master_in(
        etcd,
        cluster,
        ports.0,
        ports.1,
        120,
        Some(&dir.join("snapshots")),
        &args,
    )
}

#[test]
fn a_standby_killed_after_loading_the_leaders_snapshot_starts_again() {
    let etcd = services::etcd();
    let cluster = cluster("snapcatchup");
    let dirs = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (dirs.path().join("a"), dirs.path().join("b"));
    let a_ports = (free_port(), free_port());
    let b_ports = (free_port(), free_port());
    let a = start(&etcd.addr, &cluster, a_ports, &a_dir, &[]);
    a.up.recv_timeout(WAIT).expect("A leads");

    let client_id = 7u128;
    let m = mounted_client(&etcd.addr, &cluster, client_id);
    let keys: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
    for chunk in keys.chunks(100) {
        put_keys(&m, client_id, chunk);
    }
    let written = replication_field(&a, "last_seq");
    eventually("the leader's log is compacted behind a snapshot", || {
        let _ = m.ping(client_id);
        replication_field(&a, "log_base") >= written
    });

    // B takes no snapshot of its own within the test: the one it loads
    // from A is all it has.
    let b_extra = ["--snapshot_interval_seconds=3600"];
    let mut b = start(&etcd.addr, &cluster, b_ports, &b_dir, &b_extra);
    eventually("B catches up and joins the in-sync set", || {
        let _ = m.ping(client_id);
        in_sync(&a) == 1
    });
    assert!(
        replication_field(&b, "log_base") >= written,
        "B started from A's snapshot, not from the first entry"
    );
    b.proc.kill9();
    eventually("A sees B gone", || {
        let _ = m.ping(client_id);
        in_sync(&a) == 0
    });

    let mut b = start(&etcd.addr, &cluster, b_ports, &b_dir, &b_extra);
    eventually("B, restarted on its directories, is in sync again", || {
        let _ = m.ping(client_id);
        assert!(
            b.proc.0.try_wait().unwrap().is_none(),
            "B exited after its restart"
        );
        in_sync(&a) == 1
    });
    assert_eq!(role(&b).as_deref(), Some("standby"));
    b.proc.kill9();
}
