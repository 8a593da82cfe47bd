//! Prometheus metrics with the reference's names.
//!
//! Per-call counters are bumped on the RPC path (one atomic add each);
//! gauges (capacity, keys, clients) are read from the state machine when
//! `/metrics` is scraped, and event counters kept by the state machine are
//! copied over at the same time.

use std::sync::atomic::Ordering;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::service::{MasterService, MasterStats};
use crate::proto::{Request, Response};

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

/// Calls counted one by one: (request tag, metric name part).
const SINGLE_OPS: &[(u8, &str)] = &[
    (1, "ping"),
    (2, "mount_segment"),
    (3, "unmount_segment"),
    (4, "put_start"),
    (6, "put_end"),
    (8, "put_revoke"),
    (10, "get_replica_list"),
    (12, "exist_key"),
    (14, "get_size"),
    (15, "remove"),
    (17, "remove_by_regex"),
    (18, "remove_all"),
    (20, "create_copy_task"),
    (21, "create_move_task"),
    (22, "query_task"),
    (23, "fetch_tasks"),
    (24, "update_task"),
    (25, "replica_transfer_start"),
    (26, "replica_transfer_end"),
    (27, "replica_transfer_revoke"),
];

/// Batch calls: (request tag, metric name part).
const BATCH_OPS: &[(u8, &str)] = &[
    (5, "put_start"),
    (7, "put_end"),
    (9, "put_revoke"),
    (11, "get_replica_list"),
    (13, "exist_key"),
    (16, "remove"),
    (19, "replica_clear"),
];

#[derive(Default, Clone)]
struct OpCounters {
    requests: Counter,
    failures: Counter,
}

#[derive(Default, Clone)]
struct BatchCounters {
    requests: Counter,
    failures: Counter,
    partial_successes: Counter,
    items: Counter,
    failed_items: Counter,
}

type Labels = Vec<(String, String)>;

