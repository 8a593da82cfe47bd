//! `MasterService`: the master's state machine. It does no I/O and reads no
//! clock: every call takes `now` (milliseconds on a monotonic clock), so
//! tests drive time by hand.
//!
//! # Decide, then apply
//!
//! Every call that changes state runs in two steps:
//!
//! 1. **Decide** (leader only): check the request, read leases and the
//!    clock, choose placements (reserving their ranges in the segments'
//!    allocators) and victims, and express the outcome as
//!    [`Mutation`](super::mutation::Mutation)s;
//! 2. **Apply** (`apply.rs`, the same on a leader and a standby): change
//!    the tables as each mutation says, reading nothing else that differs
//!    between them.
//!
//! Both steps run under the lock of what the call touches, so a decision
//! still holds when it is applied. Every apply function hands its mutation
//! to the [`MutationSink`](super::mutation::MutationSink) first
//! (`MasterService::observe`): the one place where an operation log
//! records the leader's mutations. A standby applies them with
//! `MasterService::replay`.
//!
//! Reads (`get_replica_list`, `exist_key`, `get_size`) and heartbeats only
//! change volatile state: read leases, soft-pin deadlines and the time a
//! client was last heard from. No mutation carries those; what a decision
//! read from them travels in the mutation it made.
//!
//! The tables are `objects` (sharded object map), `segments` (mounted
//! segments and their allocators), `clients` (liveness), `tasks` (copy and
//! move tasks) and `retired` (space freed later); `eviction` schedules
//! rounds and ranks victims. Only this module composes effects across
//! tables, e.g. an unmount drops the segment, then the replicas there, then
//! the puts in flight that lost a target.
//!
//! # Lock order
//!
//! Object shard → one segment's allocator (the segment table is a lock-free
//! snapshot; its writer lock is taken alone, or before a segment's
//! allocator); eviction round → object shards; task table → client table.
//! The retired list, the client table and the hot-key table are leaves,
//! and a sink runs under these locks and must take none of them.

mod apply;
mod drain;
mod events;
mod files;
mod handle;
mod hotkeys;
mod mounts;
mod offload;
mod placement;
mod put;
mod read;
mod remove;
mod replay;
mod reserve;
mod tenants;
#[cfg(test)]
pub(in crate::master) mod tests;
mod tick;
mod transfer;
mod unserved;

pub use handle::Answer;

use std::sync::atomic::{AtomicU64, Ordering};

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;

use super::clients::ClientTable;
use super::eviction::Eviction;
use super::fs_tier::FileTier;
use super::mutation::MutationSink;
use super::objects::{flags, ObjectMap};
use super::retired::RetiredSpace;
use super::segments::SegmentTable;
use super::ssd_tier::DiskTable;
use super::tasks::TaskTable;
use crate::master::config::policy::{OffloadPolicy, Policy, TaskPolicy};
use crate::master::config::MasterConfig;
use crate::types::{ClientId, ReplicaPolicy, MAX_KEY_LEN, MAX_REPLICA_NUM, MAX_VALUE_LEN};

/// Event counters (monotonic).
#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub eviction_rounds: AtomicU64,
    pub eviction_rounds_freeing: AtomicU64,
    pub evicted_keys: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub discarded_puts: AtomicU64,
    /// Discarded puts whose staging space was freed.
    pub released_puts: AtomicU64,
    pub expired_clients: AtomicU64,
    pub evict_disk_replica_requests: AtomicU64,
    pub evict_disk_replica_failures: AtomicU64,
    pub promotion_admitted: AtomicU64,
    pub promotion_rejected_frequency: AtomicU64,
    pub promotion_rejected_cap: AtomicU64,
    pub promotion_rejected_watermark: AtomicU64,
    pub promotion_completed: AtomicU64,
    pub promotion_completed_bytes: AtomicU64,
    pub promotion_failed: AtomicU64,
    /// Hot keys admitted (read at the admission rate within a window).
    pub hot_key_admissions: AtomicU64,
    /// Copy tasks queued for hot keys.
    pub hot_key_fan_outs: AtomicU64,
    /// Extra replicas taken back (cooling or memory pressure).
    pub hot_key_replicas_dropped: AtomicU64,
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
    /// Unique for the master's lifetime (a name can be mounted again).
    pub id: u32,
    pub name: String,
    pub endpoint: String,
    pub base: u64,
    pub used: u64,
    pub capacity: u64,
    pub owner: ClientId,
    /// `OK`, `DRAINING` or `DRAINED`.
    pub status: &'static str,
}

pub struct MasterService {
    policy: Policy,
    task_policy: TaskPolicy,
    pub(in crate::master::state) segments: SegmentTable,
    pub(in crate::master::state) objects: ObjectMap,
    pub(in crate::master::state) clients: Mutex<ClientTable>,
    pub(in crate::master::state) tasks: Mutex<TaskTable>,
    pub(in crate::master::state) retired: RetiredSpace,
    /// The storage clients' SSD tiers and the copies in them.
    pub(in crate::master::state) disk: DiskTable,
    offload: OffloadPolicy,
    /// The shared-filesystem tier's writers and writes in flight.
    pub(in crate::master::state) files: FileTier,
    eviction: Eviction,
    counters: Counters,
    /// Wall-clock ms at `now == 0`, for task timestamps (set by the server).
    epoch_offset_ms: AtomicU64,
    /// Sees every applied mutation (see the module docs).
    sink: Option<Box<dyn MutationSink>>,
    /// Puts go to reserved space and are answered before their entries
    /// are committed (a replicated leader, `segments::space`).
    fence: bool,
    /// Where the leader's KV events go (`events`), when enabled.
    kv_events: Option<crate::master::events::Publisher>,
    /// Multi-tenant mode (`--enable_multi_tenants`): quotas and charges.
    pub(in crate::master::state) tenants: Option<super::tenants::TenantTable>,
    /// Hot keys and their extra memory replicas.
    hot: hotkeys::HotKeys,
}

