//! `MasterService`: the master's state machine. It does no I/O and reads no
//! clock: every call takes `now` (milliseconds on a monotonic clock), so
//! tests drive time by hand.
//!
//! Lock order: object shard → one segment's allocator (the segment table
//! is a lock-free snapshot); eviction round → object shards; task table → client table;
//! the retired list and the client table are leaves.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;

use super::clients::ClientState;
use super::config::{AllocationStrategy, MasterConfig};
use super::leases::LeasePolicy;
use super::objects::{flags, ObjectMap, ObjectMeta, PendingKind, PendingPut, Replicas, SHARDS};
use super::segments::{Placement, SegmentTable};
use crate::proto::{Request, Response};
use crate::types::{
    ClientId, GetReplicaListResponse, ReplicaDesc, ReplicaStatus, ReplicateConfig, SegmentInfo,
    MAX_KEY_LEN, MAX_REPLICA_NUM, MAX_VALUE_LEN,
};

/// The master's rules, with times in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub lease: LeasePolicy,
    pub client_ttl: u64,
    /// An unfinished put older than this is discarded (key freed).
    pub discard_after: u64,
    /// A discarded put's space is reused only this long after its PutStart,
    /// in case its writer is slow rather than dead.
    pub release_after: u64,
    pub high_watermark: f64,
    pub eviction_ratio: f64,
    pub evict_soft_pinned: bool,
    pub strategy: AllocationStrategy,
}

impl Policy {
    pub fn from_config(c: &MasterConfig) -> Self {
        let ms = |d: std::time::Duration| d.as_millis().min(u64::MAX as u128) as u64;
        Policy {
            lease: LeasePolicy {
                lease_ttl: ms(c.default_kv_lease_ttl),
                soft_pin_ttl: ms(c.default_kv_soft_pin_ttl),
            },
            client_ttl: ms(c.client_ttl),
            discard_after: ms(c.put_start_discard_timeout),
            release_after: ms(c.put_start_release_timeout).max(ms(c.put_start_discard_timeout)),
            high_watermark: c.eviction_high_watermark_ratio,
            eviction_ratio: c.eviction_ratio,
            evict_soft_pinned: c.allow_evict_soft_pinned_objects,
            strategy: c.allocation_strategy,
        }
    }
}

/// Space that may still be written by a slow client: freed at `free_at`.
struct Retired {
    free_at: u64,
    placement: Placement,
    size: u64,
}

/// Event counters (monotonic).
#[derive(Default, Debug)]
pub struct Counters {
    pub eviction_rounds: AtomicU64,
    pub eviction_rounds_freeing: AtomicU64,
    pub evicted_keys: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub discarded_puts: AtomicU64,
    pub expired_clients: AtomicU64,
}

/// What one `tick` did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TickReport {
    pub expired_clients: usize,
    pub discarded_puts: usize,
    pub freed_retired: usize,
    pub failed_tasks: usize,
    pub evicted_keys: usize,
    pub evicted_bytes: u64,
}

/// Totals for metrics and the HTTP service.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MasterStats {
    pub allocated_bytes: u64,
    pub capacity_bytes: u64,
    pub key_count: u64,
    pub soft_pin_key_count: u64,
    pub hard_pin_key_count: u64,
    pub pending_puts: u64,
    pub active_clients: u64,
    pub segment_count: u64,
}

/// One segment as the HTTP service shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSummary {
    pub name: String,
    pub endpoint: String,
    pub base: u64,
    pub used: u64,
    pub capacity: u64,
    pub owner: ClientId,
}

pub struct MasterService {
    pub(super) policy: Policy,
    pub(super) segments: SegmentTable,
    pub(super) objects: ObjectMap,
    pub(super) clients: Mutex<HashMap<ClientId, ClientState>>,
    retired: Mutex<Vec<Retired>>,
    /// An allocation failed for lack of space: evict at the next tick even below the watermark.
    pub(super) need_eviction: AtomicBool,
    /// One eviction round at a time.
    pub(super) eviction_lock: Mutex<()>,
    /// Bumped after every eviction round.
    pub(super) eviction_generation: AtomicU64,
    pub counters: Counters,
    pub(super) tasks: Mutex<super::tasks::TaskTable>,
    pub(super) task_policy: super::tasks::TaskPolicy,
    /// Wall-clock ms at `now == 0`, for task timestamps (set by the server).
    pub(super) epoch_offset_ms: AtomicU64,
}

