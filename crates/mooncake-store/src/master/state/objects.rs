//! The object map: key → compact metadata, split into independently locked
//! shards so calls on different keys rarely meet on a lock.
//!
//! Per object the master keeps the key (inline up to 22 bytes), its size,
//! two timestamps, the replica placements (inline for a single replica) and
//! a pointer that is null unless a put is in flight: an 88-byte record in a
//! chunked table plus a 4-byte slot in the hash index (`table`).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard, RwLockReadGuard};

use super::segments::{Placement, Segment};
use crate::types::{ClientId, ReplicaDesc, ReplicaStatus};

mod cut;
mod table;
mod tally;
mod walk;

use cut::Cuts;
pub(crate) use cut::Round;
use table::Table;
pub(crate) use tally::Counts;
use tally::{Standing, Tally};

/// Number of shards; a power of two.
pub(crate) const SHARDS: usize = 64;

/// Object flags.
pub(crate) mod flags {
    /// PutEnd happened: readable.
    pub(crate) const COMPLETE: u8 = 1;
    /// Never evicted.
    pub(crate) const HARD_PIN: u8 = 2;
    /// Evicted only after everything else, while accessed within the soft-pin TTL.
    pub(crate) const SOFT_PIN: u8 = 4;
    /// A durable copy is in an SSD tier (`ssd_tier`): memory may let it go.
    pub(crate) const ON_DISK: u8 = 8;
}

/// Where an object's replicas are; one replica is stored inline.
#[derive(Debug, Clone)]
pub(crate) enum Replicas {
    One(Placement),
    Many(Box<[Placement]>),
}

impl Replicas {
    pub(crate) fn from_vec(mut v: Vec<Placement>) -> Self {
        if v.len() == 1 {
            Replicas::One(v.pop().expect("one element"))
        } else {
            Replicas::Many(v.into_boxed_slice())
        }
    }

