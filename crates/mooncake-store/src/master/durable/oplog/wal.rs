//! The local write-ahead log: every mutation the master applies, framed
//! as entries (`codec`) in numbered files, written by one thread that
//! commits whatever has gathered since its last write with one
//! `fdatasync` (group commit).
//!
//! The sink side ([`WalSink`]) only queues the mutation and returns its
//! position, which the call records (`mutation::Call`); the RPC thread
//! that made the call then waits, after the call and outside every lock,
//! until the writer has made that position durable ([`Wal::wait_for`]). A
//! call is acknowledged only after its mutations are on disk.
//!
//! Files are `wal-<first seq, 20 digits>.log` in the log directory. A
//! snapshot cuts the log ([`Wal::rotate`]): the current file is closed at
//! an entry boundary and later entries go to a new file, so a snapshot
//! can be built from the closed files alone and the files it covers
//! deleted ([`Wal::remove_through`]).

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};

use super::codec::{self, DecodeError};
use super::{OwnedEntry, OwnedMutation};
use crate::master::state::mutation::{Mutation, MutationSink, Release};

/// Mutations per entry at most (entries stay far below the frame limit).
const MAX_MUTATIONS_PER_ENTRY: usize = 4096;

/// Group-commit statistics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WalStats {
    /// Write + sync rounds.
    pub commits: u64,
    /// Mutations made durable.
    pub mutations: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Entries written.
    pub entries: u64,
}

struct Queue {
    mutations: Vec<OwnedMutation>,
    /// Position of the last queued mutation (mutations queued ever).
    queued: u64,
    /// A snapshot asked for a cut: answered with the last seq before it.
    rotate: Vec<std::sync::mpsc::Sender<Result<u64>>>,
    /// Marks at mutation positions (`Wal::mark`): an entry ends at each,
    /// and each is answered with that entry's seq.
    marks: Vec<(u64, std::sync::mpsc::Sender<Result<u64>>)>,
    stop: bool,
}

struct Durable {
    position: u64,
    /// Set when a write or sync failed: nothing is acknowledged after it.
    failed: Option<String>,
}

/// A write-ahead log being written.
pub struct Wal {
    dir: PathBuf,
    sync: bool,
    queue: Mutex<Queue>,
    wake_writer: Condvar,
    durable: Mutex<Durable>,
    wake_waiters: Condvar,
    stats: Mutex<WalStats>,
}

/// The sink that feeds a [`Wal`].
pub struct WalSink(pub Arc<Wal>);

impl MutationSink for WalSink {
    fn applied(&self, m: &Mutation<'_>) -> Release {
        let owned = OwnedMutation::from_mutation(m);
        let mut q = self.0.queue.lock();
        q.mutations.push(owned);
        q.queued += 1;
        let at = q.queued;
        drop(q);
        self.0.wake_writer.notify_one();
        Release::Durable(at)
    }
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::new(
        ErrorCode::FILE_WRITE_FAIL,
        format!("write-ahead log: {what} {}: {e}", path.display()),
    )
}

/// The path of the log file whose first entry is `seq`.
pub fn file_name(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("wal-{first_seq:020}.log"))
}

/// The log files in `dir`, by first seq.
pub fn list_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let read = std::fs::read_dir(dir).map_err(|e| {
        Error::new(
            ErrorCode::FILE_OPEN_FAIL,
            format!("write-ahead log directory {}: {e}", dir.display()),
        )
    })?;
    let mut files = Vec::new();
    for ent in read.flatten() {
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(num) = name
            .strip_prefix("wal-")
            .and_then(|n| n.strip_suffix(".log"))
        else {
            continue;
        };
        if let Ok(seq) = num.parse::<u64>() {
            files.push((seq, ent.path()));
        }
    }
    files.sort();
    Ok(files)
}

/// What reading a log found.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Entries after `after`, in order.
    pub entries: Vec<OwnedEntry>,
    /// The last seq in the log (`after` when it holds nothing later).
    pub last_seq: u64,
    /// Bytes of a torn last write that were cut off.
    pub torn_bytes: u64,
}

/// Reads every entry after seq `after` from the log in `dir`. A frame cut
/// short at the very end (a write the crash interrupted, never
/// acknowledged) is cut off the file; damage anywhere else, or a gap in
/// the sequence, is an error: the log cannot be trusted past it.
///
/// With `upto`, reads only the closed files holding entries up to it (a
/// snapshot's view, while the writer goes on in a later file) and repairs
/// nothing.
pub fn recover(dir: &Path, after: u64, upto: Option<u64>) -> Result<Recovered> {
    let mut entries = Vec::new();
    let tail = recover_each(dir, after, upto, &mut |e| {
        entries.push(e);
        Ok(())
    })?;
    Ok(Recovered {
        entries,
        last_seq: tail.last_seq,
        torn_bytes: tail.torn_bytes,
    })
}

