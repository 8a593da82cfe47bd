//! When an entry is committed, and who may take over: the in-sync replica
//! set. Pure logic (no sockets, no clock: times are arguments).
//!
//! The leader commits an entry once every standby of its *required* set
//! has it. The set is also *recorded* in the coordination service, under
//! the leader's term, and only a recorded member may be promoted. The two
//! move so that every recorded member holds every committed entry:
//!
//! - a standby joins the required set once it has every entry, *before*
//!   it is recorded (it only adds acknowledgements to wait for);
//! - a standby that stopped answering leaves the required set only once a
//!   record without it is written (a write a deposed leader cannot make);
//! - a standby that reports less than it reported before (it restarted
//!   and its log lost what the page cache held) is believed: it is counted
//!   for what it holds now, and leaves the record as a silent one does
//!   until it has caught up again.
//!
//! One record write is in flight at a time; the required set does not
//! change meanwhile, except by the write's own additions.
//!
//! With a minimum of members (`--ha_min_in_sync`, the leader included),
//! nothing commits while the record holds fewer: writes wait until enough
//! standbys are recorded again, instead of resting on too few copies.
//!
//! Silence is timed from what the leader could observe: when its own look
//! at the standbys comes late (the process was paused, or starved), the
//! lateness is not charged to them, or a leader stopped for longer than
//! the lag limit would drop every healthy standby as it resumes.

use std::collections::{BTreeMap, BTreeSet};

/// A standby as the leader sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Standby {
    /// Highest sequence number it has.
    acked: u64,
    /// When it last asked for entries (ms).
    heard_at: u64,
    /// Its connection closed: silent, whatever the time says.
    gone: bool,
    /// It has asked for entries (an inherited member has not yet).
    heard: bool,
    /// It reported less than before and has not caught up since: it may
    /// lack committed entries, so it must not stay recorded.
    lost: bool,
    /// The leader's lateness summed (`InSync::late`) when it was heard.
    late_at: u64,
}

impl Standby {
    /// How long it has been silent while the leader was looking, with
    /// `late` the leader's lateness summed so far.
    fn silence(&self, now: u64, late: u64) -> u64 {
        now.saturating_sub(self.heard_at)
            .saturating_sub(late.saturating_sub(self.late_at))
    }

    fn unheard(now: u64, late: u64) -> Standby {
        Standby {
            acked: 0,
            heard_at: now,
            gone: false,
            heard: false,
            lost: false,
            late_at: late,
        }
    }
}

/// The leader's view of its replica set.
#[derive(Debug)]
pub(crate) struct InSync {
    last: u64,
    committed: u64,
    standbys: BTreeMap<String, Standby>,
    required: BTreeSet<String>,
    recorded: BTreeSet<String>,
    writing: Option<BTreeSet<String>>,
    /// A required standby silent for longer than this is dropped (ms).
    lag_limit: u64,
    /// Members (the leader included) that must be recorded for anything
    /// to commit.
    min_members: usize,
    /// When the leader last looked at its standbys (ms).
    looked_at: u64,
    /// How late its looks came, summed (ms): not charged to the standbys.
    late: u64,
}

impl InSync {
    /// A leader whose log ends at `last`, all of it committed unless
    /// [`InSync::committed_at`] says less, with `recorded`
    /// the standbys of the record it inherits (itself and the previous
    /// leader left out: the first record it writes drops them). They stay
    /// required until they ask for entries or `lag_limit` after `now`.
    pub(crate) fn new(last: u64, recorded: BTreeSet<String>, lag_limit: u64, now: u64) -> InSync {
        let standbys = recorded
            .iter()
            .map(|id| (id.clone(), Standby::unheard(now, 0)))
            .collect();
        InSync {
            last,
            committed: last,
            standbys,
            required: recorded.clone(),
            recorded,
            writing: None,
            lag_limit,
            min_members: 1,
            looked_at: now,
            late: 0,
        }
    }

    /// Only the entries up to `c` are known committed (the rest of the
    /// leader's log is a tail it received and commits with its own).
    pub(crate) fn committed_at(mut self, c: u64) -> InSync {
        self.committed = c.min(self.last);
        self
    }

    /// Nothing commits while fewer than `n` members (the leader included)
    /// are recorded.
    pub(crate) fn min_members(mut self, n: usize) -> InSync {
        self.min_members = n.max(1);
        self
    }

