//! [`DiskTier`]: one directory's SSD tier — the layout's writer, the index,
//! eviction and verified reads behind one thread-safe handle.
//!
//! Writing is stage-then-commit. [`DiskTier::stage`] admits an object (evicting
//! under the policy, or refusing with [`TierError::Full`] when it may not),
//! copies it into the open bucket and may seal a full bucket on the way;
//! [`DiskTier::commit`] seals whatever is staged. An object is readable, and
//! may be acknowledged to the master, exactly when it appears in a
//! [`Committed`]. A caller group-commits by staging everything it has queued
//! and committing once.
//!
//! Eviction batches that `stage` hands back are phase 1: the caller reports
//! their keys to the master, then calls [`DiskTier::finalize`] (or
//! [`DiskTier::restore`] if the report failed).

use super::bucket::{data_path, meta_path, BucketWriter, SealedBucket};
use super::config::{StorageBackend, TierConfig};
use super::file_per_key::{scan_files, FilePerKeyWriter};
use super::format::{align_up, ObjectHeader, DIO_ALIGN};
use super::index::{EvictionBatch, IndexUsage, NewUnit, ObjectLocation, TierIndex};
use super::io::holes::supports_punch;
use super::io::{engine, fs_capacity, fs_usage, DiskFile, IoEngine};
use super::read::{read_range, read_value, read_values, ValueRead, ValueRef};
use super::readahead::{Readahead, AHEAD_BYTES};
use super::scan::{scan_buckets, ScanReport, Verify};
use super::{Result, TierError};
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;

pub type TierUsage = IndexUsage;

/// The file that names a tier directory across restarts.
pub const IDENTITY_FILE: &str = "mooncake-tier.id";

