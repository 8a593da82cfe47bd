//! Mounted segments, each with its own allocator lock, and replica placement.
//!
//! The table changes only on mount/unmount, which publish a new snapshot;
//! allocation reads the current snapshot without a lock and then takes the
//! one segment's allocator lock, so puts to different segments never contend.

pub(crate) mod local_first;
pub(crate) mod ramp;
pub(crate) mod space;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Mutex, MutexGuard};
use rand::Rng;

use self::space::Space;
use super::allocator::BadFree;
use crate::master::config::policy::AllocationStrategy;
use crate::types::{
    ClientId, MemoryDescriptor, ReplicaDesc, ReplicaKind, ReplicaPolicy, ReplicaStatus, SegmentInfo,
};

pub(crate) type SegmentId = u32;

/// How many segments the random strategy tries before giving up on a replica.
const MAX_PLACEMENT_ATTEMPTS: usize = 100;
/// Candidates sampled per missing replica by `free_ratio_first`.
const FREE_RATIO_SAMPLES_PER_REPLICA: usize = 6;

/// A mounted segment.
#[derive(Debug)]
pub(crate) struct Segment {
    /// Unique for the master's lifetime (names can be mounted again later);
    /// a logged placement names its segment by id.
    pub(crate) id: SegmentId,
    pub(crate) info: SegmentInfo,
    pub(crate) owner: ClientId,
    /// Its allocator, with the space reserved ahead of puts (`space`).
    pub(in crate::master) space: Mutex<Space>,
    used: AtomicU64,
    /// False once unmounted: its space is gone, allocations fail and frees
    /// are no-ops. Changed only under the allocator lock.
    mounted: AtomicBool,
    /// [`SegmentStatus`] as a number: only `Ok` takes new allocations.
    status: AtomicU8,
    /// False for a restored segment until its owner is heard from again:
    /// its replicas are not served meanwhile (the owner may be gone, and
    /// another process may hold that memory now).
    verified: AtomicBool,
    /// Its owner is Suspected (`clients::health`): reads prefer other
    /// replicas. Set by the leader's timer, cleared by a heartbeat.
    suspected: AtomicBool,
    /// When it was mounted (master clock, ms) for the placement ramp
    /// (`ramp`); `ramp::NOT_RAMPING` for one restored or replayed.
    mounted_at: AtomicU64,
}

/// Where a segment is in a drain, with the reference's numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum SegmentStatus {
    Ok = 1,
    /// Readable; takes no new replicas while a drain job moves its objects.
    Draining = 2,
    /// Drained: empty of objects, awaiting unmount; takes no new replicas.
    Drained = 3,
}

impl SegmentStatus {
    pub(crate) fn name(self) -> &'static str {
        match self {
            SegmentStatus::Ok => "OK",
            SegmentStatus::Draining => "DRAINING",
            SegmentStatus::Drained => "DRAINED",
        }
    }

    fn from_u8(v: u8) -> SegmentStatus {
        match v {
            2 => SegmentStatus::Draining,
            3 => SegmentStatus::Drained,
            _ => SegmentStatus::Ok,
        }
    }
}

impl Segment {
    fn new(id: SegmentId, info: SegmentInfo, owner: ClientId) -> Self {
        let space = Space::new(info.size);
        Segment {
            id,
            info,
            owner,
            space: Mutex::new(space),
            used: AtomicU64::new(0),
            mounted: AtomicBool::new(true),
            status: AtomicU8::new(SegmentStatus::Ok as u8),
            verified: AtomicBool::new(true),
            suspected: AtomicBool::new(false),
            mounted_at: AtomicU64::new(ramp::NOT_RAMPING),
        }
    }

    /// Starts its placement ramp (a mount the leader accepted at `now`).
    pub(crate) fn start_ramp(&self, now: u64) {
        self.mounted_at.store(now, Ordering::Relaxed);
    }

