//! The shared-filesystem tier (`mooncake_master --root_fs_dir`): one file
//! per object under a directory every client mounts at the same path.
//!
//! Paths are the reference's: `<root_fs_dir>/<cluster_id>/<d1>/<d2>/<name>`,
//! `d1`/`d2` the letters `a` + the low two nibbles of libstdc++'s
//! `std::hash<std::string>` of the key. The name is the key, except that the
//! characters the reference replaces with `_` (`/\:*?"<>|` and NUL) and `%`
//! are percent-escaped (so `a/b` and `a_b` never share a file), `.` and `..`
//! are escaped whole, and a name longer than a file name may be is a hash.
//!
//! A file is the SSD tier's object format (`format::ObjectHeader`: key,
//! length, crc32c, then the value on a 4 KiB boundary). [`GroupWriter`]
//! writes a group of them under `.tmp` names, then fsyncs, renames and
//! fsyncs each directory once: a file exists under its name only once
//! durable. Reads check the header's key and
//! length against what the master said and the value's checksum, so a file
//! of another key or version is never served.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::format::{
    decode_object_header, encode_object_header, FormatError, ObjectHeader, DIO_ALIGN,
};
use super::io::psync::PsyncEngine;
use super::io::{sync_dir, temp_path, AlignedBuf, DiskFile, IoEngine, SeqWriter};
use super::{Result, TierError};

/// Longest file name most filesystems take (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// libstdc++'s `std::hash<std::string>` on 64-bit targets (`_Hash_bytes`,
/// a MurmurHash2 variant, seed `0xc70f6907`): the reference derives its
/// directories from it.
pub fn std_hash(bytes: &[u8]) -> u64 {
    const MUL: u64 = (0xc6a4_a793u64 << 32) + 0x5bd1_e995;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let mut hash = 0xc70f_6907u64 ^ (bytes.len() as u64).wrapping_mul(MUL);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let data = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        hash ^= shift_mix(data.wrapping_mul(MUL)).wrapping_mul(MUL);
        hash = hash.wrapping_mul(MUL);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let data = rest
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) + b as u64);
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    hash = shift_mix(hash).wrapping_mul(MUL);
    shift_mix(hash)
}

fn file_name(key: &str) -> String {
    if key.is_empty() {
        return "%".into(); // no escaped key is a lone `%`
    }
    if key == "." || key == ".." {
        return key.bytes().map(|b| format!("%{b:02X}")).collect();
    }
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            '/' | '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|' | '\0' | '%' => {
                out.push_str(&format!("%{:02X}", c as u32))
            }
            c => out.push(c),
        }
    }
    if out.len() > NAME_MAX {
        let h = std_hash(key.as_bytes());
        return format!("~{h:016x}{:08x}", crc32c::crc32c(key.as_bytes()));
    }
    out
}

/// The file holding `key` under `fsdir` (`<root_fs_dir>/<cluster_id>`).
pub fn object_file(fsdir: &str, key: &str) -> String {
    let h = std_hash(key.as_bytes());
    let d1 = (b'a' + (h & 0xf) as u8) as char;
    let d2 = (b'a' + ((h >> 4) & 0xf) as u8) as char;
    format!(
        "{}/{d1}/{d2}/{}",
        fsdir.trim_end_matches('/'),
        file_name(key)
    )
}

/// Bytes of each of the group writer's reused buffers.
pub const GROUP_CHUNK: usize = 4 << 20;
/// Buffers per writing thread: one fills while the other is written.
const GROUP_DEPTH: usize = 2;
/// Threads writing a group's files.
const WRITE_LANES: usize = 4;

/// Threads of a group's durability pass. Syncs issued together share the
/// filesystem's journal commits and device flushes (and on a network
/// filesystem, its round trips); one at a time, each waits for its own.
const SYNC_THREADS: usize = 64;

/// `f` of every item, from up to [`SYNC_THREADS`] threads; results in order.
fn in_parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.iter().map(&f).collect();
    }
    let threads = items.len().min(SYNC_THREADS);
    let per = items.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let workers: Vec<_> = items
            .chunks(per)
            .map(|chunk| scope.spawn(|| chunk.iter().map(&f).collect::<Vec<R>>()))
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a sync thread panicked"))
            .collect()
    })
}