    /// Whether enough members are recorded for entries to commit.
    pub(crate) fn enough(&self) -> bool {
        self.recorded.len() + 1 >= self.min_members
    }

    /// The leader looks at its standbys at `now` (each tick of its loop):
    /// a look later than a quarter of the lag limit after the last one
    /// means the leader itself stood still; the excess is not silence of
    /// theirs.
    fn look(&mut self, now: u64) {
        let gap = now.saturating_sub(self.looked_at);
        self.late += gap.saturating_sub(self.lag_limit / 4);
        self.looked_at = self.looked_at.max(now);
    }

    pub(crate) fn committed(&self) -> u64 {
        self.committed
    }

    /// The standbys whose acknowledgement a commit waits for.
    pub(crate) fn required(&self) -> &BTreeSet<String> {
        &self.required
    }

    /// The standbys of the last record written.
    pub(crate) fn recorded(&self) -> &BTreeSet<String> {
        &self.recorded
    }

    /// Each known standby and how many entries it lacks.
    pub(crate) fn lags(&self) -> impl Iterator<Item = (&str, u64)> {
        self.standbys
            .iter()
            .map(|(id, s)| (id.as_str(), self.last.saturating_sub(s.acked)))
    }

    /// The lowest entry a standby it hears from has acknowledged: the log
    /// must still hold what follows it.
    pub(crate) fn min_acked(&self) -> Option<u64> {
        self.standbys.values().map(|s| s.acked).min()
    }

    /// The leader appended entries up to `seq`.
    pub(crate) fn appended(&mut self, seq: u64) {
        self.last = self.last.max(seq);
        self.recompute();
    }

    /// `standby` has every entry up to `seq` (it asked for the next ones)
    /// at `now`. Returns whether the commit point moved.
    pub(crate) fn acked(&mut self, standby: &str, seq: u64, now: u64) -> bool {
        let seq = seq.min(self.last);
        let s = self
            .standbys
            .entry(standby.to_string())
            .or_insert(Standby::unheard(now, self.late));
        // Pulls on a connection only go forward: less than before is a
        // standby that restarted without entries it had, and what it
        // holds now is the truth.
        if s.heard && seq < s.acked {
            s.lost = true;
        }
        if seq >= self.last {
            s.lost = false;
        }
        s.acked = seq;
        s.heard = true;
        s.heard_at = now;
        s.late_at = self.late;
        s.gone = false;
        let before = self.committed;
        self.recompute();
        self.committed != before
    }

    /// `standby`'s connection closed.
    pub(crate) fn gone(&mut self, standby: &str) {
        if let Some(s) = self.standbys.get_mut(standby) {
            s.gone = true;
        }
    }

    fn recompute(&mut self) {
        let floor = self
            .required
            .iter()
            .map(|id| self.standbys.get(id).map_or(0, |s| s.acked))
            .min()
            .unwrap_or(self.last);
        if !self.enough() {
            return;
        }
        // Never backwards: a required standby that restarted without
        // entries it had still leaves every committed one with the leader,
        // and it leaves the record at the next write.
        self.committed = self.committed.max(floor.min(self.last));
    }

    /// The record to write next at `now`, if it should change and no write
    /// is in flight: caught-up standbys join, silent ones leave. Its
    /// additions join the required set at once.
    pub(crate) fn next_record(&mut self, now: u64) -> Option<BTreeSet<String>> {
        if self.writing.is_some() {
            return None;
        }
        let (late, limit) = (self.late, self.lag_limit);
        let alive = |s: &Standby| !s.gone && s.silence(now, late) <= limit;
        let mut want: BTreeSet<String> = self
            .required
            .iter()
            .filter(|id| self.standbys.get(*id).is_some_and(|s| alive(s) && !s.lost))
            .cloned()
            .collect();
        for (id, s) in &self.standbys {
            if s.acked >= self.last && alive(s) {
                want.insert(id.clone());
            }
        }
        if want == self.recorded && want == self.required {
            return None;
        }
        self.required.extend(want.iter().cloned());
        self.writing = Some(want.clone());
        self.recompute();
        Some(want)
    }

    /// The record `set` was written: it is the required set now.
    pub(crate) fn written(&mut self, set: BTreeSet<String>) {
        self.writing = None;
        self.required = set.clone();
        self.recorded = set;
        self.recompute();
    }

