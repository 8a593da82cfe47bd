//! Replicated HA with a log directory: where each master's log lives, and
//! bringing a master back from it (the newest stored snapshot plus the
//! log after it) before it follows or campaigns.
//!
//! Every member of the in-sync set has written every entry it
//! acknowledged, and the leader every entry it answered for
//! (`replication::disk`), so after the loss of every master at once any
//! recorded member brought back from its directory holds every answered
//! write. Entries it holds past the commit point it last noted are kept
//! but not applied: they are applied if it leads, and dropped if the
//! leader it follows does not hold them (never committed).

use std::path::Path;
use std::sync::Arc;

use mooncake_common::{Error, ErrorCode, Result};

use super::compaction::{load_snapshot, newest_snapshot};
use crate::master::durable::oplog::decode;
use crate::master::durable::snapshot::Stores;
use crate::master::replication::disk::{self, DiskLog, Recovered};
use crate::master::serve::shared::Shared;

/// What a restore brought back, for the log.
#[derive(Debug, Default)]
pub(crate) struct RestoreReport {
    pub(crate) snapshot: Option<u64>,
    pub(crate) applied: u64,
    pub(crate) kept: u64,
}

/// Restores `shared`'s still empty state from the newest snapshot of
/// `stores` and the log `rec` read from `dir`, then opens the log there
/// for what follows.
pub(crate) fn restore(
    shared: &Shared,
    stores: Option<&Stores>,
    dir: &Path,
    rec: Recovered,
    sync_ack: bool,
) -> Result<(Arc<DiskLog>, RestoreReport)> {
    let repl = shared.replication.as_ref().expect("replicated");
    let mut report = RestoreReport::default();
    let base = rec.base;
    let last = rec.entries.last().map_or(base, |e| e.0);
    let snapshot = stores.and_then(|s| newest_snapshot(shared, s));
    // Entries of the log to use: those after `from` (None: the log is
    // not used).
    let from = match &snapshot {
        Some((seq, term, _)) => {
            let term_here = rec.entries.iter().find(|e| e.0 == *seq).map(|e| e.1);
            if *seq < base {
                return Err(Error::new(
                    ErrorCode::DESERIALIZE_FAIL,
                    format!(
                        "the replicated log in {} starts after entry {base}, but the newest snapshot is at {seq}",
                        dir.display()
                    ),
                ));
            }
            if *seq >= last || term_here.is_some_and(|t| t != *term) {
                // Newer than this log, or of another history: the log
                // holds nothing it lacks that was committed.
                None
            } else {
                Some(*seq)
            }
        }
        None if base > 0 => {
            return Err(Error::new(
                ErrorCode::DESERIALIZE_FAIL,
                format!(
                    "the replicated log in {} starts after entry {base}, and no snapshot is stored",
                    dir.display()
                ),
            ))
        }
        None => Some(0),
    };
    let mut position = 0;
    let mut now = 0;
    if let Some((seq, _, bytes)) = snapshot {
        load_snapshot(shared, repl, bytes)?;
        report.snapshot = Some(seq);
        position = seq;
    }
    match from {
        Some(after) => {
            let committed = rec.committed.max(after);
            for (seq, term, frame) in rec.entries.into_iter().filter(|e| e.0 > after) {
                let apply = seq <= committed;
                if apply {
                    let entry = decode(&frame).map_err(|e| {
                        Error::new(ErrorCode::DESERIALIZE_FAIL, format!("entry {seq}: {e}"))
                    })?;
                    entry.apply_to(&shared.service)?;
                    for m in &entry.mutations {
                        if let Some(t) = m.now() {
                            now = now.max(t);
                        }
                    }
                    report.applied += 1;
                } else {
                    report.kept += 1;
                }
                repl.restored_entry(seq, term, frame, apply);
                position = seq;
            }
        }
        None => disk::clear(dir)?,
    }
    if report.snapshot.is_some() || position > 0 {
        shared.clock.advance_to(now);
        shared.service.await_owners(shared.clock.now_ms());
    }
    let log = DiskLog::start(dir, position, sync_ack)?;
    log.note_committed(position - report.kept);
    repl.set_disk(log.clone());
    Ok((log, report))
}
