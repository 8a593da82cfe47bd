//! The replicated log on local disk: every master of a replicated cluster
//! given a log directory appends the entries it holds (the leader those
//! it makes, a standby those it receives) to its own files, so that the
//! loss of every master at once still leaves the last snapshot plus log.
//!
//! - Frames are the `oplog` codec's, with the leader's seq and term, in
//!   files `wal-<first seq, 20 digits>.log`. A file starting at seq `s`
//!   replaces every entry from `s` on of the files before it: that is how
//!   a standby's tail that its new leader does not have is cut
//!   ([`DiskLog::truncate_after`]) without rewriting anything.
//! - Entries are written (`write`, no `fsync`) before they count: the
//!   leader's call waits for its own write before it is answered, a
//!   standby writes what it received before it acknowledges it. Written
//!   entries survive the process (`kill -9`).
//! - A syncer thread `fdatasync`s whatever was written since its last
//!   round (group commit), off the acknowledgement path, and then notes
//!   the commit point this master knows in `COMMITTED`. With
//!   `--ha_wal_sync_ack` the leader also waits for its sync before it
//!   answers, so an acknowledged write survives the loss of the machine.
//!   A cut of the log starts a new sync generation: a sync begun before
//!   it acknowledges nothing written after it.
//! - `MEMBER` keeps this master's member id: a restarted master that
//!   brings its log back is the same member of the in-sync set.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};

#[cfg(test)]
use crate::master::durable::oplog::wal::SYNCED;
use crate::master::durable::oplog::wal::{file_name, list_files, read_durable};
use crate::master::durable::oplog::{decode_prefix, DecodeError, HEADER_LEN};

/// Longest the syncer sleeps when nothing wakes it.
const SYNC_IDLE: Duration = Duration::from_millis(50);
/// A file is closed for a new one past this size, so compaction can
/// delete what a snapshot holds.
const ROTATE_AT: u64 = 64 << 20;

const MEMBER: &str = "MEMBER";
const COMMITTED: &str = "COMMITTED";

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::new(
        ErrorCode::FILE_WRITE_FAIL,
        format!("replicated log: {what} {}: {e}", path.display()),
    )
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("sync directory", dir, e))?;
    #[cfg(test)]
    SYNCED.with(|s| s.borrow_mut().push(dir.to_path_buf()));
    Ok(())
}

/// Frames queued by the log, not written yet.
#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    /// Seq of the last frame in `buf`.
    last: u64,
}

/// The file being written.
struct Current {
    file: Arc<File>,
    path: PathBuf,
    first: u64,
    /// Seq of the last entry written (`first - 1` when none).
    last: u64,
    bytes: u64,
}

/// How far the log is known to be on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Synced {
    /// Bumped by each cut of the log: a sync begun before a cut synced
    /// files the cut replaced, not the entries written after it.
    gen: u64,
    /// Every entry up to here is synced.
    seq: u64,
}

impl Synced {
    /// A sync of the entries up to `upto` of generation `gen` finished.
    fn raise(&mut self, gen: u64, upto: u64) {
        if gen == self.gen {
            self.seq = self.seq.max(upto);
        }
    }

    /// The log was cut after `seq` (or started over at `seq`, held
    /// elsewhere): syncs in flight no longer count.
    fn cut(&mut self, seq: u64) {
        self.gen += 1;
        self.seq = seq;
    }
}

/// One master's replicated log on disk.
pub(crate) struct DiskLog {
    dir: PathBuf,
    sync_ack: bool,
    pending: Mutex<Pending>,
    current: Mutex<Current>,
    written: AtomicU64,
    synced: Mutex<Synced>,
    synced_cv: Condvar,
    /// The commit point this master knows, for `COMMITTED`.
    committed: AtomicU64,
    wake: Condvar,
    wake_lock: Mutex<bool>,
    failed: Mutex<Option<String>>,
    stop: AtomicBool,
    /// Tests: held, it keeps the syncer from syncing; `probe` hears an
    /// answer wait for its sync.
    #[cfg(test)]
    sync_gate: Mutex<()>,
    #[cfg(test)]
    probe: Mutex<Option<std::sync::mpsc::Sender<&'static str>>>,
    /// Tests: the syncer waits for the test to take each of its steps.
    #[cfg(test)]
    steps: Mutex<Option<std::sync::mpsc::SyncSender<&'static str>>>,
}

