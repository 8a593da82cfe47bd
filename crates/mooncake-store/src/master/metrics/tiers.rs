//! Families of the HA replication log, the disk tiers and promotion.
//!
//! They are always exported (at zero where nothing feeds them yet) so that
//! dashboards written for the reference keep working. The subsystems that
//! own these numbers set them through the small methods below; every handle
//! is a shared atomic, so a subsystem may also keep a clone of a field.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// What a standby's replication state machine reports, with the reference's
/// numbering of `ha_standby_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandbyState {
    Stopped = 0,
    Connecting = 1,
    Syncing = 2,
    Watching = 3,
    Recovering = 4,
    Reconnecting = 5,
    Promoting = 6,
    Promoted = 7,
    Failed = 8,
}

/// `ha_*`: the operation log between a leader and its standbys.
#[derive(Default)]
pub struct HaMetrics {
    last_sequence_id: Gauge,
    applied_sequence_id: Gauge,
    standby_lag: Gauge,
    pending_entries: Gauge,
    pending_mutation_queue_size: Gauge,
    standby_state: Gauge,
}

impl HaMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        let g =
            |r: &mut Registry, name: &str, help: &str, m: &Gauge| r.register(name, help, m.clone());
        g(
            r,
            "ha_oplog_last_sequence_id",
            "Latest OpLog sequence ID written by Primary",
            &self.last_sequence_id,
        );
        g(
            r,
            "ha_oplog_applied_sequence_id",
            "Latest OpLog sequence ID applied by Standby",
            &self.applied_sequence_id,
        );
        g(
            r,
            "ha_oplog_standby_lag",
            "Number of OpLog entries Standby is behind Primary",
            &self.standby_lag,
        );
        g(
            r,
            "ha_oplog_pending_entries",
            "Number of out-of-order entries waiting in OpLogApplier",
            &self.pending_entries,
        );
        g(
            r,
            "ha_pending_mutation_queue_size",
            "Number of mutations pending etcd write retry",
            &self.pending_mutation_queue_size,
        );
        g(
            r,
            "ha_standby_state",
            "Current state of the Standby service (0=STOPPED, 1=CONNECTING, 2=SYNCING, 3=WATCHING, 4=RECOVERING, 5=RECONNECTING, 6=PROMOTING, 7=PROMOTED, 8=FAILED)",
            &self.standby_state,
        );
    }

    /// The leader wrote entry `seq` to the operation log.
    pub fn set_oplog_last_sequence_id(&self, seq: u64) {
        self.last_sequence_id.set(as_i64(seq));
    }

    /// A standby applied the log up to `seq`; its lag is `last - seq`.
    pub fn set_oplog_applied_sequence_id(&self, seq: u64, last: u64) {
        self.applied_sequence_id.set(as_i64(seq));
        self.standby_lag.set(as_i64(last.saturating_sub(seq)));
    }

    /// Entries received out of order and waiting for their predecessors.
    pub fn set_oplog_pending_entries(&self, n: u64) {
        self.pending_entries.set(as_i64(n));
    }

    /// Mutations waiting for the log store to accept them.
    pub fn set_pending_mutation_queue_size(&self, n: u64) {
        self.pending_mutation_queue_size.set(as_i64(n));
    }

    pub fn set_standby_state(&self, state: StandbyState) {
        self.standby_state.set(state as i64);
    }

    /// (last, applied, lag, pending, mutation queue, state), for the summary.
    pub(super) fn snapshot(&self) -> [i64; 6] {
        [
            self.last_sequence_id.get(),
            self.applied_sequence_id.get(),
            self.standby_lag.get(),
            self.pending_entries.get(),
            self.pending_mutation_queue_size.get(),
            self.standby_state.get(),
        ]
    }
}

/// The file (SSD / DFS) tier: capacity, usage and what reads it served.
#[derive(Default)]
pub struct FileTierMetrics {
    pub(super) allocated: Gauge,
    pub(super) capacity: Gauge,
    pub(super) cached_values: Gauge,
}

impl FileTierMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "master_allocated_file_size_bytes",
            "Total bytes currently allocated for file storage in 3fs/nfs",
            self.allocated.clone(),
        );
        r.register(
            "master_total_file_capacity_bytes",
            "Total capacity for file storage in 3fs/nfs",
            self.capacity.clone(),
        );
        r.register(
            "file_cache_nums_",
            "Current number of cached values in SSD cache",
            self.cached_values.clone(),
        );
    }

    /// Bytes stored in, and the capacity of, the file tier.
    pub fn set_usage(&self, allocated: u64, capacity: u64) {
        self.allocated.set(as_i64(allocated));
        self.capacity.set(as_i64(capacity));
    }

    /// Objects with a replica in the file tier.
    pub fn set_cached_values(&self, n: u64) {
        self.cached_values.set(as_i64(n));
    }
}