/// One object of a group: its key and bytes, and the file they go to
/// (`object_file` of the key).
pub struct GroupObject<'a> {
    pub key: &'a str,
    pub path: PathBuf,
    pub value: &'a [u8],
}

/// A written object waiting for the group's durability pass.
struct Staged {
    index: usize,
    temp: PathBuf,
    file: Arc<DiskFile>,
}

/// Writes groups of object files the way the SSD tier writes its own:
/// `O_DIRECT` from aligned buffers reused across files and groups (two per
/// writing thread, a few threads per group; buffered where the filesystem
/// refuses `O_DIRECT`), then one
/// durability pass per group: `fdatasync` of every file, renames from the
/// `.tmp` names, one fsync per directory touched, each step from several
/// threads. Syncing after all the writes, together, lets the syncs share
/// journal commits, and no file is visible under its name before it is
/// complete.
pub struct GroupWriter {
    engine: Arc<dyn IoEngine>,
    /// Each writing thread's buffers, kept for the next group.
    lanes: Vec<Vec<AlignedBuf>>,
    chunk: usize,
}

impl Default for GroupWriter {
    fn default() -> Self {
        Self::new(Arc::new(PsyncEngine), GROUP_CHUNK)
    }
}

impl GroupWriter {
    /// A writer moving bytes with `engine` through buffers of `chunk`
    /// bytes (a multiple of the `O_DIRECT` alignment).
    pub fn new(engine: Arc<dyn IoEngine>, chunk: usize) -> GroupWriter {
        let chunk = chunk.div_ceil(DIO_ALIGN).max(1) * DIO_ALIGN;
        GroupWriter {
            engine,
            lanes: Vec::new(),
            chunk,
        }
    }