/// What a log directory held at start.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    /// `(seq, term, frame)`, consecutive.
    pub(crate) entries: Vec<(u64, u64, Vec<u8>)>,
    /// The entry the files start after (0: from the first).
    pub(crate) base: u64,
    /// Log files found (0: a fresh directory).
    pub(crate) files: usize,
    /// The commit point last noted (at most the last entry).
    pub(crate) committed: u64,
    /// The member id kept there.
    pub(crate) member: Option<String>,
}

/// Reads the log in `dir` (missing: empty). A last frame of the last file
/// cut short, or of full length with a failing checksum, is a write the
/// crash interrupted and is cut off (the next start writes a new file);
/// damage anywhere else is an error.
pub(crate) fn recover(dir: &Path) -> Result<Recovered> {
    let mut out = Recovered::default();
    if !dir.exists() {
        return Ok(out);
    }
    let files = list_files(dir)?;
    let n = files.len();
    out.base = files.first().map_or(0, |f| f.0.saturating_sub(1));
    out.files = n;
    for (i, (first, path)) in files.iter().enumerate() {
        // A later file replaces everything from its first entry on.
        while out.entries.last().is_some_and(|e| e.0 >= *first) {
            out.entries.pop();
        }
        if let Some(&(last, _, _)) = out.entries.last() {
            if last + 1 != *first {
                return Err(Error::new(
                    ErrorCode::DESERIALIZE_FAIL,
                    format!(
                        "replicated log {} starts at entry {first}, after {last}",
                        path.display()
                    ),
                ));
            }
        }
        // Durable before this master serves or acknowledges from it.
        let bytes = read_durable(path).map_err(|e| {
            Error::new(
                ErrorCode::FILE_READ_FAIL,
                format!("replicated log {}: {e}", path.display()),
            )
        })?;
        let mut at = 0;
        let mut want = *first;
        while at < bytes.len() {
            match decode_prefix(&bytes[at..]) {
                Ok((entry, used)) => {
                    if entry.seq != want {
                        return Err(Error::new(
                            ErrorCode::DESERIALIZE_FAIL,
                            format!(
                                "replicated log {}: entry {} where {want} was expected",
                                path.display(),
                                entry.seq
                            ),
                        ));
                    }
                    out.entries
                        .push((entry.seq, entry.term, bytes[at..at + used].to_vec()));
                    want += 1;
                    at += used;
                }
                Err(e) if i + 1 == n && torn_tail(&bytes[at..], &e) => {
                    tracing::warn!(
                        file = %path.display(),
                        bytes = bytes.len() - at,
                        entry = want,
                        "replicated log ends in a torn write ({e}); cutting it off"
                    );
                    OpenOptions::new()
                        .write(true)
                        .open(path)
                        .and_then(|f| {
                            f.set_len(at as u64)?;
                            f.sync_all()
                        })
                        .map_err(|e| io_error("truncate", path, e))?;
                    break;
                }
                Err(e) => {
                    return Err(Error::new(
                        ErrorCode::DESERIALIZE_FAIL,
                        format!("replicated log {} at byte {at}: {e}", path.display()),
                    ))
                }
            }
        }
    }
    if n > 0 {
        sync_dir(dir)?;
    }
    let last = out.entries.last().map_or(0, |e| e.0);
    out.committed = read_marker(&dir.join(COMMITTED)).min(last);
    out.member = std::fs::read_to_string(dir.join(MEMBER))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    Ok(out)
}

