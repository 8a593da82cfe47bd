//! The rules the state machine obeys, as plain values with times in
//! milliseconds. A leaf: `config` builds them from the flags, every table
//! reads them, and this module imports none of its siblings.

use mooncake_common::{Error, ErrorCode, Result};

/// How replicas are spread over segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocationStrategy {
    /// Random start, then consecutive segments.
    Random,
    /// Sample a few segments, fill the emptiest first.
    FreeRatioFirst,
    /// As `FreeRatioFirst`, ranking each segment by the free share of its
    /// owner's SSD tier (1 for an owner without one).
    SsdFreeRatioFirst,
    /// A single-replica put tries the writer's host first, then the other
    /// hosts in order; otherwise random.
    LocalFirst,
}

impl AllocationStrategy {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "random" => Ok(AllocationStrategy::Random),
            "free_ratio_first" => Ok(AllocationStrategy::FreeRatioFirst),
            "ssd_free_ratio_first" => Ok(AllocationStrategy::SsdFreeRatioFirst),
            "local_first" => Ok(AllocationStrategy::LocalFirst),
            "cxl" => Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "allocation strategy cxl is not supported",
            )),
            _ => Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "unknown allocation strategy {s:?} (random, free_ratio_first, ssd_free_ratio_first, local_first)"
                ),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AllocationStrategy::Random => "random",
            AllocationStrategy::FreeRatioFirst => "free_ratio_first",
            AllocationStrategy::SsdFreeRatioFirst => "ssd_free_ratio_first",
            AllocationStrategy::LocalFirst => "local_first",
        }
    }
}

/// How eviction ranks its candidates (`--eviction_policy`, ours).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Oldest lease first (a read extends it): near-LRU, as the reference.
    Lru,
    /// As `Lru`, with each read since the object's put (up to three)
    /// counting as if it came later (`state::frequency`).
    Frequency,
}

impl EvictionPolicy {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "lru" => Ok(EvictionPolicy::Lru),
            "frequency" => Ok(EvictionPolicy::Frequency),
            _ => Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("unknown eviction policy {s:?} (lru, frequency)"),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Frequency => "frequency",
        }
    }
}

/// Time-based protection of objects (see `leases`).
#[derive(Debug, Clone, Copy)]
pub struct LeasePolicy {
    pub lease_ttl: u64,
    pub soft_pin_ttl: u64,
}

/// The master's rules for objects, segments and clients.
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
    pub eviction_policy: EvictionPolicy,
    pub strategy: AllocationStrategy,
    /// A master whose sink logs places puts in reserved space and answers
    /// them before their entries are kept (`segments::space`).
    pub put_fence: bool,
}

/// Task limits and timeouts (0 = no timeout).
#[derive(Debug, Clone, Copy)]
pub struct TaskPolicy {
    pub max_pending: usize,
    pub max_processing: usize,
    pub max_finished: usize,
    pub pending_timeout: u64,
    pub processing_timeout: u64,
}

impl Default for TaskPolicy {
    fn default() -> Self {
        TaskPolicy {
            max_pending: 10_000,
            max_processing: 10_000,
            max_finished: 10_000,
            pending_timeout: 300_000,
            processing_timeout: 300_000,
        }
    }
}

/// The SSD tier's rules (`--enable_offload` and the flags around it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OffloadPolicy {
    /// Tiers may mount and objects are copied to them.
    pub enabled: bool,
    /// Copy at eviction time instead of at PutEnd.
    pub on_evict: bool,
    /// Most keys queued or in flight per tier owner.
    pub queue_limit: usize,
    /// Share of `queue_limit` one eviction round may queue.
    pub cap_ratio: f64,
    /// When eviction cannot free enough, evict objects with no disk copy.
    pub force_evict: bool,
    /// A disk-only object read `promote_after` times gets a memory copy
    /// again (its owner is asked to write one).
    pub promote_on_hit: bool,
    pub promote_after: usize,
    /// Promotions handed to an owner per round of `promote_round_ms`:
    /// polls between rounds get none. The reference's owner pulls them
    /// once per offload heartbeat (`MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS`,
    /// 10 s by default).
    pub promote_per_poll: usize,
    /// The round of an owner whose poll names none.
    pub promote_round_ms: u64,
    /// Promotions queued or in flight, at most.
    pub promote_limit: usize,
}

