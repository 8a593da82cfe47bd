//! The file-per-key layout (`file_per_key_storage_backend`): one file per
//! object under `<storage path>/<MOONCAKE_OFFLOAD_FSDIR>/<h0>/<h1>/`, where
//! `h0`, `h1` are two hex digits of the key's crc32c (256 directories, so none
//! grows huge). The file name is the key, percent-escaped (reversible, so two
//! keys never share a name); keys whose escaped form is too long for a file
//! name use a 64-bit hash instead, and the key inside the file settles who
//! owns it.
//!
//! Each file carries its own header ([`super::format::ObjectHeader`]): key,
//! length, checksum, the caller's tag and a sequence number that keeps fifo
//! order across restarts. Files are written under a `.tmp` name and renamed
//! after `fdatasync`; the directory is synced before the objects count.

use super::format::{
    decode_object_header, encode_object_header, FormatError, ObjectHeader, DIO_ALIGN, MAX_KEY_LEN,
};
use super::index::{NewUnit, ObjectLocation};
use super::io::{on_disk, sync_dir, AlignedBuf, DiskFile, IoEngine, SeqWriter};
use super::read::{read_value, ValueRef};
use super::scan::{ScanProblem, ScanReport, Verify};
use super::{Result, TierError};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const SUFFIX: &str = ".obj";
const TEMP_SUFFIX: &str = ".obj.tmp";
/// Escaped names longer than this use the hashed name.
const MAX_ESCAPED_NAME: usize = 200;

fn escape(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The file an object of `key` lives in, under the layout's root.
pub fn object_path(root: &Path, key: &str) -> PathBuf {
    let h = crc32c::crc32c(key.as_bytes());
    let escaped = escape(key);
    let name = if escaped.len() <= MAX_ESCAPED_NAME {
        escaped
    } else {
        let h2 = crc32c::crc32c_append(0x9e37_79b9, key.as_bytes());
        format!("~{h:08x}{h2:08x}")
    };
    root.join(format!("{:x}", h & 0xf))
        .join(format!("{:x}", (h >> 4) & 0xf))
        .join(name + SUFFIX)
}

/// An object file that is durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedFile {
    pub key: String,
    pub path: PathBuf,
    pub header: ObjectHeader,
    pub file_len: u64,
}

impl CommittedFile {
    pub fn to_unit(&self) -> NewUnit {
        NewUnit {
            id: self.header.seq,
            data: self.path.clone(),
            meta: None,
            bytes: on_disk(self.file_len),
            objects: vec![(
                self.key.clone(),
                ObjectLocation {
                    unit: self.header.seq,
                    offset: self.header.value_offset,
                    len: self.header.value_len,
                    crc: self.header.value_crc,
                    tag: self.header.tag,
                },
            )],
        }
    }
}

struct Staged {
    temp: PathBuf,
    committed: CommittedFile,
    file: std::sync::Arc<DiskFile>,
}

/// Writes object files; stage several, then [`FilePerKeyWriter::seal`] makes
/// them durable together.
pub struct FilePerKeyWriter {
    root: PathBuf,
    engine: Arc<dyn IoEngine>,
    chunk: usize,
    next_seq: u64,
    staged: Vec<Staged>,
}

impl FilePerKeyWriter {
    /// `next_seq` must exceed every sequence number already under `root`.
    pub fn new(root: &Path, engine: Arc<dyn IoEngine>, next_seq: u64) -> Self {
        FilePerKeyWriter {
            root: root.to_path_buf(),
            engine,
            chunk: super::bucket::DEFAULT_CHUNK,
            next_seq,
            staged: Vec::new(),
        }
    }

    pub fn staged(&self) -> (usize, u64) {
        (
            self.staged.len(),
            self.staged
                .iter()
                .map(|s| s.committed.header.value_len)
                .sum(),
        )
    }

    pub fn staged_keys(&self) -> Vec<String> {
        self.staged
            .iter()
            .map(|s| s.committed.key.clone())
            .collect()
    }