/// Whether `rest`, the end of the last file from a frame that failed to
/// decode, is a write a crash interrupted: a frame cut short, one of full
/// length whose checksum fails (its pages reached the disk only in part)
/// and that ends the file, or zeros to the end (the file grew, its data
/// never came). A bad frame followed by more bytes is damage, not a torn
/// write.
fn torn_tail(rest: &[u8], e: &DecodeError) -> bool {
    if rest.iter().all(|b| *b == 0) {
        return true;
    }
    match e {
        DecodeError::Truncated => true,
        DecodeError::Checksum { .. } => {
            let len = u32::from_le_bytes(rest[8..12].try_into().expect("4 bytes")) as usize;
            HEADER_LEN + len == rest.len()
        }
        _ => false,
    }
}

fn read_marker(path: &Path) -> u64 {
    let Ok(b) = std::fs::read(path) else { return 0 };
    if b.len() < 16 {
        return 0;
    }
    let seq = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    let check = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    if check == !seq {
        seq
    } else {
        0
    }
}

/// Keeps `member` as the member id of the log in `dir`.
pub(crate) fn keep_member(dir: &Path, member: &str) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io_error("create", dir, e))?;
    let path = dir.join(MEMBER);
    let tmp = dir.join("MEMBER.tmp");
    std::fs::write(&tmp, member)
        .and_then(|()| File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| io_error("write", &path, e))?;
    sync_dir(dir)
}

/// Deletes every log file in `dir` (a master that starts a new history).
pub(crate) fn clear(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    for (_, path) in list_files(dir)? {
        std::fs::remove_file(&path).map_err(|e| io_error("remove", &path, e))?;
    }
    let _ = std::fs::remove_file(dir.join(COMMITTED));
    sync_dir(dir)
}

/// Deletes the files whose first entry is after `seq`.
fn remove_after(dir: &Path, seq: u64) -> Result<()> {
    for (first, path) in list_files(dir)? {
        if first > seq {
            std::fs::remove_file(&path).map_err(|e| io_error("remove", &path, e))?;
        }
    }
    Ok(())
}

fn create(dir: &Path, first: u64) -> Result<Current> {
    let path = file_name(dir, first);
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .map_err(|e| io_error("create", &path, e))?;
    sync_dir(dir)?;
    Ok(Current {
        file: Arc::new(file),
        path,
        first,
        last: first - 1,
        bytes: 0,
    })
}

impl DiskLog {
    /// Opens the log in `dir` to append entries after `last` (what
    /// [`recover`] found, or a snapshot's position), in a new file, and
    /// starts its syncer.
    pub(crate) fn start(dir: &Path, last: u64, sync_ack: bool) -> Result<Arc<DiskLog>> {
        std::fs::create_dir_all(dir).map_err(|e| io_error("create", dir, e))?;
        // Files wholly after `last` (a torn or replaced tail) must not
        // come back at the next start.
        remove_after(dir, last + 1)?;
        let current = create(dir, last + 1)?;
        let log = Arc::new(DiskLog {
            dir: dir.to_path_buf(),
            sync_ack,
            pending: Mutex::new(Pending {
                buf: Vec::new(),
                last,
            }),
            current: Mutex::new(current),
            written: AtomicU64::new(last),
            synced: Mutex::new(Synced { gen: 0, seq: last }),
            synced_cv: Condvar::new(),
            committed: AtomicU64::new(0),
            wake: Condvar::new(),
            wake_lock: Mutex::new(false),
            failed: Mutex::new(None),
            stop: AtomicBool::new(false),
            #[cfg(test)]
            sync_gate: Mutex::new(()),
            #[cfg(test)]
            probe: Mutex::new(None),
            #[cfg(test)]
            steps: Mutex::new(None),
        });
        let l = log.clone();
        std::thread::Builder::new()
            .name("mc-ha-wal".into())
            .spawn(move || l.sync_loop())
            .map_err(|e| io_error("start syncer for", dir, e))?;
        Ok(log)
    }

    /// Queues entry `seq`'s frame (the next one, in order).
    pub(crate) fn append(&self, seq: u64, frame: &[u8]) {
        let mut p = self.pending.lock();
        p.buf.extend_from_slice(frame);
        p.last = seq;
    }

    /// Notes the commit point this master knows.
    pub(crate) fn note_committed(&self, seq: u64) {
        self.committed.fetch_max(seq, Ordering::Relaxed);
    }

