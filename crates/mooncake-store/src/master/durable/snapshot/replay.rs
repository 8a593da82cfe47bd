//! Replaying the log after a snapshot with reading and applying
//! overlapped: a helper thread reads and decodes the log files (into owned
//! entries, allocating their keys), this one applies them in order.
//! Applying stays on one thread: entries do not commute (space is taken
//! at the offsets the log names).

use std::path::Path;
use std::sync::mpsc;

use mooncake_common::{Error, ErrorCode, Result};

use super::super::oplog::wal::{self, Tail};
use super::super::oplog::OwnedEntry;

/// Mutations handed over at once (the last batch may hold fewer); small in
/// tests, so theirs logs cross many batches.
const BATCH_MUTATIONS: usize = if cfg!(test) { 8 } else { 1024 };
/// Batches decoded ahead of the one being applied.
const QUEUED: usize = 8;

/// Reads the log in `dir` after `after` (up to `upto`), as
/// [`wal::recover_each`] does, and hands each entry to `apply` in order,
/// decoding ahead on a second thread. An error of `apply` stops the read
/// and is the one returned.
pub(super) fn each_entry(
    dir: &Path,
    after: u64,
    upto: Option<u64>,
    apply: &mut dyn FnMut(OwnedEntry) -> Result<()>,
) -> Result<Tail> {
    let (tx, rx) = mpsc::sync_channel::<Vec<OwnedEntry>>(QUEUED);
    std::thread::scope(|sc| {
        let reader = std::thread::Builder::new()
            .name("mc-log-read".into())
            .spawn_scoped(sc, move || {
                let mut batch = Vec::new();
                let mut held = 0;
                let tail = wal::recover_each(dir, after, upto, &mut |e| {
                    held += e.mutations.len().max(1);
                    batch.push(e);
                    if held >= BATCH_MUTATIONS {
                        held = 0;
                        tx.send(std::mem::take(&mut batch)).map_err(|_| stopped())?;
                    }
                    Ok(())
                })?;
                if !batch.is_empty() {
                    tx.send(batch).map_err(|_| stopped())?;
                }
                Ok(tail)
            });
        let reader = match reader {
            Ok(r) => r,
            // No second thread: read and apply on this one.
            Err(_) => return wal::recover_each(dir, after, upto, apply),
        };
        let mut applied = Ok(());
        for batch in rx.iter() {
            applied = batch.into_iter().try_for_each(&mut *apply);
            if applied.is_err() {
                break;
            }
        }
        // The reader sees the channel closed and stops.
        drop(rx);
        let read = reader.join().unwrap_or_else(|_| {
            Err(Error::new(
                ErrorCode::INTERNAL_ERROR,
                "the log reader thread panicked",
            ))
        });
        applied.and(read)
    })
}

fn stopped() -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, "log replay stopped")
}