/// What [`recover_each`] read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    /// Entries after `after` handed on.
    pub entries: usize,
    /// The last seq in the log (`after` when it holds nothing later).
    pub last_seq: u64,
    /// Bytes of a torn last write that were cut off.
    pub torn_bytes: u64,
}

/// [`recover`], handing each entry after `after` to `each` as it is
/// decoded rather than collecting them: a restore applies a long log
/// without holding it. An error from `each` stops the read and is
/// returned; so is damage found after entries were handed on (the caller
/// drops what it applied).
pub fn recover_each(
    dir: &Path,
    after: u64,
    upto: Option<u64>,
    each: &mut dyn FnMut(OwnedEntry) -> Result<()>,
) -> Result<Tail> {
    let mut files = list_files(dir)?;
    if let Some(upto) = upto {
        files.retain(|(first, _)| *first <= upto);
    }
    let mut out = Tail {
        last_seq: after,
        ..Tail::default()
    };
    let mut expected: Option<u64> = None;
    // Files wholly before `after` are skipped: a file ends where the next begins.
    let skip = files.windows(2).take_while(|w| w[1].0 <= after + 1).count();
    let files = &files[skip..];
    let n = files.len();
    for (i, (first, path)) in files.iter().enumerate() {
        // A snapshot's view reads closed files and repairs nothing; a
        // recovery makes what it reads durable before it serves from it.
        let read = match upto {
            Some(_) => std::fs::read(path),
            None => read_durable(path),
        };
        let bytes = read.map_err(|e| {
            Error::new(
                ErrorCode::FILE_READ_FAIL,
                format!("write-ahead log {}: {e}", path.display()),
            )
        })?;
        let mut at = 0;
        while at < bytes.len() {
            match codec::decode_prefix(&bytes[at..]) {
                Ok((entry, used)) => {
                    if let Some(want) = expected {
                        if entry.seq != want {
                            return Err(Error::new(
                                ErrorCode::DESERIALIZE_FAIL,
                                format!(
                                    "write-ahead log {}: entry {} where {want} was expected",
                                    path.display(),
                                    entry.seq
                                ),
                            ));
                        }
                    } else if entry.seq != *first {
                        return Err(Error::new(
                            ErrorCode::DESERIALIZE_FAIL,
                            format!(
                                "write-ahead log {} starts at entry {}",
                                path.display(),
                                entry.seq
                            ),
                        ));
                    }
                    expected = Some(entry.seq + 1);
                    out.last_seq = out.last_seq.max(entry.seq);
                    if entry.seq > after && upto.is_none_or(|u| entry.seq <= u) {
                        if out.entries == 0 && entry.seq != after + 1 {
                            return Err(Error::new(
                                ErrorCode::DESERIALIZE_FAIL,
                                format!(
                                    "write-ahead log in {} starts at entry {}, after a gap from {after}",
                                    dir.display(),
                                    entry.seq
                                ),
                            ));
                        }
                        out.entries += 1;
                        each(entry)?;
                    }
                    at += used;
                }
                Err(DecodeError::Truncated) if i + 1 == n && upto.is_none() => {
                    let torn = (bytes.len() - at) as u64;
                    tracing::warn!(
                        file = %path.display(),
                        bytes = torn,
                        "write-ahead log ends in a torn write; cutting it off"
                    );
                    let f = OpenOptions::new()
                        .write(true)
                        .open(path)
                        .map_err(|e| io_error("open", path, e))?;
                    f.set_len(at as u64)
                        .and_then(|_| f.sync_all())
                        .map_err(|e| io_error("truncate", path, e))?;
                    out.torn_bytes = torn;
                    break;
                }
                Err(e) => {
                    return Err(Error::new(
                        ErrorCode::DESERIALIZE_FAIL,
                        format!("write-ahead log {} at byte {at}: {e}", path.display()),
                    ))
                }
            }
        }
    }
    if upto.is_none() && n > 0 {
        sync_dir(dir)?;
    }
    Ok(out)
}