    /// The write failed: the required set stays as it is (additions
    /// included) until a later write.
    pub(crate) fn write_failed(&mut self) {
        self.writing = None;
    }

    /// The leader's look at its standbys, at each tick of its loop (before
    /// [`InSync::next_record`]): forgets standbys silent since long (lag
    /// limit × 10) and not required, and notes how late the look comes.
    pub(crate) fn forget_silent(&mut self, now: u64) {
        self.look(now);
        let (late, limit) = (self.late, self.lag_limit.saturating_mul(10));
        let required = &self.required;
        self.standbys
            .retain(|id, s| required.contains(id) || s.silence(now, late) <= limit);
    }
}

/// The replication record, as kept in the coordination service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) term: u64,
    /// The leader that wrote it.
    pub(crate) leader: String,
    /// Standbys holding every committed entry (besides the leader).
    pub(crate) standbys: BTreeSet<String>,
}

impl Record {
    pub(crate) fn encode(&self) -> String {
        let mut s = format!("term={}\nleader={}\n", self.term, self.leader);
        for m in &self.standbys {
            s.push_str("standby=");
            s.push_str(m);
            s.push('\n');
        }
        s
    }

    pub(crate) fn parse(s: &str) -> Option<Record> {
        let mut term = None;
        let mut leader = None;
        let mut standbys = BTreeSet::new();
        for line in s.lines().filter(|l| !l.is_empty()) {
            let (k, v) = line.split_once('=')?;
            match k {
                "term" => term = Some(v.parse().ok()?),
                "leader" => leader = Some(v.to_string()),
                "standby" => {
                    standbys.insert(v.to_string());
                }
                _ => return None,
            }
        }
        Some(Record {
            term: term?,
            leader: leader?,
            standbys,
        })
    }

