//! The tier's in-memory index: key → location, the units of files that hold
//! the objects (a bucket, or one file-per-key object), and eviction within a
//! byte and key limit.
//!
//! Eviction runs in two phases so a read in flight never sees its file vanish:
//! 1. [`TierIndex::admit`] (or [`TierIndex::evict_above_watermark`]) takes the
//!    victims out of the index: from then on no lookup hands them out. The
//!    caller tells the master their disk replicas are gone.
//! 2. [`TierIndex::finalize`] dooms the victims' files. A doomed file is
//!    deleted when the last [`UnitHandle`] is dropped: readers clone the handle
//!    at lookup and hold it for the whole read, so deletion waits for them.
//!
//! If telling the master fails, [`TierIndex::restore`] puts the victims back.
//! Times (for LRU) are the caller's ticks; the index never reads a clock.

use super::config::EvictionPolicy;
use super::TierError;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Buckets and file-per-key objects are both "units": ordered by id (ids only
/// grow, so id order is write order), evicted whole.
pub type UnitId = u64;

/// Where an object's value is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectLocation {
    pub unit: UnitId,
    pub offset: u64,
    pub len: u64,
    pub crc: u32,
    /// The caller's version of the object.
    pub tag: u64,
}

/// The files of one unit. Once doomed, they are removed when the last handle
/// is dropped.
#[derive(Debug)]
pub struct UnitFiles {
    pub id: UnitId,
    /// The file the values are read from.
    pub data: PathBuf,
    /// A bucket's metadata file.
    pub meta: Option<PathBuf>,
    bytes: u64,
    doomed: AtomicBool,
    doomed_bytes: Arc<AtomicU64>,
}

impl Drop for UnitFiles {
    fn drop(&mut self) {
        if self.doomed.load(Ordering::Acquire) {
            // Metadata first: a crash between the two leaves an orphan data
            // file (removed by the next scan), never metadata without data.
            if let Some(meta) = &self.meta {
                let _ = std::fs::remove_file(meta);
            }
            let _ = std::fs::remove_file(&self.data);
            self.doomed_bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        }
    }
}

/// What a reader holds while it reads from a unit's files.
pub type UnitHandle = Arc<UnitFiles>;

/// A unit to add: its files, its on-disk bytes, its objects in file order.
#[derive(Debug, Clone)]
pub struct NewUnit {
    pub id: UnitId,
    pub data: PathBuf,
    pub meta: Option<PathBuf>,
    pub bytes: u64,
    pub objects: Vec<(String, ObjectLocation)>,
}

#[derive(Debug)]
struct Unit {
    files: UnitHandle,
    keys: Vec<String>,
    live: usize,
    last_access: u64,
}

/// Victims taken out of the index (phase 1), waiting for
/// [`TierIndex::finalize`] or [`TierIndex::restore`].
#[must_use = "finalize or restore the batch"]
#[derive(Debug, Default)]
pub struct EvictionBatch {
    /// The evicted objects' keys: their disk replicas are gone.
    pub keys: Vec<String>,
    units: Vec<Victim>,
}

/// An evicted unit and the objects it took out of the index.
#[derive(Debug)]
struct Victim {
    id: UnitId,
    unit: Unit,
    objects: Vec<(String, ObjectLocation)>,
}

impl EvictionBatch {
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// Bytes the batch frees once finalized.
    pub fn bytes(&self) -> u64 {
        self.units.iter().map(|v| v.unit.files.bytes).sum()
    }
}

/// Counts the tier reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexUsage {
    pub keys: u64,
    pub bytes: u64,
    pub units: u64,
    /// Admitted for writes not yet committed.
    pub reserved_bytes: u64,
    pub reserved_keys: u64,
    /// Evicted or emptied units whose files a reader still holds.
    pub doomed_bytes: u64,
    pub byte_limit: u64,
    pub key_limit: u64,
}

pub struct TierIndex {
    objects: HashMap<String, ObjectLocation>,
    units: BTreeMap<UnitId, Unit>,
    lru: BTreeSet<(u64, UnitId)>,
    policy: EvictionPolicy,
    byte_limit: u64,
    key_limit: u64,
    bytes: u64,
    reserved_bytes: u64,
    reserved_keys: u64,
    doomed_bytes: Arc<AtomicU64>,
}