/// Reads a log file at recovery and `fsync`s it before its entries are
/// used: a process killed after `write` and before its `fdatasync` (or
/// one not syncing) left them in the page cache only, and the restarted
/// master serves them, and as a standby acknowledges them as held, so a
/// crash of the machine afterwards must not take them back.
pub(crate) fn read_durable(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut f = File::open(path)?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    f.sync_all()?;
    #[cfg(test)]
    SYNCED.with(|s| s.borrow_mut().push(path.to_path_buf()));
    Ok(bytes)
}

/// `fsync`s the directory `dir` (its entries: files created, renamed or
/// removed).
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("sync directory", dir, e))?;
    #[cfg(test)]
    SYNCED.with(|s| s.borrow_mut().push(dir.to_path_buf()));
    Ok(())
}

#[cfg(test)]
thread_local! {
    /// Tests: the files and directories this thread `fsync`ed.
    pub(crate) static SYNCED: std::cell::RefCell<Vec<PathBuf>> = const {
        std::cell::RefCell::new(Vec::new())
    };
}

impl Wal {
    /// Starts a log in `dir` (created if needed) whose next entry is
    /// `next_seq`, in a new file, with its writer thread. With `sync`,
    /// every commit is `fdatasync`ed before it counts as durable; without,
    /// it is durable as soon as written (it survives the process, not the
    /// machine).
    pub fn start(dir: &Path, next_seq: u64, sync: bool) -> Result<Arc<Wal>> {
        std::fs::create_dir_all(dir).map_err(|e| io_error("create", dir, e))?;
        let wal = Arc::new(Wal {
            dir: dir.to_path_buf(),
            sync,
            queue: Mutex::new(Queue {
                mutations: Vec::new(),
                queued: 0,
                rotate: Vec::new(),
                marks: Vec::new(),
                stop: false,
            }),
            wake_writer: Condvar::new(),
            durable: Mutex::new(Durable {
                position: 0,
                failed: None,
            }),
            wake_waiters: Condvar::new(),
            stats: Mutex::new(WalStats::default()),
        });
        let file = wal.create_file(next_seq)?;
        let w = wal.clone();
        std::thread::Builder::new()
            .name("mc-wal".into())
            .spawn(move || w.write_loop(file, next_seq))
            .map_err(|e| io_error("start writer for", dir, e))?;
        Ok(wal)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn stats(&self) -> WalStats {
        *self.stats.lock()
    }

    fn create_file(&self, first_seq: u64) -> Result<(File, PathBuf)> {
        let path = file_name(&self.dir, first_seq);
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .map_err(|e| io_error("create", &path, e))?;
        sync_dir(&self.dir)?;
        Ok((f, path))
    }

    /// Waits until position `pos` is durable.
    pub fn wait_for(&self, pos: u64) -> Result<()> {
        let mut d = self.durable.lock();
        loop {
            if let Some(why) = &d.failed {
                return Err(Error::new(ErrorCode::FILE_WRITE_FAIL, why.clone()));
            }
            if d.position >= pos {
                return Ok(());
            }
            self.wake_waiters.wait(&mut d);
        }
    }

    /// The position of the last mutation queued.
    pub fn queued(&self) -> u64 {
        self.queue.lock().queued
    }

    /// Marks the log after the last mutation queued: the writer ends an
    /// entry there (mutations share entries otherwise) and answers with its
    /// seq, which is then the position of exactly the mutations queued so
    /// far (a snapshot's cut, taken while no mutation is being logged).
    pub fn mark(&self) -> std::sync::mpsc::Receiver<Result<u64>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut q = self.queue.lock();
        let at = q.queued;
        q.marks.push((at, tx));
        drop(q);
        self.wake_writer.notify_one();
        rx
    }

    /// Waits until everything queued so far is durable.
    pub fn flush(&self) -> Result<()> {
        let pos = self.queue.lock().queued;
        self.wait_for(pos)
    }

