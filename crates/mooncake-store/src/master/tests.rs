//! State-machine tests with a hand-driven clock (milliseconds).

use mooncake_common::ErrorCode;

use super::{AllocationStrategy, LeasePolicy, MasterService, Policy, TaskPolicy, TickReport};
use crate::proto::{Request, Response};
use crate::types::{
    ClientId, ReplicaDesc, ReplicaStatus, ReplicateConfig, SegmentInfo, MAX_KEY_LEN,
};
use crate::types::{TaskStatus, TaskType};

const A: ClientId = 1;
const B: ClientId = 2;
const W: ClientId = 3;
const LEASE: u64 = 100;
const SOFT_PIN: u64 = 1_000;
const CLIENT_TTL: u64 = 500;
const DISCARD: u64 = 300;
const RELEASE: u64 = 600;
/// Time for reads whose lease does not matter to the test.
const NOW: u64 = 0;

fn policy() -> Policy {
    Policy {
        lease: LeasePolicy {
            lease_ttl: LEASE,
            soft_pin_ttl: SOFT_PIN,
        },
        client_ttl: CLIENT_TTL,
        discard_after: DISCARD,
        release_after: RELEASE,
        high_watermark: 0.9,
        eviction_ratio: 0.2,
        evict_soft_pinned: true,
        strategy: AllocationStrategy::Random,
    }
}

fn seg(name: &str, base: u64, size: u64) -> SegmentInfo {
    SegmentInfo {
        name: name.into(),
        base,
        size,
        transport_endpoint: format!("{name}-host:1234"),
    }
}

fn one() -> ReplicateConfig {
    ReplicateConfig::default()
}

fn put(
    s: &MasterService,
    key: &str,
    len: u64,
    cfg: &ReplicateConfig,
    now: u64,
) -> Vec<ReplicaDesc> {
    let d = s.put_start(W, key, len, cfg, false, now).unwrap();
    s.put_end(W, key, now).unwrap();
    d
}

/// Runs the timers with segment owner A alive.
fn tick(s: &MasterService, now: u64) -> TickReport {
    let _ = s.ping(A, now);
    s.tick(now)
}

fn used(s: &MasterService) -> u64 {
    s.stats(0).allocated_bytes
}

fn code<T: std::fmt::Debug>(r: mooncake_common::Result<T>) -> ErrorCode {
    r.unwrap_err().code
}

fn addr(d: &ReplicaDesc) -> u64 {
    d.memory().unwrap().buffer_address
}

fn segment_of(d: &ReplicaDesc) -> &str {
    &d.memory().unwrap().segment_name
}

/// One segment "a" of `size` bytes owned by client A.
fn with_segment(size: u64) -> MasterService {
    let s = MasterService::with_policy(policy());
    s.mount_segment(A, &seg("a", 0x10_000, size), 0).unwrap();
    s
}