    pub(crate) fn as_slice(&self) -> &[Placement] {
        match self {
            Replicas::One(p) => std::slice::from_ref(p),
            Replicas::Many(ps) => ps,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// Keeps the replicas `keep` accepts and hands the others to `drop_one`.
    pub(crate) fn retain(
        &mut self,
        mut keep: impl FnMut(&Placement) -> bool,
        mut drop_one: impl FnMut(Placement),
    ) {
        if self.as_slice().iter().all(&mut keep) {
            return;
        }
        let old = std::mem::replace(self, Replicas::Many(Box::new([])));
        let all: Vec<Placement> = match old {
            Replicas::One(p) => vec![p],
            Replicas::Many(ps) => ps.into_vec(),
        };
        let mut kept = Vec::with_capacity(all.len());
        for p in all {
            if keep(&p) {
                kept.push(p);
            } else {
                drop_one(p);
            }
        }
        *self = Replicas::from_vec(kept);
    }

    pub(crate) fn descriptors(&self, size: u64, status: ReplicaStatus) -> Vec<ReplicaDesc> {
        self.as_slice()
            .iter()
            .map(|p| p.segment.descriptor(p.offset, size, status))
            .collect()
    }

    pub(crate) fn on_segment(&self, seg: &Arc<Segment>) -> bool {
        self.as_slice().iter().any(|p| Arc::ptr_eq(&p.segment, seg))
    }

    /// Gives every replica's range back to its segment now.
    pub(crate) fn free_all(&self, size: u64) {
        for p in self.as_slice() {
            p.segment.free(p.offset, size);
        }
    }
}

/// A put that has started but not ended.
#[derive(Debug, Clone)]
pub(crate) struct PendingPut {
    pub(crate) client: ClientId,
    /// When PutStart ran (ms).
    pub(crate) started: u64,
    pub(crate) kind: PendingKind,
}

#[derive(Debug, Clone)]
pub(crate) enum PendingKind {
    /// A new object; its replicas are being written and it is not readable.
    Fresh,
    /// An upsert rewriting the object's own replicas; not readable meanwhile.
    InPlace,
    /// An upsert writing new replicas; the old ones stay readable until PutEnd.
    Replacing {
        replicas: Replicas,
        size: u64,
        flags: u8,
    },
    /// A copy or move task writing extra replicas of a readable object; a
    /// move then drops the replica on `drop_source`.
    Replicating {
        replicas: Replicas,
        drop_source: Option<Box<str>>,
    },
}

/// Metadata of one object.
#[derive(Debug, Clone)]
pub(crate) struct ObjectMeta {
    pub(crate) size: u64,
    /// Readers hold a lease until this time (ms); also the LRU clock for eviction.
    pub(crate) lease_until: u64,
    /// A soft pin protects the object until this time (ms), refreshed on access.
    pub(crate) soft_pin_until: u64,
    pub(crate) replicas: Replicas,
    pub(crate) pending: Option<Box<PendingPut>>,
    pub(crate) flags: u8,
    /// When the object was last read or written, counted in uses (see
    /// `leases`, wrapping): orders objects whose `lease_until` ties.
    /// Volatile, like the lease; it fits in what would be padding.
    pub(crate) used: u32,
    /// Reads since the put, up to `frequency::MAX_READS`: the eviction
    /// order weighs them. Volatile; it fits in what would be padding.
    pub(crate) reads: u8,
}

impl ObjectMeta {
    /// The empty entry a new put fills in (see `Write::Fresh`).
    pub(crate) fn absent() -> Self {
        ObjectMeta {
            size: 0,
            lease_until: 0,
            soft_pin_until: 0,
            replicas: Replicas::Many(Box::new([])),
            pending: None,
            flags: 0,
            used: 0,
            reads: 0,
        }
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.flags & flags::COMPLETE != 0
    }

    pub(crate) fn is_hard_pinned(&self) -> bool {
        self.flags & flags::HARD_PIN != 0
    }

    pub(crate) fn is_on_disk(&self) -> bool {
        self.flags & flags::ON_DISK != 0
    }

    pub(crate) fn has_soft_pin(&self) -> bool {
        self.flags & flags::SOFT_PIN != 0
    }
}

/// One shard's contents. Objects change only through `get_mut` and the
/// `ObjectMap` calls that take a shard, which keep its tally.
pub(crate) struct Shard {
    map: Table,
    tally: Tally,
    /// Bytes charged to each tenant, when the master has tenants.
    charges: Option<Arc<Charges>>,
    /// A lower bound on the start time of puts in flight here (`u64::MAX` =
    /// none): the timeout sweep skips shards whose oldest put is still young.
    pub(crate) oldest_pending: u64,
    /// The latest `now` any call on this shard has used. Callers stamp `now`
    /// before taking the lock, so two calls on one object can arrive out of
    /// clock order; `clock` makes time monotonic in lock order.
    pub(crate) latest: u64,
    cuts: Arc<Cuts>,
    /// The latest cut this shard's table has joined (`Cuts::join`).
    walked_at: u64,
}

/// A shard's parts, opened for a write (`Shard::open`).
struct Open<'a> {
    map: &'a mut Table,
    tally: &'a mut Tally,
    charges: Option<&'a Charges>,
    oldest_pending: &'a mut u64,
    gate: RwLockReadGuard<'a, ()>,
}

impl Shard {
    /// Opens a write: holds the cut gate (read) until the parts drop, so
    /// the next cut waits for the write and the mutation it logs, and
    /// makes the table join a cut it has not yet joined first.
    fn open(&mut self) -> Open<'_> {
        let Shard {
            map,
            tally,
            charges,
            oldest_pending,
            cuts,
            walked_at,
            ..
        } = self;
        let cuts: &Cuts = cuts;
        // Recursive: a call writing under one guard (an update logging its
        // mutation) never waits for a cut that waits for that guard.
        let gate = cuts.gate.read_recursive();
        cuts.join(map, walked_at);
        Open {
            map,
            tally,
            charges: charges.as_deref(),
            oldest_pending,
            gate,
        }
    }

    /// `now`, raised to the latest time already used in this shard, so a call
    /// never runs "before" one that held the lock earlier: e.g. a remove
    /// stamped at t that locks after a read (or PutEnd) stamped at t+1 must
    /// not see that read's `lease_until = t+1` as a lease with a zero TTL.
    pub(crate) fn clock(&mut self, now: u64) -> u64 {
        self.latest = self.latest.max(now);
        self.latest
    }

    /// Notes that a put started at `now` is in flight in this shard.
    pub(crate) fn note_pending(&mut self, now: u64) {
        self.oldest_pending = self.oldest_pending.min(now);
    }

