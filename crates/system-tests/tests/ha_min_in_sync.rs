//! `--ha_min_in_sync` with real processes on a real etcd
//! (`MOONCAKE_TEST_ETCD`, or started here): with two members required, a
//! leader whose only standby went silent acknowledges nothing on its own
//! copy alone, and answers the held writes once the standby is back.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::ha::{cluster, in_sync, mounted_client, put_keys, start_master_in, Master};
use common::{eventually, free_port, Proc, WAIT};
use test_support::services;

fn signal(p: &Proc, sig: i32) {
    let pid = p.0.id() as i32;
    // SAFETY: kill(2) on a child this test spawned and still holds.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

fn master(etcd: &str, cluster: &str, dir: &std::path::Path) -> Master {
    let (rpc, http) = (free_port(), free_port());
    start_master_in(
        etcd,
        cluster,
        rpc,
        http,
        3,
        Some(dir),
        &["--ha_min_in_sync=2"],
    )
}

#[test]
fn below_the_minimum_the_leader_holds_its_writes() {
    let etcd = services::etcd();
    let cluster = cluster("min-in-sync");
    let dir = tempfile::tempdir().unwrap();
    let a = master(&etcd.addr, &cluster, dir.path());
    a.up.recv_timeout(WAIT).expect("A leads");
    let b = master(&etcd.addr, &cluster, dir.path());
    eventually("B joins the in-sync set", || in_sync(&a) == 1);
    let client = mounted_client(&etcd.addr, &cluster, 7);
    put_keys(&client, 7, &["with-b".to_string()]);

    // B hangs: A drops it from the record after the lag limit (2 s) and
    // is then the only copy.
    signal(&b.proc, libc::SIGSTOP);
    eventually("A records itself alone", || in_sync(&a) == 0);
    let (tx, rx) = mpsc::channel();
    let put = std::thread::spawn(move || {
        put_keys(&client, 7, &["held".to_string()]);
        let _ = tx.send(Instant::now());
    });
    let held = Duration::from_secs(2);
    assert!(
        rx.recv_timeout(held).is_err(),
        "a put was acknowledged with the leader alone in the set"
    );
    let resumed = Instant::now();
    signal(&b.proc, libc::SIGCONT);
    let answered = rx
        .recv_timeout(Duration::from_secs(12))
        .expect("the held put is answered once B is back");
    put.join().expect("the held put succeeds");
    assert!(answered >= resumed);
    assert_eq!(in_sync(&a), 1, "B is recorded again");
}