    pub(crate) fn status(&self) -> SegmentStatus {
        SegmentStatus::from_u8(self.status.load(Ordering::Acquire))
    }

    /// Set by drain jobs on the leader; a segment mounted again starts `Ok`.
    pub(crate) fn set_status(&self, status: SegmentStatus) {
        self.status.store(status as u8, Ordering::Release);
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.info.size & !(super::allocator::ALIGNMENT - 1)
    }

    /// Bytes allocated (read without the allocator lock).
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub(crate) fn free_ratio(&self) -> f64 {
        let cap = self.capacity();
        if cap == 0 {
            return 0.0;
        }
        cap.saturating_sub(self.used()) as f64 / cap as f64
    }

    pub(crate) fn is_mounted(&self) -> bool {
        self.mounted.load(Ordering::Acquire)
    }

    /// Whether its replicas may be served (see `verified`).
    pub(crate) fn is_verified(&self) -> bool {
        self.verified.load(Ordering::Acquire)
    }

    /// Whether its owner is Suspected (see `suspected`).
    pub(crate) fn is_suspected(&self) -> bool {
        self.suspected.load(Ordering::Acquire)
    }

    /// Allocates `size` bytes here; `None` when full, unmounted or being
    /// drained.
    pub(crate) fn allocate(&self, size: u64) -> Option<u64> {
        let mut space = self.space.lock();
        if !self.takes_new() {
            return None;
        }
        let off = space.allocate(size)?;
        self.note_used(&space);
        Some(off)
    }

    /// Mounted and not being drained: takes new replicas.
    pub(in crate::master) fn takes_new(&self) -> bool {
        self.is_mounted() && self.status() == SegmentStatus::Ok
    }

    pub(in crate::master) fn note_used(&self, space: &Space) {
        self.used.store(space.used(), Ordering::Relaxed);
    }

    /// Allocates exactly `[offset, offset + size)`, as a log or snapshot
    /// says; false when that range is not free here (or unmounted).
    pub(crate) fn reserve(&self, offset: u64, size: u64) -> bool {
        let mut space = self.space.lock();
        if !self.is_mounted() || space.reserve(offset, size).is_err() {
            return false;
        }
        self.note_used(&space);
        true
    }

    /// Gives a replica's range back; a no-op on an unmounted segment.
    pub(crate) fn free(&self, offset: u64, size: u64) {
        let mut space = self.space.lock();
        if !self.is_mounted() {
            return;
        }
        if let Err(BadFree { offset, len }) = space.free(offset, size) {
            tracing::error!(segment = %self.info.name, offset, len, "refused a free that was never allocated");
        }
        self.note_used(&space);
    }

    fn unmount(&self) {
        let mut space = self.space.lock();
        self.mounted.store(false, Ordering::Release);
        *space = Space::new(0);
        self.used.store(0, Ordering::Relaxed);
    }

    /// Describes the replica at `offset` for a client.
    pub(crate) fn descriptor(&self, offset: u64, size: u64, status: ReplicaStatus) -> ReplicaDesc {
        ReplicaDesc {
            kind: ReplicaKind::Memory(MemoryDescriptor {
                segment_name: self.info.name.clone(),
                transport_endpoint: self.info.transport_endpoint.clone(),
                buffer_address: self.info.base + offset,
                size,
                suspected: self.is_suspected(),
            }),
            status,
        }
    }
}

/// A replica's place: a segment and an offset in it.
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    pub(crate) segment: Arc<Segment>,
    pub(crate) offset: u64,
}

#[derive(Default, Clone)]
struct Table {
    by_name: HashMap<String, Arc<Segment>>,
    by_id: HashMap<SegmentId, Arc<Segment>>,
    /// The same segments, in a vector for random picks.
    list: Vec<Arc<Segment>>,
    next_id: SegmentId,
}

