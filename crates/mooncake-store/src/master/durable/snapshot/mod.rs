//! Durability of a single master: the local log (`oplog::wal`), periodic
//! snapshots, and restoring both at start.
//!
//! # Capture
//!
//! A master's snapshot thread cuts its live state (`live`,
//! `state::view`): the mutations under way finish, new ones wait for an
//! instant while the log position and the small tables are read, and the
//! objects are written out of the live tables, a write first saving the
//! encoded form of an object the round has not reached yet
//! (`state::objects::walk`): the round holds a bit per object and the
//! saved bytes not yet written out, never a copy of the state. The view
//! is streamed to a file, stored and dropped; it is exactly the state at
//! the position it records.
//!
//! Without a live master beside the log ([`round`]: benchmarks, tests), a
//! round rebuilds a copy of the state machine at a log cut from the newest
//! snapshot and the closed log files (a shadow) and encodes that.
//!
//! # Retention and truncation
//!
//! The store keeps the newest `--snapshot_retention_count` snapshots; the
//! log is truncated behind the *oldest* of them, so a restore can fall
//! back to any snapshot kept and still replay every entry after it.
//!
//! # Restore
//!
//! The newest snapshot that decodes and holds together, then the log
//! entries after it; a damaged or truncated snapshot is skipped for the
//! next older one. The log directory's `BASE` file records the position
//! a fresh log started from: snapshots at or before it belong to an older
//! history and are never restored under that log.

mod durable;
pub mod format;
mod live;
mod progress;
mod replay;
pub mod store;

use std::path::Path;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};

pub(crate) use durable::{open, Durability, LiveState, Opened};
pub use durable::{round, Shadow};
pub use live::live_round;
pub use progress::RestoreProgress;

#[cfg(test)]
mod counts;
#[cfg(test)]
mod tests;

use super::oplog::wal;
use super::oplog::OwnedEntry;
use crate::master::config::MasterConfig;
use crate::master::state::service::MasterService;
use format::SnapshotMeta;
use store::{snapshot_name, LocalStore, S3Store, SnapshotStore};

/// What a restore found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    /// The snapshot restored (its seq), if any.
    pub snapshot: Option<u64>,
    /// Newer snapshots skipped as damaged.
    pub skipped: Vec<u64>,
    /// Log entries replayed after it.
    pub entries: usize,
    /// The last log position in the restored state.
    pub last_seq: u64,
    pub elapsed: Duration,
}

/// What one snapshot round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SnapshotReport {
    pub seq: u64,
    pub objects: u64,
    pub bytes: u64,
    /// How long the log cut held the writers.
    pub cut: Duration,
    /// Applying the new log files to the shadow copy.
    pub apply: Duration,
    pub encode: Duration,
    pub store: Duration,
    /// Snapshots deleted by retention, and log files truncated.
    pub deleted_snapshots: usize,
    pub deleted_log_files: usize,
}

/// The snapshot store and its optional local backup.
pub struct Stores {
    main: Box<dyn SnapshotStore>,
    backup: Option<LocalStore>,
}

impl Stores {
    pub(crate) fn from_config(config: &MasterConfig) -> Result<Stores> {
        let main: Box<dyn SnapshotStore> = match config.snapshot_store_type() {
            "s3" => Box::new(S3Store::from_env(&config.cluster_id)?),
            _ => Box::new(LocalStore::new(config.local_snapshot_dir().ok_or_else(
                || {
                    Error::new(
                        ErrorCode::INVALID_PARAMS,
                        "local snapshots need MOONCAKE_SNAPSHOT_LOCAL_PATH",
                    )
                },
            )?)?),
        };
        let backup = match config.snapshot_backup_dir.as_str() {
            "" => None,
            dir => Some(LocalStore::new(dir)?),
        };
        Ok(Stores { main, backup })
    }

    /// Snapshots kept in `main`, each also written to `backup` if given.
    pub fn new(main: Box<dyn SnapshotStore>, backup: Option<LocalStore>) -> Stores {
        Stores { main, backup }
    }

