//! The storage clients' SSD tiers as the master knows them: which tiers
//! are mounted, which objects have a durable copy in one (`LOCAL_DISK`
//! replicas), and each tier owner's mailbox of offload work.
//!
//! The copies and the tiers are replicated state (changed only by
//! [`DiskOp`](super::mutation::DiskOp)s); an object with a copy also
//! carries `flags::ON_DISK` in the object map while it has memory
//! replicas, so eviction can tell it apart without a lookup here. An object
//! whose memory replicas are gone lives on here alone ("disk-only").
//!
//! The mailboxes are volatile: the leader fills them at PutEnd and when
//! eviction passes over an object it may not evict yet; after a failover
//! the next eviction round fills them again.
//!
//! Lock order: object shard → `copies` → `tiers` → `mail`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use super::fs_tier::SHARED_FS;
use super::leases::CopyLease;
use super::promotion::{Candidates, Pacer};
use super::room::RoomSignal;
use crate::types::{ClientId, OffloadBatch, OffloadTask};

/// One object's copy in a tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DiskCopy {
    pub(crate) owner: ClientId,
    pub(crate) size: u64,
}

/// A mounted tier.
#[derive(Debug, Clone)]
pub(crate) struct Tier {
    /// Names the tier's directory across restarts of its owner.
    pub(crate) tier_id: Box<str>,
    /// The owner's tier service, where readers ask for staged copies.
    pub(crate) endpoint: String,
    pub(crate) capacity: u64,
}

/// What a read of a disk-only object did towards its promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Promotion {
    /// Read fewer times than the admission threshold.
    TooRare,
    Queued,
    /// Already queued.
    Pending,
    /// Memory is at the eviction high watermark.
    Pressed,
    /// The queue is at `--promotion_queue_limit`.
    AtCap,
}

/// Offload work queued for one tier owner.
#[derive(Default)]
struct Mailbox {
    tasks: VecDeque<OffloadTask>,
    /// Keys queued or handed out and not yet reported: never queued twice.
    queued: HashSet<Box<str>>,
    /// The leases of the copies handed out, given back when reported.
    lent: HashMap<Box<str>, CopyLease>,
    removes: Vec<String>,
    promotions: Vec<String>,
}

#[derive(Default)]
pub(crate) struct DiskTable {
    copies: Mutex<HashMap<Box<str>, DiskCopy>>,
    tiers: RwLock<HashMap<ClientId, Tier>>,
    mail: Mutex<HashMap<ClientId, Mailbox>>,
    /// Reads of disk-only objects not promoted yet (volatile).
    hits: Mutex<HashMap<Box<str>, usize>>,
    /// Promotions queued or in flight, with the reads of each meanwhile
    /// (volatile).
    promoting: Mutex<HashMap<Box<str>, u32>>,
    /// Promotions to retry (volatile).
    candidates: Mutex<Candidates>,
    /// When each owner may take promotions again (volatile).
    pacer: Mutex<Pacer<ClientId>>,
    /// Sum of the copies' sizes.
    bytes: AtomicU64,
    /// The copies' bytes per tier owner.
    used: Mutex<HashMap<ClientId, u64>>,
    /// The shared filesystem's copies, oldest first (its eviction order).
    files: Mutex<FileOrder>,
    /// Bumped when copies in flight end: puts waiting for room retry.
    room: RoomSignal,
}

/// Write order of the shared filesystem's copies.
#[derive(Default)]
struct FileOrder {
    by_seq: std::collections::BTreeMap<u64, Box<str>>,
    seq_of: HashMap<Box<str>, u64>,
    next: u64,
    bytes: u64,
}

impl DiskTable {
    /// Forgets every tier and copy (a standby about to load its leader's
    /// snapshot over what it held).
    pub(crate) fn clear(&self) {
        self.copies.lock().clear();
        self.tiers.write().clear();
        self.mail.lock().clear();
        self.hits.lock().clear();
        self.promoting.lock().clear();
        self.candidates.lock().clear();
        self.pacer.lock().clear();
        self.bytes.store(0, Ordering::Relaxed);
        self.used.lock().clear();
        *self.files.lock() = FileOrder::default();
    }

    pub(crate) fn copy(&self, key: &str) -> Option<DiskCopy> {
        self.copies.lock().get(key).copied()
    }

    pub(crate) fn has_copy(&self, key: &str) -> bool {
        self.copies.lock().contains_key(key)
    }

    pub(crate) fn tier(&self, owner: ClientId) -> Option<Tier> {
        self.tiers.read().get(&owner).cloned()
    }

