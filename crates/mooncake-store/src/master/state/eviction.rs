//! Watermark eviction: when to run a round, how much it frees, which
//! objects qualify and in what order.
//!
//! When allocated bytes reach `eviction_high_watermark_ratio` of capacity,
//! the timer runs a round that frees enough to get `eviction_ratio` of
//! capacity below the watermark, and at least `eviction_ratio` of capacity.
//! When a put finds no space, a round runs at once (freeing at least what the
//! put needs) and the put is retried. Victims go oldest first by lease time (a read
//! extends it, so this approximates LRU), and objects whose lease times tie
//! (two puts in one millisecond) in the order of their last use, exactly
//! ([`Rank`]); `--eviction_policy=frequency` (the default) counts reads
//! since the put as later use (`frequency`). Never evicted: hard-pinned objects,
//! objects under a read lease, puts in flight. Soft-pinned objects go only in
//! a second pass, when the first freed too little and
//! `allow_evict_soft_pinned_objects` is set.
//!
//! Choosing victims is the leader's decision; the service removes each one
//! with a `Remove` mutation, so a standby never evaluates leases.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use mooncake_common::{ErrorCode, Result};
use parking_lot::{Mutex, MutexGuard};

use super::allocator::aligned_len;
use super::frequency::Weight;
use super::objects::ObjectMeta;
use crate::master::config::policy::Policy;

/// When eviction rounds run: one at a time, with a generation count so a
/// put that found no space can tell whether a round ran since.
#[derive(Default)]
pub(crate) struct Eviction {
    /// An allocation failed for lack of space: evict at the next tick even
    /// below the watermark.
    needed: AtomicBool,
    /// One eviction round at a time.
    round: Mutex<()>,
    /// Bumped after every eviction round.
    generation: AtomicU64,
    /// What a read is worth in the victim order (`--eviction_policy`).
    pub(crate) weight: Weight,
}

impl Eviction {
    /// Asks for a round at the next tick.
    pub(crate) fn request(&self) {
        self.needed.store(true, Ordering::Relaxed);
    }

    /// Whether a round was asked for; clears the request.
    pub(crate) fn take_request(&self) -> bool {
        self.needed.swap(false, Ordering::Relaxed)
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Holds off other rounds until the guard drops.
    pub(crate) fn begin_round(&self) -> MutexGuard<'_, ()> {
        self.round.lock()
    }

