//! Shared-memory regions between a dummy client and the real client on the
//! same host. The dummy creates an anonymous memfd, seals its size, maps it
//! and tells the real client its pid, fd and name; the real client opens it
//! through `/proc/<pid>/fd/<fd>`, maps the same pages, registers them with
//! its engine and moves object bytes in and out of them, so the bytes never
//! travel through the RPC socket. Nothing is ever named in `/dev/shm`, so a
//! crash leaks nothing.
//!
//! A shared file that shrinks under a mapping turns the next access into
//! SIGBUS. The region is sealed against resizing before it is shared, and the
//! real client maps only a memfd that carries `F_SEAL_SHRINK`, so one buggy
//! or hostile dummy cannot crash the service that every dummy shares.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd};

use memmap2::MmapMut;
use mooncake_common::{Error, ErrorCode, Result};

use super::staging::Region;

const NAME_PREFIX: &str = "mooncake-dummy-";

/// A shared mapping of a sealed memfd.
pub(crate) struct ShmRegion {
    map: MmapMut,
    name: String,
    /// Kept open so the peer can reach it through `/proc`.
    file: File,
}

fn os_err(what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, format!("{what}: {e}"))
}

fn refuse(msg: String) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, msg)
}

fn check_name(name: &str) -> Result<()> {
    let ok = name.starts_with(NAME_PREFIX)
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(refuse(format!("not a dummy-client region name: {name:?}")))
    }
}

impl ShmRegion {
    /// Creates a fresh zeroed region of `len` bytes whose size can never
    /// change.
    pub(super) fn create(len: usize) -> Result<ShmRegion> {
        if len == 0 {
            return Err(refuse("shared memory region of 0 bytes".into()));
        }
        let name = format!(
            "{NAME_PREFIX}{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        );
        let cname = CString::new(name.as_str()).expect("generated name has no NUL");
        // SAFETY: memfd_create reads the NUL-terminated name and returns a new fd.
        let raw = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(os_err("memfd_create", std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        let file = unsafe { File::from_raw_fd(raw) };
        file.set_len(len as u64)
            .map_err(|e| os_err("size the region", e))?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on our own fd with integer arguments.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(os_err("seal the region", std::io::Error::last_os_error()));
        }
        // SAFETY: the file is exactly `len` bytes and sealed against
        // shrinking, so every page of the mapping stays backed.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| os_err("map the region", e))?;
        Ok(ShmRegion { map, name, file })
    }

    /// Maps the region `name` that process `pid` created with
    /// [`create`](Self::create) and holds as `fd`. Refused unless that fd
    /// is the memfd of that name, sealed against shrinking and exactly
    /// `len` bytes long.
    pub(super) fn open(pid: u32, fd: i32, name: &str, len: usize) -> Result<ShmRegion> {
        check_name(name)?;
        if fd < 0 || len == 0 {
            return Err(refuse(format!("bad region fd {fd} or length {len}")));
        }
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| refuse(format!("open {path}: {e}")))?;
        // What we opened, not what the path names now: no race with the peer.
        let target = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .map_err(|e| os_err("readlink", e))?;
        if target.as_os_str() != format!("/memfd:{name} (deleted)").as_str() {
            return Err(refuse(format!(
                "{path} is {}, not the region {name}",
                target.display()
            )));
        }
        // Sealed first, so the size checked below holds for the mapping's life.
        // SAFETY: fcntl on an fd we own, no pointers.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(refuse(format!("{name} is not sealed against shrinking")));
        }
        let actual = file.metadata().map_err(|e| os_err("stat", e))?.len();
        if actual != len as u64 {
            return Err(refuse(format!("{name} has {actual} bytes, expected {len}")));
        }
        // SAFETY: the memfd is `len` bytes and can no longer shrink (sealed
        // above), so every page of the mapping stays backed.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| os_err("map the region", e))?;
        Ok(ShmRegion {
            map,
            name: name.to_owned(),
            file,
        })
    }

    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// The fd a peer opens through `/proc/<pid>/fd/<fd>`.
    pub(super) fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }
}

impl Region for ShmRegion {
    fn addr(&self) -> usize {
        self.map.as_ptr() as usize
    }
    fn size(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> u32 {
        std::process::id()
    }

    #[test]
    fn two_mappings_share_bytes() {
        let a = ShmRegion::create(8192).unwrap();
        let b = ShmRegion::open(me(), a.raw_fd(), a.name(), 8192).unwrap();
        // SAFETY: both mappings are 8192 bytes long and alive here.
        unsafe {
            *(a.addr() as *mut u8).add(100) = 42;
            assert_eq!(*(b.addr() as *const u8).add(100), 42);
        }
    }

    #[test]
    fn region_cannot_be_resized_by_anyone() {
        let a = ShmRegion::create(8192).unwrap();
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", a.raw_fd()))
            .unwrap();
        assert!(f.set_len(0).is_err(), "the region shrank");
        assert!(f.set_len(1 << 20).is_err(), "the region grew");
        assert_eq!(f.metadata().unwrap().len(), 8192);
    }

    #[test]
    fn rejects_foreign_names_files_and_sizes() {
        let a = ShmRegion::create(4096).unwrap();
        let code = |r: Result<ShmRegion>| r.err().expect("refused").code;
        for bad in [
            "../etc/passwd",
            "/dev/shm/x",
            "mooncake-dummy-../x",
            "other",
            "",
        ] {
            assert_eq!(
                code(ShmRegion::open(me(), a.raw_fd(), bad, 4096)),
                ErrorCode::INVALID_PARAMS,
                "{bad}"
            );
        }
        let other = ShmRegion::create(4096).unwrap();
        let inval = |r| assert_eq!(code(r), ErrorCode::INVALID_PARAMS);
        inval(ShmRegion::open(me(), a.raw_fd(), other.name(), 4096));
        inval(ShmRegion::open(me(), a.raw_fd(), a.name(), 8192));
        inval(ShmRegion::open(me(), a.raw_fd(), a.name(), 0));
        inval(ShmRegion::open(me(), -1, a.name(), 4096));
        inval(ShmRegion::open(me(), 1_000_000, a.name(), 4096));
        inval(ShmRegion::open(u32::MAX, a.raw_fd(), a.name(), 4096));
        // A memfd with the right name but no seals could shrink under us.
        let cname = CString::new(format!("{NAME_PREFIX}unsealed")).unwrap();
        // SAFETY: memfd_create reads the name and returns a new fd.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: `raw` is a fresh fd nothing else owns.
        let unsealed = unsafe { File::from_raw_fd(raw) };
        unsealed.set_len(4096).unwrap();
        inval(ShmRegion::open(
            me(),
            unsealed.as_raw_fd(),
            &format!("{NAME_PREFIX}unsealed"),
            4096,
        ));
        // A regular file (the old /dev/shm scheme) is refused too.
        let plain = tempfile::tempfile().unwrap();
        plain.set_len(4096).unwrap();
        inval(ShmRegion::open(me(), plain.as_raw_fd(), a.name(), 4096));
        assert!(ShmRegion::create(0).is_err());
    }
}
