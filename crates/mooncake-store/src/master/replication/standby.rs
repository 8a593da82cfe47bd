//! A standby's bookkeeping of the entries it pulls: what to ask for next,
//! keeping what a leader sends, and which kept entry to apply next. The
//! follower thread (`master::ha::follower`) drives it.

use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};

use std::sync::atomic::Ordering;

use super::{Replication, Role, State};

/// What a standby asks for next.
pub(crate) struct Pull {
    pub(crate) after: u64,
    pub(crate) after_term: u64,
    pub(crate) applied: u64,
    pub(crate) max: u32,
    pub(crate) wait_ms: u32,
}

impl Replication {
    pub(crate) fn pull_request(&self, max: u32, wait: Duration) -> Pull {
        let st = self.state.lock();
        let after = st
            .verify
            .map_or(st.log.last(), |v| v.clamp(st.log.base(), st.log.last()));
        Pull {
            after,
            after_term: st.log.term_at(after).unwrap_or(0),
            // What it knows committed (and applies next): a leader holds
            // the pull until it can say more than that.
            applied: st.committed.min(st.log.last()).max(st.applied),
            max,
            wait_ms: wait.as_millis().min(u32::MAX as u128) as u32,
        }
    }

    /// Whether the follower holds a connection to the leader.
    pub(crate) fn set_connected(&self, connected: bool) {
        self.state.lock().following = connected;
    }

    /// A new leader: the entries received but not applied are kept, but
    /// checked against its log before anything more is kept. They may
    /// hold committed entries this master has not heard were committed
    /// (the commit point travels with the next answer), and this master
    /// may yet lead, if the one it sees leading does not hold on.
    pub(crate) fn new_leader(&self) {
        let mut st = self.state.lock();
        st.following = false;
        // Known committed, so in the log of every leader that may lead.
        let sure = st.committed.min(st.log.last()).max(st.applied);
        st.verify = Some(sure);
    }

    /// The leader refused the log from the point being checked: check it
    /// again from what is applied.
    pub(crate) fn refused_log(&self) {
        let mut st = self.state.lock();
        st.verify = Some(st.applied);
    }

    /// Writes the entries kept so far to this master's disk log (before
    /// they are acknowledged).
    pub(crate) fn write_kept(&self) -> Result<()> {
        let Some(d) = self.disk.get() else {
            return Ok(());
        };
        let last = self.state.lock().log.last();
        d.write_through(last)
    }

    /// Entry `seq` (of `term`) read back from this master's disk log at
    /// start: kept, and applied (`applied`, by the caller) when it is
    /// known committed. The rest is checked against the first leader's
    /// log, as after any change of leader.
    pub(crate) fn restored_entry(&self, seq: u64, term: u64, frame: Vec<u8>, applied: bool) {
        let mut st = self.state.lock();
        debug_assert_eq!(seq, st.log.last() + 1);
        st.log.push(term, frame);
        st.term = st.term.max(term);
        if applied {
            st.applied = seq;
            st.committed = st.committed.max(seq);
        }
        self.last_hint.store(seq, Ordering::Release);
    }

    /// Keeps entries `(seq, term, frame)` from the leader of `term`, which
    /// has committed up to `committed`; returns up to where to apply.
    pub(crate) fn keep(
        &self,
        term: u64,
        committed: u64,
        batch: Vec<(u64, u64, Vec<u8>)>,
    ) -> Result<u64> {
        let mut st = self.state.lock();
        if st.role != Role::Standby {
            return Ok(st.applied);
        }
        if term < st.term {
            // A deposed leader still answering: the election names the next.
            return Ok(st.applied);
        }
        st.term = term;
        st.following = true;
        let reached = batch.last().map(|e| e.0);
        for (seq, entry_term, frame) in batch {
            if st.verify.is_some() && seq <= st.log.last() {
                if st.log.term_at(seq) == Some(entry_term) {
                    // The entry held here: a term's entries come from its
                    // one leader, in order.
                    continue;
                }
                self.cut_after(&mut st, seq - 1)?;
            }
            if seq != st.log.last() + 1 || entry_term > term {
                return Err(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("entry {seq} of term {entry_term} after {}", st.log.last()),
                ));
            }
            if let Some(d) = self.disk.get() {
                d.append(seq, &frame);
            }
            st.log.push(entry_term, frame);
        }
        if let Some(from) = st.verify {
            let reached = reached.unwrap_or(from);
            if reached >= st.log.last() {
                st.verify = None;
            } else if reached == from {
                // The leader's log ends here: the rest was never committed.
                self.cut_after(&mut st, from)?;
                st.verify = None;
            } else {
                st.verify = Some(reached);
            }
        }
        st.committed = st.committed.max(committed);
        if let Some(d) = self.disk.get() {
            d.note_committed(st.committed);
        }
        Ok(st.committed.min(st.log.last()))
    }

    /// Drops the entries after `seq`, which the leader does not hold.
    fn cut_after(&self, st: &mut State, seq: u64) -> Result<()> {
        if seq < st.applied {
            return Err(Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!(
                    "the leader's log differs at entry {}, applied here",
                    seq + 1
                ),
            ));
        }
        st.log.truncate_after(seq);
        match self.disk.get() {
            Some(d) => d.truncate_after(seq),
            None => Ok(()),
        }
    }

    /// The next kept entry to apply, if it is at most `target`.
    pub(crate) fn next_to_apply(&self, target: u64) -> Option<(u64, Vec<u8>)> {
        let st = self.state.lock();
        let seq = st.applied + 1;
        if seq > target {
            return None;
        }
        st.log.frame(seq).map(|f| (seq, f.to_vec()))
    }

    pub(crate) fn applied_to(&self, seq: u64) {
        let mut st = self.state.lock();
        st.applied = st.applied.max(seq);
    }
}
