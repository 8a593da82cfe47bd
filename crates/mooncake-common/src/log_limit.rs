//! Rate limiting for log lines a peer can trigger at will (refused
//! connections and the like), so that a flood of them cannot fill a disk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Allows one event per period through, counting the ones held back.
#[derive(Debug)]
pub struct LogLimit {
    start: Instant,
    every_ms: u64,
    /// Milliseconds since `start` of the last event let through, plus one
    /// (0: none yet).
    last_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl LogLimit {
    pub fn new(every: Duration) -> LogLimit {
        LogLimit {
            start: Instant::now(),
            every_ms: every.as_millis() as u64,
            last_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether to log an event now: `Some(n)` with the number of events
    /// held back since the last one logged, `None` to stay silent.
    pub fn should_log(&self) -> Option<u64> {
        self.should_log_at(Instant::now())
    }

    /// [`Self::should_log`] at the given time (for tests).
    pub fn should_log_at(&self, now: Instant) -> Option<u64> {
        let now = now.saturating_duration_since(self.start).as_millis() as u64 + 1;
        let last = self.last_ms.load(Ordering::Relaxed);
        if last != 0 && now < last + self.every_ms {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.last_ms.store(now, Ordering::Relaxed);
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_with_the_count_held_back() {
        let limit = LogLimit::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(limit.should_log_at(t0), Some(0));
        for _ in 0..1000 {
            assert_eq!(limit.should_log_at(t0 + Duration::from_secs(5)), None);
        }
        assert_eq!(
            limit.should_log_at(t0 + Duration::from_secs(11)),
            Some(1000)
        );
        assert_eq!(limit.should_log_at(t0 + Duration::from_secs(12)), None);
        assert_eq!(limit.should_log_at(t0 + Duration::from_secs(30)), Some(1));
    }
}
