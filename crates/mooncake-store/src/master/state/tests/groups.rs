//! Object groups: one group per key of a call, membership for life, leases
//! and eviction by whole groups, kept by the log and the image.

use super::*;
use crate::master::state::service::tests::{assert_same, Mirror};

fn grouped(groups: &[&str]) -> ReplicaPolicy {
    ReplicaPolicy {
        group_ids: Some(groups.iter().map(|g| g.to_string()).collect()),
        ..one()
    }
}

fn batch(s: &MasterService, keys: Vec<&str>, cfg: ReplicaPolicy, upsert: bool) -> Vec<ErrorCode> {
    let req = Request::BatchPutStart {
        client_id: W,
        value_lens: vec![64; keys.len()],
        keys: keys.clone(),
        config: cfg,
        upsert,
    };
    let Response::BatchReplicas { results } = s.handle(req, 0).response else {
        panic!("not a batch answer")
    };
    let codes: Vec<ErrorCode> = results
        .iter()
        .map(|r| r.as_ref().err().map_or(ErrorCode::OK, |e| e.code))
        .collect();
    for (k, c) in keys.iter().zip(&codes) {
        if *c == ErrorCode::OK {
            s.put_end(W, k, 0).unwrap();
        }
    }
    codes
}

#[test]
fn a_call_names_one_group_per_key() {
    let s = with_segment(1 << 20);
    let bad = ErrorCode::INVALID_PARAMS;
    assert_eq!(
        batch(&s, vec!["a", "b"], grouped(&["g"]), false),
        [bad, bad]
    );
    assert_eq!(
        code(s.put_start(W, "a", 64, &grouped(&["g", "g"]), false, 0)),
        bad
    );
    assert_eq!(code(s.put_start(W, "a", 64, &grouped(&[]), false, 0)), bad);
    assert_eq!(
        code(s.put_start(W, "a", 64, &grouped(&["g\0h"]), false, 0)),
        bad
    );
    assert!(!s.exist_key("a", 0).unwrap());
    let ok = ErrorCode::OK;
    assert_eq!(
        batch(&s, vec!["a", "b", "c"], grouped(&["g", "", "g"]), false),
        [ok; 3]
    );
    let groups = s.objects_table().groups.export();
    assert_eq!(groups.len(), 1);
    assert_eq!(&*groups[0].0, "g");
    assert_eq!(
        groups[0].1.iter().map(|k| &**k).collect::<Vec<_>>(),
        ["a", "c"]
    );
}

