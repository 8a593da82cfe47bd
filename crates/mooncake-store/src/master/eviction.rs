//! Watermark eviction.
//!
//! When allocated bytes reach `eviction_high_watermark_ratio` of capacity,
//! the timer runs a round that frees enough to get `eviction_ratio` of
//! capacity below the watermark, and at least `eviction_ratio` of capacity.
//! When a put finds no space, a round runs at once (freeing at least what the
//! put needs) and the put is retried. Victims go oldest first by lease time (a read
//! extends it, so this approximates LRU). Never evicted: hard-pinned objects,
//! objects under a read lease, puts in flight. Soft-pinned objects go only in
//! a second pass, when the first freed too little and
//! `allow_evict_soft_pinned_objects` is set.

use std::sync::atomic::Ordering;

use super::allocator::aligned_len;
use super::objects::{ObjectMeta, SHARDS};
use super::service::MasterService;

impl MasterService {
    /// Runs an eviction round if usage calls for one; returns (keys, bytes) freed.
    pub fn evict_if_needed(&self, now: u64) -> (usize, u64) {
        let forced = self.need_eviction.swap(false, Ordering::Relaxed);
        let (used, capacity) = self.segments.usage();
        if capacity == 0 {
            return (0, 0);
        }
        let high = (self.policy.high_watermark * capacity as f64) as u64;
        if used < high && !forced {
            return (0, 0);
        }
        let ratio_bytes = (self.policy.eviction_ratio * capacity as f64) as u64;
        let target = used
            .saturating_sub(high.saturating_sub(ratio_bytes))
            .max(ratio_bytes);
        let _round = self.eviction_lock.lock();
        let freed = self.evict_round(now, target.min(used));
        self.eviction_generation.fetch_add(1, Ordering::Release);
        freed
    }

    /// A put found no space: evict synchronously (at least `need` bytes and
    /// `eviction_ratio` of capacity) so the caller can retry, as the
    /// reference does. `seen` is the eviction generation read before the
    /// failed attempt: if another round ran since, the caller just retries.
    /// Returns whether a retry may succeed.
    pub(super) fn evict_for_put(&self, need: u64, seen: u64, now: u64) -> bool {
        let _round = self.eviction_lock.lock();
        if self.eviction_generation.load(Ordering::Acquire) != seen {
            return true;
        }
        let (used, capacity) = self.segments.usage();
        let ratio_bytes = (self.policy.eviction_ratio * capacity as f64) as u64;
        let (keys, _) = self.evict_round(now, need.max(ratio_bytes).min(used));
        self.need_eviction.store(false, Ordering::Relaxed);
        self.eviction_generation.fetch_add(1, Ordering::Release);
        keys > 0
    }

    /// One round: frees `target` bytes (if it can), plain objects first.
    fn evict_round(&self, now: u64, target: u64) -> (usize, u64) {
        if target == 0 {
            return (0, 0);
        }
        self.counters
            .eviction_rounds
            .fetch_add(1, Ordering::Relaxed);
        let (mut keys, mut bytes) = self.evict_pass(now, target, false);
        if bytes < target && self.policy.evict_soft_pinned {
            let (k, b) = self.evict_pass(now, target - bytes, true);
            keys += k;
            bytes += b;
        }
        if keys > 0 {
            self.counters
                .eviction_rounds_freeing
                .fetch_add(1, Ordering::Relaxed);
            self.counters
                .evicted_keys
                .fetch_add(keys as u64, Ordering::Relaxed);
            self.counters
                .evicted_bytes
                .fetch_add(bytes, Ordering::Relaxed);
            tracing::info!(keys, bytes, target, "evicted objects");
        }
        (keys, bytes)
    }

    /// Evicts the oldest eligible objects until `target` bytes are freed.
    fn evict_pass(&self, now: u64, target: u64, include_soft_pinned: bool) -> (usize, u64) {
        let eligible = |obj: &ObjectMeta| {
            obj.is_complete()
                && obj.pending.is_none()
                && !obj.is_hard_pinned()
                && !obj.is_leased(now)
                && (include_soft_pinned || !obj.is_soft_pinned(now))
        };
        let footprint = |obj: &ObjectMeta| {
            aligned_len(obj.size).unwrap_or(obj.size) * obj.replicas.len() as u64
        };

        // Pass 1: find the lease time below which evicting frees enough,
        // without copying keys.
        let mut candidates: Vec<(u64, u64)> = Vec::new();
        for i in 0..SHARDS {
            let shard = self.objects.lock_shard(i);
            candidates.extend(
                shard
                    .map
                    .values()
                    .filter(|o| eligible(o))
                    .map(|o| (o.lease_until, footprint(o))),
            );
        }
        if candidates.is_empty() {
            return (0, 0);
        }
        candidates.sort_unstable();
        let mut acc = 0;
        let mut threshold = candidates.last().expect("not empty").0;
        for &(t, b) in &candidates {
            acc += b;
            if acc >= target {
                threshold = t;
                break;
            }
        }
        drop(candidates);

        // Pass 2: evict up to the threshold (objects may have changed since).
        let (mut keys, mut bytes) = (0, 0);
        for i in 0..SHARDS {
            if bytes >= target {
                break;
            }
            let mut shard = self.objects.lock_shard(i);
            shard.map.retain(|_, obj| {
                if bytes >= target || obj.lease_until > threshold || !eligible(obj) {
                    return true;
                }
                bytes += footprint(obj);
                keys += 1;
                self.release_object(obj, now);
                false
            });
        }
        (keys, bytes)
    }
}