    pub(crate) fn get(&self, key: &str) -> Option<&ObjectMeta> {
        self.map.get(key)
    }

    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &ObjectMeta)> {
        self.map.iter()
    }

    #[cfg(test)]
    pub(crate) fn values(&self) -> impl Iterator<Item = &ObjectMeta> {
        self.map.values()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// `key`'s object, to change in place; the tally follows the change
    /// when the guard drops.
    pub(crate) fn get_mut<'a>(&'a mut self, key: &'a str) -> Option<ObjectMut<'a>> {
        let Open {
            map,
            tally,
            charges,
            gate,
            ..
        } = self.open();
        let obj = map.get_mut(key)?;
        Some(ObjectMut {
            before: Standing::of(obj),
            charged: charge_of(obj),
            obj,
            tally,
            charges: charges.map(|c| (c, key)),
            _gate: gate,
        })
    }

    /// Raises every object's read lease to `until` (leases are not counted).
    pub(crate) fn raise_leases(&mut self, until: u64) {
        let Open {
            map, gate: _gate, ..
        } = self.open();
        for obj in map.values_mut() {
            obj.lease_until = obj.lease_until.max(until);
        }
    }

    /// This shard's counts at `now`.
    pub(crate) fn counts(&mut self, now: u64) -> Counts {
        self.tally.counts(now)
    }
}

/// An object borrowed for change from its shard (see `Shard::get_mut`).
pub(crate) struct ObjectMut<'a> {
    obj: &'a mut ObjectMeta,
    tally: &'a mut Tally,
    before: Standing,
    charged: u64,
    charges: Option<(&'a Charges, &'a str)>,
    _gate: RwLockReadGuard<'a, ()>,
}

impl std::ops::Deref for ObjectMut<'_> {
    type Target = ObjectMeta;

    fn deref(&self) -> &ObjectMeta {
        self.obj
    }
}

impl std::ops::DerefMut for ObjectMut<'_> {
    fn deref_mut(&mut self) -> &mut ObjectMeta {
        self.obj
    }
}

impl Drop for ObjectMut<'_> {
    fn drop(&mut self) {
        let after = Standing::of(self.obj);
        self.tally.moved(Some(self.before), Some(after));
        if let Some((c, key)) = self.charges {
            c.moved(key, self.charged, charge_of(self.obj));
        }
    }
}

#[repr(align(128))]
struct PaddedShard(Mutex<Shard>);

/// What one object costs the master besides its key's bytes: its entry
/// (key box, metadata, replica list) and hash-table slack, rounded up.
pub(crate) const OBJECT_OVERHEAD: u64 = 256;

/// What an object under `key` is charged against the metadata budget.
pub(crate) fn metadata_cost(key: &str) -> u64 {
    key.len() as u64 + OBJECT_OVERHEAD
}

/// What an object charges its tenant: its memory replicas, written or
/// being written, each the object's size (a new version's, of an upsert
/// writing beside the old one, too).
pub(crate) fn charge_of(obj: &ObjectMeta) -> u64 {
    let mut n = obj.replicas.len() as u64 * obj.size;
    if let Some(p) = &obj.pending {
        match &p.kind {
            PendingKind::Replacing { replicas, size, .. } => n += replicas.len() as u64 * size,
            PendingKind::Replicating { replicas, .. } => n += replicas.len() as u64 * obj.size,
            PendingKind::Fresh | PendingKind::InPlace => {}
        }
    }
    n
}

/// Bytes charged to each tenant (`crate::tenant`), kept as objects change.
#[derive(Debug, Default)]
pub(crate) struct Charges(Mutex<HashMap<String, u64>>);

impl Charges {
    /// The object under `key` went from charging `before` to `after`.
    fn moved(&self, key: &str, before: u64, after: u64) {
        if before == after {
            return;
        }
        let tenant = crate::tenant::tenant_of(key);
        let mut m = self.0.lock();
        let n = m.entry(tenant.to_string()).or_default();
        *n = (*n + after).saturating_sub(before);
        if *n == 0 {
            m.remove(tenant);
        }
    }

    fn clear(&self) {
        self.0.lock().clear();
    }

    /// The bytes `tenant` is charged.
    pub(crate) fn of(&self, tenant: &str) -> u64 {
        self.0.lock().get(tenant).copied().unwrap_or(0)
    }

    /// Every tenant charged something.
    pub(crate) fn all(&self) -> HashMap<String, u64> {
        self.0.lock().clone()
    }
}

/// The sharded object map.
pub(crate) struct ObjectMap {
    shards: Box<[PaddedShard]>,
    hasher: RandomState,
    /// Bytes of metadata held (see [`metadata_cost`]), and the most
    /// allowed (`--max_metadata_bytes`).
    metadata_used: AtomicU64,
    metadata_limit: AtomicU64,
    /// Metadata bytes from which the timer evicts (`u64::MAX`: never).
    metadata_watermark: AtomicU64,
    /// Object groups: a key leaves its group when it leaves the map.
    pub(crate) groups: super::groups::Groups,
    cuts: Arc<Cuts>,
}