/// All mounted segments. Readers (every allocation) load an immutable
/// snapshot without locking; mount and unmount publish a new one.
#[derive(Default)]
pub(crate) struct SegmentTable {
    table: ArcSwap<Table>,
    /// Serialises writers.
    writer: Mutex<()>,
    /// Segments unmounted so far, by id: a logged placement may name one
    /// (a put that allocated just before the unmount), and replaying it
    /// must find the same unmounted segment the leader's replica holds.
    unmounted: Mutex<HashMap<SegmentId, Arc<Segment>>>,
    /// Some mounted segment awaits its owner (see `Segment::verified`).
    awaiting_owners: AtomicBool,
    /// Some mounted segment's owner is Suspected (`Segment::suspected`):
    /// heartbeats look for theirs only then.
    any_suspected: AtomicBool,
    /// `--segment_ramp_ms` (0: off): see `ramp`.
    ramp_ms: AtomicU64,
}

impl SegmentTable {
    /// How long a new segment's placement weight takes to reach 1 (0: off).
    pub(crate) fn set_ramp(&self, ms: u64) {
        self.ramp_ms.store(ms, Ordering::Relaxed);
    }

    /// `seg`'s placement weight at `now` (`ramp::weight`).
    fn weight(&self, seg: &Segment, now: u64) -> f64 {
        let ramp_ms = self.ramp_ms.load(Ordering::Relaxed);
        ramp::weight(seg.mounted_at.load(Ordering::Relaxed), now, ramp_ms)
    }

    /// Forgets every segment, mounted or not (a standby about to load its
    /// leader's snapshot over what it held).
    pub(crate) fn clear(&self) {
        let _lock = self.writer.lock();
        self.table.store(Arc::new(Table::default()));
        self.unmounted.lock().clear();
        self.awaiting_owners.store(false, Ordering::Release);
    }

