//! Snapshots in HA mode: catching up from one, and keeping the log short.
//!
//! With `--enable_snapshot`, every master of a replicated cluster turns
//! its committed state into a snapshot every `--snapshot_interval_seconds`
//! ([`Snapshotter`]): a shadow copy of the state machine, rebuilt for the
//! round from the previous image and dropped after it, applies the
//! committed entries (copied out of the log: the live state is never
//! locked for it), is encoded (`snapshot::format`), and becomes this
//! master's *image* (`replication::catch_up`). The leader also stores it
//! (`--snapshot_object_store_type`, with retention), so that the loss of
//! every master at once still leaves the last snapshot. Then the in-memory
//! log is compacted behind the image: on the leader never past an entry a
//! standby it hears from still lacks, on a standby only behind its
//! previous image.
//!
//! A standby behind its leader's compacted log (started late, or brought
//! back from an old log directory) loads the leader's image in place of
//! its state ([`load_snapshot`]) and pulls the entries after it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};

use crate::master::durable::oplog::decode;
use crate::master::durable::snapshot::format::{self, SnapshotMeta};
use crate::master::durable::snapshot::{RestoreProgress, Stores};
use crate::master::replication::catch_up::Image;
use crate::master::replication::{Replication, Role};
use crate::master::serve::shared::Shared;
use crate::master::state::service::MasterService;

/// Most entries the shadow takes from the log at once.
const SHADOW_BATCH: usize = 16_384;

/// Loads the snapshot `bytes` into `shared`'s state machine; the log then
/// starts after it. Returns its position.
///
/// A standby whose state already holds something (one brought back from
/// its log directory, behind its leader's compacted log) has it replaced:
/// the snapshot is checked on a scratch copy first, so a damaged one
/// leaves the state as it was, and only then is the state emptied and
/// the snapshot loaded.
pub(crate) fn load_snapshot(shared: &Shared, repl: &Replication, bytes: Vec<u8>) -> Result<u64> {
    let bad = |e: format::SnapshotError| {
        Error::new(
            ErrorCode::DESERIALIZE_FAIL,
            format!("snapshot from the leader: {e}"),
        )
    };
    if repl.may_load_snapshot()? {
        let scratch = MasterService::new(&shared.config);
        format::decode_into(&bytes, &scratch, &RestoreProgress::default()).map_err(bad)?;
        drop(scratch);
        shared.service.reset();
        repl.forget_log();
    }
    let meta =
        format::decode_into(&bytes, &shared.service, &shared.metrics.restore).map_err(bad)?;
    shared.clock.advance_to(meta.now);
    repl.loaded_snapshot(meta.seq, meta.term, bytes)?;
    Ok(meta.seq)
}

/// Loads the newest usable snapshot of `stores` into `shared`'s still
/// empty state (a master restarted with `--enable_snapshot_restore`);
/// a damaged one is skipped for the next older. Returns its position.
pub(crate) fn restore_newest(shared: &Shared, stores: &Stores) -> Result<Option<u64>> {
    let repl = shared.replication.as_ref().expect("replicated");
    let Some((_, _, bytes)) = newest_snapshot(shared, stores) else {
        return Ok(None);
    };
    let seq = load_snapshot(shared, repl, bytes)?;
    shared.service.await_owners(shared.clock.now_ms());
    Ok(Some(seq))
}

/// The newest stored snapshot that decodes and holds together, with its
/// position and term.
pub(crate) fn newest_snapshot(shared: &Shared, stores: &Stores) -> Option<(u64, u64, Vec<u8>)> {
    for seq in stores.list() {
        let checked = stores.get(seq).and_then(|bytes| {
            // On a scratch copy: a damaged one must leave nothing behind.
            let scratch = MasterService::new(&shared.config);
            let meta = format::decode_into(&bytes, &scratch, &RestoreProgress::default())
                .map_err(|e| Error::new(ErrorCode::DESERIALIZE_FAIL, e.to_string()))?;
            if meta.seq != seq {
                return Err(Error::new(
                    ErrorCode::DESERIALIZE_FAIL,
                    format!("snapshot named {seq} holds position {}", meta.seq),
                ));
            }
            Ok((meta.term, bytes))
        });
        match checked {
            Ok((term, bytes)) => return Some((seq, term, bytes)),
            Err(e) => tracing::warn!(seq, "snapshot unusable, trying an older one: {e}"),
        }
    }
    None
}