    /// The client holding the tier `tier_id`.
    pub(crate) fn holder_of(&self, tier_id: &str) -> Option<ClientId> {
        self.tiers
            .read()
            .iter()
            .find(|(_, t)| &*t.tier_id == tier_id)
            .map(|(&c, _)| c)
    }

    pub(crate) fn has_tier(&self, owner: ClientId) -> bool {
        self.tiers.read().contains_key(&owner)
    }

    /// (bytes held in SSD tiers and the shared filesystem, capacity of
    /// the SSD tiers).
    pub(crate) fn usage(&self) -> (u64, u64) {
        let cap = self.tiers.read().values().map(|t| t.capacity).sum();
        (self.bytes.load(Ordering::Relaxed), cap)
    }

    pub(crate) fn copy_count(&self) -> u64 {
        self.copies.lock().len() as u64
    }

    /// Keys with a copy owned by `owner`.
    pub(crate) fn keys_of(&self, owner: ClientId) -> Vec<String> {
        self.copies
            .lock()
            .iter()
            .filter(|(_, c)| c.owner == owner)
            .map(|(k, _)| k.to_string())
            .collect()
    }

    /// Keys with a copy matching `pred`.
    pub(crate) fn keys_where(&self, mut pred: impl FnMut(&str) -> bool) -> Vec<String> {
        self.copies
            .lock()
            .keys()
            .filter(|k| pred(k))
            .map(|k| k.to_string())
            .collect()
    }

    // ---- applied by mutations -----------------------------------------

    /// Mounts `owner`'s tier; a tier of the same id held by another client
    /// (a previous process on the same directory) passes to `owner` with
    /// its copies.
    pub(crate) fn mount(&self, owner: ClientId, tier: Tier) {
        let mut tiers = self.tiers.write();
        let previous: Vec<ClientId> = tiers
            .iter()
            .filter(|(&c, t)| c != owner && t.tier_id == tier.tier_id)
            .map(|(&c, _)| c)
            .collect();
        for c in &previous {
            tiers.remove(c);
        }
        tiers.insert(owner, tier);
        drop(tiers);
        if !previous.is_empty() {
            let mut copies = self.copies.lock();
            for copy in copies.values_mut() {
                if previous.contains(&copy.owner) {
                    copy.owner = owner;
                }
            }
            drop(copies);
            let mut used = self.used.lock();
            let moved: u64 = previous.iter().filter_map(|c| used.remove(c)).sum();
            *used.entry(owner).or_default() += moved;
            drop(used);
            let mut mail = self.mail.lock();
            for c in previous {
                mail.remove(&c);
            }
        }
    }

    pub(crate) fn unmount(&self, owner: ClientId) {
        self.tiers.write().remove(&owner);
        self.pacer.lock().forget(owner);
        // Promotions it never started are no longer pending.
        let mail = self.mail.lock().remove(&owner);
        if let Some(mail) = mail {
            let mut promoting = self.promoting.lock();
            for key in &mail.promotions {
                promoting.remove(key.as_str());
            }
        }
    }

    /// Records `key`'s copy (replacing one another tier held).
    pub(crate) fn add(&self, key: &str, copy: DiskCopy) {
        let old = self.copies.lock().insert(key.into(), copy);
        let old_size = old.map_or(0, |c| c.size);
        self.charge(copy.owner, copy.size, old);
        self.bytes.fetch_add(copy.size, Ordering::Relaxed);
        self.bytes.fetch_sub(old_size, Ordering::Relaxed);
        if let Some(old) = old {
            self.unorder(key, old);
        }
        if copy.owner == SHARED_FS {
            let mut f = self.files.lock();
            let seq = f.next;
            f.next += 1;
            f.by_seq.insert(seq, key.into());
            f.seq_of.insert(key.into(), seq);
            f.bytes += copy.size;
        }
    }

    /// Forgets `key`'s copy; returns it.
    pub(crate) fn drop_copy(&self, key: &str) -> Option<DiskCopy> {
        let old = self.copies.lock().remove(key)?;
        self.bytes.fetch_sub(old.size, Ordering::Relaxed);
        self.charge(old.owner, 0, Some(old));
        self.unorder(key, old);
        Some(old)
    }

    /// `owner`'s tier holds `size` more bytes, and `old`'s owner `old.size` fewer.
    fn charge(&self, owner: ClientId, size: u64, old: Option<DiskCopy>) {
        let mut used = self.used.lock();
        *used.entry(owner).or_default() += size;
        if let Some(old) = old {
            if let Some(u) = used.get_mut(&old.owner) {
                *u = u.saturating_sub(old.size);
                if *u == 0 {
                    used.remove(&old.owner);
                }
            }
        }
    }

