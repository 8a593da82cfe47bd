//! How long a won election is known to hold, readable by any thread.
//!
//! A leader's holder task notices a lost lease only when it next runs. A
//! leader process that was frozen (stopped, swapped out, a paused VM) past
//! its lease can run its connection threads first when it thaws, and
//! answer reads from a state a newer leader has moved past. A call checks
//! this deadline instead: a renewal the coordination service accepted,
//! sent at `t`, proves the lease until `t + grace`, the same grace after
//! which the holder gives leadership up and before which no other candidate
//! can win.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// The deadline until which a leadership is proven, shared between its
/// holder task (which extends and ends it) and the threads serving calls.
#[derive(Clone, Debug)]
pub struct HeldUntil(Arc<AtomicU64>);

/// Nanoseconds since a process-wide origin, so a deadline fits an atomic.
/// Instants before the origin count as the origin (a deadline there has
/// passed).
fn nanos(at: Instant) -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    u64::try_from(at.saturating_duration_since(origin).as_nanos()).unwrap_or(u64::MAX - 1)
}

impl HeldUntil {
    /// A leadership whose backend keeps no lease clock: it holds until
    /// [`HeldUntil::end`].
    pub fn forever() -> HeldUntil {
        HeldUntil(Arc::new(AtomicU64::new(u64::MAX)))
    }

    /// Proven until `at`, and no longer unless extended.
    pub fn until(at: Instant) -> HeldUntil {
        HeldUntil(Arc::new(AtomicU64::new(nanos(at))))
    }

    /// A renewal was accepted: proven until `at`. Never moves the deadline
    /// back (a late answer to an older renewal proves less).
    pub fn extend_to(&self, at: Instant) {
        self.0.fetch_max(nanos(at), Ordering::AcqRel);
    }

    /// Leadership is given up or lost: no call is answered as leader again.
    pub fn end(&self) {
        self.0.store(0, Ordering::Release);
    }

    /// Whether the leadership is still proven at `now`.
    pub fn holds_at(&self, now: Instant) -> bool {
        nanos(now) < self.0.load(Ordering::Acquire)
    }

    /// Whether the leadership is proven now.
    pub fn holds(&self) -> bool {
        self.holds_at(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_deadline_holds_until_it_passes() {
        let t0 = Instant::now();
        let held = HeldUntil::until(t0 + Duration::from_secs(3));
        assert!(held.holds_at(t0));
        assert!(held.holds_at(t0 + Duration::from_millis(2_999)));
        assert!(!held.holds_at(t0 + Duration::from_secs(3)));
        assert!(!held.holds_at(t0 + Duration::from_secs(60)));
    }

    #[test]
    fn renewals_extend_and_never_shorten() {
        let t0 = Instant::now();
        let held = HeldUntil::until(t0 + Duration::from_secs(3));
        let shared = held.clone();
        shared.extend_to(t0 + Duration::from_secs(5));
        assert!(held.holds_at(t0 + Duration::from_secs(4)));
        // The answer to an older renewal arrives late.
        shared.extend_to(t0 + Duration::from_secs(1));
        assert!(held.holds_at(t0 + Duration::from_secs(4)));
        assert!(!held.holds_at(t0 + Duration::from_secs(5)));
    }

    #[test]
    fn an_ended_leadership_never_holds_again() {
        let t0 = Instant::now();
        let held = HeldUntil::until(t0 + Duration::from_secs(3));
        held.end();
        assert!(!held.holds_at(t0));
        let forever = HeldUntil::forever();
        assert!(forever.holds_at(t0 + Duration::from_secs(1 << 30)));
        forever.end();
        assert!(!forever.holds_at(t0));
    }

    #[test]
    fn a_deadline_before_the_origin_has_passed() {
        let past = Instant::now()
            .checked_sub(Duration::from_secs(10))
            .unwrap_or_else(Instant::now);
        let held = HeldUntil::until(past);
        assert!(!held.holds());
    }
}
