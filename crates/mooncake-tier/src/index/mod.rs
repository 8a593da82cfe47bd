//! The tier's in-memory index: key → location, the units of files that hold
//! the objects (a bucket, or one file-per-key object), and eviction within a
//! byte and key limit.
//!
//! The unit of eviction is one object. Its bytes go back by punching its
//! blocks out of the bucket file ([`super::io::holes`]); a bucket whose last
//! object goes is deleted. Where the filesystem cannot punch holes, or an
//! object covers no whole block of its own, eviction takes the object's
//! whole unit instead.
//!
//! Eviction runs in two phases so a read in flight never sees its bytes
//! vanish:
//! 1. [`TierIndex::admit`] (or [`TierIndex::evict_bytes`]) takes the
//!    victims out of the index: from then on no lookup hands them out. The
//!    caller tells the master their disk replicas are gone.
//! 2. [`TierIndex::finalize`] frees them: a doomed unit's files are deleted
//!    when the last handle is dropped, a punched object's blocks once no
//!    reader of its unit is left (see [`super::unit_files`]).
//!
//! If telling the master fails, [`TierIndex::restore`] puts the victims back.
//! Times (for LRU) are the caller's ticks; the index never reads a clock.

use super::config::EvictionPolicy;
use super::io::holes::inner_blocks;
pub use super::unit_files::{ReadHandle, UnitFiles, UnitId};
use super::TierError;
use std::collections::{BTreeMap, HashMap};

pub use super::readahead::Span;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a reader holds while it reads from a unit's files.
pub type UnitHandle = ReadHandle;

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

/// A unit to add: its files, its on-disk bytes, its objects in file order.
#[derive(Debug, Clone)]
pub struct NewUnit {
    pub id: UnitId,
    pub data: PathBuf,
    pub meta: Option<PathBuf>,
    pub bytes: u64,
    pub objects: Vec<(String, ObjectLocation)>,
}

/// An object's place in the eviction order: (last use, insertion sequence)
/// under `lru`, (0, insertion sequence) otherwise. The smallest goes first.
type Rank = (u64, u64);

#[derive(Debug, Clone)]
struct Entry {
    loc: ObjectLocation,
    rank: Rank,
}

#[derive(Debug)]
struct Unit {
    files: Arc<UnitFiles>,
    keys: Vec<String>,
    live: usize,
    /// Bytes the unit counts for: its files less what was punched out.
    charged: u64,
    /// Where its last value ends in the data file (readahead reads no further).
    data_end: u64,
}

/// Victims taken out of the index (phase 1), waiting for
/// [`TierIndex::finalize`] or [`TierIndex::restore`].
#[must_use = "finalize or restore the batch"]
#[derive(Debug, Default)]
pub struct EvictionBatch {
    /// The evicted objects' keys: their disk replicas are gone.
    pub keys: Vec<String>,
    units: Vec<Victim>,
    punched: Vec<Punched>,
}

/// An evicted unit and the objects it took out of the index.
#[derive(Debug)]
struct Victim {
    id: UnitId,
    unit: Unit,
    objects: Vec<(String, Entry)>,
}

/// An object evicted from a unit that stays.
#[derive(Debug)]
struct Punched {
    key: String,
    entry: Entry,
    files: Arc<UnitFiles>,
    /// The blocks freed: `(offset, len)`.
    blocks: (u64, u64),
}

impl EvictionBatch {
    pub fn is_empty(&self) -> bool {
        self.units.is_empty() && self.punched.is_empty()
    }

