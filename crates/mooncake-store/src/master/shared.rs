//! What every task of a running master shares: the state machine, its
//! metrics, the clock and the configuration. The RPC server, the timers and
//! the HTTP service all hold one [`Shared`].

use std::time::Instant;

use super::config::MasterConfig;
use super::drain::DrainJobs;
use super::metrics::MasterMetrics;
use super::service::MasterService;

/// Milliseconds on a monotonic clock, from the master's start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    start: Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Clock {
            start: Instant::now(),
        }
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
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
}

impl Shared {
    /// A fresh state machine for `config`, its clock starting now.
    pub(crate) fn new(config: MasterConfig) -> Shared {
        let clock = Clock::new();
        let service = MasterService::new(&config);
        let epoch_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        service.set_epoch_offset(epoch_ms.saturating_sub(clock.now_ms()));
        Shared {
            service,
            metrics: MasterMetrics::new(),
            clock,
            config,
            drain: DrainJobs::default(),
        }
    }
}