    pub(crate) fn end_round(&self) {
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Room for a put whose try (`refused`, made at generation `seen`)
    /// found no space. The put joins the rounds rather than racing them:
    /// it waits for a round running now, tries again (`place`) if a round
    /// ended since its try, and if that finds no space either it runs its
    /// own round (`evict`, which says whether it freed anything) and tries
    /// once more, holding the round throughout. So no other round runs
    /// between its last try and its own round: a round that freed too
    /// little for it (the timer's, another put's) never stands in for its
    /// own. The answer is the last try's.
    pub(crate) fn room_for<C, T>(
        &self,
        seen: u64,
        refused: Result<T>,
        cx: &mut C,
        mut place: impl FnMut(&mut C) -> Result<T>,
        evict: impl FnOnce(&mut C) -> bool,
    ) -> Result<T> {
        let _round = self.begin_round();
        let mut last = refused;
        if self.generation() != seen {
            last = place(cx);
            if !no_room(&last) {
                return last;
            }
        }
        let freed = evict(cx);
        self.take_request();
        self.end_round();
        if freed {
            place(cx)
        } else {
            last
        }
    }
}

/// Whether `r` is a refusal for lack of room (`NO_AVAILABLE_HANDLE`).
pub(crate) fn no_room<T>(r: &Result<T>) -> bool {
    matches!(r, Err(e) if e.code == ErrorCode::NO_AVAILABLE_HANDLE)
}

/// Bytes the timer's round frees at this usage, or `None` below the
/// watermark (unless `forced`).
pub(crate) fn round_target(p: &Policy, used: u64, capacity: u64, forced: bool) -> Option<u64> {
    if capacity == 0 {
        return None;
    }
    let high = (p.high_watermark * capacity as f64) as u64;
    if used < high && !forced {
        return None;
    }
    let ratio_bytes = ratio_bytes(p, capacity);
    let target = used
        .saturating_sub(high.saturating_sub(ratio_bytes))
        .max(ratio_bytes);
    Some(target.min(used))
}

/// An object's place in the eviction order, smallest first: its lease
/// time, then its last use counted from `epoch` (a count of uses read once
/// per round, [`super::leases::uses_now`]; a use after it counts as newer).
/// Exact while the uses of objects with tied lease times lie within 2^31
/// of the epoch. `frequency` weighs reads into the lease time.
pub(crate) use super::frequency::Rank;

/// Metadata bytes the timer's round frees when `used` reached `watermark`
/// (of a budget of `limit`): down to `eviction_ratio` of the budget below
/// the watermark, and at least that much. `None` below the watermark.
pub(crate) fn metadata_target(p: &Policy, used: u64, watermark: u64, limit: u64) -> Option<u64> {
    if used < watermark {
        return None;
    }
    let ratio_bytes = ratio_bytes(p, limit);
    let target = used
        .saturating_sub(watermark.saturating_sub(ratio_bytes))
        .max(ratio_bytes);
    Some(target.min(used))
}

/// `eviction_ratio` of `capacity`, in bytes.
pub(crate) fn ratio_bytes(p: &Policy, capacity: u64) -> u64 {
    (p.eviction_ratio * capacity as f64) as u64
}

/// Whether `obj` may be evicted at `now` (soft-pinned ones only when asked).
pub(crate) fn eligible(obj: &ObjectMeta, now: u64, include_soft_pinned: bool) -> bool {
    obj.is_complete()
        && obj.pending.is_none()
        && !obj.is_hard_pinned()
        && !obj.is_leased(now)
        && (include_soft_pinned || !obj.is_soft_pinned(now))
}

/// Allocated bytes evicting `obj` gives back.
pub(crate) fn footprint(obj: &ObjectMeta) -> u64 {
    aligned_len(obj.size).unwrap_or(obj.size) * obj.replicas.len() as u64
}

/// The rank up to which evicting the `(rank, footprint)` candidates, oldest
/// first, frees `target` bytes (all of them when they hold less). `None`
/// when there is no candidate. Sorts `candidates`.
pub(crate) fn threshold<K: Ord + Copy>(candidates: &mut [(K, u64)], target: u64) -> Option<K> {
    candidates.sort_unstable();
    let mut acc = 0;
    for &(t, b) in candidates.iter() {
        acc += b;
        if acc >= target {
            return Some(t);
        }
    }
    candidates.last().map(|&(t, _)| t)
}

/// [`threshold`], with the bytes the candidates up to it hold: the rank up
/// to which the oldest candidates cover `target`, and what they cover (less
/// than `target` when all of them do not reach it).
pub(crate) fn cover<K: Ord + Copy>(candidates: &mut [(K, u64)], target: u64) -> Option<(K, u64)> {
    let t = threshold(candidates, target)?;
    let bytes = candidates
        .iter()
        .take_while(|&&(l, _)| l <= t)
        .map(|&(_, b)| b)
        .sum();
    Some((t, bytes))
}

/// Rounds' worth of copies kept queued or in flight while memory is past
/// its watermark: a round's copies alone leave the tier idle between rounds.
pub(crate) const COPY_ROUNDS_AHEAD: u64 = 3;

/// How much (in the round's unit) should be queued or under way for a
/// copy, given a round's `target` and what the copies `under_way` hold.
/// Zero when enough is under way.
pub(crate) fn queue_ahead(target: u64, under_way: u64) -> u64 {
    target
        .saturating_mul(COPY_ROUNDS_AHEAD)
        .saturating_sub(under_way)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::config::policy::{AllocationStrategy, EvictionPolicy, LeasePolicy};
    use crate::master::state::frequency::Order;

    fn rank(obj: &ObjectMeta, epoch: u32) -> Rank {
        Order::lru(epoch).rank(obj)
    }

    fn policy(high_watermark: f64, eviction_ratio: f64) -> Policy {
        Policy {
            lease: LeasePolicy {
                lease_ttl: 0,
                soft_pin_ttl: 0,
            },
            client_ttl: 1,
            discard_after: 1,
            release_after: 1,
            high_watermark,
            eviction_ratio,
            evict_soft_pinned: true,
            eviction_policy: EvictionPolicy::Frequency,
            strategy: AllocationStrategy::Random,
            put_fence: true,
        }
    }

    #[test]
    fn metadata_targets_go_below_the_metadata_watermark() {
        let p = policy(0.9, 0.1);
        assert_eq!(metadata_target(&p, 899, 900, 1000), None);
        assert_eq!(metadata_target(&p, 900, 900, 1000), Some(100));
        assert_eq!(metadata_target(&p, 950, 900, 1000), Some(150));
        assert_eq!(
            metadata_target(&p, 5, 0, 1000),
            Some(5),
            "never more than held"
        );
        assert_eq!(metadata_target(&p, 10, u64::MAX, u64::MAX), None, "off");
    }

    #[test]
    fn targets_go_below_the_watermark() {
        let p = policy(0.9, 0.2);
        assert_eq!(round_target(&p, 89, 100, false), None);
        assert_eq!(round_target(&p, 90, 100, false), Some(20));
        assert_eq!(
            round_target(&p, 10, 100, true),
            Some(10),
            "never more than used"
        );
        assert_eq!(round_target(&p, 0, 0, true), None);
    }

    #[test]
    fn ties_in_lease_time_go_in_order_of_use_across_the_wrap() {
        let obj = |lease_until, used| ObjectMeta {
            lease_until,
            used,
            ..ObjectMeta::absent()
        };
        // Uses counted just before and after the counter wraps, read
        // with an epoch between them.
        let epoch = u32::MAX - 1;
        let (a, b, c) = (obj(5, u32::MAX - 3), obj(5, u32::MAX), obj(5, 2));
        assert!(rank(&a, epoch) < rank(&b, epoch));
        assert!(
            rank(&b, epoch) < rank(&c, epoch),
            "a use after the wrap is newer"
        );
        assert!(
            rank(&obj(4, 2), epoch) < rank(&a, epoch),
            "the lease time comes first"
        );
        let mut c = [
            (rank(&c, epoch), 1),
            (rank(&a, epoch), 1),
            (rank(&b, epoch), 1),
        ];
        assert_eq!(cover(&mut c, 2), Some((rank(&b, epoch), 2)));
    }

    #[test]
    fn the_threshold_covers_the_target_oldest_first() {
        let mut c = [(30, 10), (10, 10), (20, 10)];
        assert_eq!(threshold(&mut c, 15), Some(20));
        assert_eq!(threshold(&mut c, 1000), Some(30));
        assert_eq!(threshold::<u64>(&mut [], 1), None);
    }

    #[test]
    fn copies_are_queued_rounds_ahead_until_enough_are_under_way() {
        // Nothing under way: three rounds' worth, not one.
        assert_eq!(queue_ahead(100, 0), 300);
        // One round under way: the next two go out before it lands.
        assert_eq!(queue_ahead(100, 100), 200);
        // Enough under way (or more): nothing more is queued.
        assert_eq!(queue_ahead(100, 300), 0);
        assert_eq!(queue_ahead(100, 1000), 0);
        assert_eq!(queue_ahead(u64::MAX, 0), u64::MAX);
        // The queue threshold covers the next-oldest, in eviction order.
        let mut c = [(40, 100), (10, 100), (30, 100), (20, 100), (50, 100)];
        assert_eq!(cover(&mut c, queue_ahead(100, 0)), Some((30, 300)));
        assert_eq!(cover(&mut c, queue_ahead(100, 100)), Some((20, 200)));
    }

    fn full() -> Result<u32> {
        Err(mooncake_common::Error::new(
            ErrorCode::NO_AVAILABLE_HANDLE,
            "full",
        ))
    }

    /// What a put did in `room_for`: its tries and whether it evicted.
    #[derive(Default)]
    struct Put {
        tries: u32,
        evicted: bool,
        /// The round was held at every try and eviction.
        held: bool,
    }

    /// Runs `room_for` for a put refused at generation `seen`, whose tries
    /// find room only once its own round has run (`room_after_own`) or at
    /// once (`!room_after_own`); its round frees something if `frees`.
    fn put(e: &Eviction, seen: u64, room_after_own: bool, frees: bool) -> (Result<u32>, Put) {
        let mut p = Put {
            held: true,
            ..Put::default()
        };
        let r = e.room_for(
            seen,
            full(),
            &mut p,
            |p| {
                p.tries += 1;
                p.held &= e.round.try_lock().is_none();
                if room_after_own && !p.evicted {
                    full()
                } else {
                    Ok(p.tries)
                }
            },
            |p| {
                p.held &= e.round.try_lock().is_none();
                p.evicted = true;
                frees
            },
        );
        (r, p)
    }

    #[test]
    fn a_put_whose_round_was_taken_by_another_still_runs_its_own() {
        let e = Eviction::default();
        // The timer's round ends between the put's try and its round,
        // freeing too little for it: the put tries again, then evicts
        // for itself and gets its room.
        let seen = e.generation();
        {
            let _round = e.begin_round();
            e.end_round();
        }
        let (r, p) = put(&e, seen, true, true);
        assert_eq!(r.unwrap(), 2, "a try after that round, one after its own");
        assert!(p.evicted && p.held, "its own round, holding the rounds");
        assert_eq!(e.generation(), seen + 2);

        // The other round made the room: one more try, no round.
        let seen = e.generation();
        e.end_round();
        let (r, p) = put(&e, seen, false, true);
        assert_eq!(r.unwrap(), 1);
        assert!(!p.evicted && p.held);
        assert_eq!(e.generation(), seen + 1, "no round of its own");
    }

    #[test]
    fn a_put_with_no_round_since_evicts_and_tries_once_more() {
        let e = Eviction::default();
        e.request();
        let seen = e.generation();
        let (r, p) = put(&e, seen, true, true);
        assert_eq!(r.unwrap(), 1, "no try before its own round");
        assert!(p.evicted && p.held);
        assert!(!e.take_request(), "its round answers the timer's request");
        // A round that frees nothing: the refusal stands, no blind try.
        let seen = e.generation();
        let (r, p) = put(&e, seen, true, false);
        assert!(no_room(&r));
        assert_eq!(p.tries, 0);
        assert!(p.evicted);
        assert!(e.round.try_lock().is_some(), "the round is given back");
    }

    #[test]
    fn cover_says_how_much_the_oldest_hold() {
        let mut c = [(30, 10), (10, 10), (20, 10), (20, 5)];
        assert_eq!(
            cover(&mut c, 12),
            Some((20, 25)),
            "ties at the threshold go too"
        );
        assert_eq!(cover(&mut c, 1000), Some((30, 35)));
        assert_eq!(cover::<u64>(&mut [], 1), None);
    }
}