    /// Whether `member` holds every entry this record's leader committed.
    pub(crate) fn holds_all(&self, member: &str) -> bool {
        self.leader == member || self.standbys.contains(member)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn alone_commits_at_once() {
        let mut s = InSync::new(0, set(&[]), 1000, 0);
        s.appended(3);
        assert_eq!(s.committed(), 3);
    }

    #[test]
    fn a_caught_up_standby_is_required_before_it_is_recorded() {
        let mut s = InSync::new(0, set(&[]), 1000, 0);
        s.appended(2);
        assert!(!s.acked("b", 1, 0));
        assert_eq!(s.next_record(0), None, "b lacks entry 2");
        s.acked("b", 2, 10);
        let want = s.next_record(10).unwrap();
        assert_eq!(want, set(&["b"]));
        // Required from now: the next entry waits for b.
        s.appended(3);
        assert_eq!(s.committed(), 2);
        assert!(s.recorded().is_empty());
        s.written(want);
        assert_eq!(s.recorded(), &set(&["b"]));
        assert!(s.acked("b", 3, 20));
        assert_eq!(s.committed(), 3);
    }

    #[test]
    fn a_silent_standby_leaves_only_once_recorded() {
        let mut s = InSync::new(5, set(&["b", "c"]), 1000, 0);
        s.acked("b", 5, 0);
        s.acked("c", 5, 0);
        s.appended(6);
        s.acked("b", 6, 500);
        assert_eq!(s.committed(), 5, "c has not got 6");
        assert_eq!(s.next_record(900), None, "c is within the lag limit");
        let want = s.next_record(1500).unwrap();
        assert_eq!(want, set(&["b"]));
        assert_eq!(s.committed(), 5, "c stays required while the write runs");
        s.write_failed();
        assert_eq!(s.committed(), 5, "a failed write drops nobody");
        s.acked("b", 6, 1550);
        let want = s.next_record(1600).unwrap();
        s.written(want);
        assert_eq!(s.committed(), 6);
    }

    #[test]
    fn an_inherited_member_that_never_comes_blocks_until_recorded_out() {
        let mut s = InSync::new(4, set(&["c"]), 1000, 0);
        s.appended(5);
        assert_eq!(s.committed(), 4);
        assert_eq!(s.next_record(1000), None, "c may still come");
        let want = s.next_record(1001).unwrap();
        assert!(want.is_empty());
        s.written(want);
        assert_eq!(s.committed(), 5);
    }

    #[test]
    fn a_closed_connection_counts_as_silent_at_once() {
        let mut s = InSync::new(1, set(&["b"]), 1000, 0);
        s.acked("b", 1, 5);
        s.appended(2);
        s.gone("b");
        let want = s.next_record(6).unwrap();
        assert!(want.is_empty());
        s.written(want);
        assert_eq!(s.committed(), 2);
        s.acked("b", 2, 7);
        assert_eq!(s.next_record(7), Some(set(&["b"])), "back and caught up");
    }

    #[test]
    fn commit_never_goes_back() {
        let mut s = InSync::new(0, set(&[]), 1000, 0);
        s.appended(4);
        s.acked("b", 4, 0);
        let want = s.next_record(0).unwrap();
        s.written(want);
        s.acked("b", 0, 1);
        assert_eq!(s.committed(), 4);
    }

    /// A recorded standby restarts from its log within the lag limit,
    /// having lost entries its page cache held: it is counted for what it
    /// holds, leaves the record, and comes back once caught up.
    #[test]
    fn a_standby_back_with_less_is_counted_for_what_it_holds() {
        let mut s = InSync::new(0, set(&[]), 1000, 0);
        s.appended(5);
        s.acked("b", 5, 0);
        let want = s.next_record(0).unwrap();
        s.written(want);
        assert_eq!(s.committed(), 5);
        s.gone("b");
        // Back at once, before any record without it: its log ends at 2.
        s.acked("b", 2, 100);
        assert_eq!(s.lags().collect::<Vec<_>>(), [("b", 3)]);
        assert_eq!(s.min_acked(), Some(2), "the log keeps what b lacks");
        s.appended(6);
        assert_eq!(s.committed(), 5, "b is still required and lacks 6");
        let want = s.next_record(100).unwrap();
        assert!(want.is_empty(), "b lacks committed entries: {want:?}");
        s.written(want);
        assert_eq!(s.committed(), 6);
        s.acked("b", 4, 120);
        assert_eq!(s.next_record(120), None, "not caught up yet");
        s.acked("b", 6, 140);
        assert_eq!(s.next_record(140), Some(set(&["b"])), "caught up, back in");
    }

    #[test]
    fn an_inherited_member_lagging_at_its_first_pull_stays() {
        let mut s = InSync::new(5, set(&["b"]), 1000, 0);
        s.acked("b", 3, 10);
        assert_eq!(s.next_record(10), None, "b has said nothing lower before");
        s.acked("b", 5, 20);
        s.appended(6);
        s.acked("b", 6, 30);
        assert_eq!(s.committed(), 6);
    }

    /// With a minimum of two members, a leader alone commits nothing; a
    /// standby recorded again releases what waited.
    #[test]
    fn below_the_minimum_nothing_commits() {
        let mut s = InSync::new(0, set(&[]), 1000, 0).min_members(2);
        s.appended(3);
        assert_eq!(s.committed(), 0, "the leader alone is one copy");
        s.acked("b", 3, 10);
        let want = s.next_record(10).unwrap();
        assert_eq!(s.committed(), 0, "b is not recorded yet");
        s.written(want);
        assert_eq!(s.committed(), 3);
        // b goes silent: dropped from the record, and writes wait again.
        s.appended(4);
        let want = s.next_record(1100).unwrap();
        assert!(want.is_empty());
        s.written(want);
        assert_eq!(s.committed(), 3);
        s.appended(5);
        assert_eq!(s.committed(), 3);
        s.acked("b", 5, 1200);
        let want = s.next_record(1200).unwrap();
        s.written(want);
        assert_eq!(s.committed(), 5);
        // The default, one member: the leader alone commits.
        let mut s = InSync::new(0, set(&[]), 1000, 0).min_members(1);
        s.appended(1);
        assert_eq!(s.committed(), 1);
    }

    /// The leader stood still for 2.5 s (longer than the lag limit): its
    /// standby, heard just before, is not dropped as the leader resumes;
    /// silent from then on, it is dropped once the leader has looked for
    /// about the lag limit (a quarter of it charged for the pause itself).
    #[test]
    fn a_pause_of_the_leader_is_not_silence_of_its_standbys() {
        let mut s = InSync::new(5, set(&[]), 1000, 0);
        s.acked("b", 5, 0);
        let want = s.next_record(0).unwrap();
        s.written(want);
        let mut now = 0;
        while now < 100 {
            now += 20;
            s.forget_silent(now);
            assert_eq!(s.next_record(now), None);
        }
        now += 2500;
        s.forget_silent(now);
        assert_eq!(
            s.next_record(now),
            None,
            "b was heard 100 ms of looking ago"
        );
        let resumed = now;
        while now < resumed + 500 {
            now += 20;
            s.forget_silent(now);
            assert_eq!(s.next_record(now), None, "b silent {} ms", now - resumed);
        }
        let mut dropped = None;
        while dropped.is_none() && now < resumed + 2000 {
            now += 20;
            s.forget_silent(now);
            dropped = s.next_record(now);
        }
        assert_eq!(dropped, Some(set(&[])));
        assert!(now - resumed <= 1000, "dropped {} ms after", now - resumed);
    }

    /// Looks that come a little late (up to a quarter of the lag limit)
    /// are not a pause: a silent standby is dropped on time.
    #[test]
    fn looks_a_little_late_still_drop_on_time() {
        let mut s = InSync::new(5, set(&[]), 1000, 0);
        s.acked("b", 5, 0);
        let want = s.next_record(0).unwrap();
        s.written(want);
        for now in [240, 480, 720, 960] {
            s.forget_silent(now);
            assert_eq!(s.next_record(now), None);
        }
        s.forget_silent(1200);
        assert_eq!(s.next_record(1200), Some(set(&[])));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Append(u64),
        /// Standby `i` receives up to `n` more entries and asks for more.
        Ack(usize, u64),
        Gone(usize),
        /// Time passes, then the leader looks at its record.
        Record(u64),
        Written,
        WriteFailed,
        Forget,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (1..4u64).prop_map(Op::Append),
            (0..3usize, 0..4u64).prop_map(|(i, n)| Op::Ack(i, n)),
            (0..3usize).prop_map(Op::Gone),
            (0..1500u64).prop_map(Op::Record),
            Just(Op::Written),
            Just(Op::WriteFailed),
            Just(Op::Forget),
        ]
    }

