//! A replicated master's image: the latest snapshot of its committed
//! state, how a standby behind the compacted log is answered with it, and
//! the log compaction behind it. `master::ha::compaction` takes the images
//! and loads them into the state machine.
//!
//! A standby asking for entries the log no longer holds (one started late,
//! or one brought back from its log directory after the leader compacted
//! past its last entry) is answered with the image instead, in chunks
//! (`SnapshotChunk`, then `SnapshotFetch` for the rest); it loads it in
//! place of whatever its state held and pulls the entries after it.

use std::sync::Arc;

use mooncake_common::{Error, ErrorCode, Result};

use super::{Replication, Role};
use crate::proto::{Frames, Response};

/// Most snapshot bytes in one answer.
pub(crate) const CHUNK: usize = 4 << 20;

/// A snapshot of the committed state at entry `seq` (of `term`).
pub(crate) struct Image {
    pub(crate) seq: u64,
    pub(crate) term: u64,
    pub(crate) bytes: Vec<u8>,
}

fn failed(why: String) -> Response {
    Response::Failed {
        error: Error::new(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, why),
    }
}

impl Replication {
    pub(crate) fn image(&self) -> Option<Arc<Image>> {
        self.image.lock().clone()
    }

    /// The bytes from `offset` of this master's image (that of entry
    /// `seq`, when given): the answer to a pull behind the log, or to a
    /// fetch.
    pub(crate) fn snapshot_chunk(&self, seq: Option<u64>, offset: u64, now: u64) -> Response {
        let Some(img) = self.image() else {
            return failed("no snapshot to catch up from".into());
        };
        if let Some(s) = seq.filter(|s| *s != img.seq) {
            return failed(format!(
                "snapshot {s} was replaced by snapshot {}: start over",
                img.seq
            ));
        }
        let total = img.bytes.len();
        let start = (offset as usize).min(total);
        let end = (start + CHUNK).min(total);
        Response::SnapshotChunk {
            seq: img.seq,
            term: img.term,
            leader_now: now,
            offset: start as u64,
            total: total as u64,
            chunk: Frames(img.bytes[start..end].to_vec()),
        }
    }

    /// Fails unless this master may load a snapshot: a standby. Returns
    /// whether its state holds something the snapshot must replace.
    pub(crate) fn may_load_snapshot(&self) -> Result<bool> {
        let st = self.state.lock();
        if st.role != Role::Standby {
            return Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                "only a standby loads its leader's snapshot",
            ));
        }
        Ok(st.applied > 0 || st.log.last() > 0)
    }

    /// Forgets every entry held (a standby whose state a snapshot is about
    /// to replace; the entries after it come from the leader).
    pub(crate) fn forget_log(&self) {
        let mut st = self.state.lock();
        st.log.reset(0, 0);
        st.applied = 0;
        st.verify = None;
    }

    /// The state machine now holds the snapshot `bytes` of entry `seq` (of
    /// `term`): the log starts after it, and it is this master's image.
    pub(crate) fn loaded_snapshot(&self, seq: u64, term: u64, bytes: Vec<u8>) -> Result<()> {
        if let Some(d) = self.disk.get() {
            // This master's log on disk now starts after it too.
            d.restart_after(seq)?;
        }
        let mut st = self.state.lock();
        st.log.reset(seq, term);
        st.applied = seq;
        st.committed = st.committed.max(seq);
        st.verify = None;
        drop(st);
        self.set_image(Image { seq, term, bytes });
        Ok(())
    }

    pub(crate) fn set_image(&self, image: Image) {
        *self.image.lock() = Some(Arc::new(image));
    }

    /// Frames of the entries after `seq` that are committed and applied
    /// here (at most `max`), for the shadow.
    pub(crate) fn settled_after(&self, seq: u64, max: usize) -> Vec<(u64, Vec<u8>)> {
        let st = self.state.lock();
        // A leader has applied everything, committed or not; a standby
        // applies only what is committed.
        let upto = st.applied.min(st.committed);
        ((seq + 1)..=upto)
            .take(max)
            .map_while(|s| st.log.frame(s).map(|f| (s, f.to_vec())))
            .collect()
    }

    pub(crate) fn term_of(&self, seq: u64) -> Option<u64> {
        self.state.lock().log.term_at(seq)
    }

    pub(crate) fn log_base(&self) -> u64 {
        self.state.lock().log.base()
    }

    /// Drops the log entries a snapshot holds: on the leader those of the
    /// one at `seq`, but none a standby it hears from still lacks; on a
    /// standby only those of the one before (`previous`): another standby
    /// may know of fewer commits, and it truncates to what it applied when
    /// this one takes over. Returns how many went.
    pub(crate) fn compact(&self, seq: u64, previous: u64) -> u64 {
        let mut st = self.state.lock();
        let mut through = seq.min(st.applied);
        if st.role == Role::Leader {
            if let Some(floor) = st.in_sync.as_ref().and_then(|s| s.min_acked()) {
                through = through.min(floor);
            }
        } else {
            through = through.min(previous);
        }
        st.log.compact_through(through)
    }
}
