//! io_uring (`MOONCAKE_OFFLOAD_USE_URING=1`): each thread owns a ring, so
//! threads never contend for one; a large write or a batch of reads is split
//! into up to [`QUEUE_DEPTH`] operations in flight at once.

use super::psync::with_fallback;
use super::{iov_after, DiskFile, IoEngine, ReadOp, MAX_IOV};
use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::io;

/// Operations kept in flight per ring.
pub const QUEUE_DEPTH: u32 = 32;
/// A large write is split into pieces of this size (a multiple of the
/// `O_DIRECT` alignment) so several are in flight at once.
const WRITE_PIECE: usize = 2 << 20;

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

pub struct UringEngine;

impl UringEngine {
    /// Checks that this kernel gives us a ring (the calling thread keeps it).
    pub fn new() -> io::Result<UringEngine> {
        with_ring(|_| Ok(()))?;
        Ok(UringEngine)
    }
}

fn with_ring<T>(f: impl FnOnce(&mut IoUring) -> io::Result<T>) -> io::Result<T> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(IoUring::new(QUEUE_DEPTH)?);
        }
        f(slot.as_mut().expect("ring just created"))
    })
}

/// One operation being driven to completion (resubmitted after a short transfer).
struct Piece {
    fd: i32,
    /// A write's one buffer, or the pieces a read scatters into.
    iov: Vec<libc::iovec>,
    len: usize,
    offset: u64,
    write: bool,
    done: usize,
    /// What is left of `iov` for the read in flight; the kernel reads this
    /// array, so it is not touched until the completion arrives.
    rest: Vec<libc::iovec>,
    result: Option<io::Result<usize>>,
    in_flight: bool,
}

impl Piece {
    fn new(fd: i32, iov: Vec<libc::iovec>, offset: u64, write: bool) -> Piece {
        Piece {
            fd,
            len: iov.iter().map(|v| v.iov_len).sum(),
            iov,
            offset,
            write,
            done: 0,
            rest: Vec::new(),
            result: None,
            in_flight: false,
        }
    }
}

/// Runs every piece to completion, at most [`QUEUE_DEPTH`] in flight.
///
/// # Safety
/// Every piece's buffer must be valid (readable for writes, writable for
/// reads) for its `len` until this returns; no two pieces may overlap.
unsafe fn run(ring: &mut IoUring, pieces: &mut [Piece]) -> io::Result<()> {
    let mut in_flight = 0usize;
    loop {
        for (i, p) in pieces.iter_mut().enumerate() {
            if in_flight >= QUEUE_DEPTH as usize {
                break;
            }
            if p.result.is_some() || p.in_flight {
                continue;
            }
            let fd = types::Fd(p.fd);
            let at = p.offset + p.done as u64;
            let entry = if p.write {
                let remaining = (p.len - p.done).min(u32::MAX as usize & !4095) as u32;
                // SAFETY: `done < len`, so the pointer stays inside the caller's buffer.
                let ptr = unsafe { p.iov[0].iov_base.cast::<u8>().add(p.done) };
                opcode::Write::new(fd, ptr, remaining).offset(at).build()
            } else {
                p.rest = iov_after(&p.iov, p.done);
                let n = p.rest.len().min(MAX_IOV) as u32;
                opcode::Readv::new(fd, p.rest.as_ptr(), n)
                    .offset(at)
                    .build()
            }
            .user_data(i as u64);
            // SAFETY: the buffer outlives the operation: we wait for every
            // submitted entry before returning.
            if unsafe { ring.submission().push(&entry) }.is_err() {
                break;
            }
            p.in_flight = true;
            in_flight += 1;
        }
        if in_flight == 0 {
            return Ok(());
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // Entries already submitted must still complete before the
                // buffers can be released: drain them, then report.
                while in_flight > 0 {
                    let _ = ring.submit_and_wait(in_flight);
                    in_flight -= ring.completion().count();
                }
                return Err(e);
            }
        }
        for cqe in ring.completion() {
            let p = &mut pieces[cqe.user_data() as usize];
            p.in_flight = false;
            in_flight -= 1;
            let res = cqe.result();
            if res == -libc::EINTR || res == -libc::EAGAIN {
                continue;
            }
            if res < 0 {
                p.result = Some(Err(io::Error::from_raw_os_error(-res)));
            } else if res == 0 {
                p.result = Some(if p.write {
                    Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0"))
                } else {
                    Ok(p.done)
                });
            } else {
                p.done += res as usize;
                if p.done >= p.len {
                    p.result = Some(Ok(p.done));
                }
            }
        }
    }
}

impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn write_all_at(&self, file: &DiskFile, buf: &[u8], offset: u64) -> io::Result<()> {
        with_fallback(file, || {
            let mut pieces: Vec<Piece> = buf
                .chunks(WRITE_PIECE)
                .enumerate()
                .map(|(i, c)| {
                    let iov = vec![libc::iovec {
                        iov_base: c.as_ptr() as *mut libc::c_void,
                        iov_len: c.len(),
                    }];
                    Piece::new(file.fd(), iov, offset + (i * WRITE_PIECE) as u64, true)
                })
                .collect();
            // SAFETY: the pieces cover disjoint parts of `buf`, borrowed for the call;
            // the kernel only reads them.
            with_ring(|ring| unsafe { run(ring, &mut pieces) })?;
            for p in pieces {
                p.result.expect("every piece completes")?;
            }
            Ok(())
        })
    }

    fn read_at(&self, file: &DiskFile, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        with_fallback(file, || {
            let iov = vec![libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            }];
            let mut pieces = [Piece::new(file.fd(), iov, offset, false)];
            // SAFETY: `buf` is borrowed mutably for the whole call.
            with_ring(|ring| unsafe { run(ring, &mut pieces) })?;
            let [p] = pieces;
            p.result.expect("the piece completes")
        })
    }

    unsafe fn read_many(&self, ops: &mut [ReadOp]) {
        let mut pieces: Vec<Piece> = ops
            .iter()
            .map(|op| Piece::new(op.fd, op.iov.clone(), op.offset, false))
            .collect();
        // SAFETY: the caller guarantees the ops' buffers are valid and disjoint.
        match with_ring(|ring| unsafe { run(ring, &mut pieces) }) {
            Ok(()) => {
                for (op, p) in ops.iter_mut().zip(pieces) {
                    op.result = p.result.expect("every piece completes");
                }
            }
            Err(e) => {
                for op in ops.iter_mut() {
                    op.result = Err(io::Error::new(e.kind(), e.to_string()));
                }
            }
        }
    }

    fn sync_data(&self, file: &DiskFile) -> io::Result<()> {
        let entry = opcode::Fsync::new(types::Fd(file.fd()))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(0);
        with_ring(|ring| {
            // SAFETY: fsync carries no buffer.
            unsafe { ring.submission().push(&entry) }
                .map_err(|_| io::Error::other("submission queue full"))?;
            loop {
                match ring.submit_and_wait(1) {
                    Ok(_) => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
            let cqe = ring
                .completion()
                .next()
                .ok_or_else(|| io::Error::other("no completion"))?;
            if cqe.result() < 0 {
                return Err(io::Error::from_raw_os_error(-cqe.result()));
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::AlignedBuf;

    #[test]
    fn uring_round_trips_when_the_kernel_offers_it() {
        let Ok(engine) = UringEngine::new() else {
            eprintln!("io_uring unavailable here; the psync engine is used instead");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let f = DiskFile::create(&p).unwrap();
        let mut buf = AlignedBuf::new(5 << 20);
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        engine.write_all_at(&f, &buf, 0).unwrap();
        engine.sync_data(&f).unwrap();
        let r = DiskFile::open_read(&p).unwrap();
        let mut out = AlignedBuf::new(5 << 20);
        assert_eq!(engine.read_at(&r, &mut out, 0).unwrap(), 5 << 20);
        assert!(out[..] == buf[..]);
        // Reading past the end returns what is there.
        let mut tail = AlignedBuf::new(8192);
        assert_eq!(
            engine.read_at(&r, &mut tail, (5 << 20) - 4096).unwrap(),
            4096
        );
        // A batch of reads at different offsets.
        let mut a = AlignedBuf::new(4096);
        let mut b = AlignedBuf::new(4096);
        let mut d = AlignedBuf::new(4096);
        let mut c = AlignedBuf::new(4096);
        let mut ops = [
            ReadOp::new(r.fd(), a.as_mut_ptr(), 4096, 4096),
            ReadOp::new(r.fd(), b.as_mut_ptr(), 4096, 1 << 20),
            // One request scattered over two buffers.
            ReadOp {
                iov: vec![
                    libc::iovec {
                        iov_base: c.as_mut_ptr().cast(),
                        iov_len: 4096,
                    },
                    libc::iovec {
                        iov_base: d.as_mut_ptr().cast(),
                        iov_len: 4096,
                    },
                ],
                ..ReadOp::new(r.fd(), std::ptr::null_mut(), 0, 8192)
            },
        ];
        // SAFETY: `a`..`d` are distinct live buffers of 4096 bytes.
        unsafe { engine.read_many(&mut ops) };
        assert_eq!(ops[0].result.as_ref().unwrap(), &4096);
        assert_eq!(ops[1].result.as_ref().unwrap(), &4096);
        assert_eq!(ops[2].result.as_ref().unwrap(), &8192);
        assert!(c[..] == buf[8192..12288]);
        assert!(d[..] == buf[12288..16384]);
        assert!(a[..] == buf[4096..8192]);
        assert!(b[..] == buf[1 << 20..(1 << 20) + 4096]);
    }
}
