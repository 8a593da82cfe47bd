//! The SSD tiers: lossless eviction, copies, disk-only objects, takeover.

use super::*;
use crate::master::config::policy::OffloadPolicy;
use crate::types::ReplicaKind;

fn offloading(on_evict: bool) -> MasterService {
    let s = MasterService::with_policy(policy()).with_offload_policy(OffloadPolicy {
        enabled: true,
        on_evict,
        ..OffloadPolicy::default()
    });
    s.mount_segment(A, &seg("a", 0x10_000, 16 * 1024), 0)
        .unwrap();
    s.mount_local_disk(A, "dir-a", "a-host:9", 1 << 30, 0)
        .unwrap();
    s
}

/// A's tier writes whatever it was asked to.
fn drain(s: &MasterService, now: u64) -> usize {
    let batch = s.fetch_offload_tasks(A, 1000, now).unwrap();
    let keys: Vec<&str> = batch.tasks.iter().map(|t| t.key.as_str()).collect();
    let sizes: Vec<u64> = batch.tasks.iter().map(|t| t.size).collect();
    for r in s.notify_offload(A, &keys, &sizes, false, now) {
        r.unwrap();
    }
    keys.len()
}

fn is_local_disk(r: &ReplicaDesc) -> bool {
    matches!(r.kind, ReplicaKind::LocalDisk(_))
}

#[test]
fn memory_keeps_objects_until_their_copy_is_durable() {
    let s = offloading(false);
    for i in 0..16 {
        put(&s, &format!("k{i}"), 1024, &one(), i);
    }
    // Full of objects without a copy: back-pressure, nothing evicted.
    let full = s.put_start(W, "k16", 1024, &one(), false, 100);
    assert_eq!(full.unwrap_err().code, ErrorCode::NO_AVAILABLE_HANDLE);
    for i in 0..16 {
        assert!(s.exist_key(&format!("k{i}"), 200).unwrap());
    }
    // The copies land; now eviction may take them, and they stay readable.
    assert_eq!(drain(&s, 300), 16);
    put(&s, "k16", 1024, &one(), 400);
    let mut disk_only = 0;
    for i in 0..17 {
        let key = format!("k{i}");
        let reps = s.get_replica_list(&key, 500).unwrap().replicas;
        if reps.iter().all(is_local_disk) {
            disk_only += 1;
            assert_eq!(s.get_size(&key, 500).unwrap(), 1024);
        }
    }
    assert!(disk_only > 0);
}

/// A copy leases its object only while it is written: once reported (or
/// failed), the object is evictable at once, not a lease later, so a full
/// memory drains at the tier's speed.
#[test]
fn a_reported_copy_gives_its_lease_back() {
    let s = offloading(false);
    for i in 0..16 {
        put(&s, &format!("k{i}"), 1024, &one(), i);
    }
    let batch = s.fetch_offload_tasks(A, 1000, 100).unwrap();
    assert_eq!(batch.tasks.len(), 16);
    // While the copies are written, the objects are leased.
    let busy = s.remove("k0", false, 101);
    assert_eq!(busy.unwrap_err().code, ErrorCode::OBJECT_HAS_LEASE);
    // k1 is read meanwhile: its reader's lease outlives the copy's.
    s.get_replica_list("k1", 102).unwrap();
    let keys: Vec<&str> = batch.tasks.iter().map(|t| t.key.as_str()).collect();
    let sizes: Vec<u64> = batch.tasks.iter().map(|t| t.size).collect();
    let (failed, written) = keys.split_at(1);
    s.notify_offload_failure(A, failed).unwrap();
    for r in s.notify_offload(A, written, &sizes[1..], false, 103) {
        r.unwrap();
    }
    // Well inside the lease TTL: the copied objects make room for a put.
    put(&s, "k16", 1024, &one(), 104);
    assert!(s.exist_key("k16", 104).unwrap());
    assert!(
        s.get_replica_list("k1", 105)
            .unwrap()
            .replicas
            .iter()
            .any(|r| !is_local_disk(r)),
        "the object a reader leased stays in memory"
    );
    // The failed copy's object is unleased and still in memory, no copy.
    s.remove("k0", false, 106).unwrap();
}

