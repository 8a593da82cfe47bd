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

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::{
    code, eventually, free_port, metadata_server, spawn_watching, value, Proc, MASTER, WAIT,
};
use mooncake_common::ErrorCode;
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::types::ReplicateConfig;
use test_support::services;

struct Master {
    proc: Proc,
    rpc: u16,
    http: u16,
    up: Receiver<String>,
}

fn start_master(coordination: &str, cluster: &str, rpc: u16, http: u16) -> Master {
    start_master_with(coordination, cluster, rpc, http, 3)
}

fn start_master_with(
    coordination: &str,
    cluster: &str,
    rpc: u16,
    http: u16,
    client_ttl: u32,
) -> Master {
    let args = [
        "--enable_ha=true".to_string(),
        "--enable_oplog=true".into(),
        format!("--etcd_endpoints={coordination}"),
        format!("--cluster_id={cluster}"),
        format!("--rpc_port={rpc}"),
        "--rpc_address=127.0.0.1".into(),
        "--metrics_host=127.0.0.1".into(),
        format!("--metrics_port={http}"),
        format!("--client_ttl={client_ttl}"),
        "--default_kv_lease_ttl=200".into(),
        "--oplog_poll_interval_ms=200".into(),
    ];
    let (proc, up) = spawn_watching(MASTER, &args, "listening on");
    Master {
        proc,
        rpc,
        http,
        up,
    }
}

/// One HTTP GET; `None` while nothing listens.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let status = resp.split_whitespace().nth(1)?.parse().ok()?;
    let (_, body) = resp.split_once("\r\n\r\n")?;
    Some((status, body.to_string()))
}

fn role(m: &Master) -> Option<String> {
    http_get(m.http, "/role").map(|(_, b)| b)
}

/// How many standbys the leader has recorded as in sync.
fn in_sync(m: &Master) -> usize {
    let Some((_, body)) = http_get(m.http, "/replication") else {
        return 0;
    };
    body.split("\"in_sync\":[")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .map_or(0, |list| list.matches('#').count())
}

fn leader(masters: &[Master]) -> usize {
    let mut found = None;
    eventually("one master leads", || {
        found = masters
            .iter()
            .position(|m| role(m).as_deref() == Some("leader"));
        found.is_some()
    });
    found.unwrap()
}

