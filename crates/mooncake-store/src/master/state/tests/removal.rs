//! Removal and what protects against it: leases, pins, replica clearing.

use super::*;

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
fn every_metadata_read_but_exist_grants_the_lease() {
    let s = with_segment(1 << 20);
    put(&s, "e", 100, &one(), 0);
    assert!(s.exist_key("e", 10).unwrap());
    // Unlike the reference: a check is not a use (see `leases`).
    s.remove("e", false, 50).unwrap();
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
    let hard = ReplicaPolicy {
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

#[test]
fn replica_clear_needs_an_expired_lease() {
    let s = with_segment(1 << 20);
    s.mount_segment(A, &seg("a2", 1 << 40, 1 << 20), 0).unwrap();
    let two = ReplicaPolicy {
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
