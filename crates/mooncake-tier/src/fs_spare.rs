//! Spare files of the shared-filesystem tier's group writer: the files a
//! writer deletes are kept, emptied, under names no key produces, and the
//! next files it writes take them over instead of allocating new inodes.
//!
//! Why: a filesystem may make a new inode cost far more after deletes. ext4
//! without a journal skips every inode freed in the last 60 s (300 s while
//! its inode-table block is dirty), scanning the group's bitmap past them
//! one by one on every create; right after a round of deletes the scans
//! took half of the writer's CPU time here. A spare keeps its inode
//! allocated, so a write pays a rename instead of that scan.
//!
//! A spare is named `%spare.<writer>.<n>` in the directory of the file it
//! was (escaped keys never start with `%s`), holds no data (truncated to
//! zero when it becomes a spare) and is never read. A write renames it to
//! its own `.tmp` name and writes it as a new file; a spare another writer
//! took first simply fails the rename and the write creates its file as
//! usual. A writer deletes its spares when it stops; one that crashes
//! leaves its empty spares behind.

use std::io;
use std::path::{Path, PathBuf};

use super::shared_fs::remove_object;
use super::Result;

/// Spares a writer keeps at most: empty files, an inode and a directory
/// entry each; enough for every file one round of deletes may hand over.
pub const MAX_SPARES: usize = 4096;

/// The prefix of spare names: no escaped key starts with `%s`.
pub const SPARE_PREFIX: &str = "%spare.";

/// A writer's spare files, most recent last.
pub struct Spares {
    /// This writer's part of the names, so writers sharing a directory
    /// never take each other's names.
    token: u64,
    next: u64,
    files: Vec<PathBuf>,
}

impl Default for Spares {
    fn default() -> Self {
        Self::new()
    }
}

impl Spares {
    pub fn new() -> Spares {
        use std::hash::{BuildHasher, Hasher};
        // A per-process random seed (std's SipHash keys), the time and the
        // pid: distinct across writers and restarts.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        Spares {
            token: h.finish(),
            next: 0,
            files: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Deletes the object file at `path` (and a `.tmp` left beside it): its
    /// name is gone when this returns, as after [`remove_object`]. The file
    /// itself becomes a spare while there is room for one, emptied after
    /// its rename (a reader that opened it before fails its checksum, as it
    /// would on any file replaced under it); otherwise it is unlinked. A
    /// missing file is fine.
    pub fn remove(&mut self, path: &Path) -> Result<()> {
        let dir = match path.parent() {
            Some(d) if self.files.len() < MAX_SPARES => d,
            _ => return remove_object(path),
        };
        // Only a regular file is kept (anything else is deleted, or fails
        // to be, as before).
        let is_file = std::fs::symlink_metadata(path).map(|m| m.is_file());
        if !matches!(is_file, Ok(true)) {
            return remove_object(path);
        }
        let _ = std::fs::remove_file(super::io::temp_path(path));
        let spare = dir.join(format!("{SPARE_PREFIX}{:016x}.{}", self.token, self.next));
        match std::fs::rename(path, &spare) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            // Not a file we can keep (a permission problem): delete it as
            // usual.
            Err(_) => return remove_object(path),
        }
        self.next += 1;
        // The spare is nobody's file any more; if it cannot be emptied it
        // is not worth keeping.
        let emptied = std::fs::OpenOptions::new()
            .write(true)
            .open(&spare)
            .and_then(|f| f.set_len(0));
        match emptied {
            Ok(()) => self.files.push(spare),
            Err(_) => {
                let _ = std::fs::remove_file(&spare);
            }
        }
        Ok(())
    }

    /// A spare for the next file, if any.
    pub fn pop(&mut self) -> Option<PathBuf> {
        self.files.pop()
    }

    /// Deletes every spare left.
    pub fn clear(&mut self) {
        for f in self.files.drain(..) {
            let _ = std::fs::remove_file(f);
        }
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Renames `spare` to `temp`, the name a write is about to create: then the
/// create opens that file instead of allocating one. False (and no spare
/// left behind) when the rename fails, e.g. another writer took the spare.
pub fn take_over(spare: &Path, temp: &Path) -> bool {
    match std::fs::rename(spare, temp) {
        Ok(()) => true,
        Err(_) => {
            let _ = std::fs::remove_file(spare);
            false
        }
    }
}

/// Whether `name` is a spare's (no reader or scan treats it as an object).
pub fn is_spare(name: &str) -> bool {
    name.starts_with(SPARE_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A removed file's name is gone at once; its inode lives on, empty,
    /// under a spare name; a missing file is fine; taking a spare over
    /// moves that inode to the new name; what is left is deleted on drop.
    #[test]
    fn removed_files_become_empty_spares_and_are_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, vec![7u8; 10_000]).unwrap();
        std::fs::write(super::super::io::temp_path(&a), b"partial").unwrap();
        let ino = std::fs::metadata(&a).unwrap().ino();
        let mut s = Spares::new();
        s.remove(&a).unwrap();
        s.remove(&dir.path().join("missing")).unwrap();
        // A directory under an object's name is not taken (nor deleted).
        let odd = dir.path().join("odd");
        std::fs::create_dir(&odd).unwrap();
        assert!(s.remove(&odd).is_err());
        assert!(odd.is_dir());
        assert!(!a.exists());
        assert!(!super::super::io::temp_path(&a).exists());
        assert_eq!(s.len(), 1);
        let spare = s.pop().unwrap();
        let name = spare.file_name().unwrap().to_str().unwrap();
        assert!(is_spare(name), "{name}");
        let meta = std::fs::metadata(&spare).unwrap();
        assert_eq!((meta.ino(), meta.len()), (ino, 0));

        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let temp = sub.join("b.tmp");
        assert!(take_over(&spare, &temp));
        assert_eq!(std::fs::metadata(&temp).unwrap().ino(), ino);
        // Gone (another writer took it): refused, nothing created.
        assert!(!take_over(&spare, &sub.join("c.tmp")));
        assert!(!sub.join("c.tmp").exists());

        let d = dir.path().join("d");
        std::fs::write(&d, b"x").unwrap();
        let mut s = Spares::new();
        s.remove(&d).unwrap();
        let left = s.files.clone();
        drop(s);
        assert!(left.iter().all(|p| !p.exists()));
    }

    /// Past [`MAX_SPARES`], removed files are unlinked.
    #[test]
    fn removes_past_the_limit_unlink() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Spares::new();
        s.files = (0..MAX_SPARES)
            .map(|i| dir.path().join(i.to_string()))
            .collect();
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        s.remove(&f).unwrap();
        assert!(!f.exists());
        assert_eq!(s.len(), MAX_SPARES);
        s.files.clear();
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(names.is_empty(), "{names:?}");
    }
}
