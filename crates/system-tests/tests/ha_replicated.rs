//! Replicated HA (`--enable_ha --enable_oplog`) with real processes on a
//! real etcd or redis (`MOONCAKE_TEST_ETCD`, `MOONCAKE_TEST_REDIS`, or
//! started here): three masters, a store client (holding the segment)
//! given `etcd://…` as its master, and a put/get/remove load from several
//! threads while leaders are killed with `kill -9`.
//!
//! What must hold: every acknowledged put reads back byte-exact through
//! the new leader, every acknowledged remove stays removed, no read ever
//! returns wrong bytes, and the client keeps its segment (no remount).
//! Waits are bounded hang guards, never speed checks; the times to the
//! first good put and get after a kill are printed, not asserted.

mod common;

use std::time::{Duration, Instant};

use common::ha::{
    cluster, gauge, http_get, in_sync, leader, mounted_client, put_keys, replication_field, role,
    start_master, start_master_in, start_master_with, Master,
};
use common::load::{check, storage_client, under_load, Load};
use common::{code, eventually, free_port, metadata_server, value, Proc, WAIT};
use mooncake_common::ErrorCode;
use mooncake_store::types::ReplicaPolicy;
use test_support::services;

/// Three masters, `kills` rounds of kill -9 of the leader under load (the
/// killed master restarts as a fresh standby and catches up before the
/// next round), then every acknowledgement is checked.
fn failovers(test: &str, coordination: &str, master_addr: &str, kills: usize) {
    let cluster = cluster(test);
    let (_meta, metadata) = metadata_server();
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let mut masters: Vec<Master> = Vec::new();
    for &(rpc, http) in &ports {
        masters.push(start_master(coordination, &cluster, rpc, http));
        if masters.len() == 1 {
            masters[0]
                .up
                .recv_timeout(WAIT)
                .expect("the first master leads");
        }
    }
    // Whoever leads by then: on a loaded machine the first lead may pass
    // to another master before both standbys have joined it.
    eventually("a leader with both standbys in sync", || {
        masters
            .iter()
            .any(|m| role(m).as_deref() == Some("leader") && in_sync(m) == 2)
    });

    let client = storage_client(master_addr, &cluster, &metadata);
    let load = Load::default();
    let (ledgers, ()) = under_load(&client, 3, &load, |start| {
        load.wait_puts(200);
        for round in 0..kills {
            let l = leader(&masters);
            load.killed(start);
            masters[l].proc.kill9();
            let killed_at = Instant::now();
            let next = loop {
                if let Some(i) =
                    (0..3).find(|&i| i != l && role(&masters[i]).as_deref() == Some("leader"))
                {
                    break i;
                }
                assert!(killed_at.elapsed() < WAIT, "no standby took over");
                std::thread::sleep(Duration::from_millis(5));
            };
            let promoted = killed_at.elapsed();
            load.wait_puts(100);
            println!(
                "round {round}: kill -9 of master {l}; master {next} leads after {promoted:?}; first good put after {:?}, get after {:?}",
                load.since_kill(&load.first_put),
                load.since_kill(&load.first_get)
            );
            // The killed master comes back empty, catches up and rejoins.
            let (rpc, http) = ports[l];
            masters[l] = start_master(coordination, &cluster, rpc, http);
            eventually("the restarted master rejoins the in-sync set", || {
                in_sync(&masters[next]) == 2
            });
        }
        load.wait_puts(100);
    });
    let (present, removed) = check(&client, &load, &ledgers);
    println!("checked {present} acknowledged puts and {removed} acknowledged removes after {kills} failovers");
}

#[test]
fn kill_9_of_the_leader_under_load_loses_nothing_on_etcd() {
    let etcd = services::etcd();
    failovers("kill-etcd", &etcd.addr, &format!("etcd://{}", etcd.addr), 1);
}

#[test]
fn kill_9_of_the_leader_under_load_loses_nothing_on_redis() {
    let redis = services::redis();
    let redis = format!("redis://{}", redis.addr);
    failovers("kill-redis", &redis, &redis, 1);
}