    /// Writes every object durably; one result per object, in order. A
    /// failed object leaves no file under its name (a file it replaced is
    /// kept) and does not affect the others.
    pub fn write_group(&mut self, objects: &[GroupObject<'_>]) -> Vec<Result<()>> {
        if objects.is_empty() {
            return Vec::new();
        }
        // Files are written by a few threads, each through its own buffers:
        // one writer at a time leaves the disk idle between its files.
        let lanes = objects.len().min(WRITE_LANES);
        self.lanes
            .resize_with(self.lanes.len().max(lanes), Vec::new);
        let per = objects.len().div_ceil(lanes);
        let (engine, chunk) = (&self.engine, self.chunk);
        let written: Vec<Result<(PathBuf, Arc<DiskFile>)>> = std::thread::scope(|scope| {
            let workers: Vec<_> = objects
                .chunks(per)
                .zip(self.lanes.iter_mut())
                .map(|(part, bufs)| {
                    scope.spawn(move || {
                        part.iter()
                            .map(|o| write_temp(engine, chunk, bufs, o))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().expect("a writing thread panicked"))
                .collect()
        });
        let mut results: Vec<Result<()>> = Vec::with_capacity(objects.len());
        let mut staged = Vec::with_capacity(objects.len());
        for (index, w) in written.into_iter().enumerate() {
            match w {
                Ok((temp, file)) => {
                    staged.push(Staged { index, temp, file });
                    results.push(Ok(()));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        // Durability pass: data, then names, then directories, each step
        // from several threads at once.
        let engine = &self.engine;
        let synced = in_parallel(&staged, |s| {
            let path = &objects[s.index].path;
            engine
                .sync_data(&s.file)
                .map_err(|e| TierError::io("fdatasync", &s.temp, e))
                .and_then(|()| {
                    std::fs::rename(&s.temp, path).map_err(|e| TierError::io("rename", path, e))
                })
        });
        let mut dirs: BTreeMap<PathBuf, Vec<usize>> = BTreeMap::new();
        for (s, r) in staged.iter().zip(synced) {
            match r {
                Ok(()) => {
                    let path = &objects[s.index].path;
                    let dir = path.parent().expect("checked in write_temp");
                    dirs.entry(dir.to_path_buf()).or_default().push(s.index);
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&s.temp);
                    results[s.index] = Err(e);
                }
            }
        }
        let dirs: Vec<(PathBuf, Vec<usize>)> = dirs.into_iter().collect();
        let dir_synced = in_parallel(&dirs, |(dir, _)| sync_dir(dir));
        for ((_, members), r) in dirs.iter().zip(dir_synced) {
            if let Err(e) = r {
                // The renames may not survive a crash: not acknowledged.
                for &i in members {
                    let _ = std::fs::remove_file(&objects[i].path);
                    results[i] = Err(TierError::Invalid(e.to_string()));
                }
            }
        }
        results
    }
}

/// Writes one object under its `.tmp` name (removed again on error) through
/// `bufs` (refilled to [`GROUP_DEPTH`] buffers of `chunk` bytes).
fn write_temp(
    engine: &Arc<dyn IoEngine>,
    chunk: usize,
    bufs: &mut Vec<AlignedBuf>,
    o: &GroupObject<'_>,
) -> Result<(PathBuf, Arc<DiskFile>)> {
    let dir = o
        .path
        .parent()
        .ok_or_else(|| TierError::Invalid(format!("{} has no directory", o.path.display())))?;
    std::fs::create_dir_all(dir).map_err(|e| TierError::io("create", dir, e))?;
    let header = ObjectHeader {
        key: o.key.to_string(),
        value_len: o.value.len() as u64,
        tag: 0,
        seq: 0,
        value_offset: ObjectHeader::value_offset_for(o.key.len()),
        value_crc: crc32c::crc32c(o.value),
    };
    let head = encode_object_header(&header);
    let temp = temp_path(&o.path);
    let file = DiskFile::create(&temp)?;
    while bufs.len() < GROUP_DEPTH {
        bufs.push(AlignedBuf::new(chunk));
    }
    let mut out = SeqWriter::with_buffers(file, engine.clone(), std::mem::take(bufs));
    let written = (|| {
        out.append(&head, 0)?;
        out.append(o.value, header.value_offset as usize - head.len())?;
        out.finish()?;
        // Drop the block padding: the value ends the file.
        out.file().set_len(header.value_offset + header.value_len)
    })();
    let (file, back) = out.into_parts();
    *bufs = back.into_iter().filter(|b| b.capacity() == chunk).collect();
    match written {
        Ok(()) => Ok((temp, file)),
        Err(e) => {
            drop(file);
            let _ = std::fs::remove_file(&temp);
            Err(e)
        }
    }
}

/// Reads `key`'s value from `path` into `dst` (exactly its length),
/// verified: the header names `key` and `dst.len()` bytes, the checksum
/// holds. A missing file is `NotFound`.
pub fn read_object(path: &Path, key: &str, dst: &mut [u8]) -> Result<()> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(TierError::NotFound),
        Err(e) => return Err(TierError::io("open", path, e)),
    };
    let corrupt = |what: String| TierError::Corrupt {
        what: format!("{}: {what}", path.display()),
    };
    let value_offset = ObjectHeader::value_offset_for(key.len());
    let mut head = vec![0u8; value_offset as usize];
    f.read_exact_at(&mut head, 0)
        .map_err(|e| corrupt(format!("header: {e}")))?;
    let header = decode_object_header(&head).map_err(|e: FormatError| corrupt(e.to_string()))?;
    if header.key != key {
        return Err(corrupt(format!("holds {:?}, not {key:?}", header.key)));
    }
    if header.value_len != dst.len() as u64 {
        return Err(TierError::BufferSize {
            want: header.value_len,
            got: dst.len() as u64,
        });
    }
    f.read_exact_at(dst, header.value_offset)
        .map_err(|e| corrupt(format!("value: {e}")))?;
    if crc32c::crc32c(dst) != header.value_crc {
        return Err(corrupt("value checksum mismatch".into()));
    }
    Ok(())
}

/// Deletes the file at `path` (and a leftover `.tmp`); a missing file is fine.
pub fn remove_object(path: &Path) -> Result<()> {
    let _ = std::fs::remove_file(temp_path(path));
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(TierError::io("remove", path, e)),
    }
}

/// `path` as a `PathBuf` (descriptors carry strings).
pub fn path_of(file: &str) -> PathBuf {
    PathBuf::from(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_matches_libstdcxx() {
        // Printed by `std::hash<std::string>{}(k)` from g++ 14 (x86-64).
        for (k, h) in [
            ("", 0x553e_9390_1e46_2a6e),
            ("a", 0x454d_dee4_88c1_ed6b),
            ("hello", 0x2655_3298_fdbe_39c8),
            ("key-0001", 0xdc5e_0483_1d97_fab9),
            ("abcdefgh", 0x783d_b3e3_8db8_98bb),
            ("abcdefghi", 0xb4ec_9257_851c_8aaf),
            ("mooncake/object:7", 0x5745_94da_f933_d07b),
        ] {
            assert_eq!(std_hash(k.as_bytes()), h, "{k:?}");
        }
    }

    #[test]
    fn paths_follow_the_reference_and_never_collide() {
        assert_eq!(object_file("/mnt/fs/c/", "hello"), "/mnt/fs/c/i/m/hello");
        assert_eq!(object_file("/d", "key-0001"), "/d/j/l/key-0001");
        let slash = object_file("/d", "a/b");
        let under = object_file("/d", "a_b");
        assert!(slash.ends_with("/a%2Fb"), "{slash}");
        assert!(under.ends_with("/a_b"), "{under}");
        assert_ne!(object_file("/d", "a%2Fb"), slash);
        for k in [".", "..", ""] {
            let p = object_file("/d", k);
            let name = p.rsplit('/').next().unwrap();
            assert!(name != "." && name != ".." && !name.is_empty(), "{p}");
        }
        let long = "k".repeat(300);
        let name_len = object_file("/d", &long).rsplit('/').next().unwrap().len();
        assert!(name_len <= NAME_MAX);
    }

    #[test]
    fn objects_round_trip_and_wrong_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fsdir = dir.path().to_str().unwrap();
        let value: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let path = path_of(&object_file(fsdir, "k1"));
        let put = GroupObject {
            key: "k1",
            path: path.clone(),
            value: &value,
        };
        let [r] = GroupWriter::default()
            .write_group(&[put])
            .try_into()
            .unwrap();
        r.unwrap();
        assert!(!temp_path(&path).exists());
        let mut out = vec![0u8; value.len()];
        read_object(&path, "k1", &mut out).unwrap();
        assert_eq!(out, value);

        // Another key's file, a wrong length, a flipped byte, no file.
        assert!(matches!(
            read_object(&path, "k2", &mut out),
            Err(TierError::Corrupt { .. })
        ));
        let mut short = vec![0u8; 10];
        assert!(matches!(
            read_object(&path, "k1", &mut short),
            Err(TierError::BufferSize { .. })
        ));
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = read_object(&path, "k1", &mut out).unwrap_err();
        assert_eq!(e.code(), mooncake_common::ErrorCode::FILE_READ_FAIL);
        remove_object(&path).unwrap();
        remove_object(&path).unwrap();
        assert!(matches!(
            read_object(&path, "k1", &mut out),
            Err(TierError::NotFound)
        ));
    }

    /// Fails writes of files whose name holds `torn` after their first
    /// block (a torn file), and the `fdatasync` of files named `unsynced`;
    /// counts files whose final name existed when their data was synced.
    #[derive(Default)]
    struct Faulty {
        visible_before_sync: std::sync::atomic::AtomicUsize,
    }

    impl IoEngine for Faulty {
        fn name(&self) -> &'static str {
            "faulty"
        }
        fn write_all_at(&self, file: &DiskFile, buf: &[u8], offset: u64) -> std::io::Result<()> {
            let name = file.path().file_name().unwrap().to_string_lossy();
            if name.starts_with("torn") {
                let part = buf.len().min(DIO_ALIGN);
                PsyncEngine.write_all_at(file, &buf[..part], offset)?;
                return Err(std::io::Error::other("injected write failure"));
            }
            PsyncEngine.write_all_at(file, buf, offset)
        }
        fn read_at(&self, file: &DiskFile, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
            PsyncEngine.read_at(file, buf, offset)
        }
        unsafe fn read_many(&self, ops: &mut [crate::tier::io::ReadOp]) {
            // SAFETY: the caller's guarantee is passed on unchanged.
            unsafe { PsyncEngine.read_many(ops) }
        }
        fn sync_data(&self, file: &DiskFile) -> std::io::Result<()> {
            let temp = file.path().to_string_lossy().into_owned();
            let name = temp.strip_suffix(".tmp").expect("writes go to temp names");
            if Path::new(name).exists() {
                self.visible_before_sync
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            if name.rsplit('/').next().unwrap().starts_with("unsynced") {
                return Err(std::io::Error::other("injected fdatasync failure"));
            }
            PsyncEngine.sync_data(file)
        }
    }

    fn value(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(13) ^ seed)
            .collect()
    }

    fn temp_files(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.to_string_lossy().ends_with(".tmp") {
                    out.push(p);
                }
            }
        }
        out
    }