    /// The free share of `owner`'s tier (1 without a tier or a limit), as
    /// the reference's `ssd_free_ratio_first` scores a segment's owner.
    pub(crate) fn tier_free_ratio(&self, owner: ClientId) -> f64 {
        let capacity = self.tiers.read().get(&owner).map_or(0, |t| t.capacity);
        if capacity == 0 {
            return 1.0;
        }
        let used = self
            .used
            .lock()
            .get(&owner)
            .copied()
            .unwrap_or(0)
            .min(capacity);
        (capacity - used) as f64 / capacity as f64
    }

    fn unorder(&self, key: &str, old: DiskCopy) {
        if old.owner == SHARED_FS {
            let mut f = self.files.lock();
            if let Some(seq) = f.seq_of.remove(key) {
                f.by_seq.remove(&seq);
            }
            f.bytes -= old.size;
        }
    }

    /// Bytes of the shared filesystem's copies.
    pub(crate) fn file_bytes(&self) -> u64 {
        self.files.lock().bytes
    }

    /// The shared filesystem's oldest copies, up to `n`, oldest first.
    pub(crate) fn oldest_files(&self, n: usize) -> Vec<String> {
        let f = self.files.lock();
        f.by_seq.values().take(n).map(|k| k.to_string()).collect()
    }

    // ---- the mailboxes (volatile) -------------------------------------

    /// Queues `task` for `owner` unless it is queued already or the
    /// mailbox holds `limit` keys; returns whether it was queued.
    pub(crate) fn queue_offload(&self, owner: ClientId, task: OffloadTask, limit: usize) -> bool {
        let mut mail = self.mail.lock();
        let m = mail.entry(owner).or_default();
        if m.queued.len() >= limit || m.queued.contains(task.key.as_str()) {
            return false;
        }
        m.queued.insert(task.key.as_str().into());
        m.tasks.push_back(task);
        true
    }

    /// Whether `key` is queued for, or being copied to, `owner`'s tier.
    pub(crate) fn is_queued(&self, owner: ClientId, key: &str) -> bool {
        self.mail
            .lock()
            .get(&owner)
            .is_some_and(|m| m.queued.contains(key))
    }

    /// Asks `owner` to delete its copy of `key`.
    pub(crate) fn queue_remove(&self, owner: ClientId, key: &str) {
        let mut mail = self.mail.lock();
        let m = mail.entry(owner).or_default();
        m.queued.remove(key);
        m.removes.push(key.to_string());
    }

    /// Takes up to `max` queued tasks, every queued remove and up to
    /// `max_promotions` promotions. The tasks stay marked as queued until
    /// `done`, the promotions until `promotion_taken`.
    pub(crate) fn take(&self, owner: ClientId, max: usize, max_promotions: usize) -> OffloadBatch {
        let mut mail = self.mail.lock();
        let Some(m) = mail.get_mut(&owner) else {
            return OffloadBatch::default();
        };
        let n = max.min(m.tasks.len());
        let p = max_promotions.min(m.promotions.len());
        OffloadBatch {
            tasks: m.tasks.drain(..n).collect(),
            removes: std::mem::take(&mut m.removes),
            promotions: m.promotions.drain(..p).collect(),
        }
    }

    /// As `take`, with at most `per_round` promotions per `round_ms`
    /// (see [`Pacer`]).
    pub(crate) fn take_paced(
        &self,
        owner: ClientId,
        max: usize,
        per_round: usize,
        round_ms: u64,
        now: u64,
    ) -> OffloadBatch {
        let mut pacer = self.pacer.lock();
        let allowance = pacer.allowance(owner, now, per_round);
        let batch = self.take(owner, max, allowance);
        pacer.took(owner, batch.promotions.len(), now, round_ms);
        batch
    }

    /// A read found `key` on disk only: counts it, and once it was read
    /// `after` times queues its promotion with `owner` (at most `limit`
    /// queued or in flight).
    /// `pressed`: memory is at the eviction watermark, so nothing is
    /// queued, and the key's count stays at the threshold (its next read
    /// tries again).
    pub(crate) fn hit(
        &self,
        key: &str,
        owner: ClientId,
        after: usize,
        limit: usize,
        pressed: bool,
    ) -> Promotion {
        {
            let mut hits = self.hits.lock();
            let n = hits.entry(key.into()).or_insert(0);
            *n = n.saturating_add(1);
            if *n < after {
                return Promotion::TooRare;
            }
            if pressed {
                *n = after;
                return Promotion::Pressed;
            }
            hits.remove(key);
        }
        self.enqueue_promotion(key, owner, limit)
    }

