//! Hot-key memory replicas against real processes: a master with
//! `--dynamic_replication_mode`, storage nodes that run the copy tasks,
//! and an in-test client reading one key over and over. Every wait is
//! bounded; reads check their bytes.

use mooncake_store::client::Client;

mod common;
use common::*;

/// Four reads within two seconds admit a key.
const HOT: [&str; 3] = [
    "--dynamic_replication_heat_window_seconds=2",
    "--dynamic_replication_admission_qps_threshold=2",
    "--dynamic_replication_max_memory_replicas=2",
];

fn flags(mode: &str) -> Vec<String> {
    let mut v: Vec<String> = HOT.iter().map(|s| s.to_string()).collect();
    v.push(format!("--dynamic_replication_mode={mode}"));
    v
}

/// Reads `key` (checking its bytes) until `done` or `reads` are spent,
/// asserting the replica count never passes `max`; the last count.
fn read_hot(
    client: &Client,
    key: &str,
    bytes: &[u8],
    max: usize,
    reads: usize,
    done: impl Fn(usize) -> bool,
) -> usize {
    let mut count = 0;
    for _ in 0..reads {
        assert_eq!(
            client.get(key).unwrap(),
            bytes,
            "a read of {key} returned other bytes"
        );
        count = segments_of(client, key).len();
        assert!(
            count <= max,
            "{key} has {count} memory replicas, more than {max}"
        );
        if done(count) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    count
}

#[test]
fn enforce_mode_gives_a_hot_key_a_second_memory_replica() {
    let f = flags("enforce");
    let f: Vec<&str> = f.iter().map(String::as_str).collect();
    let cluster = Cluster::start(&f);
    let mut a = cluster.storage("16MB");
    let _b = cluster.storage("16MB");
    let _c = cluster.storage("16MB");
    let client = cluster.pure_client();

    let hot = value("hot", 1 << 20);
    let cold = value("cold", 1 << 20);
    client.put("hot", &hot, &pinned_to(&a.segment)).unwrap();
    client.put("cold", &cold, &pinned_to(&a.segment)).unwrap();
    assert_eq!(client.get("cold").unwrap(), cold);

    // Reads well past the threshold (bounded: a loaded machine gets time).
    let n = read_hot(&client, "hot", &hot, 2, 3_000, |n| n == 2);
    assert_eq!(n, 2, "the hot key never got a second memory replica");
    assert_eq!(segments_of(&client, "cold"), vec![a.segment.clone()]);
    assert!(metric(&cluster.http_addr, "master_dynamic_replication_tasks_total") >= 1.0);

    // Still hot: never a third replica.
    read_hot(&client, "hot", &hot, 2, 200, |_| false);

    // The extra replica holds the bytes on its own.
    let others: Vec<String> = segments_of(&client, "hot")
        .into_iter()
        .filter(|s| *s != a.segment)
        .collect();
    assert_eq!(others.len(), 1);
    a.proc.kill();
    eventually("the first replica's node goes", || {
        segments_of(&client, "hot") == others
    });
    assert_eq!(client.get("hot").unwrap(), hot);
}

#[test]
fn a_cooled_key_loses_its_extra_replica() {
    let f = flags("enforce");
    let f: Vec<&str> = f.iter().map(String::as_str).collect();
    let cluster = Cluster::start(&f);
    let a = cluster.storage("16MB");
    let _b = cluster.storage("16MB");
    let client = cluster.pure_client();
    let hot = value("hot", 64 << 10);
    client.put("hot", &hot, &pinned_to(&a.segment)).unwrap();
    assert_eq!(read_hot(&client, "hot", &hot, 2, 3_000, |n| n == 2), 2);
    // No reads at the admission rate for two windows: the extra goes
    // (`segments_of` reads once a second, half the rate).
    eventually("the extra replica goes", || {
        std::thread::sleep(std::time::Duration::from_secs(1));
        segments_of(&client, "hot").len() == 1
    });
    assert_eq!(client.get("hot").unwrap(), hot);
    assert!(
        metric(
            &cluster.http_addr,
            "master_dynamic_replication_dropped_total"
        ) >= 1.0
    );
}

#[test]
fn observe_and_off_modes_add_no_replica() {
    for mode in ["observe", "off"] {
        let f = flags(mode);
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        let cluster = Cluster::start(&f);
        let a = cluster.storage("16MB");
        let _b = cluster.storage("16MB");
        let client = cluster.pure_client();
        let hot = value("hot", 256 << 10);
        client.put("hot", &hot, &pinned_to(&a.segment)).unwrap();
        // Hot for a few windows, then time for a fan-out that must not come.
        read_hot(&client, "hot", &hot, 1, 200, |_| false);
        std::thread::sleep(std::time::Duration::from_secs(1));
        assert_eq!(
            segments_of(&client, "hot"),
            vec![a.segment.clone()],
            "{mode}"
        );
        let admitted = metric(
            &cluster.http_addr,
            "master_dynamic_replication_admitted_total",
        );
        assert_eq!(
            admitted >= 1.0,
            mode == "observe",
            "{mode}: {admitted} admissions"
        );
        assert_eq!(
            metric(&cluster.http_addr, "master_dynamic_replication_tasks_total"),
            0.0
        );
    }
}

#[test]
fn a_bad_mode_is_refused_at_start() {
    let out = std::process::Command::new(&*MASTER)
        .args(MasterPorts::ANY.args())
        .arg("--dynamic_replication_mode=sometimes")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("dynamic_replication_mode must be one of off, observe, enforce"),
        "{err}"
    );
}