#[test]
fn in_evict_mode_eviction_queues_the_copies() {
    let s = offloading(true);
    for i in 0..16 {
        put(&s, &format!("k{i}"), 1024, &one(), i);
    }
    assert_eq!(drain(&s, 50), 0, "nothing is queued at PutEnd");
    tick(&s, 1000);
    assert!(
        drain(&s, 1000) > 0,
        "the round queued what it could not evict"
    );
}

/// Copies go out rounds ahead (`eviction::COPY_ROUNDS_AHEAD`), oldest
/// first, so the tier writes on while a round's copies land.
#[test]
fn in_evict_mode_copies_go_out_rounds_ahead_oldest_first() {
    let s = offloading(true);
    for i in 0..16 {
        put(&s, &format!("k{i}"), 1024, &one(), i);
    }
    // Full: the round (down to 70% of 16 KiB) needs 5 objects out; three
    // rounds' worth of copies are queued.
    tick(&s, 1000);
    let batch = s.fetch_offload_tasks(A, 1000, 1000).unwrap();
    let mut keys: Vec<&str> = batch.tasks.iter().map(|t| t.key.as_str()).collect();
    keys.sort_by_key(|k| k[1..].parse::<u32>().unwrap());
    let oldest: Vec<String> = (0..15).map(|i| format!("k{i}")).collect();
    assert_eq!(keys, oldest, "the oldest, and only them");
    // Each task says how long its object sat unused in memory.
    let k0 = batch.tasks.iter().find(|t| t.key == "k0").unwrap();
    assert_eq!(k0.idle_ms, 1000);
    // Copies under way count: the next round queues nothing more, and
    // evicts nothing before a copy lands.
    tick(&s, 1100);
    assert!(s
        .fetch_offload_tasks(A, 1000, 1100)
        .unwrap()
        .tasks
        .is_empty());
    for i in 0..16 {
        let reps = s.get_replica_list(&format!("k{i}"), 1150).unwrap().replicas;
        assert!(!reps.iter().any(is_local_disk), "k{i} has no copy yet");
        assert!(!reps.is_empty(), "k{i} is still in memory");
    }
    let sizes = vec![1024; keys.len()];
    for r in s.notify_offload(A, &keys, &sizes, false, 1200) {
        r.unwrap();
    }
    // Landed copies go first, a round's worth; the rest stay in memory.
    tick(&s, 1300);
    let gone = (0..16)
        .filter(|i| {
            let reps = s.get_replica_list(&format!("k{i}"), 1400).unwrap().replicas;
            reps.iter().all(is_local_disk)
        })
        .count();
    assert_eq!(gone, 5);
    let reps = s.get_replica_list("k15", 1400).unwrap().replicas;
    assert!(!reps.iter().any(is_local_disk), "k15 was never copied");
}

/// Memory is one LRU: an object read since its copy landed (as a
/// promoted one is) is newer than the objects still waiting for a copy;
/// those are queued and the read one stays, copy or not.
#[test]
fn in_evict_mode_eviction_goes_in_lease_order_whatever_has_a_copy() {
    let s = offloading(true);
    for i in 0..16 {
        put(&s, &format!("k{i}"), 1024, &one(), i);
    }
    tick(&s, 1000);
    assert_eq!(drain(&s, 1000), 15, "k0..k14 copied");
    // All five are read: the newest objects now, with a copy each.
    for i in 0..5 {
        s.get_replica_list(&format!("k{i}"), 1200).unwrap();
    }
    tick(&s, 1200 + LEASE);
    let batch = s.fetch_offload_tasks(A, 1000, 1400).unwrap();
    let keys: Vec<&str> = batch.tasks.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys, ["k15"], "the oldest are queued");
    for i in 0..5 {
        let reps = s.get_replica_list(&format!("k{i}"), 1400).unwrap().replicas;
        assert!(
            !reps.iter().all(is_local_disk),
            "k{i} was read: it stays in memory"
        );
    }
}