    /// Queues `key`'s promotion with `owner` (at most `limit` queued or in
    /// flight), unless it is queued already.
    pub(crate) fn enqueue_promotion(&self, key: &str, owner: ClientId, limit: usize) -> Promotion {
        let mut promoting = self.promoting.lock();
        if let Some(reads) = promoting.get_mut(key) {
            *reads = reads.saturating_add(1);
            return Promotion::Pending;
        }
        if promoting.len() >= limit {
            return Promotion::AtCap;
        }
        promoting.insert(key.into(), 0);
        drop(promoting);
        self.mail
            .lock()
            .entry(owner)
            .or_default()
            .promotions
            .push(key.to_string());
        Promotion::Queued
    }

    /// The promotions waiting for a retry.
    pub(crate) fn candidates(&self) -> parking_lot::MutexGuard<'_, Candidates> {
        self.candidates.lock()
    }

    /// Promotions queued and not yet started.
    pub(crate) fn promotions_queued(&self) -> usize {
        self.promoting.lock().len()
    }

    /// The owner started (or gave up) promoting `key`: the reads it had
    /// meanwhile.
    pub(crate) fn promotion_taken(&self, key: &str) -> u32 {
        self.promoting.lock().remove(key).unwrap_or(0)
    }

    /// `key`'s copy, handed out to `owner`, holds `lease` on the object.
    pub(crate) fn lent(&self, owner: ClientId, key: &str, lease: CopyLease) {
        if let Some(m) = self.mail.lock().get_mut(&owner) {
            m.lent.insert(key.into(), lease);
        }
    }

    /// A handed-out task ended (or was found stale): `key` may be queued
    /// again. Returns the lease its copy held, for the caller to give back.
    pub(crate) fn done(&self, owner: ClientId, key: &str) -> Option<CopyLease> {
        let mut mail = self.mail.lock();
        let m = mail.get_mut(&owner)?;
        m.queued.remove(key);
        m.lent.remove(key)
    }

    /// Whether any tier has copies queued or in flight: memory they
    /// hold is freed once they land.
    pub(crate) fn copies_under_way(&self) -> bool {
        self.mail.lock().values().any(|m| !m.queued.is_empty())
    }

    pub(crate) fn room(&self) -> &RoomSignal {
        &self.room
    }

    /// Keys queued or in flight for `owner`.
    #[cfg(test)]
    pub(crate) fn queued_len(&self, owner: ClientId) -> usize {
        self.mail.lock().get(&owner).map_or(0, |m| m.queued.len())
    }
}

impl DiskTable {
    /// The tiers as (owner, tier id, endpoint, capacity) and the copies as
    /// (key, copy), for a snapshot, or `None` while either is busy.
    #[allow(clippy::type_complexity)]
    pub(crate) fn try_export(
        &self,
    ) -> Option<(
        Vec<(ClientId, String, String, u64)>,
        Vec<(String, DiskCopy)>,
    )> {
        let tiers = self.tiers.try_read()?;
        let copies = self.copies.try_lock()?;
        Some((
            tiers
                .iter()
                .map(|(&c, t)| (c, t.tier_id.to_string(), t.endpoint.clone(), t.capacity))
                .collect(),
            copies.iter().map(|(k, c)| (k.to_string(), *c)).collect(),
        ))
    }
}

/// The replicated part of a [`DiskTable`], sorted: copies and tiers.
#[cfg(test)]
pub(crate) type DiskSnapshot = (Vec<(String, DiskCopy)>, Vec<(ClientId, String, u64)>);