    /// Values smaller and larger than the buffers (several chunks in
    /// flight), reused across groups: each reads back byte-exact.
    #[test]
    fn groups_round_trip_through_reused_buffers() {
        let dir = tempfile::tempdir().unwrap();
        let fsdir = dir.path().to_str().unwrap();
        let mut w = GroupWriter::new(Arc::new(PsyncEngine), 3 * DIO_ALIGN);
        for round in 0..3u8 {
            let keys: Vec<String> = (0..20).map(|i| format!("r{round}/k{i}")).collect();
            let values: Vec<Vec<u8>> = (0..20)
                .map(|i| value(i * 7_001 + round as usize, round))
                .collect();
            let group: Vec<GroupObject<'_>> = keys
                .iter()
                .zip(&values)
                .map(|(k, v)| GroupObject {
                    key: k,
                    path: path_of(&object_file(fsdir, k)),
                    value: v,
                })
                .collect();
            for r in w.write_group(&group) {
                r.unwrap();
            }
            for o in &group {
                let mut out = vec![0u8; o.value.len()];
                read_object(&o.path, o.key, &mut out).unwrap();
                assert_eq!(out, o.value, "{}", o.key);
            }
        }
        assert!(temp_files(dir.path()).is_empty());
    }

    /// One object of a group fails at each step (its directory, a torn
    /// write, its fdatasync): it alone reports the error, no file of it
    /// is under its name (the one it would have replaced is intact), no
    /// temp file remains, and the rest of the group is durable. No file
    /// appears under its final name before its data is synced.
    #[test]
    fn a_failed_object_leaves_no_file_and_spares_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let fsdir = dir.path().to_str().unwrap();
        let engine = Arc::new(Faulty::default());
        let mut w = GroupWriter::new(engine.clone(), 2 * DIO_ALIGN);

