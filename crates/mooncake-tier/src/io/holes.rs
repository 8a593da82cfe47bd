//! Freeing one object's blocks inside a bucket file (`fallocate` with
//! `FALLOC_FL_PUNCH_HOLE`), and finding them freed again after a restart
//! (`SEEK_HOLE`): per-object disk eviction without rewriting the bucket.

use super::super::format::DIO_ALIGN;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

/// The whole blocks inside `[offset, offset + len)`: the part of a value
/// that no neighbour shares, so it can be punched out. `(start, 0)` when
/// the value covers no whole block.
pub fn inner_blocks(offset: u64, len: u64) -> (u64, u64) {
    let b = DIO_ALIGN as u64;
    let start = offset.div_ceil(b) * b;
    let end = (offset + len) / b * b;
    (start, end.saturating_sub(start))
}

/// Deallocates `[offset, offset + len)` of `path`, keeping its size.
pub fn punch_hole(path: &Path, offset: u64, len: u64) -> io::Result<()> {
    let f = OpenOptions::new().write(true).open(path)?;
    punch(&f, offset, len)
}

fn punch(f: &File, offset: u64, len: u64) -> io::Result<()> {
    let (off, n) = (
        libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?,
        libc::off_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?,
    );
    // SAFETY: a valid fd; fallocate reads no memory of ours.
    let rc = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            n,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `[offset, offset + len)` of `f` contains a hole (a punched
/// object). A filesystem without `SEEK_HOLE` reports none.
pub fn has_hole(fd: RawFd, offset: u64, len: u64) -> bool {
    let Ok(off) = libc::off_t::try_from(offset) else {
        return false;
    };
    // SAFETY: a valid fd; lseek reads no memory of ours.
    let hole = unsafe { libc::lseek(fd, off, libc::SEEK_HOLE) };
    hole >= 0 && (hole as u64) < offset + len
}

/// Whether the filesystem holding `dir` frees punched blocks and reports
/// them as holes: tried on a scratch file, removed afterwards.
pub fn supports_punch(dir: &Path) -> bool {
    let path = dir.join(".mooncake-punch-probe");
    let probe = || -> io::Result<bool> {
        let b = DIO_ALIGN as u64;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        std::io::Write::write_all(&mut &f, &vec![1u8; 3 * DIO_ALIGN])?;
        f.sync_data()?;
        punch(&f, b, b)?;
        Ok(has_hole(f.as_raw_fd(), b, b) && !has_hole(f.as_raw_fd(), 0, b))
    };
    let ok = probe().unwrap_or(false);
    let _ = std::fs::remove_file(&path);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_blocks_never_touch_a_neighbour() {
        assert_eq!(inner_blocks(0, 8192), (0, 8192));
        assert_eq!(inner_blocks(8, 8192), (4096, 4096));
        assert_eq!(inner_blocks(8, 4000), (4096, 0));
        assert_eq!(inner_blocks(4096, 65536 + 100), (4096, 65536));
    }

    #[test]
    fn a_punched_range_reads_as_a_hole_and_the_rest_stays() {
        let dir = tempfile::tempdir().unwrap();
        if !supports_punch(dir.path()) {
            eprintln!("no hole punching here; skipped");
            return;
        }
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 4 * DIO_ALIGN]).unwrap();
        punch_hole(&path, 4096, 8192).unwrap();
        let f = File::open(&path).unwrap();
        assert!(has_hole(f.as_raw_fd(), 4096, 8192));
        assert!(!has_hole(f.as_raw_fd(), 0, 4096));
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 4 * DIO_ALIGN);
        assert!(bytes[..4096].iter().all(|&b| b == 7));
        assert!(bytes[4096..12288].iter().all(|&b| b == 0));
        assert!(bytes[12288..].iter().all(|&b| b == 7));
    }
}