impl MasterService {
    pub fn new(config: &MasterConfig) -> Self {
        Self::with_policy(config.policy())
            .with_task_policy(config.task_policy())
            .with_offload_policy(config.offload_policy())
            .with_metadata_budget(config.max_metadata_bytes)
            .with_metadata_watermark(config.metadata_eviction_watermark_ratio)
            .with_suspect_after(config.suspect_after())
            .with_segment_ramp(config.segment_ramp())
            .with_file_policy(config.file_policy())
            .with_tenants_of(config)
            .with_hot_key_policy(config.hot_key_policy())
    }

    /// Caps what objects' metadata may cost (key bytes plus a fixed
    /// overhead each): a put of a new key past it fails with
    /// `NO_AVAILABLE_HANDLE`. Unlimited by default.
    pub fn with_metadata_budget(self, bytes: u64) -> Self {
        self.objects.set_metadata_limit(bytes);
        self
    }

    /// Evicts objects, oldest first, once their metadata reaches `ratio` of
    /// the budget (set the budget first; 0: never), so the master makes
    /// room before puts of new keys are refused and before it runs out of
    /// memory.
    pub fn with_metadata_watermark(self, ratio: f64) -> Self {
        let limit = self.objects.metadata_limit();
        if ratio > 0.0 && limit != u64::MAX {
            self.objects
                .set_metadata_watermark((ratio * limit as f64) as u64);
        }
        self
    }

    /// Bytes of object metadata held, as the budget counts them.
    /// After a restore: owners may be gone since, so every restored client
    /// gets a full TTL from `now` to come back, and its segments are served
    /// only once it is heard from.
    pub(crate) fn await_owners(&self, now: u64) {
        self.clients.lock().touch_all(now);
        self.segments.unverify_all();
    }

    pub fn metadata_bytes(&self) -> u64 {
        self.objects.metadata_bytes()
    }

    pub fn with_policy(policy: Policy) -> Self {
        MasterService {
            policy,
            task_policy: TaskPolicy::default(),
            segments: SegmentTable::default(),
            objects: ObjectMap::default(),
            clients: Mutex::new(ClientTable::default()),
            tasks: Mutex::new(TaskTable::default()),
            retired: RetiredSpace::default(),
            disk: DiskTable::default(),
            offload: OffloadPolicy::default(),
            files: FileTier::default(),
            eviction: Eviction::default(),
            counters: Counters::default(),
            epoch_offset_ms: AtomicU64::new(0),
            sink: None,
            fence: false,
            kv_events: None,
            tenants: None,
            hot: hotkeys::HotKeys::default(),
        }
    }

    pub fn with_task_policy(mut self, task_policy: TaskPolicy) -> Self {
        self.task_policy = task_policy;
        self
    }

    /// Hands every mutation this master applies to `sink` (before it takes
    /// effect, in an order a standby can replay).
    pub(crate) fn with_sink(mut self, sink: Box<dyn MutationSink>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Places puts in reserved space, answered before their entries are
    /// committed (`segments::space`): for a sink that logs. Unless the
    /// policy turns the fence off (every PutStart then waits for its own
    /// entry, to measure what the fence saves).
    pub(crate) fn with_put_fence(mut self) -> Self {
        self.fence = self.policy.put_fence;
        self
    }

    /// Sets the wall-clock time (ms since the epoch) that `now == 0` stands
    /// for; task timestamps are reported in wall-clock time.
    pub fn set_epoch_offset(&self, epoch_ms_at_zero: u64) {
        self.epoch_offset_ms
            .store(epoch_ms_at_zero, Ordering::Relaxed);
    }

    /// A standby takes over at `now`: the volatile state its leader kept
    /// is assumed at its most cautious. Every known client counts as just
    /// heard from (none expires before it could reach the new leader), and
    /// every object as read just now (a lease the old leader granted is
    /// honoured: no removal or eviction within a lease TTL).
    pub(crate) fn take_over(&self, now: u64) {
        self.clients.lock().touch_all(now);
        let until = now.saturating_add(self.policy.lease.lease_ttl);
        for mut shard in self.objects.shards() {
            shard.raise_leases(until);
        }
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }
}

/// A master key: the caller's part (after its tenant) is checked.
fn check_key(key: &str) -> Result<()> {
    let key = crate::tenant::split(key).1;
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

fn check_put(len: u64, cfg: &ReplicaPolicy) -> Result<()> {
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

fn pin_flags(cfg: &ReplicaPolicy) -> u8 {
    let mut f = 0;
    if cfg.with_hard_pin {
        f |= flags::HARD_PIN;
    }
    if cfg.with_soft_pin {
        f |= flags::SOFT_PIN;
    }
    f
}