    /// Takes the writer lock: mounts and unmounts happen one at a time,
    /// while allocations go on reading the published snapshot.
    pub(crate) fn write(&self) -> SegmentWriter<'_> {
        SegmentWriter {
            _lock: self.writer.lock(),
            table: &self.table,
            unmounted: &self.unmounted,
        }
    }

    /// Checks and mounts in one step (what the service does, without its
    /// mutation log).
    #[cfg(test)]
    pub(crate) fn mount(
        &self,
        owner: ClientId,
        info: &SegmentInfo,
    ) -> Result<Option<Arc<Segment>>> {
        let mut w = self.write();
        if !w.check_mount(owner, info)? {
            return Ok(None);
        }
        let id = w.next_id();
        Ok(Some(w.insert(id, owner, info)))
    }

    /// Unmounts `name` if `owner` (when given) owns it.
    #[cfg(test)]
    pub(crate) fn unmount(&self, name: &str, owner: Option<ClientId>) -> Option<Arc<Segment>> {
        let mut w = self.write();
        if owner.is_some_and(|o| w.get(name).is_some_and(|s| s.owner != o)) {
            return None;
        }
        w.remove(name)
    }

    pub(crate) fn get(&self, name: &str) -> Option<Arc<Segment>> {
        self.table.load().by_name.get(name).cloned()
    }

    /// The mounted segment of this id (how a log names it).
    pub(crate) fn by_id(&self, id: SegmentId) -> Option<Arc<Segment>> {
        self.table.load().by_id.get(&id).cloned()
    }

    /// Whether some unmounted segment is held by more than this table (a
    /// replica may still name it).
    pub(crate) fn unmounted_in_use(&self) -> bool {
        let unmounted = self.unmounted.lock();
        unmounted.values().any(|s| Arc::strong_count(s) > 1)
    }

    /// The segment of this id, mounted or unmounted since.
    pub(crate) fn any_by_id(&self, id: SegmentId) -> Option<Arc<Segment>> {
        self.by_id(id)
            .or_else(|| self.unmounted.lock().get(&id).cloned())
    }

    /// Serves no replica on any mounted segment until its owner is heard
    /// from ([`SegmentTable::verify_owner`]): after a restore.
    pub(crate) fn unverify_all(&self) {
        let t = self.table.load();
        for s in &t.list {
            s.verified.store(false, Ordering::Release);
        }
        self.awaiting_owners
            .store(!t.list.is_empty(), Ordering::Release);
    }

    /// `owner` was heard from: its segments are served again.
    pub(crate) fn verify_owner(&self, owner: ClientId) {
        if !self.awaiting_owners.load(Ordering::Acquire) {
            return;
        }
        let t = self.table.load();
        let mut waiting = false;
        for s in &t.list {
            if s.owner == owner {
                s.verified.store(true, Ordering::Release);
            }
            waiting |= !s.is_verified();
        }
        if !waiting {
            self.awaiting_owners.store(false, Ordering::Release);
        }
    }

    /// Marks the segments of the `suspects` (and only theirs) Suspected.
    pub(crate) fn suspect_owners(&self, suspects: &[ClientId]) {
        if suspects.is_empty() && !self.any_suspected.load(Ordering::Acquire) {
            return;
        }
        let mut any = false;
        for s in &self.table.load().list {
            let suspected = suspects.contains(&s.owner);
            s.suspected.store(suspected, Ordering::Release);
            any |= suspected;
        }
        self.any_suspected.store(any, Ordering::Release);
    }

    /// `owner` was heard from: its segments are no longer Suspected.
    pub(crate) fn clear_suspicion(&self, owner: ClientId) {
        if !self.any_suspected.load(Ordering::Acquire) {
            return;
        }
        for s in &self.table.load().list {
            if s.owner == owner && s.is_suspected() {
                s.suspected.store(false, Ordering::Release);
            }
        }
    }

    /// Notes an unmounted segment a restored replica still names.
    pub(crate) fn add_unmounted(&self, id: SegmentId, owner: ClientId, info: SegmentInfo) {
        let seg = Arc::new(Segment::new(id, info, owner));
        seg.unmount();
        self.unmounted.lock().insert(id, seg);
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.table.load().list.is_empty()
    }

    /// A snapshot of every mounted segment.
    pub(crate) fn all(&self) -> Vec<Arc<Segment>> {
        self.table.load().list.clone()
    }

    /// Every mounted segment and the id the next one gets, read together.
    pub(crate) fn all_and_next_id(&self) -> (Vec<Arc<Segment>>, SegmentId) {
        let t = self.table.load();
        (t.list.clone(), t.next_id)
    }

    /// Capacity of the largest segment (0 when none is mounted).
    pub(crate) fn max_capacity(&self) -> u64 {
        self.table
            .load()
            .list
            .iter()
            .map(|s| s.capacity())
            .max()
            .unwrap_or(0)
    }

    /// (allocated, capacity) summed over all segments.
    pub(crate) fn usage(&self) -> (u64, u64) {
        let t = self.table.load();
        t.list
            .iter()
            .fold((0, 0), |(u, c), s| (u + s.used(), c + s.capacity()))
    }

    /// Places up to `config.replica_num` replicas of `size` bytes on distinct
    /// segments: preferred segments first, then by `strategy`. Returns at
    /// least one placement, or `NO_AVAILABLE_HANDLE`.
    #[cfg(test)]
    pub(crate) fn place(
        &self,
        size: u64,
        config: &ReplicaPolicy,
        strategy: AllocationStrategy,
    ) -> Result<Vec<Placement>> {
        self.place_with(size, config, strategy, &mut |s, n| s.allocate(n), 0)
    }

    /// [`SegmentTable::place`], taking each range with `allocate`.
    #[cfg(test)]
    pub(crate) fn place_with(
        &self,
        size: u64,
        config: &ReplicaPolicy,
        strategy: AllocationStrategy,
        allocate: &mut dyn FnMut(&Segment, u64) -> Option<u64>,
        now: u64,
    ) -> Result<Vec<Placement>> {
        self.place_ranked(size, config, strategy, &|s| s.free_ratio(), allocate, now)
    }

    /// Places as `place`; the ranked strategies sample and try
    /// the segments of the highest `score` first (free-ratio first: the
    /// segment's free share; SSD free-ratio first: its owner's tier's).
    /// A segment mounted less than the ramp ago (`ramp`) counts for its
    /// weight at `now`: its score is scaled by it, and a random pick tries
    /// it first only that often.
    pub(crate) fn place_ranked(
        &self,
        size: u64,
        config: &ReplicaPolicy,
        strategy: AllocationStrategy,
        score: &dyn Fn(&Segment) -> f64,
        allocate: &mut dyn FnMut(&Segment, u64) -> Option<u64>,
        now: u64,
    ) -> Result<Vec<Placement>> {
        let t = self.table.load();
        if t.list.is_empty() {
            return Err(Error::new(
                ErrorCode::SEGMENT_NOT_FOUND,
                "no segment is mounted",
            ));
        }
        let want = config.replica_num.max(1);
        let mut placed: Vec<Placement> = Vec::with_capacity(want);
        let taken = |placed: &[Placement], s: &Arc<Segment>| {
            placed.iter().any(|p| Arc::ptr_eq(&p.segment, s))
        };

        let preferred = std::iter::once(config.preferred_segment.as_str())
            .chain(config.preferred_segments.iter().map(String::as_str))
            .filter(|n| !n.is_empty());
        for name in preferred {
            if placed.len() == want {
                break;
            }
            if let Some(seg) = t.by_name.get(name) {
                if !taken(&placed, seg) {
                    if let Some(offset) = allocate(seg.as_ref(), size) {
                        placed.push(Placement {
                            segment: seg.clone(),
                            offset,
                        });
                    }
                }
            }
        }

        let n = t.list.len();
        let ranked = matches!(
            strategy,
            AllocationStrategy::FreeRatioFirst | AllocationStrategy::SsdFreeRatioFirst
        );
        if placed.len() < want && ranked {
            // Best of N: sample consecutive segments from a random start and
            // try the emptiest first.
            let samples = (FREE_RATIO_SAMPLES_PER_REPLICA * (want - placed.len())).min(n);
            let start = rand::thread_rng().gen_range(0..n);
            let mut candidates: Vec<(f64, &Arc<Segment>)> = (0..samples)
                .map(|i| &t.list[(start + i) % n])
                .map(|s| (score(s) * self.weight(s, now), s))
                .collect();
            candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
            for (_, seg) in candidates {
                if placed.len() == want {
                    break;
                }
                if !taken(&placed, seg) {
                    if let Some(offset) = allocate(seg.as_ref(), size) {
                        placed.push(Placement {
                            segment: seg.clone(),
                            offset,
                        });
                    }
                }
            }
        }

        if placed.len() < want {
            let mut rng = rand::thread_rng();
            let start = rng.gen_range(0..n);
            let tries = (0..n.min(MAX_PLACEMENT_ATTEMPTS))
                .map(|i| &t.list[(start + i) % n])
                .map(|s| (s, self.weight(s, now)))
                .collect();
            for seg in ramp::weighted_order(tries, || rng.gen::<f64>()) {
                if placed.len() == want {
                    break;
                }
                if !taken(&placed, seg) {
                    if let Some(offset) = allocate(seg.as_ref(), size) {
                        placed.push(Placement {
                            segment: seg.clone(),
                            offset,
                        });
                    }
                }
            }
        }

        if placed.is_empty() {
            return Err(Error::new(
                ErrorCode::NO_AVAILABLE_HANDLE,
                format!("no segment has {size} free bytes in one range"),
            ));
        }
        Ok(placed)
    }
}

