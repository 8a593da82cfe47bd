//! Watermark eviction.
//!
//! When allocated bytes reach `eviction_high_watermark_ratio` of capacity (or
//! an allocation just failed for lack of space), one round frees enough to
//! get `eviction_ratio` of capacity below the watermark, and at least
//! `eviction_ratio` of capacity. Victims go oldest first by lease time (a read
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
            .max(ratio_bytes)
            .min(used);
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
            tracing::info!(keys, bytes, used, capacity, "evicted objects");
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