pub(super) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::new(ErrorCode::INVALID_KEY, "empty key"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::new(
            ErrorCode::INVALID_KEY,
            format!("key of {} bytes exceeds {MAX_KEY_LEN}", key.len()),
        ));
    }
    Ok(())
}

fn check_put(len: u64, cfg: &ReplicateConfig) -> Result<()> {
    if len == 0 {
        return Err(Error::new(ErrorCode::INVALID_PARAMS, "value is empty"));
    }
    if len > MAX_VALUE_LEN {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("value of {len} bytes exceeds {MAX_VALUE_LEN}"),
        ));
    }
    if cfg.replica_num == 0 || cfg.replica_num > MAX_REPLICA_NUM {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!(
                "replica_num {} not in 1..={MAX_REPLICA_NUM}",
                cfg.replica_num
            ),
        ));
    }
    Ok(())
}

fn not_found(key: &str) -> Error {
    Error::new(
        ErrorCode::OBJECT_NOT_FOUND,
        format!("object {key:?} not found"),
    )
}

fn not_ready(key: &str) -> Error {
    Error::new(
        ErrorCode::REPLICA_IS_NOT_READY,
        format!("object {key:?} is being written"),
    )
}

fn pin_flags(cfg: &ReplicateConfig) -> u8 {
    let mut f = 0;
    if cfg.with_hard_pin {
        f |= flags::HARD_PIN;
    }
    if cfg.with_soft_pin {
        f |= flags::SOFT_PIN;
    }
    f
}

fn free_now(replicas: &Replicas, size: u64) {
    for p in replicas.as_slice() {
        p.segment.free(p.offset, size);
    }
}

impl MasterService {
    pub fn new(config: &MasterConfig) -> Self {
        let mut s = Self::with_policy(Policy::from_config(config));
        s.task_policy = config.task_policy();
        s
    }

    /// Sets the wall-clock time (ms since the epoch) that `now == 0` stands
    /// for; task timestamps are reported in wall-clock time.
    pub fn set_epoch_offset(&self, epoch_ms_at_zero: u64) {
        self.epoch_offset_ms
            .store(epoch_ms_at_zero, Ordering::Relaxed);
    }

