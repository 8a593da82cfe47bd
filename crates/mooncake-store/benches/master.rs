//! Master benchmarks (not timed assertions): state-machine throughput,
//! RPC round-trip latency over loopback, and metadata memory per object.
//!
//! `cargo bench -p mooncake-store --bench master [-- quick]`

use std::time::{Duration, Instant};

use mooncake_store::master::{MasterConfig, MasterHandle, MasterService};
use mooncake_store::types::{ReplicaPolicy, SegmentInfo, WriteOptions};
use mooncake_store::MasterClient;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = status
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn segment(name: &str, size: u64) -> SegmentInfo {
    SegmentInfo {
        name: name.into(),
        base: 1 << 40,
        size,
        transport_endpoint: format!("{name}:1"),
    }
}

fn report(what: &str, n: usize, took: Duration) {
    let per = took / n as u32;
    println!(
        "{what:<44} {n:>9} ops  {:>8.2} µs/op  {:>10.0} ops/s",
        per.as_secs_f64() * 1e6,
        n as f64 / took.as_secs_f64()
    );
}

fn allocator(n: usize) {
    use mooncake_store::master::state::allocator::OffsetAllocator;
    let mut a = OffsetAllocator::new(64 << 30);
    let t = Instant::now();
    let mut offs: Vec<u64> = (0..n).map(|_| a.allocate(4096).unwrap()).collect();
    report("allocator: allocate 4 KiB", n, t.elapsed());
    // Free in a scrambled order (what eviction and remove_all do).
    let mut x = 0x9e3779b97f4a7c15u64;
    for i in (1..offs.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        offs.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let t = Instant::now();
    for &o in &offs[..n / 2] {
        a.free(o, 4096).unwrap();
    }
    report(
        "allocator: free, scrambled (fragmenting)",
        n / 2,
        t.elapsed(),
    );
    let t = Instant::now();
    for _ in 0..n / 4 {
        a.allocate(4096).unwrap();
    }
    report("allocator: allocate into holes", n / 4, t.elapsed());
}

fn state_machine(n: usize) {
    let cfg = MasterConfig::default();
    let s = MasterService::new(&cfg);
    s.mount_segment(1, &segment("a", 64 << 30), 0).unwrap();
    let keys: Vec<String> = (0..n).map(|i| format!("key-{i:08}")).collect();
    let rc = ReplicaPolicy::default();
    let before = rss_bytes();
    let t = Instant::now();
    for k in &keys {
        s.put_start(7, k, 4096, &rc, false, 0).unwrap();
        s.put_end(7, k, 0).unwrap();
    }
    report("in-process put_start+put_end (4 KiB)", n, t.elapsed());
    let grown = rss_bytes().saturating_sub(before);
    println!(
        "metadata RSS per object: {} bytes ({} objects, {} MiB)",
        grown / n as u64,
        n,
        grown >> 20
    );
    let t = Instant::now();
    for k in &keys {
        s.get_replica_list(k, 1).unwrap();
    }
    report("in-process get_replica_list", n, t.elapsed());
    let t = Instant::now();
    let r = s.remove_all(true, 2);
    println!("remove_all of {r} objects: {:?}", t.elapsed());
}

fn rpc(n: usize) {
    let threads = std::env::var("MASTER_RPC_THREADS").unwrap_or_else(|_| "0".into());
    let cfg = MasterConfig::from_settings([
        ("rpc_thread_num", threads.as_str()),
        ("port", "0"),
        ("metrics_port", "0"),
        ("rpc_address", "127.0.0.1"),
        ("metrics_host", "127.0.0.1"),
        ("enable_metric_reporting", "false"),
        ("allow_force_remove_all", "true"),
    ])
    .unwrap();
    let master = MasterHandle::spawn(cfg).unwrap();
    let c = MasterClient::connect(&master.rpc_addr().to_string()).unwrap();
    c.mount_segment(1, &segment("a", 64 << 30)).unwrap();
    let rc = ReplicaPolicy::default();
    let keys: Vec<String> = (0..n).map(|i| format!("key-{i:08}")).collect();
    for k in keys.iter().take(1000) {
        c.exist_key(k).unwrap();
    }
    let t = Instant::now();
    for k in &keys {
        c.put_start(1, k, 4096, &WriteOptions::put(&rc)).unwrap();
        c.put_end(1, k).unwrap();
    }
    report("RPC put_start+put_end (2 round trips)", n, t.elapsed());
    let t = Instant::now();
    for k in &keys {
        c.get_replica_list(k).unwrap();
    }
    report("RPC get_replica_list (1 round trip)", n, t.elapsed());
    let batch: Vec<String> = keys.iter().take(128).cloned().collect();
    let rounds = (n / 128).max(1);
    let t = Instant::now();
    for _ in 0..rounds {
        c.batch_get_replica_list(&batch).unwrap();
    }
    report(
        "RPC batch_get_replica_list x128 (per call)",
        rounds,
        t.elapsed(),
    );
    // Several threads sharing the client (pooled connections).
    let threads = 4;
    let t = Instant::now();
    std::thread::scope(|s| {
        for i in 0..threads {
            let c = c.clone();
            let keys = &keys;
            s.spawn(move || {
                for k in keys.iter().skip(i).step_by(threads) {
                    c.get_replica_list(k).unwrap();
                }
            });
        }
    });
    report(
        "RPC get_replica_list, 4 threads (aggregate)",
        n,
        t.elapsed(),
    );
    c.remove_all(true).unwrap();
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    if std::env::args().any(|a| a == "alloc") {
        return allocator(1_000_000);
    }
    if !std::env::args().any(|a| a == "rpc") {
        state_machine(if quick { 100_000 } else { 1_000_000 });
    }
    rpc(if quick { 5_000 } else { 50_000 });
}
