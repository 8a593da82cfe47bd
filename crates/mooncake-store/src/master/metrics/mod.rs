//! Prometheus metrics with the reference's names, types and meanings.
//!
//! Per-call counters are bumped on the RPC path (one atomic add each);
//! gauges (capacity, keys, clients) are read from the state machine when
//! `/metrics` is scraped, and event counters kept by the state machine are
//! copied over at the same time. Families of subsystems that feed their own
//! numbers (HA log, file tier, promotion) live in [`tiers`].

mod ops;
mod summary;
pub mod tenants;
pub mod tiers;

use std::sync::atomic::Ordering;

use parking_lot::Mutex;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use ops::{BatchCounters, OpCounters};
pub use ops::{BatchOp, Op};
use tiers::{FileTierMetrics, HaMetrics, HotKeyMetrics, NofMetrics, PromotionMetrics};

use super::durable::snapshot::RestoreProgress;
use super::state::service::{MasterService, MasterStats};
use crate::proto::{Request, Response};
use crate::types::{GetReplicaListResponse, ReplicaKind};

/// Bucket bounds of `master_value_size_bytes`, as the reference prints them.
const VALUE_SIZE_BUCKETS: [f64; 9] = [
    4096.0,
    65536.0,
    262144.0,
    1048576.0,
    4194304.0,
    16777216.0,
    67108864.0,
    268435456.0,
    1073741824.0,
];

/// Counters the reference names without `_total`. They are kept in gauges
/// (which print the bare name) and declared `counter` when rendered.
const BARE_COUNTERS: [&str; 8] = [
    "mem_cache_hit_nums_",
    "file_cache_hit_nums_",
    "valid_get_nums_",
    "total_get_nums_",
    "master_evicted_key_count",
    "master_evicted_size_bytes",
    "master_put_start_discard_cnt",
    "master_put_start_release_cnt",
];

type Labels = Vec<(String, String)>;

/// What a request is counted as, decided before it is served.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    single: Option<Op>,
    /// The copy or move family of a replica transfer.
    transfer: Option<Op>,
    batch: Option<BatchOp>,
    /// Replicas asked for by a put (to spot partial allocations).
    wanted_replicas: usize,
}

/// Reads served by tier, from `GetReplicaList` answers.
#[derive(Default)]
struct ReadHits {
    total: Gauge,
    valid: Gauge,
    mem_hits: Gauge,
    mem_bytes: Counter,
    file_hits: Gauge,
    file_bytes: Counter,
}

pub struct MasterMetrics {
    registry: Registry,
    singles: Vec<OpCounters>,
    batches: Vec<BatchCounters>,
    value_size: Histogram,
    allocated: Gauge,
    capacity: Gauge,
    keys: Gauge,
    soft_pinned: Gauge,
    clients: Gauge,
    mem_cached_values: Gauge,
    segment_allocated: Family<Labels, Gauge>,
    segment_capacity: Family<Labels, Gauge>,
    reads: ReadHits,
    malformed: Counter,
    alloc_failures: Counter,
    partial_allocations: Counter,
    // Copies of the state machine's event counters.
    attempted_evictions: Counter,
    successful_evictions: Counter,
    evicted_keys: Gauge,
    evicted_bytes: Gauge,
    discarded_puts: Gauge,
    released_puts: Gauge,
    discarded_staging: Gauge,
    expired_clients: Counter,
    leader: Gauge,
    /// Fed by the HA replication log.
    pub ha: HaMetrics,
    /// Fed by the file (SSD / DFS) tier.
    pub file_tier: FileTierMetrics,
    /// Fed by promotion from the local disk tier.
    pub promotion: PromotionMetrics,
    /// Fed by the hot-key fan-out.
    pub hot_keys: HotKeyMetrics,
    nof: NofMetrics,
    snapshots_ok: Counter,
    snapshots_failed: Counter,
    /// Fed by the restore at start (`snapshot::restore`).
    pub(crate) restore: RestoreProgress,
    /// Counts at the previous summary, for its per-second rates.
    last_summary: Mutex<Option<summary::Snapshot>>,
    created: std::time::Instant,
}

impl Default for MasterMetrics {
    fn default() -> Self {
        Self::new()
    }
}

