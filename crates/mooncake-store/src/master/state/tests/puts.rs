//! Puts and upserts: the lifecycle, bad input, batches, placement, timeouts.

use super::*;

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
    // A put in flight is no stored value: not OBJECT_ALREADY_EXISTS, which
    // clients report as success.
    assert_eq!(
        code(s.put_start(W, "k", 10, &one(), false, 1)),
        ErrorCode::OBJECT_REPLICA_BUSY
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

/// A put a failover left in flight (its PutStart held, its PutEnd never
/// made) is not a stored value: a retry of it, by the same client or in a
/// batch, must not be told OBJECT_ALREADY_EXISTS, which clients report as
/// a successful put. A complete object still answers OBJECT_ALREADY_EXISTS.
#[test]
fn a_retry_over_a_put_in_flight_is_busy_not_existing() {
    let s = with_segment(1 << 20);
    s.put_start(W, "k", 64, &one(), false, 0).unwrap();
    assert_eq!(
        code(s.put_start(W, "k", 64, &one(), false, 1)),
        ErrorCode::OBJECT_REPLICA_BUSY
    );
    let batch = |keys: Vec<&'static str>, now| {
        let req = Request::BatchPutStart {
            client_id: W,
            value_lens: vec![64; keys.len()],
            keys,
            config: one(),
            upsert: false,
        };
        let Response::BatchReplicas { results } = s.handle(req, now).response else {
            panic!()
        };
        results
            .iter()
            .map(|r| r.as_ref().err().map(|e| e.code))
            .collect::<Vec<_>>()
    };
    // In flight from an earlier call: busy. Repeated within one batch: the
    // first occurrence holds it ("first wins").
    assert_eq!(
        batch(vec!["k", "n", "n"], 2),
        [
            Some(ErrorCode::OBJECT_REPLICA_BUSY),
            None,
            Some(ErrorCode::OBJECT_ALREADY_EXISTS)
        ]
    );
    s.put_end(W, "k", 3).unwrap();
    assert_eq!(
        code(s.put_start(W, "k", 64, &one(), false, 4)),
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
    assert_eq!(
        batch(vec!["k"], 5),
        [Some(ErrorCode::OBJECT_ALREADY_EXISTS)]
    );
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
    let zero = ReplicaPolicy {
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
    match s.handle(req, 0).response {
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
    let Response::BatchReplicas { results } = s.handle(req, 0).response else {
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
    let Response::Units { results } = s
        .handle(
            Request::BatchPutEnd {
                client_id: W,
                keys: vec!["x", "zz"],
            },
            1,
        )
        .response
    else {
        panic!()
    };
    assert!(results[0].is_ok());
    assert_eq!(
        results[1].as_ref().unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    let Response::Bools { results } = s
        .handle(
            Request::BatchExistKey {
                keys: vec!["x", "y"],
            },
            2,
        )
        .response
    else {
        panic!()
    };
    assert_eq!(results, [Ok(true), Ok(false)]);
    let Response::BatchReplicaList { results } = s
        .handle(
            Request::BatchGetReplicaList {
                keys: vec!["x", "y"],
            },
            2,
        )
        .response
    else {
        panic!()
    };
    assert_eq!(results[0].as_ref().unwrap().replicas.len(), 1);
    assert_eq!(
        results[1].as_ref().unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    let Response::Units { results } = s
        .handle(
            Request::BatchRemove {
                keys: vec!["x", "y"],
                force: true,
            },
            3,
        )
        .response
    else {
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
            let cfg = ReplicaPolicy {
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
            &ReplicaPolicy {
                replica_num: 4,
                ..one()
            },
            0,
        );
        assert_eq!(d.len(), 3);
        assert_eq!(s2.get_replica_list("wide", 1).unwrap().replicas.len(), 3);
    }
    // Preferred segment first.
    let cfg = ReplicaPolicy {
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
fn a_new_segment_takes_new_replicas_gradually_with_the_ramp() {
    let mut p = policy();
    p.strategy = AllocationStrategy::FreeRatioFirst;
    let s = MasterService::with_policy(p).with_segment_ramp(4_000);
    s.mount_segment(A, &seg("old", 0, 1 << 20), 0).unwrap();
    for i in 0..50 {
        put(&s, &format!("o{i}"), 8192, &one(), 0);
    }
    s.mount_segment(B, &seg("new", 1 << 40, 1 << 20), 10_000)
        .unwrap();
    // Just mounted: 5% of its (empty) score, less than the old one's.
    for i in 0..10 {
        let d = put(&s, &format!("a{i}"), 8192, &one(), 10_000);
        assert_eq!(segment_of(&d[0]), "old");
    }
    // The ramp over: ranked by free share alone again.
    for i in 0..10 {
        let d = put(&s, &format!("b{i}"), 8192, &one(), 14_000);
        assert_eq!(segment_of(&d[0]), "new");
    }
}

#[test]
fn a_random_pick_spares_a_new_segment_while_it_ramps() {
    let s = with_segment(64 << 20).with_segment_ramp(4_000);
    s.mount_segment(B, &seg("new", 1 << 40, 64 << 20), 10_000)
        .unwrap();
    let on_new = |now: u64, tag: &str| {
        (0..200)
            .filter(|i| segment_of(&put(&s, &format!("{tag}{i}"), 64, &one(), now)[0]) == "new")
            .count()
    };
    // About 2.5% (tried first 5% of the time, then half of those) while it
    // is new, about half once the ramp is over.
    assert!(on_new(10_000, "a") < 50);
    assert!(on_new(14_000, "b") > 50);
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
        ErrorCode::OBJECT_REPLICA_BUSY
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
