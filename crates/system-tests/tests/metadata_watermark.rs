//! The master's metadata watermark (`--metadata_eviction_watermark_ratio`),
//! on a `mooncake_master` process: once object metadata reaches the
//! watermark the oldest objects go, so puts of new keys go on past what the
//! budget (`--max_metadata_bytes`) alone would hold.

use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use mooncake_store::types::ReplicaPolicy;

mod common;
use common::*;

/// Keys of 1,000 bytes: each object costs 1,256 bytes of the budget.
fn key(i: usize) -> String {
    let head = format!("{i:05}-");
    format!("{head}{}", "k".repeat(1000 - head.len()))
}

#[test]
fn the_metadata_watermark_evicts_the_oldest_so_new_keys_go_on() {
    let budget = format!("--max_metadata_bytes={}", 100 * (1000 + 256));
    let cluster = Cluster::start(&[
        &budget,
        "--metadata_eviction_watermark_ratio=0.5",
        "--eviction_ratio=0.2",
    ]);
    let _s = cluster.storage("16MB");
    let client = cluster.pure_client();
    let cfg = ReplicaPolicy::default();
    // Three budgets' worth of new keys, with tiny values: memory never
    // fills, only the metadata does. A put refused at the budget waits for
    // the timer's round (bounded), as a client backing off would.
    for i in 0..300 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match client.put(&key(i), b"v", &cfg) {
                Ok(()) => break,
                Err(e) if e.code == ErrorCode::NO_AVAILABLE_HANDLE && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("put {i}: {e}"),
            }
        }
    }
    let held: Vec<usize> = (0..300)
        .filter(|&i| client.is_exist(&key(i)).unwrap())
        .collect();
    assert!(
        held.len() <= 100,
        "{} objects held past a budget of 100",
        held.len()
    );
    assert!(held.contains(&299), "the newest stays");
    assert!(!held.contains(&0), "the oldest went");
    assert_eq!(client.get(&key(299)).unwrap(), b"v");
}