impl TierIndex {
    pub fn new(policy: EvictionPolicy, byte_limit: u64, key_limit: u64) -> Self {
        TierIndex {
            objects: HashMap::new(),
            units: BTreeMap::new(),
            lru: BTreeSet::new(),
            policy,
            byte_limit,
            key_limit,
            bytes: 0,
            reserved_bytes: 0,
            reserved_keys: 0,
            doomed_bytes: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn usage(&self) -> IndexUsage {
        IndexUsage {
            keys: self.objects.len() as u64,
            bytes: self.bytes,
            units: self.units.len() as u64,
            reserved_bytes: self.reserved_bytes,
            reserved_keys: self.reserved_keys,
            doomed_bytes: self.doomed_bytes.load(Ordering::Acquire),
            byte_limit: self.byte_limit,
            key_limit: self.key_limit,
        }
    }

    pub fn location(&self, key: &str) -> Option<&ObjectLocation> {
        self.objects.get(key)
    }

    pub fn keys(&self) -> impl Iterator<Item = (&String, &ObjectLocation)> {
        self.objects.iter()
    }

    /// Adds a unit that is durable on disk. An object whose key is already
    /// indexed replaces the old copy; a unit left with no live object is
    /// removed and its files doomed.
    pub fn insert(&mut self, unit: NewUnit, now: u64) {
        let files = Arc::new(UnitFiles {
            id: unit.id,
            data: unit.data,
            meta: unit.meta,
            bytes: unit.bytes,
            doomed: AtomicBool::new(false),
            doomed_bytes: self.doomed_bytes.clone(),
        });
        let mut keys = Vec::with_capacity(unit.objects.len());
        for (key, loc) in unit.objects {
            if let Some(old) = self.objects.insert(key.clone(), loc) {
                self.drop_object_from(old.unit);
            }
            keys.push(key);
        }
        let live = keys
            .iter()
            .filter(|k| self.objects.get(*k).is_some_and(|l| l.unit == unit.id))
            .count();
        self.bytes += unit.bytes;
        self.lru.insert((now, unit.id));
        self.units.insert(
            unit.id,
            Unit {
                files,
                keys,
                live,
                last_access: now,
            },
        );
        if live == 0 {
            self.drop_unit(unit.id);
        }
    }

    /// One object of `unit` stopped being live (replaced or removed).
    fn drop_object_from(&mut self, id: UnitId) {
        if let Some(u) = self.units.get_mut(&id) {
            u.live = u.live.saturating_sub(1);
            if u.live == 0 {
                self.drop_unit(id);
            }
        }
    }

    /// Removes an empty unit and dooms its files.
    fn drop_unit(&mut self, id: UnitId) {
        if let Some(u) = self.units.remove(&id) {
            self.lru.remove(&(u.last_access, id));
            self.bytes -= u.files.bytes;
            self.doom(&u.files);
        }
    }

    fn doom(&self, files: &UnitFiles) {
        if !files.doomed.swap(true, Ordering::AcqRel) {
            self.doomed_bytes.fetch_add(files.bytes, Ordering::AcqRel);
        }
    }

    /// Finds an object and the handle that keeps its files for the read;
    /// marks its unit used at `now` (LRU).
    pub fn lookup(&mut self, key: &str, now: u64) -> Option<(ObjectLocation, UnitHandle)> {
        let loc = self.objects.get(key)?.clone();
        let u = self
            .units
            .get_mut(&loc.unit)
            .expect("indexed objects have a unit");
        if now > u.last_access {
            self.lru.remove(&(u.last_access, loc.unit));
            u.last_access = now;
            self.lru.insert((now, loc.unit));
        }
        Some((loc, u.files.clone()))
    }

    /// Forgets objects (the master removed them). Returns how many were here.
    pub fn remove(&mut self, keys: &[String]) -> usize {
        let mut n = 0;
        for k in keys {
            if let Some(old) = self.objects.remove(k) {
                self.drop_object_from(old.unit);
                n += 1;
            }
        }
        n
    }

    fn fits(&self, bytes: u64, keys: u64) -> bool {
        self.bytes + self.reserved_bytes + bytes <= self.byte_limit
            && self.objects.len() as u64 + self.reserved_keys + keys <= self.key_limit
    }

    /// The next victim under the policy.
    fn candidate(&self) -> Option<UnitId> {
        match self.policy {
            EvictionPolicy::None => None,
            EvictionPolicy::Fifo => self.units.keys().next().copied(),
            EvictionPolicy::Lru => self.lru.first().map(|&(_, id)| id),
        }
    }

    /// Phase 1 on one unit: out of the index, into the batch.
    fn take_unit(&mut self, id: UnitId, batch: &mut EvictionBatch) {
        let Some(u) = self.units.remove(&id) else {
            return;
        };
        self.lru.remove(&(u.last_access, id));
        self.bytes -= u.files.bytes;
        let mut objects = Vec::new();
        for k in &u.keys {
            if self.objects.get(k).is_some_and(|l| l.unit == id) {
                let loc = self.objects.remove(k).expect("checked");
                batch.keys.push(k.clone());
                objects.push((k.clone(), loc));
            }
        }
        batch.units.push(Victim {
            id,
            unit: u,
            objects,
        });
    }

    /// Admits a write of `bytes` and `keys` objects: reserves room for it,
    /// evicting under the policy when the limits require. With the `none`
    /// policy, or when even an empty tier could not hold it, the answer is
    /// [`TierError::Full`] and nothing changes. The returned batch (possibly
    /// empty) must be finalized or restored.
    pub fn admit(&mut self, bytes: u64, keys: u64) -> Result<EvictionBatch, TierError> {
        let mut batch = EvictionBatch::default();
        while !self.fits(bytes, keys) {
            match self.candidate() {
                Some(id) => self.take_unit(id, &mut batch),
                None => {
                    let why = format!(
                        "{} bytes / {} keys used of {} / {}, {} more bytes asked",
                        self.bytes + self.reserved_bytes,
                        self.objects.len() as u64 + self.reserved_keys,
                        self.byte_limit,
                        self.key_limit,
                        bytes
                    );
                    self.restore(batch);
                    return Err(TierError::Full(why));
                }
            }
        }
        self.reserved_bytes += bytes;
        self.reserved_keys += keys;
        Ok(batch)
    }

    /// Returns a reservation made by [`TierIndex::admit`] (the write was
    /// committed as a unit, or failed).
    pub fn release(&mut self, bytes: u64, keys: u64) {
        self.reserved_bytes = self.reserved_bytes.saturating_sub(bytes);
        self.reserved_keys = self.reserved_keys.saturating_sub(keys);
    }

    /// Proactive eviction: above `high × limit` bytes, evict down to `low × limit`.
    pub fn evict_above_watermark(&mut self, high: f64, low: f64) -> EvictionBatch {
        let mut batch = EvictionBatch::default();
        let limit = self.byte_limit as f64;
        if self.policy == EvictionPolicy::None || (self.bytes as f64) <= high * limit {
            return batch;
        }
        while (self.bytes as f64) > low * limit {
            match self.candidate() {
                Some(id) => self.take_unit(id, &mut batch),
                None => break,
            }
        }
        batch
    }

    /// Phase 2: dooms the batch's files; each is deleted as soon as no reader
    /// holds it (at once if none does).
    pub fn finalize(&self, batch: EvictionBatch) {
        for v in batch.units {
            self.doom(&v.unit.files);
        }
    }

    /// Undoes phase 1 (the master could not be told). Objects indexed again
    /// meanwhile keep their newer location.
    pub fn restore(&mut self, batch: EvictionBatch) {
        for Victim {
            id,
            unit: mut u,
            objects,
        } in batch.units
        {
            let mut live = 0;
            for (k, loc) in objects {
                if let std::collections::hash_map::Entry::Vacant(e) = self.objects.entry(k) {
                    e.insert(loc);
                    live += 1;
                }
            }
            if live == 0 {
                self.doom(&u.files);
                continue;
            }
            u.live = live;
            self.bytes += u.files.bytes;
            self.lru.insert((u.last_access, id));
            self.units.insert(id, u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(dir: &std::path::Path, id: UnitId, keys: &[&str], bytes: u64) -> NewUnit {
        let data = dir.join(format!("u{id}"));
        std::fs::write(&data, b"x").unwrap();
        NewUnit {
            id,
            data,
            meta: None,
            bytes,
            objects: keys
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    (
                        k.to_string(),
                        ObjectLocation {
                            unit: id,
                            offset: i as u64 * 10,
                            len: 10,
                            crc: 0,
                            tag: id,
                        },
                    )
                })
                .collect(),
        }
    }

    fn evict_order(policy: EvictionPolicy, touches: &[(&str, u64)]) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let mut ix = TierIndex::new(policy, 300, 1000);
        ix.insert(unit(dir.path(), 1, &["a"], 100), 1);
        ix.insert(unit(dir.path(), 2, &["b"], 100), 2);
        ix.insert(unit(dir.path(), 3, &["c"], 100), 3);
        for (k, t) in touches {
            ix.lookup(k, *t).unwrap();
        }
        let mut order = Vec::new();
        for round in 0..3u64 {
            let b = ix.admit(100, 1).unwrap();
            order.extend(b.keys.iter().cloned());
            ix.finalize(b);
            // The write that needed the room lands as a newer unit.
            ix.release(100, 1);
            ix.insert(
                unit(dir.path(), 10 + round, &[&format!("new{round}")], 100),
                50 + round,
            );
        }
        order
    }

    #[test]
    fn fifo_evicts_oldest_first_whatever_was_read() {
        assert_eq!(
            evict_order(EvictionPolicy::Fifo, &[("a", 10)]),
            ["a", "b", "c"]
        );
    }

    #[test]
    fn lru_evicts_least_recently_read_first() {
        assert_eq!(
            evict_order(EvictionPolicy::Lru, &[("a", 10), ("c", 11), ("b", 12)]),
            ["a", "c", "b"]
        );
        assert_eq!(
            evict_order(EvictionPolicy::Lru, &[("a", 10)]),
            ["b", "c", "a"]
        );
    }

    #[test]
    fn none_refuses_instead_of_evicting() {
        let dir = tempfile::tempdir().unwrap();
        let mut ix = TierIndex::new(EvictionPolicy::None, 200, 1000);
        ix.insert(unit(dir.path(), 1, &["a"], 150), 0);
        assert!(matches!(ix.admit(100, 1), Err(TierError::Full(_))));
        assert!(ix.location("a").is_some());
        let b = ix.admit(50, 1).unwrap();
        assert!(b.is_empty());
        ix.finalize(b);
        assert_eq!(ix.usage().reserved_bytes, 50);
        // The key limit holds too.
        let mut ix = TierIndex::new(EvictionPolicy::None, 1 << 30, 1);
        ix.insert(unit(dir.path(), 2, &["b"], 1), 0);
        assert!(matches!(ix.admit(1, 1), Err(TierError::Full(_))));
    }

    #[test]
    fn a_write_too_big_for_the_tier_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut ix = TierIndex::new(EvictionPolicy::Fifo, 200, 1000);
        ix.insert(unit(dir.path(), 1, &["a"], 100), 0);
        assert!(matches!(ix.admit(500, 1), Err(TierError::Full(_))));
        assert!(ix.location("a").is_some());
        assert_eq!(ix.usage().bytes, 100);
    }

    #[test]
    fn a_file_is_deleted_only_after_its_last_reader_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let mut ix = TierIndex::new(EvictionPolicy::Fifo, 100, 1000);
        ix.insert(unit(dir.path(), 1, &["a", "b"], 100), 0);
        let path = dir.path().join("u1");
        let (_, reader) = ix.lookup("a", 1).unwrap();
        let batch = ix.admit(100, 1).unwrap();
        assert_eq!(batch.keys, ["a", "b"]);
        // Phase 1: the index no longer hands the objects out.
        assert!(ix.lookup("a", 2).is_none());
        assert!(path.exists());
        ix.finalize(batch);
        // Phase 2 waits for the reader.
        assert!(path.exists());
        assert_eq!(ix.usage().doomed_bytes, 100);
        drop(reader);
        assert!(!path.exists());
        assert_eq!(ix.usage().doomed_bytes, 0);
    }

