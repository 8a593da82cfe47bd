//! Snapshots in HA mode: catching up from one, and keeping the log short.
//!
//! With `--enable_snapshot`, every master of a replicated cluster turns
//! its committed state into a snapshot every `--snapshot_interval_seconds`
//! ([`Snapshotter`]): a shadow copy of the state machine applies the
//! committed entries (copied out of the log: the live state is never
//! locked for it), is encoded (`snapshot::format`), and becomes this
//! master's *image*. The leader also stores it (`--snapshot_object_store_type`,
//! with retention), so that the loss of every master at once still leaves
//! the last snapshot. Then the in-memory log is compacted behind the
//! image: on the leader never past an entry a standby it hears from still
//! lacks, on a standby only behind its previous image.
//!
//! A standby asking for entries the log no longer holds (one started late)
//! is answered with the image instead, in chunks (`SnapshotChunk`, then
//! `SnapshotFetch` for the rest); it loads it into its still empty state
//! and pulls the entries after it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};

use super::{Replication, Role};
use crate::master::oplog::decode;
use crate::master::service::MasterService;
use crate::master::shared::Shared;
use crate::master::snapshot::format::{self, SnapshotMeta};
use crate::master::snapshot::Stores;
use crate::proto::{Frames, Response};

/// Most snapshot bytes in one answer.
pub(crate) const CHUNK: usize = 4 << 20;
/// Most entries the shadow takes from the log at once.
const SHADOW_BATCH: usize = 16_384;

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

    /// Loads the snapshot `bytes` into `shared`'s state machine, which
    /// must hold nothing yet (a standby started late); the log then starts
    /// after it. Returns its position.
    pub(crate) fn load_snapshot(&self, shared: &Shared, bytes: Vec<u8>) -> Result<u64> {
        {
            let st = self.state.lock();
            if st.role != Role::Standby || st.applied > 0 || st.log.last() > 0 {
                return Err(Error::new(
                    ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                    "this standby fell behind its leader's compacted log; restart it to catch up from a snapshot",
                ));
            }
        }
        let meta = format::decode_into(&bytes, &shared.service).map_err(|e| {
            Error::new(
                ErrorCode::DESERIALIZE_FAIL,
                format!("snapshot from the leader: {e}"),
            )
        })?;
        shared.clock.advance_to(meta.now);
        let mut st = self.state.lock();
        st.log.reset(meta.seq, meta.term);
        st.applied = meta.seq;
        st.committed = st.committed.max(meta.seq);
        drop(st);
        *self.image.lock() = Some(Arc::new(Image {
            seq: meta.seq,
            term: meta.term,
            bytes,
        }));
        Ok(meta.seq)
    }

    /// Frames of the entries after `seq` that are committed and applied
    /// here (at most `max`), for the shadow.
    fn settled_after(&self, seq: u64, max: usize) -> Vec<(u64, Vec<u8>)> {
        let st = self.state.lock();
        // A leader has applied everything, committed or not; a standby
        // applies only what is committed.
        let upto = st.applied.min(st.committed);
        ((seq + 1)..=upto)
            .take(max)
            .map_while(|s| st.log.frame(s).map(|f| (s, f.to_vec())))
            .collect()
    }

    fn term_of(&self, seq: u64) -> Option<u64> {
        self.state.lock().log.term_at(seq)
    }

    fn log_base(&self) -> u64 {
        self.state.lock().log.base()
    }

    /// Drops the log entries a snapshot holds: on the leader those of the
    /// one at `seq`, but none a standby it hears from still lacks; on a
    /// standby only those of the one before (`previous`): another standby
    /// may know of fewer commits, and it truncates to what it applied when
    /// this one takes over. Returns how many went.
    fn compact(&self, seq: u64, previous: u64) -> u64 {
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

/// Loads the newest usable snapshot of `stores` into `shared`'s still
/// empty state (a master restarted with `--enable_snapshot_restore`);
/// a damaged one is skipped for the next older. Returns its position.
pub(crate) fn restore_newest(shared: &Shared, stores: &Stores) -> Result<Option<u64>> {
    let repl = shared.replication.as_ref().expect("replicated");
    for seq in stores.list() {
        let checked = stores.get(seq).and_then(|bytes| {
            // Checked on a scratch copy: a damaged one must not leave
            // half a state behind in the live one.
            let scratch = MasterService::new(&shared.config);
            let meta = format::decode_into(&bytes, &scratch)
                .map_err(|e| Error::new(ErrorCode::DESERIALIZE_FAIL, e.to_string()))?;
            if meta.seq != seq {
                return Err(Error::new(
                    ErrorCode::DESERIALIZE_FAIL,
                    format!("snapshot named {seq} holds position {}", meta.seq),
                ));
            }
            Ok(bytes)
        });
        match checked {
            Ok(bytes) => {
                let seq = repl.load_snapshot(shared, bytes)?;
                // Owners may be gone since: their segments are served
                // again only once they are heard from.
                shared.service.segments.unverify_all();
                shared
                    .service
                    .clients
                    .lock()
                    .touch_all(shared.clock.now_ms());
                return Ok(Some(seq));
            }
            Err(e) => tracing::warn!(seq, "snapshot unusable, trying an older one: {e}"),
        }
    }
    Ok(None)
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
    let mut shadow: Option<Shadow> = None;
    let mut due = Instant::now() + interval;
    while !stop.load(Ordering::SeqCst) {
        if Instant::now() < due {
            std::thread::sleep((due - Instant::now()).min(Duration::from_millis(50)));
            continue;
        }
        due = Instant::now() + interval;
        match round(&shared, &repl, stores.as_deref(), &mut shadow) {
            Ok(Some((seq, bytes, compacted))) => {
                tracing::info!(seq, bytes, compacted, "HA snapshot taken")
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!("HA snapshot failed: {e}");
                shadow = None;
            }
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
    if shadow.is_none() {
        let service = MasterService::new(&shared.config);
        let seq = match repl.image() {
            Some(img) => {
                format::decode_into(&img.bytes, &service).map_err(|e| {
                    Error::new(ErrorCode::DESERIALIZE_FAIL, format!("own snapshot: {e}"))
                })?;
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
            s.service.apply_entry(&entry)?;
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
    if let (Some(stores), Role::Leader) = (stores, repl.role()) {
        stores.put(s.seq, &bytes)?;
        stores.retain(shared.config.snapshot_retention_count)?;
    }
    *repl.image.lock() = Some(Arc::new(Image {
        seq: s.seq,
        term,
        bytes,
    }));
    Ok(Some((s.seq, size, repl.compact(s.seq, previous))))
}