#[cfg(test)]
impl DiskTable {
    pub(crate) fn snapshot(&self) -> DiskSnapshot {
        let mut copies: Vec<(String, DiskCopy)> = self
            .copies
            .lock()
            .iter()
            .map(|(k, c)| (k.to_string(), *c))
            .collect();
        copies.sort_by(|a, b| a.0.cmp(&b.0));
        let mut tiers: Vec<(ClientId, String, u64)> = self
            .tiers
            .read()
            .iter()
            .map(|(&c, t)| (c, t.tier_id.to_string(), t.capacity))
            .collect();
        tiers.sort();
        (copies, tiers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(id: &str) -> Tier {
        Tier {
            tier_id: id.into(),
            endpoint: format!("{id}:1"),
            capacity: 100,
        }
    }

    fn task(key: &str) -> OffloadTask {
        OffloadTask {
            key: key.into(),
            size: 8,
            address: 0,
            idle_ms: 0,
        }
    }

    #[test]
    fn a_tier_mounted_again_by_a_new_client_keeps_its_copies() {
        let t = DiskTable::default();
        t.mount(1, tier("dir-a"));
        t.mount(2, tier("dir-b"));
        t.add("k", DiskCopy { owner: 1, size: 8 });
        t.add("j", DiskCopy { owner: 2, size: 4 });
        t.mount(3, tier("dir-a"));
        assert!(!t.has_tier(1));
        assert_eq!(t.copy("k").unwrap().owner, 3);
        assert_eq!(t.copy("j").unwrap().owner, 2);
        assert_eq!(t.usage(), (12, 200));
        assert_eq!(t.drop_copy("k").unwrap().size, 8);
        assert_eq!(t.usage().0, 4);
    }

    #[test]
    fn mailboxes_queue_each_key_once_within_the_limit() {
        let t = DiskTable::default();
        assert!(t.queue_offload(1, task("a"), 2));
        assert!(!t.queue_offload(1, task("a"), 2), "already queued");
        assert!(t.queue_offload(1, task("b"), 2));
        assert!(!t.queue_offload(1, task("c"), 2), "mailbox full");
        let b = t.take(1, 1, 0);
        assert_eq!(b.tasks, [task("a")]);
        assert!(b.removes.is_empty());
        assert!(!t.queue_offload(1, task("a"), 3), "in flight");
        t.done(1, "a");
        assert!(t.queue_offload(1, task("a"), 3));
        t.queue_remove(1, "z");
        let b = t.take(1, 10, 0);
        assert_eq!(b.tasks.len(), 2);
        assert_eq!(b.removes, ["z"]);
        assert_eq!(t.queued_len(1), 2);
    }

    #[test]
    fn a_tiers_free_ratio_follows_its_copies() {
        let t = DiskTable::default();
        assert_eq!(t.tier_free_ratio(1), 1.0, "no tier");
        let tier = |id: &str| Tier {
            tier_id: id.into(),
            endpoint: "h:1".into(),
            capacity: 1000,
        };
        t.mount(1, tier("d1"));
        t.add(
            "a",
            DiskCopy {
                owner: 1,
                size: 250,
            },
        );
        t.add(
            "b",
            DiskCopy {
                owner: 1,
                size: 250,
            },
        );
        assert_eq!(t.tier_free_ratio(1), 0.5);
        t.add(
            "a",
            DiskCopy {
                owner: 1,
                size: 100,
            },
        );
        assert_eq!(t.tier_free_ratio(1), 0.65, "a replaced copy");
        t.drop_copy("b");
        assert_eq!(t.tier_free_ratio(1), 0.9);
        // A takeover moves the bytes with the copies.
        t.mount(2, tier("d1"));
        assert_eq!(t.tier_free_ratio(2), 0.9);
        assert_eq!(t.tier_free_ratio(1), 1.0);
    }

    #[test]
    fn a_promotion_waits_for_memory_below_the_watermark() {
        let t = DiskTable::default();
        assert_eq!(t.hit("k", 1, 2, 10, true), Promotion::TooRare);
        assert_eq!(t.hit("k", 1, 2, 10, true), Promotion::Pressed);
        assert_eq!(t.promotions_queued(), 0);
        // The count stays at the threshold: the next read under no
        // pressure queues it.
        assert_eq!(t.hit("k", 1, 2, 10, false), Promotion::Queued);
        assert_eq!(t.take(1, 0, 5).promotions, ["k"]);
    }

    #[test]
    fn an_unmounted_tier_leaves_no_promotion_pending() {
        let t = DiskTable::default();
        assert_eq!(t.hit("k", 1, 1, 10, false), Promotion::Queued);
        t.unmount(1);
        assert_eq!(t.promotions_queued(), 0);
        assert_eq!(t.hit("k", 2, 1, 10, false), Promotion::Queued);
        assert_eq!(t.take(2, 0, 5).promotions, ["k"]);
    }

    #[test]
    fn promotions_fire_at_the_threshold_once() {
        let t = DiskTable::default();
        assert_eq!(t.hit("k", 1, 2, 10, false), Promotion::TooRare);
        assert_eq!(t.hit("k", 1, 2, 10, false), Promotion::Queued);
        assert_eq!(t.hit("k", 1, 1, 10, false), Promotion::Pending);
        assert_eq!(t.hit("j", 1, 1, 1, false), Promotion::AtCap);
        assert_eq!(t.promotions_queued(), 1);
        assert_eq!(t.take(1, 0, 5).promotions, ["k"]);
        t.promotion_taken("k");
        assert_eq!(t.hit("k", 1, 1, 10, false), Promotion::Queued);
    }
}
