//! The master served in-process over real TCP: many client threads sharing
//! one pooled `MasterClient` on overlapping keys, batches as one call, and
//! a client reconnecting after the master restarts.

use std::sync::Arc;
use std::time::Duration;

use mooncake_common::ErrorCode;
use mooncake_store::master::{MasterConfig, MasterHandle};
use mooncake_store::types::{ClientId, ReplicaPolicy, SegmentInfo, WriteOptions};
use mooncake_store::MasterClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use test_support::ports::MASTER_ANY_PORTS;

fn config() -> MasterConfig {
    MasterConfig::from_settings(MASTER_ANY_PORTS.into_iter().chain([
        ("rpc_address", "127.0.0.1"),
        ("metrics_host", "127.0.0.1"),
        ("default_kv_lease_ttl", "0"),
        ("rpc_thread_num", "2"),
    ]))
    .unwrap()
}

fn segment(name: &str) -> SegmentInfo {
    SegmentInfo {
        name: name.into(),
        base: 1 << 40,
        size: 8 << 20,
        transport_endpoint: format!("{name}:1"),
    }
}

#[test]
fn many_threads_share_one_client() {
    let master = MasterHandle::spawn(config()).unwrap();
    let client = MasterClient::connect(&master.rpc_addr().to_string()).unwrap();
    client.mount_segment(1, &segment("a")).unwrap();
    client.mount_segment(1, &segment("b")).unwrap();
    let allowed = [
        ErrorCode::OBJECT_NOT_FOUND,
        ErrorCode::OBJECT_ALREADY_EXISTS,
        // Another thread's put of the key in flight.
        ErrorCode::OBJECT_REPLICA_BUSY,
        ErrorCode::REPLICA_IS_NOT_READY,
        ErrorCode::ILLEGAL_CLIENT,
    ];
    let client = Arc::new(client);
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let c = client.clone();
            std::thread::spawn(move || {
                let me = 10 + t as ClientId;
                let mut rng = StdRng::seed_from_u64(t);
                let cfg = ReplicaPolicy {
                    replica_num: 2,
                    ..Default::default()
                };
                for _ in 0..500 {
                    let key = format!("k{}", rng.gen_range(0..16));
                    let r = match rng.gen_range(0..4) {
                        0 => c
                            .put_start(me, &key, rng.gen_range(1..4096), &WriteOptions::put(&cfg))
                            .and_then(|d| {
                                assert_eq!(d.len(), 2);
                                c.put_end(me, &key)
                            }),
                        1 => c
                            .get_replica_list(&key)
                            .map(|g| assert_eq!(g.replicas.len(), 2)),
                        2 => c.remove(&key, false),
                        _ => c.exist_key(&key).map(drop),
                    };
                    if let Err(e) = r {
                        assert!(allowed.contains(&e.code), "{e}");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = master.service().stats(0);
    assert_eq!(stats.pending_puts, 0);
    // No leases (a zero TTL): removal without force takes everything.
    client.remove_all(false).unwrap();
    assert_eq!(master.service().stats(0).allocated_bytes, 0);
}

#[test]
fn batches_answer_per_key_in_one_call() {
    let master = MasterHandle::spawn(config()).unwrap();
    let c = MasterClient::connect(&master.rpc_addr().to_string()).unwrap();
    c.mount_segment(1, &segment("a")).unwrap();
    let keys: Vec<String> = (0..1000).map(|i| format!("key-{i}")).collect();
    let mut lens = vec![4096u64; 1000];
    lens[7] = 0;
    let cfg = ReplicaPolicy::default();
    let starts = c
        .batch_put_start(1, &keys, &lens, &WriteOptions::put(&cfg))
        .unwrap();
    assert_eq!(starts.iter().filter(|r| r.is_err()).count(), 1);
    assert_eq!(
        starts[7].as_ref().unwrap_err().code,
        ErrorCode::INVALID_PARAMS
    );
    let ends = c.batch_put_end(1, &keys).unwrap();
    assert_eq!(
        ends[7].as_ref().unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    let got = c.batch_get_replica_list(&keys).unwrap();
    assert_eq!(got.iter().filter(|r| r.is_ok()).count(), 999);
    let removed = c.batch_remove(&keys, false).unwrap();
    assert_eq!(removed.iter().filter(|r| r.is_ok()).count(), 999);
    assert_eq!(
        c.batch_put_revoke(1, &keys[..2]).unwrap()[0]
            .as_ref()
            .unwrap_err()
            .code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert!(c.batch_exist_key(&[]).unwrap().is_empty());
}

#[test]
fn a_client_survives_a_master_restart() {
    let master = MasterHandle::spawn(config()).unwrap();
    let addr = master.rpc_addr();
    let c = MasterClient::connect(&addr.to_string()).unwrap();
    c.mount_segment(1, &segment("a")).unwrap();
    master.stop().unwrap();
    // While it is down: RPC_FAIL, not a hang.
    assert_eq!(c.exist_key("k").unwrap_err().code, ErrorCode::RPC_FAIL);
    // A new master on the same port: the pooled connection is stale, the client reconnects.
    let mut cfg = config();
    cfg.rpc_port = addr.port();
    let master = MasterHandle::spawn(cfg).unwrap();
    assert_eq!(
        c.ping(1).unwrap_err().code,
        ErrorCode::CLIENT_NOT_FOUND,
        "the new master does not know us"
    );
    c.mount_segment(1, &segment("a")).unwrap();
    c.put_start(1, "k", 1, &WriteOptions::default()).unwrap();
    c.put_end(1, "k").unwrap();
    assert!(c.exist_key("k").unwrap());
    drop(master);
}

#[test]
fn tasks_over_rpc() {
    use mooncake_store::types::{TaskStatus, TaskType};
    let master = MasterHandle::spawn(config()).unwrap();
    let c = MasterClient::connect(&master.rpc_addr().to_string()).unwrap();
    c.mount_segment(1, &segment("a")).unwrap();
    c.mount_segment(
        2,
        &SegmentInfo {
            base: 1 << 41,
            ..segment("b")
        },
    )
    .unwrap();
    let on_a = ReplicaPolicy {
        preferred_segment: "a".into(),
        ..Default::default()
    };
    c.put_start(1, "k", 64, &WriteOptions::put(&on_a)).unwrap();
    c.put_end(1, "k").unwrap();
    assert_eq!(
        c.create_copy_task("k", &["nosuch:1".into()])
            .unwrap_err()
            .code,
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        c.create_copy_task("missing", &["b".into()])
            .unwrap_err()
            .code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(c.query_task(0).unwrap_err().code, ErrorCode::TASK_NOT_FOUND);
    let id = c.create_copy_task("k", &["b".into()]).unwrap();
    let info = c.query_task(id).unwrap();
    assert_eq!(
        (info.task_type, info.status, info.assigned_client),
        (TaskType::ReplicaCopy, TaskStatus::Pending, 2)
    );
    assert!(
        info.created_at_ms_epoch > 1_600_000_000_000,
        "wall-clock milliseconds"
    );
    let tasks = c.fetch_tasks(2, 8).unwrap();
    assert_eq!(tasks.len(), 1);
    let new = c
        .replica_transfer_start(2, "k", "", &tasks[0].targets)
        .unwrap();
    assert_eq!(new[0].memory().unwrap().segment_name, "b");
    c.replica_transfer_end(2, "k").unwrap();
    c.mark_task_complete(2, id, true, "").unwrap();
    assert_eq!(c.query_task(id).unwrap().status, TaskStatus::Success);
    assert_eq!(c.get_replica_list("k").unwrap().replicas.len(), 2);
    let moved = c.create_move_task("k", "a", "b").unwrap();
    assert_ne!(moved, id);
    // Leases are off in this config: the replica on b can be cleared.
    assert_eq!(c.batch_replica_clear(1, &["k".into()], "b").unwrap(), ["k"]);
    assert_eq!(c.get_replica_list("k").unwrap().replicas.len(), 1);
}

#[test]
fn after_a_call_times_out_pooled_connections_are_not_waited_on_again() {
    let master = MasterHandle::spawn(config()).unwrap();
    let proxy = test_support::FreezeProxy::start(&master.rpc_addr().to_string());
    let client = MasterClient::connect_with_timeouts(
        &proxy.addr,
        Duration::from_secs(5),
        Duration::from_millis(300),
    )
    .unwrap();
    // Overlapping calls leave several connections in the pool.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while proxy.connections() < 3 {
        assert!(std::time::Instant::now() < deadline, "pool never grew");
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20 {
                        client.exist_key("k").unwrap();
                    }
                });
            }
        });
    }

    // The master stops answering (a host gone dark behind its connections).
    proxy.freeze();
    assert_eq!(client.exist_key("k").unwrap_err().code, ErrorCode::RPC_FAIL);
    // The other pooled connections lead to the same silent master: the next
    // call must not spend its time on one of them, but open a new one
    // (which, for an HA client, is where a new leader gets looked up).
    let opened = proxy.connections();
    assert_eq!(client.exist_key("k").unwrap_err().code, ErrorCode::RPC_FAIL);
    assert!(
        proxy.connections() > opened,
        "the call waited on another pooled connection to the silent master"
    );
}
