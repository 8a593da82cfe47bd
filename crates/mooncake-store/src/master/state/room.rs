//! Room for a put while memory is full of objects waiting for their disk
//! copy: instead of answering `NO_AVAILABLE_HANDLE` (-200) at once, the
//! put waits until a copy lands (the next try evicts it) and tries again,
//! for at most [`PUT_ROOM_WAIT`]. It is answered -200 only when its last
//! try (which ran an eviction round of its own, queueing whatever may be
//! copied: `eviction::Eviction::room_for`) left no copy under way and none
//! ended since that try began (nothing the wait could free), or when the
//! wait runs out.
//!
//! [`RoomSignal`] counts the reports that end copies (written or failed);
//! [`next_wait`] is the decision, free of clocks.

use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// The longest a put waits for copies to land before it is answered -200;
/// well inside a client's call timeout (30 s).
pub(crate) const PUT_ROOM_WAIT: Duration = Duration::from_secs(5);

/// How long one wait lasts at most before the put looks again (a copy can
/// end without a signal: its tier unmounted, its object removed).
pub(crate) const PUT_ROOM_SLICE: Duration = Duration::from_millis(50);

/// A count of reports that ended copies, with a condition variable to
/// wait for the next. A report runs inside [`Self::ending`] and the
/// waiters look at the count and at the copies under way together
/// ([`Self::look`]): a put never sees a copy gone from those under way
/// without the count that says it ended.
#[derive(Default)]
pub(crate) struct RoomSignal {
    ended: Mutex<u64>,
    changed: Condvar,
}

impl RoomSignal {
    /// The count now: read it before a try, compare after.
    pub(crate) fn generation(&self) -> u64 {
        *self.ended.lock()
    }

    /// Runs `report` (which ends copies: their objects may leave memory,
    /// or be queued again) and counts it, waking every waiting put.
    pub(crate) fn ending<R>(&self, report: impl FnOnce() -> R) -> R {
        let mut ended = self.ended.lock();
        let r = report();
        *ended += 1;
        self.changed.notify_all();
        r
    }

    /// The count and `under_way()` (whether copies are queued or in
    /// flight), read with no report halfway through.
    pub(crate) fn look(&self, under_way: impl FnOnce() -> bool) -> (u64, bool) {
        let ended = self.ended.lock();
        (*ended, under_way())
    }

    /// Waits until the count moves past `seen` or `timeout` passes;
    /// returns whether it moved.
    pub(crate) fn wait_past(&self, seen: u64, timeout: Duration) -> bool {
        let mut ended = self.ended.lock();
        if *ended == seen {
            let _ = self.changed.wait_for(&mut ended, timeout);
        }
        *ended != seen
    }
}

/// Whether a put answered `no_room` after `waited` should wait (and for
/// how long at most) before trying again: only while the wait may free
/// room (`may_free`: copies are under way, or one ended since the try
/// began, whose object the next try can evict), and within the budget of
/// `limit`. No blind tries: a put's try runs its own eviction round.
pub(crate) fn next_wait(
    no_room: bool,
    may_free: bool,
    waited: Duration,
    limit: Duration,
) -> Option<Duration> {
    if !no_room || !may_free || waited >= limit {
        return None;
    }
    Some((limit - waited).min(PUT_ROOM_SLICE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_put_waits_only_while_copies_may_free_room_and_within_its_budget() {
        let limit = Duration::from_secs(5);
        let zero = Duration::ZERO;
        assert_eq!(next_wait(false, true, zero, limit), None, "placed");
        assert_eq!(
            next_wait(true, false, zero, limit),
            None,
            "nothing under way or ended: no blind try"
        );
        assert_eq!(
            next_wait(true, true, zero, limit),
            Some(PUT_ROOM_SLICE),
            "copies under way or just ended"
        );
        assert_eq!(next_wait(true, true, limit, limit), None, "budget spent");
        assert_eq!(
            next_wait(true, true, limit - Duration::from_millis(10), limit),
            Some(Duration::from_millis(10)),
            "never past the budget"
        );
    }

    #[test]
    fn a_report_is_seen_whole_or_not_at_all() {
        let s = Arc::new(RoomSignal::default());
        let under_way = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let seen = s.generation();
        let reporter = {
            let (s, under_way) = (s.clone(), under_way.clone());
            std::thread::spawn(move || {
                s.ending(|| {
                    under_way.store(false, std::sync::atomic::Ordering::SeqCst);
                    // A waiter looking now must not see the copy gone
                    // without the count moved.
                    std::thread::sleep(Duration::from_millis(30));
                })
            })
        };
        for _ in 0..20 {
            let (count, busy) = s.look(|| under_way.load(std::sync::atomic::Ordering::SeqCst));
            assert!(busy || count != seen, "a copy gone, its end not counted");
            std::thread::sleep(Duration::from_millis(3));
        }
        reporter.join().unwrap();
        assert_eq!(
            s.look(|| under_way.load(std::sync::atomic::Ordering::SeqCst)),
            (seen + 1, false)
        );
    }

    #[test]
    fn an_ended_copy_wakes_a_waiting_put() {
        let s = Arc::new(RoomSignal::default());
        let seen = s.generation();
        assert!(
            !s.wait_past(seen, Duration::from_millis(1)),
            "nothing ended"
        );
        let t = {
            let s = s.clone();
            std::thread::spawn(move || s.wait_past(seen, Duration::from_secs(60)))
        };
        std::thread::sleep(Duration::from_millis(20));
        s.ending(|| ());
        assert!(t.join().unwrap(), "woken by the copy, not the timeout");
        assert!(
            s.wait_past(seen, Duration::ZERO),
            "a past change is seen at once"
        );
    }
}