    /// Seqs held in either place, newest first.
    pub(crate) fn list(&self) -> Vec<u64> {
        let mut seqs = self.main.list().unwrap_or_else(|e| {
            tracing::warn!("{e}");
            Vec::new()
        });
        if let Some(b) = &self.backup {
            seqs.extend(b.list().unwrap_or_default());
        }
        seqs.sort_unstable_by(|a, b| b.cmp(a));
        seqs.dedup();
        seqs
    }

    pub(crate) fn get(&self, seq: u64) -> Result<Vec<u8>> {
        let name = snapshot_name(seq);
        match self.main.get(&name) {
            Ok(b) => Ok(b),
            Err(e) => match &self.backup {
                Some(backup) => backup.get(&name).map_err(|_| e),
                None => Err(e),
            },
        }
    }

    pub(crate) fn put(&self, seq: u64, bytes: &[u8]) -> Result<()> {
        let name = snapshot_name(seq);
        self.main.put(&name, bytes)?;
        if let Some(b) = &self.backup {
            b.put(&name, bytes)?;
        }
        Ok(())
    }

    /// Stores the snapshot file at `path` as `seq` (and in the backup).
    pub(crate) fn put_file(&self, seq: u64, path: &Path) -> Result<()> {
        let name = snapshot_name(seq);
        self.main.put_file(&name, path)?;
        if let Some(b) = &self.backup {
            b.put_file(&name, path)?;
        }
        Ok(())
    }

    /// After a round was kept: deletes all but the newest `keep` snapshots
    /// and the log files the oldest kept one covers, counting both in
    /// `report`.
    pub(crate) fn retire(
        &self,
        keep: usize,
        wal: &wal::Wal,
        report: &mut SnapshotReport,
    ) -> Result<()> {
        let (oldest, deleted) = self.retain(keep)?;
        report.deleted_snapshots = deleted;
        if let Some(oldest) = oldest {
            report.deleted_log_files = wal.remove_through(oldest)?;
        }
        Ok(())
    }

    /// Deletes all but the newest `keep`; returns the oldest kept and the
    /// number deleted.
    pub(crate) fn retain(&self, keep: usize) -> Result<(Option<u64>, usize)> {
        let mut deleted = 0;
        let mut oldest = None;
        let places: Vec<&dyn SnapshotStore> = std::iter::once(&*self.main)
            .chain(self.backup.as_ref().map(|b| b as &dyn SnapshotStore))
            .collect();
        for (i, place) in places.into_iter().enumerate() {
            let seqs = place.list()?;
            let cut = seqs.len().saturating_sub(keep);
            for &seq in &seqs[..cut] {
                place.delete(&snapshot_name(seq))?;
                deleted += 1;
            }
            if i == 0 {
                oldest = seqs.get(cut).copied();
            }
        }
        Ok((oldest, deleted))
    }
}

/// Gives the heap what a round freed back to the system (a dropped shadow,
/// copied chunks): its many small
/// allocations (and those of the log entries it replayed) otherwise stay
/// resident after it is gone.
pub(crate) fn release_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

const BASE_FILE: &str = "BASE";

