//! Which family each served call moves, on a state machine without sockets.

use super::MasterMetrics;
use crate::master::config::policy::{AllocationStrategy, EvictionPolicy, LeasePolicy, Policy};
use crate::master::state::service::MasterService;
use crate::proto::Request;
use crate::types::{ReplicaPolicy, SegmentInfo};

fn service() -> MasterService {
    MasterService::with_policy(Policy {
        lease: LeasePolicy {
            lease_ttl: 0,
            soft_pin_ttl: 1_000,
        },
        client_ttl: 10_000,
        discard_after: 100,
        release_after: 200,
        high_watermark: 0.9,
        eviction_ratio: 0.1,
        evict_soft_pinned: true,
        eviction_policy: EvictionPolicy::Frequency,
        strategy: AllocationStrategy::Random,
        put_fence: true,
    })
}

fn segment(name: &str) -> SegmentInfo {
    SegmentInfo {
        name: name.into(),
        base: 1 << 40,
        size: 1 << 20,
        transport_endpoint: format!("{name}:1"),
    }
}

/// Serves `req` at `now` and counts it.
fn call(m: &MasterMetrics, svc: &MasterService, req: Request<'_>, now: u64) {
    let c = m.classify(svc, &req);
    let resp = svc.handle(req, now).response;
    m.observe(c, &resp);
}

/// The value of the sample `name` (exact, with labels if any).
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
}

fn render(m: &MasterMetrics, svc: &MasterService, now: u64) -> String {
    m.render(svc, &svc.stats(now))
}

fn put(m: &MasterMetrics, svc: &MasterService, key: &str, len: u64, replicas: usize, now: u64) {
    let config = ReplicaPolicy {
        replica_num: replicas,
        ..Default::default()
    };
    let req = Request::PutStart {
        client_id: 1,
        key,
        value_len: len,
        config,
        upsert: false,
    };
    call(m, svc, req, now);
    call(m, svc, Request::PutEnd { client_id: 1, key }, now);
}

#[test]
fn reads_count_hits_bytes_and_misses() {
    let (m, svc) = (MasterMetrics::new(), service());
    svc.mount_segment(1, &segment("a"), 0).unwrap();
    put(&m, &svc, "k1", 1000, 1, 0);
    put(&m, &svc, "k2", 3000, 1, 0);
    call(&m, &svc, Request::GetReplicaList { key: "k1" }, 1);
    call(&m, &svc, Request::GetReplicaList { key: "nope" }, 1);
    let keys = vec!["k1", "k2", "nope"];
    call(&m, &svc, Request::BatchGetReplicaList { keys }, 1);
    let t = render(&m, &svc, 1);
    assert_eq!(sample(&t, "total_get_nums_"), 5.0);
    assert_eq!(sample(&t, "valid_get_nums_"), 3.0);
    assert_eq!(sample(&t, "mem_cache_hit_nums_"), 3.0);
    assert_eq!(sample(&t, "mem_cache_hit_bytes_total"), 5000.0);
    assert_eq!(sample(&t, "file_cache_hit_nums_"), 0.0);
    assert_eq!(sample(&t, "mem_cache_nums_"), 2.0);
    assert_eq!(sample(&t, "master_get_replica_list_failures_total"), 1.0);
    assert_eq!(
        sample(&t, "master_batch_get_replica_list_partial_successes_total"),
        1.0
    );
    assert_eq!(
        sample(&t, "master_batch_get_replica_list_failed_items_total"),
        1.0
    );
    // Reference types: counters without `_total` are still counters.
    assert!(t.contains("# TYPE mem_cache_hit_nums_ counter\n"), "{t}");
    assert!(t.contains("# TYPE master_evicted_key_count counter\n"));
}

#[test]
fn fewer_replicas_than_asked_is_a_partial_allocation() {
    let (m, svc) = (MasterMetrics::new(), service());
    svc.mount_segment(1, &segment("a"), 0).unwrap();
    put(&m, &svc, "one", 100, 1, 0);
    put(&m, &svc, "three", 100, 3, 0);
    let t = render(&m, &svc, 0);
    assert_eq!(
        sample(&t, "master_put_start_partial_allocations_total"),
        1.0
    );
    assert_eq!(sample(&t, "master_put_start_requests_total"), 2.0);
}

