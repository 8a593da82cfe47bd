//! Readahead for values read one at a time in the order they were written.
//!
//! The tier reads with `O_DIRECT`, so the kernel's readahead never runs:
//! each lone read waits for its request, then the caller checksums it while
//! the disk idles. A bucket's objects are written back to back, and objects
//! put together tend to be read together (a request's prefix blocks), so
//! once two reads of a bucket follow each other, a background thread reads
//! the next windows of the file while the caller checksums and uses what it
//! has. A read that a window covers copies from it; the caller verifies the
//! checksum as for any read, so a window never serves bytes the file's
//! checksum does not vouch for.
//!
//! Windows stay valid for every object still indexed: a bucket's bytes never
//! change after its seal, except blocks punched out of objects that left
//! the index, and unit ids are never reused.

use super::format::{align_up, DIO_ALIGN};
use super::io::{AlignedBuf, DiskFile, IoEngine};
use super::unit_files::UnitId;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Bytes one readahead request reads.
pub const WINDOW: usize = 4 << 20;
/// Bytes kept read ahead of a sequential reader.
pub const AHEAD_BYTES: u64 = 16 << 20;
/// Windows held at most (in flight or ready), across all streams: a
/// stream's windows ahead (at least one per unit, so small buckets take
/// more windows than bytes) and the one being read.
const MAX_WINDOWS: usize = 16;
/// Units whose last read position is remembered.
const MAX_STREAMS: usize = 16;
/// How long a read waits for a window in flight before reading the file
/// itself.
const WAIT: std::time::Duration = std::time::Duration::from_secs(2);

enum Fill {
    InFlight,
    /// The bytes read (fewer than the window at the end of the file).
    Ready(Arc<AlignedBuf>, usize),
    Failed,
}

struct Window {
    unit: UnitId,
    start: u64,
    fill: Fill,
}

struct Stream {
    /// The unit of the last read.
    unit: UnitId,
    /// Where the last read ended.
    end: u64,
    /// Where the windows scheduled so far end: (unit, offset), in write
    /// order.
    ahead: (UnitId, u64),
}

/// A unit on a reader's way: its data file and where its last value ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub unit: UnitId,
    pub data: PathBuf,
    pub end: u64,
}

#[derive(Default)]
struct State {
    streams: VecDeque<Stream>,
    windows: VecDeque<Window>,
    spare: Vec<AlignedBuf>,
}

struct Job {
    unit: UnitId,
    start: u64,
    /// Bytes to read: up to the unit's last value, at most a window.
    len: usize,
    path: PathBuf,
    /// A recycled buffer; the thread allocates one when there is none, so
    /// a reader never waits for a new buffer to be zeroed.
    buf: Option<AlignedBuf>,
}

struct Shared {
    state: Mutex<State>,
    filled: Condvar,
}

