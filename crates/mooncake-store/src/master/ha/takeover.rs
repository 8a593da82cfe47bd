//! Whether a master that just won the election may take over, from the
//! replication record and what this master has seen: kept apart from the
//! election loop (`failover.rs`) so that it is decided without processes
//! or a clock.
//!
//! - A record naming this master (leader or in-sync standby): take over.
//! - A record that does not: step aside, and take over anyway only once no
//!   member has led for [`Gate`]'s `after` since this master first stepped
//!   aside under that record's leader. A record written by a later leader
//!   (someone led meanwhile) starts that wait again.
//! - No record, or a win whose term is not above every term this master
//!   has seen: the coordination service lost its state (a redis flushed or
//!   restarted without persistence, a deleted Lease) and cannot say who
//!   holds what. Only a master that has seen nothing (a new cluster: no
//!   leader followed, no log) takes over; any other steps aside, unless
//!   `--ha_allow_takeover_without_record` says to take over anyway.

use std::time::{Duration, Instant};

use crate::master::replication::in_sync::Record;

/// What a master knows on winning.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Win<'a> {
    /// The replication record read after winning (`None`: none, or not one).
    pub(crate) record: Option<&'a Record>,
    /// The term of the election just won.
    pub(crate) term: u64,
    /// The highest term this master has followed, led or restored entries
    /// of; with `last_seq`, 0 only for a master that never saw a leader.
    pub(crate) seen_term: u64,
    /// This master's last log entry.
    pub(crate) last_seq: u64,
}

/// What to do with a win.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Take over: this master holds every committed entry, or nothing was
    /// ever committed.
    Take,
    /// Take over though entries only other masters held may be lost.
    Unclean(String),
    /// Step aside (resign) and campaign again.
    Aside(String),
    /// Step aside, as long as the coordination service lacks what it lost.
    Refuse(String),
}

/// The takeover decision of one master across its wins.
#[derive(Debug)]
pub(crate) struct Gate {
    member: String,
    allow_without_record: bool,
    after: Duration,
    /// The term of the record this master stepped aside under, outside its
    /// set, and when it first did.
    aside: Option<(u64, Instant)>,
}

impl Gate {
    pub(crate) fn new(member: &str, allow_without_record: bool, after: Duration) -> Gate {
        Gate {
            member: member.to_string(),
            allow_without_record,
            after,
            aside: None,
        }
    }

    pub(crate) fn decide(&mut self, win: &Win<'_>, now: Instant) -> Verdict {
        let seen_any = win.seen_term > 0 || win.last_seq > 0;
        let Some(record) = win.record else {
            self.aside = None;
            if !seen_any {
                return Verdict::Take;
            }
            return self.without_record(format!(
                "no replication record, though this master has seen term {} and holds {} entries",
                win.seen_term, win.last_seq
            ));
        };
        if seen_any && win.term <= win.seen_term {
            // Terms only grow: this one was counted again from an earlier
            // value, so it no longer orders leaders and cannot fence them.
            self.aside = None;
            return self.without_record(format!(
                "won term {}, not above term {} already seen: the election's term went back",
                win.term, win.seen_term
            ));
        }
        if record.holds_all(&self.member) {
            self.aside = None;
            return Verdict::Take;
        }
        let since = match self.aside {
            Some((term, since)) if term == record.term => since,
            // First aside, or a later leader recorded since: wait again.
            _ => {
                self.aside = Some((record.term, now));
                now
            }
        };
        if now.saturating_duration_since(since) < self.after {
            return Verdict::Aside(format!(
                "not in the in-sync set of term {}: stepping aside",
                record.term
            ));
        }
        Verdict::Unclean(format!(
            "no member of the in-sync set of term {} took over within {:?}",
            record.term, self.after
        ))
    }