    /// Cuts the log: what is queued is written to the current file, which
    /// is closed; later entries go to a new file. Returns the seq of the
    /// last entry before the cut.
    pub fn rotate(&self) -> Result<u64> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.queue.lock().rotate.push(tx);
        self.wake_writer.notify_one();
        rx.recv().unwrap_or_else(|_| {
            Err(Error::new(
                ErrorCode::INTERNAL_ERROR,
                "write-ahead log writer stopped",
            ))
        })
    }

    /// Deletes the files holding only entries up to `seq` (a snapshot
    /// covers them).
    pub fn remove_through(&self, seq: u64) -> Result<usize> {
        let files = list_files(&self.dir)?;
        let mut removed = 0;
        // A file ends where the next begins.
        for pair in files.windows(2) {
            let (_, path) = &pair[0];
            let (next_first, _) = pair[1];
            if next_first <= seq + 1 {
                std::fs::remove_file(path).map_err(|e| io_error("remove", path, e))?;
                removed += 1;
            }
        }
        if removed > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(removed)
    }

    /// Stops the writer once what is queued is written.
    pub fn stop(&self) {
        self.queue.lock().stop = true;
        self.wake_writer.notify_one();
    }

    fn write_loop(self: Arc<Self>, mut file: (File, PathBuf), mut next_seq: u64) {
        let mut buf = Vec::new();
        loop {
            let (batch, upto, rotate, marks, stop) = {
                let mut q = self.queue.lock();
                while q.mutations.is_empty() && q.rotate.is_empty() && q.marks.is_empty() && !q.stop
                {
                    self.wake_writer.wait(&mut q);
                }
                (
                    std::mem::take(&mut q.mutations),
                    q.queued,
                    std::mem::take(&mut q.rotate),
                    std::mem::take(&mut q.marks),
                    q.stop,
                )
            };
            let at: Vec<u64> = marks.iter().map(|(p, _)| *p).collect();
            let mut marked = Vec::with_capacity(at.len());
            let result = self.commit(
                &mut file,
                &mut buf,
                batch,
                &mut next_seq,
                upto,
                &at,
                &mut marked,
            );
            for ((_, tx), seq) in marks
                .into_iter()
                .zip(marked.into_iter().map(Some).chain(std::iter::repeat(None)))
            {
                let _ = tx.send(match (&result, seq) {
                    (Ok(()), Some(seq)) => Ok(seq),
                    (Err(e), _) => Err(e.clone()),
                    (Ok(()), None) => Err(Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        "write-ahead log: a mark outside the batch",
                    )),
                });
            }
            let result = result.and_then(|()| {
                if rotate.is_empty() {
                    return Ok(());
                }
                file = self.create_file(next_seq)?;
                Ok(())
            });
            if let Err(e) = &result {
                tracing::error!("{e}; the master acknowledges no more writes");
                self.durable.lock().failed = Some(e.to_string());
                self.wake_waiters.notify_all();
            }
            for tx in rotate {
                let _ = tx.send(result.clone().map(|()| next_seq - 1));
            }
            if stop || result.is_err() {
                return;
            }
        }
    }

    /// Writes `batch` (the mutations up to position `upto`) as entries and
    /// syncs; then `upto` is durable. An entry ends at each position of
    /// `marks` (ascending, within the batch), whose seqs go to `marked`.
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &self,
        (file, path): &mut (File, PathBuf),
        buf: &mut Vec<u8>,
        batch: Vec<OwnedMutation>,
        next_seq: &mut u64,
        upto: u64,
        marks: &[u64],
        marked: &mut Vec<u64>,
    ) -> Result<()> {
        let mut pos = upto - batch.len() as u64;
        let mut marks = marks.iter().copied().peekable();
        // Marks where the batch starts: the previous entry ends there.
        while marks.next_if(|&m| m <= pos).is_some() {
            marked.push(*next_seq - 1);
        }
        if batch.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        buf.clear();
        let n = batch.len() as u64;
        let mut entries = 0;
        let mut it = batch.into_iter().peekable();
        while it.peek().is_some() {
            let room = match marks.peek() {
                Some(&m) => (m - pos).min(MAX_MUTATIONS_PER_ENTRY as u64) as usize,
                None => MAX_MUTATIONS_PER_ENTRY,
            };
            let entry = OwnedEntry {
                seq: *next_seq,
                term: 0,
                mutations: it.by_ref().take(room).collect(),
            };
            pos += entry.mutations.len() as u64;
            entry.encode_into(buf);
            while marks.next_if(|&m| m <= pos).is_some() {
                marked.push(*next_seq);
            }
            *next_seq += 1;
            entries += 1;
        }
        file.write_all(buf)
            .map_err(|e| io_error("write", path, e))?;
        if self.sync {
            file.sync_data().map_err(|e| io_error("sync", path, e))?;
        }
        self.durable.lock().position = upto;
        self.wake_waiters.notify_all();
        let mut s = self.stats.lock();
        s.commits += 1;
        s.mutations += n;
        s.bytes += buf.len() as u64;
        s.entries += entries;
        tracing::trace!(mutations = n, elapsed = ?started.elapsed(), "wal commit");
        Ok(())
    }
}