    fn check(&self) -> Result<()> {
        match &*self.failed.lock() {
            Some(why) => Err(Error::new(ErrorCode::FILE_WRITE_FAIL, why.clone())),
            None => Ok(()),
        }
    }

    /// Why the log failed, once it has: nothing more is acknowledged.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failed.lock().clone()
    }

    fn fail(&self, e: &Error) {
        tracing::error!("{e}; this master acknowledges no more writes");
        *self.failed.lock() = Some(e.to_string());
        self.synced_cv.notify_all();
    }

    /// Writes every queued entry up to `seq` (and those queued with it),
    /// unless already written; then, with `--ha_wal_sync_ack`, waits for
    /// their sync.
    pub(crate) fn write_through(&self, seq: u64) -> Result<()> {
        if self.written.load(Ordering::Acquire) < seq {
            self.write_pending()?;
        }
        self.check()?;
        if self.sync_ack {
            let mut s = self.synced.lock();
            while s.seq < seq {
                self.check()?;
                #[cfg(test)]
                if let Some(p) = &*self.probe.lock() {
                    let _ = p.send("waits for its sync");
                }
                self.synced_cv.wait_for(&mut s, SYNC_IDLE);
            }
        }
        Ok(())
    }

    /// Writes whatever is queued.
    fn write_pending(&self) -> Result<()> {
        let mut cur = self.current.lock();
        let (buf, last) = {
            let mut p = self.pending.lock();
            (std::mem::take(&mut p.buf), p.last)
        };
        if buf.is_empty() {
            return Ok(());
        }
        let r = (&*cur.file)
            .write_all(&buf)
            .map_err(|e| io_error("write", &cur.path, e));
        if let Err(e) = &r {
            self.fail(e);
            return r;
        }
        cur.last = last;
        cur.bytes += buf.len() as u64;
        self.written.store(last, Ordering::Release);
        let rotate = cur.bytes >= ROTATE_AT;
        // The buffer goes back for reuse.
        let mut buf = buf;
        buf.clear();
        {
            let mut p = self.pending.lock();
            if p.buf.is_empty() && p.buf.capacity() < buf.capacity() {
                p.buf = buf;
            }
        }
        if rotate {
            self.rotate(&mut cur)?;
        }
        drop(cur);
        *self.wake_lock.lock() = true;
        self.wake.notify_one();
        Ok(())
    }

    /// Closes the current file (synced) for a new one after its last entry.
    fn rotate(&self, cur: &mut Current) -> Result<()> {
        let next = cur.last + 1;
        let r = cur
            .file
            .sync_data()
            .map_err(|e| io_error("sync", &cur.path, e))
            .and_then(|()| create(&self.dir, next));
        match r {
            Ok(c) => {
                *cur = c;
                Ok(())
            }
            Err(e) => {
                self.fail(&e);
                Err(e)
            }
        }
    }

    /// Drops every entry after `seq` (a standby's tail its new leader
    /// does not have): later entries go to a new file starting at
    /// `seq + 1`, which replaces them.
    pub(crate) fn truncate_after(&self, seq: u64) -> Result<()> {
        // A failed log is left as it is (see `remove_through`).
        self.check()?;
        let mut cur = self.current.lock();
        {
            let mut p = self.pending.lock();
            p.buf.clear();
            p.last = p.last.min(seq);
        }
        if cur.last <= seq && cur.first <= seq + 1 {
            return Ok(());
        }
        // What stays of the current file is synced before it is left: the
        // syncer only syncs the file being written, and counts for the
        // entries after `seq` only once it has synced them.
        let kept = if cur.first <= seq {
            cur.file
                .sync_data()
                .map_err(|e| io_error("sync", &cur.path, e))
        } else {
            Ok(())
        };
        let next = kept
            .and_then(|()| remove_after(&self.dir, seq + 1))
            .and_then(|()| create(&self.dir, seq + 1));
        self.go_on_after(&mut cur, seq, next)
    }

    /// Starts the log over after entry `seq` (a standby that loaded its
    /// leader's snapshot at `seq`): every file goes.
    pub(crate) fn restart_after(&self, seq: u64) -> Result<()> {
        let mut cur = self.current.lock();
        {
            let mut p = self.pending.lock();
            p.buf.clear();
            p.last = seq;
        }
        let next = clear(&self.dir).and_then(|()| create(&self.dir, seq + 1));
        self.go_on_after(&mut cur, seq, next)
    }

    /// The log goes on after entry `seq` in `next`, the file a truncation
    /// or a restart made (nothing past `seq` is written or synced any
    /// more); a failure to make it fails the log.
    fn go_on_after(&self, cur: &mut Current, seq: u64, next: Result<Current>) -> Result<()> {
        match next {
            Ok(c) => {
                *cur = c;
                self.written.store(seq, Ordering::Release);
                self.synced.lock().cut(seq);
                Ok(())
            }
            Err(e) => {
                self.fail(&e);
                Err(e)
            }
        }
    }

    /// Deletes the files holding only entries up to `seq` (a stored
    /// snapshot holds them); the current file is closed first if it is
    /// one of them.
    pub(crate) fn remove_through(&self, seq: u64) -> Result<usize> {
        // Once a write failed, the current file may end in a torn frame,
        // which a restart cuts off only at the end of the last file: a new
        // file after it would make the restart fail for good.
        self.check()?;
        {
            let mut cur = self.current.lock();
            if cur.first <= seq && cur.last >= cur.first {
                self.rotate(&mut cur)?;
            }
        }
        let files = list_files(&self.dir)?;
        let mut removed = 0;
        for pair in files.windows(2) {
            let (_, path) = &pair[0];
            if pair[1].0 <= seq + 1 {
                std::fs::remove_file(path).map_err(|e| io_error("remove", path, e))?;
                removed += 1;
            }
        }
        if removed > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(removed)
    }

    #[cfg(test)]
    fn step(&self, what: &'static str) {
        let tx = self.steps.lock().clone();
        if let Some(tx) = tx {
            let _ = tx.send(what);
        }
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        *self.wake_lock.lock() = true;
        self.wake.notify_one();
    }

    fn sync_loop(self: Arc<Self>) {
        let marker = self.dir.join(COMMITTED);
        let marker = match OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&marker)
        {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::warn!("replicated log: {}: {e}", marker.display());
                None
            }
        };
        let mut noted = 0;
        while !self.stop.load(Ordering::SeqCst) {
            {
                let mut woken = self.wake_lock.lock();
                if !*woken {
                    self.wake.wait_for(&mut woken, SYNC_IDLE);
                }
                *woken = false;
            }
            // Entries no call waits for (background mutations) are
            // written here.
            if self.write_pending().is_err() {
                return;
            }
            // The generation is read with the file, under the same lock a
            // cut holds.
            let (file, upto, path, gen, behind) = {
                let cur = self.current.lock();
                let s = *self.synced.lock();
                let behind = cur.last > s.seq;
                (cur.file.clone(), cur.last, cur.path.clone(), s.gen, behind)
            };
            if behind {
                #[cfg(test)]
                self.step("syncs");
                #[cfg(test)]
                let gate = self.sync_gate.lock();
                let r = file.sync_data();
                #[cfg(test)]
                drop(gate);
                if let Err(e) = r {
                    self.fail(&io_error("sync", &path, e));
                    return;
                }
                self.synced.lock().raise(gen, upto);
                self.synced_cv.notify_all();
                #[cfg(test)]
                self.step("synced");
            }
            let committed = self.committed.load(Ordering::Relaxed).min(upto);
            if committed != noted {
                if let Some(f) = &marker {
                    let mut b = [0u8; 16];
                    b[..8].copy_from_slice(&committed.to_le_bytes());
                    b[8..].copy_from_slice(&(!committed).to_le_bytes());
                    if f.write_all_at(&b, 0).is_ok() {
                        noted = committed;
                    }
                }
            }
        }
        let _ = self.write_pending();
    }
}

#[cfg(test)]
mod tests;
