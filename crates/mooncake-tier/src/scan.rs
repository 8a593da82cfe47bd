//! The restart scan of the bucket layout: every complete object comes back,
//! everything torn is dropped and reported, never served.
//!
//! A bucket counts only with its metadata file, which is committed after its
//! data is durable. So: a data file without metadata is a write cut short
//! (removed); metadata without data, or metadata that does not decode, is
//! removed with whatever data it had; a leftover `.meta.tmp` is a commit cut
//! short (removed). Inside a good bucket, an object that lies past the end of
//! a truncated data file, or whose checksum fails, is dropped, and the
//! metadata is rewritten without it so it is reported once. An object whose
//! blocks were punched out (evicted, see [`super::index`]) is dropped the
//! same way, quietly.

use super::bucket::{data_path, meta_path, parse_name, FileKind};
use super::format::{decode_bucket_meta, encode_bucket_meta, BucketMeta};
use super::index::{NewUnit, ObjectLocation, UnitId};
use super::io::holes::{has_hole, inner_blocks};
use super::io::{commit_file, on_disk, sync_dir, AlignedBuf, DiskFile, IoEngine};
use super::read::{read_value, ValueRef};
use super::{Result, TierError};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Metadata files larger than this are not read (no bucket of ours comes
/// close: 500 keys of 64 KiB would be 32 MiB).
pub const MAX_META_FILE: u64 = 256 << 20;

/// How much the scan checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Read every object and check its checksum (reads check it again).
    All,
    /// Check metadata and file lengths only; checksums are checked on read.
    Structure,
}

/// Something the scan dropped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanProblem {
    /// A metadata commit cut short; removed.
    TempFile(PathBuf),
    /// A data file with no metadata (a bucket never committed); removed.
    OrphanData(PathBuf),
    /// Metadata whose data file is gone; removed.
    MetaWithoutData(PathBuf),
    /// Metadata that does not decode; removed with its data.
    BadMeta { path: PathBuf, error: String },
    /// An object past the end of its (truncated) data file; dropped.
    Truncated { unit: UnitId, key: String },
    /// An object whose checksum fails; dropped.
    Corrupt { unit: UnitId, key: String },
    /// A file that could not be read or removed; left alone and not served.
    Unreadable { path: PathBuf, error: String },
}

impl fmt::Display for ScanProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanProblem::TempFile(p) => write!(f, "{}: unfinished commit, removed", p.display()),
            ScanProblem::OrphanData(p) => {
                write!(f, "{}: data without metadata, removed", p.display())
            }
            ScanProblem::MetaWithoutData(p) => {
                write!(f, "{}: metadata without data, removed", p.display())
            }
            ScanProblem::BadMeta { path, error } => {
                write!(f, "{}: {error}, removed", path.display())
            }
            ScanProblem::Truncated { unit, key } => {
                write!(f, "unit {unit:x}: {key:?} truncated, dropped")
            }
            ScanProblem::Corrupt { unit, key } => {
                write!(f, "unit {unit:x}: {key:?} fails its checksum, dropped")
            }
            ScanProblem::Unreadable { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

/// What a scan found.
#[derive(Debug, Default)]
pub struct ScanReport {
    /// Complete units, in id order, ready for the index.
    pub units: Vec<NewUnit>,
    pub problems: Vec<ScanProblem>,
    /// Objects whose blocks were punched out (evicted or removed while
    /// their bucket stayed): dropped, and not a problem.
    pub evicted: usize,
    /// The first id no file in the directory uses.
    pub next_id: u64,
}

impl ScanReport {
    pub fn objects(&self) -> usize {
        self.units.iter().map(|u| u.objects.len()).sum()
    }
}

#[derive(Default)]
struct Found {
    data: bool,
    meta: bool,
    temp: bool,
}

fn remove(path: &Path, problem: ScanProblem, report: &mut ScanReport) {
    match std::fs::remove_file(path) {
        Ok(()) => report.problems.push(problem),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => report.problems.push(problem),
        Err(e) => report.problems.push(ScanProblem::Unreadable {
            path: path.to_path_buf(),
            error: format!("{problem}; removing failed: {e}"),
        }),
    }
}

/// Scans the bucket files of `dir` (other files are left alone).
pub fn scan_buckets(dir: &Path, engine: &dyn IoEngine, verify: Verify) -> Result<ScanReport> {
    let mut found: BTreeMap<u64, Found> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).map_err(|e| TierError::io("list", dir, e))? {
        let entry = entry.map_err(|e| TierError::io("list", dir, e))?;
        let Some((id, kind)) = entry.file_name().to_str().and_then(parse_name) else {
            continue;
        };
        if !entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
            continue;
        }
        let f = found.entry(id).or_default();
        match kind {
            FileKind::Data => f.data = true,
            FileKind::Meta => f.meta = true,
            FileKind::MetaTemp => f.temp = true,
        }
    }
    let mut report = ScanReport {
        next_id: found.keys().next_back().map_or(1, |id| id + 1),
        ..ScanReport::default()
    };
    let mut removed_any = false;
    for (id, f) in found {
        let (data, meta) = (data_path(dir, id), meta_path(dir, id));
        if f.temp {
            let tmp = super::io::temp_path(&meta);
            remove(&tmp, ScanProblem::TempFile(tmp.clone()), &mut report);
            removed_any = true;
        }
        match (f.data, f.meta) {
            (true, false) => {
                remove(&data, ScanProblem::OrphanData(data.clone()), &mut report);
                removed_any = true;
            }
            (false, true) => {
                remove(
                    &meta,
                    ScanProblem::MetaWithoutData(meta.clone()),
                    &mut report,
                );
                removed_any = true;
            }
            (true, true) => {
                removed_any |= scan_bucket(id, &data, &meta, engine, verify, &mut report);
            }
            (false, false) => {}
        }
    }
    if removed_any {
        sync_dir(dir)?;
    }
    Ok(report)
}

