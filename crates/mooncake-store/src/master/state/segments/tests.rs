//! The segment table: mounts, placement.

use super::*;

fn seg(name: &str, size: u64) -> SegmentInfo {
    SegmentInfo {
        name: name.into(),
        base: 0x1000_0000,
        size,
        transport_endpoint: format!("{name}:1"),
    }
}

#[test]
fn mount_rules() {
    let t = SegmentTable::default();
    assert!(t.mount(1, &seg("a", 1024)).unwrap().is_some());
    // Same segment again from the same owner: accepted, nothing new.
    assert!(t.mount(1, &seg("a", 1024)).unwrap().is_none());
    assert_eq!(
        t.mount(2, &seg("a", 1024)).unwrap_err().code,
        ErrorCode::SEGMENT_ALREADY_EXISTS
    );
    assert_eq!(
        t.mount(1, &seg("a", 2048)).unwrap_err().code,
        ErrorCode::SEGMENT_ALREADY_EXISTS
    );
    assert_eq!(
        t.mount(1, &seg("", 1024)).unwrap_err().code,
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        t.mount(1, &seg("z", 0)).unwrap_err().code,
        ErrorCode::INVALID_PARAMS
    );
    let mut wrap = seg("w", 16);
    wrap.base = u64::MAX - 4;
    assert_eq!(
        t.mount(1, &wrap).unwrap_err().code,
        ErrorCode::INVALID_PARAMS
    );
    // Another segment over the same bytes of the same endpoint, from
    // any client: refused; the same range elsewhere is another memory.
    let mut over = seg("b", 1024);
    over.transport_endpoint = "a:1".into();
    over.base += 512;
    assert_eq!(
        t.mount(2, &over).unwrap_err().code,
        ErrorCode::SEGMENT_ALREADY_EXISTS
    );
    assert_eq!(
        t.mount(1, &over).unwrap_err().code,
        ErrorCode::SEGMENT_ALREADY_EXISTS
    );
    over.base += 512;
    assert!(
        t.mount(2, &over).unwrap().is_some(),
        "adjacent, not overlapping"
    );
    assert!(t.unmount("b", Some(2)).is_some());
    assert!(
        t.mount(2, &seg("b", 1024)).unwrap().is_some(),
        "another endpoint"
    );
    assert!(t.unmount("b", Some(2)).is_some());
    assert!(t.unmount("a", Some(2)).is_none(), "not the owner");
    let gone = t.unmount("a", Some(1)).unwrap();
    assert!(!gone.is_mounted());
    assert!(t.unmount("a", None).is_none());
    assert!(t.is_empty());
}

#[test]
fn replicas_land_on_distinct_segments() {
    let t = SegmentTable::default();
    for name in ["a", "b", "c"] {
        t.mount(1, &seg(name, 1 << 20)).unwrap();
    }
    for strategy in [
        AllocationStrategy::Random,
        AllocationStrategy::FreeRatioFirst,
    ] {
        for _ in 0..50 {
            let cfg = ReplicaPolicy {
                replica_num: 3,
                ..Default::default()
            };
            let p = t.place(100, &cfg, strategy).unwrap();
            let mut names: Vec<_> = p.iter().map(|p| p.segment.info.name.clone()).collect();
            names.sort();
            assert_eq!(names, ["a", "b", "c"]);
        }
        // More replicas than segments: best effort.
        let cfg = ReplicaPolicy {
            replica_num: 5,
            ..Default::default()
        };
        assert_eq!(t.place(100, &cfg, strategy).unwrap().len(), 3);
    }
}

#[test]
fn preferred_segments_come_first() {
    let t = SegmentTable::default();
    for name in ["a", "b", "c", "d"] {
        t.mount(1, &seg(name, 1 << 20)).unwrap();
    }
    let cfg = ReplicaPolicy {
        replica_num: 2,
        preferred_segment: "c".into(),
        preferred_segments: vec!["c".into(), "missing".into(), "a".into()],
        ..Default::default()
    };
    let p = t.place(10, &cfg, AllocationStrategy::Random).unwrap();
    let names: Vec<_> = p.iter().map(|p| p.segment.info.name.as_str()).collect();
    assert_eq!(names, ["c", "a"]);
}

#[test]
fn free_ratio_first_prefers_empty_segments() {
    let t = SegmentTable::default();
    let full = t.mount(1, &seg("full", 1000)).unwrap().unwrap();
    t.mount(1, &seg("empty", 1000)).unwrap();
    full.allocate(800).unwrap();
    for _ in 0..20 {
        let cfg = ReplicaPolicy::default();
        let p = t
            .place(8, &cfg, AllocationStrategy::FreeRatioFirst)
            .unwrap();
        assert_eq!(p[0].segment.info.name, "empty");
        p[0].segment.free(p[0].offset, 8);
    }
}

#[test]
fn errors() {
    let t = SegmentTable::default();
    let cfg = ReplicaPolicy::default();
    assert_eq!(
        t.place(8, &cfg, AllocationStrategy::Random)
            .unwrap_err()
            .code,
        ErrorCode::SEGMENT_NOT_FOUND
    );
    t.mount(1, &seg("a", 1024)).unwrap();
    assert_eq!(
        t.place(4096, &cfg, AllocationStrategy::Random)
            .unwrap_err()
            .code,
        ErrorCode::NO_AVAILABLE_HANDLE
    );
}
