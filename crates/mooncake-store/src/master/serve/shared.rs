//! What every task of a running master shares: the state machine, its
//! metrics, the clock and the configuration. The RPC server, the timers and
//! the HTTP service all hold one [`Shared`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use super::access::AccessPolicy;
use super::drain_jobs::DrainJobs;
use crate::ha::HeldUntil;
use crate::master::config::MasterConfig;
use crate::master::durable::snapshot::{Durability, Opened};
use crate::master::events::{self, Publisher};
use crate::master::metrics::MasterMetrics;
use crate::master::replication::Replication;
use crate::master::state::service::MasterService;
use mooncake_common::Result;
use mooncake_transfer::metadata::http_server::MemoryStore;

/// Milliseconds on a monotonic clock, from the master's start; a standby
/// moves it forward to its leader's, so times in replicated state stay in
/// one domain across leaders.
#[derive(Debug)]
pub(crate) struct Clock {
    start: Instant,
    offset: AtomicU64,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Clock {
            start: Instant::now(),
            offset: AtomicU64::new(0),
        }
    }

    pub(crate) fn now_ms(&self) -> u64 {
        (self.start.elapsed().as_millis() as u64)
            .saturating_add(self.offset.load(Ordering::Relaxed))
    }

    /// Moves the clock forward to at least `ms` (never back).
    pub(crate) fn advance_to(&self, ms: u64) {
        let elapsed = self.start.elapsed().as_millis() as u64;
        self.offset
            .fetch_max(ms.saturating_sub(elapsed), Ordering::Relaxed);
    }
}

/// Milliseconds since the Unix epoch (for timestamps users read).
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// What every task of a running master shares.
pub(crate) struct Shared {
    pub(crate) service: MasterService,
    pub(crate) metrics: MasterMetrics,
    pub(crate) clock: Clock,
    pub(crate) config: MasterConfig,
    /// Drain jobs, stepped by the timer loop.
    pub(crate) drain: DrainJobs,
    /// The log and snapshots, when enabled (`crate::master::durable::snapshot`).
    pub(crate) durability: Durability,
    /// The replicated log, in HA mode with `--enable_oplog`.
    pub(crate) replication: Option<Arc<Replication>>,
    /// The cluster and admin tokens (`super::access`).
    pub(crate) access: AccessPolicy,
    /// The KV of the embedded HTTP metadata server, when enabled: mounts
    /// are checked against it (`super::published`).
    pub(crate) metadata: Option<MemoryStore>,
    /// In HA mode once it leads: the term it leads and until when that is
    /// proven; no call is answered as leader past it, nor on a connection
    /// that stated another term (`super::server`).
    pub(crate) leading: OnceLock<Leading>,
}

/// The leadership a serving HA master answers under.
pub(crate) struct Leading {
    /// Until when the leadership is proven (`crate::ha::HeldUntil`).
    pub(crate) lease: HeldUntil,
    /// The election's term.
    pub(crate) term: u64,
}

impl Shared {
    /// The state machine for `config` (restored when it asks), its clock
    /// resuming after every restored time.
    /// A restore reports its progress in `metrics`.
    pub(crate) fn open(config: MasterConfig, metrics: MasterMetrics) -> Result<Shared> {
        Self::build(config, metrics, None)
    }

    /// A fresh state machine whose mutations `replication` logs (HA mode:
    /// replication owns durability, see `crate::master::durable::snapshot::open`).
    pub(crate) fn replicated(
        config: MasterConfig,
        replication: Arc<Replication>,
    ) -> Result<Shared> {
        Self::build(config, MasterMetrics::new(), Some(replication))
    }

    fn build(
        config: MasterConfig,
        metrics: MasterMetrics,
        replication: Option<Arc<Replication>>,
    ) -> Result<Shared> {
        let access = AccessPolicy::from_config(&config)?;
        let metadata = config.enable_http_metadata_server.then(MemoryStore::new);
        let Opened {
            mut service,
            clock_base,
            durability,
        } = crate::master::durable::snapshot::open(&config, &metrics.restore)?;
        if config.enable_kv_events {
            service = service.with_kv_events(Publisher::bind(events::Config {
                bind_endpoint: config.kv_events_bind_endpoint.clone(),
                format: events::Format {
                    backend_id: config.kv_events_backend_id.clone(),
                    legacy: config.kv_events_emit_legacy_compat,
                    object_key: config.kv_events_emit_object_key,
                },
                queue_capacity: config.kv_events_queue_capacity,
                replay_endpoint: Some(config.kv_events_replay_endpoint.trim())
                    .filter(|e| !e.is_empty())
                    .map(str::to_owned),
                replay_buffer: config.kv_events_replay_buffer,
            })?);
        }
        if let Some(r) = &replication {
            service = service.with_sink(Box::new(r.clone())).with_put_fence();
        }
        let clock = Clock::new();
        // A restored master resumes after every time its state holds.
        clock.advance_to(clock_base);
        let epoch_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        service.set_epoch_offset(epoch_ms.saturating_sub(clock.now_ms()));
        Ok(Shared {
            service,
            metrics,
            clock,
            config,
            drain: DrainJobs::default(),
            durability,
            replication,
            access,
            metadata,
            leading: OnceLock::new(),
        })
    }
}

impl crate::master::durable::snapshot::LiveState for Shared {
    fn service(&self) -> &MasterService {
        &self.service
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }
}