/// The position the log in `dir` started from (None: no log there).
fn read_base(dir: &Path) -> Result<Option<u64>> {
    match std::fs::read_to_string(dir.join(BASE_FILE)) {
        Ok(s) => s.trim().parse().map(Some).map_err(|e| {
            Error::new(
                ErrorCode::DESERIALIZE_FAIL,
                format!("{}: {e}", dir.join(BASE_FILE).display()),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::new(
            ErrorCode::FILE_READ_FAIL,
            format!("{}: {e}", dir.join(BASE_FILE).display()),
        )),
    }
}

/// Starts a fresh log history in `dir`: old log files go, `BASE` says
/// where the new one starts.
pub fn start_history(dir: &Path, base: u64) -> Result<()> {
    let io = |e: std::io::Error| {
        Error::new(
            ErrorCode::FILE_WRITE_FAIL,
            format!("write-ahead log directory {}: {e}", dir.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    for (_, path) in wal::list_files(dir)? {
        std::fs::remove_file(path).map_err(io)?;
    }
    let tmp = dir.join(".BASE.tmp");
    std::fs::write(&tmp, format!("{base}\n")).map_err(io)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, dir.join(BASE_FILE)).map_err(io)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)
}

/// A restored state machine and where it stands.
pub struct Restored {
    pub service: MasterService,
    pub report: RestoreReport,
    /// The latest master clock (ms) in the restored state.
    pub now: u64,
}

/// Applies the log entries in `dir` after `after` (up to `upto`) to `s`.
fn replay_log(
    s: &MasterService,
    dir: &Path,
    after: u64,
    upto: Option<u64>,
    now: &mut u64,
) -> Result<(usize, u64)> {
    if !dir.exists() {
        return Ok((0, after));
    }
    let t = Instant::now();
    let mut mutations = 0usize;
    let tail = replay::each_entry(dir, after, upto, &mut |e| {
        mutations += e.mutations.len();
        apply(s, &e, now)
    })?;
    if upto.is_none() {
        tracing::info!(
            entries = tail.entries,
            mutations,
            ms = t.elapsed().as_millis() as u64,
            "restore: log replayed"
        );
    }
    Ok((tail.entries, tail.last_seq.max(after)))
}

fn apply(s: &MasterService, e: &OwnedEntry, now: &mut u64) -> Result<()> {
    for m in &e.mutations {
        if let Some(t) = m.now() {
            *now = (*now).max(t);
        }
    }
    e.apply_to(s)
}

/// Rebuilds the state into masters `make` gives: the newest usable
/// snapshot, then the log after it.
pub fn restore(
    make: &dyn Fn() -> MasterService,
    stores: Option<&Stores>,
    wal_dir: Option<&Path>,
    upto: Option<u64>,
    progress: &RestoreProgress,
) -> Result<Restored> {
    let started = Instant::now();
    let base = match wal_dir {
        Some(d) => read_base(d)?,
        None => None,
    };
    let mut report = RestoreReport::default();
    let candidates = stores.map(Stores::list).unwrap_or_default();
    let candidates = candidates
        .into_iter()
        .filter(|&seq| base.is_none_or(|b| seq > b) && upto.is_none_or(|u| seq <= u));
    for seq in candidates {
        let stores = stores.expect("candidates come from the stores");
        let service = make();
        let t = Instant::now();
        let meta = stores.get(seq).and_then(|bytes| {
            tracing::info!(
                seq,
                bytes = bytes.len(),
                ms = t.elapsed().as_millis() as u64,
                "restore: snapshot read"
            );
            let t = Instant::now();
            let meta = format::decode_into(&bytes, &service, progress)?;
            tracing::info!(
                seq,
                ms = t.elapsed().as_millis() as u64,
                "restore: snapshot decoded"
            );
            if meta.seq != seq {
                return Err(Error::new(
                    ErrorCode::DESERIALIZE_FAIL,
                    format!("snapshot named {seq} holds position {}", meta.seq),
                ));
            }
            Ok(meta)
        });
        match meta {
            Ok(SnapshotMeta { now, .. }) => {
                let mut now = now;
                let (entries, last) = match wal_dir {
                    Some(d) => replay_log(&service, d, seq, upto, &mut now)?,
                    None => (0, seq),
                };
                progress.replayed(entries);
                report.snapshot = Some(seq);
                report.entries = entries;
                report.last_seq = last;
                report.elapsed = started.elapsed();
                return Ok(Restored {
                    service,
                    report,
                    now,
                });
            }
            Err(e) => {
                tracing::warn!(seq, "snapshot unusable, trying an older one: {e}");
                report.skipped.push(seq);
            }
        }
    }
    let service = make();
    let mut now = 0;
    let after = base.unwrap_or(0);
    if !report.skipped.is_empty() && base.is_none() {
        return Err(Error::new(
            ErrorCode::DESERIALIZE_FAIL,
            format!(
                "no usable snapshot (damaged: {:?}) and no log to rebuild from",
                report.skipped
            ),
        ));
    }
    let (entries, last) = match wal_dir {
        Some(d) => replay_log(&service, d, after, upto, &mut now)?,
        None => (0, after),
    };
    progress.replayed(entries);
    report.entries = entries;
    report.last_seq = last;
    report.elapsed = started.elapsed();
    Ok(Restored {
        service,
        report,
        now,
    })
}