    fn without_record(&self, why: String) -> Verdict {
        if self.allow_without_record {
            Verdict::Unclean(format!("{why}; --ha_allow_takeover_without_record"))
        } else {
            Verdict::Refuse(format!(
                "{why}: not taking over (restart one master with --ha_allow_takeover_without_record to accept losing what only the others hold)"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(10);

    fn record(term: u64, leader: &str, standbys: &[&str]) -> Record {
        Record {
            term,
            leader: leader.to_string(),
            standbys: standbys.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn win(record: Option<&Record>, term: u64, seen_term: u64, last_seq: u64) -> Win<'_> {
        Win {
            record,
            term,
            seen_term,
            last_seq,
        }
    }

    fn is_aside(v: &Verdict) -> bool {
        matches!(v, Verdict::Aside(_))
    }

    fn is_refused(v: &Verdict) -> bool {
        matches!(v, Verdict::Refuse(_))
    }

    #[test]
    fn a_member_of_the_set_takes_over() {
        let mut g = Gate::new("b", false, AFTER);
        let r = record(3, "a", &["b", "c"]);
        assert_eq!(
            g.decide(&win(Some(&r), 4, 3, 10), Instant::now()),
            Verdict::Take
        );
        let led = record(3, "b", &[]);
        assert_eq!(
            g.decide(&win(Some(&led), 4, 3, 10), Instant::now()),
            Verdict::Take
        );
    }

    #[test]
    fn a_non_member_waits_then_takes_over_uncleanly() {
        let t0 = Instant::now();
        let mut g = Gate::new("b", false, AFTER);
        let r = record(3, "a", &["c"]);
        assert!(is_aside(&g.decide(&win(Some(&r), 4, 3, 10), t0)));
        assert!(is_aside(&g.decide(
            &win(Some(&r), 5, 3, 10),
            t0 + AFTER - Duration::from_millis(1)
        )));
        assert!(matches!(
            g.decide(&win(Some(&r), 6, 3, 10), t0 + AFTER),
            Verdict::Unclean(_)
        ));
    }

    /// Stepped aside once; a member then led (its record has a later
    /// term); a later win outside the set must wait again, not take over
    /// at once on the old stepping aside.
    #[test]
    fn a_member_seen_leading_restarts_the_wait() {
        let t0 = Instant::now();
        let mut g = Gate::new("b", false, AFTER);
        let first = record(3, "a", &["c"]);
        assert!(is_aside(&g.decide(&win(Some(&first), 4, 3, 10), t0)));
        // "c" took over (term 5) and led for a minute; it died, "b" wins.
        let later = record(5, "c", &["a"]);
        let t1 = t0 + Duration::from_secs(60);
        assert!(is_aside(&g.decide(&win(Some(&later), 6, 5, 90), t1)));
        assert!(is_aside(
            &g.decide(&win(Some(&later), 7, 5, 90), t1 + AFTER / 2)
        ));
        assert!(matches!(
            g.decide(&win(Some(&later), 8, 5, 90), t1 + AFTER),
            Verdict::Unclean(_)
        ));
    }

    /// Back in the set in between: a later stepping aside starts afresh.
    #[test]
    fn rejoining_the_set_restarts_the_wait() {
        let t0 = Instant::now();
        let mut g = Gate::new("b", false, AFTER);
        let out = record(3, "a", &["c"]);
        assert!(is_aside(&g.decide(&win(Some(&out), 4, 3, 10), t0)));
        let member = record(3, "a", &["b", "c"]);
        assert_eq!(g.decide(&win(Some(&member), 5, 3, 10), t0), Verdict::Take);
        let t1 = t0 + Duration::from_secs(60);
        assert!(is_aside(&g.decide(&win(Some(&out), 6, 3, 10), t1)));
    }

    #[test]
    fn a_new_cluster_starts_without_a_record() {
        let mut g = Gate::new("a", false, AFTER);
        assert_eq!(g.decide(&win(None, 1, 0, 0), Instant::now()), Verdict::Take);
        // The Lease stand-in counts its first holder's term from 0.
        assert_eq!(g.decide(&win(None, 0, 0, 0), Instant::now()), Verdict::Take);
    }

    /// The record gone (redis flushed, a deleted Lease) while this master
    /// has followed a leader: no takeover unless forced.
    #[test]
    fn a_missing_record_is_no_licence() {
        let mut g = Gate::new("b", false, AFTER);
        assert!(is_refused(&g.decide(&win(None, 9, 3, 0), Instant::now())));
        assert!(is_refused(&g.decide(&win(None, 9, 0, 12), Instant::now())));
        // Not after any wait either.
        let later = Instant::now() + Duration::from_secs(3600);
        assert!(is_refused(&g.decide(&win(None, 9, 3, 12), later)));
        let mut forced = Gate::new("b", true, AFTER);
        assert!(matches!(
            forced.decide(&win(None, 9, 3, 12), Instant::now()),
            Verdict::Unclean(_)
        ));
    }

    /// A term counter reset (redis without persistence): the new win's
    /// term is not above what this master followed, even with a record.
    #[test]
    fn a_term_that_went_back_is_no_licence() {
        let mut g = Gate::new("b", false, AFTER);
        let r = record(2, "b", &[]);
        assert!(is_refused(
            &g.decide(&win(Some(&r), 3, 7, 40), Instant::now())
        ));
        assert!(is_refused(
            &g.decide(&win(Some(&r), 7, 7, 40), Instant::now())
        ));
        assert_eq!(
            g.decide(&win(Some(&r), 8, 7, 40), Instant::now()),
            Verdict::Take
        );
        let mut forced = Gate::new("b", true, AFTER);
        assert!(matches!(
            forced.decide(&win(Some(&r), 3, 7, 40), Instant::now()),
            Verdict::Unclean(_)
        ));
    }
}
