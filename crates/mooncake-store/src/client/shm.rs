//! Shared-memory regions between a dummy client and the real client on the
//! same host. The dummy creates a file under `/dev/shm`, maps it, and tells
//! the real client its name; the real client maps the same pages, registers
//! them with its engine and moves object bytes in and out of them, so the
//! bytes never travel through the RPC socket. The dummy unlinks the name as
//! soon as the real client has mapped it, so a crash leaks nothing.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use memmap2::MmapMut;
use mooncake_common::{Error, ErrorCode, Result};

use super::staging::Region;

const SHM_DIR: &str = "/dev/shm";
const NAME_PREFIX: &str = "mooncake-dummy-";

/// A shared mapping of a `/dev/shm` file.
pub struct ShmRegion {
    map: MmapMut,
    name: String,
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::new(
        ErrorCode::INTERNAL_ERROR,
        format!("{what} {}: {e}", path.display()),
    )
}

impl ShmRegion {
    /// Creates a fresh zeroed region of `len` bytes readable only by this user.
    pub fn create(len: usize) -> Result<ShmRegion> {
        if len == 0 {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "shared memory region of 0 bytes",
            ));
        }
        let name = format!(
            "{NAME_PREFIX}{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        );
        let path = Path::new(SHM_DIR).join(&name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_err("create", &path, e))?;
        let sized = file
            .set_len(len as u64)
            .map_err(|e| io_err("size", &path, e));
        // SAFETY: the file was just created by us with exactly `len` bytes;
        // other mappers (the real client) only read and write bytes, never
        // truncate it.
        let map = sized
            .and_then(|()| unsafe { MmapMut::map_mut(&file) }.map_err(|e| io_err("map", &path, e)));
        match map {
            Ok(map) => Ok(ShmRegion { map, name }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Maps a region another process created with [`create`](Self::create).
    /// Only names this module generates are accepted, and the file must be
    /// exactly `len` bytes.
    pub fn open(name: &str, len: usize) -> Result<ShmRegion> {
        let path = Self::path_of(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io_err("open", &path, e))?;
        let actual = file.metadata().map_err(|e| io_err("stat", &path, e))?.len();
        if actual != len as u64 || len == 0 {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("{} has {actual} bytes, expected {len}", path.display()),
            ));
        }
        // SAFETY: the size was checked above; the creator never truncates the
        // file while either side has it mapped.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| io_err("map", &path, e))?;
        Ok(ShmRegion {
            map,
            name: name.to_owned(),
        })
    }

    fn path_of(name: &str) -> Result<PathBuf> {
        let ok = name.starts_with(NAME_PREFIX)
            && name.len() <= 128
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !ok {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("not a dummy-client region name: {name:?}"),
            ));
        }
        Ok(Path::new(SHM_DIR).join(name))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Removes the name; existing mappings stay valid.
    pub fn unlink(&self) {
        if let Ok(path) = Self::path_of(&self.name) {
            let _ = std::fs::remove_file(path);
        }
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

    #[test]
    fn two_mappings_share_bytes() {
        let a = ShmRegion::create(8192).unwrap();
        let b = ShmRegion::open(a.name(), 8192).unwrap();
        a.unlink();
        // SAFETY: both mappings are 8192 bytes long and alive here.
        unsafe {
            *(a.addr() as *mut u8).add(100) = 42;
            assert_eq!(*(b.addr() as *const u8).add(100), 42);
        }
        assert!(
            ShmRegion::open(a.name(), 8192).is_err(),
            "name is gone after unlink"
        );
    }

    #[test]
    fn rejects_foreign_names_and_wrong_sizes() {
        for bad in [
            "../etc/passwd",
            "/dev/shm/x",
            "mooncake-dummy-../../x",
            "other",
            "",
        ] {
            assert_eq!(
                ShmRegion::open(bad, 4096).err().unwrap().code,
                ErrorCode::INVALID_PARAMS,
                "{bad}"
            );
        }
        let a = ShmRegion::create(4096).unwrap();
        assert_eq!(
            ShmRegion::open(a.name(), 8192).err().unwrap().code,
            ErrorCode::INVALID_PARAMS
        );
        a.unlink();
        assert!(ShmRegion::create(0).is_err());
    }
}
