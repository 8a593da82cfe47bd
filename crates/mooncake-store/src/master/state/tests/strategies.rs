//! The allocation strategies that look beyond the segment itself:
//! `ssd_free_ratio_first` (its owner's SSD tier) and `local_first` (the
//! writer's host).

use super::*;
use crate::master::config::policy::OffloadPolicy;

const C: ClientId = 4;

fn with_strategy(strategy: AllocationStrategy) -> MasterService {
    let mut p = policy();
    p.strategy = strategy;
    MasterService::with_policy(p).with_offload_policy(OffloadPolicy {
        enabled: true,
        ..OffloadPolicy::default()
    })
}

fn segment(d: &ReplicaDesc) -> String {
    d.memory().unwrap().segment_name.clone()
}

#[test]
fn ssd_free_ratio_first_prefers_the_emptiest_tier() {
    let s = with_strategy(AllocationStrategy::SsdFreeRatioFirst);
    s.mount_segment(A, &seg("a:1", 0, 1 << 20), 0).unwrap();
    s.mount_segment(B, &seg("b:1", 1 << 40, 1 << 20), 0)
        .unwrap();
    s.mount_local_disk(A, "dir-a", "a:9", 1000, 0).unwrap();
    s.mount_local_disk(B, "dir-b", "b:9", 1000, 0).unwrap();
    // A's tier is 90% full, B's empty: memory goes to B's segment.
    assert!(s.notify_offload(A, &["old"], &[900], true, 0)[0].is_ok());
    for i in 0..20 {
        assert_eq!(
            segment(&put(&s, &format!("k{i}"), 4096, &one(), 1)[0]),
            "b:1"
        );
    }
    // Now B's is fuller: A's segment is chosen.
    assert!(s.notify_offload(B, &["older"], &[950], true, 2)[0].is_ok());
    for i in 0..20 {
        assert_eq!(
            segment(&put(&s, &format!("j{i}"), 4096, &one(), 3)[0]),
            "a:1"
        );
    }
    // Two replicas: both segments, the emptier tier's first.
    let two = ReplicaPolicy {
        replica_num: 2,
        ..one()
    };
    let got: Vec<String> = put(&s, "two", 4096, &two, 4).iter().map(segment).collect();
    assert_eq!(got, ["a:1", "b:1"]);
}

#[test]
fn ssd_free_ratio_first_counts_an_owner_without_a_tier_as_empty() {
    let s = with_strategy(AllocationStrategy::SsdFreeRatioFirst);
    s.mount_segment(A, &seg("a:1", 0, 1 << 20), 0).unwrap();
    s.mount_segment(B, &seg("b:1", 1 << 40, 1 << 20), 0)
        .unwrap();
    s.mount_local_disk(A, "dir-a", "a:9", 1000, 0).unwrap();
    assert!(s.notify_offload(A, &["old"], &[1], true, 0)[0].is_ok());
    for i in 0..20 {
        assert_eq!(
            segment(&put(&s, &format!("k{i}"), 4096, &one(), 1)[0]),
            "b:1"
        );
    }
}

fn two_hosts() -> MasterService {
    let s = with_strategy(AllocationStrategy::LocalFirst);
    s.mount_segment(A, &seg("10.0.0.1:1", 0, 64 * 1024), 0)
        .unwrap();
    s.mount_segment(A, &seg("10.0.0.1:2", 1 << 30, 64 * 1024), 0)
        .unwrap();
    s.mount_segment(B, &seg("10.0.0.2:1", 1 << 40, 1 << 20), 0)
        .unwrap();
    s
}

#[test]
fn local_first_places_a_writers_puts_on_its_host() {
    let s = two_hosts();
    let mut on_a = std::collections::HashSet::new();
    for i in 0..20 {
        let seg = segment(
            &s.put_start(A, &format!("a{i}"), 1024, &one(), false, 1)
                .unwrap()[0],
        );
        assert!(seg.starts_with("10.0.0.1:"), "{seg}");
        on_a.insert(seg);
        s.put_end(A, &format!("a{i}"), 1).unwrap();
    }
    assert_eq!(on_a.len(), 2, "keys spread over the host's segments");
    for i in 0..20 {
        let seg = segment(
            &s.put_start(B, &format!("b{i}"), 1024, &one(), false, 1)
                .unwrap()[0],
        );
        assert_eq!(seg, "10.0.0.2:1");
        s.put_end(B, &format!("b{i}"), 1).unwrap();
    }
}

#[test]
fn local_first_falls_back_to_the_other_hosts_when_its_own_is_full() {
    let s = two_hosts();
    // 128 KiB on A's host: the rest of A's puts go to B's host.
    let mut remote = 0;
    for i in 0..40 {
        let seg = segment(
            &s.put_start(A, &format!("a{i}"), 8192, &one(), false, 1)
                .unwrap()[0],
        );
        if seg == "10.0.0.2:1" {
            remote += 1;
        }
        s.put_end(A, &format!("a{i}"), 1).unwrap();
    }
    assert!(remote >= 40 - 16, "{remote} put on the other host");
}

#[test]
fn local_first_leaves_multi_replica_puts_and_hostless_writers_to_random() {
    let s = two_hosts();
    s.mount_segment(C, &seg("127.0.0.1:7", 1 << 50, 1 << 20), 0)
        .unwrap();
    let mut seen = std::collections::HashSet::new();
    for i in 0..60 {
        let key = format!("c{i}");
        seen.insert(segment(
            &s.put_start(C, &key, 1024, &one(), false, 1).unwrap()[0],
        ));
        s.put_end(C, &key, 1).unwrap();
        let key = format!("w{i}");
        seen.insert(segment(
            &s.put_start(W, &key, 1024, &one(), false, 1).unwrap()[0],
        ));
        s.put_end(W, &key, 1).unwrap();
    }
    assert!(seen.len() >= 3, "placed at random: {seen:?}");
    let three = ReplicaPolicy {
        replica_num: 3,
        ..one()
    };
    assert_eq!(
        s.put_start(A, "three", 1024, &three, false, 2)
            .unwrap()
            .len(),
        3
    );
}

// `prefer_alloc_in_same_node` asks for the host-first order for one put
// under any strategy (the reference's "host-aware local-first allocation for
// this request").
#[test]
fn prefer_alloc_in_same_node_puts_on_the_writers_host_under_any_strategy() {
    let s = with_strategy(AllocationStrategy::Random);
    s.mount_segment(A, &seg("10.0.0.1:1", 0, 1 << 20), 0)
        .unwrap();
    s.mount_segment(B, &seg("10.0.0.2:1", 1 << 40, 1 << 20), 0)
        .unwrap();
    let same = ReplicaPolicy {
        prefer_alloc_in_same_node: true,
        ..one()
    };
    let mut elsewhere = 0;
    for i in 0..30 {
        let key = format!("p{i}");
        let got = segment(&s.put_start(A, &key, 1024, &same, false, 1).unwrap()[0]);
        assert_eq!(got, "10.0.0.1:1");
        s.put_end(A, &key, 1).unwrap();
        let key = format!("r{i}");
        if segment(&s.put_start(A, &key, 1024, &one(), false, 1).unwrap()[0]) != "10.0.0.1:1" {
            elsewhere += 1;
        }
        s.put_end(A, &key, 1).unwrap();
    }
    assert!(
        elsewhere > 0,
        "without the flag, random placement uses both hosts"
    );
}
