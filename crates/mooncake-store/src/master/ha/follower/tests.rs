//! A leader and a standby wired by hand (no sockets): the leader's sink
//! logs its mutations, a pull carries them, the standby keeps and applies
//! the committed ones, and promotion applies the rest.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::{apply_up_to, receive};
use crate::master::replication::in_sync::Record;
use crate::master::replication::{Options, Replication, Role};
use crate::master::serve::shared::Shared;
use crate::master::MasterConfig;
use crate::master::Release;
use crate::proto::{Frames, Request, Response};
use crate::types::{ReplicaPolicy, SegmentInfo};
use mooncake_common::ErrorCode;

fn opts() -> Options {
    Options {
        batch_max: 1024,
        poll: Duration::ZERO,
        lag_limit: Duration::from_secs(2),
        min_in_sync: 1,
    }
}

fn master(me: &str) -> (Arc<Shared>, Arc<Replication>) {
    let r = Arc::new(Replication::new(me.into(), opts()));
    (
        Arc::new(Shared::replicated(MasterConfig::default(), r.clone()).unwrap()),
        r,
    )
}

/// One pull of `standby` (holding `after` entries, `applied` applied).
fn pull(leader: &Replication, standby: &Replication, now: u64) -> (u64, u64, Frames) {
    let p = standby.pull_request(1024, Duration::ZERO);
    match leader.serve_pull(
        standby.member(),
        p.after,
        p.after_term,
        p.applied,
        1024,
        Duration::ZERO,
        now,
    ) {
        Response::Entries {
            term,
            committed,
            frames,
            ..
        } => (term, committed, frames),
        other => panic!("pull answered {other:?}"),
    }
}

fn segment() -> SegmentInfo {
    SegmentInfo {
        name: "seg".into(),
        base: 1 << 30,
        size: 1 << 20,
        transport_endpoint: "127.0.0.1:1".into(),
    }
}

#[test]
fn a_standby_follows_commits_and_takes_over() {
    let (la, ra) = master("a#1");
    let (lb, rb) = master("b#1");
    let rec = ra.promote(7, "a:1", None, 0);
    assert!(rec.standbys.is_empty());
    ra.record_done(rec, true);

    la.service.mount_segment(1, &segment(), 0).unwrap();
    let cfg = ReplicaPolicy::default();
    la.service.put_start(1, "k", 100, &cfg, false, 1).unwrap();
    la.service.put_end(1, "k", 2).unwrap();
    let last = ra.status().last_seq;
    assert!(last >= 3, "register, mount, put start and end are logged");
    ra.wait_committed(last).unwrap();

    // B pulls everything; it applies only what A says is committed.
    let (term, committed, frames) = pull(&ra, &rb, 3);
    assert_eq!((term, committed), (7, last));
    receive(&lb, &rb, term, committed, &frames).unwrap();
    assert_eq!(rb.status().applied_seq, last);
    assert!(lb.service.exist_key("k", 3).unwrap());

    // B has every entry: it joins the in-sync set; from then on a put
    // commits only once B asked for what follows it.
    let _ = pull(&ra, &rb, 4);
    let rec = ra.next_record(4).unwrap();
    assert_eq!(rec.standbys, BTreeSet::from(["b#1".to_string()]));
    ra.record_done(rec.clone(), true);
    la.service.put_start(1, "k2", 100, &cfg, false, 5).unwrap();
    let seq = ra.status().last_seq;
    assert!(ra.status().committed_seq < seq, "B has not got it");
    let (term, committed, frames) = pull(&ra, &rb, 6);
    assert!(committed < seq);
    receive(&lb, &rb, term, committed, &frames).unwrap();
    assert_eq!(rb.status().last_seq, seq, "kept, not applied");
    let _ = pull(&ra, &rb, 7); // acknowledges
    ra.wait_committed(seq).unwrap();

    // A is gone; B is in the record: it applies the rest and leads.
    let record = Record {
        term: 7,
        leader: "a#1".into(),
        standbys: rec.standbys,
    };
    assert!(record.holds_all(rb.member()));
    apply_up_to(&lb, &rb, u64::MAX).unwrap();
    let first = rb.promote(8, "b:1", Some(&record), 8);
    assert!(first.standbys.is_empty(), "A is not carried over");
    assert_eq!(rb.role(), Role::Leader);
    // The put in flight on A is in flight on B: its writer can end it.
    lb.service.put_end(1, "k2", 9).unwrap();
    assert!(lb.service.exist_key("k2", 9).unwrap());

    // A deposed leader commits nothing and fails its waiting calls.
    ra.depose();
    assert!(ra.wait_committed(u64::MAX).is_err());
    assert!(matches!(
        ra.serve_pull("b#1", 0, 0, 0, 1, Duration::ZERO, 10),
        Response::Failed { .. }
    ));
}