/// The snapshot thread of a replicated master.
pub(crate) struct Snapshotter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Snapshotter {
    /// Starts taking snapshots of `shared`'s committed state every
    /// `--snapshot_interval_seconds`; the leader's go to `stores` too.
    pub(crate) fn start(shared: Arc<Shared>, stores: Option<Arc<Stores>>) -> Result<Snapshotter> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("mc-ha-snapshot".into())
            .spawn(move || run(shared, stores, s))
            .map_err(|e| {
                Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("cannot start the snapshot thread: {e}"),
                )
            })?;
        Ok(Snapshotter {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Snapshotter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The shadow state machine and the entry it stands at.
struct Shadow {
    service: MasterService,
    seq: u64,
}

fn run(shared: Arc<Shared>, stores: Option<Arc<Stores>>, stop: Arc<AtomicBool>) {
    let repl = shared.replication.clone().expect("replicated");
    let interval = shared
        .config
        .snapshot_interval
        .max(Duration::from_millis(100));
    let mut due = Instant::now() + interval;
    while !stop.load(Ordering::SeqCst) {
        if Instant::now() < due {
            std::thread::sleep((due - Instant::now()).min(Duration::from_millis(50)));
            continue;
        }
        due = Instant::now() + interval;
        // Built for this round from the image and the log, and dropped
        // after it: between rounds the master holds one copy.
        let mut shadow: Option<Shadow> = None;
        let result = round(&shared, &repl, stores.as_deref(), &mut shadow);
        drop(shadow);
        crate::master::durable::snapshot::release_heap();
        match result {
            Ok(Some((seq, bytes, compacted))) => {
                tracing::info!(seq, bytes, compacted, "HA snapshot taken")
            }
            Ok(None) => {}
            Err(e) => tracing::error!("HA snapshot failed: {e}"),
        }
    }
}

/// One snapshot: brings the shadow to the settled entries, encodes it as
/// the image, stores it (leader), compacts the log. `None`: nothing new.
fn round(
    shared: &Shared,
    repl: &Replication,
    stores: Option<&Stores>,
    shadow: &mut Option<Shadow>,
) -> Result<Option<(u64, usize, u64)>> {
    if shadow.as_ref().is_some_and(|s| s.seq < repl.log_base()) {
        // The log starts past the shadow (this standby loaded its
        // leader's snapshot): the shadow starts over from that image.
        *shadow = None;
    }
    if shadow.is_none() {
        let service = MasterService::new(&shared.config);
        let seq = match repl.image() {
            Some(img) => {
                format::decode_into(&img.bytes, &service, &RestoreProgress::default()).map_err(
                    |e| Error::new(ErrorCode::DESERIALIZE_FAIL, format!("own snapshot: {e}")),
                )?;
                img.seq
            }
            None if repl.log_base() == 0 => 0,
            None => {
                return Err(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    "the log was compacted but no snapshot is held",
                ))
            }
        };
        *shadow = Some(Shadow { service, seq });
    }
    let s = shadow.as_mut().expect("set above");
    loop {
        let batch = repl.settled_after(s.seq, SHADOW_BATCH);
        let Some(&(last, _)) = batch.last() else {
            break;
        };
        for (seq, frame) in &batch {
            let entry = decode(frame).map_err(|e| {
                Error::new(ErrorCode::DESERIALIZE_FAIL, format!("entry {seq}: {e}"))
            })?;
            entry.apply_to(&s.service)?;
        }
        s.seq = last;
    }
    let previous = repl.image().map_or(0, |i| i.seq);
    if s.seq == 0 || previous >= s.seq {
        return Ok(None);
    }
    let term = repl.term_of(s.seq).ok_or_else(|| {
        Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!("entry {} left the log before its snapshot", s.seq),
        )
    })?;
    let meta = SnapshotMeta {
        seq: s.seq,
        term,
        now: shared.clock.now_ms(),
    };
    let bytes = format::encode(&s.service, meta);
    let size = bytes.len();
    // Stored before it counts as this master's image (and the log is
    // compacted behind it).
    // A master with a log on disk stores its own too: its log is
    // truncated behind them, and it restarts from them.
    let stored = match stores {
        Some(stores) if repl.role() == Role::Leader || repl.disk().is_some() => {
            stores.put(s.seq, &bytes)?;
            stores.retain(shared.config.snapshot_retention_count)?;
            true
        }
        _ => false,
    };
    repl.set_image(Image {
        seq: s.seq,
        term,
        bytes,
    });
    let compacted = repl.compact(s.seq, previous);
    if let (true, Some(disk)) = (stored, repl.disk()) {
        // Behind the previous snapshot, so that a restore can fall back
        // to it when the newest is damaged.
        disk.remove_through(previous)?;
    }
    Ok(Some((s.seq, size, compacted)))
}