impl Default for ObjectMap {
    fn default() -> Self {
        let cuts = Arc::new(Cuts::default());
        let shards = (0..SHARDS)
            .map(|_| {
                PaddedShard(Mutex::new(Shard {
                    map: Table::default(),
                    tally: Tally::default(),
                    charges: None,
                    oldest_pending: u64::MAX,
                    latest: 0,
                    cuts: cuts.clone(),
                    walked_at: 0,
                }))
            })
            .collect();
        ObjectMap {
            shards,
            hasher: RandomState::new(),
            metadata_used: AtomicU64::new(0),
            metadata_limit: AtomicU64::new(u64::MAX),
            metadata_watermark: AtomicU64::new(u64::MAX),
            groups: Default::default(),
            cuts,
        }
    }
}

impl ObjectMap {
    /// Forgets every object (a standby about to load its leader's
    /// snapshot over what it held).
    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            let mut s = shard.0.lock();
            s.map = Table::default();
            s.tally = Tally::default();
            if let Some(c) = &s.charges {
                c.clear();
            }
            s.oldest_pending = u64::MAX;
        }
        self.metadata_used.store(0, Ordering::Relaxed);
        self.groups.clear();
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) & (SHARDS - 1)
    }

    /// Locks the shard holding `key`.
    pub(crate) fn lock(&self, key: &str) -> MutexGuard<'_, Shard> {
        self.shards[self.shard_of(key)].0.lock()
    }

    /// Locks shard `i`.
    #[cfg(test)]
    pub(crate) fn lock_shard(&self, i: usize) -> MutexGuard<'_, Shard> {
        self.shards[i].0.lock()
    }

    /// Counts the bytes each tenant is charged from now on (set before
    /// any object exists).
    pub(crate) fn count_charges(&self) -> Arc<Charges> {
        let charges = Arc::new(Charges::default());
        for shard in self.shards.iter() {
            shard.0.lock().charges = Some(charges.clone());
        }
        charges
    }

    pub(crate) fn set_metadata_limit(&self, bytes: u64) {
        self.metadata_limit.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn metadata_limit(&self) -> u64 {
        self.metadata_limit.load(Ordering::Relaxed)
    }

    pub(crate) fn set_metadata_watermark(&self, bytes: u64) {
        self.metadata_watermark.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn metadata_watermark(&self) -> u64 {
        self.metadata_watermark.load(Ordering::Relaxed)
    }

    /// Bytes of metadata held.
    pub(crate) fn metadata_bytes(&self) -> u64 {
        self.metadata_used.load(Ordering::Relaxed)
    }

    /// Whether a new object under `key` fits the budget (checked before a
    /// put creates it; replayed and restored objects are never refused).
    pub(crate) fn admits(&self, key: &str) -> bool {
        let limit = self.metadata_limit.load(Ordering::Relaxed);
        self.metadata_bytes().saturating_add(metadata_cost(key)) <= limit
    }

    /// An object under `key` entered a shard.
    fn charge(&self, key: &str) {
        self.metadata_used
            .fetch_add(metadata_cost(key), Ordering::Relaxed);
    }

    /// The object under `key` left its shard.
    fn release(&self, key: &str) {
        self.metadata_used
            .fetch_sub(metadata_cost(key), Ordering::Relaxed);
    }

    /// Runs `change` on `key`'s object in its locked `shard` (a new, empty
    /// one when `create` and the key is absent), and removes it when
    /// `change` returns false. Panics when the object is absent and not
    /// to be created: callers decide on objects they hold the lock of.
    pub(crate) fn update(
        &self,
        shard: &mut Shard,
        key: &str,
        create: bool,
        change: impl FnOnce(&mut ObjectMeta) -> bool,
    ) {
        let Open {
            map,
            tally,
            charges,
            gate: _gate,
            ..
        } = shard.open();
        let (obj, before) = if create {
            let (obj, made) = map.get_or_insert_with(key, ObjectMeta::absent);
            if made {
                self.charge(key);
                (obj, None)
            } else {
                let before = Standing::of(obj);
                (obj, Some(before))
            }
        } else {
            let obj = map.get_mut(key).expect("decided on a present object");
            let before = Standing::of(obj);
            (obj, Some(before))
        };
        let charged = charge_of(obj);
        if change(obj) {
            tally.moved(before, Some(Standing::of(obj)));
            if let Some(c) = charges {
                c.moved(key, charged, charge_of(obj));
            }
        } else {
            tally.moved(before, None);
            if let Some(c) = charges {
                c.moved(key, charged, 0);
            }
            map.remove(key);
            self.release(key);
            self.groups.forget(key);
        }
    }

    /// `shard.map.retain(keep)`, releasing what leaves.
    pub(crate) fn retain(
        &self,
        shard: &mut Shard,
        mut keep: impl FnMut(&str, &mut ObjectMeta) -> bool,
    ) {
        let Open {
            map,
            tally,
            charges,
            gate: _gate,
            ..
        } = shard.open();
        map.retain(|key, obj| {
            let before = Standing::of(obj);
            let charged = charge_of(obj);
            let kept = keep(key, obj);
            if kept {
                tally.moved(Some(before), Some(Standing::of(obj)));
            } else {
                tally.moved(Some(before), None);
                self.release(key);
                self.groups.forget(key);
            }
            if let Some(c) = charges {
                c.moved(key, charged, if kept { charge_of(obj) } else { 0 });
            }
            kept
        });
    }

    /// The shard `key` lives in (a restore groups its objects by it).
    pub(crate) fn shard_index(&self, key: &str) -> usize {
        self.shard_of(key)
    }

    /// Adds objects read from a snapshot, all of shard `i`
    /// ([`shard_index`](Self::shard_index)), under one lock; `now` is the
    /// image's clock. Stops at the first key already present and returns
    /// its position in `objects`, the objects before it added.
    pub(crate) fn restore_shard<'a>(
        &self,
        i: usize,
        now: u64,
        objects: impl IntoIterator<Item = (&'a str, ObjectMeta)>,
    ) -> Result<(), usize> {
        let mut guard = self.shards[i].0.lock();
        guard.clock(now);
        // Held for the batch: a snapshot cut sees all of it or none.
        let Open {
            map,
            tally,
            charges,
            oldest_pending,
            gate,
        } = guard.open();
        let mut cost = 0;
        let mut result = Ok(());
        for (n, (key, obj)) in objects.into_iter().enumerate() {
            debug_assert_eq!(self.shard_of(key), i);
            if let Some(p) = &obj.pending {
                *oldest_pending = (*oldest_pending).min(p.started);
            }
            let (standing, charged) = (Standing::of(&obj), charge_of(&obj));
            if !map.insert_if_absent(key, obj) {
                result = Err(n);
                break;
            }
            tally.moved(None, Some(standing));
            if let Some(c) = charges {
                c.moved(key, 0, charged);
            }
            cost += metadata_cost(key);
        }
        drop(gate);
        self.metadata_used.fetch_add(cost, Ordering::Relaxed);
        result
    }

    /// The counts by walking every object: what `counts` must agree with.
    #[cfg(test)]
    pub(crate) fn scan_counts(&self, now: u64) -> Counts {
        let mut total = Counts::default();
        for shard in self.shards() {
            total.add(Counts::scan(shard.values(), now));
        }
        total
    }

    /// Makes room for `n` more objects spread over the shards (a restore).
    pub(crate) fn reserve(&self, n: u64) {
        let per = usize::try_from(n / SHARDS as u64).unwrap_or(usize::MAX);
        for mut shard in self.shards() {
            // Hashing spreads keys within a few per cent of the mean.
            shard.map.reserve(per.saturating_add(per / 16));
        }
    }

    /// Objects by standing at `now`: a short lock of each shard in turn.
    pub(crate) fn counts(&self, now: u64) -> Counts {
        let mut total = Counts::default();
        for mut shard in self.shards() {
            total.add(shard.counts(now));
        }
        total
    }

    /// Every shard in turn, each locked while the caller holds it.
    pub(crate) fn shards(&self) -> impl Iterator<Item = MutexGuard<'_, Shard>> {
        self.shards.iter().map(|s| s.0.lock())
    }

    /// Keeps cuts out while a mutation that is not a table write (of the
    /// segments, clients, tasks, tiers, reserved space) is logged and
    /// applied. Never blocks a caller that holds it already.
    pub(crate) fn hold_cut(&self) -> RwLockReadGuard<'_, ()> {
        self.cuts.gate.read_recursive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_stays_compact() {
        // The per-object budget (see the module docs) depends on these.
        assert_eq!(std::mem::size_of::<Placement>(), 16);
        assert!(std::mem::size_of::<Replicas>() <= 24);
        assert!(
            std::mem::size_of::<ObjectMeta>() <= 64,
            "{}",
            std::mem::size_of::<ObjectMeta>()
        );
    }
}
