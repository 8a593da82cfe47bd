//! Who publishes KV events: the reference's cases (a put's end, a remove,
//! an eviction that leaves no copy) and no others; a standby replaying the
//! leader's mutations publishes nothing.

use std::sync::Arc;

use parking_lot::Mutex;

use super::files::{drain, with_tier};
use super::*;
use crate::master::events::{Kind, Medium, Publisher};
use crate::master::state::mutation::{Mutation, MutationSink, Release};
use crate::master::state::owned::OwnedMutation;

fn publishing(s: MasterService) -> MasterService {
    s.with_kv_events(Publisher::unsent())
}

fn ev(kind: Kind, key: &str, medium: Medium) -> (Kind, String, Medium) {
    (kind, key.to_string(), medium)
}

#[test]
fn puts_and_removes_publish_as_the_reference_does() {
    let s = publishing(with_segment(1 << 20));
    put(&s, "1", 1024, &one(), 0);
    put(&s, "2", 1024, &one(), 0);
    put(&s, "3", 1024, &one(), 0);
    put(&s, "4", 1024, &one(), 0);
    // A put of an existing key fails: nothing.
    assert_eq!(
        code(s.put_start(W, "1", 1024, &one(), false, 1000)),
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
    // An upsert's end is stored again; a repeated PutEnd is not.
    s.put_start(W, "1", 1024, &one(), true, 1000).unwrap();
    s.put_end(W, "1", 1000).unwrap();
    s.put_end(W, "1", 1000).unwrap();
    s.remove("1", false, 2000).unwrap();
    // Batch remove, by regex, everything: nothing.
    let batch = Request::BatchRemove {
        keys: vec!["2"],
        force: false,
    };
    let _ = s.handle(batch, 2000);
    assert_eq!(s.remove_by_regex("^3$", false, 2000).unwrap(), 1);
    assert_eq!(s.remove_all(false, 2000), 1);
    // A put dropped unfinished: nothing.
    s.put_start(W, "5", 1024, &one(), false, 3000).unwrap();
    s.put_revoke(W, "5", 3000).unwrap();
    assert_eq!(
        s.kv_events_queued(),
        [
            ev(Kind::Stored, "1", Medium::Cpu),
            ev(Kind::Stored, "2", Medium::Cpu),
            ev(Kind::Stored, "3", Medium::Cpu),
            ev(Kind::Stored, "4", Medium::Cpu),
            ev(Kind::Stored, "1", Medium::Cpu),
            ev(Kind::Removed, "1", Medium::Cpu),
        ]
    );
}

#[test]
fn eviction_from_memory_publishes_the_keys_it_drops() {
    let s = publishing(with_segment(100 * 1024));
    for t in 0..90 {
        put(&s, &format!("{t}"), 1024, &one(), t);
    }
    assert_eq!(tick(&s, 1000).evicted_keys, 20);
    let mut removed: Vec<_> = s
        .kv_events_queued()
        .into_iter()
        .filter(|e| e.0 == Kind::Removed)
        .collect();
    // In shard order.
    removed.sort_by_key(|e| e.1.parse::<u64>().unwrap());
    let expected: Vec<_> = (0..20)
        .map(|t| ev(Kind::Removed, &t.to_string(), Medium::Cpu))
        .collect();
    assert_eq!(removed, expected);
}

// A file written is `stored` on `disk`; objects whose file copy stays leave
// memory quietly; the files the tier drops for lack of room take their keys
// with them: `removed` on `disk`.
#[test]
fn eviction_from_the_file_tier_publishes_disk() {
    let s = publishing(with_tier(2, true));
    for i in 0..16 {
        put(&s, &format!("{i}"), 1024, &one(), i);
    }
    let mut written = 0;
    for t in [1000, 2000, 3000, 4000] {
        tick(&s, t);
        written += drain(&s, t).0;
        let _ = s.put_start(W, &format!("{t}"), 1024, &one(), false, t);
        let _ = s.put_end(W, &format!("{t}"), t);
    }
    let gone: Vec<String> = (0..16)
        .map(|i| i.to_string())
        .filter(|k| !s.exist_key(k, 5000).unwrap())
        .collect();
    assert!(!gone.is_empty());
    let removed: Vec<_> = s
        .kv_events_queued()
        .into_iter()
        .filter(|e| e.0 == Kind::Removed)
        .collect();
    let mut keys: Vec<String> = removed.iter().map(|e| e.1.clone()).collect();
    keys.sort();
    let mut gone_sorted = gone.clone();
    gone_sorted.sort();
    assert_eq!(keys, gone_sorted, "one removed event per key gone");
    assert!(removed.iter().all(|e| e.2 == Medium::Disk), "{removed:?}");
    // Each file written is stored on `disk`, as the reference's PutEnd of a
    // disk replica.
    let files = s
        .kv_events_queued()
        .into_iter()
        .filter(|e| e.0 == Kind::Stored && e.2 == Medium::Disk)
        .count();
    assert!(written > 0);
    assert_eq!(files, written);
}

#[derive(Default)]
struct Log(Mutex<Vec<OwnedMutation>>);

impl MutationSink for Arc<Log> {
    fn applied(&self, m: &Mutation<'_>) -> Release {
        self.0.lock().push(OwnedMutation::from_mutation(m));
        Release::Now
    }
}

#[test]
fn a_standby_replaying_the_leader_publishes_nothing() {
    let log = Arc::new(Log::default());
    let leader = publishing(MasterService::with_policy(policy())).with_sink(Box::new(log.clone()));
    leader
        .mount_segment(A, &seg("a", 0x10_000, 100 * 1024), 0)
        .unwrap();
    let standby = publishing(MasterService::with_policy(policy()));
    for t in 0..90 {
        put(&leader, &format!("{t}"), 1024, &one(), t);
    }
    assert_eq!(tick(&leader, 1000).evicted_keys, 20);
    leader.remove("89", false, 2000).unwrap();
    for m in log.0.lock().iter() {
        standby.apply_logged(m).unwrap();
    }
    assert_eq!(leader.kv_events_queued().len(), 90 + 1 + 20);
    assert!(standby.kv_events_queued().is_empty());
    assert!(
        !standby.exist_key("0", NOW).unwrap(),
        "the standby replayed"
    );
}
