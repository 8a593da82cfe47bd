//! A connection's idle mark: written by the thread serving it (around
//! each frame), read by the listener when it must shed a connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// When a connection went idle: 0 while it handles a frame, else
/// milliseconds since the listener started, plus one.
pub(crate) struct IdleMark {
    since: AtomicU64,
    epoch: Instant,
}

impl IdleMark {
    pub(crate) fn new(epoch: Instant) -> IdleMark {
        IdleMark {
            since: AtomicU64::new(0),
            epoch,
        }
    }

    /// The connection waits for its peer's next frame.
    pub(crate) fn idle(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64 + 1;
        self.since.store(ms, Ordering::Relaxed);
    }

    /// Marks it idle since `ms` (milliseconds since the epoch, plus one).
    #[cfg(test)]
    pub(crate) fn idle_at(&self, ms: u64) {
        self.since.store(ms, Ordering::Relaxed);
    }

    /// The connection handles a frame.
    pub(crate) fn busy(&self) {
        self.since.store(0, Ordering::Relaxed);
    }

    pub(crate) fn idle_since(&self) -> Option<u64> {
        match self.since.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(ms),
        }
    }
}