    /// Bytes the batch frees once finalized.
    pub fn bytes(&self) -> u64 {
        self.units.iter().map(|v| v.unit.charged).sum::<u64>()
            + self.punched.iter().map(|p| p.blocks.1).sum::<u64>()
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
    /// Evicted or removed bytes still on disk while a reader holds them.
    pub doomed_bytes: u64,
    pub byte_limit: u64,
    pub key_limit: u64,
}

pub struct TierIndex {
    objects: HashMap<String, Entry>,
    order: BTreeMap<Rank, String>,
    units: BTreeMap<UnitId, Unit>,
    policy: EvictionPolicy,
    /// Objects may be evicted one by one (the filesystem punches holes).
    per_object: bool,
    next_seq: u64,
    byte_limit: u64,
    key_limit: u64,
    bytes: u64,
    reserved_bytes: u64,
    reserved_keys: u64,
    doomed_bytes: Arc<AtomicU64>,
}

impl TierIndex {
    /// `per_object`: the directory's filesystem punches holes
    /// ([`super::io::holes::supports_punch`]); without it eviction takes
    /// whole units.
    pub fn new(policy: EvictionPolicy, byte_limit: u64, key_limit: u64, per_object: bool) -> Self {
        TierIndex {
            objects: HashMap::new(),
            order: BTreeMap::new(),
            units: BTreeMap::new(),
            policy,
            per_object,
            next_seq: 0,
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
        self.objects.get(key).map(|e| &e.loc)
    }

    pub fn keys(&self) -> impl Iterator<Item = (&String, &ObjectLocation)> {
        self.objects.iter().map(|(k, e)| (k, &e.loc))
    }

    fn rank(&mut self, now: u64) -> Rank {
        self.next_seq += 1;
        match self.policy {
            EvictionPolicy::Lru => (now, self.next_seq),
            EvictionPolicy::Fifo | EvictionPolicy::None => (0, self.next_seq),
        }
    }

    /// Adds a unit that is durable on disk. An object whose key is already
    /// indexed replaces the old copy; a unit left with no live object is
    /// removed and its files doomed.
    pub fn insert(&mut self, unit: NewUnit, now: u64) {
        let files = Arc::new(UnitFiles::new(
            unit.id,
            unit.data,
            unit.meta,
            self.doomed_bytes.clone(),
        ));
        self.bytes += unit.bytes;
        let data_end = unit
            .objects
            .iter()
            .map(|(_, l)| l.offset + l.len)
            .max()
            .unwrap_or(0);
        self.units.insert(
            unit.id,
            Unit {
                files,
                keys: Vec::with_capacity(unit.objects.len()),
                live: 0,
                charged: unit.bytes,
                data_end,
            },
        );
        for (key, loc) in unit.objects {
            let rank = self.rank(now);
            self.order.insert(rank, key.clone());
            let u = self.units.get_mut(&unit.id).expect("inserted above");
            u.keys.push(key.clone());
            u.live += 1;
            if let Some(old) = self.objects.insert(key, Entry { loc, rank }) {
                self.order.remove(&old.rank);
                self.drop_object(old.loc);
            }
        }
        if self.units.get(&unit.id).is_some_and(|u| u.live == 0) {
            self.drop_unit(unit.id);
        }
    }

    /// Under `lru`, places `key` as last used at `at` (earlier or later
    /// than now): a copy of an object that was idle in memory before it
    /// came here ranks by that idle time, not by when it was written.
    pub fn set_last_use(&mut self, key: &str, at: u64) {
        if self.policy != EvictionPolicy::Lru {
            return;
        }
        if let Some(e) = self.objects.get_mut(key) {
            let key = self.order.remove(&e.rank).expect("ranked");
            e.rank.0 = at;
            self.order.insert(e.rank, key);
        }
    }

    /// An object at `loc` stopped being live (replaced or removed): its
    /// blocks are punched out, or its unit goes with its last object.
    fn drop_object(&mut self, loc: ObjectLocation) {
        let Some(u) = self.units.get_mut(&loc.unit) else {
            return;
        };
        u.live = u.live.saturating_sub(1);
        if u.live == 0 {
            self.drop_unit(loc.unit);
            return;
        }
        if self.per_object {
            let (start, len) = inner_blocks(loc.offset, loc.len);
            u.charged -= len;
            self.bytes -= len;
            u.files.punch_later(start, len);
        }
    }

    /// Removes an empty unit and dooms its files.
    fn drop_unit(&mut self, id: UnitId) {
        if let Some(u) = self.units.remove(&id) {
            self.bytes -= u.charged;
            u.files.doom(u.charged);
        }
    }

    /// Finds an object and the handle that keeps its bytes for the read;
    /// marks it used at `now` (LRU).
    pub fn lookup(&mut self, key: &str, now: u64) -> Option<(ObjectLocation, UnitHandle)> {
        let e = self.objects.get_mut(key)?;
        if self.policy == EvictionPolicy::Lru && now > e.rank.0 {
            let k = self.order.remove(&e.rank).expect("ranked");
            e.rank.0 = now;
            self.order.insert(e.rank, k);
        }
        let u = self
            .units
            .get(&e.loc.unit)
            .expect("indexed objects have a unit");
        Some((e.loc.clone(), u.files.reader()))
    }

    /// `unit` and the units written after it, in write order, as far as
    /// `ahead` bytes past `unit`'s end (for readahead; empty when `unit`
    /// left the index).
    pub fn route(&self, unit: UnitId, ahead: u64) -> Vec<Span> {
        let mut out = Vec::new();
        let mut covered = 0u64;
        for (&id, u) in self.units.range(unit..) {
            if id != unit && (out.is_empty() || covered >= ahead) {
                break;
            }
            if id != unit {
                covered += u.data_end;
            }
            out.push(Span {
                unit: id,
                data: u.files.data.clone(),
                end: u.data_end,
            });
        }
        out
    }

    /// Forgets objects (the master removed them). Returns how many were here.
    pub fn remove(&mut self, keys: &[String]) -> usize {
        let mut n = 0;
        for k in keys {
            if let Some(old) = self.objects.remove(k) {
                self.order.remove(&old.rank);
                self.drop_object(old.loc);
                n += 1;
            }
        }
        n
    }

    fn fits(&self, bytes: u64, keys: u64) -> bool {
        self.bytes + self.reserved_bytes + bytes <= self.byte_limit
            && self.objects.len() as u64 + self.reserved_keys + keys <= self.key_limit
    }

    /// Phase 1 on the next victim under the policy; false when there is none.
    fn take_next(&mut self, batch: &mut EvictionBatch) -> bool {
        if self.policy == EvictionPolicy::None {
            return false;
        }
        let Some((_, key)) = self.order.first_key_value() else {
            return false;
        };
        let key = key.clone();
        let loc = &self.objects[&key].loc;
        let (unit, blocks) = (loc.unit, inner_blocks(loc.offset, loc.len));
        if self.units[&unit].live == 1 || !self.per_object || blocks.1 == 0 {
            self.take_unit(unit, batch);
            return true;
        }
        let e = self
            .objects
            .remove(&key)
            .expect("ranked objects are indexed");
        self.order.remove(&e.rank);
        let u = self.units.get_mut(&e.loc.unit).expect("checked");
        u.live -= 1;
        u.charged -= blocks.1;
        self.bytes -= blocks.1;
        batch.keys.push(key.clone());
        batch.punched.push(Punched {
            key,
            entry: e,
            files: u.files.clone(),
            blocks,
        });
        true
    }

    /// Phase 1 on one unit: out of the index, into the batch.
    fn take_unit(&mut self, id: UnitId, batch: &mut EvictionBatch) {
        let Some(u) = self.units.remove(&id) else {
            return;
        };
        self.bytes -= u.charged;
        let mut objects = Vec::new();
        for k in &u.keys {
            if self.objects.get(k).is_some_and(|e| e.loc.unit == id) {
                let e = self.objects.remove(k).expect("checked");
                self.order.remove(&e.rank);
                batch.keys.push(k.clone());
                objects.push((k.clone(), e));
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
            if !self.take_next(&mut batch) {
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

    /// Proactive eviction: takes objects in policy order until at least
    /// `bytes` of the tier's are freed (or none is left). Nothing under the
    /// `none` policy.
    pub fn evict_bytes(&mut self, bytes: u64) -> EvictionBatch {
        let mut batch = EvictionBatch::default();
        if self.policy == EvictionPolicy::None {
            return batch;
        }
        let goal = self.bytes.saturating_sub(bytes);
        while self.bytes > goal && self.take_next(&mut batch) {}
        batch
    }

    /// Phase 2: frees the batch's bytes, each as soon as no reader holds
    /// them (at once if none does).
    pub fn finalize(&self, batch: EvictionBatch) {
        for v in batch.units {
            v.unit.files.doom(v.unit.charged);
        }
        for p in batch.punched {
            p.files.punch_later(p.blocks.0, p.blocks.1);
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
            for (k, e) in objects {
                if let std::collections::hash_map::Entry::Vacant(v) = self.objects.entry(k) {
                    self.order.insert(e.rank, v.key().clone());
                    v.insert(e);
                    live += 1;
                }
            }
            if live == 0 {
                u.files.doom(u.charged);
                continue;
            }
            u.live = live;
            self.bytes += u.charged;
            self.units.insert(id, u);
        }
        for p in batch.punched {
            let (start, len) = p.blocks;
            let home = self.units.get_mut(&p.entry.loc.unit);
            match home {
                Some(u) if !self.objects.contains_key(&p.key) => {
                    u.live += 1;
                    u.charged += len;
                    self.bytes += len;
                    self.order.insert(p.entry.rank, p.key.clone());
                    self.objects.insert(p.key, p.entry);
                }
                // Replaced meanwhile: its old blocks are free after all.
                Some(_) => p.files.punch_later(start, len),
                // Its unit went meanwhile, files and all.
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;
