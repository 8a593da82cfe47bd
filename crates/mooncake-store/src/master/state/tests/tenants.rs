//! Multi-tenant mode: isolation, admission, quotas, eviction within a
//! tenant, batches, removals, and images keeping tenants and charges.

use super::*;
use crate::tenant::Policies;

const KIB: u64 = 1024;

fn policies(q: &[(&str, u64)]) -> Policies {
    q.iter().map(|&(n, b)| (n.to_string(), b)).collect()
}

/// A multi-tenant master with the quotas `q` and one segment of `size`.
fn mt(size: u64, q: &[(&str, u64)]) -> MasterService {
    let s = MasterService::with_policy(policy()).with_tenants(policies(q));
    if size > 0 {
        s.mount_segment(A, &seg("a", 0x10_000, size), 0).unwrap();
    }
    s
}

fn call(s: &MasterService, tenant: &str, req: Request<'_>, now: u64) -> Response {
    s.handle_as(req, tenant, now).response
}

fn replicas(n: usize) -> ReplicaPolicy {
    ReplicaPolicy {
        replica_num: n,
        ..one()
    }
}

fn start(s: &MasterService, t: &str, key: &str, len: u64, n: usize, now: u64) -> ErrorCode {
    let req = Request::PutStart {
        client_id: W,
        key,
        value_len: len,
        config: replicas(n),
        upsert: false,
    };
    match call(s, t, req, now) {
        Response::Replicas { result: Ok(_) } => ErrorCode::OK,
        Response::Replicas { result: Err(e) } | Response::Failed { error: e } => e.code,
        other => panic!("{other:?}"),
    }
}

/// A whole put as `t`; its code.
fn put_as(s: &MasterService, t: &str, key: &str, len: u64, n: usize, now: u64) -> ErrorCode {
    let c = start(s, t, key, len, n, now);
    if c != ErrorCode::OK {
        return c;
    }
    match call(s, t, Request::PutEnd { client_id: W, key }, now) {
        Response::Unit { result } => result.map_or_else(|e| e.code, |()| ErrorCode::OK),
        other => panic!("{other:?}"),
    }
}

/// The size `t` reads under `key`, or the code.
fn size_as(s: &MasterService, t: &str, key: &str) -> Result<u64, ErrorCode> {
    match call(s, t, Request::GetSize { key }, NOW) {
        Response::Count { result } => result.map_err(|e| e.code),
        Response::Failed { error } => Err(error.code),
        other => panic!("{other:?}"),
    }
}

fn charged(s: &MasterService, t: &str) -> u64 {
    s.tenant_quota(t).map_or(0, |q| q.charged_bytes)
}

