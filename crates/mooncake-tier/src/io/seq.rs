//! [`SeqWriter`]: writes a file front to back through a few aligned chunk
//! buffers. Bytes are copied (and checksummed on the way) into one buffer
//! while a flusher thread writes the full ones, so the copy and the checksum
//! of the next chunk overlap the disk write of the previous ones instead of
//! waiting for it. With one buffer, every write happens inline.

use super::{AlignedBuf, DiskFile, IoEngine};
use crate::format::{align_up, DIO_ALIGN};
use crate::TierError;
use std::io;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Bytes copied and checksummed at a time: small enough that the piece is
/// still in cache when it is copied after its checksum.
const CRC_PIECE: usize = 64 << 10;

/// A full buffer on its way to the file, and its way back.
struct Job {
    buf: AlignedBuf,
    len: usize,
    offset: u64,
}

struct Flusher {
    jobs: Option<Sender<Job>>,
    done: Receiver<(AlignedBuf, io::Result<()>)>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    fn start(file: Arc<DiskFile>, engine: Arc<dyn IoEngine>) -> io::Result<Flusher> {
        let (jobs, rx) = channel::<Job>();
        let (tx, done) = channel();
        let thread = std::thread::Builder::new()
            .name("tier-flush".into())
            .spawn(move || {
                for job in rx {
                    let r = engine.write_all_at(&file, &job.buf[..job.len], job.offset);
                    if tx.send((job.buf, r)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Flusher {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        // Closing the queue ends the thread once the writes under way are
        // done: nothing touches the file after its writer is gone.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub struct SeqWriter {
    file: Arc<DiskFile>,
    engine: Arc<dyn IoEngine>,
    cur: AlignedBuf,
    staged: usize,
    /// Bytes handed to the file (written or in flight).
    flushed: u64,
    /// Empty buffers ready to be filled.
    free: Vec<AlignedBuf>,
    in_flight: usize,
    flusher: Option<Flusher>,
    /// The first write that failed; every later call reports it.
    failed: Option<io::Error>,
}

impl SeqWriter {
    /// One buffer of `chunk` bytes: every write is inline.
    pub fn new(file: DiskFile, engine: Arc<dyn IoEngine>, chunk: usize) -> SeqWriter {
        Self::with_buffers(file, engine, vec![AlignedBuf::new(chunk)])
    }

    /// Writes through `bufs` (at least one, all of the same capacity, a
    /// multiple of the `O_DIRECT` alignment); with more than one, up to
    /// `bufs.len() - 1` writes are in flight while the next one fills.
    pub fn with_buffers(
        file: DiskFile,
        engine: Arc<dyn IoEngine>,
        mut bufs: Vec<AlignedBuf>,
    ) -> SeqWriter {
        let cur = bufs.pop().unwrap_or_else(|| AlignedBuf::new(DIO_ALIGN));
        debug_assert!(bufs.iter().all(|b| b.capacity() == cur.capacity()));
        SeqWriter {
            file: Arc::new(file),
            engine,
            cur,
            staged: 0,
            flushed: 0,
            free: bufs,
            in_flight: 0,
            flusher: None,
            failed: None,
        }
    }

    pub fn file(&self) -> &DiskFile {
        &self.file
    }

    /// Bytes appended so far.
    pub fn end(&self) -> u64 {
        self.flushed + self.staged as u64
    }

    fn error(&self, e: &io::Error) -> TierError {
        TierError::io(
            "write",
            self.file.path(),
            io::Error::new(e.kind(), e.to_string()),
        )
    }

    fn check(&self) -> Result<(), TierError> {
        match &self.failed {
            Some(e) => Err(self.error(e)),
            None => Ok(()),
        }
    }

    /// Takes one finished write back, blocking; records its error.
    fn reap(&mut self) {
        let Some(f) = &self.flusher else { return };
        match f.done.recv() {
            Ok((buf, r)) => {
                self.in_flight -= 1;
                self.free.push(buf);
                if let Err(e) = r {
                    self.failed.get_or_insert(e);
                }
            }
            Err(_) => {
                // The thread is gone with buffers in flight (it panicked).
                self.in_flight = 0;
                self.failed
                    .get_or_insert_with(|| io::Error::other("tier flusher thread died"));
            }
        }
    }

    /// Writes the current buffer's first `len` bytes at the end of what
    /// was handed out before, in the background when a spare buffer
    /// lets the next chunk fill meanwhile.
    fn flush(&mut self, len: usize) -> Result<(), TierError> {
        let offset = self.flushed;
        if self.free.is_empty() && self.in_flight == 0 {
            // A single buffer: write inline.
            self.engine
                .write_all_at(&self.file, &self.cur[..len], offset)
                .map_err(|e| TierError::io("write", self.file.path(), e))?;
        } else {
            if self.flusher.is_none() {
                let f = Flusher::start(self.file.clone(), self.engine.clone())
                    .map_err(|e| TierError::io("spawn flusher for", self.file.path(), e))?;
                self.flusher = Some(f);
            }
            while self.free.is_empty() {
                self.reap();
            }
            self.check()?;
            let next = self.free.pop().expect("a free buffer");
            let buf = std::mem::replace(&mut self.cur, next);
            let jobs = self.flusher.as_ref().and_then(|f| f.jobs.as_ref());
            if jobs
                .expect("flusher running")
                .send(Job { buf, len, offset })
                .is_err()
            {
                let e = io::Error::other("tier flusher thread died");
                self.failed.get_or_insert(e);
                return self.check();
            }
            self.in_flight += 1;
        }
        self.flushed += len as u64;
        self.staged = 0;
        Ok(())
    }

    /// Appends `zeros` zero bytes, then `bytes`.
    pub fn append(&mut self, bytes: &[u8], zeros: usize) -> Result<(), TierError> {
        self.append_inner(bytes, zeros, None)
    }

    /// Appends `bytes`, extending the crc32c `crc` over them as they are
    /// copied (one pass over the source instead of two).
    pub fn append_crc(&mut self, bytes: &[u8], crc: &mut u32) -> Result<(), TierError> {
        self.append_inner(bytes, 0, Some(crc))
    }

    fn append_inner(
        &mut self,
        mut bytes: &[u8],
        mut zeros: usize,
        mut crc: Option<&mut u32>,
    ) -> Result<(), TierError> {
        self.check()?;
        while !bytes.is_empty() || zeros > 0 {
            let room = self.cur.capacity() - self.staged;
            if zeros > 0 {
                let n = room.min(zeros);
                self.cur[self.staged..self.staged + n].fill(0);
                self.staged += n;
                zeros -= n;
            } else {
                let n = room.min(bytes.len());
                let dst = &mut self.cur[self.staged..self.staged + n];
                for (d, s) in dst.chunks_mut(CRC_PIECE).zip(bytes[..n].chunks(CRC_PIECE)) {
                    if let Some(c) = crc.as_deref_mut() {
                        *c = crc32c::crc32c_append(*c, s);
                    }
                    d.copy_from_slice(s);
                }
                self.staged += n;
                bytes = &bytes[n..];
            }
            if self.staged == self.cur.capacity() {
                self.flush(self.staged)?;
            }
        }
        Ok(())
    }

    /// Writes what is buffered, zero-padded to a whole block, and waits for
    /// every write in flight. Returns the file length (a multiple of
    /// [`DIO_ALIGN`]). Durability is the caller's `sync_data`, after any
    /// length change.
    pub fn finish(&mut self) -> Result<u64, TierError> {
        self.check()?;
        let tail = align_up(self.staged as u64, DIO_ALIGN as u64) as usize;
        self.cur[self.staged..tail].fill(0);
        while self.in_flight > 0 {
            self.reap();
        }
        self.check()?;
        if tail > 0 {
            let r = self
                .engine
                .write_all_at(&self.file, &self.cur[..tail], self.flushed);
            r.map_err(|e| TierError::io("write", self.file.path(), e))?;
        }
        self.flushed += tail as u64;
        self.staged = 0;
        Ok(self.flushed)
    }

    /// Like [`Self::finish`], but the file ends exactly at [`Self::end`]: the
    /// whole blocks go as usual, a partial last block is written without
    /// `O_DIRECT` (the file leaves direct mode), unpadded. Cutting the
    /// padding off afterwards instead would make the filesystem read the
    /// last block back to zero its tail. Returns the file length.
    pub fn finish_exact(&mut self) -> Result<u64, TierError> {
        self.check()?;
        let whole = self.staged / DIO_ALIGN * DIO_ALIGN;
        while self.in_flight > 0 {
            self.reap();
        }
        self.check()?;
        let err = |e| TierError::io("write", self.file.path(), e);
        if whole > 0 {
            self.engine
                .write_all_at(&self.file, &self.cur[..whole], self.flushed)
                .map_err(err)?;
        }
        if self.staged > whole {
            if self.file.is_direct() {
                self.file.fall_back_to_buffered().map_err(err)?;
            }
            let at = self.flushed + whole as u64;
            self.engine
                .write_all_at(&self.file, &self.cur[whole..self.staged], at)
                .map_err(err)?;
        }
        self.flushed += self.staged as u64;
        self.staged = 0;
        Ok(self.flushed)
    }

    /// Overwrites appended bytes at `offset` with `bytes` while they are
    /// all still in the current buffer (nothing written yet): a header
    /// whose checksum covers what follows it. False, and nothing changed,
    /// once the range has left the buffer.
    pub fn patch_unwritten(&mut self, offset: usize, bytes: &[u8]) -> bool {
        let end = offset + bytes.len();
        if self.flushed != 0 || end > self.staged {
            return false;
        }
        self.cur[offset..end].copy_from_slice(bytes);
        true
    }

    /// The file and the buffers, for the next file (after [`Self::finish`];
    /// buffers still in flight are waited for).
    pub fn into_parts(mut self) -> (Arc<DiskFile>, Vec<AlignedBuf>) {
        while self.in_flight > 0 {
            self.reap();
        }
        self.flusher.take();
        let mut bufs = std::mem::take(&mut self.free);
        bufs.push(std::mem::replace(&mut self.cur, AlignedBuf::new(0)));
        (self.file.clone(), bufs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::psync::PsyncEngine;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    /// Every buffer count and a chunk that does not divide the input: the
    /// file holds exactly the bytes appended, padded to a block, and the
    /// fused checksum equals the plain one.
    #[test]
    fn pipelined_writes_land_in_order() {
        let dir = tempfile::tempdir().unwrap();
        for depth in [1usize, 2, 4] {
            let p = dir.path().join(format!("f{depth}"));
            let bufs = (0..depth).map(|_| AlignedBuf::new(8192)).collect();
            let mut w =
                SeqWriter::with_buffers(DiskFile::create(&p).unwrap(), Arc::new(PsyncEngine), bufs);
            let a = pattern(50_001, 1);
            let b = pattern(12_345, 2);
            let mut crc = 0;
            w.append_crc(&a, &mut crc).unwrap();
            w.append(&[], 3).unwrap();
            w.append_crc(&b, &mut crc).unwrap();
            let len = w.finish().unwrap();
            assert_eq!(len, align_up(50_001 + 3 + 12_345, 4096));
            let (_, back) = w.into_parts();
            assert_eq!(back.len(), depth);
            let data = std::fs::read(&p).unwrap();
            assert_eq!(data.len() as u64, len);
            assert_eq!(&data[..50_001], &a[..]);
            assert_eq!(&data[50_001..50_004], &[0, 0, 0]);
            assert_eq!(&data[50_004..50_004 + 12_345], &b[..]);
            assert!(data[50_004 + 12_345..].iter().all(|&x| x == 0));
            let mut both = a.clone();
            both.extend_from_slice(&b);
            assert_eq!(crc, crc32c::crc32c(&both));
        }
    }

    /// `finish_exact` leaves the file at exactly the bytes appended, whole
    /// blocks or not, across several buffers; `patch_unwritten` changes
    /// bytes only while none has been written.
    #[test]
    fn exact_finish_and_patches() {
        let dir = tempfile::tempdir().unwrap();
        for (i, len) in [0usize, 100, 4096, 8192 + 1, 3 * 8192 + 4095]
            .into_iter()
            .enumerate()
        {
            let p = dir.path().join(format!("e{i}"));
            let bufs = (0..2).map(|_| AlignedBuf::new(8192)).collect();
            let mut w =
                SeqWriter::with_buffers(DiskFile::create(&p).unwrap(), Arc::new(PsyncEngine), bufs);
            let data = pattern(len, i as u8);
            w.append(&data, 0).unwrap();
            let patched = w.patch_unwritten(0, &[0xee; 2]);
            assert_eq!(patched, (2..8192).contains(&len), "{len}");
            assert_eq!(w.finish_exact().unwrap(), len as u64);
            let mut want = data.clone();
            if patched {
                want[..2].copy_from_slice(&[0xee; 2]);
            }
            assert_eq!(std::fs::read(&p).unwrap(), want, "{len}");
        }
    }

    /// A write that fails in the background is reported by a later call,
    /// never swallowed.
    #[test]
    fn a_background_write_error_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ro");
        std::fs::write(&p, b"").unwrap();
        // A read-only descriptor: every write fails with EBADF.
        let file = DiskFile::open_read(&p).unwrap();
        let bufs = (0..3).map(|_| AlignedBuf::new(4096)).collect();
        let mut w = SeqWriter::with_buffers(file, Arc::new(PsyncEngine), bufs);
        let data = pattern(4096 * 5, 3);
        let appended = w.append(&data, 0);
        let finished = w.finish();
        assert!(appended.is_err() || finished.is_err());
        assert!(w.finish().is_err(), "the error sticks");
    }
}
