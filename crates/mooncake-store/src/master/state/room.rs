//! Room for a put while memory is full of objects waiting for their disk
//! copy: instead of answering `NO_AVAILABLE_HANDLE` (-200) at once, the
//! put waits until a copy lands (the next try evicts it) and tries again,
//! for at most [`PUT_ROOM_WAIT`]. It is answered -200 only when no copy is
//! under way (nothing the wait could free) or the wait runs out.
//!
//! [`RoomSignal`] is bumped whenever copies in flight end (written or
//! failed); [`next_wait`] is the decision, free of clocks.

use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// The longest a put waits for copies to land before it is answered -200;
/// well inside a client's call timeout (30 s).
pub(crate) const PUT_ROOM_WAIT: Duration = Duration::from_secs(5);

/// How long one wait lasts at most before the put looks again (a copy can
/// end without a signal: its tier unmounted, its object removed).
pub(crate) const PUT_ROOM_SLICE: Duration = Duration::from_millis(50);

/// A count of ended copies with a condition variable to wait for the next.
#[derive(Default)]
pub(crate) struct RoomSignal {
    ended: Mutex<u64>,
    changed: Condvar,
}

impl RoomSignal {
    /// The count now; pass it to [`Self::wait_past`].
    pub(crate) fn generation(&self) -> u64 {
        *self.ended.lock()
    }

    /// Copies ended: wakes every waiting put.
    pub(crate) fn notify(&self) {
        *self.ended.lock() += 1;
        self.changed.notify_all();
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

/// Tries a refused put gets with no copy under way: a try can lose its
/// eviction round to another (the timer's) that freed too little for it,
/// while objects whose copies just landed are still in memory.
pub(crate) const IDLE_TRIES: u32 = 2;

/// Whether a put answered `no_room` after `waited` should wait (and for
/// how long at most) before trying again: while copies are under way, or
/// for [`IDLE_TRIES`] tries (`idle` so far) without one, and within the
/// budget of `limit`.
pub(crate) fn next_wait(
    no_room: bool,
    under_way: bool,
    idle: u32,
    waited: Duration,
    limit: Duration,
) -> Option<Duration> {
    if !no_room || !(under_way || idle < IDLE_TRIES) || waited >= limit {
        return None;
    }
    Some((limit - waited).min(PUT_ROOM_SLICE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_put_waits_only_while_copies_are_under_way_and_within_its_budget() {
        let limit = Duration::from_secs(5);
        let zero = Duration::ZERO;
        assert_eq!(next_wait(false, true, 0, zero, limit), None, "placed");
        assert_eq!(
            next_wait(true, false, 0, zero, limit),
            Some(PUT_ROOM_SLICE),
            "one more try after a lost round"
        );
        assert_eq!(
            next_wait(true, false, IDLE_TRIES, zero, limit),
            None,
            "nothing to wait for"
        );
        assert_eq!(
            next_wait(true, true, IDLE_TRIES, zero, limit),
            Some(PUT_ROOM_SLICE),
            "copies under way"
        );
        assert_eq!(next_wait(true, true, 0, limit, limit), None, "budget spent");
        assert_eq!(
            next_wait(true, true, 0, limit - Duration::from_millis(10), limit),
            Some(Duration::from_millis(10)),
            "never past the budget"
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
        s.notify();
        assert!(t.join().unwrap(), "woken by the copy, not the timeout");
        assert!(
            s.wait_past(seen, Duration::ZERO),
            "a past change is seen at once"
        );
    }
}
