//! The SSD tiers: mounting a storage client's tier, the offload mailbox,
//! copies reported durable, tier evictions, and what the rest of the
//! service asks about copies (reads, puts, removes, eviction).
//!
//! The rule that makes offload lossless: while `--enable_offload` is on,
//! eviction never takes an object that could have a copy (one of its
//! replicas is on a client with a tier) and has none yet; it queues it
//! instead. When memory is full of such objects, a put waits for copies
//! to land (`serve::room_wait`, up to 5 s) and only then gets
//! `NO_AVAILABLE_HANDLE` (-200, retryable).
//! `--offload_force_evict` lifts the rule for rounds that free too little.

use mooncake_common::{Error, ErrorCode, Result};

use super::{check_key, MasterService};
use crate::master::config::policy::OffloadPolicy;
use crate::master::events::{Kind, Medium};
use crate::master::state::fs_tier::SHARED_FS;
use crate::master::state::mutation::{Call, ClientOp, DiskOp, Mutation};
use crate::master::state::objects::{flags, ObjectMeta};
use crate::master::state::ssd_tier::{DiskCopy, Promotion, Tier};
use crate::types::{
    ClientId, LocalDiskDescriptor, OffloadBatch, OffloadTask, ReplicaDesc, ReplicaKind,
    ReplicaStatus,
};

fn offload_disabled() -> Error {
    Error::new(
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
        "offload is disabled on this master (--enable_offload=false)",
    )
}

fn no_tier(client: ClientId) -> Error {
    Error::new(
        ErrorCode::SEGMENT_NOT_FOUND,
        format!("client {client:032x} has no SSD tier mounted"),
    )
}

impl MasterService {
    pub fn with_offload_policy(mut self, offload: OffloadPolicy) -> Self {
        self.offload = offload;
        self
    }

