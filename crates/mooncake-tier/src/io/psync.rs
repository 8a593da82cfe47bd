//! `pread`/`pwrite`: one operation at a time on the calling thread.

use super::{DiskFile, IoEngine, ReadOp};
use std::io;

pub struct PsyncEngine;

fn errno_result(n: isize) -> io::Result<usize> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `pread` until `len` bytes or end of file.
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes.
unsafe fn pread_full(fd: i32, buf: *mut u8, len: usize, offset: u64) -> io::Result<usize> {
    let iov = [libc::iovec {
        iov_base: buf.cast(),
        iov_len: len,
    }];
    // SAFETY: the caller's guarantee for `buf` is the one `preadv_full` needs.
    unsafe { preadv_full(fd, &iov, offset) }
}

/// `preadv` until every piece is full or the file ends; returns the bytes read.
///
/// # Safety
/// Every piece of `iov` must be valid for writes of its length.
unsafe fn preadv_full(fd: i32, iov: &[libc::iovec], offset: u64) -> io::Result<usize> {
    let total: usize = iov.iter().map(|v| v.iov_len).sum();
    let mut rest = iov.to_vec();
    let mut done = 0;
    while done < total {
        let n_iov = rest.len().min(super::MAX_IOV) as libc::c_int;
        // SAFETY: `rest` are the caller's pieces, advanced past what was read.
        let n = unsafe {
            libc::preadv(
                fd,
                rest.as_ptr(),
                n_iov,
                (offset + done as u64) as libc::off_t,
            )
        };
        match errno_result(n) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                rest = super::iov_after(&rest, n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Retries an operation once without `O_DIRECT` when a direct file refuses it.
pub(crate) fn with_fallback<T>(
    file: &DiskFile,
    mut op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    match op() {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && file.is_direct() => {
            file.fall_back_to_buffered()?;
            op()
        }
        r => r,
    }
}

impl IoEngine for PsyncEngine {
    fn name(&self) -> &'static str {
        "psync"
    }

    fn write_all_at(&self, file: &DiskFile, buf: &[u8], offset: u64) -> io::Result<()> {
        with_fallback(file, || {
            let mut done = 0;
            while done < buf.len() {
                // SAFETY: `buf[done..]` is a valid readable slice.
                let n = unsafe {
                    libc::pwrite(
                        file.fd(),
                        buf[done..].as_ptr().cast(),
                        buf.len() - done,
                        (offset + done as u64) as libc::off_t,
                    )
                };
                match errno_result(n) {
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::WriteZero,
                            "pwrite wrote 0 bytes",
                        ))
                    }
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })
    }

    fn read_at(&self, file: &DiskFile, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        // SAFETY: `buf` is a valid writable slice of its length.
        with_fallback(file, || unsafe {
            pread_full(file.fd(), buf.as_mut_ptr(), buf.len(), offset)
        })
    }

    unsafe fn read_many(&self, ops: &mut [ReadOp]) {
        for op in ops {
            // SAFETY: the caller guarantees each op's pieces are valid.
            op.result = unsafe { preadv_full(op.fd, &op.iov, op.offset) };
        }
    }

    fn sync_data(&self, file: &DiskFile) -> io::Result<()> {
        // SAFETY: fdatasync on a descriptor `file` owns.
        if unsafe { libc::fdatasync(file.fd()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}
