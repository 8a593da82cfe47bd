//! Segments and clients: mount, unmount, expiry and what they take along.

use super::*;

#[test]
fn expired_clients_lose_segments_and_objects() {
    let s = with_segment(1 << 20);
    s.mount_segment(B, &seg("b", 1 << 40, 1 << 20), 0).unwrap();
    let on_b = on("b");
    let both = ReplicaPolicy {
        replica_num: 2,
        ..one()
    };
    put(&s, "only-b", 100, &on_b, 0);
    put(&s, "both", 100, &both, 0);
    put(&s, "only-a", 100, &on("a"), 0);
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
fn unmounting_a_segment_drops_its_replicas() {
    let s = with_segment(1 << 20);
    s.mount_segment(A, &seg("a2", 1 << 40, 1 << 20), 0).unwrap();
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

#[test]
fn reads_skip_a_suspected_owners_replicas_while_another_is_served() {
    for suspect_after in [200, 0] {
        let s = two_owners().with_suspect_after(suspect_after);
        let both = ReplicaPolicy {
            replica_num: 2,
            ..one()
        };
        put(&s, "k", 100, &both, 0);
        put(&s, "solo", 100, &on("a"), 0);
        let segments = |key: &str, now| -> Vec<String> {
            let r = s.get_replica_list(key, now).unwrap();
            let mut v: Vec<String> = r
                .replicas
                .iter()
                .map(|d| segment_of(d).to_owned())
                .collect();
            v.sort();
            v
        };
        // Whether each listed replica is marked Suspected for its readers.
        let marked = |key: &str, now| -> Vec<bool> {
            let r = s.get_replica_list(key, now).unwrap();
            r.replicas
                .iter()
                .map(|d| d.memory().unwrap().suspected)
                .collect()
        };
        // B keeps its heartbeats; A misses them for 300 ms of a 500 ms TTL.
        s.ping(B, 250).unwrap();
        s.tick(300);
        if suspect_after == 0 {
            assert_eq!(
                segments("k", 300),
                ["a", "b"],
                "off: A is alive until it expires"
            );
            continue;
        }
        assert_eq!(segments("k", 300), ["b"], "A is Suspected");
        assert_eq!(
            segments("solo", 300),
            ["a"],
            "no other replica: A's is read"
        );
        assert_eq!(marked("solo", 300), [true], "read with a short deadline");
        assert_eq!(marked("k", 300), [false]);
        // A heartbeat ends the suspicion at once.
        s.ping(A, 310).unwrap();
        assert_eq!(segments("k", 310), ["a", "b"]);
        assert_eq!(marked("k", 310), [false, false]);
        assert_eq!(marked("solo", 310), [false]);
        // Silent again until the TTL: Suspected, then Offline and dropped.
        s.ping(B, 600).unwrap();
        s.tick(600);
        assert_eq!(segments("k", 600), ["b"]);
        s.ping(B, 800).unwrap();
        assert_eq!(s.tick(810).expired_clients, 1);
        assert_eq!(segments("k", 810), ["b"]);
        assert_eq!(
            code(s.get_replica_list("solo", 810)),
            ErrorCode::OBJECT_NOT_FOUND
        );
    }
}