    /// Mounts `client`'s tier. A tier of the same id held by another
    /// client (the previous process on that directory) passes to `client`
    /// with its copies at once, so a restarted storage client serves them
    /// without waiting for the old one's TTL.
    pub(super) fn mount_local_disk_in(
        &self,
        call: &mut Call,
        client: ClientId,
        tier_id: &str,
        endpoint: &str,
        capacity: u64,
        now: u64,
    ) -> Result<()> {
        if !self.offload.enabled {
            return Err(offload_disabled());
        }
        if tier_id.is_empty() || endpoint.is_empty() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "a tier needs an id and an endpoint",
            ));
        }
        self.ping_in(call, client, now).or_else(|e| {
            if e.code == ErrorCode::CLIENT_NOT_FOUND {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        let previous = self.disk.holder_of(tier_id).filter(|&c| c != client);
        self.apply_tiers(
            call,
            DiskOp::MountTier {
                client,
                tier_id,
                endpoint,
                capacity,
            },
        );
        if let Some(old) = previous {
            // Only one process serves a directory: the one that held it
            // before is gone, so its memory replicas are too. Forgetting it
            // now, not at its TTL, makes its copies readable at once.
            tracing::warn!(
                old = %format!("{old:032x}"),
                new = %format!("{client:032x}"),
                "SSD tier taken over by a new process; the old one is dropped"
            );
            let expired = {
                let mut clients = self.clients.lock();
                let known = clients.contains(old);
                if known {
                    self.apply_clients(call, &mut clients, ClientOp::Expire { client: old });
                }
                known
            };
            if expired {
                self.retire_clients(call, &[old], now);
            }
        }
        Ok(())
    }

    /// Hands `client` up to `max` queued offload tasks (each object still
    /// as it was queued, leased for the copy) and the copies to delete.
    /// Promotions at the master's default round.
    pub fn fetch_offload_tasks(
        &self,
        client: ClientId,
        max: u32,
        now: u64,
    ) -> Result<OffloadBatch> {
        self.fetch_offload_tasks_paced(client, max, 0, now)
    }

    /// As `fetch_offload_tasks`, with promotions at most once per
    /// `round_ms` (the tier's offload heartbeat; 0: the default).
    pub fn fetch_offload_tasks_paced(
        &self,
        client: ClientId,
        max: u32,
        round_ms: u64,
        now: u64,
    ) -> Result<OffloadBatch> {
        if !self.disk.has_tier(client) {
            return Err(no_tier(client));
        }
        let p = &self.offload;
        let round_ms = if round_ms == 0 {
            p.promote_round_ms
        } else {
            round_ms
        };
        let taken = self
            .disk
            .take_paced(client, max as usize, p.promote_per_poll, round_ms, now);
        let tasks = taken.tasks;
        let mut batch = OffloadBatch {
            tasks: Vec::with_capacity(tasks.len()),
            ..taken
        };
        for mut task in tasks {
            let key = task.key.clone();
            let mut shard = self.objects.lock(&key);
            let now = shard.clock(now);
            let fresh = shard.get_mut(&key).filter(|obj| {
                obj.is_complete()
                    && obj.pending.is_none()
                    && !obj.is_on_disk()
                    && obj.size == task.size
                    && replica_at(obj, client, task.address)
            });
            match fresh {
                Some(mut obj) => {
                    // Before the copy's lease moves it: the object's age in
                    // memory's LRU order.
                    task.idle_ms = now.saturating_sub(obj.lease_until);
                    let lease = self.policy.lease.lend_for_copy(&mut obj, now);
                    self.disk.lent(client, &task.key, lease);
                    batch.tasks.push(task);
                }
                None => {
                    self.disk.done(client, &task.key);
                }
            }
        }
        Ok(batch)
    }

    /// `keys` are durable in `client`'s tier. A copy is accepted when the
    /// object is still the one the task named (complete, same size, a
    /// replica on this client), or, for `restore`, when the master knows
    /// nothing newer: the key is absent (the copy becomes a disk-only
    /// object) or this tier already holds it. Anything else is
    /// `OBJECT_NOT_FOUND` and the caller deletes its copy.
    pub(super) fn notify_offload_in(
        &self,
        call: &mut Call,
        client: ClientId,
        keys: &[&str],
        sizes: &[u64],
        restore: bool,
        now: u64,
    ) -> Vec<Result<()>> {
        if !self.disk.has_tier(client) {
            return vec![Err(no_tier(client)); keys.len()];
        }
        // Counted as one report: a put waiting for room sees these
        // copies either still under way or ended (`room`).
        self.disk.room().ending(|| {
            keys.iter()
                .zip(sizes)
                .map(|(&key, &size)| self.accept_copy(call, client, key, size, restore, now))
                .collect()
        })
    }

    /// One copy of `notify_offload_in`: accepted (recorded) or stale.
    fn accept_copy(
        &self,
        call: &mut Call,
        client: ClientId,
        key: &str,
        size: u64,
        restore: bool,
        now: u64,
    ) -> Result<()> {
        let stale = |key: &str| {
            Error::new(
                ErrorCode::OBJECT_NOT_FOUND,
                format!("{key:?} changed since its copy was written"),
            )
        };
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let _ = shard.clock(now);
        if let (Some(lease), Some(mut obj)) = (self.disk.done(client, key), shard.get_mut(key)) {
            lease.release(&mut obj);
        }
        let held = self.disk.copy(key);
        let ok = match shard.get(key) {
            Some(obj) if restore => {
                held.is_some_and(|c| c.owner == client && c.size == size) && obj.size == size
            }
            Some(obj) => {
                obj.is_complete()
                    && obj.pending.is_none()
                    && obj.size == size
                    && obj
                        .replicas
                        .as_slice()
                        .iter()
                        .any(|p| p.segment.owner == client)
            }
            None if restore => held.is_none_or(|c| c.owner == client && c.size == size),
            None => false,
        };
        if !ok {
            return Err(stale(key));
        }
        self.apply_copy(
            call,
            shard.get_mut(key).as_deref_mut(),
            DiskOp::AddCopy { client, key, size },
        );
        Ok(())
    }

    /// The tier could not write `keys`: they may be queued again; their
    /// memory copies stay.
    pub fn notify_offload_failure(&self, client: ClientId, keys: &[&str]) -> Result<()> {
        // A put waiting for room sees these copies under way or ended: its
        // next round queues them again.
        self.disk.room().ending(|| {
            for &key in keys {
                let mut shard = self.objects.lock(key);
                let Some(lease) = self.disk.done(client, key) else {
                    continue;
                };
                // A statement, not the block's tail: the guard must drop before `shard`.
                if let Some(mut obj) = shard.get_mut(key) {
                    lease.release(&mut obj);
                };
            }
        });
        Ok(())
    }

    /// Whether a put refused for lack of room may get it by waiting:
    /// copies are queued or in flight, and their objects leave memory
    /// once they land.
    pub(crate) fn copies_under_way(&self) -> bool {
        self.offload.enabled && self.disk.copies_under_way()
    }

    /// Bumped whenever copies in flight end (see `room`).
    pub(crate) fn room_signal(&self) -> &crate::master::state::room::RoomSignal {
        self.disk.room()
    }

    /// Phase 1 of a tier eviction: `client`'s copies of `keys` are
    /// forgotten (objects still in memory stay there). A key whose copy
    /// is not `client`'s is `OBJECT_NOT_FOUND`.
    pub(super) fn evict_disk_replicas_in(
        &self,
        call: &mut Call,
        client: ClientId,
        keys: &[&str],
        now: u64,
    ) -> Vec<Result<()>> {
        self.counters
            .evict_disk_replica_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        keys.iter()
            .map(|&key| {
                check_key(key)?;
                let mut shard = self.objects.lock(key);
                let _ = shard.clock(now);
                if self.disk.copy(key).is_none_or(|c| c.owner != client) {
                    self.counters
                        .evict_disk_replica_failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Err(Error::new(
                        ErrorCode::OBJECT_NOT_FOUND,
                        format!("{key:?} has no copy in this tier"),
                    ));
                }
                self.apply_copy(
                    call,
                    shard.get_mut(key).as_deref_mut(),
                    DiskOp::DropCopy { key },
                );
                if !shard.contains_key(key) {
                    self.kv_event(Kind::Removed, key, Medium::Disk);
                }
                Ok(())
            })
            .collect()
    }

    /// Promotion: memory replicas (preferably on `client`'s own segments)
    /// for the disk-only object `key` whose copy `client` holds. The object
    /// is a put in flight by `client` until its PutEnd; its copy stays.
    pub(super) fn promotion_start_in(
        &self,
        call: &mut Call,
        client: ClientId,
        key: &str,
        now: u64,
    ) -> Result<Vec<ReplicaDesc>> {
        check_key(key)?;
        let reads = self.disk.promotion_taken(key);
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        let copy = self.disk.copy(key).filter(|c| c.owner == client);
        let Some(copy) = copy.filter(|_| !shard.contains_key(key)) else {
            return Err(Error::new(
                ErrorCode::OBJECT_NOT_FOUND,
                format!("{key:?} is not a disk-only object of this tier"),
            ));
        };
        // The reference gates at admission only, handing out one promotion
        // per ten-second heartbeat; ours hands them out as fast as the owner
        // asks, so the gate is checked again as each starts.
        if self.memory_pressed() {
            self.counters
                .promotion_rejected_watermark
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.disk
                .candidates()
                .defer(key, reads.saturating_add(1), now);
            return Err(Error::new(
                ErrorCode::NO_AVAILABLE_HANDLE,
                format!("{key:?}: memory is at the eviction watermark; the promotion waits"),
            ));
        }
        let own: Vec<String> = self
            .segments
            .all()
            .iter()
            .filter(|s| s.owner == client)
            .map(|s| s.info.name.clone())
            .collect();
        let cfg = crate::types::ReplicaPolicy {
            preferred_segments: own,
            ..Default::default()
        };
        let replicas =
            crate::master::state::objects::Replicas::from_vec(self.place(copy.size, &cfg, now)?);
        let descs = replicas.descriptors(copy.size, ReplicaStatus::Processing);
        let start = crate::master::state::mutation::ObjectOp::PutStart {
            client,
            size: copy.size,
            pins: 0,
            now,
            write: crate::master::state::mutation::Write::Fresh(replicas),
        };
        self.apply_in(call, &mut shard, key, start);
        Ok(descs)
    }

    /// A PutEnd of `key` whose copy is still recorded (a promotion): the
    /// object in memory is flagged as having it.
    pub(super) fn reflag_copy(&self, call: &mut Call, key: &str, obj: &mut ObjectMeta) {
        if let Some(copy) = self.disk.copy(key) {
            if !obj.is_on_disk() && copy.size == obj.size {
                let c = &self.counters;
                c.promotion_completed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                c.promotion_completed_bytes
                    .fetch_add(copy.size, std::sync::atomic::Ordering::Relaxed);
                let op = DiskOp::AddCopy {
                    client: copy.owner,
                    key,
                    size: copy.size,
                };
                self.apply_copy(call, Some(obj), op);
            }
        }
    }

    /// A read found `key` on disk only: count it towards a promotion.
    pub(super) fn disk_hit(&self, key: &str, owner: ClientId, now: u64) {
        let p = &self.offload;
        if !p.promote_on_hit {
            return;
        }
        let c = &self.counters;
        let pressed = self.memory_pressed();
        let hit = self
            .disk
            .hit(key, owner, p.promote_after, p.promote_limit, pressed);
        let counter = match hit {
            Promotion::Queued => &c.promotion_admitted,
            Promotion::TooRare => &c.promotion_rejected_frequency,
            Promotion::Pressed => &c.promotion_rejected_watermark,
            Promotion::AtCap => &c.promotion_rejected_cap,
            Promotion::Pending => return,
        };
        if matches!(hit, Promotion::Pressed | Promotion::AtCap) {
            self.disk.candidates().record(key, now);
        }
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether memory is at the eviction high watermark: a promotion then
    /// waits, as the reference's does, rather than add to what the next
    /// eviction round must free.
    fn memory_pressed(&self) -> bool {
        let (used, capacity) = self.segments.usage();
        capacity == 0 || used as f64 >= self.policy.high_watermark * capacity as f64
    }

    /// Retries the promotions due (at most 128 a tick) that memory had no
    /// room for: queued when memory is below the watermark now, else
    /// backed off. Keys no longer disk-only in a tier are dropped.
    pub(super) fn retry_promotions(&self, now: u64) -> usize {
        let p = &self.offload;
        if !p.promote_on_hit {
            return 0;
        }
        let due = self.disk.candidates().due(now, 128);
        let mut queued = 0;
        for key in due {
            let owner = self
                .disk
                .copy(&key)
                .map(|c| c.owner)
                .filter(|&o| o != SHARED_FS && self.disk.has_tier(o));
            let in_memory = self.objects.lock(&key).contains_key(key.as_str());
            let Some(owner) = owner.filter(|_| !in_memory) else {
                self.disk.candidates().remove(&key);
                continue;
            };
            if self.memory_pressed() {
                self.disk.candidates().back_off(&key, now);
                continue;
            }
            match self.disk.enqueue_promotion(&key, owner, p.promote_limit) {
                Promotion::Queued => {
                    self.disk.candidates().remove(&key);
                    self.counters
                        .promotion_admitted
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    queued += 1;
                }
                Promotion::AtCap => self.disk.candidates().back_off(&key, now),
                _ => self.disk.candidates().remove(&key),
            }
        }
        queued
    }

    /// Promotions queued and not started yet.
    pub fn promotions_queued(&self) -> u64 {
        self.disk.promotions_queued() as u64
    }

    // ---- what the rest of the service asks ----------------------------

    /// The tier owner that could hold a copy of `obj`, and where its bytes
    /// are in that owner's segment.
    fn offload_target(&self, obj: &ObjectMeta) -> Option<(ClientId, u64)> {
        obj.replicas
            .as_slice()
            .iter()
            .filter(|p| p.segment.is_mounted())
            .find(|p| self.disk.has_tier(p.segment.owner))
            .map(|p| (p.segment.owner, p.segment.info.base + p.offset))
    }

    /// Whether eviction may take `obj` as far as the tiers are concerned
    /// (`force`: a round that may evict objects without a copy): it has a
    /// copy, or no tier could take one.
    pub(super) fn may_leave_memory(&self, obj: &ObjectMeta, force: bool) -> bool {
        let ssd = self.offload.enabled && self.offload_target(obj).is_some();
        obj.is_on_disk() || force || !(ssd || self.file_target(obj).is_some())
    }

    /// Queues `key` for a copy in its owner's SSD tier, else on the shared
    /// filesystem (at most `limit` keys per owner); false when no tier can
    /// take it now.
    pub(super) fn queue_offload(&self, key: &str, obj: &ObjectMeta, limit: usize) -> bool {
        if obj.is_on_disk() || !obj.is_complete() {
            return false;
        }
        let limit = limit.min(self.offload.queue_limit);
        let target = self.offload_target(obj).filter(|_| self.offload.enabled);
        let Some((owner, address)) = target else {
            return self.queue_file_write(key, obj, limit);
        };
        let task = OffloadTask {
            key: key.to_string(),
            size: obj.size,
            address,
            idle_ms: 0,
        };
        self.disk.queue_offload(owner, task, limit)
    }

    /// Whether a copy of `key` is queued or being written (it will be
    /// free to leave memory once it lands).
    pub(super) fn copy_under_way(&self, key: &str, obj: &ObjectMeta) -> bool {
        match self.offload_target(obj).filter(|_| self.offload.enabled) {
            Some((owner, _)) => self.disk.is_queued(owner, key),
            None => self.files.is_busy(key),
        }
    }

    /// A PutEnd just made `key` readable: in put mode, queue its copy.
    pub(super) fn offload_at_put_end(&self, key: &str, obj: &ObjectMeta) {
        // The shared filesystem takes objects at eviction only.
        if self.offload.enabled && !self.offload.on_evict && self.offload_target(obj).is_some() {
            self.queue_offload(key, obj, usize::MAX);
        }
    }

    pub(super) fn offload_policy(&self) -> &OffloadPolicy {
        &self.offload
    }

    /// Drops `key`'s copy (the object was removed or is being replaced)
    /// and asks its tier to delete it. The caller holds `key`'s shard.
    pub(super) fn forget_copy(
        &self,
        call: &mut Call,
        key: &str,
        obj: Option<&mut ObjectMeta>,
    ) -> bool {
        let Some(copy) = self.disk.copy(key) else {
            return false;
        };
        self.apply_copy(call, obj, DiskOp::DropCopy { key });
        match copy.owner {
            SHARED_FS => self.files.queue_delete(key),
            owner => self.disk.queue_remove(owner, key),
        }
        true
    }

    /// `key`'s disk replica as a reader sees it.
    pub(super) fn disk_replica(&self, key: &str) -> Option<(ReplicaDesc, u64)> {
        let copy = self.disk.copy(key)?;
        if copy.owner == SHARED_FS {
            return Some((self.file_replica(key, copy.size)?, copy.size));
        }
        let tier = self.disk.tier(copy.owner)?;
        let desc = ReplicaDesc {
            kind: ReplicaKind::LocalDisk(LocalDiskDescriptor {
                client_id: copy.owner,
                object_size: copy.size,
                transport_endpoint: tier.endpoint,
            }),
            status: ReplicaStatus::Complete,
        };
        Some((desc, copy.size))
    }

    /// The tiers of `dead` clients go with their copies.
    pub(super) fn unmount_tiers(&self, call: &mut Call, dead: &[ClientId]) {
        for &client in dead {
            self.files.unmount(client);
            if self.drop_tier(call, client) {
                tracing::warn!(client = %format!("{client:032x}"), "SSD tier unmounted with its client");
            }
        }
    }

    /// A storage client withdraws its SSD tier before it stops: from now
    /// on it gets no offload or promotion work, and the master forgets its
    /// copies (an object held only there is gone), so no reader is sent to
    /// a tier about to stop serving. A client without a tier: done already.
    pub(super) fn unmount_local_disk_in(&self, call: &mut Call, client: ClientId) -> Result<()> {
        if !self.offload.enabled {
            return Err(Error::new(
                ErrorCode::UNABLE_OFFLOAD,
                "offload is disabled on this master (--enable_offload=false)",
            ));
        }
        if self.drop_tier(call, client) {
            tracing::info!(client = %format!("{client:032x}"), "SSD tier unmounted on request");
        }
        Ok(())
    }

    /// Drops `client`'s tier and every copy it holds; false when it has none.
    fn drop_tier(&self, call: &mut Call, client: ClientId) -> bool {
        if !self.disk.has_tier(client) {
            return false;
        }
        for key in self.disk.keys_of(client) {
            let mut shard = self.objects.lock(&key);
            self.apply_copy(
                call,
                shard.get_mut(key.as_str()).as_deref_mut(),
                DiskOp::DropCopy { key: &key },
            );
        }
        self.apply_tiers(call, DiskOp::UnmountTier { client });
        true
    }

    // ---- apply --------------------------------------------------------

    /// Applies a copy mutation; the caller holds the key's shard and
    /// passes its object when it is in memory.
    pub(super) fn apply_copy(&self, call: &mut Call, obj: Option<&mut ObjectMeta>, op: DiskOp<'_>) {
        let _cut = self.observe(call, &Mutation::Disk(op));
        match op {
            DiskOp::AddCopy { client, key, size } => {
                if let Some(obj) = obj {
                    obj.flags |= flags::ON_DISK;
                }
                self.disk.add(
                    key,
                    DiskCopy {
                        owner: client,
                        size,
                    },
                );
            }
            DiskOp::DropCopy { key } => {
                if let Some(obj) = obj {
                    obj.flags &= !flags::ON_DISK;
                }
                self.disk.drop_copy(key);
            }
            DiskOp::MountTier { .. } | DiskOp::UnmountTier { .. } => {
                unreachable!("not a copy mutation")
            }
        }
    }

    pub(super) fn apply_tiers(&self, call: &mut Call, op: DiskOp<'_>) {
        let _cut = self.observe(call, &Mutation::Disk(op));
        match op {
            DiskOp::MountTier {
                client,
                tier_id,
                endpoint,
                capacity,
            } => self.disk.mount(
                client,
                Tier {
                    tier_id: tier_id.into(),
                    endpoint: endpoint.to_string(),
                    capacity,
                },
            ),
            DiskOp::UnmountTier { client } => self.disk.unmount(client),
            DiskOp::AddCopy { .. } | DiskOp::DropCopy { .. } => {
                unreachable!("not a tier mutation")
            }
        }
    }

    /// Replays a disk mutation decided by the leader.
    pub(super) fn replay_disk(&self, call: &mut Call, op: DiskOp<'_>) {
        match op {
            DiskOp::AddCopy { key, .. } | DiskOp::DropCopy { key } => {
                let mut shard = self.objects.lock(key);
                self.apply_copy(call, shard.get_mut(key).as_deref_mut(), op);
            }
            DiskOp::MountTier { .. } | DiskOp::UnmountTier { .. } => self.apply_tiers(call, op),
        }
    }

    /// (bytes in tiers, their capacity, objects with a copy), the SSD
    /// tiers and the shared filesystem together.
    pub fn disk_usage(&self) -> (u64, u64, u64) {
        let (used, cap) = self.disk.usage();
        let (_, file_cap) = self.file_usage();
        (used, cap.saturating_add(file_cap), self.disk.copy_count())
    }
}

/// Whether `obj` has a replica at `address` on a segment `client` owns.
fn replica_at(obj: &ObjectMeta, client: ClientId, address: u64) -> bool {
    obj.replicas.as_slice().iter().any(|p| {
        p.segment.is_mounted()
            && p.segment.owner == client
            && p.segment.info.base + p.offset == address
    })
}