/// `master_promotion_*`: copies from the local disk tier back to memory.
/// Counters are bumped with `.inc()` / `.inc_by()` by the promotion code.
#[derive(Default)]
pub struct PromotionMetrics {
    pub in_flight: Gauge,
    pub admitted: Counter,
    pub completed: Counter,
    pub completed_bytes: Counter,
    pub expired: Counter,
    pub failed: Counter,
    pub cancelled: Counter,
    pub rejected_frequency: Counter,
    pub rejected_watermark: Counter,
    pub rejected_cap: Counter,
    pub candidate_recorded: Counter,
    pub candidate_admitted: Counter,
    pub candidate_admission_rejected: Counter,
    pub candidate_expired_evaluated: Counter,
    pub candidate_expired_unevaluated: Counter,
    pub candidate_dropped_limit: Counter,
}

impl PromotionMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "master_promotion_in_flight",
            "Current number of in-flight L2->L1 promotion tasks",
            self.in_flight.clone(),
        );
        let counters: [(&str, &str, &Counter); 15] = [
            ("admitted", "Total promotion tasks admitted past all gates and enqueued", &self.admitted),
            ("completed", "Total promotion tasks committed via NotifyPromotionSuccess", &self.completed),
            ("completed_bytes", "Total bytes promoted from LOCAL_DISK to MEMORY", &self.completed_bytes),
            ("expired", "Total promotion tasks expired via the reaper (put_start_release_timeout_sec)", &self.expired),
            ("failed", "Total promotion tasks aborted by holder via NotifyPromotionFailure", &self.failed),
            ("cancelled", "Total promotion tasks removed because the prerequisite went away", &self.cancelled),
            ("rejected_frequency", "Promotion attempts rejected because the access frequency was below promotion_admission_threshold", &self.rejected_frequency),
            ("rejected_watermark", "Promotion attempts rejected because DRAM was at or above the eviction high watermark", &self.rejected_watermark),
            ("rejected_cap", "Promotion attempts rejected because promotion_in_flight was at promotion_queue_limit", &self.rejected_cap),
            ("candidate_recorded", "New promotion retry candidate entries created", &self.candidate_recorded),
            ("candidate_admitted", "Promotion retry candidates successfully queued on background retry", &self.candidate_admitted),
            ("candidate_admission_rejected", "Promotion retry candidates that hit a gate again during retry scan", &self.candidate_admission_rejected),
            ("candidate_expired_evaluated", "Promotion retry candidates expired or exhausted during a retry scan", &self.candidate_expired_evaluated),
            ("candidate_expired_unevaluated", "Promotion retry candidates that aged out before the background scheduler evaluated them", &self.candidate_expired_unevaluated),
            ("candidate_dropped_limit", "Promotion retry candidates dropped at record time because the global candidate count limit was reached", &self.candidate_dropped_limit),
        ];
        for (name, help, c) in counters {
            r.register(format!("master_promotion_{name}"), help, c.clone());
        }
    }
}

/// NVMe-oF: not implemented; its capacity families stay at zero.
#[derive(Default)]
pub(super) struct NofMetrics {
    allocated: Gauge,
    capacity: Gauge,
}

impl NofMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "master_nof_allocated_bytes",
            "Total nof ssd bytes currently allocated across all segments",
            self.allocated.clone(),
        );
        r.register(
            "master_total_nof_capacity_bytes",
            "Total nof ssd capacity across all mounted segments",
            self.capacity.clone(),
        );
    }
}

/// Hot-key fan-out (`--dynamic_replication_*`). The reference only logs
/// these events; the families are ours.
#[derive(Default)]
pub struct HotKeyMetrics {
    pub tracked_keys: Gauge,
    pub extra_replicas: Gauge,
    pub admitted: Counter,
    pub tasks: Counter,
    pub dropped: Counter,
}

impl HotKeyMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "master_dynamic_replication_tracked_keys",
            "Keys whose reads are counted in a heat window now",
            self.tracked_keys.clone(),
        );
        r.register(
            "master_dynamic_replication_extra_replicas",
            "Extra MEMORY replicas of hot keys, written or being written",
            self.extra_replicas.clone(),
        );
        let counters: [(&str, &str, &Counter); 3] = [
            (
                "admitted",
                "Keys admitted as hot (read at the admission rate within a window)",
                &self.admitted,
            ),
            (
                "tasks",
                "Copy tasks queued to add a MEMORY replica of a hot key",
                &self.tasks,
            ),
            (
                "dropped",
                "Extra MEMORY replicas taken back (key cooled or memory at the eviction watermark)",
                &self.dropped,
            ),
        ];
        for (name, help, c) in counters {
            r.register(
                format!("master_dynamic_replication_{name}"),
                help,
                c.clone(),
            );
        }
    }
}