    pub fn with_policy(policy: Policy) -> Self {
        MasterService {
            policy,
            segments: SegmentTable::default(),
            objects: ObjectMap::default(),
            clients: Mutex::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
            need_eviction: AtomicBool::new(false),
            eviction_lock: Mutex::new(()),
            eviction_generation: AtomicU64::new(0),
            counters: Counters::default(),
            tasks: Mutex::new(Default::default()),
            task_policy: Default::default(),
            epoch_offset_ms: AtomicU64::new(0),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    // ---- puts -------------------------------------------------------------

    /// Allocates replicas for `key`; the object becomes readable at `put_end`.
    /// With `upsert`, an existing object is replaced: in place when the size
    /// is unchanged and no reader holds a lease (unreadable until PutEnd),
    /// otherwise into new space while the old replicas stay readable.
    ///
    /// When no segment has room, an eviction round runs and the put is
    /// retried once.
    pub fn put_start(
        &self,
        client: ClientId,
        key: &str,
        len: u64,
        cfg: &ReplicateConfig,
        upsert: bool,
        now: u64,
    ) -> Result<Vec<ReplicaDesc>> {
        check_key(key)?;
        check_put(len, cfg)?;
        let generation = self.eviction_generation.load(Ordering::Acquire);
        match self.put_start_once(client, key, len, cfg, upsert, now) {
            Err(e)
                if e.code == ErrorCode::NO_AVAILABLE_HANDLE
                    && self.segments.max_capacity() >= len =>
            {
                let need = super::allocator::aligned_len(len)
                    .unwrap_or(len)
                    .saturating_mul(cfg.replica_num as u64);
                if self.evict_for_put(need, generation, now) {
                    self.put_start_once(client, key, len, cfg, upsert, now)
                } else {
                    Err(e)
                }
            }
            r => r,
        }
    }

    fn put_start_once(
        &self,
        client: ClientId,
        key: &str,
        len: u64,
        cfg: &ReplicateConfig,
        upsert: bool,
        now: u64,
    ) -> Result<Vec<ReplicaDesc>> {
        let pins = pin_flags(cfg);
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        if let Some(obj) = shard.map.get_mut(key) {
            if let Some(p) = &obj.pending {
                if now.saturating_sub(p.started) < self.policy.discard_after {
                    return Err(if upsert {
                        Error::new(
                            ErrorCode::OBJECT_REPLICA_BUSY,
                            format!("object {key:?} has a put in flight"),
                        )
                    } else {
                        Error::new(
                            ErrorCode::OBJECT_ALREADY_EXISTS,
                            format!("object {key:?} is being written"),
                        )
                    });
                }
                // The earlier writer is a zombie: discard its put, then go on.
                self.counters.discarded_puts.fetch_add(1, Ordering::Relaxed);
                if self.discard_pending(obj, None, now) {
                    shard.map.remove(key);
                }
            }
        }
        if let Some(obj) = shard.map.get_mut(key) {
            if !upsert {
                return Err(Error::new(
                    ErrorCode::OBJECT_ALREADY_EXISTS,
                    format!("object {key:?} exists"),
                ));
            }
            let descs = if obj.size == len
                && !obj.is_leased(now)
                && obj
                    .replicas
                    .as_slice()
                    .iter()
                    .all(|p| p.segment.is_mounted())
            {
                obj.flags = pins;
                obj.pending = Some(Box::new(PendingPut {
                    client,
                    started: now,
                    kind: PendingKind::InPlace,
                }));
                obj.replicas.descriptors(len, ReplicaStatus::Processing)
            } else {
                let replicas = Replicas::from_vec(self.place(len, cfg)?);
                let descs = replicas.descriptors(len, ReplicaStatus::Processing);
                let kind = PendingKind::Replacing {
                    replicas,
                    size: len,
                    flags: pins,
                };
                obj.pending = Some(Box::new(PendingPut {
                    client,
                    started: now,
                    kind,
                }));
                descs
            };
            shard.note_pending(now);
            return Ok(descs);
        }
        let replicas = Replicas::from_vec(self.place(len, cfg)?);
        let descs = replicas.descriptors(len, ReplicaStatus::Processing);
        let obj = ObjectMeta {
            size: len,
            lease_until: 0,
            soft_pin_until: 0,
            replicas,
            pending: Some(Box::new(PendingPut {
                client,
                started: now,
                kind: PendingKind::Fresh,
            })),
            flags: pins,
        };
        shard.map.insert(key.into(), obj);
        shard.note_pending(now);
        Ok(descs)
    }

    fn place(&self, len: u64, cfg: &ReplicateConfig) -> Result<Vec<Placement>> {
        self.segments
            .place(len, cfg, self.policy.strategy)
            .inspect_err(|e| {
                if e.code == ErrorCode::NO_AVAILABLE_HANDLE {
                    self.need_eviction.store(true, Ordering::Relaxed);
                }
            })
    }

    /// Marks the put complete: the object becomes readable.
    pub fn put_end(&self, client: ClientId, key: &str, now: u64) -> Result<()> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        let obj = shard.map.get_mut(key).ok_or_else(|| not_found(key))?;
        match &obj.pending {
            // Already complete: a repeated PutEnd is harmless.
            None => return Ok(()),
            Some(p) if matches!(p.kind, PendingKind::Replicating { .. }) => {
                return Err(Error::new(
                    ErrorCode::OBJECT_HAS_REPLICATION_TASK,
                    format!("object {key:?} is being replicated, not written"),
                ))
            }
            Some(p) if p.client != client => {
                return Err(Error::new(
                    ErrorCode::ILLEGAL_CLIENT,
                    format!("object {key:?} is being written by another client"),
                ))
            }
            Some(_) => {}
        }
        let pending = obj.pending.take().expect("checked above");
        match pending.kind {
            PendingKind::Fresh | PendingKind::InPlace => obj.flags |= flags::COMPLETE,
            PendingKind::Replacing {
                replicas,
                size,
                flags: pins,
            } => {
                let old = std::mem::replace(&mut obj.replicas, replicas);
                let old_size = std::mem::replace(&mut obj.size, size);
                // Readers holding a lease may still copy the old bytes.
                self.release(&old, old_size, obj.lease_until, now);
                obj.flags = pins | flags::COMPLETE;
                obj.lease_until = now;
                obj.soft_pin_until = 0;
            }
            PendingKind::Replicating { .. } => unreachable!("refused above"),
        }
        self.policy.lease.on_write(obj, now);
        Ok(())
    }

    /// Abandons a put: the object (or, for an upsert, the new version) is
    /// dropped and its space freed.
    pub fn put_revoke(&self, client: ClientId, key: &str, _now: u64) -> Result<()> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let obj = shard.map.get_mut(key).ok_or_else(|| not_found(key))?;
        match &obj.pending {
            None => {
                return Err(Error::new(
                    ErrorCode::INVALID_WRITE,
                    format!("object {key:?} has no put in flight"),
                ))
            }
            Some(p) if matches!(p.kind, PendingKind::Replicating { .. }) => {
                return Err(Error::new(
                    ErrorCode::OBJECT_HAS_REPLICATION_TASK,
                    format!("object {key:?} is being replicated, not written"),
                ))
            }
            Some(p) if p.client != client => {
                return Err(Error::new(
                    ErrorCode::ILLEGAL_CLIENT,
                    format!("object {key:?} is being written by another client"),
                ))
            }
            Some(_) => {}
        }
        let pending = obj.pending.take().expect("checked above");
        match pending.kind {
            PendingKind::Fresh | PendingKind::InPlace => {
                free_now(&obj.replicas, obj.size);
                shard.map.remove(key);
            }
            PendingKind::Replacing { replicas, size, .. } => free_now(&replicas, size),
            PendingKind::Replicating { .. } => unreachable!("refused above"),
        }
        Ok(())
    }