#[test]
fn the_same_key_in_two_tenants_is_two_objects() {
    let s = mt(1 << 20, &[("a", 1 << 19), ("b", 1 << 19)]);
    assert_eq!(put_as(&s, "a", "k", 100, 1, 0), ErrorCode::OK);
    assert_eq!(put_as(&s, "b", "k", 200, 1, 0), ErrorCode::OK);
    assert_eq!(size_as(&s, "a", "k"), Ok(100));
    assert_eq!(size_as(&s, "b", "k"), Ok(200));
    // Another tenant, or the default one, does not see them.
    assert_eq!(size_as(&s, "c", "k"), Err(ErrorCode::OBJECT_NOT_FOUND));
    assert_eq!(
        size_as(&s, "default", "k"),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
    match call(
        &s,
        "b",
        Request::Remove {
            key: "k",
            force: false,
        },
        1000,
    ) {
        Response::Unit { result } => result.unwrap(),
        other => panic!("{other:?}"),
    }
    assert_eq!(size_as(&s, "a", "k"), Ok(100));
    assert_eq!(size_as(&s, "b", "k"), Err(ErrorCode::OBJECT_NOT_FOUND));
    // Batch reads are scoped too.
    let keys = vec!["k", "x"];
    match call(&s, "a", Request::BatchExistKey { keys }, NOW) {
        Response::Bools { results } => {
            assert_eq!(results, vec![Ok(true), Ok(false)]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn writes_need_a_registered_tenant() {
    let s = mt(1 << 20, &[("a", 1 << 20)]);
    // `default` is not special.
    assert_eq!(
        put_as(&s, "default", "k", 10, 1, 0),
        ErrorCode::TENANT_NOT_REGISTERED
    );
    assert_eq!(
        put_as(&s, "", "k", 10, 1, 0),
        ErrorCode::TENANT_NOT_REGISTERED
    );
    assert_eq!(
        put_as(&s, "zz", "k", 10, 1, 0),
        ErrorCode::TENANT_NOT_REGISTERED
    );
    // A malformed id: not registered for a write, a bad parameter for a read.
    assert_eq!(
        put_as(&s, "_x", "k", 10, 1, 0),
        ErrorCode::TENANT_NOT_REGISTERED
    );
    assert_eq!(size_as(&s, "_x", "k"), Err(ErrorCode::INVALID_PARAMS));
    // Removals by a malformed id: a bad parameter, or nothing to remove.
    let remove = Request::Remove {
        key: "k",
        force: false,
    };
    match call(&s, "_x", remove, NOW) {
        Response::Failed { error } => assert_eq!(error.code, ErrorCode::INVALID_PARAMS),
        other => panic!("{other:?}"),
    }
    match call(&s, "_x", Request::RemoveAll { force: true }, NOW) {
        Response::Count { result } => assert_eq!(result, Ok(0)),
        other => panic!("{other:?}"),
    }
    assert_eq!(size_as(&s, "a\u{1}", "k"), Err(ErrorCode::INVALID_PARAMS));
    let (rejects, _) = s.tenant_counters().unwrap();
    assert_eq!(rejects.values().sum::<u64>(), 4);
}

#[test]
fn replicas_count_against_the_quota() {
    let s = MasterService::with_policy(policy()).with_tenants(policies(&[("a", 4 * KIB)]));
    s.mount_segment(A, &seg("a", 0x10_000, 1 << 20), 0).unwrap();
    s.mount_segment(B, &seg("b", 1 << 40, 1 << 20), 0).unwrap();
    assert_eq!(put_as(&s, "a", "k1", KIB, 2, 0), ErrorCode::OK);
    assert_eq!(charged(&s, "a"), 2 * KIB);
    assert_eq!(put_as(&s, "a", "k2", KIB, 2, 0), ErrorCode::OK);
    assert_eq!(charged(&s, "a"), 4 * KIB);
    // More than the whole quota: refused, nothing stored.
    assert_eq!(
        put_as(&s, "a", "big", 3 * KIB, 2, 0),
        ErrorCode::TENANT_QUOTA_EXCEEDED
    );
    assert_eq!(size_as(&s, "a", "big"), Err(ErrorCode::OBJECT_NOT_FOUND));
    assert_eq!(charged(&s, "a"), 4 * KIB);
    let q = s.tenant_quota("a").unwrap();
    assert!(!q.over_quota && q.has_explicit_policy && !q.admission_closed);
}

#[test]
fn over_quota_the_tenants_own_oldest_objects_go_first() {
    let s = mt(1 << 20, &[("a", 3 * KIB), ("b", 64 * KIB)]);
    assert_eq!(put_as(&s, "b", "other", KIB, 1, 0), ErrorCode::OK);
    for (i, k) in ["k0", "k1", "k2"].iter().enumerate() {
        assert_eq!(put_as(&s, "a", k, KIB, 1, i as u64), ErrorCode::OK);
    }
    // Past every lease: the oldest of a's objects makes room.
    assert_eq!(put_as(&s, "a", "k3", KIB, 1, 1000), ErrorCode::OK);
    assert_eq!(size_as(&s, "a", "k0"), Err(ErrorCode::OBJECT_NOT_FOUND));
    for k in ["k1", "k2", "k3"] {
        assert_eq!(size_as(&s, "a", k), Ok(KIB), "{k}");
    }
    assert_eq!(size_as(&s, "b", "other"), Ok(KIB), "another tenant's stays");
    assert_eq!(charged(&s, "a"), 3 * KIB);
    let (_, evicted) = s.tenant_counters().unwrap();
    assert_eq!(evicted["a"], KIB);
    // Objects read a moment ago are leased: nothing may go.
    for k in ["k1", "k2", "k3"] {
        let _ = call(&s, "a", Request::GetReplicaList { key: k }, 2000);
    }
    assert_eq!(
        put_as(&s, "a", "k4", KIB, 1, 2000),
        ErrorCode::TENANT_QUOTA_EXCEEDED
    );
    assert_eq!(size_as(&s, "a", "k4"), Err(ErrorCode::OBJECT_NOT_FOUND));
}

/// A put of `key` in group `g` as `t`.
fn put_grouped(s: &MasterService, t: &str, key: &str, g: &str, now: u64) {
    let config = ReplicaPolicy {
        group_ids: Some(vec![g.to_string()]),
        ..one()
    };
    let req = Request::PutStart {
        client_id: W,
        key,
        value_len: KIB,
        config,
        upsert: false,
    };
    assert!(matches!(
        call(s, t, req, now),
        Response::Replicas { result: Ok(_) }
    ));
    let end = call(s, t, Request::PutEnd { client_id: W, key }, now);
    assert!(matches!(end, Response::Unit { result: Ok(()) }));
}

#[test]
fn over_quota_a_group_goes_whole_ranked_by_its_newest_member() {
    // The group's oldest member is the oldest object, but its newest is
    // newer than "solo": "solo" goes, the group stays whole.
    let s = mt(1 << 20, &[("a", 3 * KIB)]);
    put_grouped(&s, "a", "g0", "g", 0);
    assert_eq!(put_as(&s, "a", "solo", KIB, 1, 1), ErrorCode::OK);
    put_grouped(&s, "a", "g1", "g", 2);
    assert_eq!(put_as(&s, "a", "new", KIB, 1, 1000), ErrorCode::OK);
    assert_eq!(size_as(&s, "a", "solo"), Err(ErrorCode::OBJECT_NOT_FOUND));
    for k in ["g0", "g1", "new"] {
        assert_eq!(size_as(&s, "a", k), Ok(KIB), "{k}");
    }
    // Now the group is the oldest: both members go for one KiB.
    assert_eq!(put_as(&s, "a", "newer", KIB, 1, 2000), ErrorCode::OK);
    for k in ["g0", "g1"] {
        assert_eq!(size_as(&s, "a", k), Err(ErrorCode::OBJECT_NOT_FOUND), "{k}");
    }
    assert_eq!(charged(&s, "a"), 2 * KIB);
}

#[test]
fn a_batch_stores_what_fits() {
    let s = mt(1 << 20, &[("a", 2 * KIB)]);
    let req = Request::BatchPutStart {
        client_id: W,
        keys: vec!["x", "y", "z"],
        value_lens: vec![KIB, KIB, KIB],
        config: one(),
        upsert: false,
    };
    let Response::BatchReplicas { results } = call(&s, "a", req, 0) else {
        panic!()
    };
    let codes: Vec<_> = results
        .iter()
        .map(|r| r.as_ref().map_or_else(|e| e.code, |_| ErrorCode::OK))
        .collect();
    assert_eq!(
        codes,
        [
            ErrorCode::OK,
            ErrorCode::OK,
            ErrorCode::TENANT_QUOTA_EXCEEDED
        ]
    );
    assert_eq!(charged(&s, "a"), 2 * KIB, "puts in flight are charged");
    let req = Request::BatchPutEnd {
        client_id: W,
        keys: vec!["x", "y"],
    };
    let _ = call(&s, "a", req, 0);
    assert_eq!(size_as(&s, "a", "y"), Ok(KIB));
    // Both read now (leased): nothing of a's may go for another put.
    let _ = call(
        &s,
        "a",
        Request::BatchGetReplicaList {
            keys: vec!["x", "y"],
        },
        0,
    );
    // A revoked put gives its charge back.
    assert_eq!(
        start(&s, "a", "w", 1, 1, 0),
        ErrorCode::TENANT_QUOTA_EXCEEDED
    );
    let _ = call(
        &s,
        "a",
        Request::Remove {
            key: "x",
            force: true,
        },
        0,
    );
    assert_eq!(start(&s, "a", "w", KIB, 1, 0), ErrorCode::OK);
    let _ = call(
        &s,
        "a",
        Request::PutRevoke {
            client_id: W,
            key: "w",
        },
        0,
    );
    assert_eq!(charged(&s, "a"), KIB);
}

#[test]
fn effective_quotas_share_the_mounted_capacity() {
    let s = mt(0, &[("a", 3000), ("b", 1000)]);
    // Nothing mounted: nothing granted.
    assert_eq!(s.tenant_quota("a").unwrap().effective_quota_bytes, 0);
    s.mount_segment(A, &seg("a", 0x10_000, 2000), 0).unwrap();
    assert_eq!(s.tenant_quota("a").unwrap().effective_quota_bytes, 1500);
    assert_eq!(s.tenant_quota("b").unwrap().effective_quota_bytes, 500);
    assert_eq!(
        put_as(&s, "b", "k", 600, 1, 0),
        ErrorCode::TENANT_QUOTA_EXCEEDED
    );
    s.mount_segment(B, &seg("b", 1 << 40, 1 << 20), 0).unwrap();
    assert_eq!(s.tenant_quota("a").unwrap().effective_quota_bytes, 3000);
    assert_eq!(put_as(&s, "b", "k", 600, 1, 0), ErrorCode::OK);
}

#[test]
fn removals_of_many_keys_stay_in_the_tenant() {
    let s = mt(1 << 20, &[("a", 1 << 20), ("b", 1 << 20)]);
    for t in ["a", "b"] {
        for k in ["x1", "x2", "y"] {
            assert_eq!(put_as(&s, t, k, 10, 1, 0), ErrorCode::OK);
        }
    }
    let req = Request::RemoveByRegex {
        pattern: "^x",
        force: false,
    };
    let Response::Count { result } = call(&s, "a", req, 1000) else {
        panic!()
    };
    assert_eq!(result, Ok(2));
    let Response::Count { result } = call(&s, "a", Request::RemoveAll { force: false }, 1000)
    else {
        panic!()
    };
    assert_eq!(result, Ok(1));
    for k in ["x1", "x2", "y"] {
        assert_eq!(size_as(&s, "b", k), Ok(10), "{k}");
    }
    assert_eq!(charged(&s, "a"), 0);
    assert_eq!(charged(&s, "b"), 30);
}

#[test]
fn replica_clears_stay_in_the_tenant() {
    let s = mt(1 << 20, &[("a", 1 << 20), ("b", 1 << 20)]);
    for t in ["a", "b"] {
        assert_eq!(put_as(&s, t, "k", 10, 1, 0), ErrorCode::OK);
    }
    let clear = |t| {
        let req = Request::BatchReplicaClear {
            client_id: W,
            keys: vec!["k", "other"],
            segment_name: "",
        };
        match call(&s, t, req, 1000) {
            Response::Keys { result } => result.map_err(|e| e.code),
            Response::Failed { error } => Err(error.code),
            other => panic!("{other:?}"),
        }
    };
    // The cleared keys come back as the caller named them.
    assert_eq!(clear("a"), Ok(vec!["k".to_string()]));
    assert_eq!(size_as(&s, "a", "k"), Err(ErrorCode::OBJECT_NOT_FOUND));
    assert_eq!(size_as(&s, "b", "k"), Ok(10));
    assert_eq!(clear("_x"), Err(ErrorCode::INVALID_PARAMS));
    assert_eq!(charged(&s, "a"), 0);
    assert_eq!(charged(&s, "b"), 10);
}

#[test]
fn admin_calls_set_and_delete_policies() {
    let s = mt(1 << 20, &[("a", 100)]);
    assert_eq!(
        s.set_tenant_quota("n", 0).unwrap_err().code,
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        s.set_tenant_quota("_n", 5).unwrap_err().code,
        ErrorCode::INVALID_PARAMS
    );
    let p = s.set_tenant_quota("n", 50).unwrap();
    assert_eq!(p, policies(&[("a", 100), ("n", 50)]));
    assert_eq!(put_as(&s, "n", "k", 10, 1, 0), ErrorCode::OK);
    assert_eq!(
        s.delete_tenant_quota("n").unwrap_err().code,
        ErrorCode::TENANT_NOT_EMPTY
    );
    assert_eq!(
        s.delete_tenant_quota("q").unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert_eq!(
        s.tenant_quota("q").unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    let _ = call(
        &s,
        "n",
        Request::Remove {
            key: "k",
            force: true,
        },
        0,
    );
    assert_eq!(s.delete_tenant_quota("n").unwrap(), policies(&[("a", 100)]));
    assert_eq!(
        put_as(&s, "n", "k", 10, 1, 0),
        ErrorCode::TENANT_NOT_REGISTERED
    );
    // Without multi-tenant mode the admin calls are refused.
    let plain = with_segment(1 << 20);
    assert_eq!(
        plain.tenant_quotas().unwrap_err().code,
        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE
    );
}

#[test]
fn without_multi_tenant_mode_the_tenant_is_ignored() {
    let s = with_segment(1 << 20);
    assert_eq!(put_as(&s, "a", "k", 10, 1, 0), ErrorCode::OK);
    assert_eq!(size_as(&s, "b", "k"), Ok(10));
    assert_eq!(size_as(&s, "_bad", "k"), Ok(10));
    assert_eq!(s.get_size("k", NOW), Ok(10));
}

#[test]
fn the_default_tenant_keeps_plain_keys() {
    let s = mt(1 << 20, &[("default", 1 << 20)]);
    assert_eq!(put_as(&s, "default", "k", 10, 1, 0), ErrorCode::OK);
    assert_eq!(
        s.get_size("k", NOW),
        Ok(10),
        "as a master without tenants keys it"
    );
    assert_eq!(
        put_as(&s, "default", "t\0k", 10, 1, 0),
        ErrorCode::INVALID_PARAMS,
        "a default key cannot pose as another tenant's"
    );
}

pub(super) struct Quiet;
impl crate::master::state::image::LoadProgress for Quiet {
    fn begin(&self, _: u64) {}
    fn restored(&self, _: u64) {}
}

#[test]
fn an_image_keeps_tenants_and_rebuilds_charges() {
    let q = [("a", 1 << 20), ("b", 1 << 20)];
    let s = mt(1 << 20, &q);
    assert_eq!(put_as(&s, "a", "k", 100, 1, 0), ErrorCode::OK);
    assert_eq!(put_as(&s, "b", "k", 300, 1, 0), ErrorCode::OK);
    assert_eq!(start(&s, "b", "pending", 50, 1, 0), ErrorCode::OK);
    let mut img = Vec::new();
    s.encode_image(&mut img);
    let r = MasterService::with_policy(policy()).with_tenants(policies(&q));
    let mut reader = crate::proto::wire::Reader::new(&img);
    r.decode_image(&mut reader, 0, 1, &Quiet).unwrap();
    assert_eq!(size_as(&r, "a", "k"), Ok(100));
    assert_eq!(size_as(&r, "b", "k"), Ok(300));
    assert_eq!(charged(&r, "a"), 100);
    assert_eq!(charged(&r, "b"), 350);
}