    #[test]
    fn restore_undoes_phase_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut ix = TierIndex::new(EvictionPolicy::Fifo, 100, 1000);
        ix.insert(unit(dir.path(), 1, &["a"], 100), 0);
        let batch = ix.admit(100, 1).unwrap();
        ix.release(100, 1);
        assert!(ix.location("a").is_none());
        ix.restore(batch);
        assert!(ix.location("a").is_some());
        assert_eq!(ix.usage().bytes, 100);
        assert!(dir.path().join("u1").exists());
    }

    #[test]
    fn replaced_and_removed_objects_free_their_units() {
        let dir = tempfile::tempdir().unwrap();
        let mut ix = TierIndex::new(EvictionPolicy::Fifo, 1000, 1000);
        ix.insert(unit(dir.path(), 1, &["a", "b"], 100), 0);
        ix.insert(unit(dir.path(), 2, &["a"], 100), 0);
        assert_eq!(ix.location("a").unwrap().unit, 2);
        assert!(dir.path().join("u1").exists(), "b still lives in unit 1");
        assert_eq!(ix.remove(&["b".to_string(), "zz".to_string()]), 1);
        assert!(!dir.path().join("u1").exists());
        assert_eq!(ix.usage().bytes, 100);
        // Duplicates inside one unit: the later entry wins.
        ix.insert(unit(dir.path(), 3, &["d", "d"], 100), 0);
        assert_eq!(ix.location("d").unwrap().offset, 10);
        assert_eq!(ix.usage().keys, 2);
    }

    #[test]
    fn watermark_eviction_goes_down_to_the_low_mark() {
        let dir = tempfile::tempdir().unwrap();
        let mut ix = TierIndex::new(EvictionPolicy::Fifo, 1000, 1000);
        for id in 1..=10 {
            ix.insert(unit(dir.path(), id, &[&format!("k{id}")], 95), id);
        }
        assert!(ix.evict_above_watermark(0.96, 0.5).is_empty());
        let b = ix.evict_above_watermark(0.9, 0.5);
        assert_eq!(b.keys, ["k1", "k2", "k3", "k4", "k5"]);
        ix.finalize(b);
        assert_eq!(ix.usage().bytes, 475);
    }
}