    /// Ends a put in flight without its writer. Its space is freed at
    /// `free_at` (default: PutStart + release timeout, since the writer may
    /// still be writing). Returns true when the object itself must go.
    pub(super) fn discard_pending(
        &self,
        obj: &mut ObjectMeta,
        free_at: Option<u64>,
        now: u64,
    ) -> bool {
        let Some(p) = obj.pending.take() else {
            return false;
        };
        let free_at =
            free_at.unwrap_or_else(|| p.started.saturating_add(self.policy.release_after));
        match p.kind {
            PendingKind::Fresh | PendingKind::InPlace => {
                self.release(&obj.replicas, obj.size, free_at, now);
                true
            }
            PendingKind::Replacing { replicas, size, .. } => {
                self.release(&replicas, size, free_at, now);
                false
            }
            PendingKind::Replicating { replicas, .. } => {
                self.release(&replicas, obj.size, free_at, now);
                false
            }
        }
    }

    /// Frees the space of an object leaving the map (with `force`, even while
    /// leased); space a writer may still touch is retired instead.
    pub(super) fn release_object(&self, obj: &mut ObjectMeta, now: u64) {
        if obj.pending.is_some() {
            let complete = obj.is_complete();
            self.discard_pending(obj, None, now);
            if !complete {
                return;
            }
        }
        free_now(&obj.replicas, obj.size);
    }

    /// Frees replicas now, or at `free_at` if that is later.
    pub(super) fn release(&self, replicas: &Replicas, size: u64, free_at: u64, now: u64) {
        if free_at <= now {
            free_now(replicas, size);
            return;
        }
        let mut retired = self.retired.lock();
        for p in replicas.as_slice() {
            retired.push(Retired {
                free_at,
                placement: p.clone(),
                size,
            });
        }
    }

