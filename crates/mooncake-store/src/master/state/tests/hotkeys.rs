//! Hot keys: heat windows and admission (pure, hand-driven clock), target
//! choice, and the fan-out through copy tasks in the state machine.

use std::sync::atomic::Ordering;

use super::*;
use crate::master::config::policy::{HotKeyMode, HotKeyPolicy};
use crate::master::state::hotkeys::{
    choose_target, Candidate, HeatTable, ACTION_COOLDOWN_MS, RECREATE_COOLDOWN_MS,
    WINDOW_ENTRY_LIMIT,
};

fn hot(mode: HotKeyMode) -> HotKeyPolicy {
    // Three reads within a second admit a key.
    HotKeyPolicy {
        mode,
        window_ms: 1_000,
        qps_threshold: 3.0,
        max_memory_replicas: 2,
    }
}

#[test]
fn min_hits_is_the_rate_over_a_window_rounded_up() {
    assert_eq!(HotKeyPolicy::default().min_hits(), 8);
    let p = |qps: f64, secs: u64| HotKeyPolicy {
        qps_threshold: qps,
        window_ms: secs * 1000,
        ..HotKeyPolicy::default()
    };
    assert_eq!(p(2.5, 3).min_hits(), 8);
    assert_eq!(p(0.01, 1).min_hits(), 1);
    assert_eq!(p(3.0, 1).min_hits(), 3);
}

#[test]
fn the_hit_reaching_the_threshold_admits_once_per_window() {
    let p = hot(HotKeyMode::Enforce);
    let mut t = HeatTable::default();
    assert!(!t.observe(&p, "k", 0));
    assert!(!t.observe(&p, "k", 100));
    assert!(!t.admitted(&p, "k", 100));
    assert!(t.observe(&p, "k", 200));
    assert!(t.admitted(&p, "k", 200));
    // More reads in the same window admit nothing new.
    assert!(!t.observe(&p, "k", 300));
    assert!(t.admitted(&p, "k", 999));
    // The window ends a window after its first hit.
    assert!(!t.admitted(&p, "k", 1_000));
    assert!(!t.observe(&p, "k", 1_000));
    assert!(!t.observe(&p, "k", 1_100));
    assert!(t.observe(&p, "k", 1_200));
}

#[test]
fn reads_below_the_rate_never_admit() {
    let p = hot(HotKeyMode::Enforce);
    let mut t = HeatTable::default();
    for w in 0..10u64 {
        assert!(!t.observe(&p, "k", w * 1_000));
        assert!(!t.observe(&p, "k", w * 1_000 + 500));
    }
    assert!(!t.admitted(&p, "k", 9_600));
}

#[test]
fn off_mode_counts_nothing() {
    let p = hot(HotKeyMode::Off);
    let mut t = HeatTable::default();
    for i in 0..10 {
        assert!(!t.observe(&p, "k", i));
    }
    assert_eq!(t.tracked(), 0);
    assert!(!t.admitted(&p, "k", 10));
}

#[test]
fn new_keys_past_the_entry_limit_are_not_counted_until_cleanup() {
    let p = hot(HotKeyMode::Observe);
    let mut t = HeatTable::default();
    for i in 0..WINDOW_ENTRY_LIMIT {
        t.observe(&p, &format!("k{i}"), 0);
    }
    assert_eq!(t.tracked(), WINDOW_ENTRY_LIMIT);
    // Still fresh: cleanup frees nothing and the new key is dropped.
    assert!(!t.observe(&p, "new", 500));
    assert_eq!(t.tracked(), WINDOW_ENTRY_LIMIT);
    // Two windows later one cleanup drops a bounded batch, not all.
    t.observe(&p, "new", 2_500);
    let left = t.tracked();
    assert_eq!(left, WINDOW_ENTRY_LIMIT - 256 + 1);
    // The next cleanup waits a second.
    t.observe(&p, "new2", 2_600);
    assert_eq!(t.tracked(), left + 1);
}

