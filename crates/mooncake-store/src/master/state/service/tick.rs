//! Time: the timers (client expiry, put timeouts, delayed frees, task
//! timeouts) and eviction rounds.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::apply::Fate;
use super::{MasterService, TickReport};
use crate::master::events::{Kind, Medium};
use crate::master::state::eviction::{self, eligible, footprint, Rank};
use crate::master::state::frequency::Order;
use crate::master::state::leases::uses_now;
use crate::master::state::mutation::{Call, ObjectOp};
use crate::master::state::objects::{metadata_cost, ObjectMeta};

/// What an eviction round counts towards its target.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Measure {
    /// Allocated segment bytes.
    Space,
    /// Metadata bytes, as `--max_metadata_bytes` counts them.
    Metadata,
}

impl Measure {
    fn of(self, key: &str, obj: &ObjectMeta) -> u64 {
        match self {
            Measure::Space => footprint(obj),
            Measure::Metadata => metadata_cost(key),
        }
    }
}

impl MasterService {
    /// Runs the timers: client expiry, put timeouts, delayed frees, eviction.
    /// What they log answers no call: nobody waits for it.
    pub fn tick(&self, now: u64) -> TickReport {
        let call = &mut Call::default();
        let mut r = TickReport {
            expired_clients: self.expire_clients(call, now),
            ..Default::default()
        };
        self.suspect_clients(now);
        r.discarded_puts = self.sweep_stale_puts(call, now);
        r.freed_retired = self.free_retired(call, now);
        r.failed_tasks = self.expire_tasks(call, now);
        // Extra replicas of hot keys go before any object is evicted.
        self.hot_key_tick(call, now);
        let (keys, bytes) = self.evict_if_needed(call, now);
        r.evicted_keys = keys;
        r.evicted_bytes = bytes;
        self.retry_promotions(now);
        r
    }