pub struct MasterMetrics {
    registry: Registry,
    /// Indexed by request tag.
    singles: Vec<Option<OpCounters>>,
    batches: Vec<Option<BatchCounters>>,
    value_size: Histogram,
    allocated: Gauge,
    capacity: Gauge,
    keys: Gauge,
    soft_pinned: Gauge,
    clients: Gauge,
    segment_allocated: Family<Labels, Gauge>,
    segment_capacity: Family<Labels, Gauge>,
    malformed: Counter,
    alloc_failures: Counter,
    // Copies of the state machine's event counters.
    attempted_evictions: Counter,
    successful_evictions: Counter,
    // The reference exposes these three as plain values (no _total).
    evicted_keys: Gauge,
    evicted_bytes: Gauge,
    discarded_puts: Gauge,
    expired_clients: Counter,
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

impl MasterMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let mut singles = vec![None; 256];
        for &(tag, name) in SINGLE_OPS {
            let c = OpCounters::default();
            registry.register(
                format!("master_{name}_requests"),
                format!("{name} calls"),
                c.requests.clone(),
            );
            registry.register(
                format!("master_{name}_failures"),
                format!("{name} calls that failed"),
                c.failures.clone(),
            );
            singles[tag as usize] = Some(c);
        }
        let mut batches = vec![None; 256];
        for &(tag, name) in BATCH_OPS {
            let c = BatchCounters::default();
            let p = format!("master_batch_{name}");
            registry.register(
                format!("{p}_requests"),
                format!("batch {name} calls"),
                c.requests.clone(),
            );
            registry.register(
                format!("{p}_failures"),
                format!("batch {name} calls where every item failed"),
                c.failures.clone(),
            );
            registry.register(
                format!("{p}_partial_successes"),
                format!("batch {name} calls where some items failed"),
                c.partial_successes.clone(),
            );
            registry.register(
                format!("{p}_items"),
                format!("items in batch {name} calls"),
                c.items.clone(),
            );
            registry.register(
                format!("{p}_failed_items"),
                format!("failed items in batch {name} calls"),
                c.failed_items.clone(),
            );
            batches[tag as usize] = Some(c);
        }
        let mut m = MasterMetrics {
            singles,
            batches,
            value_size: Histogram::new(VALUE_SIZE_BUCKETS.into_iter()),
            allocated: Gauge::default(),
            capacity: Gauge::default(),
            keys: Gauge::default(),
            soft_pinned: Gauge::default(),
            clients: Gauge::default(),
            segment_allocated: Family::default(),
            segment_capacity: Family::default(),
            malformed: Counter::default(),
            alloc_failures: Counter::default(),
            attempted_evictions: Counter::default(),
            successful_evictions: Counter::default(),
            evicted_keys: Gauge::default(),
            evicted_bytes: Gauge::default(),
            discarded_puts: Gauge::default(),
            expired_clients: Counter::default(),
            registry,
        };
        let r = &mut m.registry;
        r.register(
            "master_value_size_bytes",
            "Sizes of values put",
            m.value_size.clone(),
        );
        r.register(
            "master_allocated_bytes",
            "Bytes allocated in all segments",
            m.allocated.clone(),
        );
        r.register(
            "master_total_capacity_bytes",
            "Capacity of all segments",
            m.capacity.clone(),
        );
        r.register("master_key_count", "Complete objects", m.keys.clone());
        r.register(
            "master_soft_pin_key_count",
            "Objects whose soft pin is in force",
            m.soft_pinned.clone(),
        );
        r.register(
            "master_active_clients",
            "Clients with a live heartbeat",
            m.clients.clone(),
        );
        r.register(
            "segment_allocated_bytes",
            "Bytes allocated per segment",
            m.segment_allocated.clone(),
        );
        r.register(
            "segment_total_capacity_bytes",
            "Capacity per segment",
            m.segment_capacity.clone(),
        );
        r.register(
            "master_malformed_requests",
            "Frames that did not decode",
            m.malformed.clone(),
        );
        r.register(
            "master_put_start_alloc_failures",
            "PutStart calls refused for lack of space",
            m.alloc_failures.clone(),
        );
        r.register(
            "master_attempted_evictions",
            "Eviction rounds started",
            m.attempted_evictions.clone(),
        );
        r.register(
            "master_successful_evictions",
            "Eviction rounds that freed space",
            m.successful_evictions.clone(),
        );
        r.register(
            "master_evicted_key_count",
            "Objects evicted",
            m.evicted_keys.clone(),
        );
        r.register(
            "master_evicted_size_bytes",
            "Bytes evicted",
            m.evicted_bytes.clone(),
        );
        r.register(
            "master_put_start_discard_cnt",
            "Unfinished puts discarded",
            m.discarded_puts.clone(),
        );
        r.register(
            "master_expired_clients",
            "Clients dropped for missing heartbeats",
            m.expired_clients.clone(),
        );
        m
    }

    /// Records the value sizes of a put.
    pub fn observe_values(&self, req: &Request<'_>) {
        match req {
            Request::PutStart { value_len, .. } => self.value_size.observe(*value_len as f64),
            Request::BatchPutStart { value_lens, .. } => {
                for &len in value_lens {
                    self.value_size.observe(len as f64);
                }
            }
            _ => {}
        }
    }

    /// Counts one served call (by request tag) and its outcome.
    pub fn observe(&self, tag: u8, resp: &Response) {
        let tag = tag as usize;
        if let Some(c) = &self.singles[tag] {
            c.requests.inc();
            let failed = match resp {
                Response::Unit { result } => result.as_ref().err(),
                Response::Replicas { result } => result.as_ref().err(),
                Response::ReplicaList { result } => result.as_ref().err(),
                Response::Bool { result } => result.as_ref().err(),
                Response::Count { result } => result.as_ref().err(),
                Response::Task { result } => result.as_ref().err(),
                Response::TaskState { result } => result.as_ref().err(),
                Response::Tasks { result } => result.as_ref().err(),
                Response::Failed { error } => Some(error),
                _ => None,
            };
            if let Some(e) = failed {
                c.failures.inc();
                if tag == 4 && e.code == mooncake_common::ErrorCode::NO_AVAILABLE_HANDLE {
                    self.alloc_failures.inc();
                }
            }
        } else if let Some(c) = &self.batches[tag] {
            c.requests.inc();
            let (items, failed) = match resp {
                Response::Units { results } => {
                    (results.len(), results.iter().filter(|r| r.is_err()).count())
                }
                Response::BatchReplicas { results } => {
                    (results.len(), results.iter().filter(|r| r.is_err()).count())
                }
                Response::BatchReplicaList { results } => {
                    (results.len(), results.iter().filter(|r| r.is_err()).count())
                }
                Response::Bools { results } => {
                    (results.len(), results.iter().filter(|r| r.is_err()).count())
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
            if tag == 5 {
                let no_space = match resp {
                    Response::BatchReplicas { results } => results
                        .iter()
                        .filter(|r| {
                            r.as_ref().is_err_and(|e| {
                                e.code == mooncake_common::ErrorCode::NO_AVAILABLE_HANDLE
                            })
                        })
                        .count(),
                    _ => 0,
                };
                self.alloc_failures.inc_by(no_space as u64);
            }
        }
    }

    /// Counts a frame that could not be decoded.
    pub fn observe_malformed(&self) {
        self.malformed.inc();
    }

    /// Requests served and failed per single call, for the summary line.
    pub fn request_counts(&self) -> Vec<(&'static str, u64, u64)> {
        SINGLE_OPS
            .iter()
            .filter_map(|&(tag, name)| {
                let c = self.singles[tag as usize].as_ref()?;
                Some((name, c.requests.get(), c.failures.get()))
            })
            .collect()
    }

    /// Refreshes the gauges from the service and renders the text format.
    pub fn render(&self, svc: &MasterService, stats: &MasterStats) -> String {
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.allocated.set(as_i64(stats.allocated_bytes));
        self.capacity.set(as_i64(stats.capacity_bytes));
        self.keys.set(as_i64(stats.key_count));
        self.soft_pinned.set(as_i64(stats.soft_pin_key_count));
        self.clients.set(as_i64(stats.active_clients));
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
        sync(
            &self.attempted_evictions,
            c.eviction_rounds.load(Ordering::Relaxed),
        );
        sync(
            &self.successful_evictions,
            c.eviction_rounds_freeing.load(Ordering::Relaxed),
        );
        self.evicted_keys
            .set(as_i64(c.evicted_keys.load(Ordering::Relaxed)));
        self.evicted_bytes
            .set(as_i64(c.evicted_bytes.load(Ordering::Relaxed)));
        self.discarded_puts
            .set(as_i64(c.discarded_puts.load(Ordering::Relaxed)));
        sync(
            &self.expired_clients,
            c.expired_clients.load(Ordering::Relaxed),
        );
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