#[test]
fn ten_failovers_in_a_row_lose_nothing() {
    let etcd = services::etcd();
    failovers("ten", &etcd.addr, &format!("etcd://{}", etcd.addr), 10);
}

#[test]
fn standbys_answer_admin_queries_and_refuse_data_queries() {
    let etcd = services::etcd();
    let cluster = cluster("admin");
    let (a, b) = ((free_port(), free_port()), (free_port(), free_port()));
    let ma = start_master(&etcd.addr, &cluster, a.0, a.1);
    ma.up.recv_timeout(WAIT).expect("the first master leads");
    let mb = start_master(&etcd.addr, &cluster, b.0, b.1);
    eventually("B follows", || in_sync(&ma) == 1);
    let (status, health) = http_get(mb.http, "/health").unwrap();
    assert_eq!(status, 200);
    assert!(
        health.contains(r#""role":"standby""#) && health.contains(r#""service_ready":false"#),
        "{health}"
    );
    assert!(
        health.contains(&format!(r#""leader_address":"127.0.0.1:{}""#, ma.rpc)),
        "{health}"
    );
    assert_eq!(http_get(mb.http, "/role").unwrap().1, "standby");
    assert_eq!(http_get(mb.http, "/ha_status").unwrap().1, "standby");
    assert_eq!(http_get(ma.http, "/role").unwrap().1, "leader");
    assert_eq!(http_get(ma.http, "/ha_status").unwrap().1, "serving");
    let (_, leader) = http_get(mb.http, "/leader").unwrap();
    assert!(
        leader.starts_with(r#"{"present":true,"leader_address":"127.0.0.1:"#),
        "{leader}"
    );
    let (status, body) = http_get(mb.http, "/get_all_keys").unwrap();
    assert_eq!(status, 503);
    assert_eq!(
        body,
        r#"{"success":false,"error_code":-1011,"error_message":"service plane is not active"}"#
    );
    assert_eq!(http_get(ma.http, "/get_all_keys").unwrap().0, 200);
    let (_, metrics) = http_get(mb.http, "/metrics").unwrap();
    assert!(metrics.contains("ha_standby_state 3"), "{metrics}");
    assert_eq!(mb.rpc, b.0);
}

/// Whether every thread of `p` is stopped (state `T` in `/proc`).
fn stopped(p: &Proc) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", p.0.id())) else {
        return false;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command name's closing parenthesis.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                == Some('T')
        })
    })
}