#[test]
fn put_lifecycle() {
    let s = with_segment(1 << 20);
    let d = s.put_start(W, "k", 4096, &one(), false, 0).unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].status, ReplicaStatus::Processing);
    let m = d[0].memory().unwrap();
    assert_eq!(
        (
            m.segment_name.as_str(),
            m.transport_endpoint.as_str(),
            m.size
        ),
        ("a", "a-host:1234", 4096)
    );
    assert!(m.buffer_address >= 0x10_000 && m.buffer_address + 4096 <= 0x10_000 + (1 << 20));

    // Not visible until PutEnd.
    assert_eq!(
        code(s.get_replica_list("k", 1)),
        ErrorCode::REPLICA_IS_NOT_READY
    );
    assert!(!s.exist_key("k", NOW).unwrap());
    assert_eq!(code(s.get_size("k", NOW)), ErrorCode::REPLICA_IS_NOT_READY);
    assert_eq!(
        code(s.put_start(W, "k", 10, &one(), false, 1)),
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
    assert_eq!(code(s.put_end(B, "k", 2)), ErrorCode::ILLEGAL_CLIENT);

    s.put_end(W, "k", 2).unwrap();
    s.put_end(W, "k", 2).unwrap(); // repeated PutEnd is harmless
    let got = s.get_replica_list("k", 3).unwrap();
    assert_eq!(got.lease_ttl_ms, LEASE);
    assert_eq!(got.replicas.len(), 1);
    assert_eq!(got.replicas[0].status, ReplicaStatus::Complete);
    assert_eq!(addr(&got.replicas[0]), m.buffer_address);
    assert!(s.exist_key("k", NOW).unwrap());
    assert_eq!(s.get_size("k", NOW).unwrap(), 4096);
    assert_eq!(
        code(s.put_start(W, "k", 10, &one(), false, 4)),
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
    assert_eq!(s.all_keys(), ["k"]);
    assert_eq!(used(&s), 4096);
}

#[test]
fn bad_inputs_get_reference_codes() {
    let s = MasterService::with_policy(policy());
    assert_eq!(
        code(s.put_start(W, "k", 8, &one(), false, 0)),
        ErrorCode::SEGMENT_NOT_FOUND
    );
    s.mount_segment(A, &seg("a", 0, 4096), 0).unwrap();
    let long = "x".repeat(MAX_KEY_LEN + 1);
    assert_eq!(
        code(s.put_start(W, "", 8, &one(), false, 0)),
        ErrorCode::INVALID_KEY
    );
    assert_eq!(
        code(s.put_start(W, &long, 8, &one(), false, 0)),
        ErrorCode::INVALID_KEY
    );
    assert_eq!(code(s.get_replica_list("", 0)), ErrorCode::INVALID_KEY);
    assert_eq!(code(s.exist_key(&long, NOW)), ErrorCode::INVALID_KEY);
    assert_eq!(
        code(s.put_start(W, "k", 0, &one(), false, 0)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(s.put_start(W, "k", u64::MAX, &one(), false, 0)),
        ErrorCode::INVALID_PARAMS
    );
    let zero = ReplicateConfig {
        replica_num: 0,
        ..one()
    };
    assert_eq!(
        code(s.put_start(W, "k", 8, &zero, false, 0)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(s.put_start(W, "k", 8192, &one(), false, 0)),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    for r in [
        s.put_end(W, "nope", 0),
        s.put_revoke(W, "nope", 0),
        s.remove("nope", false, 0),
    ] {
        assert_eq!(code(r), ErrorCode::OBJECT_NOT_FOUND);
    }
    assert_eq!(
        code(s.get_replica_list("nope", 0)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(code(s.get_size("nope", NOW)), ErrorCode::OBJECT_NOT_FOUND);
    assert!(!s.exist_key("nope", NOW).unwrap());
    assert_eq!(
        code(s.remove_by_regex("(", false, 0)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(s.unmount_segment(A, "nope", 0)),
        ErrorCode::SEGMENT_NOT_FOUND
    );
    assert_eq!(
        code(s.unmount_segment(B, "a", 0)),
        ErrorCode::ILLEGAL_CLIENT
    );

    let req = Request::BatchPutStart {
        client_id: W,
        keys: vec!["a", "b"],
        value_lens: vec![1],
        config: one(),
        upsert: false,
    };
    match s.handle(req, 0) {
        Response::Failed { error } => assert_eq!(error.code, ErrorCode::INVALID_PARAMS),
        other => panic!("{other:?}"),
    }
    // Nothing was lost along the way.
    assert_eq!(used(&s), 0);
    put(&s, "fine", 100, &one(), 0);
    assert!(s.exist_key("fine", NOW).unwrap());
}

#[test]
fn batch_calls_answer_per_key() {
    let s = with_segment(1 << 16);
    let req = Request::BatchPutStart {
        client_id: W,
        keys: vec!["x", "", "y", "x"],
        value_lens: vec![10, 10, 1 << 20, 10],
        config: one(),
        upsert: false,
    };
    let Response::BatchReplicas { results } = s.handle(req, 0) else {
        panic!()
    };
    let codes: Vec<_> = results
        .iter()
        .map(|r| r.as_ref().err().map(|e| e.code))
        .collect();
    assert_eq!(
        codes,
        [
            None,
            Some(ErrorCode::INVALID_KEY),
            Some(ErrorCode::NO_AVAILABLE_HANDLE),
            Some(ErrorCode::OBJECT_ALREADY_EXISTS)
        ]
    );
    let Response::Units { results } = s.handle(
        Request::BatchPutEnd {
            client_id: W,
            keys: vec!["x", "zz"],
        },
        1,
    ) else {
        panic!()
    };
    assert!(results[0].is_ok());
    assert_eq!(
        results[1].as_ref().unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    let Response::Bools { results } = s.handle(
        Request::BatchExistKey {
            keys: vec!["x", "y"],
        },
        2,
    ) else {
        panic!()
    };
    assert_eq!(results, [Ok(true), Ok(false)]);
    let Response::BatchReplicaList { results } = s.handle(
        Request::BatchGetReplicaList {
            keys: vec!["x", "y"],
        },
        2,
    ) else {
        panic!()
    };
    assert_eq!(results[0].as_ref().unwrap().replicas.len(), 1);
    assert_eq!(
        results[1].as_ref().unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    let Response::Units { results } = s.handle(
        Request::BatchRemove {
            keys: vec!["x", "y"],
            force: true,
        },
        3,
    ) else {
        panic!()
    };
    assert!(results[0].is_ok());
    assert_eq!(used(&s), 0);
}

#[test]
fn revoke_frees_space_and_hides_the_object() {
    let s = with_segment(1 << 20);
    s.put_start(W, "k", 1000, &one(), false, 0).unwrap();
    assert_eq!(used(&s), 1000);
    assert_eq!(code(s.put_revoke(B, "k", 1)), ErrorCode::ILLEGAL_CLIENT);
    s.put_revoke(W, "k", 1).unwrap();
    assert_eq!(used(&s), 0);
    assert_eq!(
        code(s.get_replica_list("k", 1)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    put(&s, "k", 1000, &one(), 2);
    assert_eq!(code(s.put_revoke(W, "k", 3)), ErrorCode::INVALID_WRITE);
}

#[test]
fn replicas_go_to_distinct_segments_best_effort() {
    let s = with_segment(1 << 20);
    s.mount_segment(B, &seg("b", 0x100_000_000, 1 << 20), 0)
        .unwrap();
    s.mount_segment(B, &seg("c", 0x200_000_000, 1 << 20), 0)
        .unwrap();
    for strategy in [
        AllocationStrategy::Random,
        AllocationStrategy::FreeRatioFirst,
    ] {
        let mut p = policy();
        p.strategy = strategy;
        let s2 = MasterService::with_policy(p);
        for (i, n) in ["a", "b", "c"].iter().enumerate() {
            s2.mount_segment(A, &seg(n, (i as u64 + 1) << 32, 1 << 20), 0)
                .unwrap();
        }
        for i in 0..20 {
            let cfg = ReplicateConfig {
                replica_num: 2,
                ..one()
            };
            let d = put(&s2, &format!("k{i}"), 4096, &cfg, 0);
            assert_eq!(d.len(), 2);
            assert_ne!(segment_of(&d[0]), segment_of(&d[1]));
        }
        // Four replicas requested, three segments: three granted.
        let d = put(
            &s2,
            "wide",
            10,
            &ReplicateConfig {
                replica_num: 4,
                ..one()
            },
            0,
        );
        assert_eq!(d.len(), 3);
        assert_eq!(s2.get_replica_list("wide", 1).unwrap().replicas.len(), 3);
    }
    // Preferred segment first.
    let cfg = ReplicateConfig {
        replica_num: 1,
        preferred_segment: "c".into(),
        ..one()
    };
    for i in 0..10 {
        assert_eq!(segment_of(&put(&s, &format!("p{i}"), 64, &cfg, 0)[0]), "c");
    }
}

#[test]
fn free_ratio_first_fills_the_new_segment() {
    let mut p = policy();
    p.strategy = AllocationStrategy::FreeRatioFirst;
    let s = MasterService::with_policy(p);
    s.mount_segment(A, &seg("old", 0, 1 << 20), 0).unwrap();
    for i in 0..100 {
        put(&s, &format!("o{i}"), 8192, &one(), 0);
    }
    s.mount_segment(B, &seg("new", 1 << 40, 1 << 20), 0)
        .unwrap();
    for i in 0..20 {
        assert_eq!(
            segment_of(&put(&s, &format!("n{i}"), 8192, &one(), 0)[0]),
            "new"
        );
    }
}

#[test]
fn leases_block_removal_until_they_expire() {
    let s = with_segment(1 << 20);
    put(&s, "k", 100, &one(), 0);
    s.remove("k", false, 1)
        .unwrap_or_else(|e| panic!("unread object is removable: {e}"));
    put(&s, "k", 100, &one(), 10);
    s.get_replica_list("k", 20).unwrap(); // lease until 120
    assert_eq!(code(s.remove("k", false, 50)), ErrorCode::OBJECT_HAS_LEASE);
    assert_eq!(s.remove_all(false, 119), 0);
    assert_eq!(s.remove_by_regex(".*", false, 119).unwrap(), 0);
    s.get_replica_list("k", 100).unwrap(); // extended to 200
    assert_eq!(code(s.remove("k", false, 150)), ErrorCode::OBJECT_HAS_LEASE);
    s.remove("k", false, 200).unwrap();
    assert_eq!(used(&s), 0);

    put(&s, "k", 100, &one(), 300);
    s.get_replica_list("k", 300).unwrap();
    s.remove("k", true, 301).unwrap(); // force ignores the lease
    put(&s, "k", 100, &one(), 400);
    s.get_replica_list("k", 400).unwrap();
    assert_eq!(s.remove_all(true, 401), 1);
    assert_eq!(used(&s), 0);
}

/// The server stamps `now` when a frame arrives, before the object's lock, so
/// calls on one object may lock out of clock order. A call must never see a
/// lease stamped "after" it by a call that locked before it.
#[test]
fn out_of_order_stamps_see_no_phantom_lease() {
    let s = MasterService::with_policy(Policy {
        lease: LeasePolicy {
            lease_ttl: 0,
            soft_pin_ttl: SOFT_PIN,
        },
        ..policy()
    });
    s.mount_segment(A, &seg("a", 1 << 30, 1 << 20), 0).unwrap();
    // With a zero TTL no read leases anything: a remove stamped before a
    // read (or a PutEnd) that locked first still succeeds.
    put(&s, "r", 100, &one(), 5);
    s.get_replica_list("r", 11).unwrap();
    assert!(s.exist_key("r", 12).unwrap());
    s.remove("r", false, 10)
        .unwrap_or_else(|e| panic!("ttl 0 leased an object: {e}"));
    s.put_start(W, "w", 100, &one(), false, 20).unwrap();
    s.put_end(W, "w", 21).unwrap();
    s.remove("w", false, 20)
        .unwrap_or_else(|e| panic!("a write leased an object: {e}"));
    assert_eq!(used(&s), 0);

    // With a real TTL the late-stamped remove runs at the read's time: the
    // lease it sees is the read's whole TTL, no more.
    let s = with_segment(1 << 20);
    put(&s, "k", 100, &one(), 0);
    s.get_replica_list("k", 50).unwrap(); // lease until 150
    assert_eq!(code(s.remove("k", false, 10)), ErrorCode::OBJECT_HAS_LEASE);
    s.remove("k", false, 150).unwrap();
}

#[test]
fn every_metadata_read_grants_the_lease() {
    let s = with_segment(1 << 20);
    put(&s, "e", 100, &one(), 0);
    assert!(s.exist_key("e", 10).unwrap());
    assert_eq!(code(s.remove("e", false, 50)), ErrorCode::OBJECT_HAS_LEASE);
    put(&s, "g", 100, &one(), 0);
    assert_eq!(s.get_size("g", 10).unwrap(), 100);
    assert_eq!(code(s.remove("g", false, 50)), ErrorCode::OBJECT_HAS_LEASE);
    // A miss grants nothing and a put in flight is not readable.
    assert!(!s.exist_key("missing", 10).unwrap());
    s.put_start(W, "p", 100, &one(), false, 0).unwrap();
    assert!(!s.exist_key("p", 10).unwrap());
    s.put_end(W, "p", 11).unwrap();
    s.remove("p", false, 12).unwrap();
}

#[test]
fn hard_pins_need_force_or_remove_all() {
    let s = with_segment(1 << 20);
    let hard = ReplicateConfig {
        with_hard_pin: true,
        ..one()
    };
    put(&s, "h", 100, &hard, 0);
    assert_eq!(code(s.remove("h", false, 1)), ErrorCode::OBJECT_HAS_LEASE);
    assert_eq!(s.remove_by_regex("h", false, 1).unwrap(), 0);
    s.remove("h", true, 1).unwrap();
    put(&s, "h", 100, &hard, 2);
    assert_eq!(s.remove_all(false, 3), 1);
    assert!(s.all_keys().is_empty());
}

#[test]
fn remove_by_regex_counts_matches() {
    let s = with_segment(1 << 20);
    for k in ["layer1/a", "layer1/b", "layer2/a", "other"] {
        put(&s, k, 64, &one(), 0);
    }
    s.put_start(W, "layer1/pending", 64, &one(), false, 0)
        .unwrap();
    assert_eq!(s.remove_by_regex("^layer1/", false, 1).unwrap(), 2);
    assert_eq!(s.remove_by_regex("/a$", false, 1).unwrap(), 1);
    let mut keys = s.all_keys();
    keys.sort();
    assert_eq!(keys, ["other"]);
    // The put in flight was left alone.
    s.put_end(W, "layer1/pending", 2).unwrap();
    assert!(s.exist_key("layer1/pending", NOW).unwrap());
}

/// Fills segment "a" (100 KiB) with 1 KiB objects put at times 0..n.
fn fill(s: &MasterService, n: u64, cfg: &ReplicateConfig, key: impl Fn(u64) -> String) {
    for t in 0..n {
        put(s, &key(t), 1024, cfg, t);
    }
}

#[test]
fn eviction_takes_oldest_first_above_the_watermark() {
    let s = with_segment(100 * 1024);
    fill(&s, 89, &one(), |t| format!("k{t}"));
    // 89% < 90% watermark: nothing happens.
    assert_eq!(tick(&s, 1000).evicted_keys, 0);
    put(&s, "k89", 1024, &one(), 89);
    // 90%: free down to 70% (watermark minus ratio): the 20 oldest go.
    let r = tick(&s, 1000);
    assert_eq!(r.evicted_keys, 20);
    assert_eq!(r.evicted_bytes, 20 * 1024);
    for t in 0..20 {
        assert!(
            !s.exist_key(&format!("k{t}"), NOW).unwrap(),
            "k{t} should be evicted"
        );
    }
    for t in 20..90 {
        assert!(
            s.exist_key(&format!("k{t}"), NOW).unwrap(),
            "k{t} should stay"
        );
    }
    assert_eq!(used(&s), 70 * 1024);
}

#[test]
fn eviction_spares_leased_hard_pinned_and_in_flight_objects() {
    let s = with_segment(100 * 1024);
    let hard = ReplicateConfig {
        with_hard_pin: true,
        ..one()
    };
    // Oldest objects: hard pinned (0..10), leased (10..20), in flight (20..30).
    fill(&s, 10, &hard, |t| format!("h{t}"));
    for t in 10..20 {
        put(&s, &format!("l{t}"), 1024, &one(), t);
    }
    for t in 20..30 {
        s.put_start(W, &format!("p{t}"), 1024, &one(), false, t)
            .unwrap();
    }
    for t in 30..90 {
        put(&s, &format!("k{t}"), 1024, &one(), t);
    }
    for t in 10..20 {
        s.get_replica_list(&format!("l{t}"), 95).unwrap(); // leased until 195
    }
    let r = tick(&s, 100);
    assert_eq!(r.evicted_keys, 20);
    for t in 0..10 {
        assert!(s.exist_key(&format!("h{t}"), NOW).unwrap());
        assert!(s.exist_key(&format!("l{}", t + 10), NOW).unwrap());
        s.put_end(W, &format!("p{}", t + 20), 100).unwrap();
    }
    for t in 30..50 {
        assert!(!s.exist_key(&format!("k{t}"), NOW).unwrap());
    }
}

#[test]
fn soft_pinned_objects_go_last_and_only_if_allowed() {
    for allow in [true, false] {
        let mut p = policy();
        p.evict_soft_pinned = allow;
        let s = MasterService::with_policy(p);
        s.mount_segment(A, &seg("a", 0, 100 * 1024), 0).unwrap();
        let soft = ReplicateConfig {
            with_soft_pin: true,
            ..one()
        };
        // 80 soft-pinned (oldest), 10 plain.
        fill(&s, 80, &soft, |t| format!("s{t}"));
        for t in 80..90 {
            put(&s, &format!("k{t}"), 1024, &one(), t);
        }
        assert_eq!(s.stats(100).soft_pin_key_count, 80);
        let r = tick(&s, 100);
        for t in 80..90 {
            assert!(
                !s.exist_key(&format!("k{t}"), NOW).unwrap(),
                "plain objects go first"
            );
        }
        if allow {
            assert_eq!(r.evicted_keys, 20);
            assert!(!s.exist_key("s0", NOW).unwrap() && s.exist_key("s10", NOW).unwrap());
        } else {
            assert_eq!(r.evicted_keys, 10);
            assert_eq!(s.stats(100).key_count, 80);
        }
        // Once the soft pin lapses (no access for its TTL) they are plain objects.
        assert_eq!(s.stats(5000).soft_pin_key_count, 0);
    }
}

#[test]
fn a_put_that_finds_no_space_evicts_and_succeeds() {
    let s = with_segment(100 * 1024);
    // 80% full: below the watermark, 20 KiB free at the end.
    fill(&s, 80, &one(), |t| format!("k{t}"));
    s.get_replica_list("k0", 95).unwrap(); // the oldest is leased: it stays
    let d = s
        .put_start(W, "big", 25 * 1024, &one(), false, 100)
        .unwrap();
    s.put_end(W, "big", 100).unwrap();
    // The round freed what the put needs, oldest first, sparing the leased one.
    assert!(s.exist_key("k0", 100).unwrap());
    for t in 1..=25 {
        assert!(
            !s.exist_key(&format!("k{t}"), 100).unwrap(),
            "k{t} should be evicted"
        );
    }
    for t in 26..80 {
        assert!(
            s.exist_key(&format!("k{t}"), 100).unwrap(),
            "k{t} should stay"
        );
    }
    assert_eq!(
        addr(&d[0]),
        0x10_000 + 1024,
        "the freed range after the leased object"
    );
    // No second round at the next tick.
    assert_eq!(tick(&s, 101).evicted_keys, 0);
    // A value larger than every segment evicts nothing.
    assert_eq!(
        code(s.put_start(W, "huge", 200 * 1024, &one(), false, 102)),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    assert!(s.exist_key("k26", 102).unwrap());
}

#[test]
fn expired_clients_lose_segments_and_objects() {
    let s = with_segment(1 << 20);
    s.mount_segment(B, &seg("b", 1 << 40, 1 << 20), 0).unwrap();
    let on_b = ReplicateConfig {
        preferred_segment: "b".into(),
        ..one()
    };
    let both = ReplicateConfig {
        replica_num: 2,
        ..one()
    };
    put(&s, "only-b", 100, &on_b, 0);
    put(&s, "both", 100, &both, 0);
    put(
        &s,
        "only-a",
        100,
        &ReplicateConfig {
            preferred_segment: "a".into(),
            ..one()
        },
        0,
    );
    s.get_replica_list("only-b", 400).unwrap(); // a lease does not keep a dead segment alive

    // A keeps pinging, B goes silent.
    for t in (100..500).step_by(100) {
        s.ping(A, t).unwrap();
        assert_eq!(s.tick(t).expired_clients, 0);
    }
    assert_eq!(s.tick(CLIENT_TTL + 1).expired_clients, 1);
    assert_eq!(
        code(s.get_replica_list("only-b", 600)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    let both = s.get_replica_list("both", 600).unwrap();
    assert_eq!(both.replicas.len(), 1);
    assert_eq!(segment_of(&both.replicas[0]), "a");
    assert!(s.exist_key("only-a", NOW).unwrap());
    let segs = s.segment_summaries();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].name, "a");
    // B comes back: told to remount, and can.
    assert_eq!(code(s.ping(B, 700)), ErrorCode::CLIENT_NOT_FOUND);
    s.ping(B, 701).unwrap();
    s.mount_segment(B, &seg("b", 1 << 40, 1 << 20), 702)
        .unwrap();
    put(&s, "again-b", 100, &on_b, 703);
    assert_eq!(
        segment_of(&s.get_replica_list("again-b", 704).unwrap().replicas[0]),
        "b"
    );
}

#[test]
fn a_writer_that_dies_mid_put_leaves_nothing_behind() {
    let s = with_segment(1 << 20);
    s.ping(W, 0).unwrap_err(); // registers the writer
    s.put_start(W, "k", 4096, &one(), false, 10).unwrap();
    assert_eq!(used(&s), 4096);
    s.ping(A, 400).unwrap();
    let r = s.tick(CLIENT_TTL);
    assert_eq!(r.expired_clients, 1);
    assert_eq!(
        code(s.get_replica_list("k", 501)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(used(&s), 0, "a dead writer's space is reclaimed at once");
    put(&s, "k", 4096, &one(), 502);
}

#[test]
fn unfinished_puts_time_out() {
    let s = with_segment(1 << 20);
    s.put_start(W, "slow", 4096, &one(), false, 0).unwrap();
    assert_eq!(tick(&s, DISCARD - 1).discarded_puts, 0);
    assert_eq!(tick(&s, DISCARD).discarded_puts, 1);
    assert_eq!(
        code(s.get_replica_list("slow", DISCARD)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(
        code(s.put_end(W, "slow", DISCARD + 1)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    // The writer might be slow rather than dead: the space waits for the release timeout.
    assert_eq!(used(&s), 4096);
    assert_eq!(tick(&s, RELEASE - 1).freed_retired, 0);
    assert_eq!(tick(&s, RELEASE).freed_retired, 1);
    assert_eq!(used(&s), 0);

    // A new put on a zombie key replaces the zombie.
    s.put_start(W, "z", 64, &one(), false, 1000).unwrap();
    assert_eq!(
        code(s.put_start(B, "z", 64, &one(), false, 1000 + DISCARD - 1)),
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
    s.put_start(B, "z", 64, &one(), false, 1000 + DISCARD)
        .unwrap();
    s.put_end(B, "z", 1000 + DISCARD).unwrap();
    assert!(s.exist_key("z", NOW).unwrap());
    tick(&s, 1000 + RELEASE);
    assert_eq!(used(&s), 64);
}

#[test]
fn upsert_in_place_and_into_new_space() {
    let s = with_segment(1 << 20);
    assert_eq!(
        code(
            s.put_start(W, "k", 100, &one(), false, 0)
                .and_then(|_| s.put_start(W, "k", 100, &one(), true, 0))
        ),
        ErrorCode::OBJECT_REPLICA_BUSY
    );
    s.put_end(W, "k", 0).unwrap();
    let first = addr(&s.get_replica_list("k", 0).unwrap().replicas[0]);

    // Same size, no lease (expired at 100): rewritten in place, unreadable meanwhile.
    let d = s.upsert(W, "k", 100, 200);
    assert_eq!(addr(&d[0]), first);
    assert_eq!(
        code(s.get_replica_list("k", 201)),
        ErrorCode::REPLICA_IS_NOT_READY
    );
    s.put_end(W, "k", 202).unwrap();
    assert_eq!(s.get_size("k", NOW).unwrap(), 100);
    assert_eq!(used(&s), 104);

    // Leased (read at 300): new space; the old version stays readable until PutEnd.
    s.get_replica_list("k", 300).unwrap();
    let d = s.upsert(W, "k", 100, 301);
    assert_ne!(addr(&d[0]), first);
    assert_eq!(
        addr(&s.get_replica_list("k", 302).unwrap().replicas[0]),
        first
    );
    s.put_end(W, "k", 303).unwrap();
    let after = s.get_replica_list("k", 304).unwrap();
    assert_eq!(addr(&after.replicas[0]), addr(&d[0]));
    // The old replica is freed only when the readers' lease is over.
    assert_eq!(used(&s), 208);
    tick(&s, 302 + LEASE);
    assert_eq!(used(&s), 104);

    // A new size: new space; revoking keeps the old version.
    let d = s.upsert(W, "k", 5000, 500);
    assert_eq!(d[0].memory().unwrap().size, 5000);
    s.put_revoke(W, "k", 501).unwrap();
    assert_eq!(s.get_size("k", NOW).unwrap(), 100);
    assert_eq!(used(&s), 104);
    // Upsert of a missing key is a put.
    s.upsert(W, "new", 10, 600);
    s.put_end(W, "new", 600).unwrap();
    assert_eq!(s.get_size("new", NOW).unwrap(), 10);
}

impl MasterService {
    fn upsert(&self, client: ClientId, key: &str, len: u64, now: u64) -> Vec<ReplicaDesc> {
        self.put_start(client, key, len, &one(), true, now).unwrap()
    }
}

#[test]
fn unmounting_a_segment_drops_its_replicas() {
    let s = with_segment(1 << 20);
    s.mount_segment(A, &seg("a2", 1 << 40, 1 << 20), 0).unwrap();
    let on = |n: &str| ReplicateConfig {
        preferred_segment: n.into(),
        ..one()
    };
    put(&s, "x", 10, &on("a2"), 0);
    s.put_start(W, "inflight", 10, &on("a2"), false, 0).unwrap();
    put(&s, "y", 10, &on("a"), 0);
    s.unmount_segment(A, "a2", 1).unwrap();
    assert!(!s.exist_key("x", NOW).unwrap());
    assert_eq!(
        code(s.put_end(W, "inflight", 2)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert!(s.exist_key("y", NOW).unwrap());
    // Re-mounting the same name later is a new, empty segment.
    s.mount_segment(A, &seg("a2", 1 << 40, 1 << 20), 3).unwrap();
    assert_eq!(
        s.segment_summaries()
            .iter()
            .find(|x| x.name == "a2")
            .unwrap()
            .used,
        0
    );
    tick(&s, 10_000);
    assert_eq!(used(&s), 16, "only y remains (10 bytes rounded up)");
}

#[test]
fn replica_clear_needs_an_expired_lease() {
    let s = with_segment(1 << 20);
    s.mount_segment(A, &seg("a2", 1 << 40, 1 << 20), 0).unwrap();
    let two = ReplicateConfig {
        replica_num: 2,
        ..one()
    };
    put(&s, "x", 100, &two, 0);
    put(&s, "y", 100, &two, 0);
    put(&s, "z", 100, &one(), 0);
    s.get_replica_list("y", 10).unwrap();
    // y is leased; "missing" and an invalid key are skipped.
    let cleared = s.batch_replica_clear(&["x", "y", "missing", ""], "a2", 20);
    assert_eq!(cleared, ["x"]);
    assert_eq!(s.get_replica_list("x", 21).unwrap().replicas.len(), 1);
    assert_eq!(
        segment_of(&s.get_replica_list("x", 21).unwrap().replicas[0]),
        "a"
    );
    // Without a segment name the whole object goes.
    assert_eq!(s.batch_replica_clear(&["y", "z"], "", 200), ["y", "z"]);
    assert!(!s.exist_key("z", 201).unwrap());
    assert_eq!(used(&s), 104, "only x's replica on a remains");
}

#[test]
fn mount_is_idempotent_per_owner() {
    let s = with_segment(1 << 20);
    s.mount_segment(A, &seg("a", 0x10_000, 1 << 20), 1).unwrap();
    assert_eq!(
        code(s.mount_segment(B, &seg("a", 0x10_000, 1 << 20), 1)),
        ErrorCode::SEGMENT_ALREADY_EXISTS
    );
    assert_eq!(s.stats(1).segment_count, 1);
    assert_eq!(s.stats(1).active_clients, 1);
}

/// Segment "a" owned by A and "b" owned by B, both alive.
fn two_owners() -> MasterService {
    let s = with_segment(1 << 20);
    s.mount_segment(B, &seg("b", 1 << 40, 1 << 20), 0).unwrap();
    s
}

#[test]
fn task_creation_checks_its_inputs() {
    let s = two_owners();
    let on_a = ReplicateConfig {
        preferred_segment: "a".into(),
        ..one()
    };
    put(&s, "k", 100, &on_a, 0);
    assert_eq!(
        code(s.create_copy_task("missing", &["b"], 1)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(
        code(s.create_copy_task("k", &["nosuch:1"], 1)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(s.create_copy_task("k", &[], 1)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(s.create_move_task("k", "a", "nosuch:1", 1)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(s.create_move_task("k", "a", "a", 1)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        code(s.create_move_task("k", "b", "a", 1)),
        ErrorCode::REPLICA_NOT_FOUND
    );
    assert_eq!(code(s.query_task(0)), ErrorCode::TASK_NOT_FOUND);
    s.put_start(W, "inflight", 10, &one(), false, 1).unwrap();
    assert_eq!(
        code(s.create_copy_task("inflight", &["b"], 1)),
        ErrorCode::OBJECT_NOT_FOUND
    );
}

#[test]
fn a_copy_task_runs_to_completion() {
    let s = two_owners();
    s.set_epoch_offset(1_000_000);
    put(
        &s,
        "k",
        100,
        &ReplicateConfig {
            preferred_segment: "a".into(),
            ..one()
        },
        0,
    );
    let id = s.create_copy_task("k", &["b"], 10).unwrap();
    let info = s.query_task(id).unwrap();
    assert_eq!(
        (info.task_type, info.status, info.assigned_client),
        (TaskType::ReplicaCopy, TaskStatus::Pending, B)
    );
    assert_eq!(info.created_at_ms_epoch, 1_000_010);
    // Only the target's owner gets it, once.
    assert!(s.fetch_tasks(A, 10, 11).is_empty());
    let tasks = s.fetch_tasks(B, 10, 11);
    assert_eq!(tasks.len(), 1);
    assert_eq!(
        (
            tasks[0].id,
            tasks[0].key.as_str(),
            tasks[0].targets.as_slice()
        ),
        (id, "k", &["b".to_string()][..])
    );
    assert!(s.fetch_tasks(B, 10, 11).is_empty());
    assert_eq!(s.query_task(id).unwrap().status, TaskStatus::Processing);

    let new = s
        .replica_transfer_start(B, "k", "", &["b", "a"], 12)
        .unwrap();
    assert_eq!(new.len(), 1, "a already holds a replica");
    assert_eq!(segment_of(&new[0]), "b");
    // The object stays readable, and busy for writers and plain removal.
    assert_eq!(s.get_replica_list("k", 13).unwrap().replicas.len(), 1);
    assert_eq!(
        code(s.put_start(W, "k", 100, &one(), true, 13)),
        ErrorCode::OBJECT_REPLICA_BUSY
    );
    assert_eq!(
        code(s.remove("k", false, 500)),
        ErrorCode::OBJECT_HAS_REPLICATION_TASK
    );
    assert_eq!(
        code(s.put_end(W, "k", 13)),
        ErrorCode::OBJECT_HAS_REPLICATION_TASK
    );
    assert_eq!(
        code(s.replica_transfer_end(A, "k", 14)),
        ErrorCode::ILLEGAL_CLIENT
    );
    s.replica_transfer_end(B, "k", 14).unwrap();
    let mut segs: Vec<String> = s
        .get_replica_list("k", 15)
        .unwrap()
        .replicas
        .iter()
        .map(|r| segment_of(r).to_string())
        .collect();
    segs.sort();
    assert_eq!(segs, ["a", "b"]);
    assert_eq!(
        code(s.replica_transfer_end(B, "k", 16)),
        ErrorCode::OBJECT_NO_REPLICATION_TASK
    );

    assert_eq!(
        code(s.mark_task_complete(A, id, true, "", 17)),
        ErrorCode::ILLEGAL_CLIENT
    );
    s.mark_task_complete(B, id, true, "done", 17).unwrap();
    let info = s.query_task(id).unwrap();
    assert_eq!(
        (
            info.status,
            info.message.as_str(),
            info.last_updated_at_ms_epoch
        ),
        (TaskStatus::Success, "done", 1_000_017)
    );
    assert_eq!(
        code(s.mark_task_complete(B, id, true, "", 18)),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(used(&s), 208);
}

#[test]
fn a_move_drops_the_source_after_readers_leases() {
    let s = two_owners();
    put(
        &s,
        "k",
        100,
        &ReplicateConfig {
            preferred_segment: "a".into(),
            ..one()
        },
        0,
    );
    s.create_move_task("k", "a", "b", 1).unwrap();
    s.fetch_tasks(B, 1, 1);
    s.replica_transfer_start(B, "k", "a", &["b"], 2).unwrap();
    s.get_replica_list("k", 3).unwrap(); // a reader leases the source until 103
    s.replica_transfer_end(B, "k", 4).unwrap();
    let r = s.get_replica_list("k", 5).unwrap().replicas;
    assert_eq!(r.len(), 1);
    assert_eq!(segment_of(&r[0]), "b");
    assert_eq!(used(&s), 208, "the source waits for the lease");
    tick(&s, 104);
    assert_eq!(used(&s), 104);
    // Copy it back, then move b -> a: a already holds one, so b's just goes.
    s.replica_transfer_start(B, "k", "", &["a"], 200).unwrap();
    s.replica_transfer_end(B, "k", 200).unwrap();
    assert!(s
        .replica_transfer_start(B, "k", "b", &["a"], 201)
        .unwrap()
        .is_empty());
    let r = s.get_replica_list("k", 202).unwrap().replicas;
    assert_eq!((r.len(), segment_of(&r[0])), (1, "a"));
    assert_eq!(used(&s), 104);
}

#[test]
fn revoked_or_abandoned_transfers_free_their_space() {
    let s = two_owners();
    put(
        &s,
        "k",
        100,
        &ReplicateConfig {
            preferred_segment: "a".into(),
            ..one()
        },
        0,
    );
    s.replica_transfer_start(B, "k", "", &["b"], 1).unwrap();
    assert_eq!(used(&s), 208);
    s.replica_transfer_revoke(B, "k").unwrap();
    assert_eq!(used(&s), 104);
    assert_eq!(s.get_replica_list("k", 2).unwrap().replicas.len(), 1);
    // A transfer never ended is discarded with unfinished puts.
    s.replica_transfer_start(B, "k", "", &["b"], 10).unwrap();
    tick(&s, 10 + DISCARD);
    assert!(s.exist_key("k", 10 + DISCARD).unwrap());
    s.ping(B, 10 + RELEASE).unwrap();
    tick(&s, 10 + RELEASE);
    assert_eq!(used(&s), 104);
    // Forced removal mid-transfer drops everything.
    s.replica_transfer_start(B, "k", "", &["b"], 700).unwrap();
    s.remove("k", true, 701).unwrap();
    s.ping(B, 700 + RELEASE).unwrap();
    tick(&s, 701 + RELEASE);
    assert_eq!(used(&s), 0);
}

#[test]
fn tasks_time_out_or_fail_with_their_executor() {
    let s = two_owners().with_task_policy(TaskPolicy {
        pending_timeout: 1_000,
        max_finished: 2,
        ..TaskPolicy::default()
    });
    put(
        &s,
        "k",
        100,
        &ReplicateConfig {
            preferred_segment: "a".into(),
            ..one()
        },
        0,
    );
    let stale = s.create_copy_task("k", &["b"], 0).unwrap();
    s.ping(B, 400).unwrap();
    s.ping(B, 800).unwrap();
    assert_eq!(tick(&s, 999).failed_tasks, 0);
    assert_eq!(tick(&s, 1000).failed_tasks, 1);
    assert_eq!(s.query_task(stale).unwrap().status, TaskStatus::Failed);
    // B goes silent: its segment is unmounted and its tasks fail.
    let orphan = s.create_move_task("k", "a", "b", 1000).unwrap();
    s.fetch_tasks(B, 1, 1000);
    let r = tick(&s, 800 + CLIENT_TTL);
    assert_eq!((r.expired_clients, r.failed_tasks), (1, 1));
    let info = s.query_task(orphan).unwrap();
    assert_eq!(
        (info.status, info.message.as_str()),
        (TaskStatus::Failed, "executor client is gone")
    );
    // Finished tasks are kept up to the limit, oldest dropped first.
    let a_task = s.create_copy_task("k", &["a"], 1400).unwrap();
    s.fetch_tasks(A, 1, 1400);
    s.mark_task_complete(A, a_task, false, "no", 1401).unwrap();
    assert_eq!(code(s.query_task(stale)), ErrorCode::TASK_NOT_FOUND);
    assert_eq!(s.query_task(orphan).unwrap().status, TaskStatus::Failed);
}