#[test]
fn the_queue_holds_a_key_once() {
    let mut t = HeatTable::default();
    assert!(t.enqueue("a"));
    assert!(!t.enqueue("a"));
    assert!(t.enqueue("b"));
    assert_eq!(t.take_queued(1), ["a"]);
    assert!(t.enqueue("a"));
    assert_eq!(t.take_queued(10), ["b", "a"]);
    assert!(t.take_queued(10).is_empty());
}

#[test]
fn a_fan_out_and_a_dropped_replica_hold_the_key_back() {
    let p = hot(HotKeyMode::Enforce);
    let mut t = HeatTable::default();
    t.fanned_out("k", "b", 7, 100);
    assert!(t.blocked("k", 100 + ACTION_COOLDOWN_MS - 1));
    assert!(!t.blocked("k", 100 + ACTION_COOLDOWN_MS));
    assert_eq!(t.extras("k").len(), 1);
    // A failed copy is forgotten without a penalty.
    t.forget_extra("k", "b", false, 200);
    assert!(!t.has_extras("k"));
    assert!(!t.blocked("k", 100 + ACTION_COOLDOWN_MS));
    // A replica the master took back is not made again for a minute.
    t.fanned_out("k", "c", 8, 40_000);
    t.forget_extra("k", "c", true, 50_000);
    assert!(t.blocked("k", 50_000 + RECREATE_COOLDOWN_MS - 1));
    assert!(!t.blocked("k", 50_000 + RECREATE_COOLDOWN_MS));
    t.expire_cooldowns(50_000 + RECREATE_COOLDOWN_MS);
    assert!(!t.cooled(&p, "k", 1_000_000));
}

#[test]
fn a_key_cools_two_windows_after_its_last_hot_read() {
    let p = hot(HotKeyMode::Enforce);
    let mut t = HeatTable::default();
    t.fanned_out("k", "b", 1, 0);
    assert!(!t.cooled(&p, "k", 1_999));
    assert!(t.cooled(&p, "k", 2_000));
    for at in [1_500, 1_600, 1_700] {
        t.observe(&p, "k", at);
    }
    assert!(!t.cooled(&p, "k", 3_000));
    assert!(t.cooled(&p, "k", 3_700));
}

fn cand<'a>(name: &'a str, endpoint: &'a str, used: u64) -> Candidate<'a> {
    Candidate {
        name,
        endpoint,
        used,
        capacity: 1_000,
        allocatable: true,
    }
}

#[test]
fn the_target_is_another_host_then_the_emptiest() {
    let segs = [
        cand("a", "h1:1", 100),
        cand("a2", "h1:2", 0),
        cand("b", "h2:1", 500),
        cand("c", "h3:1", 400),
    ];
    // "a2" is emptier but on the host of the replica.
    assert_eq!(choose_target("k", 10, &["a"], &segs), Some("c"));
    assert_eq!(choose_target("k", 10, &["a", "c"], &segs), Some("b"));
    // Only the replica's host has room left.
    assert_eq!(choose_target("k", 10, &["a", "b", "c"], &segs), Some("a2"));
}

#[test]
fn a_target_needs_room_below_the_watermark_and_to_take_replicas() {
    let mut segs = [
        cand("a", "h1:1", 0),
        cand("b", "h2:1", 800),
        cand("c", "h3:1", 0),
    ];
    segs[2].allocatable = false;
    // 800 + 100 would be 90% used.
    assert_eq!(choose_target("k", 100, &["a"], &segs), None);
    assert_eq!(choose_target("k", 40, &["a"], &segs), Some("b"));
    assert_eq!(choose_target("k", 2_000, &[], &segs), None);
}

#[test]
fn ties_break_the_same_way_every_time() {
    let segs = [
        cand("a", "h1:1", 0),
        cand("b", "h2:1", 0),
        cand("c", "h3:1", 0),
    ];
    let first = choose_target("key", 10, &["a"], &segs);
    assert!(first.is_some());
    for _ in 0..5 {
        assert_eq!(choose_target("key", 10, &["a"], &segs), first);
    }
    let reversed = [segs[2].clone(), segs[1].clone(), segs[0].clone()];
    assert_eq!(choose_target("key", 10, &["a"], &reversed), first);
}

// ---- the state machine ------------------------------------------------