fn signal(p: &Proc, sig: i32) {
    let pid = p.0.id() as i32;
    // SAFETY: kill(2) on a child this test spawned and still holds.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// Three masters of `cluster`: A, the leader, reaching the election at
/// `a_coordination`, then two standbys at `coordination`, both in sync.
fn three_masters(a_coordination: &str, coordination: &str, cluster: &str) -> [Master; 3] {
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let a = start_master(a_coordination, cluster, ports[0].0, ports[0].1);
    a.up.recv_timeout(WAIT).expect("A leads");
    let b = start_master(coordination, cluster, ports[1].0, ports[1].1);
    let c = start_master(coordination, cluster, ports[2].0, ports[2].1);
    eventually("both standbys in sync", || in_sync(&a) == 2);
    [a, b, c]
}

/// The leader is cut off from etcd (a frozen relay) and from its standbys
/// (stopped with SIGSTOP) while a client keeps calling it: it acknowledges
/// nothing, and the standby that takes over keeps every acknowledged put
/// and, of the calls made during the cut, at most the first few, intact.
#[test]
fn a_partitioned_leader_commits_nothing() {
    let etcd = services::etcd();
    let cluster = cluster("partition");
    let relay = test_support::freeze_proxy::FreezeProxy::start(&etcd.addr);
    let (_meta, metadata) = metadata_server();
    let [a, b, c] = three_masters(&relay.addr, &etcd.addr, &cluster);

    let client = storage_client(&format!("etcd://{}", etcd.addr), &cluster, &metadata);
    let cfg = ReplicaPolicy::default();
    let before: Vec<(String, Vec<u8>)> = (0..50)
        .map(|i| {
            let k = format!("before-{i}");
            let v = value(&k, 4096);
            client.put(&k, &v, &cfg).unwrap();
            (k, v)
        })
        .collect();

    // The fence under test needs both standbys in the set at the cut.
    eventually("both standbys still in sync", || in_sync(&a) == 2);
    relay.freeze();
    signal(&b.proc, libc::SIGSTOP);
    signal(&c.proc, libc::SIGSTOP);
    // kill(2) returns before the stop takes hold: a standby thread still
    // running could acknowledge one more entry. Wait until every thread
    // of both is stopped.
    eventually("both standbys stopped", || {
        stopped(&b.proc) && stopped(&c.proc)
    });
    let cut = Instant::now();
    let mut during = Vec::new();
    let mut outcomes = Vec::new();
    while cut.elapsed() < Duration::from_secs(5) {
        let k = format!("during-{}", during.len());
        let r = client.put(&k, &value(&k, 4096), &cfg);
        outcomes.push(format!(
            "{k} at {:?}: {:?}",
            cut.elapsed(),
            r.as_ref().err()
        ));
        assert!(
            r.is_err(),
            "put {k} acknowledged by a leader without its replica set; so far: {outcomes:?}"
        );
        during.push(k);
    }
    signal(&b.proc, libc::SIGCONT);
    signal(&c.proc, libc::SIGCONT);
    eventually("a standby takes over", || {
        [&b, &c]
            .iter()
            .any(|m| role(m).as_deref() == Some("leader"))
    });
    let after = value("after", 4096);
    eventually("puts through the new leader", || {
        client.put("after", &after, &cfg).is_ok()
    });
    for (k, v) in &before {
        assert_eq!(client.get(k).as_ref(), Ok(v), "acknowledged put {k} lost");
    }
    // Never acknowledged, but not necessarily lost: a standby's pull that
    // was in flight at the stop may carry the first puts' entries into its
    // socket, and the standby that takes over commits what it received
    // (their outcome was unknown to the client, never "done"). So each is
    // absent, still being written (its start arrived, its space stays
    // taken until the put times out since its writer may still be
    // writing), or complete with exactly its bytes.
    let mut late = Vec::new();
    for k in &during {
        match client.get(k) {
            Ok(got) => {
                assert!(got == value(k, 4096), "{k} reads wrong bytes");
                late.push(k.clone());
            }
            Err(e) => assert!(
                matches!(
                    e.code,
                    ErrorCode::OBJECT_NOT_FOUND | ErrorCode::REPLICA_IS_NOT_READY
                ),
                "{k}: {e:?}"
            ),
        }
    }
    // Entries travel in log order, so what arrived is a prefix.
    assert_eq!(late, during[..late.len()], "committed out of order");
    println!(
        "{} puts during the partition, none acknowledged ({:?} ... {:?}), {late:?} committed by the new leader",
        during.len(),
        outcomes.first(),
        outcomes.last()
    );
    relay.thaw();
}

/// A leader frozen (SIGSTOP) past its lease while a standby takes over and
/// a key is removed through the new leader: a read that was waiting in the
/// frozen leader's socket is refused when it thaws, before its holder task
/// has run to notice the lost lease, never answered from the old state.
#[test]
fn a_leader_thawed_after_its_lease_answers_no_read() {
    let etcd = services::etcd();
    let cluster = cluster("thawed");
    let (_meta, metadata) = metadata_server();
    let [a, b, c] = three_masters(&etcd.addr, &etcd.addr, &cluster);

    let client = storage_client(&format!("etcd://{}", etcd.addr), &cluster, &metadata);
    let cfg = ReplicaPolicy::default();
    client.put("k", &value("k", 4096), &cfg).unwrap();
    // A connection of its own to A, open before the freeze.
    let direct = mooncake_store::MasterClient::connect(&format!("127.0.0.1:{}", a.rpc)).unwrap();
    assert!(direct.get_replica_list("k").is_ok());

    signal(&a.proc, libc::SIGSTOP);
    eventually("A stopped", || stopped(&a.proc));
    eventually("a standby takes over", || {
        [&b, &c]
            .iter()
            .any(|m| role(m).as_deref() == Some("leader"))
    });
    // A client of its own: `client`'s calls to the frozen A wait out
    // their deadline first.
    let fresh = mooncake_store::MasterClient::connect_in_cluster(
        &format!("etcd://{}", etcd.addr),
        &cluster,
    )
    .unwrap();
    eventually("k removed through the new leader", || {
        fresh.remove("k", true).is_ok()
    });
    assert_eq!(
        code(fresh.get_replica_list("k")),
        ErrorCode::OBJECT_NOT_FOUND
    );

    let read = std::thread::spawn(move || direct.get_replica_list("k"));
    // The request reaches A's socket while A is still frozen.
    std::thread::sleep(Duration::from_millis(300));
    signal(&a.proc, libc::SIGCONT);
    let answer = read.join().unwrap();
    assert!(
        answer.is_err(),
        "the thawed leader answered a read from its old state: {answer:?}"
    );
    assert_eq!(code(answer), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
}

/// A master client of `cluster` (found through etcd at `etcd`) that has
/// mounted a 64 MiB segment as `client_id`.
/// With HA snapshots, a standby started after 100 000 objects loads the
/// leader's snapshot (the log before it is compacted away on the leader)
/// and then the log tail, joins the in-sync set, and once the leader and
/// the other standby are killed serves every one of them.
#[test]
fn a_standby_started_after_100k_objects_catches_up_from_a_snapshot() {
    let etcd = services::etcd();
    let cluster = cluster("late");
    let dir = tempfile::tempdir().unwrap();
    let snaps = Some(dir.path());
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let mut a = start_master_in(
        &etcd.addr,
        &cluster,
        ports[0].0,
        ports[0].1,
        120,
        snaps,
        &[],
    );
    a.up.recv_timeout(WAIT).expect("A leads");
    let mut b = start_master_in(
        &etcd.addr,
        &cluster,
        ports[1].0,
        ports[1].1,
        120,
        snaps,
        &[],
    );
    eventually("B in sync", || in_sync(&a) == 1);

    let client_id = 42u128;
    let m = mounted_client(&etcd.addr, &cluster, client_id);
    let mut keys = Vec::new();
    let put_batch = |batch: usize, keys: &mut Vec<String>| {
        let ks: Vec<String> = (0..1000).map(|i| format!("k{batch}-{i}")).collect();
        put_keys(&m, client_id, &ks);
        keys.extend(ks);
    };
    for batch in 0..100 {
        put_batch(batch, &mut keys);
    }
    assert!(m.exist_key(&keys[0]).unwrap(), "on A");
    // A snapshot holds the 100 000 objects; the leader's log behind it is gone.
    let snapshotted = replication_field(&a, "last_seq");
    assert!(snapshotted >= keys.len() as u64, "{snapshotted} entries");
    eventually("the leader's log is compacted behind a snapshot", || {
        let _ = m.ping(client_id);
        replication_field(&a, "log_base") >= snapshotted
    });
    // A few more after the snapshot: the tail C must pull.
    for batch in 100..103 {
        put_batch(batch, &mut keys);
    }
    let c = start_master_in(
        &etcd.addr,
        &cluster,
        ports[2].0,
        ports[2].1,
        120,
        snaps,
        &[],
    );
    eventually("C catches up and joins the in-sync set", || {
        let _ = m.ping(client_id);
        in_sync(&a) == 2
    });
    assert!(
        replication_field(&c, "log_base") >= snapshotted,
        "C started from a snapshot, not from the first entry"
    );
    a.proc.kill9();
    b.proc.kill9();
    eventually("C takes over", || role(&c).as_deref() == Some("leader"));
    eventually("the client reaches C", || m.ping(client_id).is_ok());
    let mut found = 0;
    for chunk in keys.chunks(5000) {
        let _ = m.ping(client_id);
        let r = loop {
            match m.batch_exist_key(chunk) {
                Ok(r) => break r,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        found += r.into_iter().filter(|e| matches!(e, Ok(true))).count();
    }
    let (_, status) = http_get(c.http, "/replication").unwrap();
    assert_eq!(found, keys.len(), "{status} {:?}", m.exist_key(&keys[0]));
    println!("late standby serves all {found} objects: {status}");
    // The leader stored its snapshots, with retention.
    let stored = std::fs::read_dir(dir.path().join("mooncake_master_snapshot").join(&cluster))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!((1..=2).contains(&stored), "{stored} snapshots stored");
}

/// Every master killed at once (HA snapshots on) once a stored snapshot
/// holds every put: restarted with `--enable_snapshot_restore`, the
/// cluster serves every object, with the storage client's segment.
#[test]
fn losing_every_master_at_once_leaves_the_last_snapshot() {
    use mooncake_store::types::WriteOptions;

    let etcd = services::etcd();
    let cluster = cluster("all-lost");
    let dir = tempfile::tempdir().unwrap();
    let snaps = Some(dir.path());
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let start = |i: usize, extra: &[&str]| {
        start_master_in(
            &etcd.addr, &cluster, ports[i].0, ports[i].1, 30, snaps, extra,
        )
    };
    let mut masters = vec![start(0, &[])];
    masters[0].up.recv_timeout(WAIT).expect("A leads");
    masters.push(start(1, &[]));
    masters.push(start(2, &[]));
    eventually("both standbys in sync", || in_sync(&masters[0]) == 2);

    let client_id = 7u128;
    let m = mounted_client(&etcd.addr, &cluster, client_id);
    let keys: Vec<String> = (0..2000).map(|i| format!("kept-{i}")).collect();
    let opts = WriteOptions::default();
    for r in m
        .batch_put_start(client_id, &keys, &vec![64; keys.len()], &opts)
        .unwrap()
    {
        r.unwrap();
    }
    for r in m.batch_put_end(client_id, &keys).unwrap() {
        r.unwrap();
    }
    let last = replication_field(&masters[0], "last_seq");
    eventually("a stored snapshot holds every put", || {
        let _ = m.ping(client_id);
        replication_field(&masters[0], "snapshot_seq") >= last
    });
    for mut old in masters.drain(..) {
        old.proc.kill9();
    }
    let restarted: Vec<Master> = (0..3)
        .map(|i| start(i, &["--enable_snapshot_restore=true"]))
        .collect();
    // Each comes back from the snapshot and its own log (kept under the
    // same directory), as the member it was.
    let l = leader(&restarted);
    eventually("the client reaches the new leader", || {
        m.ping(client_id).is_ok()
    });
    let found = loop {
        match m.batch_exist_key(&keys) {
            Ok(r) => break r.into_iter().filter(|e| matches!(e, Ok(true))).count(),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    assert_eq!(found, keys.len(), "objects lost with every master");
    println!("every master lost: master {l} restored {found} objects from the last snapshot");
    drop(restarted);
}

/// Every master killed at once under a put/remove load, each with its
/// log on disk (under the shared `MOONCAKE_SNAPSHOT_LOCAL_PATH`, one
/// directory per master) and HA snapshots every second: restarted on the
/// same directories, the cluster serves every acknowledged put byte-exact
/// and keeps every acknowledged remove, those after the last snapshot
/// included.
#[test]
fn losing_every_master_at_once_under_load_loses_nothing_with_the_log_on_disk() {
    let etcd = services::etcd();
    let cluster = cluster("all-lost-log");
    let (_meta, metadata) = metadata_server();
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let start = |i: usize| {
        start_master_in(
            &etcd.addr,
            &cluster,
            ports[i].0,
            ports[i].1,
            30,
            Some(dir.path()),
            &[],
        )
    };
    let mut masters = vec![start(0)];
    masters[0].up.recv_timeout(WAIT).expect("A leads");
    masters.push(start(1));
    masters.push(start(2));
    eventually("both standbys in sync", || in_sync(&masters[0]) == 2);

    let client = storage_client(&format!("etcd://{}", etcd.addr), &cluster, &metadata);
    let load = Load::default();
    let (ledgers, restarted) = under_load(&client, 3, &load, |start_at| {
        load.wait_puts(300);
        let l = leader(&masters);
        eventually("a snapshot is stored", || {
            replication_field(&masters[l], "snapshot_seq") > 0
        });
        load.wait_puts(100);
        let (snap, last) = (
            replication_field(&masters[l], "snapshot_seq"),
            replication_field(&masters[l], "last_seq"),
        );
        load.killed(start_at);
        for m in &mut masters {
            m.proc.kill9();
        }
        println!("killed every master: last entry {last}, last snapshot at {snap}");
        let restarted: Vec<Master> = (0..3).map(start).collect();
        let l = leader(&restarted);
        // The restored leader serves an object only once the owner of its
        // segment is heard from again: until then reads are refused.
        let up = start_at.elapsed().as_nanos() as u64;
        eventually("a get succeeds through the restored leader", || {
            load.got_after(up)
        });
        load.wait_puts(100);
        println!(
            "master {l} leads again; first good put after {:?}, get after {:?}",
            load.since_kill(&load.first_put),
            load.since_kill(&load.first_get)
        );
        restarted
    });
    let (present, removed) = check(&client, &load, &ledgers);
    println!("every master lost: {present} acknowledged puts and {removed} removes kept");
    drop(restarted);
}

/// A leader and a standby export the `ha_*` families with their view of
/// the log: the standby applies everything the leader wrote (lag 0,
/// WATCHING), the leader is PROMOTED and leads.
#[test]
fn a_standby_exports_its_replication_state_in_metrics() {
    use mooncake_store::types::WriteOptions;

    let etcd = services::etcd();
    let cluster = cluster("ha-metrics");
    let (a, b) = ((free_port(), free_port()), (free_port(), free_port()));
    let ma = start_master_with(&etcd.addr, &cluster, a.0, a.1, 120);
    ma.up.recv_timeout(WAIT).expect("A leads");
    let mb = start_master_with(&etcd.addr, &cluster, b.0, b.1, 120);
    eventually("B in sync", || in_sync(&ma) == 1);

    let client_id = 43u128;
    let m = mounted_client(&etcd.addr, &cluster, client_id);
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    for r in m
        .batch_put_start(
            client_id,
            &keys,
            &vec![64; keys.len()],
            &WriteOptions::default(),
        )
        .unwrap()
    {
        r.unwrap();
    }
    for r in m.batch_put_end(client_id, &keys).unwrap() {
        r.unwrap();
    }

    // Every call was committed, so B holds it; it applies it at its next pull.
    let last = gauge(&ma, "ha_oplog_last_sequence_id").unwrap();
    assert!(
        last >= 2 * keys.len() as i64,
        "every put start and end is logged: {last}"
    );
    eventually("B applied all A wrote", || {
        let now = gauge(&ma, "ha_oplog_last_sequence_id");
        now.is_some() && gauge(&mb, "ha_oplog_applied_sequence_id") == now
    });
    let applied = gauge(&mb, "ha_oplog_applied_sequence_id").unwrap();
    assert!(applied >= last);
    for (name, want) in [
        ("ha_oplog_last_sequence_id", applied),
        ("ha_oplog_standby_lag", 0),
        ("ha_oplog_pending_entries", 0),
        ("ha_standby_state", 3),
        ("master_is_leader", 0),
    ] {
        assert_eq!(gauge(&mb, name), Some(want), "standby {name}");
    }
    eventually("A counts B caught up", || {
        gauge(&ma, "ha_oplog_standby_lag") == Some(0)
    });
    for (name, want) in [
        ("ha_oplog_applied_sequence_id", applied),
        ("ha_standby_state", 7),
        ("master_is_leader", 1),
    ] {
        assert_eq!(gauge(&ma, name), Some(want), "leader {name}");
    }
}