fn read_meta(meta: &Path, id: u64) -> std::result::Result<BucketMeta, String> {
    let len = std::fs::metadata(meta).map_err(|e| e.to_string())?.len();
    if len > MAX_META_FILE {
        return Err(format!("metadata file of {len} bytes"));
    }
    let bytes = std::fs::read(meta).map_err(|e| e.to_string())?;
    let m = decode_bucket_meta(&bytes).map_err(|e| e.to_string())?;
    if m.bucket_id != id {
        return Err(format!("metadata names bucket {:x}", m.bucket_id));
    }
    Ok(m)
}

/// Scans one bucket; returns whether it removed or rewrote files.
fn scan_bucket(
    id: u64,
    data: &Path,
    meta: &Path,
    engine: &dyn IoEngine,
    verify: Verify,
    report: &mut ScanReport,
) -> bool {
    let m = match read_meta(meta, id) {
        Ok(m) => m,
        Err(error) => {
            remove(
                meta,
                ScanProblem::BadMeta {
                    path: meta.to_path_buf(),
                    error,
                },
                report,
            );
            let _ = std::fs::remove_file(data);
            return true;
        }
    };
    let file = match DiskFile::open_read(data) {
        Ok(f) => f,
        Err(e) => {
            report.problems.push(ScanProblem::Unreadable {
                path: data.to_path_buf(),
                error: e.to_string(),
            });
            return false;
        }
    };
    let have = file.len().unwrap_or(0);
    let mut scratch = AlignedBuf::new(0);
    let mut good = Vec::with_capacity(m.entries.len());
    for e in &m.entries {
        if e.offset + e.len > have {
            report.problems.push(ScanProblem::Truncated {
                unit: id,
                key: e.key.clone(),
            });
            continue;
        }
        let (start, blocks) = inner_blocks(e.offset, e.len);
        if blocks > 0 && has_hole(file.fd(), start, blocks) {
            report.evicted += 1;
            continue;
        }
        if verify == Verify::All {
            if scratch.capacity() < e.len as usize {
                scratch = AlignedBuf::new(e.len as usize);
            }
            let v = ValueRef {
                file: &file,
                offset: e.offset,
                len: e.len,
                crc: e.crc,
            };
            match read_value(engine, v, &mut scratch[..e.len as usize]) {
                Ok(()) => {}
                Err(TierError::Corrupt { .. }) => {
                    report.problems.push(ScanProblem::Corrupt {
                        unit: id,
                        key: e.key.clone(),
                    });
                    continue;
                }
                Err(err) => {
                    report.problems.push(ScanProblem::Unreadable {
                        path: data.to_path_buf(),
                        error: format!("{:?}: {err}", e.key),
                    });
                    continue;
                }
            }
        }
        good.push(e.clone());
    }
    let mut changed = false;
    let mut meta_len = std::fs::metadata(meta).map(|x| x.len()).unwrap_or(0);
    if good.is_empty() {
        let _ = std::fs::remove_file(meta);
        let _ = std::fs::remove_file(data);
        return true;
    }
    if good.len() < m.entries.len() {
        let rewritten = encode_bucket_meta(&BucketMeta {
            bucket_id: id,
            data_len: m.data_len,
            entries: good.clone(),
        });
        if let Err(e) = commit_file(meta, &rewritten) {
            report.problems.push(ScanProblem::Unreadable {
                path: meta.to_path_buf(),
                error: format!("rewriting without the dropped objects: {e}"),
            });
        }
        meta_len = rewritten.len() as u64;
        changed = true;
    }
    report.units.push(NewUnit {
        id,
        data: data.to_path_buf(),
        meta: Some(meta.to_path_buf()),
        bytes: on_disk(have) + on_disk(meta_len),
        objects: good
            .into_iter()
            .map(|e| {
                (
                    e.key,
                    ObjectLocation {
                        unit: id,
                        offset: e.offset,
                        len: e.len,
                        crc: e.crc,
                        tag: e.tag,
                    },
                )
            })
            .collect(),
    });
    changed
}