fn service(mode: HotKeyMode) -> MasterService {
    let s = MasterService::with_policy(policy()).with_hot_key_policy(hot(mode));
    s.mount_segment(A, &seg("a", 0x10_000, 1 << 20), 0).unwrap();
    s.mount_segment(B, &seg("b", 1 << 40, 1 << 20), 0).unwrap();
    s
}

fn tick_all(s: &MasterService, now: u64) {
    let _ = s.ping(B, now);
    tick(s, now);
}

fn reads(s: &MasterService, key: &str, at: &[u64]) -> Vec<ReplicaDesc> {
    let mut last = Vec::new();
    for &t in at {
        last = s.get_replica_list(key, t).unwrap().replicas;
    }
    last
}

/// Runs B's pending copy tasks as a client would.
fn run_copies(s: &MasterService, now: u64) -> usize {
    let tasks = s.fetch_tasks(B, 10, now);
    for t in &tasks {
        assert_eq!(t.task_type, TaskType::ReplicaCopy);
        let targets: Vec<&str> = t.targets.iter().map(String::as_str).collect();
        s.replica_transfer_start(B, &t.key, "", &targets, now)
            .unwrap();
        s.replica_transfer_end(B, &t.key, now).unwrap();
        s.mark_task_complete(B, t.id, true, "", now).unwrap();
    }
    tasks.len()
}

#[test]
fn enforce_mode_adds_one_replica_on_another_segment() {
    let s = service(HotKeyMode::Enforce);
    put(&s, "k", 100, &on("a"), 0);
    assert_eq!(reads(&s, "k", &[10, 20]).len(), 1);
    tick_all(&s, 30);
    assert_eq!(run_copies(&s, 31), 0, "two reads are below the threshold");
    reads(&s, "k", &[40]);
    tick_all(&s, 50);
    assert_eq!(run_copies(&s, 51), 1);
    let r = reads(&s, "k", &[60]);
    let mut segs: Vec<&str> = r.iter().map(segment_of).collect();
    segs.sort();
    assert_eq!(segs, ["a", "b"]);
    assert_eq!(s.counters().hot_key_fan_outs.load(Ordering::Relaxed), 1);
    // At the cap: however hot, no third replica.
    for w in 1..5u64 {
        reads(&s, "k", &[w * 1_000 + 10, w * 1_000 + 20, w * 1_000 + 30]);
        tick_all(&s, w * 1_000 + 40);
        assert_eq!(run_copies(&s, w * 1_000 + 41), 0);
        assert_eq!(
            s.get_replica_list("k", w * 1_000 + 50)
                .unwrap()
                .replicas
                .len(),
            2
        );
    }
}

#[test]
fn observe_and_off_modes_make_no_replica() {
    for mode in [HotKeyMode::Observe, HotKeyMode::Off] {
        let s = service(mode);
        put(&s, "k", 100, &on("a"), 0);
        reads(&s, "k", &[10, 20, 30, 40]);
        tick_all(&s, 50);
        assert_eq!(run_copies(&s, 51), 0);
        assert_eq!(s.get_replica_list("k", 60).unwrap().replicas.len(), 1);
        let admitted = s.counters().hot_key_admissions.load(Ordering::Relaxed);
        assert_eq!(admitted, u64::from(mode == HotKeyMode::Observe));
    }
}

#[test]
fn a_cap_of_one_replica_suppresses_fan_out() {
    let s = MasterService::with_policy(policy()).with_hot_key_policy(HotKeyPolicy {
        max_memory_replicas: 1,
        ..hot(HotKeyMode::Enforce)
    });
    s.mount_segment(A, &seg("a", 0x10_000, 1 << 20), 0).unwrap();
    s.mount_segment(B, &seg("b", 1 << 40, 1 << 20), 0).unwrap();
    put(&s, "k", 100, &on("a"), 0);
    reads(&s, "k", &[10, 20, 30, 40]);
    tick_all(&s, 50);
    assert_eq!(run_copies(&s, 51), 0);
    assert_eq!(s.counters().hot_key_admissions.load(Ordering::Relaxed), 0);
}