    /// Writes one object under its temporary name. On error, everything
    /// staged since the last seal is discarded.
    pub fn stage(&mut self, key: &str, tag: u64, parts: &[&[u8]]) -> Result<()> {
        let r = self.write_one(key, tag, parts);
        if r.is_err() {
            self.abort();
        }
        r
    }

    fn write_one(&mut self, key: &str, tag: u64, parts: &[&[u8]]) -> Result<()> {
        if key.len() > MAX_KEY_LEN {
            return Err(TierError::Invalid(format!(
                "key of {} bytes exceeds {MAX_KEY_LEN}",
                key.len()
            )));
        }
        let path = object_path(&self.root, key);
        let dir = path.parent().expect("object paths have a directory");
        std::fs::create_dir_all(dir).map_err(|e| TierError::io("create", dir, e))?;
        let mut temp = path.clone().into_os_string();
        temp.push(".tmp");
        let temp = PathBuf::from(temp);
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let crc = parts.iter().fold(0, |c, p| crc32c::crc32c_append(c, p));
        let header = ObjectHeader {
            key: key.to_string(),
            value_len: len,
            tag,
            seq: self.next_seq,
            value_offset: ObjectHeader::value_offset_for(key.len()),
            value_crc: crc,
        };
        let head = encode_object_header(&header);
        let mut out = SeqWriter::new(
            DiskFile::create(&temp)?,
            self.engine.clone(),
            self.chunk.min(on_disk(header.value_offset + len) as usize),
        );
        let written = (|| {
            out.append(&head, 0)?;
            out.append(&[], (header.value_offset as usize) - head.len())?;
            for p in parts {
                out.append(p, 0)?;
            }
            out.finish()?;
            // Drop the block padding: the value ends the file.
            out.file().set_len(header.value_offset + len)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
        let file = out.into_parts().0;
        self.next_seq += 1;
        self.staged.push(Staged {
            temp,
            committed: CommittedFile {
                key: key.to_string(),
                path,
                file_len: header.value_offset + len,
                header,
            },
            file,
        });
        Ok(())
    }

    /// Makes every staged object durable: `fdatasync` (after the length was
    /// cut), rename into place, sync each directory touched.
    pub fn seal(&mut self) -> Result<Vec<CommittedFile>> {
        let staged = std::mem::take(&mut self.staged);
        let mut dirs = BTreeSet::new();
        let mut done = Vec::with_capacity(staged.len());
        let mut failure = None;
        for s in &staged {
            if failure.is_some() {
                break;
            }
            let r = self
                .engine
                .sync_data(&s.file)
                .map_err(|e| TierError::io("fdatasync", &s.temp, e))
                .and_then(|()| {
                    std::fs::rename(&s.temp, &s.committed.path)
                        .map_err(|e| TierError::io("rename", &s.committed.path, e))
                });
            match r {
                Ok(()) => {
                    dirs.insert(
                        s.committed
                            .path
                            .parent()
                            .expect("has a directory")
                            .to_path_buf(),
                    );
                    done.push(s.committed.clone());
                }
                Err(e) => failure = Some(e),
            }
        }
        if let Some(e) = failure {
            // Nothing of this group is acknowledged: undo the renames too.
            for s in &staged {
                let _ = std::fs::remove_file(&s.temp);
            }
            for c in &done {
                let _ = std::fs::remove_file(&c.path);
            }
            return Err(e);
        }
        for d in &dirs {
            sync_dir(d)?;
        }
        Ok(done)
    }

    pub fn abort(&mut self) {
        for s in self.staged.drain(..) {
            let _ = std::fs::remove_file(&s.temp);
        }
    }
}

impl Drop for FilePerKeyWriter {
    fn drop(&mut self) {
        self.abort();
    }
}

fn read_header(
    file: &DiskFile,
    engine: &dyn IoEngine,
    file_len: u64,
) -> std::result::Result<ObjectHeader, String> {
    let mut buf = AlignedBuf::new(DIO_ALIGN);
    let n = engine
        .read_at(file, &mut buf, 0)
        .map_err(|e| e.to_string())?;
    match decode_object_header(&buf[..n]) {
        // A long key: the header needs more than one block (bounded by the
        // decoder's key limit and by the file).
        Err(FormatError::Truncated { need }) if need > n && need as u64 <= file_len => {
            let mut buf = AlignedBuf::new(need);
            let n = engine
                .read_at(file, &mut buf, 0)
                .map_err(|e| e.to_string())?;
            decode_object_header(&buf[..n]).map_err(|e| e.to_string())
        }
        r => r.map_err(|e| e.to_string()),
    }
}

/// Scans the layout's root: complete objects come back as one unit each, in
/// sequence order; temp files, files that do not decode, truncated or
/// corrupt objects are removed and reported.
pub fn scan_files(root: &Path, engine: &dyn IoEngine, verify: Verify) -> Result<ScanReport> {
    let mut report = ScanReport {
        next_id: 1,
        ..ScanReport::default()
    };
    if !root.exists() {
        return Ok(report);
    }
    let mut dirs = BTreeSet::new();
    let mut scratch = AlignedBuf::new(0);
    for l1 in std::fs::read_dir(root).map_err(|e| TierError::io("list", root, e))? {
        let l1 = l1.map_err(|e| TierError::io("list", root, e))?.path();
        if !l1.is_dir() {
            continue;
        }
        for l2 in std::fs::read_dir(&l1).map_err(|e| TierError::io("list", &l1, e))? {
            let l2 = l2.map_err(|e| TierError::io("list", &l1, e))?.path();
            if !l2.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&l2).map_err(|e| TierError::io("list", &l2, e))? {
                let path = f.map_err(|e| TierError::io("list", &l2, e))?.path();
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if name.ends_with(TEMP_SUFFIX) {
                    let _ = std::fs::remove_file(&path);
                    report.problems.push(ScanProblem::TempFile(path.clone()));
                    dirs.insert(l2.clone());
                    continue;
                }
                if !name.ends_with(SUFFIX) {
                    continue;
                }
                match scan_one(&path, engine, verify, &mut scratch) {
                    Ok(c) => {
                        report.next_id = report.next_id.max(c.header.seq + 1);
                        report.units.push(c.to_unit());
                    }
                    Err(problem) => {
                        let _ = std::fs::remove_file(&path);
                        report.problems.push(problem);
                        dirs.insert(l2.clone());
                    }
                }
            }
        }
    }
    report.units.sort_by_key(|u| u.id);
    for d in dirs {
        sync_dir(&d)?;
    }
    Ok(report)
}

fn scan_one(
    path: &Path,
    engine: &dyn IoEngine,
    verify: Verify,
    scratch: &mut AlignedBuf,
) -> std::result::Result<CommittedFile, ScanProblem> {
    let bad = |error: String| ScanProblem::BadMeta {
        path: path.to_path_buf(),
        error,
    };
    let file = DiskFile::open_read(path).map_err(|e| bad(e.to_string()))?;
    let file_len = file.len().map_err(|e| bad(e.to_string()))?;
    let header = read_header(&file, engine, file_len).map_err(bad)?;
    let unit = header.seq;
    if object_path(
        path.parent()
            .and_then(Path::parent)
            .and_then(Path::parent)
            .unwrap_or(path),
        &header.key,
    ) != path
    {
        return Err(bad("file name does not match its key".into()));
    }
    if header.value_offset + header.value_len > file_len {
        return Err(ScanProblem::Truncated {
            unit,
            key: header.key,
        });
    }
    if verify == Verify::All {
        let len = header.value_len as usize;
        if scratch.capacity() < len {
            *scratch = AlignedBuf::new(len);
        }
        let v = ValueRef {
            file: &file,
            offset: header.value_offset,
            len: header.value_len,
            crc: header.value_crc,
        };
        if read_value(engine, v, &mut scratch[..len]).is_err() {
            return Err(ScanProblem::Corrupt {
                unit,
                key: header.key,
            });
        }
    }
    Ok(CommittedFile {
        key: header.key.clone(),
        path: path.to_path_buf(),
        header,
        file_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::psync::PsyncEngine;

    #[test]
    fn paths_are_distinct_for_distinct_keys() {
        let root = Path::new("/r");
        assert_ne!(object_path(root, "a/b"), object_path(root, "a_b"));
        assert_ne!(object_path(root, "a%2Fb"), object_path(root, "a/b"));
        let p = object_path(root, "weird key/../x");
        assert!(p.starts_with(root));
        assert_eq!(p.components().count(), 5);
        let long = "k".repeat(500);
        let name = object_path(root, &long)
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        assert!(name.starts_with('~') && name.len() < 64);
    }

    #[test]
    fn stage_seal_scan_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("file_per_key_dir");
        let mut w = FilePerKeyWriter::new(&root, Arc::new(PsyncEngine), 1);
        let long = "x".repeat(300);
        let keys = ["a", "b/c", "", long.as_str()];
        for (i, k) in keys.iter().enumerate() {
            let v = vec![i as u8; i * 5000];
            w.stage(k, 10 + i as u64, &[&v]).unwrap();
        }
        let done = w.seal().unwrap();
        assert_eq!(done.len(), 4);
        let report = scan_files(&root, &PsyncEngine, Verify::All).unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        assert_eq!(report.units.len(), 4);
        assert_eq!(report.next_id, 5);
        let keys_back: Vec<_> = report
            .units
            .iter()
            .map(|u| u.objects[0].0.clone())
            .collect();
        assert_eq!(keys_back, keys);
        for (i, u) in report.units.iter().enumerate() {
            let loc = &u.objects[0].1;
            assert_eq!(loc.tag, 10 + i as u64);
            let f = DiskFile::open_read(&u.data).unwrap();
            let mut out = vec![0u8; loc.len as usize];
            read_value(
                &PsyncEngine,
                ValueRef {
                    file: &f,
                    offset: loc.offset,
                    len: loc.len,
                    crc: loc.crc,
                },
                &mut out,
            )
            .unwrap();
            assert_eq!(out, vec![i as u8; i * 5000]);
        }
    }

    #[test]
    fn scan_drops_temp_truncated_and_corrupt_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("fpk");
        let mut w = FilePerKeyWriter::new(&root, Arc::new(PsyncEngine), 1);
        for k in ["good", "cut", "flip"] {
            w.stage(k, 0, &[&vec![7u8; 10_000]]).unwrap();
        }
        w.seal().unwrap();
        w.stage("never-sealed", 0, &[b"zz"]).unwrap();
        std::mem::forget(w); // a kill -9: the temp file stays
        let cut = object_path(&root, "cut");
        let f = std::fs::OpenOptions::new().write(true).open(&cut).unwrap();
        f.set_len(4096 + 5000).unwrap();
        let flip = object_path(&root, "flip");
        let mut bytes = std::fs::read(&flip).unwrap();
        bytes[4096 + 123] ^= 1;
        std::fs::write(&flip, bytes).unwrap();
        let report = scan_files(&root, &PsyncEngine, Verify::All).unwrap();
        let kept: Vec<_> = report
            .units
            .iter()
            .map(|u| u.objects[0].0.as_str())
            .collect();
        assert_eq!(kept, ["good"]);
        assert_eq!(report.problems.len(), 3, "{:?}", report.problems);
        assert!(report
            .problems
            .iter()
            .any(|p| matches!(p, ScanProblem::TempFile(_))));
        assert!(report
            .problems
            .iter()
            .any(|p| matches!(p, ScanProblem::Truncated { key, .. } if key == "cut")));
        assert!(report
            .problems
            .iter()
            .any(|p| matches!(p, ScanProblem::Corrupt { key, .. } if key == "flip")));
        assert!(!cut.exists() && !flip.exists());
        // A second scan finds nothing wrong.
        assert!(scan_files(&root, &PsyncEngine, Verify::All)
            .unwrap()
            .problems
            .is_empty());
    }
}