fn sync(counter: &Counter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn error_of(resp: &Response) -> Option<&mooncake_common::Error> {
    match resp {
        Response::Unit { result } => result.as_ref().err(),
        Response::Replicas { result } => result.as_ref().err(),
        Response::ReplicaList { result } => result.as_ref().err(),
        Response::Bool { result } => result.as_ref().err(),
        Response::Count { result } => result.as_ref().err(),
        Response::Task { result } => result.as_ref().err(),
        Response::TaskState { result } => result.as_ref().err(),
        Response::Tasks { result } => result.as_ref().err(),
        Response::Keys { result } => result.as_ref().err(),
        Response::Failed { error } => Some(error),
        _ => None,
    }
}

impl MasterMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let singles = ops::register_singles(&mut registry);
        let batches = ops::register_batches(&mut registry);
        let mut m = MasterMetrics {
            singles,
            batches,
            value_size: Histogram::new(VALUE_SIZE_BUCKETS.into_iter()),
            allocated: Gauge::default(),
            capacity: Gauge::default(),
            keys: Gauge::default(),
            soft_pinned: Gauge::default(),
            clients: Gauge::default(),
            mem_cached_values: Gauge::default(),
            segment_allocated: Family::default(),
            segment_capacity: Family::default(),
            reads: ReadHits::default(),
            malformed: Counter::default(),
            alloc_failures: Counter::default(),
            partial_allocations: Counter::default(),
            attempted_evictions: Counter::default(),
            successful_evictions: Counter::default(),
            evicted_keys: Gauge::default(),
            evicted_bytes: Gauge::default(),
            discarded_puts: Gauge::default(),
            released_puts: Gauge::default(),
            discarded_staging: Gauge::default(),
            expired_clients: Counter::default(),
            leader: Gauge::default(),
            ha: HaMetrics::default(),
            file_tier: FileTierMetrics::default(),
            promotion: PromotionMetrics::default(),
            hot_keys: HotKeyMetrics::default(),
            nof: NofMetrics::default(),
            snapshots_ok: Counter::default(),
            snapshots_failed: Counter::default(),
            restore: RestoreProgress::default(),
            last_summary: Mutex::new(None),
            created: std::time::Instant::now(),
            registry,
        };
        m.register_rest();
        // A master serves its HTTP port while it leads.
        m.leader.set(1);
        m
    }

    /// Whether this master leads (1) or stands by (0): `master_is_leader`.
    pub fn set_leader(&self, leads: bool) {
        self.leader.set(i64::from(leads));
    }

    fn register_rest(&mut self) {
        let r = &mut self.registry;
        let gauges: [(&str, &str, &Gauge); 16] = [
            ("master_is_leader", "1 while this master leads its cluster, 0 while it stands by", &self.leader),
            ("master_allocated_bytes", "Total memory bytes currently allocated across all segments", &self.allocated),
            ("master_total_capacity_bytes", "Total memory capacity across all mounted segments", &self.capacity),
            ("master_key_count", "Total number of keys managed by the master", &self.keys),
            ("master_soft_pin_key_count", "Total number of soft-pinned keys managed by the master", &self.soft_pinned),
            ("master_active_clients", "Total number of active clients", &self.clients),
            ("mem_cache_nums_", "Current number of cached values in the memory pool", &self.mem_cached_values),
            ("mem_cache_hit_nums_", "Total number of GetReplicaList results served from the memory pool", &self.reads.mem_hits),
            ("file_cache_hit_nums_", "Total number of GetReplicaList results served from the SSD cache", &self.reads.file_hits),
            ("valid_get_nums_", "Total number of GetReplicaList operations that returned at least one completed replica", &self.reads.valid),
            ("total_get_nums_", "Total number of GetReplicaList operations", &self.reads.total),
            ("master_evicted_key_count", "Total number of keys evicted", &self.evicted_keys),
            ("master_evicted_size_bytes", "Total bytes of evicted objects", &self.evicted_bytes),
            ("master_put_start_discard_cnt", "Total number of discarded PutStart operations", &self.discarded_puts),
            ("master_put_start_release_cnt", "Total number of released PutStart operations", &self.released_puts),
            ("master_put_start_discarded_staging_size", "Total size of memory replicas in discarded but not yet released PutStart operations", &self.discarded_staging),
        ];
        for (name, help, g) in gauges {
            r.register(name, help, g.clone());
        }
        let counters: [(&str, &str, &Counter); 10] = [
            ("mem_cache_hit_bytes", "Total bytes of GetReplicaList results served from the memory pool", &self.reads.mem_bytes),
            ("file_cache_hit_bytes", "Total bytes of GetReplicaList results served from the SSD cache", &self.reads.file_bytes),
            ("master_put_start_alloc_failures", "Total number of PutStart requests that failed to allocate space", &self.alloc_failures),
            ("master_put_start_partial_allocations", "Total number of PutStart requests that succeeded with fewer replicas than requested (best-effort degradation)", &self.partial_allocations),
            ("master_attempted_evictions", "Total number of attempted eviction operations", &self.attempted_evictions),
            ("master_successful_evictions", "Total number of successful eviction operations", &self.successful_evictions),
            ("master_malformed_requests", "Frames that did not decode", &self.malformed),
            ("master_expired_clients", "Clients dropped for missing heartbeats", &self.expired_clients),
            ("master_snapshot_successes", "Metadata snapshots written", &self.snapshots_ok),
            ("master_snapshot_failures", "Metadata snapshots that failed", &self.snapshots_failed),
        ];
        for (name, help, c) in counters {
            r.register(name, help, c.clone());
        }
        r.register(
            "master_value_size_bytes",
            "Distribution of object value sizes",
            self.value_size.clone(),
        );
        r.register(
            "segment_allocated_bytes",
            "Total memory bytes currently allocated of the segment",
            self.segment_allocated.clone(),
        );
        r.register(
            "segment_total_capacity_bytes",
            "Total memory capacity of the mounted segment",
            self.segment_capacity.clone(),
        );
        self.nof.register(r);
        self.file_tier.register(r);
        self.promotion.register(r);
        self.hot_keys.register(r);
        self.ha.register(r);
        self.restore.register(r);
    }

    fn single(&self, op: Op) -> &OpCounters {
        &self.singles[op as usize]
    }

    fn batch(&self, op: BatchOp) -> &BatchCounters {
        &self.batches[op as usize]
    }

    /// Decides what `req` counts as and records its value sizes. Called
    /// before the request is served: a transfer's end or revoke is a copy or
    /// a move depending on the transfer still in flight.
    pub fn classify(&self, svc: &MasterService, req: &Request<'_>) -> Call {
        let mut call = Call {
            single: Op::of(req),
            transfer: None,
            batch: BatchOp::of(req),
            wanted_replicas: 0,
        };
        match req {
            Request::PutStart {
                value_len, config, ..
            } => {
                self.value_size.observe(*value_len as f64);
                call.wanted_replicas = config.replica_num;
            }
            Request::BatchPutStart {
                value_lens, config, ..
            } => {
                for &len in value_lens {
                    self.value_size.observe(len as f64);
                }
                call.wanted_replicas = config.replica_num;
            }
            Request::ReplicaTransferStart { source, .. } => {
                call.transfer = Some(if source.is_empty() {
                    Op::CopyStart
                } else {
                    Op::MoveStart
                });
            }
            Request::ReplicaTransferEnd { key, .. } => {
                call.transfer =
                    svc.transfer_is_move(key)
                        .map(|mv| if mv { Op::MoveEnd } else { Op::CopyEnd });
            }
            Request::ReplicaTransferRevoke { key, .. } => {
                call.transfer =
                    svc.transfer_is_move(key).map(
                        |mv| {
                            if mv {
                                Op::MoveRevoke
                            } else {
                                Op::CopyRevoke
                            }
                        },
                    );
            }
            _ => {}
        }
        call
    }

    /// Counts one served call and its outcome.
    pub fn observe(&self, call: Call, resp: &Response) {
        for op in [call.single, call.transfer].into_iter().flatten() {
            let c = self.single(op);
            c.requests.inc();
            if error_of(resp).is_some() {
                c.failures.inc();
            }
        }
        match (call.single, resp) {
            (Some(Op::PutStart), Response::Replicas { result }) => match result {
                Ok(r) if r.len() < call.wanted_replicas => {
                    self.partial_allocations.inc();
                }
                Err(e) if e.code == mooncake_common::ErrorCode::NO_AVAILABLE_HANDLE => {
                    self.alloc_failures.inc();
                }
                _ => {}
            },
            (Some(Op::GetReplicaList), Response::ReplicaList { result }) => {
                self.observe_read(result.as_ref().ok());
            }
            (Some(Op::GetReplicaList), _) => self.observe_read(None),
            _ => {}
        }
        if let Some(op) = call.batch {
            self.observe_batch(op, call, resp);
        }
    }

    fn observe_batch(&self, op: BatchOp, call: Call, resp: &Response) {
        let c = self.batch(op);
        c.requests.inc();
        let count = |n: usize, failed: usize| (n, failed);
        let (items, failed) = match resp {
            Response::Units { results } => {
                count(results.len(), results.iter().filter(|r| r.is_err()).count())
            }
            Response::BatchReplicas { results } => {
                for r in results {
                    match r {
                        Ok(r) if r.len() < call.wanted_replicas => {
                            self.partial_allocations.inc();
                        }
                        Err(e) if e.code == mooncake_common::ErrorCode::NO_AVAILABLE_HANDLE => {
                            self.alloc_failures.inc();
                        }
                        _ => {}
                    }
                }
                count(results.len(), results.iter().filter(|r| r.is_err()).count())
            }
            Response::BatchReplicaList { results } => {
                for r in results {
                    self.observe_read(r.as_ref().ok());
                }
                count(results.len(), results.iter().filter(|r| r.is_err()).count())
            }
            Response::Bools { results } => {
                count(results.len(), results.iter().filter(|r| r.is_err()).count())
            }
            Response::Keys { result: Ok(keys) } => (keys.len(), 0),
            _ => (0, 0),
        };
        c.items.inc_by(items as u64);
        c.failed_items.inc_by(failed as u64);
        if matches!(resp, Response::Failed { .. }) || (items > 0 && failed == items) {
            c.failures.inc();
        } else if failed > 0 {
            c.partial_successes.inc();
        }
    }

    /// One `GetReplicaList` result: served from memory if it has a memory
    /// replica, else from the file tier.
    fn observe_read(&self, found: Option<&GetReplicaListResponse>) {
        self.reads.total.inc();
        let Some(found) = found.filter(|f| !f.replicas.is_empty()) else {
            return;
        };
        self.reads.valid.inc();
        let mem = found.replicas.iter().find_map(|r| match &r.kind {
            ReplicaKind::Memory(m) => Some(m.size),
            ReplicaKind::Disk(_) | ReplicaKind::LocalDisk(_) => None,
        });
        if let Some(size) = mem {
            self.reads.mem_hits.inc();
            self.reads.mem_bytes.inc_by(size);
        } else if let Some(size) = found.replicas.iter().find_map(|r| match &r.kind {
            ReplicaKind::Disk(d) => Some(d.object_size),
            ReplicaKind::LocalDisk(d) => Some(d.object_size),
            ReplicaKind::Memory(_) => None,
        }) {
            self.reads.file_hits.inc();
            self.reads.file_bytes.inc_by(size);
        }
    }

    /// Counts a frame that could not be decoded.
    pub fn observe_malformed(&self) {
        self.malformed.inc();
    }

    /// Counts a call served outside the RPC loop (e.g. by the file tier's
    /// `EvictDiskReplica` handler).
    pub fn observe_op(&self, op: Op, ok: bool) {
        let c = self.single(op);
        c.requests.inc();
        if !ok {
            c.failures.inc();
        }
    }

    /// Counts a metadata snapshot written (or not).
    pub fn observe_snapshot(&self, ok: bool) {
        if ok {
            self.snapshots_ok.inc();
        } else {
            self.snapshots_failed.inc();
        }
    }

    /// (requests, failures) of a single call.
    pub fn op_counts(&self, op: Op) -> (u64, u64) {
        let c = self.single(op);
        (c.requests.get(), c.failures.get())
    }

    /// The numbers of the status page that only the metrics know.
    pub(crate) fn status_numbers(&self) -> StatusNumbers {
        let total = |op: Op, label: &'static str, metric: &'static str| {
            (label, metric, self.single(op).requests.get())
        };
        let batch_items = |op: BatchOp, label: &'static str, metric: &'static str| {
            (label, metric, self.batch(op).items.get())
        };
        let [_, _, lag, _, _, state] = self.ha.snapshot();
        StatusNumbers {
            totals: vec![
                total(Op::PutStart, "Put", "master_put_start_requests_total"),
                batch_items(
                    BatchOp::PutStart,
                    "Batch put (keys)",
                    "master_batch_put_start_items_total",
                ),
                total(
                    Op::GetReplicaList,
                    "Get",
                    "master_get_replica_list_requests_total",
                ),
                batch_items(
                    BatchOp::GetReplicaList,
                    "Batch get (keys)",
                    "master_batch_get_replica_list_items_total",
                ),
                total(Op::ExistKey, "Exist", "master_exist_key_requests_total"),
                total(Op::Remove, "Remove", "master_remove_requests_total"),
                total(Op::Ping, "Ping", "master_ping_requests_total"),
            ],
            file_used: self.file_tier.allocated.get().max(0) as u64,
            file_capacity: self.file_tier.capacity.get().max(0) as u64,
            ha_lag: lag,
            ha_state: state,
            gets: (
                self.reads.valid.get().max(0) as u64,
                self.reads.total.get().max(0) as u64,
            ),
        }
    }

    /// Refreshes the gauges from the service.
    fn refresh(&self, svc: &MasterService, stats: &MasterStats) {
        self.allocated.set(as_i64(stats.allocated_bytes));
        self.capacity.set(as_i64(stats.capacity_bytes));
        self.keys.set(as_i64(stats.key_count));
        self.soft_pinned.set(as_i64(stats.soft_pin_key_count));
        self.clients.set(as_i64(stats.active_clients));
        // Every complete object has its memory replicas (the disk tier
        // counts its own objects in `file_cache_nums_`).
        self.mem_cached_values.set(as_i64(stats.key_count));
        self.segment_allocated.clear();
        self.segment_capacity.clear();
        for s in svc.segment_summaries() {
            let labels = vec![("segment".to_string(), s.name.clone())];
            self.segment_allocated
                .get_or_create(&labels)
                .set(as_i64(s.used));
            self.segment_capacity
                .get_or_create(&labels)
                .set(as_i64(s.capacity));
        }
        let c = svc.counters();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        sync(&self.attempted_evictions, load(&c.eviction_rounds));
        sync(&self.successful_evictions, load(&c.eviction_rounds_freeing));
        sync(&self.expired_clients, load(&c.expired_clients));
        self.evicted_keys.set(as_i64(load(&c.evicted_keys)));
        self.evicted_bytes.set(as_i64(load(&c.evicted_bytes)));
        self.discarded_puts.set(as_i64(load(&c.discarded_puts)));
        self.released_puts.set(as_i64(load(&c.released_puts)));
        self.discarded_staging
            .set(as_i64(svc.discarded_staging_bytes()));
        let (file_used, file_cap, file_values) = svc.disk_usage();
        self.file_tier.set_usage(file_used, file_cap);
        self.file_tier.set_cached_values(file_values);
        // Disk-replica evictions are counted by the service (the tier's
        // eviction calls them), so their families follow its counters.
        let evict = self.single(Op::EvictDiskReplica);
        sync(&evict.requests, load(&c.evict_disk_replica_requests));
        sync(&evict.failures, load(&c.evict_disk_replica_failures));
        let p = &self.promotion;
        p.in_flight.set(as_i64(svc.promotions_queued()));
        sync(&p.admitted, load(&c.promotion_admitted));
        sync(&p.rejected_frequency, load(&c.promotion_rejected_frequency));
        sync(&p.rejected_cap, load(&c.promotion_rejected_cap));
        sync(&p.rejected_watermark, load(&c.promotion_rejected_watermark));
        sync(&p.completed, load(&c.promotion_completed));
        sync(&p.completed_bytes, load(&c.promotion_completed_bytes));
        sync(&p.failed, load(&c.promotion_failed));
        let h = &self.hot_keys;
        let (tracked, extras) = svc.hot_key_gauges();
        h.tracked_keys.set(as_i64(tracked as u64));
        h.extra_replicas.set(as_i64(extras as u64));
        sync(&h.admitted, load(&c.hot_key_admissions));
        sync(&h.tasks, load(&c.hot_key_fan_outs));
        sync(&h.dropped, load(&c.hot_key_replicas_dropped));
    }

    /// Refreshes the gauges from the service and renders the text format.
    pub fn render(&self, svc: &MasterService, stats: &MasterStats) -> String {
        self.refresh(svc, stats);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        let tenants = tenants::render(svc);
        if !tenants.is_empty() {
            match out.strip_suffix("# EOF\n") {
                Some(head) => out = format!("{head}{tenants}# EOF\n"),
                None => out.push_str(&tenants),
            }
        }
        for name in BARE_COUNTERS {
            let from = format!("# TYPE {name} gauge\n");
            let to = format!("# TYPE {name} counter\n");
            out = out.replacen(&from, &to, 1);
        }
        out
    }
}

/// See [`MasterMetrics::status_numbers`].
pub(crate) struct StatusNumbers {
    pub totals: Vec<(&'static str, &'static str, u64)>,
    pub file_used: u64,
    pub file_capacity: u64,
    pub ha_lag: i64,
    pub ha_state: i64,
    pub gets: (u64, u64),
}

#[cfg(test)]
mod tests;
