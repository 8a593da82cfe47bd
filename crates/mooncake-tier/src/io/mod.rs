//! File I/O for the tier: aligned buffers, `O_DIRECT` files that fall back to
//! buffered I/O where the filesystem refuses it, and the engines that move the
//! bytes ([`psync`] with `pread`/`pwrite`, [`uring`] with io_uring).
//!
//! Durability helpers: [`commit_file`] writes a small file under a temporary
//! name, fsyncs it, renames it into place and fsyncs the directory, so a crash
//! leaves either the old state or the new one, never half a file.

pub mod holes;
pub mod psync;
pub mod seq;
pub mod uring;

pub use seq::SeqWriter;

use super::format::DIO_ALIGN;
use super::TierError;
use std::alloc::{self, Layout};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A zeroed heap buffer whose address and capacity are multiples of
/// [`DIO_ALIGN`], as `O_DIRECT` requires. Buffers of [`HUGE`] or more are
/// aligned to it and asked to be backed by transparent huge pages: every
/// `O_DIRECT` transfer pins its buffer's pages, and pinning one 2 MiB page
/// is far cheaper than pinning 512 small ones.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    cap: usize,
}

/// The size of a transparent huge page on x86-64 and most arm64 kernels.
pub const HUGE: usize = 2 << 20;

// SAFETY: the buffer is uniquely owned heap memory, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// At least `len` bytes, rounded up to [`DIO_ALIGN`] (one block for 0).
    pub fn new(len: usize) -> AlignedBuf {
        let cap = len.div_ceil(DIO_ALIGN).max(1) * DIO_ALIGN;
        let layout = Self::layout(cap);
        let raw = if layout.align() == HUGE {
            // SAFETY: the layout has a non-zero size.
            let raw = unsafe { alloc::alloc(layout) };
            if !raw.is_null() {
                // The hint must come before the first touch, which is the
                // zeroing below; without THP it is a no-op.
                // SAFETY: `raw..raw + cap` is our allocation, HUGE-aligned.
                unsafe { libc::madvise(raw.cast(), cap, libc::MADV_HUGEPAGE) };
                // SAFETY: as above; writes `cap` bytes inside it.
                unsafe { std::ptr::write_bytes(raw, 0, cap) };
            }
            raw
        } else {
            // SAFETY: the layout has a non-zero size.
            unsafe { alloc::alloc_zeroed(layout) }
        };
        let ptr = std::ptr::NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, cap }
    }

    fn layout(cap: usize) -> Layout {
        let align = if cap >= HUGE { HUGE } else { DIO_ALIGN };
        Layout::from_size_align(cap, align).expect("aligned layout")
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `cap` initialised (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.cap) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }
}

/// An open tier file that knows whether it bypasses the page cache.
pub struct DiskFile {
    file: File,
    path: PathBuf,
    direct: std::sync::atomic::AtomicBool,
}

impl DiskFile {
    /// Opens `path` for reading with `O_DIRECT`, or buffered where the
    /// filesystem rejects `O_DIRECT` (EINVAL, e.g. some tmpfs and FUSE mounts).
    pub fn open_read(path: &Path) -> Result<DiskFile, TierError> {
        Self::open_with(path, OpenOptions::new().read(true))
    }

    /// Creates (truncating) `path` for writing, `O_DIRECT` where allowed.
    pub fn create(path: &Path) -> Result<DiskFile, TierError> {
        Self::open_with(
            path,
            OpenOptions::new().write(true).create(true).truncate(true),
        )
    }

    fn open_with(path: &Path, opts: &OpenOptions) -> Result<DiskFile, TierError> {
        let mut direct = opts.clone();
        direct.custom_flags(libc::O_DIRECT | libc::O_CLOEXEC);
        let (file, is_direct) = match direct.open(path) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let f = opts
                    .open(path)
                    .map_err(|e| TierError::io("open", path, e))?;
                (f, false)
            }
            Err(e) => return Err(TierError::io("open", path, e)),
        };
        Ok(DiskFile {
            file,
            path: path.to_path_buf(),
            direct: std::sync::atomic::AtomicBool::new(is_direct),
        })
    }

    /// Whether reads and writes of this file bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Drops `O_DIRECT` for this file: some filesystems accept the flag at open
    /// and refuse the I/O with EINVAL.
    pub fn fall_back_to_buffered(&self) -> io::Result<()> {
        let fd = self.fd();
        // SAFETY: fcntl on a descriptor this struct owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_DIRECT) } < 0 {
            return Err(io::Error::last_os_error());
        }
        self.direct
            .store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> Result<u64, TierError> {
        Ok(self
            .file
            .metadata()
            .map_err(|e| TierError::io("stat", &self.path, e))?
            .len())
    }

    pub fn is_empty(&self) -> Result<bool, TierError> {
        Ok(self.len()? == 0)
    }

    /// Sets the file length (drops the block padding of the last write).
    pub fn set_len(&self, len: u64) -> Result<(), TierError> {
        self.file
            .set_len(len)
            .map_err(|e| TierError::io("truncate", &self.path, e))
    }
}