        // An older file of the key whose rewrite will tear.
        let old = value(5_000, 9);
        let torn_path = path_of(&object_file(fsdir, "torn"));
        let first = GroupWriter::default().write_group(&[GroupObject {
            key: "torn",
            path: torn_path.clone(),
            value: &old,
        }]);
        assert!(first.iter().all(|r| r.is_ok()));
        // A regular file where the next key's directory must go.
        let blocked = dir.path().join("blocked");
        std::fs::write(&blocked, b"not a directory").unwrap();

        let values: Vec<Vec<u8>> = (0..6).map(|i| value(9_000 + i * 3_000, i as u8)).collect();
        let mut group: Vec<GroupObject<'_>> = ["a", "torn", "b", "unsynced", "c"]
            .iter()
            .zip(&values)
            .map(|(k, v)| GroupObject {
                key: k,
                path: path_of(&object_file(fsdir, k)),
                value: v,
            })
            .collect();
        group.push(GroupObject {
            key: "d",
            path: blocked.join("x").join("d"),
            value: &values[5],
        });
        let results = w.write_group(&group);
        let ok: Vec<bool> = results.iter().map(|r| r.is_ok()).collect();
        assert_eq!(ok, [true, false, true, false, true, false], "{results:?}");
        for (o, r) in group.iter().zip(&results) {
            let mut out = vec![0u8; o.value.len()];
            if r.is_ok() {
                read_object(&o.path, o.key, &mut out).unwrap();
                assert_eq!(&out, o.value);
            } else if o.key != "torn" {
                assert!(!o.path.exists(), "{}", o.path.display());
            }
        }
        let mut out = vec![0u8; old.len()];
        read_object(&torn_path, "torn", &mut out).unwrap();
        assert_eq!(out, old);
        assert!(temp_files(dir.path()).is_empty());
        assert_eq!(
            engine
                .visible_before_sync
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }
}
