//! The master's budget for object metadata (`--max_metadata_bytes`): puts
//! of 4 MiB keys stop at the budget with `NO_AVAILABLE_HANDLE`, the
//! master's memory stays near the budget, and removing objects makes room
//! again. The master runs in this process, alone in this test binary, so
//! the process's RSS is the master's.

use mooncake_common::ErrorCode;
use mooncake_store::master::{MasterConfig, MasterHandle};
use mooncake_store::master_client::MasterClient;
use mooncake_store::types::{SegmentInfo, WriteOptions};
use test_support::ports::MASTER_ANY_PORTS;

const MIB: usize = 1 << 20;
const KEY_LEN: usize = 4 * MIB;
const BUDGET: usize = 64 * MIB;

fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

fn key(i: usize) -> String {
    let mut k = format!("{i:08}-");
    k.extend(std::iter::repeat_n('k', KEY_LEN - k.len()));
    k
}

#[test]
fn puts_of_huge_keys_stop_at_the_metadata_budget() {
    let budget = BUDGET.to_string();
    let config = MasterConfig::from_settings(MASTER_ANY_PORTS.into_iter().chain([
        ("rpc_address", "127.0.0.1"),
        ("metrics_host", "127.0.0.1"),
        ("max_metadata_bytes", budget.as_str()),
        // The budget alone: no eviction at its watermark.
        ("metadata_eviction_watermark_ratio", "0"),
        // No heartbeats here: the client must outlive the slow puts.
        ("client_ttl", "3600"),
    ]))
    .unwrap();
    let master = MasterHandle::spawn(config).unwrap();
    let client = MasterClient::connect(&master.rpc_addr().to_string()).unwrap();
    let id = 7u128;
    client
        .mount_segment(
            id,
            &SegmentInfo {
                name: "budget:1".into(),
                base: 1 << 32,
                size: 1 << 30,
                transport_endpoint: "budget:1".into(),
            },
        )
        .unwrap();
    let cfg = WriteOptions::default();
    let upsert = WriteOptions {
        upsert: true,
        ..WriteOptions::default()
    };
    let keys: Vec<String> = (0..40).map(key).collect();
    let base = rss();
    let mut stored = 0;
    let mut refused = 0;
    for k in &keys {
        match client.put_start(id, k, 1, &cfg) {
            Ok(_) => {
                client.put_end(id, k).unwrap();
                stored += 1;
            }
            Err(e) => {
                assert_eq!(e.code, ErrorCode::NO_AVAILABLE_HANDLE, "{e}");
                assert!(e.context.contains("max_metadata_bytes"), "{e}");
                refused += 1;
            }
        }
    }
    // 15 keys of 4 MiB (plus overhead each) fit 64 MiB; the other 25 not.
    assert_eq!(stored, BUDGET / (KEY_LEN + 256));
    assert_eq!(refused, keys.len() - stored);
    let grown = rss().saturating_sub(base);
    assert!(
        grown < BUDGET + 48 * MIB,
        "RSS grew {} MiB for a {} MiB budget",
        grown / MIB,
        BUDGET / MIB
    );

    // Upserting a stored key is not a new key; removing one makes room.
    client.put_start(id, &keys[0], 1, &upsert).unwrap();
    client.put_end(id, &keys[0]).unwrap();
    client.remove(&keys[1], true).unwrap();
    client.put_start(id, &keys[39], 1, &cfg).unwrap();
    client.put_end(id, &keys[39]).unwrap();
    assert_eq!(
        client.put_start(id, &keys[38], 1, &cfg).unwrap_err().code,
        ErrorCode::NO_AVAILABLE_HANDLE
    );
}