#[test]
fn an_object_stays_in_its_group() {
    let s = with_segment(1 << 20);
    put(&s, "k", 64, &grouped(&["g"]), 0);
    put(&s, "u", 64, &one(), 0);
    let bad = ErrorCode::INVALID_PARAMS;
    assert_eq!(
        code(s.put_start(W, "k", 64, &grouped(&["h"]), true, 1)),
        bad
    );
    assert_eq!(code(s.put_start(W, "k", 64, &grouped(&[""]), true, 1)), bad);
    assert_eq!(
        code(s.put_start(W, "u", 64, &grouped(&["g"]), true, 1)),
        bad
    );
    assert_eq!(batch(&s, vec!["u"], grouped(&["g"]), true), [bad]);
    // Its own group, or none named: the upsert goes ahead, the group stays.
    for cfg in [grouped(&["g"]), one()] {
        s.put_start(W, "k", 128, &cfg, true, 2).unwrap();
        s.put_end(W, "k", 2).unwrap();
        assert_eq!(s.objects_table().groups.group_of("k").as_deref(), Some("g"));
    }
    s.put_start(W, "u", 64, &grouped(&[""]), true, 3).unwrap();
    s.put_end(W, "u", 3).unwrap();
    // A put of an existing key keeps it as it is.
    assert_eq!(
        code(s.put_start(W, "k", 64, &grouped(&["h"]), false, 4)),
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
    // A removed object leaves its group; the key may join another.
    s.remove("k", true, 5).unwrap();
    assert!(
        s.objects_table().groups.export().is_empty(),
        "g went with its last member"
    );
    put(&s, "k", 64, &grouped(&["h"]), 6);
    assert_eq!(s.objects_table().groups.group_of("k").as_deref(), Some("h"));
    // A revoked first put takes its membership with it.
    s.put_start(W, "r", 64, &grouped(&["h"]), false, 7).unwrap();
    s.put_revoke(W, "r", 7).unwrap();
    assert_eq!(s.objects_table().groups.group_of("r"), None);
}

#[test]
fn a_read_of_one_member_leases_the_group() {
    let s = with_segment(1 << 20);
    assert_eq!(
        batch(&s, vec!["a", "b", "c"], grouped(&["g", "g", ""]), false),
        [ErrorCode::OK; 3]
    );
    put(&s, "d", 64, &one(), 0);
    // An exist check of an ungrouped object leases nothing.
    assert!(s.exist_key("d", 10).unwrap());
    s.remove("d", false, 11).unwrap();
    // One of a group leases the whole group (itself too).
    assert!(s.exist_key("a", 10).unwrap());
    assert_eq!(code(s.remove("b", false, 11)), ErrorCode::OBJECT_HAS_LEASE);
    assert_eq!(code(s.remove("a", false, 11)), ErrorCode::OBJECT_HAS_LEASE);
    s.remove("c", false, 11).unwrap();
    // A read with more than half the lease left leases only itself.
    s.get_replica_list("b", 50).unwrap();
    assert_eq!(code(s.remove("b", false, 60)), ErrorCode::OBJECT_HAS_LEASE);
    s.remove("a", false, 110).unwrap();
    // With less, the whole group again, until the lease runs out.
    put(&s, "a", 64, &grouped(&["g"]), 120);
    s.get_replica_list("b", 120).unwrap();
    assert_eq!(
        code(s.remove("a", false, 120 + LEASE - 1)),
        ErrorCode::OBJECT_HAS_LEASE
    );
    s.remove("a", false, 120 + LEASE).unwrap();
}

#[test]
fn eviction_takes_whole_groups_and_spares_leased_ones() {
    // 100 objects of 1 KiB fill segment "a"; a round frees 30 (to 70%).
    let s = with_segment(100 * 1024);
    // The oldest object is in a group with a new one: the group ranks by
    // its newest member, so both stay while older ones go.
    put(&s, "old", 1024, &grouped(&["young"]), 0);
    for t in 1..99 {
        put(&s, &format!("k{t}"), 1024, &one(), t);
    }
    put(&s, "new", 1024, &grouped(&["young"]), 99);
    let r = tick(&s, 1000);
    assert_eq!(r.evicted_keys, 30);
    assert!(s.exist_key("old", 1000).unwrap() && s.exist_key("new", 1000).unwrap());
    assert!(!s.exist_key("k30", 1000).unwrap() && s.exist_key("k31", 1000).unwrap());

    let s = with_segment(100 * 1024);
    let keys: Vec<String> = (0..30).map(|t| format!("g{t}")).collect();
    for (t, k) in keys.iter().enumerate() {
        put(&s, k, 1024, &grouped(&["big"]), t as u64);
    }
    for t in 30..100 {
        put(&s, &format!("k{t}"), 1024, &one(), t);
    }
    // A leased member holds its whole group back.
    s.get_replica_list("g5", 1000).unwrap();
    let r = tick(&s, 1000 + LEASE - 1);
    assert_eq!(r.evicted_keys, 30);
    assert!(!s.exist_key("k59", 2000).unwrap() && s.exist_key("k60", 2000).unwrap());
    // (Admin queries lease nothing.)
    assert!(
        keys.iter().all(|k| s.query_key(k).is_ok()),
        "leased: the group stays"
    );

    // An old unleased group goes whole, past the 20 the round needs.
    let s = with_segment(100 * 1024);
    for (t, k) in keys.iter().enumerate() {
        put(&s, k, 1024, &grouped(&["big"]), t as u64);
    }
    for t in 30..90 {
        put(&s, &format!("k{t}"), 1024, &one(), t);
    }
    let r = tick(&s, 1000);
    assert_eq!(r.evicted_keys, 30);
    assert!(keys.iter().all(|k| s.query_key(k).is_err()));
    assert!(s.query_key("k30").is_ok());
    assert!(s.objects_table().groups.export().is_empty());
}

#[test]
fn the_log_and_the_image_keep_groups() {
    let follower = std::sync::Arc::new(MasterService::with_policy(policy()));
    let mirror = Box::new(Mirror {
        follower: follower.clone(),
    });
    let leader = MasterService::with_policy(policy()).with_sink(mirror);
    leader
        .mount_segment(A, &seg("a", 0x10_000, 1 << 20), 0)
        .unwrap();
    assert_eq!(
        batch(
            &leader,
            vec!["a", "b", "c"],
            grouped(&["g", "h", "g"]),
            false
        ),
        [ErrorCode::OK; 3]
    );
    leader.remove("b", true, 1).unwrap();
    assert_same(&leader, &follower, &[], "replayed");
    assert_eq!(
        follower.objects_table().groups.export(),
        leader.objects_table().groups.export()
    );

    let mut img = Vec::new();
    leader.encode_image(&mut img);
    let back = MasterService::with_policy(policy());
    let mut r = crate::proto::wire::Reader::new(&img);
    back.decode_image(&mut r, 0, 3, &super::tenants::Quiet)
        .unwrap();
    r.finish().unwrap();
    assert_eq!(
        back.objects_table().groups.export(),
        leader.objects_table().groups.export()
    );
    // An upsert on the restored master still knows the group.
    assert_eq!(
        code(back.put_start(W, "a", 64, &grouped(&["h"]), true, 2)),
        ErrorCode::INVALID_PARAMS
    );
}

#[test]
fn a_group_mutation_round_trips() {
    use crate::master::state::mutation::{Mutation, ObjectOp};
    use crate::master::state::owned::OwnedMutation;
    use crate::proto::wire::{Decode, Encode, Reader};
    let op = ObjectOp::Group { group: "t\0g" };
    let m = OwnedMutation::from_mutation(&Mutation::Object { key: "k", op });
    let mut out = Vec::new();
    m.encode(&mut out);
    let mut r = Reader::new(&out);
    assert_eq!(OwnedMutation::decode(&mut r).unwrap(), m);
    r.finish().unwrap();
}