    /// Frees retired space whose time has come; returns how many ranges.
    pub(super) fn free_retired(&self, now: u64) -> usize {
        let due: Vec<Retired> = {
            let mut retired = self.retired.lock();
            if retired.iter().all(|r| r.free_at > now) {
                return 0;
            }
            let (due, keep) = std::mem::take(&mut *retired)
                .into_iter()
                .partition(|r| r.free_at <= now);
            *retired = keep;
            due
        };
        for r in &due {
            r.placement.segment.free(r.placement.offset, r.size);
        }
        due.len()
    }

    /// Allocated bytes waiting in the retired list (on mounted segments).
    pub fn retired_bytes(&self) -> u64 {
        let retired = self.retired.lock();
        let live = retired.iter().filter(|r| r.placement.segment.is_mounted());
        live.map(|r| super::allocator::aligned_len(r.size).unwrap_or(r.size))
            .sum()
    }

    // ---- reads ------------------------------------------------------------

    /// The complete replicas of `key`; grants the read lease.
    pub fn get_replica_list(&self, key: &str, now: u64) -> Result<GetReplicaListResponse> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        let obj = shard.map.get_mut(key).ok_or_else(|| not_found(key))?;
        if !obj.is_complete() {
            return Err(not_ready(key));
        }
        let replicas: Vec<ReplicaDesc> = obj
            .replicas
            .as_slice()
            .iter()
            .filter(|p| p.segment.is_mounted())
            .map(|p| {
                p.segment
                    .descriptor(p.offset, obj.size, ReplicaStatus::Complete)
            })
            .collect();
        if replicas.is_empty() {
            return Err(not_found(key));
        }
        self.policy.lease.on_read(obj, now);
        Ok(GetReplicaListResponse {
            replicas,
            lease_ttl_ms: self.policy.lease.lease_ttl,
        })
    }

    /// Whether a complete object exists (a put in flight does not count).
    /// Like every metadata read in the reference, a hit grants the lease.
    pub fn exist_key(&self, key: &str, now: u64) -> Result<bool> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        match shard.map.get_mut(key) {
            Some(obj) if obj.is_complete() => {
                self.policy.lease.on_read(obj, now);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Size of a complete object; grants the lease.
    pub fn get_size(&self, key: &str, now: u64) -> Result<u64> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        let obj = shard.map.get_mut(key).ok_or_else(|| not_found(key))?;
        if !obj.is_complete() {
            return Err(not_ready(key));
        }
        self.policy.lease.on_read(obj, now);
        Ok(obj.size)
    }

    /// Replicas of a complete object, without granting a lease (admin queries).
    pub fn query_key(&self, key: &str) -> Result<Vec<ReplicaDesc>> {
        check_key(key)?;
        let shard = self.objects.lock(key);
        let obj = shard.map.get(key).ok_or_else(|| not_found(key))?;
        if !obj.is_complete() {
            return Err(not_ready(key));
        }
        Ok(obj.replicas.descriptors(obj.size, ReplicaStatus::Complete))
    }

    /// Every complete object's key.
    pub fn all_keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        for i in 0..SHARDS {
            let shard = self.objects.lock_shard(i);
            keys.extend(
                shard
                    .map
                    .iter()
                    .filter(|(_, o)| o.is_complete())
                    .map(|(k, _)| k.to_string()),
            );
        }
        keys
    }

    // ---- removal ----------------------------------------------------------

    /// Removes an object. Without `force`, a leased or hard-pinned object is
    /// `OBJECT_HAS_LEASE` and one being written is `REPLICA_IS_NOT_READY`.
    pub fn remove(&self, key: &str, force: bool, now: u64) -> Result<()> {
        check_key(key)?;
        let mut shard = self.objects.lock(key);
        let now = shard.clock(now);
        let obj = shard.map.get_mut(key).ok_or_else(|| not_found(key))?;
        if !force {
            if !obj.is_complete() {
                return Err(not_ready(key));
            }
            if obj.is_leased(now) {
                return Err(Error::new(
                    ErrorCode::OBJECT_HAS_LEASE,
                    format!("object {key:?} is leased by a reader"),
                ));
            }
            if obj
                .pending
                .as_ref()
                .is_some_and(|p| matches!(p.kind, PendingKind::Replicating { .. }))
            {
                return Err(Error::new(
                    ErrorCode::OBJECT_HAS_REPLICATION_TASK,
                    format!("object {key:?} is being replicated"),
                ));
            }
            if obj.is_hard_pinned() {
                return Err(Error::new(
                    ErrorCode::OBJECT_HAS_LEASE,
                    format!("object {key:?} is hard-pinned"),
                ));
            }
        }
        self.release_object(obj, now);
        shard.map.remove(key);
        Ok(())
    }

    /// Removes every complete object whose key matches `pattern` and that
    /// `remove` would accept; returns how many.
    pub fn remove_by_regex(&self, pattern: &str, force: bool, now: u64) -> Result<u64> {
        let re = regex::RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| {
                Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("bad regex {pattern:?}: {e}"),
                )
            })?;
        Ok(self.remove_where(now, |key, obj| {
            re.is_match(key)
                && obj.is_complete()
                && (force || (!obj.is_leased(now) && !obj.is_hard_pinned()))
        }))
    }

    /// Removes every complete object (hard-pinned ones too); leased ones only
    /// with `force`. Returns how many.
    pub fn remove_all(&self, force: bool, now: u64) -> u64 {
        self.remove_where(now, |_, obj| {
            obj.is_complete() && (force || !obj.is_leased(now))
        })
    }

    fn remove_where(&self, now: u64, pred: impl Fn(&str, &ObjectMeta) -> bool) -> u64 {
        let mut n = 0;
        for i in 0..SHARDS {
            let mut shard = self.objects.lock_shard(i);
            shard.map.retain(|key, obj| {
                if !pred(key, obj) {
                    return true;
                }
                self.release_object(obj, now);
                n += 1;
                false
            });
        }
        n
    }

    /// Clears replicas of unleased complete objects: those on `segment_name`,
    /// or the whole object when it is empty. Returns the keys cleared.
    pub fn batch_replica_clear(&self, keys: &[&str], segment_name: &str, now: u64) -> Vec<String> {
        let mut cleared = Vec::new();
        for &key in keys {
            if check_key(key).is_err() {
                continue;
            }
            let mut shard = self.objects.lock(key);
            let now = shard.clock(now);
            let Some(obj) = shard.map.get_mut(key) else {
                continue;
            };
            if !obj.is_complete() || obj.pending.is_some() || obj.is_leased(now) {
                continue;
            }
            if segment_name.is_empty() {
                self.release_object(obj, now);
                shard.map.remove(key);
                cleared.push(key.to_string());
                continue;
            }
            let size = obj.size;
            let mut dropped = false;
            obj.replicas.retain(
                |p| p.segment.info.name != segment_name,
                |p| {
                    p.segment.free(p.offset, size);
                    dropped = true;
                },
            );
            if dropped {
                if obj.replicas.is_empty() {
                    shard.map.remove(key);
                }
                cleared.push(key.to_string());
            }
        }
        cleared
    }

    // ---- segments and clients ---------------------------------------------

    /// Heartbeat. `CLIENT_NOT_FOUND` when the client was unknown (first
    /// contact, expired, or master restarted): it is registered now and
    /// should mount its segments again.
    pub fn ping(&self, client: ClientId, now: u64) -> Result<()> {
        let mut clients = self.clients.lock();
        match clients.get_mut(&client) {
            Some(c) => {
                c.last_seen = now;
                Ok(())
            }
            None => {
                clients.insert(client, ClientState::new(now));
                Err(Error::new(
                    ErrorCode::CLIENT_NOT_FOUND,
                    "client was not registered; remount its segments",
                ))
            }
        }
    }

    pub fn mount_segment(&self, client: ClientId, seg: &SegmentInfo, now: u64) -> Result<()> {
        let mounted = self.segments.mount(client, seg)?;
        let mut clients = self.clients.lock();
        let state = clients
            .entry(client)
            .or_insert_with(|| ClientState::new(now));
        state.last_seen = now;
        if mounted.is_some() {
            state.segments.push(seg.name.clone());
        }
        Ok(())
    }

    /// Unmounts one of the client's segments; objects with replicas there
    /// lose them (and are dropped when none is left).
    pub fn unmount_segment(&self, client: ClientId, name: &str, now: u64) -> Result<()> {
        let seg = self.segments.get(name).ok_or_else(|| {
            Error::new(
                ErrorCode::SEGMENT_NOT_FOUND,
                format!("segment {name:?} is not mounted"),
            )
        })?;
        if seg.owner != client {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!("segment {name:?} belongs to another client"),
            ));
        }
        self.segments.unmount(name, Some(client));
        if let Some(state) = self.clients.lock().get_mut(&client) {
            state.segments.retain(|s| s != name);
            state.last_seen = now;
        }
        self.drop_unmounted(&[], now);
        Ok(())
    }

    pub fn segment_summaries(&self) -> Vec<SegmentSummary> {
        let mut v: Vec<SegmentSummary> = self
            .segments
            .all()
            .iter()
            .map(|s| SegmentSummary {
                name: s.info.name.clone(),
                endpoint: s.info.transport_endpoint.clone(),
                base: s.info.base,
                used: s.used(),
                capacity: s.capacity(),
                owner: s.owner,
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn stats(&self, now: u64) -> MasterStats {
        let (allocated_bytes, capacity_bytes) = self.segments.usage();
        let mut s = MasterStats {
            allocated_bytes,
            capacity_bytes,
            segment_count: self.segments.all().len() as u64,
            active_clients: self.clients.lock().len() as u64,
            ..Default::default()
        };
        for i in 0..SHARDS {
            let shard = self.objects.lock_shard(i);
            for obj in shard.map.values() {
                if obj.is_complete() {
                    s.key_count += 1;
                }
                if obj.pending.is_some() {
                    s.pending_puts += 1;
                }
                if obj.is_soft_pinned(now) {
                    s.soft_pin_key_count += 1;
                }
                if obj.is_hard_pinned() {
                    s.hard_pin_key_count += 1;
                }
            }
        }
        s
    }

    // ---- time ---------------------------------------------------------------

    /// Runs the timers: client expiry, put timeouts, delayed frees, eviction.
    pub fn tick(&self, now: u64) -> TickReport {
        let mut r = TickReport {
            expired_clients: self.expire_clients(now),
            ..Default::default()
        };
        r.discarded_puts = self.sweep_stale_puts(now);
        r.freed_retired = self.free_retired(now);
        r.failed_tasks = self.expire_tasks(now);
        let (keys, bytes) = self.evict_if_needed(now);
        r.evicted_keys = keys;
        r.evicted_bytes = bytes;
        r
    }

    /// Discards puts in flight for longer than the discard timeout.
    fn sweep_stale_puts(&self, now: u64) -> usize {
        let discard_after = self.policy.discard_after;
        let mut n = 0;
        for i in 0..SHARDS {
            let mut shard = self.objects.lock_shard(i);
            if shard.oldest_pending.saturating_add(discard_after) > now {
                continue;
            }
            let mut oldest = u64::MAX;
            shard.map.retain(|_, obj| {
                let Some(p) = &obj.pending else { return true };
                if now.saturating_sub(p.started) < discard_after {
                    oldest = oldest.min(p.started);
                    return true;
                }
                n += 1;
                !self.discard_pending(obj, None, now)
            });
            shard.oldest_pending = oldest;
        }
        self.counters
            .discarded_puts
            .fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    // ---- the RPC surface --------------------------------------------------

    /// Serves one decoded request.
    pub fn handle(&self, req: Request<'_>, now: u64) -> Response {
        use Request as Q;
        use Response as A;
        let mismatch = |a: usize, b: usize| A::Failed {
            error: Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("{a} keys but {b} value lengths"),
            ),
        };
        match req {
            Q::Ping { client_id } => A::Unit {
                result: self.ping(client_id, now),
            },
            Q::MountSegment { client_id, segment } => A::Unit {
                result: self.mount_segment(client_id, &segment, now),
            },
            Q::UnmountSegment { client_id, name } => A::Unit {
                result: self.unmount_segment(client_id, name, now),
            },
            Q::PutStart {
                client_id,
                key,
                value_len,
                config,
                upsert,
            } => A::Replicas {
                result: self.put_start(client_id, key, value_len, &config, upsert, now),
            },
            Q::BatchPutStart {
                client_id,
                keys,
                value_lens,
                config,
                upsert,
            } => {
                if keys.len() != value_lens.len() {
                    return mismatch(keys.len(), value_lens.len());
                }
                let results = keys
                    .iter()
                    .zip(&value_lens)
                    .map(|(k, &len)| self.put_start(client_id, k, len, &config, upsert, now))
                    .collect();
                A::BatchReplicas { results }
            }
            Q::PutEnd { client_id, key } => A::Unit {
                result: self.put_end(client_id, key, now),
            },
            Q::BatchPutEnd { client_id, keys } => A::Units {
                results: keys
                    .iter()
                    .map(|k| self.put_end(client_id, k, now))
                    .collect(),
            },
            Q::PutRevoke { client_id, key } => A::Unit {
                result: self.put_revoke(client_id, key, now),
            },
            Q::BatchPutRevoke { client_id, keys } => A::Units {
                results: keys
                    .iter()
                    .map(|k| self.put_revoke(client_id, k, now))
                    .collect(),
            },
            Q::GetReplicaList { key } => A::ReplicaList {
                result: self.get_replica_list(key, now),
            },
            Q::BatchGetReplicaList { keys } => A::BatchReplicaList {
                results: keys.iter().map(|k| self.get_replica_list(k, now)).collect(),
            },
            Q::ExistKey { key } => A::Bool {
                result: self.exist_key(key, now),
            },
            Q::BatchExistKey { keys } => A::Bools {
                results: keys.iter().map(|k| self.exist_key(k, now)).collect(),
            },
            Q::GetSize { key } => A::Count {
                result: self.get_size(key, now),
            },
            Q::Remove { key, force } => A::Unit {
                result: self.remove(key, force, now),
            },
            Q::BatchRemove { keys, force } => A::Units {
                results: keys.iter().map(|k| self.remove(k, force, now)).collect(),
            },
            Q::RemoveByRegex { pattern, force } => A::Count {
                result: self.remove_by_regex(pattern, force, now),
            },
            Q::BatchReplicaClear {
                keys, segment_name, ..
            } => A::Keys {
                result: Ok(self.batch_replica_clear(&keys, segment_name, now)),
            },
            Q::CreateCopyTask { key, targets } => A::Task {
                result: self.create_copy_task(key, &targets, now),
            },
            Q::CreateMoveTask {
                key,
                source,
                target,
            } => A::Task {
                result: self.create_move_task(key, source, target, now),
            },
            Q::QueryTask { id } => A::TaskState {
                result: self.query_task(id),
            },
            Q::FetchTasks { client_id, max } => A::Tasks {
                result: Ok(self.fetch_tasks(client_id, max, now)),
            },
            Q::MarkTaskComplete {
                client_id,
                id,
                success,
                message,
            } => A::Unit {
                result: self.mark_task_complete(client_id, id, success, message, now),
            },
            Q::ReplicaTransferStart {
                client_id,
                key,
                source,
                targets,
            } => A::Replicas {
                result: self.replica_transfer_start(client_id, key, source, &targets, now),
            },
            Q::ReplicaTransferEnd { client_id, key } => A::Unit {
                result: self.replica_transfer_end(client_id, key, now),
            },
            Q::ReplicaTransferRevoke { client_id, key } => A::Unit {
                result: self.replica_transfer_revoke(client_id, key),
            },
            Q::RemoveAll { force } => A::Count {
                result: Ok(self.remove_all(force, now)),
            },
        }
    }
}