#[test]
fn transfers_count_as_copies_or_moves() {
    let (m, svc) = (MasterMetrics::new(), service());
    for s in ["a", "b", "c"] {
        svc.mount_segment(1, &segment(s), 0).unwrap();
    }
    let config = ReplicaPolicy {
        preferred_segment: "a".into(),
        ..Default::default()
    };
    let start = Request::PutStart {
        client_id: 1,
        key: "k",
        value_len: 100,
        config,
        upsert: false,
    };
    call(&m, &svc, start, 0);
    call(
        &m,
        &svc,
        Request::PutEnd {
            client_id: 1,
            key: "k",
        },
        0,
    );
    let copy = |targets| Request::ReplicaTransferStart {
        client_id: 1,
        key: "k",
        source: "",
        targets,
    };
    call(&m, &svc, copy(vec!["b"]), 1);
    call(
        &m,
        &svc,
        Request::ReplicaTransferEnd {
            client_id: 1,
            key: "k",
        },
        1,
    );
    let mv = Request::ReplicaTransferStart {
        client_id: 1,
        key: "k",
        source: "a",
        targets: vec!["c"],
    };
    call(&m, &svc, mv, 2);
    call(
        &m,
        &svc,
        Request::ReplicaTransferRevoke {
            client_id: 1,
            key: "k",
        },
        2,
    );
    // No transfer in flight: the end fails and is neither a copy nor a move.
    call(
        &m,
        &svc,
        Request::ReplicaTransferEnd {
            client_id: 1,
            key: "k",
        },
        3,
    );
    let t = render(&m, &svc, 3);
    for (name, v) in [
        ("master_copy_start_requests_total", 1.0),
        ("master_copy_end_requests_total", 1.0),
        ("master_copy_revoke_requests_total", 0.0),
        ("master_move_start_requests_total", 1.0),
        ("master_move_end_requests_total", 0.0),
        ("master_move_revoke_requests_total", 1.0),
        ("master_replica_transfer_end_requests_total", 2.0),
        ("master_replica_transfer_end_failures_total", 1.0),
    ] {
        assert_eq!(sample(&t, name), v, "{name}");
    }
}

#[test]
fn discarded_puts_are_released_after_the_release_timeout() {
    let (m, svc) = (MasterMetrics::new(), service());
    svc.mount_segment(1, &segment("a"), 0).unwrap();
    let start = Request::PutStart {
        client_id: 1,
        key: "slow",
        value_len: 4096,
        config: ReplicaPolicy::default(),
        upsert: false,
    };
    call(&m, &svc, start, 0);
    svc.tick(150); // past discard_after, before release_after
    let t = render(&m, &svc, 150);
    assert_eq!(sample(&t, "master_put_start_discard_cnt"), 1.0);
    assert_eq!(sample(&t, "master_put_start_release_cnt"), 0.0);
    assert_eq!(
        sample(&t, "master_put_start_discarded_staging_size"),
        4096.0
    );
    svc.tick(250);
    let t = render(&m, &svc, 250);
    assert_eq!(sample(&t, "master_put_start_release_cnt"), 1.0);
    assert_eq!(sample(&t, "master_put_start_discarded_staging_size"), 0.0);
}

#[test]
fn subsystem_setters_show_up() {
    let (m, svc) = (MasterMetrics::new(), service());
    m.ha.set_oplog_last_sequence_id(10);
    m.ha.set_oplog_applied_sequence_id(7, 10);
    m.ha.set_standby_state(super::tiers::StandbyState::Watching);
    m.promotion.admitted.inc();
    let t = render(&m, &svc, 0);
    assert_eq!(sample(&t, "ha_oplog_standby_lag"), 3.0);
    assert_eq!(sample(&t, "ha_standby_state"), 3.0);
    // The file tier's gauges follow the service (no tier mounted here).
    assert_eq!(sample(&t, "master_total_file_capacity_bytes"), 0.0);
    assert_eq!(sample(&t, "master_promotion_admitted_total"), 1.0);
    let summary = m.summary(&svc, &svc.stats(0));
    for section in [
        "Mem Storage:",
        "SSD Storage: 0 B / 0 B",
        "Keys: 0",
        "Clients: 0",
        "Requests (Success/Total per sec):",
        "Batch Requests",
        "Eviction:",
        "Discard: Released/Total=0/0",
        "Promotion: in_flight=0, admitted=1",
        "Snapshots:",
        "ha={HA Metrics Summary: last_seq=10, applied_seq=7, lag=3",
    ] {
        assert!(summary.contains(section), "{section} not in {summary}");
    }
}