/// A leader's calls are released once committed: a put in reserved space
/// at its reservation, its PutEnd at its own entry. A deposed leader's
/// sink logs nothing, so its calls carry no position (the server then
/// refuses them as not leading).
#[test]
fn a_leader_releases_its_calls_at_their_commit() {
    let (la, ra) = master("a#1");
    let rec = ra.promote(7, "a:1", None, 0);
    ra.record_done(rec, true);
    la.service.mount_segment(1, &segment(), 0).unwrap();
    let put = |key| Request::PutStart {
        client_id: 1,
        key,
        value_len: 100,
        config: ReplicaPolicy::default(),
        upsert: false,
    };
    let before = ra.status().last_seq;
    let start = la.service.handle(put("k"), 1);
    assert_eq!(
        start.release,
        Release::Committed(before + 1),
        "its reservation"
    );
    assert_eq!(ra.status().last_seq, before + 2, "then its own entry");
    let end = Request::PutEnd {
        client_id: 1,
        key: "k",
    };
    let end = la.service.handle(end, 2);
    assert_eq!(end.release, Release::Committed(ra.status().last_seq));
    ra.wait_committed(ra.status().last_seq).unwrap();

    ra.depose();
    let last = ra.status().last_seq;
    let refused = la.service.handle(put("k2"), 3);
    assert_eq!(refused.release, Release::Now);
    assert_eq!(ra.status().last_seq, last, "nothing logged");
}

#[test]
fn a_log_that_does_not_match_is_refused() {
    let (_la, ra) = master("a#1");
    let rec = ra.promote(3, "a:1", None, 0);
    ra.record_done(rec, true);
    // Entry 5 of term 2 is not in A's (empty) log.
    assert!(matches!(
        ra.serve_pull("b#1", 5, 2, 0, 10, Duration::ZERO, 1),
        Response::Failed { .. }
    ));
}

