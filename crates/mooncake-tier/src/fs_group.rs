//! The shared-filesystem tier's group writer: a client writer's round of
//! objects written as files at their keys' paths, each durable before the
//! round returns it as written.
//!
//! An object is written under its `.tmp` name with `O_DIRECT` from aligned
//! buffers reused across files and groups, `fdatasync`ed, and renamed to
//! its name; once every object of the group that goes to a directory has
//! been renamed (or has failed), that directory is fsynced, once. Several
//! lanes do this at once, each taking the next object of the group, so the
//! syncs of one file overlap the writes of the others instead of waiting
//! for the whole group's writes.
//!
//! Directories are created once per writer (all of a tier's at mount, with
//! [`GroupWriter::prepare`]) and their own entries made durable then, so a
//! group syncs only the directories its renames touched.
//!
//! Files the writer deletes ([`GroupWriter::remove`]) become spares that its
//! next files take over instead of allocating inodes ([`super::fs_spare`]).

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::format::{encode_object_header, ObjectHeader, DIO_ALIGN};
use super::fs_spare::{take_over, Spares};
use super::io::psync::PsyncEngine;
use super::io::{sync_dir, temp_path, AlignedBuf, DiskFile, IoEngine, SeqWriter};
use super::{Result, TierError};

/// Bytes of each of the group writer's reused buffers.
pub const GROUP_CHUNK: usize = 4 << 20;
/// Buffers per lane: one fills while the other is written.
const GROUP_DEPTH: usize = 2;
/// Lanes writing a group's files, each one file at a time from write to
/// rename: enough that the disk stays busy while some of them create,
/// sync and rename (measured here: 8 lanes reached 83-84 % of dd where 4
/// reached 61-71 % and 12 no more than 8). Their buffers, 2 x 4 MiB each,
/// are kept across groups.
const WRITE_LANES: usize = 8;

/// One object of a group: its key and bytes, and the file they go to
/// (`object_file` of the key).
pub struct GroupObject<'a> {
    pub key: &'a str,
    pub path: PathBuf,
    pub value: &'a [u8],
}

/// Writes groups of object files the way the SSD tier writes its own:
/// `O_DIRECT` from aligned buffers reused across files and groups (two per
/// lane; buffered where the filesystem refuses `O_DIRECT`, as some NFS and
/// FUSE mounts do), each file synced and renamed as soon as it is written,
/// each directory the group touched fsynced once, after its last rename.
pub struct GroupWriter {
    engine: Arc<dyn IoEngine>,
    /// Each lane's buffers, kept for the next group.
    lanes: Vec<Vec<AlignedBuf>>,
    chunk: usize,
    /// Directories this writer created or found, their entries synced.
    dirs: HashSet<PathBuf>,
    /// Files it deleted, kept for the next files it writes.
    spares: Spares,
}

impl Default for GroupWriter {
    fn default() -> Self {
        Self::new(Arc::new(PsyncEngine), GROUP_CHUNK)
    }
}