#[test]
fn reads_of_a_fanned_out_key_alternate_between_its_replicas() {
    let s = service(HotKeyMode::Enforce);
    put(&s, "k", 100, &on("a"), 0);
    reads(&s, "k", &[10, 20, 30]);
    tick_all(&s, 40);
    assert_eq!(run_copies(&s, 41), 1);
    let firsts: Vec<String> = (0..4)
        .map(|i| segment_of(&reads(&s, "k", &[50 + i])[0]).to_string())
        .collect();
    assert_ne!(firsts[0], firsts[1]);
    assert_eq!(firsts[0], firsts[2]);
    assert_eq!(firsts[1], firsts[3]);
}

#[test]
fn a_cooled_key_loses_its_extra_replica_and_waits_to_get_another() {
    let s = service(HotKeyMode::Enforce);
    put(&s, "k", 100, &on("a"), 0);
    reads(&s, "k", &[10, 20, 30]);
    tick_all(&s, 40);
    assert_eq!(run_copies(&s, 41), 1);
    let before = used(&s);
    // No read for two windows (the reads' leases are long over).
    tick_all(&s, 2_100);
    let r = s.get_replica_list("k", 2_200).unwrap().replicas;
    assert_eq!(r.len(), 1);
    assert_eq!(
        s.counters()
            .hot_key_replicas_dropped
            .load(Ordering::Relaxed),
        1
    );
    tick_all(&s, 3_000);
    assert!(used(&s) < before, "the dropped replica's space is freed");
    // Hot again at once: no new replica within the recreate cooldown.
    reads(&s, "k", &[3_100, 3_200, 3_300]);
    tick_all(&s, 3_400);
    assert_eq!(run_copies(&s, 3_401), 0);
    let later = 2_100 + RECREATE_COOLDOWN_MS;
    reads(&s, "k", &[later, later + 10, later + 20]);
    tick_all(&s, later + 30);
    assert_eq!(run_copies(&s, later + 31), 1);
}

#[test]
fn a_failed_copy_leaves_nothing_behind() {
    let s = service(HotKeyMode::Enforce);
    put(&s, "k", 100, &on("a"), 0);
    reads(&s, "k", &[10, 20, 30]);
    tick_all(&s, 40);
    let tasks = s.fetch_tasks(B, 10, 41);
    assert_eq!(tasks.len(), 1);
    s.mark_task_complete(B, tasks[0].id, false, "copy failed", 42)
        .unwrap();
    tick_all(&s, 50);
    assert_eq!(s.hot_key_gauges().1, 0);
    assert_eq!(s.get_replica_list("k", 60).unwrap().replicas.len(), 1);
}

#[test]
fn removing_a_hot_key_forgets_its_extras() {
    let s = service(HotKeyMode::Enforce);
    put(&s, "k", 100, &on("a"), 0);
    reads(&s, "k", &[10, 20, 30]);
    tick_all(&s, 40);
    assert_eq!(run_copies(&s, 41), 1);
    assert_eq!(s.hot_key_gauges().1, 1);
    s.remove("k", true, 1_000).unwrap();
    tick_all(&s, 1_010);
    assert_eq!(s.hot_key_gauges().1, 0);
}

#[test]
fn extra_replicas_go_before_any_object_under_memory_pressure() {
    let s = service(HotKeyMode::Enforce);
    put(&s, "k", 100 << 10, &on("a"), 0);
    reads(&s, "k", &[10, 20, 30]);
    tick_all(&s, 40);
    assert_eq!(run_copies(&s, 41), 1);
    // Above the 90% watermark of the two segments only with the extra.
    put(&s, "f1", 800 << 10, &on("a"), 50);
    put(&s, "f2", 860 << 10, &on("b"), 50);
    let _ = s.ping(B, 1_000);
    let r = tick(&s, 1_000);
    assert_eq!(r.evicted_keys, 0);
    assert_eq!(
        s.counters()
            .hot_key_replicas_dropped
            .load(Ordering::Relaxed),
        1
    );
    for key in ["k", "f1", "f2"] {
        assert_eq!(
            s.get_replica_list(key, 1_010).unwrap().replicas.len(),
            1,
            "{key}"
        );
    }
}