#[test]
fn stale_copies_are_refused_and_replaced_objects_drop_theirs() {
    let s = offloading(false);
    put(&s, "k", 1024, &one(), 0);
    let batch = s.fetch_offload_tasks(A, 10, 1).unwrap();
    assert_eq!(batch.tasks.len(), 1);
    // A copy of another size is not this object.
    assert!(s.notify_offload(A, &["k"], &[999], false, 2)[0].is_err());
    assert!(s.notify_offload(A, &["k"], &[1024], false, 3)[0].is_ok());
    // An upsert makes the copy stale: the tier is told to delete it.
    s.put_start(W, "k", 2048, &one(), true, 200).unwrap();
    s.put_end(W, "k", 200).unwrap();
    let reps = s.get_replica_list("k", 300).unwrap().replicas;
    assert!(!reps.iter().any(is_local_disk));
    let batch = s.fetch_offload_tasks(A, 10, 300).unwrap();
    assert_eq!(batch.removes, ["k"]);
    assert_eq!(batch.tasks.len(), 1, "the new version is queued");
}

#[test]
fn restored_copies_become_disk_only_objects_and_a_takeover_keeps_them() {
    let s = offloading(false);
    assert!(s.notify_offload(A, &["old"], &[10], true, 0)[0].is_ok());
    let reps = s.get_replica_list("old", 1).unwrap().replicas;
    assert_eq!(reps.len(), 1);
    assert!(is_local_disk(&reps[0]));
    assert_eq!(
        s.put_start(W, "old", 10, &one(), false, 2)
            .unwrap_err()
            .code,
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
    // A new process on the same directory: the copies are its own at once,
    // and the old process is gone.
    s.mount_local_disk(B, "dir-a", "b-host:9", 1 << 30, 3)
        .unwrap();
    let reps = s.get_replica_list("old", 4).unwrap().replicas;
    match &reps[0].kind {
        ReplicaKind::LocalDisk(d) => {
            assert_eq!(d.client_id, B);
            assert_eq!(d.transport_endpoint, "b-host:9");
        }
        other => panic!("{other:?}"),
    }
    assert!(s.segment_summaries().is_empty(), "A's segment went with it");
    // Removing a disk-only object tells its tier.
    s.remove("old", false, 5).unwrap();
    assert!(!s.exist_key("old", 6).unwrap());
    assert_eq!(s.fetch_offload_tasks(B, 1, 7).unwrap().removes, ["old"]);
    assert_eq!(
        s.evict_disk_replicas(B, &["old"], 8)[0]
            .as_ref()
            .unwrap_err()
            .code,
        ErrorCode::OBJECT_NOT_FOUND
    );
}

#[test]
fn tiers_need_offload_enabled() {
    let s = with_segment(1 << 20);
    assert_eq!(
        s.mount_local_disk(A, "d", "h:1", 1, 0).unwrap_err().code,
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
    );
}

#[test]
fn a_disk_only_object_read_often_is_promoted() {
    let s = MasterService::with_policy(policy()).with_offload_policy(OffloadPolicy {
        enabled: true,
        promote_on_hit: true,
        promote_after: 2,
        ..OffloadPolicy::default()
    });
    s.mount_segment(A, &seg("a", 0x10_000, 16 * 1024), 0)
        .unwrap();
    s.mount_local_disk(A, "dir-a", "a-host:9", 1 << 30, 0)
        .unwrap();
    assert!(s.notify_offload(A, &["p"], &[1024], true, 0)[0].is_ok());
    s.get_replica_list("p", 1).unwrap();
    assert!(s
        .fetch_offload_tasks(A, 10, 2)
        .unwrap()
        .promotions
        .is_empty());
    s.get_replica_list("p", 3).unwrap();
    assert_eq!(s.fetch_offload_tasks(A, 10, 4).unwrap().promotions, ["p"]);
    // Only the copy's owner promotes.
    assert!(s.promotion_start(B, "p", 5).is_err());
    let descs = s.promotion_start(A, "p", 5).unwrap();
    assert_eq!(descs.len(), 1);
    assert_eq!(descs[0].memory().unwrap().segment_name, "a");
    s.put_end(A, "p", 6).unwrap();
    let reps = s.get_replica_list("p", 7).unwrap().replicas;
    assert!(matches!(reps[0].kind, ReplicaKind::Memory(_)));
    assert!(reps.iter().any(is_local_disk), "the copy stays");
    // In memory with its copy: eviction may take it again at once.
    assert!(s.fetch_offload_tasks(A, 10, 8).unwrap().tasks.is_empty());
}

/// The reads that asked for a promotion leased the object: its memory
/// replica keeps that lease (from the promotion's start), so it is not the
/// first object an eviction round takes again.
#[test]
fn a_promoted_object_keeps_the_lease_of_its_reads() {
    let s = promoting();
    assert!(s.notify_offload(A, &["p"], &[1024], true, 0)[0].is_ok());
    s.get_replica_list("p", 1).unwrap();
    assert_eq!(s.fetch_offload_tasks(A, 10, 2).unwrap().promotions, ["p"]);
    s.promotion_start(A, "p", 5).unwrap();
    s.put_end(A, "p", 6).unwrap();
    let leased = s.remove("p", false, 5 + LEASE - 1);
    assert_eq!(leased.unwrap_err().code, ErrorCode::OBJECT_HAS_LEASE);
    s.remove("p", false, 5 + LEASE).unwrap();
}

fn promoting() -> MasterService {
    let s = MasterService::with_policy(policy()).with_offload_policy(OffloadPolicy {
        enabled: true,
        promote_on_hit: true,
        promote_after: 1,
        ..OffloadPolicy::default()
    });
    s.mount_segment(A, &seg("a", 0x10_000, 16 * 1024), 0)
        .unwrap();
    s.mount_local_disk(A, "dir-a", "a-host:9", 1 << 30, 0)
        .unwrap();
    s
}

/// As the reference: no promotion into memory at the eviction watermark
/// (0.9 here), where it would only add to what eviction must free. A
/// promotion that finds memory there when it starts waits for a retry.
#[test]
fn promotions_stop_at_the_eviction_watermark() {
    let s = promoting();
    for i in 0..14 {
        put(&s, &format!("m{i}"), 1024, &one(), i);
    }
    let keys = ["p0", "p1", "p2"];
    assert!(s
        .notify_offload(A, &keys, &[1024; 3], true, 20)
        .iter()
        .all(Result::is_ok));
    for k in keys {
        s.get_replica_list(k, 21).unwrap();
    }
    let queued = s.fetch_offload_tasks(A, 10, 22).unwrap().promotions;
    assert_eq!(queued, ["p0"], "one promotion per round");
    // 14 of 16 KiB used, under 14.4: p0 starts; then memory is there.
    s.promotion_start(A, "p0", 23).unwrap();
    s.put_end(A, "p0", 24).unwrap();
    let paced = s.fetch_offload_tasks(A, 10, 25).unwrap().promotions;
    assert!(paced.is_empty(), "the next round is 10 s after the first");
    let round = |n: u64| 22 + n * 10_000;
    assert_eq!(
        s.fetch_offload_tasks(A, 10, round(1)).unwrap().promotions,
        ["p1"]
    );
    let e = s.promotion_start(A, "p1", round(1) + 1).unwrap_err();
    assert_eq!(e.code, ErrorCode::NO_AVAILABLE_HANDLE);
    let watermark = || {
        s.counters()
            .promotion_rejected_watermark
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    assert_eq!(watermark(), 1);
    // A read at the watermark queues nothing.
    s.get_replica_list("p1", round(1) + 2).unwrap();
    assert_eq!(watermark(), 2);
    assert_eq!(
        s.fetch_offload_tasks(A, 10, round(2)).unwrap().promotions,
        ["p2"]
    );
    assert!(s
        .fetch_offload_tasks(A, 10, round(3))
        .unwrap()
        .promotions
        .is_empty());
}

/// Until its round comes, a queued promotion waits and the object is
/// read from its disk copy.
#[test]
fn queued_promotions_wait_for_their_round_and_read_from_the_copy() {
    let s = promoting();
    let keys = ["p0", "p1"];
    assert!(s
        .notify_offload(A, &keys, &[1024; 2], true, 0)
        .iter()
        .all(Result::is_ok));
    for k in keys {
        s.get_replica_list(k, 1).unwrap();
    }
    assert_eq!(s.fetch_offload_tasks(A, 10, 2).unwrap().promotions, ["p0"]);
    for now in [3, 5_000, 10_001] {
        let batch = s.fetch_offload_tasks(A, 10, now).unwrap();
        assert!(batch.promotions.is_empty(), "polled at {now}");
        let reps = s.get_replica_list("p1", now).unwrap().replicas;
        assert_eq!(reps.len(), 1);
        assert!(is_local_disk(&reps[0]));
    }
    assert_eq!(
        s.promotions_queued(),
        2,
        "p0 handed out, not started; p1 waiting"
    );
    let next = s.fetch_offload_tasks(A, 10, 10_002).unwrap().promotions;
    assert_eq!(next, ["p1"]);
}

/// A tier that polls with its own heartbeat (1 s) gets its promotions
/// once per that round; a poll without one gets the default 10 s.
#[test]
fn a_tier_polling_with_its_heartbeat_is_paced_by_it() {
    let s = promoting();
    let keys = ["p0", "p1", "p2", "p3", "p4"];
    assert!(s
        .notify_offload(A, &keys, &[1024; 5], true, 0)
        .iter()
        .all(Result::is_ok));
    for k in keys {
        s.get_replica_list(k, 1).unwrap();
    }
    let take = |round_ms: u64, now: u64| {
        let req = Request::FetchOffloadTasks {
            client_id: A,
            max: 10,
            promote_round_ms: round_ms,
        };
        match s.handle(req, now).response {
            Response::Offload { result } => result.unwrap().promotions,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(take(1_000, 2), ["p0"]);
    assert!(take(1_000, 1_001).is_empty(), "within its 1 s round");
    assert_eq!(take(1_000, 1_002), ["p1"], "its own round, not 10 s");
    assert_eq!(take(1_000, 2_002), ["p2"]);
    assert_eq!(take(0, 3_002), ["p3"]);
    assert!(take(0, 4_002).is_empty(), "the default 10 s from p3");
    assert_eq!(take(0, 13_002), ["p4"]);
}

#[test]
fn an_unmounted_tier_takes_its_copies_and_work_with_it() {
    let s = promoting();
    put(&s, "mem", 1024, &one(), 1);
    assert_eq!(drain(&s, 2), 1);
    assert!(s.notify_offload(A, &["disk"], &[1024], true, 2)[0].is_ok());
    assert!(s
        .get_replica_list("mem", 2)
        .unwrap()
        .replicas
        .iter()
        .any(is_local_disk));
    s.get_replica_list("disk", 3).unwrap();
    s.unmount_local_disk(A).unwrap();
    // The disk-only object is gone; the other keeps its memory replica.
    let e = s.get_replica_list("disk", 4).unwrap_err();
    assert_eq!(e.code, ErrorCode::OBJECT_NOT_FOUND);
    let reps = s.get_replica_list("mem", 5).unwrap().replicas;
    assert!(!reps.iter().any(is_local_disk));
    assert_eq!(s.promotions_queued(), 0);
    // No more work: the owner's polls say its tier is unknown.
    let e = s.fetch_offload_tasks(A, 10, 6).unwrap_err();
    assert_eq!(e.code, ErrorCode::SEGMENT_NOT_FOUND);
    let e = s
        .notify_offload(A, &["mem"], &[1024], false, 7)
        .remove(0)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::SEGMENT_NOT_FOUND);
    // Done already: a second call, or one from a client without a tier.
    s.unmount_local_disk(A).unwrap();
    s.unmount_local_disk(B).unwrap();
}

#[test]
fn unmounting_a_tier_needs_offload_enabled() {
    let s = with_segment(1 << 20);
    let e = s.unmount_local_disk(A).unwrap_err();
    assert_eq!(e.code, ErrorCode::UNABLE_OFFLOAD);
}

/// While its promotion is under way the object stays readable from its
/// copy, as the reference's disk replica does.
#[test]
fn a_promotion_under_way_reads_from_the_copy() {
    let s = promoting();
    assert!(s.notify_offload(A, &["p"], &[1024], true, 0)[0].is_ok());
    s.get_replica_list("p", 1).unwrap();
    assert_eq!(s.fetch_offload_tasks(A, 10, 2).unwrap().promotions, ["p"]);
    s.promotion_start(A, "p", 3).unwrap();
    let reps = s.get_replica_list("p", 4).unwrap().replicas;
    assert_eq!(reps.len(), 1);
    assert!(is_local_disk(&reps[0]));
    assert!(s.exist_key("p", 4).unwrap());
    assert_eq!(s.get_size("p", 4).unwrap(), 1024);
    assert!(is_local_disk(&s.query_key("p").unwrap()[0]));
    // Such a read does not queue the promotion again.
    assert!(s
        .fetch_offload_tasks(A, 10, 5)
        .unwrap()
        .promotions
        .is_empty());
    s.put_revoke(A, "p", 6).unwrap();
    assert!(s
        .get_replica_list("p", 7)
        .unwrap()
        .replicas
        .iter()
        .all(is_local_disk));
}

/// A read that memory had no room to promote for is retried on the tick
/// once there is room (10 ms later, then backing off), as the reference's
/// promotion candidates are.
#[test]
fn a_promotion_memory_had_no_room_for_is_retried_when_it_has() {
    let s = promoting();
    for i in 0..15 {
        put(&s, &format!("m{i}"), 1024, &one(), i);
    }
    // 15 of 16 KiB: at the watermark. Their copies are not written: eviction cannot make room.
    assert!(s.notify_offload(A, &["p"], &[1024], true, 20)[0].is_ok());
    s.get_replica_list("p", 20).unwrap();
    assert!(s
        .fetch_offload_tasks(A, 10, 20)
        .unwrap()
        .promotions
        .is_empty());
    // Still at the watermark: backed off until 31.
    s.tick(21);
    assert!(s
        .fetch_offload_tasks(A, 10, 21)
        .unwrap()
        .promotions
        .is_empty());
    s.remove("m0", true, 22).unwrap();
    s.remove("m1", true, 22).unwrap();
    s.tick(30);
    assert!(s
        .fetch_offload_tasks(A, 10, 30)
        .unwrap()
        .promotions
        .is_empty());
    s.tick(31);
    assert_eq!(s.fetch_offload_tasks(A, 10, 31).unwrap().promotions, ["p"]);
    s.promotion_start(A, "p", 32).unwrap();
    s.put_end(A, "p", 33).unwrap();
    let reps = s.get_replica_list("p", 34).unwrap().replicas;
    assert!(matches!(reps[0].kind, ReplicaKind::Memory(_)));
}