/// The `ha_*` gauges of `s` (as `/metrics` renders them).
fn ha_gauges(s: &Shared, r: &Replication) -> std::collections::HashMap<String, i64> {
    r.publish_metrics(&s.metrics);
    let text = s.metrics.render(&s.service, &s.service.stats(0));
    text.lines()
        .filter(|l| l.starts_with("ha_"))
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_standby_reports_where_it_stands_in_the_ha_gauges() {
    let (la, ra) = master("a#1");
    let (lb, rb) = master("b#1");
    assert_eq!(ha_gauges(&lb, &rb)["ha_standby_state"], 1, "connecting");
    let rec = ra.promote(7, "a:1", None, 0);
    ra.record_done(rec, true);
    la.service.mount_segment(1, &segment(), 0).unwrap();
    let (term, committed, frames) = pull(&ra, &rb, 1);
    receive(&lb, &rb, term, committed, &frames).unwrap();
    let _ = pull(&ra, &rb, 2);
    let rec = ra.next_record(2).unwrap();
    ra.record_done(rec, true);

    // B keeps a put it may not apply yet: it is behind, syncing.
    let cfg = ReplicaPolicy::default();
    la.service.put_start(1, "k", 100, &cfg, false, 3).unwrap();
    let seq = ra.status().last_seq;
    let (term, committed, frames) = pull(&ra, &rb, 4);
    receive(&lb, &rb, term, committed, &frames).unwrap();
    let b = ha_gauges(&lb, &rb);
    assert_eq!(b["ha_standby_state"], 2, "syncing: {b:?}");
    assert_eq!(b["ha_oplog_last_sequence_id"], seq as i64);
    let behind = seq as i64 - b["ha_oplog_applied_sequence_id"];
    assert!(behind > 0, "{b:?}");
    assert_eq!(b["ha_oplog_standby_lag"], behind);
    assert_eq!(b["ha_oplog_pending_entries"], behind);

    // It acknowledges, A commits, the next answer says so: caught up.
    let _ = pull(&ra, &rb, 5);
    ra.wait_committed(seq).unwrap();
    let (term, committed, frames) = pull(&ra, &rb, 6);
    receive(&lb, &rb, term, committed, &frames).unwrap();
    let b = ha_gauges(&lb, &rb);
    assert_eq!(b["ha_standby_state"], 3, "watching: {b:?}");
    assert_eq!(b["ha_oplog_applied_sequence_id"], seq as i64);
    assert_eq!(b["ha_oplog_standby_lag"], 0);
    let a = ha_gauges(&la, &ra);
    assert_eq!(a["ha_standby_state"], 7, "the leader is promoted: {a:?}");
    assert_eq!(a["ha_oplog_last_sequence_id"], seq as i64);

    // A new leader not heard from yet: connecting again.
    rb.new_leader();
    assert_eq!(ha_gauges(&lb, &rb)["ha_standby_state"], 1);
}

/// A leading B and C, both recorded in sync, with a segment mounted.
fn three() -> [(Arc<Shared>, Arc<Replication>); 3] {
    let (la, ra) = master("a#1");
    let (lb, rb) = master("b#1");
    let (lc, rc) = master("c#1");
    let rec = ra.promote(7, "a:1", None, 0);
    ra.record_done(rec, true);
    la.service.mount_segment(1, &segment(), 0).unwrap();
    for (l, r) in [(&lb, &rb), (&lc, &rc)] {
        let (term, committed, frames) = pull(&ra, r, 1);
        receive(l, r, term, committed, &frames).unwrap();
        let _ = pull(&ra, r, 2);
    }
    let rec = ra.next_record(2).unwrap();
    assert_eq!(rec.standbys.len(), 2);
    ra.record_done(rec, true);
    [(la, ra), (lb, rb), (lc, rc)]
}

fn a_record() -> Record {
    Record {
        term: 7,
        leader: "a#1".into(),
        standbys: BTreeSet::from(["b#1".to_string(), "c#1".to_string()]),
    }
}

/// The last entry of a put is acknowledged by both standbys, so A answers
/// the put; neither has heard it is committed (the commit point travels
/// with the next answer, which a stopped standby never reads). C then
/// sees B elected, but B's win does not hold (its candidacy expired while
/// it was stopped), and C, being recorded, leads: it must hold the put.
#[test]
fn a_standby_that_saw_another_leader_keeps_what_it_acknowledged() {
    let [(la, ra), (lb, rb), (lc, rc)] = three();
    let cfg = ReplicaPolicy::default();
    la.service.put_start(1, "k", 100, &cfg, false, 3).unwrap();
    la.service.put_end(1, "k", 4).unwrap();
    let seq = ra.status().last_seq;
    for (l, r) in [(&lb, &rb), (&lc, &rc)] {
        let (term, committed, frames) = pull(&ra, r, 5);
        assert!(committed < seq);
        receive(l, r, term, committed, &frames).unwrap();
    }
    for r in [&rb, &rc] {
        let _ = pull(&ra, r, 6); // acknowledges; the answer is never read
    }
    ra.wait_committed(seq).unwrap();
    assert!(rc.status().applied_seq < seq, "C has not applied the put");

    rc.new_leader();
    assert!(a_record().holds_all(rc.member()));
    apply_up_to(&lc, &rc, u64::MAX).unwrap();
    rc.promote(9, "c:1", Some(&a_record()), 10);
    assert!(
        lc.service.exist_key("k", 10).unwrap(),
        "the acknowledged put is lost on the new leader"
    );
}

/// A new leader whose log is shorter: the standby keeps the entries it
/// holds with the same term, replaces those the leader wrote in their
/// place, and ends up with the leader's log and state.
#[test]
fn a_standby_checks_its_tail_against_a_new_leader() {
    let [(la, ra), (lb, rb), (lc, rc)] = three();
    let cfg = ReplicaPolicy::default();
    // "k1" reaches both and is committed, "k2" only C: never committed.
    la.service.put_start(1, "k1", 100, &cfg, false, 3).unwrap();
    for (l, r) in [(&lb, &rb), (&lc, &rc)] {
        let (term, committed, frames) = pull(&ra, r, 4);
        receive(l, r, term, committed, &frames).unwrap();
    }
    let k1 = ra.status().last_seq;
    la.service.put_start(1, "k2", 100, &cfg, false, 5).unwrap();
    let (term, committed, frames) = pull(&ra, &rc, 6);
    receive(&lc, &rc, term, committed, &frames).unwrap();
    let k2 = ra.status().last_seq;
    assert!(k2 > k1 && rc.status().last_seq == k2);
    assert_eq!(rb.status().last_seq, k1);

    // B leads with what it holds and writes its own entry where C has k2.
    apply_up_to(&lb, &rb, u64::MAX).unwrap();
    let rec = rb.promote(9, "b:1", Some(&a_record()), 7);
    rb.record_done(rec, true);
    assert_eq!(rb.status().last_seq, k2, "B's no-op takes k2's place");
    lb.service.put_start(1, "k3", 100, &cfg, false, 8).unwrap();
    let k3 = rb.status().last_seq;
    assert_eq!(k3, k2 + 1, "B's entry follows its no-op");

    rc.new_leader();
    let p = rc.pull_request(1024, Duration::ZERO);
    assert!(p.after < k1, "C asks from what it knows committed");
    let (term, committed, frames) = pull(&rb, &rc, 9);
    receive(&lc, &rc, term, committed, &frames).unwrap();
    assert_eq!(rc.term_of(k1), Some(7), "kept");
    assert_eq!(rc.term_of(k2), Some(9), "replaced");
    assert_eq!(rc.status().last_seq, k3);
    let _ = pull(&rb, &rc, 10); // acknowledges
    rb.wait_committed(k3).unwrap();
    let (term, committed, frames) = pull(&rb, &rc, 11);
    receive(&lc, &rc, term, committed, &frames).unwrap();
    assert_eq!(rc.status().applied_seq, k3);
    // k2 was never committed: C's state has B's k3 in flight, not k2.
    lc.service.put_end(1, "k3", 12).unwrap();
    assert!(lc.service.put_end(1, "k2", 12).is_err());
}

/// A new leader that holds less than the standby and nothing more: the
/// standby's tail past the leader's last entry goes.
#[test]
fn a_tail_past_the_new_leaders_log_is_cut() {
    let [(la, ra), (lb, rb), (lc, rc)] = three();
    let cfg = ReplicaPolicy::default();
    let before = rb.status().last_seq;
    la.service.put_start(1, "k", 100, &cfg, false, 3).unwrap();
    let (term, committed, frames) = pull(&ra, &rc, 4);
    receive(&lc, &rc, term, committed, &frames).unwrap();
    // Its reservation and its PutStart: past B's no-op.
    assert!(rc.status().last_seq > before + 1);

    apply_up_to(&lb, &rb, u64::MAX).unwrap();
    let rec = rb.promote(9, "b:1", Some(&a_record()), 5);
    rb.record_done(rec, true);
    rc.new_leader();
    // The entries C holds up to B's last (resent, the same), then none.
    for now in [6, 7] {
        let (term, committed, frames) = pull(&rb, &rc, now);
        receive(&lc, &rc, term, committed, &frames).unwrap();
    }
    // B's no-op replaced the first entry of C's tail, the rest is cut.
    assert_eq!(rc.status().last_seq, before + 1);
    assert_eq!(rc.term_of(before + 1), Some(9));
    // What it holds now matches B's log: the next pull is answered.
    let _ = pull(&rb, &rc, 8);
}

/// A call that logs nothing answers from the leader's state, which may
/// hold entries not yet committed: it waits for the last entry logged
/// (the read index) while there is one, and is answered at once when all
/// is committed.
#[test]
fn a_call_logging_nothing_waits_for_the_last_entry_while_uncommitted() {
    let [(la, ra), (lb, rb), (lc, rc)] = three();
    let cfg = ReplicaPolicy::default();
    la.service.put_start(1, "k", 100, &cfg, false, 3).unwrap();
    la.service.put_end(1, "k", 4).unwrap();
    let last = ra.status().last_seq;
    assert!(ra.status().committed_seq < last, "no standby has the put");
    let reads = || {
        [
            Request::GetReplicaList { key: "k" },
            Request::ExistKey { key: "k" },
            // Refused from the state: the object is complete, or absent.
            Request::PutEnd {
                client_id: 1,
                key: "k",
            },
            Request::PutStart {
                client_id: 1,
                key: "k",
                value_len: 100,
                config: ReplicaPolicy::default(),
                upsert: false,
            },
            Request::Remove {
                key: "absent",
                force: false,
            },
        ]
    };
    for req in reads() {
        let answer = la.service.handle(req, 5);
        assert_eq!(answer.release, Release::Committed(last), "{answer:?}");
    }
    assert_eq!(ra.status().last_seq, last, "nothing logged");
    for (l, r) in [(&lb, &rb), (&lc, &rc)] {
        let (term, committed, frames) = pull(&ra, r, 6);
        receive(l, r, term, committed, &frames).unwrap();
        let _ = pull(&ra, r, 7);
    }
    ra.wait_committed(last).unwrap();
    // All committed: the fast path, no wait.
    for req in reads() {
        assert_eq!(la.service.handle(req, 8).release, Release::Now);
    }
}

/// A new leader does not count the tail it received as committed: it
/// appends an empty entry of its term, and its answers wait for that
/// entry, which commits once its required standbys hold the whole log.
#[test]
fn a_new_leader_commits_its_tail_with_an_entry_of_its_term() {
    let [(la, ra), (lb, rb), (lc, rc)] = three();
    let cfg = ReplicaPolicy::default();
    la.service.put_start(1, "k", 100, &cfg, false, 3).unwrap();
    la.service.put_end(1, "k", 4).unwrap();
    let seq = ra.status().last_seq;
    // C receives the put; B does not; neither hears of its commit.
    let (term, committed, frames) = pull(&ra, &rc, 5);
    assert!(committed < seq);
    receive(&lc, &rc, term, committed, &frames).unwrap();

    rc.new_leader();
    apply_up_to(&lc, &rc, u64::MAX).unwrap();
    let rec = rc.promote(9, "c:1", Some(&a_record()), 10);
    rc.record_done(rec, true);
    let st = rc.status();
    assert_eq!(st.last_seq, seq + 1, "an entry of its own");
    assert_eq!(rc.term_of(seq + 1), Some(9));
    assert!(st.committed_seq < seq, "the tail is not committed yet");
    // A get of the put in the tail waits for the new entry.
    let get = || Request::GetReplicaList { key: "k" };
    assert_eq!(
        lc.service.handle(get(), 11).release,
        Release::Committed(seq + 1)
    );

    // B follows C and takes the tail with the new entry.
    rb.new_leader();
    for now in [12, 13, 14] {
        let (term, committed, frames) = pull(&rc, &rb, now);
        receive(&lb, &rb, term, committed, &frames).unwrap();
    }
    rc.wait_committed(seq + 1).unwrap();
    assert_eq!(lc.service.handle(get(), 15).release, Release::Now);
    assert!(lb.service.exist_key("k", 15).unwrap(), "B holds the put");
}

/// A leader deposed without knowing it, its standbys gone to the new
/// leader: a read of state resting on an entry they never took waits for
/// a commit that does not come, and is refused as not leading (the client
/// looks the leader up) as soon as the leader learns it is deposed.
#[test]
fn a_deposed_leaders_read_of_uncommitted_state_is_refused_as_not_leading() {
    let [(la, ra), ..] = three();
    let cfg = ReplicaPolicy::default();
    la.service.put_start(1, "k", 100, &cfg, false, 3).unwrap();
    la.service.remove("k", true, 4).unwrap();
    let last = ra.status().last_seq;
    let get = la.service.handle(Request::ExistKey { key: "k" }, 5);
    assert_eq!(get.release, Release::Committed(last));
    let waiting = {
        let ra = ra.clone();
        std::thread::spawn(move || ra.wait_committed(last))
    };
    ra.depose();
    let refused = waiting.join().unwrap().unwrap_err();
    assert_eq!(refused.code, ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
}