/// A cluster of its own for each test: tests share one etcd.
fn cluster(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

/// What one load thread saw acknowledged.
#[derive(Default)]
struct Ledger {
    present: HashMap<String, Vec<u8>>,
    removed: HashSet<String>,
}

/// Shared counters of the load.
#[derive(Default)]
struct Load {
    stop: AtomicBool,
    puts: AtomicUsize,
    wrong: AtomicUsize,
    /// Nanoseconds since `start` of the first good put and get after the
    /// last kill (`u64::MAX`: none yet).
    kill_at: AtomicU64,
    first_put: AtomicU64,
    first_get: AtomicU64,
}

impl Load {
    fn note(&self, start: Instant, slot: &AtomicU64) {
        let now = start.elapsed().as_nanos() as u64;
        if now > self.kill_at.load(Ordering::SeqCst) {
            let _ = slot.fetch_min(now, Ordering::SeqCst);
        }
    }

    fn killed(&self, start: Instant) {
        self.first_put.store(u64::MAX, Ordering::SeqCst);
        self.first_get.store(u64::MAX, Ordering::SeqCst);
        self.kill_at
            .store(start.elapsed().as_nanos() as u64, Ordering::SeqCst);
    }

    fn since_kill(&self, slot: &AtomicU64) -> Option<Duration> {
        let (at, kill) = (
            slot.load(Ordering::SeqCst),
            self.kill_at.load(Ordering::SeqCst),
        );
        (at != u64::MAX).then(|| Duration::from_nanos(at - kill))
    }
}

fn worker(client: &Client, id: usize, load: &Load, start: Instant) -> Ledger {
    let mut ledger = Ledger::default();
    let mut mine: Vec<String> = Vec::new();
    let cfg = ReplicateConfig::default();
    let mut i = 0usize;
    while !load.stop.load(Ordering::SeqCst) {
        let key = format!("w{id}-{i}");
        i += 1;
        let v = value(&key, 4096 + (i % 7) * 512);
        if client.put(&key, &v, &cfg).is_ok() {
            load.note(start, &load.first_put);
            load.puts.fetch_add(1, Ordering::SeqCst);
            ledger.present.insert(key.clone(), v);
            mine.push(key);
        }
        if i.is_multiple_of(3) && mine.len() > 4 {
            let k = mine.swap_remove(i % mine.len());
            let was = ledger.present.remove(&k);
            match client.remove(&k, true) {
                Ok(()) => {
                    ledger.removed.insert(k);
                }
                // Unknown outcome: neither present nor removed is asserted.
                Err(_) => drop(was),
            }
        }
        if let Some(k) = mine.get(i % mine.len().max(1)) {
            if let Ok(got) = client.get(k) {
                load.note(start, &load.first_get);
                if Some(&got) != ledger.present.get(k) {
                    load.wrong.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }
    ledger
}

fn storage_client(master: &str, cluster: &str, metadata: &str) -> Client {
    Client::setup(&ClientConfig {
        cluster_id: cluster.to_string(),
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata.to_string(),
        global_segment_size: 256 << 20,
        local_buffer_size: 64 << 20,
        protocol: "tcp".into(),
        device_name: String::new(),
        master_server_address: master.to_string(),
        ..ClientConfig::default()
    })
    .unwrap()
}

fn wait_puts(load: &Load, n: usize) {
    let target = load.puts.load(Ordering::SeqCst) + n;
    eventually("puts go on", || load.puts.load(Ordering::SeqCst) >= target);
}

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
    let l = leader(&masters);
    eventually("both standbys in sync", || in_sync(&masters[l]) == 2);

    let client = storage_client(master_addr, &cluster, &metadata);
    let load = Load::default();
    load.killed(Instant::now());
    let start = Instant::now();
    let ledgers = std::thread::scope(|s| {
        let workers: Vec<_> = (0..3)
            .map(|id| {
                s.spawn({
                    let (client, load) = (&client, &load);
                    move || worker(client, id, load, start)
                })
            })
            .collect();
        wait_puts(&load, 200);
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
            wait_puts(&load, 100);
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
        wait_puts(&load, 100);
        load.stop.store(true, Ordering::SeqCst);
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .collect::<Vec<_>>()
    });

    assert_eq!(
        load.wrong.load(Ordering::SeqCst),
        0,
        "a read returned wrong bytes"
    );
    let (mut present, mut removed) = (0, 0);
    for ledger in &ledgers {
        for (k, v) in &ledger.present {
            assert_eq!(client.get(k).as_ref(), Ok(v), "acknowledged put {k} lost");
            present += 1;
        }
        for k in &ledger.removed {
            assert_eq!(
                code(client.get(k)),
                ErrorCode::OBJECT_NOT_FOUND,
                "removed {k} is back"
            );
            removed += 1;
        }
    }
    println!("checked {present} acknowledged puts and {removed} acknowledged removes after {kills} failovers");
    assert!(present > 0 && removed > 0);
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

fn signal(p: &Proc, sig: i32) {
    let pid = p.0.id() as i32;
    // SAFETY: kill(2) on a child this test spawned and still holds.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// The leader is cut off from etcd (a frozen relay) and from its standbys
/// (stopped with SIGSTOP) while a client keeps calling it: it commits
/// nothing, and the standby that takes over knows none of those calls.
#[test]
fn a_partitioned_leader_commits_nothing() {
    let etcd = services::etcd();
    let cluster = cluster("partition");
    let relay = test_support::freeze_proxy::FreezeProxy::start(&etcd.addr);
    let (_meta, metadata) = metadata_server();
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let a = start_master(&relay.addr, &cluster, ports[0].0, ports[0].1);
    a.up.recv_timeout(WAIT).expect("A leads");
    let b = start_master(&etcd.addr, &cluster, ports[1].0, ports[1].1);
    let c = start_master(&etcd.addr, &cluster, ports[2].0, ports[2].1);
    eventually("both standbys in sync", || in_sync(&a) == 2);

    let client = storage_client(&format!("etcd://{}", etcd.addr), &cluster, &metadata);
    let cfg = ReplicateConfig::default();
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
    let cut = Instant::now();
    let mut during = Vec::new();
    while cut.elapsed() < Duration::from_secs(5) {
        let k = format!("during-{}", during.len());
        let r = client.put(&k, &value(&k, 4096), &cfg);
        assert!(
            r.is_err(),
            "put {k} acknowledged by a leader without its replica set"
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
    for k in &during {
        assert_eq!(
            code(client.get(k)),
            ErrorCode::OBJECT_NOT_FOUND,
            "{k} was committed"
        );
    }
    println!("{} puts during the partition, none committed", during.len());
    relay.thaw();
}

/// A master client of `cluster` (found through etcd at `etcd`) that has
/// mounted a 64 MiB segment as `client_id`.
fn mounted_client(etcd: &str, cluster: &str, client_id: u128) -> mooncake_store::MasterClient {
    let m = mooncake_store::MasterClient::connect_in_cluster(&format!("etcd://{etcd}"), cluster)
        .unwrap();
    let _ = m.ping(client_id);
    let segment = mooncake_store::types::SegmentInfo {
        name: "seg".into(),
        base: 1 << 30,
        size: 64 << 20,
        transport_endpoint: "127.0.0.1:1".into(),
    };
    m.mount_segment(client_id, &segment).unwrap();
    m
}

/// A standby started after 100 000 objects catches up (the whole log from
/// its leader), joins the in-sync set, and once the leader and the other
/// standby are killed serves every one of them.
#[test]
fn a_standby_started_after_100k_objects_catches_up() {
    use mooncake_store::types::WriteOptions;

    let etcd = services::etcd();
    let cluster = cluster("late");
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let mut a = start_master_with(&etcd.addr, &cluster, ports[0].0, ports[0].1, 120);
    a.up.recv_timeout(WAIT).expect("A leads");
    let mut b = start_master_with(&etcd.addr, &cluster, ports[1].0, ports[1].1, 120);
    eventually("B in sync", || in_sync(&a) == 1);

    let client_id = 42u128;
    let m = mounted_client(&etcd.addr, &cluster, client_id);
    let opts = WriteOptions::default();
    let mut keys = Vec::new();
    for batch in 0..100 {
        let ks: Vec<String> = (0..1000).map(|i| format!("k{batch}-{i}")).collect();
        // Heartbeats keep the client (and its segment) alive (client_ttl 3 s).
        m.ping(client_id).unwrap();
        for r in m
            .batch_put_start(client_id, &ks, &vec![64; ks.len()], &opts)
            .unwrap()
        {
            r.unwrap();
        }
        for r in m.batch_put_end(client_id, &ks).unwrap() {
            r.unwrap();
        }
        keys.extend(ks);
    }

    assert!(m.exist_key(&keys[0]).unwrap(), "on A");
    let c = start_master_with(&etcd.addr, &cluster, ports[2].0, ports[2].1, 120);
    eventually("C catches up and joins the in-sync set", || {
        in_sync(&a) == 2
    });
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
}

/// The value of an unlabelled metric on `m`'s `/metrics`.
fn gauge(m: &Master, name: &str) -> Option<i64> {
    let (_, body) = http_get(m.http, "/metrics")?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
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