    proptest::proptest! {
        /// Whatever the standbys do and whichever record writes succeed,
        /// every standby the leader waits for, and so every recorded one
        /// (the only ones that may be promoted), holds every committed
        /// entry: a new leader needs no "longest log" choice among them.
        #[test]
        fn every_recorded_standby_holds_every_committed_entry(
            ops in proptest::collection::vec(op(), 1..200),
            min in 1..4usize,
        ) {
            let ids = ["b", "c", "d"];
            let mut held = [0u64; 3];
            let (mut last, mut now) = (0u64, 0u64);
            let mut s = InSync::new(0, set(&[]), 1000, 0).min_members(min);
            let mut writing = None;
            let mut was = 0;
            for op in ops {
                match op {
                    Op::Append(n) => {
                        last += n;
                        s.appended(last);
                    }
                    Op::Ack(i, n) => {
                        held[i] = (held[i] + n).min(last);
                        s.acked(ids[i], held[i], now);
                    }
                    Op::Gone(i) => s.gone(ids[i]),
                    Op::Record(dt) => {
                        now += dt;
                        if let Some(want) = s.next_record(now) {
                            writing = Some(want);
                        }
                    }
                    Op::Written => {
                        if let Some(w) = writing.take() {
                            s.written(w);
                        }
                    }
                    Op::WriteFailed => {
                        if writing.take().is_some() {
                            s.write_failed();
                        }
                    }
                    Op::Forget => s.forget_silent(now),
                }
                let c = s.committed();
                proptest::prop_assert!(
                    c == 0 || s.recorded().len() + 1 >= min || was == c,
                    "committed {c} with {} recorded of {min}", s.recorded().len()
                );
                was = c;
                proptest::prop_assert!(c <= last);
                for (i, id) in ids.iter().enumerate() {
                    if s.required().contains(*id) || s.recorded().contains(*id) {
                        proptest::prop_assert!(
                            held[i] >= c,
                            "{id} holds {} of {c} committed", held[i]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn record_round_trip() {
        let r = Record {
            term: 7,
            leader: "a:1#x".into(),
            standbys: set(&["b:1#y", "c:1#z"]),
        };
        assert_eq!(Record::parse(&r.encode()), Some(r.clone()));
        assert!(r.holds_all("a:1#x") && r.holds_all("c:1#z") && !r.holds_all("d"));
        assert_eq!(Record::parse("term=x\nleader=a\n"), None);
        assert_eq!(Record::parse("leader=a\n"), None);
        assert_eq!(Record::parse("term=1\nleader=a\nwhat=b\n"), None);
    }
}
