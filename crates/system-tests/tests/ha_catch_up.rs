//! Replicated HA with each master's log and snapshots on its own
//! directory (as on separate hosts): a standby that comes back from its
//! directory after its leader compacted the log past its last entry.
//!
//! The leader can no longer send the entries it lacks, so it answers with
//! its snapshot; the standby loads it in place of what it restored and
//! pulls the tail. It must then hold every acknowledged write: once the
//! leader is killed it serves every object. Waits are bounded hang
//! guards, never speed checks.

mod common;

use std::time::Duration;

use common::ha::{
    cluster, in_sync, mounted_client, put_keys, replication_field, role, start_master_in,
};
use common::{eventually, free_port, WAIT};
use test_support::services;

#[test]
fn a_standby_back_from_its_directory_behind_the_compacted_log_catches_up() {
    let etcd = services::etcd();
    let cluster = cluster("behind-compacted");
    // One directory per master: its own snapshots and its own log.
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let ports: Vec<(u16, u16)> = (0..2).map(|_| (free_port(), free_port())).collect();
    let start = |i: usize| {
        start_master_in(
            &etcd.addr,
            &cluster,
            ports[i].0,
            ports[i].1,
            120,
            Some(dirs[i].path()),
            &[],
        )
    };
    let mut a = start(0);
    a.up.recv_timeout(WAIT).expect("A leads");
    let mut b = start(1);
    eventually("B in sync", || in_sync(&a) == 1);

    let client_id = 61u128;
    let m = mounted_client(&etcd.addr, &cluster, client_id);
    let mut keys: Vec<String> = Vec::new();
    let put = |ks: Vec<String>, keys: &mut Vec<String>| {
        put_keys(&m, client_id, &ks);
        keys.extend(ks);
    };
    put((0..500).map(|i| format!("before-{i}")).collect(), &mut keys);
    eventually("B stored a snapshot of its own", || {
        replication_field(&b, "snapshot_seq") > 0
    });
    put((0..500).map(|i| format!("held-{i}")).collect(), &mut keys);
    let b_last = replication_field(&b, "last_seq");
    assert!(b_last >= 2000, "B holds every put: {b_last}");
    b.proc.kill9();

    // A goes on alone; once it has forgotten B it compacts its log behind
    // a snapshot past B's last entry.
    put((0..500).map(|i| format!("alone-{i}")).collect(), &mut keys);
    let mut n = 0;
    eventually("A compacts its log past B's last entry", || {
        n += 1;
        put(vec![format!("tick-{n}")], &mut keys);
        replication_field(&a, "log_base") > b_last
    });

    // B comes back on its directory (its old snapshot and log, behind A's
    // log), loads A's snapshot instead and pulls the rest.
    b = start(1);
    eventually("B catches up and rejoins the in-sync set", || {
        let _ = m.ping(client_id);
        in_sync(&a) == 1
    });
    assert!(
        replication_field(&b, "log_base") > b_last,
        "B caught up from A's snapshot"
    );
    put((0..500).map(|i| format!("after-{i}")).collect(), &mut keys);

    a.proc.kill9();
    eventually("B takes over", || role(&b).as_deref() == Some("leader"));
    eventually("the client reaches B", || m.ping(client_id).is_ok());
    let found = loop {
        match m.batch_exist_key(&keys) {
            Ok(r) => break r.into_iter().filter(|e| matches!(e, Ok(true))).count(),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    assert_eq!(found, keys.len(), "acknowledged puts lost");
    println!("B serves all {found} objects after catching up from A's snapshot");
}