/// The segment table under its writer lock. Each change publishes a new
/// snapshot; allocations holding an older one see a removed segment as
/// unmounted.
pub(crate) struct SegmentWriter<'t> {
    _lock: MutexGuard<'t, ()>,
    table: &'t ArcSwap<Table>,
    unmounted: &'t Mutex<HashMap<SegmentId, Arc<Segment>>>,
}

impl SegmentWriter<'_> {
    /// Whether `info` may be mounted by `owner`: `Ok(true)` when it is new,
    /// `Ok(false)` when the same owner mounts the same segment (same base
    /// and size) again, which is accepted so that a client can re-register
    /// after a master restart.
    pub(crate) fn check_mount(&self, owner: ClientId, info: &SegmentInfo) -> Result<bool> {
        if info.name.is_empty() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "segment name is empty",
            ));
        }
        if info.size == 0 || info.base.checked_add(info.size).is_none() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "segment {} has invalid range base={:#x} size={}",
                    info.name, info.base, info.size
                ),
            ));
        }
        let table = self.table.load();
        // Two segments on one endpoint sharing bytes would hand the same
        // memory to two objects: refused, whoever mounts them.
        let end = info.base + info.size;
        let overlapping = table.list.iter().find(|s| {
            s.info.name != info.name
                && s.info.transport_endpoint == info.transport_endpoint
                && info.base < s.info.base + s.info.size
                && s.info.base < end
        });
        if let Some(other) = overlapping {
            return Err(Error::new(
                ErrorCode::SEGMENT_ALREADY_EXISTS,
                format!(
                    "segment {} [{:#x}, {:#x}) overlaps segment {} on {}",
                    info.name, info.base, end, other.info.name, info.transport_endpoint
                ),
            ));
        }
        match table.by_name.get(&info.name) {
            None => Ok(true),
            Some(existing) if existing.owner == owner && existing.info == *info => Ok(false),
            Some(_) => Err(Error::new(
                ErrorCode::SEGMENT_ALREADY_EXISTS,
                format!("segment {} is already mounted", info.name),
            )),
        }
    }

    /// The id the next mounted segment gets.
    pub(crate) fn next_id(&self) -> SegmentId {
        self.table.load().next_id
    }

    /// Sets the id the next mounted segment gets (restoring a snapshot).
    pub(crate) fn set_next_id(&mut self, id: SegmentId) {
        let mut t = Table::clone(&self.table.load());
        t.next_id = id;
        self.table.store(Arc::new(t));
    }

    pub(crate) fn get(&self, name: &str) -> Option<Arc<Segment>> {
        self.table.load().by_name.get(name).cloned()
    }

    /// The segments `owner` mounted, in mount order.
    pub(crate) fn owned_by(&self, owner: ClientId) -> Vec<Arc<Segment>> {
        let t = self.table.load();
        t.list
            .iter()
            .filter(|s| s.owner == owner)
            .cloned()
            .collect()
    }

    /// Mounts a segment whose name is free, under `id`.
    pub(crate) fn insert(
        &mut self,
        id: SegmentId,
        owner: ClientId,
        info: &SegmentInfo,
    ) -> Arc<Segment> {
        let mut t = Table::clone(&self.table.load());
        t.next_id = id.wrapping_add(1);
        let seg = Arc::new(Segment::new(id, info.clone(), owner));
        t.by_name.insert(info.name.clone(), seg.clone());
        t.by_id.insert(id, seg.clone());
        t.list.push(seg.clone());
        self.table.store(Arc::new(t));
        seg
    }

    /// Unmounts a segment and drops its space. Replicas on it must then be
    /// removed by the caller: they still hold the `Arc`, but it is no longer
    /// mounted.
    pub(crate) fn remove(&mut self, name: &str) -> Option<Arc<Segment>> {
        let mut t = Table::clone(&self.table.load());
        let seg = t.by_name.remove(name)?;
        t.by_id.remove(&seg.id);
        t.list.retain(|s| !Arc::ptr_eq(s, &seg));
        self.table.store(Arc::new(t));
        // Allocations still holding the old snapshot see it unmounted.
        seg.unmount();
        self.unmounted.lock().insert(seg.id, seg.clone());
        Some(seg)
    }
}

#[cfg(test)]
mod tests;