/// A directory's share of a group: objects still to finish, those renamed.
#[derive(Default)]
struct DirShare {
    left: usize,
    renamed: Vec<usize>,
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
            dirs: HashSet::new(),
            spares: Spares::new(),
        }
    }

    /// Deletes the object file at `path` (and its `.tmp`): the name is gone
    /// when this returns; the file is kept, emptied, as a spare for the
    /// next file this writer writes (see [`super::fs_spare`]).
    pub fn remove(&mut self, path: &Path) -> Result<()> {
        self.spares.remove(path)
    }

    /// Deletes the spares kept: a writer with nothing to write calls it.
    pub fn release_spares(&mut self) {
        self.spares.clear();
    }

    /// Spares kept for the next files.
    pub fn spares(&self) -> usize {
        self.spares.len()
    }

    /// Creates every directory of the tier at `fsdir` (those that exist are
    /// kept) and makes the new entries durable: one fsync per parent, for
    /// all of its new children at once. A client does this when it mounts
    /// the tier, so groups only sync the directories they rename into.
    pub fn prepare(&mut self, fsdir: &str) -> Result<()> {
        let mut by_parent: HashMap<PathBuf, Vec<PathBuf>> = HashMap::new();
        for d in super::shared_fs::object_dirs(fsdir) {
            let parent = d.parent().expect("object dirs have parents").to_path_buf();
            by_parent.entry(parent).or_default().push(d);
        }
        for (parent, children) in by_parent {
            self.ensure_dir(&parent)?;
            let mut created = false;
            for c in &children {
                created |= make_dir(c)?;
            }
            if created {
                sync_dir(&parent)?;
            }
            self.dirs.extend(children);
        }
        Ok(())
    }

    /// [`make_dir_durable`] of `dir`, unless this writer already did it.
    fn ensure_dir(&mut self, dir: &Path) -> Result<()> {
        if !self.dirs.contains(dir) {
            make_dir_durable(dir)?;
            self.dirs.insert(dir.to_path_buf());
        }
        Ok(())
    }

    /// Writes every object durably; one result per object, in order. A
    /// failed object leaves no file under its name (a file it replaced is
    /// kept) and does not affect the others.
    pub fn write_group(&mut self, objects: &[GroupObject<'_>]) -> Vec<Result<()>> {
        let mut results: Vec<Result<()>> = Vec::with_capacity(objects.len());
        let mut shares: HashMap<&Path, DirShare> = HashMap::new();
        let mut todo = Vec::with_capacity(objects.len());
        for (i, o) in objects.iter().enumerate() {
            let Some(dir) = o.path.parent() else {
                let e = format!("{} has no directory", o.path.display());
                results.push(Err(TierError::Invalid(e)));
                continue;
            };
            match self.ensure_dir(dir) {
                Ok(()) => {
                    shares.entry(dir).or_default().left += 1;
                    todo.push(i);
                    results.push(Ok(()));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if todo.is_empty() {
            return results;
        }
        let lanes = todo.len().min(WRITE_LANES);
        // Each file takes a spare while there are any.
        let mut spares: Vec<Option<PathBuf>> = vec![None; objects.len()];
        for &i in &todo {
            spares[i] = self.spares.pop();
        }
        self.lanes
            .resize_with(self.lanes.len().max(lanes), Vec::new);
        let (engine, chunk) = (&self.engine, self.chunk);
        let next = AtomicUsize::new(0);
        let shares = Mutex::new(shares);
        let dir_failures: Mutex<Vec<(Vec<usize>, TierError)>> = Mutex::new(Vec::new());
        let done: Vec<(usize, Result<()>)> = std::thread::scope(|scope| {
            let workers: Vec<_> = self.lanes[..lanes]
                .iter_mut()
                .map(|bufs| {
                    let (next, todo, shares, spares) = (&next, &todo, &shares, &spares);
                    let dir_failures = &dir_failures;
                    scope.spawn(move || {
                        let mut out = Vec::new();
                        while let Some(&i) = todo.get(next.fetch_add(1, Ordering::Relaxed)) {
                            let o = &objects[i];
                            let r = write_one(engine, chunk, bufs, o, spares[i].as_deref());
                            let dir = o.path.parent().expect("checked above");
                            let last = {
                                let mut shares = shares.lock().expect("dir shares");
                                let share = shares.get_mut(dir).expect("counted above");
                                share.left -= 1;
                                if r.is_ok() {
                                    share.renamed.push(i);
                                }
                                (share.left == 0).then(|| std::mem::take(&mut share.renamed))
                            };
                            // The directory's last object of the group: its
                            // renames become durable with one fsync.
                            if let Some(members) = last.filter(|m| !m.is_empty()) {
                                if let Err(e) = sync_dir(dir) {
                                    dir_failures
                                        .lock()
                                        .expect("dir failures")
                                        .push((members, e));
                                }
                            }
                            out.push((i, r));
                        }
                        out
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().expect("a writing lane panicked"))
                .collect()
        });
        for (i, r) in done {
            results[i] = r;
        }
        for (members, e) in dir_failures.into_inner().expect("dir failures") {
            // The renames may not survive a crash: not acknowledged.
            for i in members {
                let _ = std::fs::remove_file(&objects[i].path);
                results[i] = Err(TierError::Invalid(e.to_string()));
            }
        }
        results
    }
}

/// `mkdir`, content with a directory that is already there; whether it
/// made one.
fn make_dir(dir: &Path) -> Result<bool> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(false),
        Err(e) => Err(TierError::io("create", dir, e)),
    }
}

/// Creates `dir` and its missing ancestors, each new entry synced through
/// its parent. A directory that exists was made durable by whoever made it
/// (other writers do the same; directories above the tier are the
/// operator's), so nothing outside the tier is opened.
fn make_dir_durable(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        make_dir_durable(parent)?;
        if make_dir(dir)? {
            sync_dir(parent)?;
        }
        return Ok(());
    }
    make_dir(dir).map(|_| ())
}

/// Writes `o` under its `.tmp` name, syncs its data and renames it to its
/// name; on error the temp file is removed and the name is untouched.
fn write_one(
    engine: &Arc<dyn IoEngine>,
    chunk: usize,
    bufs: &mut Vec<AlignedBuf>,
    o: &GroupObject<'_>,
    spare: Option<&Path>,
) -> Result<()> {
    let (temp, file) = write_temp(engine, chunk, bufs, o, spare)?;
    let r = engine
        .sync_data(&file)
        .map_err(|e| TierError::io("fdatasync", &temp, e))
        .and_then(|()| {
            std::fs::rename(&temp, &o.path).map_err(|e| TierError::io("rename", &o.path, e))
        });
    drop(file);
    if r.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    r
}

/// Creates `path`; if its directory has gone since this writer made it
/// (someone removed it), makes it again, its entry synced.
fn create_file(path: &Path) -> Result<DiskFile> {
    match DiskFile::create(path) {
        Err(TierError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            make_dir_durable(path.parent().expect("object files have directories"))?;
            DiskFile::create(path)
        }
        r => r,
    }
}

/// Writes one object under its `.tmp` name (removed again on error) through
/// `bufs` (refilled to [`GROUP_DEPTH`] buffers of `chunk` bytes), in the
/// file of `spare` if it can take that over.
fn write_temp(
    engine: &Arc<dyn IoEngine>,
    chunk: usize,
    bufs: &mut Vec<AlignedBuf>,
    o: &GroupObject<'_>,
    spare: Option<&Path>,
) -> Result<(PathBuf, Arc<DiskFile>)> {
    let value_offset = ObjectHeader::value_offset_for(o.key.len());
    let mut header = ObjectHeader {
        key: o.key.to_string(),
        value_len: o.value.len() as u64,
        tag: 0,
        seq: 0,
        value_offset,
        value_crc: 0,
    };
    let temp = temp_path(&o.path);
    // Renamed to the temp name, a spare is what the create opens (and
    // empties): no new inode.
    if let Some(s) = spare {
        take_over(s, &temp);
    }
    let file = create_file(&temp)?;
    while bufs.len() < GROUP_DEPTH {
        bufs.push(AlignedBuf::new(chunk));
    }
    let mut out = SeqWriter::with_buffers(file, engine.clone(), std::mem::take(bufs));
    let written = (|| {
        if value_offset as usize + o.value.len() < chunk {
            // The whole file fits one buffer: checksum the value as it is
            // copied in, then put the header in front of it.
            out.append(&[], value_offset as usize)?;
            out.append_crc(o.value, &mut header.value_crc)?;
            let head = encode_object_header(&header);
            assert!(out.patch_unwritten(0, &head), "the file fits one buffer");
        } else {
            header.value_crc = crc32c::crc32c(o.value);
            let head = encode_object_header(&header);
            out.append(&head, 0)?;
            out.append(o.value, value_offset as usize - head.len())?;
        }
        // The value ends the file: no padding after it.
        out.finish_exact().map(|_| ())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_fs::{object_file, path_of, read_object};

    /// The group writing `values[i]` under `keys[i]`, each at its tier path.
    fn group_of<'a, K: AsRef<str>>(
        fsdir: &str,
        keys: &'a [K],
        values: &'a [Vec<u8>],
    ) -> Vec<GroupObject<'a>> {
        keys.iter()
            .zip(values)
            .map(|(k, v)| GroupObject {
                key: k.as_ref(),
                path: path_of(&object_file(fsdir, k.as_ref())),
                value: v,
            })
            .collect()
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
        unsafe fn read_many(&self, ops: &mut [crate::io::ReadOp]) {
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
    /// flight), reused across groups: each reads back byte-exact, its file
    /// ending where its value does.
    #[test]
    fn groups_round_trip_through_reused_buffers() {
        let dir = tempfile::tempdir().unwrap();
        let fsdir = dir.path().to_str().unwrap();
        let mut w = GroupWriter::new(Arc::new(PsyncEngine), 3 * DIO_ALIGN);
        for round in 0..3u8 {
            let keys: Vec<String> = (0..26).map(|i| format!("r{round}/k{i}")).collect();
            // Sizes spread over several buffers, then the file filling its
            // one buffer short by a byte, exactly, and over by a byte.
            let head = ObjectHeader::value_offset_for(keys[0].len()) as usize;
            let values: Vec<Vec<u8>> = (0..20)
                .map(|i| i * 7_001 + round as usize)
                .chain([3 * DIO_ALIGN - head - 1, 3 * DIO_ALIGN - head])
                .chain([3 * DIO_ALIGN - head + 1, DIO_ALIGN, 1, 0])
                .map(|len| value(len, round))
                .collect();
            let file_len = |o: &GroupObject<'_>| {
                (ObjectHeader::value_offset_for(o.key.len()) as usize + o.value.len()) as u64
            };
            let group = group_of(fsdir, &keys, &values);
            for r in w.write_group(&group) {
                r.unwrap();
            }
            for o in &group {
                let mut out = vec![0u8; o.value.len()];
                read_object(&o.path, o.key, &mut out).unwrap();
                assert_eq!(out, o.value, "{}", o.key);
                // No padding after the value.
                assert_eq!(std::fs::metadata(&o.path).unwrap().len(), file_len(o));
            }
        }
        assert!(temp_files(dir.path()).is_empty());
    }

    /// Files the writer deleted are gone by name at once; the next group's
    /// files (other keys, other directories) take over their inodes, read
    /// back byte-exact and end at their values; a group with fewer files
    /// than spares leaves the rest for later, and releasing them leaves
    /// nothing but the objects.
    #[test]
    fn deleted_files_are_taken_over_by_the_next_group() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let fsdir = dir.path().to_str().unwrap();
        let mut w = GroupWriter::new(Arc::new(PsyncEngine), 4 * DIO_ALIGN);
        w.prepare(fsdir).unwrap();
        let write = |w: &mut GroupWriter, keys: &[String], seed: u8| -> Vec<u64> {
            let values: Vec<Vec<u8>> = (0..keys.len())
                .map(|i| value(1_000 + i * 5_003, seed))
                .collect();
            let group = group_of(fsdir, keys, &values);
            assert!(w.write_group(&group).iter().all(|r| r.is_ok()));
            group
                .iter()
                .map(|o| {
                    let mut out = vec![0u8; o.value.len()];
                    read_object(&o.path, o.key, &mut out).unwrap();
                    assert_eq!(&out, o.value, "{}", o.key);
                    let meta = std::fs::metadata(&o.path).unwrap();
                    let end = ObjectHeader::value_offset_for(o.key.len()) + o.value.len() as u64;
                    assert_eq!(meta.len(), end);
                    meta.ino()
                })
                .collect()
        };
        let old: Vec<String> = (0..12).map(|i| format!("old{i}")).collect();
        let old_inodes: HashSet<u64> = write(&mut w, &old, 1).into_iter().collect();
        for k in &old {
            let p = path_of(&object_file(fsdir, k));
            w.remove(&p).unwrap();
            assert!(!p.exists());
        }
        assert_eq!(w.spares(), old.len());
        let new: Vec<String> = (0..8).map(|i| format!("new{i}")).collect();
        for ino in write(&mut w, &new, 2) {
            assert!(old_inodes.contains(&ino), "a new inode: {ino}");
        }
        assert_eq!(w.spares(), 4);
        w.release_spares();
        assert!(temp_files(dir.path()).is_empty());
        let mut files = 0;
        let mut stack = vec![dir.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    files += 1;
                }
            }
        }
        assert_eq!(files, new.len());
    }

    /// `prepare` makes all 256 directories; one removed behind the
    /// writer's back (with its parent) is made again by the next write.
    #[test]
    fn directories_are_made_at_mount_and_again_when_removed() {
        let dir = tempfile::tempdir().unwrap();
        let fsdir = dir.path().join("tier");
        let fsdir = fsdir.to_str().unwrap();
        let mut w = GroupWriter::default();
        w.prepare(fsdir).unwrap();
        for d in crate::shared_fs::object_dirs(fsdir) {
            assert!(d.is_dir(), "{}", d.display());
        }
        w.prepare(fsdir).unwrap();
        let v = value(10_000, 3);
        let path = path_of(&object_file(fsdir, "gone"));
        let d1 = path.parent().unwrap().parent().unwrap();
        std::fs::remove_dir_all(d1).unwrap();
        let put = [GroupObject {
            key: "gone",
            path: path.clone(),
            value: &v,
        }];
        for r in w.write_group(&put) {
            r.unwrap();
        }
        let mut out = vec![0u8; v.len()];
        read_object(&path, "gone", &mut out).unwrap();
        assert_eq!(out, v);
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
        let mut group = group_of(fsdir, &["a", "torn", "b", "unsynced", "c"], &values);
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

    /// Set in the child of the crash test: the directory it writes to.
    const CRASH_CHILD: &str = "MOONCAKE_FS_GROUP_CRASH_CHILD";

    /// The value of `key` in the crash test: a slice of a fixed pool whose
    /// place and length follow from the key, so any file can be checked on
    /// its own (and values cost nothing to make).
    fn crash_value(key: &str) -> &'static [u8] {
        static POOL: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let pool = POOL.get_or_init(|| value(2 << 20, 0x5a));
        let h = crate::shared_fs::std_hash(key.as_bytes());
        let len = 20_000 + (h % 600_000) as usize;
        let at = ((h >> 32) % (1 << 20)) as usize;
        &pool[at..at + len]
    }

    /// A writer killed (SIGKILL) while writing groups, each after deleting
    /// the group before last (its files the new group's spares): every
    /// object a group returned as written and not deleted since is there,
    /// byte-exact, and every file under an object's name is complete; only
    /// `.tmp` files and spares may be partial.
    #[test]
    fn a_writer_killed_mid_group_leaves_only_complete_files() {
        if let Some(dir) = std::env::var_os(CRASH_CHILD) {
            let fsdir = dir.to_str().unwrap();
            // Small buffers: a file takes many writes, so a kill is likely
            // to land in the middle of one.
            let mut w = GroupWriter::new(Arc::new(PsyncEngine), 16 * DIO_ALIGN);
            w.prepare(fsdir).unwrap();
            let pid = std::process::id();
            let keys_of = |g: usize| -> Vec<String> {
                (0..24).map(|i| format!("p{pid}-g{g}-k{i}")).collect()
            };
            for g in 0.. {
                let keys = keys_of(g);
                let group: Vec<GroupObject<'_>> = keys
                    .iter()
                    .map(|k| GroupObject {
                        key: k,
                        path: path_of(&object_file(fsdir, k)),
                        value: crash_value(k),
                    })
                    .collect();
                use std::io::Write;
                let mut out = std::io::stdout();
                // The group before last is deleted first: this group's
                // files take over its inodes (spares).
                if g >= 2 {
                    let old = keys_of(g - 2);
                    writeln!(out, "removing {}", old.join(" "))
                        .and_then(|()| out.flush())
                        .unwrap();
                    for k in &old {
                        w.remove(&path_of(&object_file(fsdir, k))).unwrap();
                    }
                }
                writeln!(out, "start").and_then(|()| out.flush()).unwrap();
                for r in w.write_group(&group) {
                    r.unwrap();
                }
                writeln!(out, "ack {}", keys.join(" "))
                    .and_then(|()| out.flush())
                    .unwrap();
            }
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let fsdir = dir.path().to_str().unwrap();
        let mut acked: Vec<String> = Vec::new();
        let mut removed: HashSet<String> = HashSet::new();
        for kill_after_ms in [0u64, 2, 5, 9, 14] {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "fs_group::tests::a_writer_killed_mid_group_leaves_only_complete_files",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CRASH_CHILD, fsdir)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let mut lines =
                std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
            // Three groups written, then a kill while the fourth is.
            let mut groups = 0;
            loop {
                let line = lines.next().expect("the child reports groups").unwrap();
                if let Some(keys) = line.strip_prefix("ack ") {
                    acked.extend(keys.split(' ').map(String::from));
                    groups += 1;
                } else if let Some(keys) = line.strip_prefix("removing ") {
                    removed.extend(keys.split(' ').map(String::from));
                } else if line == "start" && groups == 3 {
                    break;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(kill_after_ms));
            child.kill().unwrap();
            child.wait().unwrap();
            // What the child printed before it died was acknowledged too.
            for line in lines {
                let line = line.unwrap();
                if let Some(keys) = line.strip_prefix("ack ") {
                    acked.extend(keys.split(' ').map(String::from));
                } else if let Some(keys) = line.strip_prefix("removing ") {
                    removed.extend(keys.split(' ').map(String::from));
                }
            }
        }
        // Deleted keys are gone or whole (a kill during the deletes).
        acked.retain(|k| !removed.contains(k));
        assert!(!acked.is_empty() && !removed.is_empty());
        for k in &acked {
            let want = crash_value(k);
            let mut out = vec![0u8; want.len()];
            read_object(&path_of(&object_file(fsdir, k)), k, &mut out).unwrap();
            assert!(out == want, "{k}");
        }
        let mut complete = 0;
        let mut stack = vec![dir.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                if p.is_dir() {
                    stack.push(p);
                } else if !name.ends_with(".tmp") && !crate::fs_spare::is_spare(&name) {
                    let want = crash_value(&name);
                    let mut out = vec![0u8; want.len()];
                    read_object(&p, &name, &mut out).unwrap();
                    assert!(out == want, "{}", p.display());
                    complete += 1;
                }
            }
        }
        assert!(
            complete >= acked.len(),
            "{complete} files, {} acknowledged",
            acked.len()
        );
    }
}
