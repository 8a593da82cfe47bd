//! Watermark eviction and eviction for a put that found no space.

use super::*;
use crate::master::Answer;

/// Fills segment "a" (100 KiB) with 1 KiB objects put at times 0..n.
fn fill(s: &MasterService, n: u64, cfg: &ReplicaPolicy, key: impl Fn(u64) -> String) {
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
    let hard = ReplicaPolicy {
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
        let soft = ReplicaPolicy {
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
fn puts_made_in_one_millisecond_go_in_the_order_they_were_made() {
    let s = with_segment(100 * 1024);
    // 90 puts, all at the same millisecond: their lease times tie.
    for t in 0..90 {
        put(&s, &format!("k{t}"), 1024, &one(), 0);
    }
    let r = tick(&s, 1000);
    assert_eq!(r.evicted_keys, 20);
    for t in 0..90 {
        assert_eq!(
            s.exist_key(&format!("k{t}"), 1000).unwrap(),
            t >= 20,
            "k{t}: the 20 made first go, the newer stay"
        );
    }
}

#[test]
fn exist_checks_do_not_keep_objects_from_eviction() {
    let s = with_segment(100 * 1024);
    fill(&s, 90, &one(), |t| format!("k{t}"));
    // Poll the oldest just before the round, one key and in a batch: a
    // lease granted here would spare them.
    assert!(s.exist_key("k0", 95).unwrap());
    let keys = vec!["k1", "k2"];
    let Answer { response, .. } = s.handle(Request::BatchExistKey { keys }, 95);
    assert_eq!(
        response,
        Response::Bools {
            results: vec![Ok(true), Ok(true)]
        }
    );
    let r = tick(&s, 100);
    assert_eq!(r.evicted_keys, 20);
    for t in 0..20 {
        assert!(
            !s.exist_key(&format!("k{t}"), 100).unwrap(),
            "k{t} was only checked for: it goes"
        );
    }
    // A read still leases what it reads.
    s.get_replica_list("k20", 100).unwrap();
    put(&s, "k90", 20 * 1024, &one(), 101);
    let r = tick(&s, 102);
    assert!(r.evicted_keys > 0);
    assert!(s.exist_key("k20", 102).unwrap(), "leased by the read");
    assert!(!s.exist_key("k21", 102).unwrap());
}

#[test]
fn a_put_under_pressure_is_refused_with_the_reference_code_then_succeeds() {
    let s = with_segment(100 * 1024);
    fill(&s, 100, &one(), |t| format!("k{t}"));
    // Every object is being read: nothing may go.
    for t in 0..100 {
        s.get_replica_list(&format!("k{t}"), 100).unwrap();
    }
    assert_eq!(
        code(s.put_start(W, "new", 4 * 1024, &one(), false, 150)),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    assert!(
        s.exist_key("k0", 150).unwrap(),
        "nothing leased was evicted"
    );
    // Once the leases end, the same put makes its room and succeeds.
    let later = 100 + LEASE + 1;
    s.put_start(W, "new", 4 * 1024, &one(), false, later)
        .unwrap();
    s.put_end(W, "new", later).unwrap();
    assert!(s.exist_key("new", later).unwrap());
    assert!(!s.exist_key("k0", later).unwrap(), "the oldest made room");
}

/// A master whose metadata budget holds 100 objects under 3-byte keys,
/// evicting from `ratio` of it.
fn with_metadata_watermark(ratio: f64) -> MasterService {
    let cost = 3 + 256;
    let s = MasterService::with_policy(policy())
        .with_metadata_budget(100 * cost)
        .with_metadata_watermark(ratio);
    s.mount_segment(A, &seg("a", 0x10_000, 1 << 20), 0).unwrap();
    s
}

#[test]
fn the_metadata_watermark_evicts_the_oldest_objects() {
    let s = with_metadata_watermark(0.5);
    // 49 objects (1 KiB each: far below the space watermark): below it.
    fill(&s, 49, &one(), |t| format!("k{t:02}"));
    assert_eq!(tick(&s, 1000).evicted_keys, 0);
    put(&s, "k49", 1024, &one(), 49);
    // At 50 of 100: down to 50 - 20 (the eviction ratio), oldest first.
    let r = tick(&s, 1000);
    assert_eq!(r.evicted_keys, 20);
    assert_eq!(r.evicted_bytes, 20 * 1024, "segment bytes freed");
    for t in 0..50 {
        assert_eq!(
            s.exist_key(&format!("k{t:02}"), 1000).unwrap(),
            t >= 20,
            "k{t:02}"
        );
    }
    assert_eq!(s.metadata_bytes(), 30 * (3 + 256));
    assert_eq!(tick(&s, 1001).evicted_keys, 0);
}

#[test]
fn without_the_metadata_watermark_only_the_budget_holds() {
    let s = with_metadata_watermark(0.0);
    fill(&s, 100, &one(), |t| format!("k{t:02}"));
    assert_eq!(tick(&s, 1000).evicted_keys, 0);
    assert_eq!(
        code(s.put_start(W, "k_x", 1024, &one(), false, 1000)),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
}

#[test]
fn objects_read_since_their_put_outlast_newer_ones_never_read() {
    for (order, read_stay) in [
        (EvictionPolicy::Frequency, true),
        (EvictionPolicy::Lru, false),
    ] {
        let s = MasterService::with_policy(Policy {
            eviction_policy: order,
            ..policy()
        });
        s.mount_segment(A, &seg("a", 0x10_000, 100 * 1024), 0)
            .unwrap();
        // A first round sets the weight of a read: its boundary, k19, was
        // last used 981 ms before it (490 ms a read).
        fill(&s, 90, &one(), |t| format!("k{t}"));
        assert_eq!(tick(&s, 1000).evicted_keys, 20);
        for t in 20..30 {
            s.get_replica_list(&format!("k{t}"), 1000).unwrap();
        }
        for t in 30..90 {
            s.remove(&format!("k{t}"), false, 1000).unwrap();
        }
        // 80 newer objects, never read, all put after the reads' leases.
        let after = 1000 + LEASE + 1;
        for t in 0..80 {
            put(&s, &format!("n{t}"), 1024, &one(), after + t);
        }
        assert_eq!(tick(&s, after + 200).evicted_keys, 20, "{order:?}");
        for t in 20..30 {
            assert_eq!(
                s.exist_key(&format!("k{t}"), after + 200).unwrap(),
                read_stay,
                "{order:?}: k{t}, read once, older than every n"
            );
        }
        let newer_gone = if read_stay { 20 } else { 10 };
        for t in 0..80 {
            assert_eq!(
                s.exist_key(&format!("n{t}"), after + 200).unwrap(),
                t >= newer_gone,
                "{order:?}: n{t}"
            );
        }
    }
}