impl Default for OffloadPolicy {
    fn default() -> Self {
        OffloadPolicy {
            enabled: false,
            on_evict: false,
            queue_limit: 50_000,
            cap_ratio: 0.5,
            force_evict: false,
            promote_on_hit: false,
            promote_after: 2,
            promote_per_poll: 1,
            promote_round_ms: 10_000,
            promote_limit: 50_000,
        }
    }
}

impl OffloadPolicy {
    /// Most tasks one eviction round queues per owner.
    pub fn per_round(&self) -> usize {
        ((self.queue_limit as f64 * self.cap_ratio) as usize).max(1)
    }
}

/// The shared-filesystem tier (`--root_fs_dir`): objects leaving memory
/// are written as files under `fsdir` by the storage client holding them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FilePolicy {
    /// `<root_fs_dir>/<cluster_id>`; `None`: the tier is off.
    pub fsdir: Option<String>,
    /// Most bytes of files: `--global_file_segment_size`, and
    /// `--quota_bytes` (0: 90% of the filesystem, where the master sees it).
    pub capacity: u64,
    /// `--enable_disk_eviction`: a full tier drops its oldest files for new
    /// ones; off, objects stay in memory and puts back off (-200).
    pub evict: bool,
    /// `--quota_bytes` as given (announced to clients).
    pub quota_bytes: u64,
}

impl FilePolicy {
    pub fn new(root: &str, cluster_id: &str, segment: u64, quota: u64, evict: bool) -> Self {
        if root.is_empty() || cluster_id.is_empty() {
            return FilePolicy::default();
        }
        let quota_cap = match quota {
            0 => crate::tier::io::fs_capacity(std::path::Path::new(root))
                .map_or(u64::MAX, |c| c / 10 * 9),
            q => q,
        };
        FilePolicy {
            fsdir: Some(format!("{}/{cluster_id}", root.trim_end_matches('/'))),
            capacity: segment.min(quota_cap),
            evict,
            quota_bytes: quota,
        }
    }
}

/// What the master does with hot keys (`--dynamic_replication_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HotKeyMode {
    /// No heat is counted.
    #[default]
    Off,
    /// Heat is counted and admissions are reported; no replica is made.
    Observe,
    /// An admitted key gets extra memory replicas in the background.
    Enforce,
}

impl HotKeyMode {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "off" => Ok(HotKeyMode::Off),
            "observe" => Ok(HotKeyMode::Observe),
            "enforce" => Ok(HotKeyMode::Enforce),
            _ => Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "dynamic_replication_mode must be one of off, observe, enforce (got {s:?})"
                ),
            )),
        }
    }
}

/// Dynamic hot-key memory replicas (`--dynamic_replication_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HotKeyPolicy {
    pub mode: HotKeyMode,
    /// Length of a key's heat window.
    pub window_ms: u64,
    /// Reads per second, over a window, that admit a key.
    pub qps_threshold: f64,
    /// Most memory replicas a key is fanned out to (its own included).
    pub max_memory_replicas: usize,
}

impl Default for HotKeyPolicy {
    fn default() -> Self {
        HotKeyPolicy {
            mode: HotKeyMode::Off,
            window_ms: 10_000,
            qps_threshold: 0.8,
            max_memory_replicas: 2,
        }
    }
}

impl HotKeyPolicy {
    /// Reads within one window that admit a key: `ceil(qps × seconds)`,
    /// at least one, as the reference counts.
    pub fn min_hits(&self) -> u64 {
        let secs = self.window_ms as f64 / 1000.0;
        ((self.qps_threshold * secs).ceil() as u64).max(1)
    }

    pub fn enabled(&self) -> bool {
        self.mode != HotKeyMode::Off
    }
}