/// One read of a batch: `len()` bytes at `offset` of `fd`, scattered over
/// `iov` in order (one request for a value and its bounced tail, or for a
/// run of adjacent values).
pub struct ReadOp {
    pub fd: RawFd,
    pub iov: Vec<libc::iovec>,
    pub offset: u64,
    /// Filled in by the engine: bytes read (short only at end of file) or the error.
    pub result: io::Result<usize>,
}

/// Most pieces one read scatters into (the kernel's `IOV_MAX`).
pub const MAX_IOV: usize = 1024;

impl ReadOp {
    /// A read of `len` bytes at `offset` into `buf`.
    pub fn new(fd: RawFd, buf: *mut u8, len: usize, offset: u64) -> ReadOp {
        ReadOp {
            fd,
            iov: vec![libc::iovec {
                iov_base: buf.cast(),
                iov_len: len,
            }],
            offset,
            result: Ok(0),
        }
    }

    /// Bytes the op asks for.
    pub fn len(&self) -> usize {
        self.iov.iter().map(|v| v.iov_len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The pieces of `iov` left after its first `done` bytes.
pub fn iov_after(iov: &[libc::iovec], mut done: usize) -> Vec<libc::iovec> {
    let mut out = Vec::with_capacity(iov.len());
    for v in iov {
        if done >= v.iov_len {
            done -= v.iov_len;
            continue;
        }
        out.push(libc::iovec {
            // Stays inside the piece: `done < iov_len`.
            iov_base: v.iov_base.cast::<u8>().wrapping_add(done).cast(),
            iov_len: v.iov_len - done,
        });
        done = 0;
    }
    out
}

/// How the tier moves bytes between buffers and files. Every call completes
/// before it returns; engines differ in how many operations they keep in flight.
pub trait IoEngine: Send + Sync {
    /// `"psync"` or `"io_uring"`.
    fn name(&self) -> &'static str;
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, file: &DiskFile, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Reads until `buf` is full or the file ends; returns the bytes read.
    fn read_at(&self, file: &DiskFile, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Runs every op (in any order), filling in each result.
    ///
    /// # Safety
    /// Each piece of each op's `iov` must be valid for writes of its length,
    /// not overlap any other piece, and stay so until the call returns.
    unsafe fn read_many(&self, ops: &mut [ReadOp]);
    /// `fdatasync`.
    fn sync_data(&self, file: &DiskFile) -> io::Result<()>;
}

/// The engine `MOONCAKE_OFFLOAD_USE_URING` asks for. io_uring falls back to
/// psync (with the reason) when the kernel does not offer it.
pub fn engine(use_uring: bool) -> (Arc<dyn IoEngine>, Option<String>) {
    if use_uring {
        match uring::UringEngine::new() {
            Ok(e) => return (Arc::new(e), None),
            Err(e) => {
                return (
                    Arc::new(psync::PsyncEngine),
                    Some(format!("io_uring unavailable ({e}); using pread/pwrite")),
                )
            }
        }
    }
    (Arc::new(psync::PsyncEngine), None)
}

/// Writes `bytes` to `path` durably and atomically: temp file, fsync, rename,
/// directory fsync.
pub fn commit_file(path: &Path, bytes: &[u8]) -> Result<(), TierError> {
    let tmp = temp_path(path);
    let result = (|| {
        let mut f = File::create(&tmp).map_err(|e| TierError::io("create", &tmp, e))?;
        f.write_all(bytes)
            .map_err(|e| TierError::io("write", &tmp, e))?;
        f.sync_all().map_err(|e| TierError::io("fsync", &tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| TierError::io("rename", path, e))?;
        sync_dir(path.parent().unwrap_or(Path::new(".")))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `path` with `.tmp` appended: the name a commit writes before its rename.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// fsync of a directory, so renames and unlinks in it are durable.
pub fn sync_dir(dir: &Path) -> Result<(), TierError> {
    let d = File::open(dir).map_err(|e| TierError::io("open", dir, e))?;
    d.sync_all().map_err(|e| TierError::io("fsync", dir, e))
}

/// Total bytes of the filesystem holding `path` (statvfs).
pub fn fs_capacity(path: &Path) -> Result<u64, TierError> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| TierError::Invalid("path contains a NUL byte".into()))?;
    // SAFETY: zeroed statvfs is a valid out-parameter; `c` is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(TierError::io("stat", path, io::Error::last_os_error()));
    }
    Ok(st.f_blocks as u64 * st.f_frsize as u64)
}

/// `(used, size)` of the filesystem holding `path`, as `df` counts them:
/// `size` is what is used plus what an unprivileged writer may still take
/// (blocks reserved for root are in neither).
pub fn fs_usage(path: &Path) -> Result<(u64, u64), TierError> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| TierError::Invalid("path contains a NUL byte".into()))?;
    // SAFETY: zeroed statvfs is a valid out-parameter; `c` is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(TierError::io("stat", path, io::Error::last_os_error()));
    }
    let block = st.f_frsize as u64;
    let used = (st.f_blocks as u64).saturating_sub(st.f_bfree as u64) * block;
    Ok((used, used + st.f_bavail as u64 * block))
}

/// Bytes a file of `len` occupies on disk, rounded to whole blocks.
pub fn on_disk(len: u64) -> u64 {
    super::format::align_up(len, DIO_ALIGN as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_is_aligned_and_zeroed() {
        for len in [
            0,
            1,
            4095,
            4096,
            4097,
            1 << 20,
            HUGE - 1,
            HUGE,
            HUGE + 1,
            3 * HUGE,
        ] {
            let b = AlignedBuf::new(len);
            assert!((b.as_ptr() as usize).is_multiple_of(DIO_ALIGN));
            if b.capacity() >= HUGE {
                assert!((b.as_ptr() as usize).is_multiple_of(HUGE));
            }
            assert!(b.capacity() >= len.max(1));
            assert!(b.capacity().is_multiple_of(DIO_ALIGN));
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn iov_after_skips_exactly_what_was_done() {
        let mut a = [0u8; 10];
        let mut b = [0u8; 5];
        let iov = [
            libc::iovec {
                iov_base: a.as_mut_ptr().cast(),
                iov_len: 10,
            },
            libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
            libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: 5,
            },
        ];
        let lens = |v: &[libc::iovec]| v.iter().map(|v| v.iov_len).collect::<Vec<_>>();
        assert_eq!(lens(&iov_after(&iov, 0)), [10, 5]);
        assert_eq!(lens(&iov_after(&iov, 3)), [7, 5]);
        assert_eq!(iov_after(&iov, 3)[0].iov_base, a[3..].as_mut_ptr().cast());
        assert_eq!(lens(&iov_after(&iov, 10)), [5]);
        assert_eq!(lens(&iov_after(&iov, 14)), [1]);
        assert_eq!(iov_after(&iov, 14)[0].iov_base, b[4..].as_mut_ptr().cast());
        assert!(iov_after(&iov, 15).is_empty());
        assert!(iov_after(&iov, 99).is_empty());
    }

    #[test]
    fn commit_file_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m");
        commit_file(&p, b"one").unwrap();
        commit_file(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!temp_path(&p).exists());
    }

    #[test]
    fn direct_open_falls_back_on_tmpfs_or_works() {
        // /dev/shm is tmpfs: either O_DIRECT is refused there (fallback) or the
        // kernel accepts it; both must give a working file.
        let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let p = dir.path().join("f");
        let f = DiskFile::create(&p).unwrap();
        let mut buf = AlignedBuf::new(4096);
        buf[0] = 7;
        psync::PsyncEngine.write_all_at(&f, &buf, 0).unwrap();
        let r = DiskFile::open_read(&p).unwrap();
        let mut out = AlignedBuf::new(4096);
        assert_eq!(psync::PsyncEngine.read_at(&r, &mut out, 0).unwrap(), 4096);
        assert_eq!(out[0], 7);
    }
}
