//! When each kind of call may be answered: the `Release` that `handle`
//! returns with the response. The sink here hands out positions 1, 2, …
//! as a log would, so a release can be checked against the log's tail.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::*;
use crate::master::state::mutation::{Call, Mutation, MutationSink, Release};
use crate::master::Answer;

/// A log: each mutation gets the next position, kept as `kept` says.
struct Log {
    last: AtomicU64,
    kept: fn(u64) -> Release,
}

impl MutationSink for Arc<Log> {
    fn applied(&self, _: &Mutation<'_>) -> Release {
        (self.kept)(self.last.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

impl Log {
    /// The position of the last mutation logged.
    fn last(&self) -> u64 {
        self.last.load(Ordering::Relaxed)
    }
}

/// A master logging to a `Log`, with the put fence as `fence` says, and a
/// 1 MiB segment mounted (its reserved regions are 64 KiB).
fn logged(kept: fn(u64) -> Release, fence: bool) -> (MasterService, Arc<Log>) {
    let log = Arc::new(Log {
        last: AtomicU64::new(0),
        kept,
    });
    let s = MasterService::with_policy(Policy {
        put_fence: fence,
        ..policy()
    })
    .with_sink(Box::new(log.clone()))
    .with_put_fence();
    s.mount_segment(A, &seg("a", 1 << 30, 1 << 20), 0).unwrap();
    (s, log)
}

fn put_start(key: &str, len: u64) -> Request<'_> {
    Request::PutStart {
        client_id: W,
        key,
        value_len: len,
        config: one(),
        upsert: false,
    }
}

/// Serves `req`; panics when the call failed.
fn ok(s: &MasterService, req: Request<'_>) -> Release {
    let Answer { response, release } = s.handle(req, NOW);
    let failed = match &response {
        Response::Failed { .. } => true,
        Response::Unit { result } => result.is_err(),
        Response::Replicas { result } => result.is_err(),
        Response::Units { results } => results.iter().any(|r| r.is_err()),
        Response::BatchReplicas { results } => results.iter().any(|r| r.is_err()),
        _ => false,
    };
    assert!(!failed, "{response:?}");
    release
}

#[test]
fn the_release_of_a_call_is_where_its_last_entry_lies_bounded_by_an_answer_at() {
    let mut call = Call::default();
    assert_eq!(call.release(), Release::Now, "nothing logged");
    call.logged(Release::Durable(5));
    assert_eq!(call.release(), Release::Durable(5));
    call.logged(Release::Now);
    assert_eq!(call.release(), Release::Durable(5), "a skipped entry");
    call.answer_at(3);
    call.answer_at(2);
    assert_eq!(call.release(), Release::Durable(3), "the furthest bound");
    call.answer_after_all();
    call.answer_at(4);
    assert_eq!(call.release(), Release::Durable(5), "after all, for good");

    let mut call = Call::default();
    call.logged(Release::Committed(7));
    call.answer_at(0);
    assert_eq!(call.release(), Release::Now, "nothing to wait for");
}

#[test]
fn reads_and_refusals_are_answered_now() {
    let (s, _) = logged(Release::Committed, true);
    super::put(&s, "k", 1024, &one(), 0);
    assert_eq!(ok(&s, Request::GetReplicaList { key: "k" }), Release::Now);
    let keys = vec!["k", "k"];
    let batch = Request::BatchGetReplicaList { keys };
    assert_eq!(ok(&s, batch), Release::Now);
    assert_eq!(ok(&s, Request::ExistKey { key: "k" }), Release::Now);
    assert_eq!(ok(&s, Request::GetSize { key: "k" }), Release::Now);
    // A heartbeat of a known client changes volatile state only.
    assert_eq!(ok(&s, Request::Ping { client_id: A }), Release::Now);
    // Refused, so nothing logged.
    let end = Request::PutEnd {
        client_id: W,
        key: "absent",
    };
    assert_eq!(s.handle(end, NOW).release, Release::Now);
    let remove = Request::Remove {
        key: "absent",
        force: false,
    };
    assert_eq!(s.handle(remove, NOW).release, Release::Now);
}

#[test]
fn a_put_in_reserved_space_waits_for_its_reservation_only() {
    let (s, log) = logged(Release::Committed, true);
    let before = log.last();
    let first = ok(&s, put_start("k1", 1024));
    // The region's reservation, then the put's own entry.
    assert_eq!(log.last(), before + 2);
    assert_eq!(first, Release::Committed(before + 1));
    // The next put lands in the same region: it waits for nothing newer.
    let second = ok(&s, put_start("k2", 1024));
    assert!(log.last() > before + 2);
    assert_eq!(second, first);
    // Its PutEnd waits for its own entry, which covers the PutStart's.
    let end = Request::PutEnd {
        client_id: W,
        key: "k1",
    };
    assert_eq!(ok(&s, end), Release::Committed(log.last()));
    // A batch waits for the furthest of its reservations.
    let batch = Request::BatchPutStart {
        client_id: W,
        keys: vec!["k3", "k4"],
        value_lens: vec![1024, 1024],
        config: one(),
        upsert: false,
    };
    assert_eq!(ok(&s, batch), first);
}

#[test]
fn a_put_outside_reserved_space_waits_for_all_its_entries() {
    let (s, log) = logged(Release::Committed, true);
    // Larger than a region: placed outside reserved space.
    assert_eq!(
        ok(&s, put_start("big", 100 << 10)),
        Release::Committed(log.last())
    );
    // One such put in a batch makes the whole call wait.
    let batch = Request::BatchPutStart {
        client_id: W,
        keys: vec!["small", "large"],
        value_lens: vec![1024, 100 << 10],
        config: one(),
        upsert: false,
    };
    assert_eq!(ok(&s, batch), Release::Committed(log.last()));
    // An upsert rewriting readable replicas in place waits for its entry.
    s.put_end(W, "small", NOW).unwrap();
    let upsert = Request::PutStart {
        client_id: W,
        key: "small",
        value_len: 1024,
        config: one(),
        upsert: true,
    };
    assert_eq!(ok(&s, upsert), Release::Committed(log.last()));
}

#[test]
fn without_the_fence_a_put_waits_for_its_own_entry() {
    let (s, log) = logged(Release::Committed, false);
    let before = log.last();
    let release = ok(&s, put_start("k", 1024));
    assert_eq!(log.last(), before + 1, "no reservation logged");
    assert_eq!(release, Release::Committed(log.last()));
}

#[test]
fn changes_wait_for_their_last_entry() {
    let (s, log) = logged(Release::Committed, true);
    let mount = Request::MountSegment {
        client_id: B,
        segment: seg("b", 1 << 31, 1 << 20),
    };
    assert_eq!(ok(&s, mount), Release::Committed(log.last()));
    // First contact registers the client.
    let ping = Request::Ping { client_id: 42 };
    let registered = s.handle(ping, NOW);
    assert!(matches!(
        registered.response,
        Response::Unit { result: Err(_) }
    ));
    assert_eq!(registered.release, Release::Committed(log.last()));
    super::put(&s, "k", 1024, &one(), 0);
    let remove = Request::Remove {
        key: "k",
        force: false,
    };
    assert_eq!(ok(&s, remove), Release::Committed(log.last()));
    let unmount = Request::UnmountSegment {
        client_id: B,
        name: "b",
    };
    assert_eq!(ok(&s, unmount), Release::Committed(log.last()));
}

#[test]
fn the_release_follows_the_log_a_master_keeps() {
    // A single master with a write-ahead log: durable, at the same rule.
    let (s, log) = logged(Release::Durable, true);
    let before = log.last();
    assert_eq!(
        ok(&s, put_start("k", 1024)),
        Release::Durable(before + 1),
        "its reservation"
    );
    let end = Request::PutEnd {
        client_id: W,
        key: "k",
    };
    assert_eq!(ok(&s, end), Release::Durable(log.last()));
    // A master without a log has nothing to wait for.
    let s = MasterService::with_policy(policy()).with_put_fence();
    s.mount_segment(A, &seg("a", 1 << 30, 1 << 20), 0).unwrap();
    assert_eq!(ok(&s, put_start("k", 1024)), Release::Now);
}
