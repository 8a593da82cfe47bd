//! A standby's bookkeeping of the entries it pulls: what to ask for next,
//! keeping what a leader sends, and which kept entry to apply next. The
//! follower thread (`master::follower`) drives it.

use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};

use std::sync::atomic::Ordering;

use super::{Replication, Role};

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
        Pull {
            after: st.log.last(),
            after_term: st.log.last_term(),
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

    /// A new leader: entries received but not applied go (the new leader
    /// resends those it has).
    pub(crate) fn drop_unapplied(&self) -> Result<()> {
        let mut st = self.state.lock();
        st.following = false;
        if std::mem::take(&mut st.keep_tail) {
            // Read back from disk at start: kept unless the leader's log
            // refuses them (then this is called again).
            return Ok(());
        }
        let applied = st.applied;
        if st.log.last() <= applied {
            return Ok(());
        }
        st.log.truncate_after(applied);
        match self.disk.get() {
            Some(d) => d.truncate_after(applied),
            None => Ok(()),
        }
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
    /// known committed.
    pub(crate) fn restored_entry(&self, seq: u64, term: u64, frame: Vec<u8>, applied: bool) {
        let mut st = self.state.lock();
        debug_assert_eq!(seq, st.log.last() + 1);
        st.log.push(term, frame);
        st.term = st.term.max(term);
        if applied {
            st.applied = seq;
            st.committed = st.committed.max(seq);
        } else {
            st.keep_tail = true;
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
        for (seq, entry_term, frame) in batch {
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
        st.committed = st.committed.max(committed);
        if let Some(d) = self.disk.get() {
            d.note_committed(st.committed);
        }
        Ok(st.committed.min(st.log.last()))
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