pub struct Readahead {
    shared: Arc<Shared>,
    /// Reads served from windows.
    hits: AtomicU64,
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Readahead {
    pub fn new(engine: Arc<dyn IoEngine>) -> std::io::Result<Readahead> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            filled: Condvar::new(),
        });
        let (jobs, rx) = channel::<Job>();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("tier-readahead".into())
            .spawn(move || {
                // The buffers are made before any read needs one: the
                // kernel zeroes a fresh page on first touch, which here
                // costs about as much as reading it from the disk, and a
                // tier's first sequential reader would pay it window by
                // window. Jobs queued meanwhile wait for this, once.
                for _ in 0..MAX_WINDOWS {
                    let buf = AlignedBuf::new(WINDOW);
                    let mut st = s.state.lock();
                    if st.windows.len() + st.spare.len() >= MAX_WINDOWS {
                        break;
                    }
                    st.spare.push(buf);
                }
                for job in rx {
                    let mut buf = job.buf.unwrap_or_else(|| AlignedBuf::new(WINDOW));
                    let read = DiskFile::open_read(&job.path)
                        .ok()
                        .and_then(|f| engine.read_at(&f, &mut buf[..job.len], job.start).ok());
                    let mut st = s.state.lock();
                    let slot = st
                        .windows
                        .iter_mut()
                        .find(|w| w.unit == job.unit && w.start == job.start);
                    match (slot, read) {
                        (Some(w), Some(n)) => w.fill = Fill::Ready(Arc::new(buf), n),
                        (Some(w), None) => {
                            w.fill = Fill::Failed;
                            keep_spare(&mut st, buf);
                        }
                        // Dropped meanwhile: nobody waits for it.
                        (None, _) => keep_spare(&mut st, buf),
                    }
                    drop(st);
                    s.filled.notify_all();
                }
            })?;
        Ok(Readahead {
            shared,
            hits: AtomicU64::new(0),
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Copies `[offset, offset + dst.len())` of `unit` into `dst` from the
    /// windows, waiting for one in flight. `false` (and `dst` unspecified)
    /// when the windows do not hold all of it.
    pub fn read(&self, unit: UnitId, offset: u64, dst: &mut [u8]) -> bool {
        let mut done = 0usize;
        while done < dst.len() {
            let at = offset + done as u64;
            let buf = {
                let mut st = self.shared.state.lock();
                loop {
                    let w = st
                        .windows
                        .iter()
                        .find(|w| w.unit == unit && w.start <= at && at < w.start + WINDOW as u64);
                    match w.map(|w| (&w.fill, w.start)) {
                        None | Some((Fill::Failed, _)) => return false,
                        Some((Fill::InFlight, _)) => {
                            // Bounded: a read never hangs on a stuck window.
                            let r = self.shared.filled.wait_for(&mut st, WAIT);
                            if r.timed_out() {
                                return false;
                            }
                        }
                        Some((Fill::Ready(buf, n), start)) => break (buf.clone(), *n, start),
                    }
                }
            };
            let (buf, valid, start) = buf;
            let from = (at - start) as usize;
            if from >= valid {
                return false; // past the end of the file
            }
            let n = (valid - from).min(dst.len() - done);
            dst[done..done + n].copy_from_slice(&buf[from..from + n]);
            done += n;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Reads served from windows so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Notes a read of `[start, end)` of `unit`; `route` is that unit and
    /// the units written after it, in write order ([`Span`]s, as far as
    /// [`AHEAD_BYTES`] past it). A read that continues a stream (it starts
    /// where the stream's previous read ended, inside what the stream read
    /// ahead, or at the start of the unit after the one the stream
    /// finished) keeps windows scheduled up to [`AHEAD_BYTES`] past it,
    /// through the end of its unit into the next ones: a bucket's objects
    /// were written back to back and the next bucket right after, so a
    /// reader in write order crosses units without waiting for the disk. A
    /// read at the start of a unit that continues nothing schedules within
    /// that unit only. Windows the stream has passed go.
    pub fn advance(&self, unit: UnitId, start: u64, end: u64, route: &[Span]) {
        let mut st = self.shared.state.lock();
        let at = (unit, start);
        // Objects written together are not always read in that order (an
        // eviction round writes its victims in its own order): a read of
        // bytes a window holds continues the stream too, even behind its
        // last read.
        let covered = st
            .windows
            .iter()
            .any(|w| w.unit == unit && w.start <= start && start < w.start + WINDOW as u64);
        let pos = st.streams.iter().position(|s| {
            (s.unit == unit && start >= s.end && start <= align_up(s.end, DIO_ALIGN as u64))
                || ((s.unit, s.end) <= at && at <= s.ahead)
                || (covered && at <= s.ahead)
        });
        let from = (unit, end / DIO_ALIGN as u64 * DIO_ALIGN as u64);
        // Windows stay until their room is needed; those behind the
        // reader go first (`schedule`).
        let (mut next, cross) = match pos {
            Some(i) => {
                let s = st.streams.remove(i).expect("found");
                (s.ahead.max(from), true)
            }
            None => (from, false),
        };
        if (cross || start == 0) && route.first().is_some_and(|s| s.unit == unit) {
            next = self.schedule_along(&mut st, route, end, at, next, cross);
        }
        st.streams.push_front(Stream {
            unit,
            end,
            ahead: next,
        });
        st.streams.truncate(MAX_STREAMS);
    }

    /// Schedules windows from `next` along `route` (whose first unit the
    /// read from `reader` to `end` is in) until [`AHEAD_BYTES`] past it,
    /// or until the windows are all in use,
    /// into the following units only when `cross`. Returns where the
    /// scheduled windows end.
    fn schedule_along(
        &self,
        st: &mut State,
        route: &[Span],
        end: u64,
        reader: (UnitId, u64),
        mut next: (UnitId, u64),
        cross: bool,
    ) -> (UnitId, u64) {
        let Some(mut i) = route.iter().position(|s| s.unit == next.0) else {
            return next;
        };
        // Bytes of the route from the read's end to the start of unit `i`.
        let mut before: u64 = route[..i].iter().map(|s| s.end).sum::<u64>();
        let read_end = end;
        loop {
            let span = &route[i];
            if next.1 >= span.end {
                if i + 1 >= route.len() {
                    return next;
                }
                before += span.end;
                i += 1;
                next = (route[i].unit, 0);
                if !cross {
                    // The stream reached its unit's end: a read at the
                    // start of the next unit continues it.
                    return next;
                }
                continue;
            }
            if (before + next.1).saturating_sub(read_end) >= AHEAD_BYTES {
                return next;
            }
            let len = align_up(span.end - next.1, DIO_ALIGN as u64).min(WINDOW as u64) as usize;
            if !self.schedule(st, reader, span.unit, next.1, len, &span.data) {
                return next;
            }
            next.1 += WINDOW as u64;
        }
    }

    /// Queues a window unless one covers `start` already; `false` when
    /// there is no room. The oldest ready window makes way if needed (the
    /// windows a reader has passed are the oldest),
    /// except one between `reader` (where the read that schedules is) and
    /// this window: those are about to be read, and dropping them to read
    /// further ahead would only make the reader read the file itself.
    fn schedule(
        &self,
        st: &mut State,
        reader: (UnitId, u64),
        unit: UnitId,
        start: u64,
        len: usize,
        path: &std::path::Path,
    ) -> bool {
        if st
            .windows
            .iter()
            .any(|w| w.unit == unit && w.start == start)
        {
            return true;
        }
        if st.windows.len() >= MAX_WINDOWS {
            let Some(i) = st.windows.iter().position(|w| {
                let ahead =
                    (w.unit, w.start + WINDOW as u64) > reader && (w.unit, w.start) < (unit, start);
                !matches!(w.fill, Fill::InFlight) && !ahead
            }) else {
                return false;
            };
            remove_window(st, i);
        }
        let job = Job {
            unit,
            start,
            len,
            path: path.to_path_buf(),
            buf: st.spare.pop(),
        };
        match self.jobs.as_ref().map(|j| j.send(job)) {
            Some(Ok(())) => {
                st.windows.push_back(Window {
                    unit,
                    start,
                    fill: Fill::InFlight,
                });
                true
            }
            _ => false,
        }
    }
}

/// Drops window `i`, keeping its buffer for the next window unless a
/// reader still copies from it.
fn remove_window(st: &mut State, i: usize) {
    let Some(w) = st.windows.remove(i) else {
        return;
    };
    if let Fill::Ready(buf, _) = w.fill {
        if let Ok(buf) = Arc::try_unwrap(buf) {
            keep_spare(st, buf);
        }
    }
}

/// Keeps a buffer for the next window while windows and spares together
/// stay within [`MAX_WINDOWS`] buffers; frees it otherwise.
fn keep_spare(st: &mut State, buf: AlignedBuf) {
    if st.windows.len() + st.spare.len() < MAX_WINDOWS {
        st.spare.push(buf);
    }
}

impl Drop for Readahead {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::psync::PsyncEngine;

    fn file(dir: &std::path::Path, len: usize) -> (PathBuf, Vec<u8>) {
        named(dir, "data", len, 0)
    }

    fn named(dir: &std::path::Path, name: &str, len: usize, salt: u8) -> (PathBuf, Vec<u8>) {
        let bytes: Vec<u8> = (0..len)
            .map(|i| (i % 251) as u8 ^ (i >> 12) as u8 ^ salt)
            .collect();
        let p = dir.join(name);
        std::fs::write(&p, &bytes).unwrap();
        (p, bytes)
    }

    /// The route of a unit alone.
    fn alone(unit: UnitId, path: &std::path::Path, end: usize) -> Vec<Span> {
        vec![Span {
            unit,
            data: path.to_path_buf(),
            end: end as u64,
        }]
    }

    #[test]
    fn sequential_reads_are_served_from_windows_across_their_edges() {
        let dir = tempfile::tempdir().unwrap();
        let len = 3 * WINDOW + 12_345;
        let (path, bytes) = file(dir.path(), len);
        let ra = Readahead::new(Arc::new(PsyncEngine)).unwrap();
        // Nothing was read yet: no window holds anything.
        let mut dst = vec![0u8; 100];
        assert!(!ra.read(1, 0, &mut dst));
        // A read at the start of the file schedules windows ahead of it.
        ra.advance(1, 0, 100, &alone(1, &path, len));
        // Across the first window's edge, then into the second.
        let at = WINDOW as u64 - 1000;
        let mut dst = vec![0u8; 5000];
        assert!(ra.read(1, at, &mut dst));
        assert!(dst[..] == bytes[at as usize..at as usize + 5000]);
        // Reading on schedules the next windows; the file's tail is short.
        ra.advance(1, at, at + 5000, &alone(1, &path, len));
        ra.advance(1, at + 5000, 3 * WINDOW as u64, &alone(1, &path, len));
        let tail = 3 * WINDOW as u64 + 10_000;
        let mut dst = vec![0u8; 2345];
        assert!(ra.read(1, tail, &mut dst));
        assert!(dst[..] == bytes[tail as usize..]);
        // Past the end of the file: not served.
        let mut dst = vec![0u8; 2346];
        assert!(!ra.read(1, tail, &mut dst));
        // Another unit shares nothing.
        assert!(!ra.read(2, tail, &mut [0u8; 10]));
        assert_eq!(ra.hits(), 2);
        // Starting over at the start of the file schedules from there again,
        // wherever the previous pass had got to.
        let dir2 = tempfile::tempdir().unwrap();
        let (path2, bytes2) = file(dir2.path(), 3 * WINDOW);
        let route2 = alone(3, &path2, 3 * WINDOW);
        let w = WINDOW as u64;
        // Windows start where the read that schedules them ends.
        ra.advance(3, 0, 10, &route2);
        assert!(ra.read(3, 10, &mut [0u8; 10]));
        assert!(ra.read(3, w + 10, &mut [0u8; 10]));
        // Reading on past the first window: it stays until its room is
        // needed, so a read behind the reader is still served.
        ra.advance(3, 10, w + 20, &route2);
        ra.advance(3, w + 20, w + 30, &route2);
        assert!(ra.read(3, 20, &mut [0u8; 10]));
        ra.advance(3, 0, 10, &route2);
        let mut dst = vec![0u8; 100];
        assert!(ra.read(3, 20, &mut dst));
        assert!(dst[..] == bytes2[20..120]);
    }

    #[test]
    fn a_jump_schedules_nothing_and_a_missing_file_serves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = file(dir.path(), 4 * WINDOW);
        let ra = Readahead::new(Arc::new(PsyncEngine)).unwrap();
        // Not at the start, and not where a previous read ended.
        let route = alone(1, &path, 4 * WINDOW);
        ra.advance(1, 2 * WINDOW as u64, 2 * WINDOW as u64 + 10, &route);
        ra.advance(1, 100_000, 100_010, &route);
        assert!(!ra.read(1, 3 * WINDOW as u64, &mut [0u8; 10]));
        assert!(!ra.read(1, 100_010, &mut [0u8; 10]));
        // A file that cannot be opened: the windows fail, readers fall back.
        ra.advance(7, 0, 10, &alone(7, &dir.path().join("gone"), 4096));
        assert!(!ra.read(7, 10, &mut [0u8; 10]));
        assert_eq!(ra.hits(), 0);
    }

    /// A reader in write order crosses into the following units without
    /// waiting: once its reads follow each other, the windows run ahead
    /// through the end of its unit into the next ones. A first read at a
    /// unit's start stays in that unit.
    #[test]
    fn a_sequential_reader_is_read_ahead_across_units() {
        let dir = tempfile::tempdir().unwrap();
        let lens = [100_000usize, 50_000, 70_000];
        let files: Vec<(PathBuf, Vec<u8>)> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| named(dir.path(), &format!("u{i}"), n, i as u8 * 17))
            .collect();
        let route = |from: usize| -> Vec<Span> {
            (from..lens.len())
                .map(|i| Span {
                    unit: 10 + i as u64,
                    data: files[i].0.clone(),
                    end: lens[i] as u64,
                })
                .collect()
        };
        let ra = Readahead::new(Arc::new(PsyncEngine)).unwrap();
        // A first read at the start of unit 10: its own unit only.
        ra.advance(10, 0, 30_000, &route(0));
        let mut dst = vec![0u8; 30_000];
        assert!(ra.read(10, 30_000, &mut dst));
        assert!(dst[..] == files[0].1[30_000..60_000]);
        assert!(!ra.read(11, 0, &mut [0u8; 10]));
        // The next read follows it: units 11 and 12 are read ahead.
        ra.advance(10, 30_000, 60_000, &route(0));
        let mut dst = vec![0u8; 50_000];
        assert!(ra.read(11, 0, &mut dst));
        assert!(dst[..] == files[1].1[..]);
        let mut dst = vec![0u8; 1000];
        assert!(ra.read(12, 69_000, &mut dst));
        assert!(dst[..] == files[2].1[69_000..]);
        // Past a unit's end: not served.
        assert!(!ra.read(12, 69_000, &mut [0u8; 1001]));
        // Reading unit 11 continues the stream; a read back in unit 10 (out
        // of write order) is still served from its window.
        ra.advance(11, 0, 50_000, &route(1));
        assert!(ra.read(12, 0, &mut [0u8; 10]));
        ra.advance(10, 60_000, 70_000, &route(0));
        let mut dst = vec![0u8; 10_000];
        assert!(ra.read(10, 60_000, &mut dst));
        assert!(dst[..] == files[0].1[60_000..70_000]);

        // A one-value unit finished by its first read: a read at the start
        // of the next unit continues the stream and crosses.
        let dir = tempfile::tempdir().unwrap();
        let (a, _) = named(dir.path(), "a", 5000, 1);
        let (b, _) = named(dir.path(), "b", 6000, 2);
        let (c, c_bytes) = named(dir.path(), "c", 7000, 3);
        let span = |unit: UnitId, data: &PathBuf, end: u64| Span {
            unit,
            data: data.clone(),
            end,
        };
        let all = [span(20, &a, 5000), span(21, &b, 6000), span(22, &c, 7000)];
        ra.advance(20, 0, 5000, &all);
        assert!(!ra.read(21, 0, &mut [0u8; 10]));
        ra.advance(21, 0, 6000, &all[1..]);
        let mut dst = vec![0u8; 7000];
        assert!(ra.read(22, 0, &mut dst));
        assert!(dst == c_bytes);
    }

    /// Units smaller than a window take a window each: the windows run out
    /// before the bytes ahead do, and reading on never drops the windows
    /// the reader is about to read to make room further ahead.
    #[test]
    fn windows_ahead_of_the_reader_are_never_dropped_for_later_ones() {
        let dir = tempfile::tempdir().unwrap();
        let route: Vec<Span> = (0..40u64)
            .map(|i| {
                let (p, _) = named(dir.path(), &format!("s{i}"), 5000, i as u8);
                Span {
                    unit: 30 + i,
                    data: p,
                    end: 5000,
                }
            })
            .collect();
        let ra = Readahead::new(Arc::new(PsyncEngine)).unwrap();
        ra.advance(30, 0, 5000, &route);
        assert!(ra.read(30, 4096, &mut [0u8; 10]));
        ra.advance(31, 0, 5000, &route[1..]);
        // Every window is held, each filled (the thread reads in order).
        let last = 31 + MAX_WINDOWS as u64 - 1;
        assert!(ra.read(last, 0, &mut [0u8; 10]));
        assert!(!ra.read(last + 1, 0, &mut [0u8; 10]));
        // Reading on, unit 31's window (behind the reader) makes room for
        // one more; no room is made by dropping the windows right ahead.
        ra.advance(32, 0, 5000, &route[2..]);
        for unit in 32..=last + 1 {
            let bytes = std::fs::read(&route[(unit - 30) as usize].data).unwrap();
            let mut dst = vec![0u8; 5000];
            assert!(ra.read(unit, 0, &mut dst), "unit {unit}");
            assert!(dst == bytes);
        }
    }
}