    /// Discards puts in flight for longer than the discard timeout.
    fn sweep_stale_puts(&self, call: &mut Call, now: u64) -> usize {
        let discard_after = self.policy.discard_after;
        let mut n = 0;
        for mut shard in self.objects.shards() {
            if shard.oldest_pending.saturating_add(discard_after) > now {
                continue;
            }
            let mut oldest = u64::MAX;
            self.objects.retain(&mut shard, |key, obj| {
                let Some(p) = &obj.pending else { return true };
                if now.saturating_sub(p.started) < discard_after {
                    oldest = oldest.min(p.started);
                    return true;
                }
                n += 1;
                let discard = ObjectOp::DiscardPut { free_at: None, now };
                self.apply_object(call, key, obj, discard) == Fate::Keep
            });
            shard.oldest_pending = oldest;
        }
        self.counters
            .discarded_puts
            .fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// Frees retired space whose time has come; returns how many ranges.
    fn free_retired(&self, call: &mut Call, now: u64) -> usize {
        if !self.retired.any_due(now) {
            return 0;
        }
        self.apply_free_retired(call, now)
    }

    /// Staging bytes of discarded puts not yet released.
    pub fn discarded_staging_bytes(&self) -> u64 {
        self.retired.staging_bytes()
    }

    /// Allocated bytes waiting in the retired list (on mounted segments).
    pub fn retired_bytes(&self) -> u64 {
        self.retired.bytes()
    }

    /// Runs an eviction round if usage calls for one; returns (keys, bytes) freed.
    fn evict_if_needed(&self, call: &mut Call, now: u64) -> (usize, u64) {
        let forced = self.eviction.take_request();
        let (used, capacity) = self.segments.usage();
        let space = eviction::round_target(&self.policy, used, capacity, forced);
        let metadata = eviction::metadata_target(
            &self.policy,
            self.objects.metadata_bytes(),
            self.objects.metadata_watermark(),
            self.objects.metadata_limit(),
        );
        if space.is_none() && metadata.is_none() {
            return (0, 0);
        }
        let _round = self.eviction.begin_round();
        let (mut keys, mut bytes) = (0, 0);
        if let Some(target) = space {
            (keys, bytes) = self.evict_round(call, now, target, Measure::Space);
        }
        // Metadata still past its watermark (what the space round freed
        // counts): the oldest objects go until it is below.
        let metadata = metadata.and_then(|_| {
            eviction::metadata_target(
                &self.policy,
                self.objects.metadata_bytes(),
                self.objects.metadata_watermark(),
                self.objects.metadata_limit(),
            )
        });
        if let Some(target) = metadata {
            let (k, b) = self.evict_round(call, now, target, Measure::Metadata);
            keys += k;
            bytes += b;
        }
        self.eviction.end_round();
        (keys, bytes)
    }

    /// A put found no space: evict at once (at least `need` bytes and
    /// `eviction_ratio` of capacity) so the caller can retry, as the
    /// reference does. Runs inside the put's round
    /// ([`eviction::Eviction::room_for`]). Returns whether it freed
    /// anything.
    pub(super) fn evict_for_put(&self, call: &mut Call, need: u64, now: u64) -> bool {
        let (used, capacity) = self.segments.usage();
        let ratio_bytes = eviction::ratio_bytes(&self.policy, capacity);
        let target = need.max(ratio_bytes).min(used);
        let (keys, _) = self.evict_round(call, now, target, Measure::Space);
        keys > 0
    }

    /// One round: frees `target` (in `by`'s unit) if it can, plain objects
    /// first; returns the keys and the segment bytes freed. Objects that
    /// must reach an SSD tier first are queued for it and stay, unless
    /// `--offload_force_evict` lets a short round take them.
    fn evict_round(&self, call: &mut Call, now: u64, target: u64, by: Measure) -> (usize, u64) {
        if target == 0 {
            return (0, 0);
        }
        let c = &self.counters;
        c.eviction_rounds.fetch_add(1, Ordering::Relaxed);
        let mut queue_budget = self.offload_policy().per_round();
        let mut pass = |target, soft, force, budget: &mut usize| {
            self.evict_pass(call, now, target, soft, force, budget, by)
        };
        let (mut keys, mut freed, mut bytes) = pass(target, false, false, &mut queue_budget);
        if freed < target && self.policy.evict_soft_pinned {
            let (k, f, b) = pass(target - freed, true, false, &mut queue_budget);
            keys += k;
            freed += f;
            bytes += b;
        }
        let tiers = self.offload_policy().enabled || self.files.enabled();
        if freed < target && tiers && self.offload_policy().force_evict {
            let soft = self.policy.evict_soft_pinned;
            let (k, _, b) = pass(target - freed, soft, true, &mut 0);
            keys += k;
            bytes += b;
        }
        if keys > 0 {
            c.eviction_rounds_freeing.fetch_add(1, Ordering::Relaxed);
            c.evicted_keys.fetch_add(keys as u64, Ordering::Relaxed);
            c.evicted_bytes.fetch_add(bytes, Ordering::Relaxed);
            tracing::info!(keys, bytes, target, "evicted objects");
        }
        (keys, bytes)
    }

    /// Evicts the oldest eligible objects until `target` (in `by`'s unit)
    /// is freed; returns the keys, what `by` counted and the segment bytes;
    /// `force` takes objects that have no disk copy yet.
    ///
    /// Memory is one LRU, as in the reference, where a tier takes objects
    /// at eviction (`--offload_on_evict`, the shared filesystem): the
    /// oldest objects that cover `target` (less what the copies under way
    /// will free) go, those with a disk copy now, those still waiting for
    /// one are queued for it (up to `queue_budget`) and go in a later
    /// round once it lands; newer objects stay, copy or not (a promoted
    /// object, just read, is not the first to leave again). Where the SSD
    /// tier copies every object at PutEnd, those waiting for a copy are
    /// the newest: the oldest with a copy go, and more copies are queued
    /// only when those cover too little ([`Self::one_lru`]). A group goes
    /// whole, ranked by its newest member, and only when no member is
    /// leased.
    #[allow(clippy::too_many_arguments)]
    fn evict_pass(
        &self,
        call: &mut Call,
        now: u64,
        target: u64,
        include_soft_pinned: bool,
        force: bool,
        queue_budget: &mut usize,
        by: Measure,
    ) -> (usize, u64, u64) {
        let may_go = |o: &ObjectMeta| {
            eligible(o, now, include_soft_pinned) && self.may_leave_memory(o, force)
        };
        let must_wait = |o: &ObjectMeta| {
            *queue_budget > 0 && eligible(o, now, include_soft_pinned) && !may_go(o)
        };
        // Pass 1: find the rank up to which evicting (or copying, then
        // evicting) frees enough, without copying keys.
        let grouping = self.objects.groups.grouping();
        let order = self
            .eviction
            .weight
            .order(self.policy.eviction_policy, uses_now());
        let mut candidates: Vec<(Rank, u64)> = Vec::new();
        let mut groups: HashMap<u32, GroupStanding> = HashMap::new();
        // Objects at most `threshold` wait for a copy: queue them.
        let mut queue = false;
        let lru = self.one_lru();
        let mut waiting: Vec<(Rank, u64)> = Vec::new();
        let mut under_way = 0;
        for shard in self.objects.shards() {
            for (key, o) in shard.iter() {
                let go = may_go(o);
                let mut wait = !go && must_wait(o);
                if wait && self.copy_under_way(key, o) {
                    // Leaving already, the oldest when queued (the copy's
                    // lease moved its rank since).
                    under_way += by.of(key, o);
                    wait = false;
                }
                if wait && !lru {
                    waiting.push((order.rank(o), by.of(key, o)));
                    wait = false;
                }
                if let Some(g) = grouping.group_of(key) {
                    let st = groups.entry(g).or_default();
                    st.seen += 1;
                    st.leased |= o.is_leased(now);
                    if go || wait {
                        st.rank = st.rank.max(order.rank(o));
                        st.bytes += by.of(key, o);
                        st.waiting |= wait;
                    }
                } else if go || wait {
                    candidates.push((order.rank(o), by.of(key, o)));
                    queue |= wait;
                }
            }
        }
        // A group whose members all were seen, none of them leased.
        let groups: HashMap<u32, Rank> = groups
            .into_iter()
            .filter(|(g, st)| !st.leased && st.bytes > 0 && st.seen == grouping.size(*g))
            .map(|(g, st)| {
                candidates.push((st.rank, st.bytes));
                queue |= st.waiting;
                (g, st.rank)
            })
            .collect();
        let evictable = if lru {
            // One order for all: the copies under way cover part of it.
            let need = target.saturating_sub(under_way);
            // The SSD tier's next rounds of copies are queued now,
            // next-oldest first, so it writes on while this round's land.
            let ssd = self.offload_policy().enabled;
            let ahead = eviction::queue_ahead(target, under_way);
            if ssd && queue && ahead > need {
                if let Some((below, _)) = eviction::cover(&mut candidates, ahead) {
                    let below = (below, order);
                    self.queue_oldest(now, below, include_soft_pinned, force, queue_budget);
                }
            }
            if need == 0 {
                return (0, 0, 0);
            }
            eviction::cover(&mut candidates, need)
        } else {
            // Objects without a copy are the newest (each got one queued
            // at PutEnd): those with one go, oldest first, and only if they
            // cover too little are more copies queued.
            let evictable = eviction::cover(&mut candidates, target);
            let freeable = evictable.map_or(0, |(_, b)| b);
            let short = target.saturating_sub(freeable).saturating_sub(under_way);
            let below = eviction::cover(&mut waiting, short).filter(|_| short > 0);
            if let Some((below, _)) = below {
                self.queue_oldest(
                    now,
                    (below, order),
                    include_soft_pinned,
                    force,
                    queue_budget,
                );
            }
            evictable
        };
        drop(candidates);
        let Some((threshold, _)) = evictable else {
            return (0, 0, 0);
        };
        if !include_soft_pinned && !force {
            self.eviction.weight.note_boundary(now, threshold);
        }
        if queue {
            let below = (threshold, order);
            self.queue_oldest(now, below, include_soft_pinned, force, queue_budget);
        }

        // Pass 2: evict up to the threshold (objects may have changed
        // since); a chosen group's members go whatever the count says.
        let whole_groups = groups.values().any(|&r| r <= threshold);
        let (mut keys, mut freed, mut bytes) = (0, 0, 0);
        for mut shard in self.objects.shards() {
            if freed >= target && !whole_groups {
                break;
            }
            self.objects.retain(&mut shard, |key, obj| {
                let chosen = match grouping.group_of(key) {
                    Some(g) => groups.get(&g).is_some_and(|&r| r <= threshold),
                    None => freed < target && order.rank(obj) <= threshold,
                };
                if !chosen || !may_go(obj) {
                    return true;
                }
                freed += by.of(key, obj);
                bytes += footprint(obj);
                keys += 1;
                let fate = self.apply_object(call, key, obj, ObjectOp::Remove { now });
                if !self.disk.has_copy(key) {
                    // The last copy went from memory.
                    self.kv_event(Kind::Removed, key, Medium::Cpu);
                }
                fate == Fate::Keep
            });
        }
        (keys, freed, bytes)
    }

    /// Whether eviction keeps memory in one LRU order (see `evict_pass`):
    /// all but the SSD tier's put mode.
    fn one_lru(&self) -> bool {
        let policy = self.offload_policy();
        !policy.enabled || policy.on_evict
    }

    /// Queues for a copy every object waiting for one ranked at most
    /// `below` (a rank and its round's order), while `queue_budget` lasts.
    fn queue_oldest(
        &self,
        now: u64,
        (below, order): (Rank, Order),
        include_soft_pinned: bool,
        force: bool,
        queue_budget: &mut usize,
    ) {
        for shard in self.objects.shards() {
            for (key, o) in shard.iter() {
                if *queue_budget == 0 {
                    return;
                }
                if order.rank(o) <= below
                    && eligible(o, now, include_soft_pinned)
                    && !self.may_leave_memory(o, force)
                    && !self.copy_under_way(key, o)
                    && self.queue_offload(key, o, usize::MAX)
                {
                    *queue_budget -= 1;
                }
            }
        }
    }
}

/// What pass 1 of an eviction round saw of one group.
#[derive(Default)]
struct GroupStanding {
    /// Members seen in the object map.
    seen: usize,
    /// A member is leased: the group stays.
    leased: bool,
    /// Its newest eligible member's rank.
    rank: Rank,
    /// What its eligible members hold.
    bytes: u64,
    /// A member waits for a copy.
    waiting: bool,
}