/// The directory's identity: 32 hex digits, created (durably) on first use.
/// A restarted storage client presents it so the master can hand it the disk
/// replicas a previous process registered from the same directory.
pub fn tier_identity(dir: &std::path::Path) -> Result<String> {
    let path = dir.join(IDENTITY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) if s.trim().len() == 32 && s.trim().bytes().all(|b| b.is_ascii_hexdigit()) => {
            return Ok(s.trim().to_string())
        }
        Ok(_) => {
            return Err(TierError::Corrupt {
                what: format!("{}: not a tier identity", path.display()),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(TierError::io("read", &path, e)),
    }
    let id = format!("{:032x}", rand::random::<u128>());
    super::io::commit_file(&path, id.as_bytes())?;
    Ok(id)
}

/// Objects that are durable and readable now, with their locations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub objects: Vec<(String, ObjectLocation)>,
}

/// What staging one object did besides staging it.
#[derive(Debug, Default)]
#[must_use = "acknowledge the committed objects and finalize the eviction"]
pub struct StageOutcome {
    /// A bucket that had to be sealed to make room: these objects are durable.
    pub committed: Option<Committed>,
    /// Objects evicted to make room (phase 1).
    pub evicted: EvictionBatch,
}

/// A failed write: the error, and every staged object it discarded (none of
/// them was ever committed).
#[derive(Debug, thiserror::Error)]
#[error("{error} ({} staged objects discarded)", discarded.len())]
pub struct WriteError {
    pub error: TierError,
    pub discarded: Vec<String>,
}

enum Writer {
    // Boxed: its open bucket (chunk buffers, flusher) makes it the large one.
    Bucket(Box<BucketWriter>),
    Files(FilePerKeyWriter),
}

struct WriteState {
    writer: Writer,
    /// Staged objects, in order.
    pending: Vec<Pending>,
}

struct Pending {
    key: String,
    /// Bytes reserved in the index.
    reserved: u64,
    /// When the object was last used before it came here (LRU rank).
    last_use: u64,
}

pub struct DiskTier {
    config: TierConfig,
    root: PathBuf,
    engine: Arc<dyn IoEngine>,
    engine_note: Option<String>,
    index: Mutex<TierIndex>,
    write: Mutex<WriteState>,
    /// Bucket layout only: a file-per-key unit holds one value.
    readahead: Option<Readahead>,
}

fn bucket_unit(root: &std::path::Path, s: &SealedBucket) -> NewUnit {
    NewUnit {
        id: s.id,
        data: data_path(root, s.id),
        meta: Some(meta_path(root, s.id)),
        bytes: s.disk_bytes(),
        objects: s
            .entries
            .iter()
            .map(|e| {
                (
                    e.key.clone(),
                    ObjectLocation {
                        unit: s.id,
                        offset: e.offset,
                        len: e.len,
                        crc: e.crc,
                        tag: e.tag,
                    },
                )
            })
            .collect(),
    }
}

impl DiskTier {
    /// Opens the tier at `config.storage_path`: checks the path, scans what a
    /// previous run left (dropping torn objects, see [`super::scan`]) and
    /// indexes every complete object. The report says what was dropped.
    pub fn open(config: TierConfig, verify: Verify) -> Result<(DiskTier, ScanReport)> {
        config.validate()?;
        config.validate_path()?;
        let (engine, engine_note) = engine(config.use_uring);
        let (root, report) = match config.backend {
            StorageBackend::Bucket => {
                let root = config.storage_path.clone();
                let report = scan_buckets(&root, &*engine, verify)?;
                (root, report)
            }
            StorageBackend::FilePerKey => {
                let root = config.storage_path.join(&config.fsdir);
                let report = scan_files(&root, &*engine, verify)?;
                (root, report)
            }
        };
        let byte_limit = config.byte_limit(fs_capacity(&config.storage_path)?);
        // Per-object eviction needs hole punching; file-per-key units
        // hold one object each anyway.
        let per_object = config.backend == StorageBackend::Bucket && supports_punch(&root);
        let mut index = TierIndex::new(
            config.effective_policy(),
            byte_limit,
            config.total_keys_limit,
            per_object,
        );
        for unit in &report.units {
            // Never read since the restart: lru evicts these first, in write order.
            index.insert(unit.clone(), 0);
        }
        let writer = match config.backend {
            StorageBackend::Bucket => Writer::Bucket(Box::new(BucketWriter::new(
                &root,
                engine.clone(),
                config.bucket_size_limit,
                config.bucket_keys_limit,
                report.next_id,
            ))),
            StorageBackend::FilePerKey => {
                Writer::Files(FilePerKeyWriter::new(&root, engine.clone(), report.next_id))
            }
        };
        let readahead = match config.backend {
            StorageBackend::Bucket => Some(
                Readahead::new(engine.clone())
                    .map_err(|e| TierError::io("spawn readahead for", &root, e))?,
            ),
            StorageBackend::FilePerKey => None,
        };
        let tier = DiskTier {
            config,
            root,
            readahead,
            engine,
            engine_note,
            index: Mutex::new(index),
            write: Mutex::new(WriteState {
                writer,
                pending: Vec::new(),
            }),
        };
        Ok((tier, report))
    }

    pub fn config(&self) -> &TierConfig {
        &self.config
    }

    /// This directory's identity ([`tier_identity`]).
    pub fn identity(&self) -> Result<String> {
        tier_identity(&self.config.storage_path)
    }

    /// `"psync"` or `"io_uring"`.
    pub fn engine_name(&self) -> &'static str {
        self.engine.name()
    }

    /// Why io_uring was asked for and not used, if it was.
    pub fn engine_note(&self) -> Option<&str> {
        self.engine_note.as_deref()
    }

    /// Bytes an object will take on disk, as the index accounts it up front.
    fn reservation(&self, key: &str, len: u64) -> u64 {
        match self.config.backend {
            StorageBackend::Bucket => align_up(len, DIO_ALIGN as u64) + 32 + key.len() as u64,
            StorageBackend::FilePerKey => align_up(
                ObjectHeader::value_offset_for(key.len()) + len,
                DIO_ALIGN as u64,
            ),
        }
    }

    /// Turns sealed objects into index entries; returns their reservations.
    fn commit_locked(&self, ws: &mut WriteState, sealed: Vec<NewUnit>, now: u64) -> Committed {
        let n: usize = sealed.iter().map(|u| u.objects.len()).sum();
        let released: Vec<Pending> = ws.pending.drain(..n.min(ws.pending.len())).collect();
        let mut index = self.index.lock();
        index.release(
            released.iter().map(|p| p.reserved).sum(),
            released.len() as u64,
        );
        let mut objects = Vec::with_capacity(n);
        for unit in sealed {
            objects.extend(unit.objects.iter().cloned());
            index.insert(unit, now);
        }
        for p in released.iter().filter(|p| p.last_use < now) {
            index.set_last_use(&p.key, p.last_use);
        }
        Committed { objects }
    }

    fn fail_locked(&self, ws: &mut WriteState, error: TierError) -> WriteError {
        let discarded: Vec<Pending> = ws.pending.drain(..).collect();
        self.index.lock().release(
            discarded.iter().map(|p| p.reserved).sum(),
            discarded.len() as u64,
        );
        WriteError {
            error,
            discarded: discarded.into_iter().map(|p| p.key).collect(),
        }
    }

    /// Stages one object (its value as parts written back to back). `tag` is
    /// the caller's version of the object, kept on disk. See the module docs.
    pub fn stage(
        &self,
        key: &str,
        tag: u64,
        parts: &[&[u8]],
        now: u64,
    ) -> Result<StageOutcome, WriteError> {
        self.stage_idle(key, tag, parts, now, now)
    }

    /// [`DiskTier::stage`] of an object last used at `last_use` (before
    /// `now`, e.g. in memory before it was offloaded): under `lru` it ranks
    /// by that time, as one LRU spanning memory and tier would.
    pub fn stage_idle(
        &self,
        key: &str,
        tag: u64,
        parts: &[&[u8]],
        now: u64,
        last_use: u64,
    ) -> Result<StageOutcome, WriteError> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let reserve = self.reservation(key, len);
        let mut ws = self.write.lock();
        let evicted = self
            .index
            .lock()
            .admit(reserve, 1)
            .map_err(|error| WriteError {
                error,
                discarded: Vec::new(),
            })?;
        ws.pending.push(Pending {
            key: key.to_string(),
            reserved: reserve,
            last_use: last_use.min(now),
        });
        let sealed = match &mut ws.writer {
            Writer::Bucket(w) => w
                .stage(key, tag, parts)
                .map(|s| s.map(|s| bucket_unit(&self.root, &s))),
            Writer::Files(w) => w.stage(key, tag, parts).map(|()| None),
        };
        match sealed {
            Ok(sealed) => {
                let committed = sealed.map(|u| self.commit_locked(&mut ws, vec![u], now));
                Ok(StageOutcome { committed, evicted })
            }
            Err(error) => {
                // Nothing was written in place of the victims: keep them.
                self.index.lock().restore(evicted);
                Err(self.fail_locked(&mut ws, error))
            }
        }
    }

    /// Makes everything staged durable now, partly filled bucket or not.
    pub fn commit(&self, now: u64) -> Result<Option<Committed>, WriteError> {
        let mut ws = self.write.lock();
        let sealed = match &mut ws.writer {
            Writer::Bucket(w) => w.seal().map(|s| {
                s.map(|s| vec![bucket_unit(&self.root, &s)])
                    .unwrap_or_default()
            }),
            Writer::Files(w) => w
                .seal()
                .map(|files| files.iter().map(|f| f.to_unit()).collect()),
        };
        match sealed {
            Ok(units) if units.is_empty() => Ok(None),
            Ok(units) => Ok(Some(self.commit_locked(&mut ws, units, now))),
            Err(error) => Err(self.fail_locked(&mut ws, error)),
        }
    }

    /// Where `key` is, if the tier has it.
    pub fn location(&self, key: &str) -> Option<ObjectLocation> {
        self.index.lock().location(key).cloned()
    }

    /// Every indexed object (key, location): what a restart re-registers.
    pub fn objects(&self) -> Vec<(String, ObjectLocation)> {
        self.index
            .lock()
            .keys()
            .map(|(k, l)| (k.clone(), l.clone()))
            .collect()
    }

    /// A read whose checksum failed: the object leaves the index for good.
    fn on_corrupt<T>(&self, key: &str, r: Result<T>) -> Result<T> {
        if matches!(r, Err(TierError::Corrupt { .. })) {
            self.index.lock().remove(&[key.to_string()]);
        }
        r
    }

    /// Notes a read of `loc` for readahead and fills `dst` from its windows
    /// if they hold the value and it passes its checksum. A window that
    /// fails the checksum serves nothing: the caller reads the file, which
    /// decides.
    fn served_by_readahead(&self, loc: &ObjectLocation, dst: &mut [u8]) -> bool {
        let Some(ra) = &self.readahead else {
            return false;
        };
        let route = self.index.lock().route(loc.unit, AHEAD_BYTES);
        ra.advance(loc.unit, loc.offset, loc.offset + loc.len, &route);
        dst.len() as u64 == loc.len
            && ra.read(loc.unit, loc.offset, dst)
            && crc32c::crc32c(dst) == loc.crc
    }

    /// Reads `key`'s value into `dst` (exactly its length), verified.
    pub fn read(&self, key: &str, dst: &mut [u8], now: u64) -> Result<()> {
        let (loc, handle) = self
            .index
            .lock()
            .lookup(key, now)
            .ok_or(TierError::NotFound)?;
        if self.served_by_readahead(&loc, dst) {
            return Ok(());
        }
        let file = DiskFile::open_read(&handle.data)?;
        let v = ValueRef {
            file: &file,
            offset: loc.offset,
            len: loc.len,
            crc: loc.crc,
        };
        let r = read_value(&*self.engine, v, dst);
        drop(handle);
        self.on_corrupt(key, r)
    }

    /// Reads `dst.len()` bytes of `key`'s value from `start`, verified.
    pub fn read_range(&self, key: &str, start: u64, dst: &mut [u8], now: u64) -> Result<()> {
        let (loc, handle) = self
            .index
            .lock()
            .lookup(key, now)
            .ok_or(TierError::NotFound)?;
        let file = DiskFile::open_read(&handle.data)?;
        let v = ValueRef {
            file: &file,
            offset: loc.offset,
            len: loc.len,
            crc: loc.crc,
        };
        let r = read_range(&*self.engine, v, start, dst);
        drop(handle);
        self.on_corrupt(key, r)
    }

    /// Reads many values at once; one result per read, in order.
    pub fn read_batch(&self, reads: &mut [(&str, &mut [u8])], now: u64) -> Vec<Result<()>> {
        if let [(key, dst)] = reads {
            // One value: the single read, which may come from readahead.
            return vec![self.read(key, dst, now)];
        }
        let mut found: Vec<_> = {
            let mut index = self.index.lock();
            reads.iter().map(|(k, _)| index.lookup(k, now)).collect()
        };
        let mut results: Vec<Option<Result<()>>> = (0..reads.len()).map(|_| None).collect();
        // In order: a batch of a bucket's values read in write order is a
        // sequential reader too. What the windows served needs no request.
        for (i, (f, (_, dst))) in found.iter_mut().zip(reads.iter_mut()).enumerate() {
            if let Some((loc, _)) = f {
                if self.served_by_readahead(loc, dst) {
                    results[i] = Some(Ok(()));
                    *f = None;
                }
            }
        }
        // One descriptor per unit, so a bucket's adjacent values can be
        // read as one request.
        let mut opened: std::collections::HashMap<u64, Arc<Result<DiskFile>>> =
            std::collections::HashMap::new();
        let files: Vec<Option<Arc<Result<DiskFile>>>> = found
            .iter()
            .map(|f| {
                f.as_ref().map(|(loc, h)| {
                    opened
                        .entry(loc.unit)
                        .or_insert_with(|| Arc::new(DiskFile::open_read(&h.data)))
                        .clone()
                })
            })
            .collect();
        let mut batch = Vec::new();
        let mut slots = Vec::new();
        for (i, ((_, dst), (f, file))) in reads.iter_mut().zip(found.iter().zip(&files)).enumerate()
        {
            match (f, file.as_deref()) {
                (None, _) if results[i].is_some() => {} // served by readahead
                (None, _) => results[i] = Some(Err(TierError::NotFound)),
                (Some(_), Some(Err(e))) => {
                    results[i] = Some(Err(TierError::Invalid(format!("open: {e}"))));
                }
                (Some((loc, _)), Some(Ok(file))) => {
                    batch.push(ValueRead {
                        value: ValueRef {
                            file,
                            offset: loc.offset,
                            len: loc.len,
                            crc: loc.crc,
                        },
                        dst,
                    });
                    slots.push(i);
                }
                (Some(_), None) => unreachable!("a file for every found object"),
            }
        }
        for (slot, r) in slots
            .into_iter()
            .zip(read_values(&*self.engine, &mut batch))
        {
            results[slot] = Some(r);
        }
        drop(found);
        results
            .into_iter()
            .zip(reads.iter())
            .map(|(r, (k, _))| self.on_corrupt(k, r.expect("every read has a result")))
            .collect()
    }

    /// Forgets objects the master removed; their files go once unused.
    pub fn remove(&self, keys: &[String]) -> usize {
        self.index.lock().remove(keys)
    }

    /// Phase 2 of an eviction: the master knows, the files may go.
    pub fn finalize(&self, batch: EvictionBatch) {
        self.index.lock().finalize(batch);
    }

    /// Undoes phase 1 of an eviction the master could not be told about.
    pub fn restore(&self, batch: EvictionBatch) {
        self.index.lock().restore(batch);
    }

    /// The proactive eviction (`MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION`
    /// and its ratios), for a disk filling up from elsewhere: when the
    /// filesystem holding the tier is above the high mark, the tier's
    /// coldest objects go until it would be back at the low mark. The tier's
    /// own size needs no sweep (admission evicts exactly what each write
    /// needs), so the tier holds its whole configured size. An empty batch
    /// when disabled, under the high mark, or when the filesystem cannot be
    /// asked.
    pub fn evict_above_watermark(&self) -> EvictionBatch {
        if !self.config.enable_disk_watermark_eviction {
            return EvictionBatch::default();
        }
        match fs_usage(&self.config.storage_path) {
            Ok((used, size)) => self.evict_for_disk_usage(used, size),
            Err(e) => {
                tracing::debug!(error = %e, "disk usage for the watermark eviction");
                EvictionBatch::default()
            }
        }
    }

    /// [`Self::evict_above_watermark`] at a measured disk usage.
    pub(crate) fn evict_for_disk_usage(&self, used: u64, size: u64) -> EvictionBatch {
        let mut index = self.index.lock();
        let excess = watermark_excess(
            used,
            size,
            index.usage().doomed_bytes,
            self.config.disk_eviction_high_watermark_ratio,
            self.config.disk_eviction_low_watermark_ratio,
        );
        if excess == 0 {
            return EvictionBatch::default();
        }
        index.evict_bytes(excess)
    }

    /// Single reads served from readahead windows so far.
    pub fn readahead_hits(&self) -> u64 {
        self.readahead.as_ref().map_or(0, |r| r.hits())
    }

    pub fn usage(&self) -> TierUsage {
        self.index.lock().usage()
    }
}

/// Bytes to free for a disk `used` of `size` bytes to go from above the
/// `high` ratio down to the `low` one, less what is freed already and
/// waiting for its readers (`pending`); 0 at or under the high mark.
pub(crate) fn watermark_excess(used: u64, size: u64, pending: u64, high: f64, low: f64) -> u64 {
    if size == 0 || used as f64 <= high * size as f64 {
        return 0;
    }
    (used - (low * size as f64) as u64).saturating_sub(pending)
}

#[cfg(test)]
mod tests;
