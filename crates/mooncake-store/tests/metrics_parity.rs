//! Metric parity with the reference master: after a small workload, every
//! family the reference exports (checked in under `tests/data`, read from
//! the reference package's `/metrics`) is exported by ours with the same
//! type, and the workload moved the families it should.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;

use mooncake_store::master::{MasterConfig, MasterHandle};
use mooncake_store::types::{SegmentInfo, WriteOptions};
use mooncake_store::MasterClient;
use test_support::ports::MASTER_ANY_PORTS;

const REFERENCE: &str = include_str!("data/reference_master_families.txt");

fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

/// Family name (without `_total`) -> type, from `# TYPE` lines.
fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("# TYPE ")?.split_whitespace();
            let name = w.next()?;
            let kind = w.next()?;
            let name = name.strip_suffix("_total").unwrap_or(name);
            Some((name.to_string(), kind.to_string()))
        })
        .collect()
}

fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name}"))
}

#[test]
fn every_reference_family_is_exported_with_its_type() {
    let config = MasterConfig::from_settings(MASTER_ANY_PORTS.into_iter().chain([
        ("rpc_address", "127.0.0.1"),
        ("metrics_host", "127.0.0.1"),
        ("default_kv_lease_ttl", "0"),
    ]))
    .unwrap();
    let master = MasterHandle::spawn(config).unwrap();
    let c = MasterClient::connect(&master.rpc_addr().to_string()).unwrap();
    let seg = SegmentInfo {
        name: "seg".into(),
        base: 1 << 40,
        size: 16 << 20,
        transport_endpoint: "seg:1".into(),
    };
    c.mount_segment(1, &seg).unwrap();
    c.ping(1).unwrap();
    let opts = WriteOptions::default();
    for i in 0..10u64 {
        let key = format!("k{i}");
        c.put_start(1, &key, 1000 * (i + 1), &opts).unwrap();
        c.put_end(1, &key).unwrap();
    }
    for i in 0..12 {
        let _ = c.get_replica_list(&format!("k{i}"));
    }
    assert!(c.exist_key("k1").unwrap());
    let keys: Vec<String> = ["k1", "k2", "nope"].map(String::from).into();
    c.batch_exist_key(&keys).unwrap();
    c.batch_get_replica_list(&keys).unwrap();
    c.remove("k3", false).unwrap();

    let http = master.http_addr().to_string();
    let text = get(&http, "/metrics");
    let ours = families(&text);
    let mut missing = Vec::new();
    let mut mistyped = Vec::new();
    let mut count = 0;
    for line in REFERENCE.lines().filter(|l| !l.starts_with('#')) {
        let (name, kind) = line.split_once(' ').unwrap();
        count += 1;
        match ours.get(name) {
            None => missing.push(name),
            Some(k) if k != kind => mistyped.push(format!("{name}: {k}, not {kind}")),
            Some(_) => {}
        }
    }
    assert_eq!(count, 136, "the checked-in list lost names");
    assert!(missing.is_empty(), "missing families: {missing:?}");
    assert!(mistyped.is_empty(), "types differ: {mistyped:?}");
    // Ours on top of the reference's.
    for extra in ["master_malformed_requests", "master_expired_clients"] {
        assert!(ours.contains_key(extra), "{extra}");
    }

    // The workload moved the read families as the reference's does.
    assert_eq!(sample(&text, "total_get_nums_"), 15.0);
    assert_eq!(sample(&text, "valid_get_nums_"), 12.0);
    assert_eq!(sample(&text, "mem_cache_hit_nums_"), 12.0);
    assert_eq!(sample(&text, "mem_cache_hit_bytes_total"), 60000.0);
    assert_eq!(sample(&text, "master_key_count"), 9.0);
    assert_eq!(sample(&text, "master_batch_exist_key_items_total"), 3.0);

    let summary = get(&http, "/metrics/summary");
    for section in [
        "Mem Storage:",
        "SSD Storage:",
        "Keys: 9",
        "Clients: 1",
        "Requests (Success/Total per sec):",
        "Batch Requests",
        "Eviction:",
        "Discard:",
        "Snapshots:",
        "ha={",
    ] {
        assert!(summary.contains(section), "{section} not in {summary}");
    }
    master.stop().unwrap();
}
