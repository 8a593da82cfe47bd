//! Which shard a consumer fetches next, and from whom (pure).
//!
//! The goal is that the publisher sends each shard about once, however many
//! consumers there are:
//! - a shard some consumer already holds is fetched from a consumer, never
//!   from the publisher (`gold`), and such shards go first;
//! - among holders, the one this process is reading the least from right
//!   now, ties broken at random, so readers spread over the holders;
//! - shards only the publisher has are taken in an order of this
//!   consumer's own (a permutation seeded by its name), so consumers that
//!   begin together mostly fetch different shards from the publisher, and
//!   each then fetches the others' from them. (A walk from a starting
//!   place would not do: two consumers starting close together would walk
//!   in step, fetching the same shards at the same time all the way.)
//! - once other consumers hold shards, one read at a time from the
//!   publisher ([`gold_cap`]): the other reads go to peers.
//! - a shard only the publisher holds that another consumer is reading
//!   from it right now (`claimed`) is left to that consumer: this one
//!   reads it from there once it has it.
//!
//! Holders that failed during this `GetReplica` (`failed`) and this
//! consumer itself are never chosen.

use std::collections::{HashMap, HashSet};

use rand::seq::SliceRandom;
use rand::Rng;

use crate::record::{Location, Payload};

/// A fetch to start: shard `shard` from `source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pick {
    pub shard: usize,
    pub source: Location,
    pub from_gold: bool,
}

/// What the picker knows besides the record.
pub struct PickState<'a> {
    /// This consumer's segment name.
    pub me: &'a str,
    /// Shards not fetched and not in flight.
    pub todo: &'a [usize],
    /// Holders that failed a fetch of this call.
    pub failed: &'a HashSet<String>,
    /// Shards another consumer is reading from the publisher right now.
    pub claimed: &'a HashSet<usize>,
    /// Fetches in flight from each holder.
    pub load: &'a HashMap<String, usize>,
    /// Seeds this consumer's order of publisher-only shards ([`seed_for`]).
    pub seed: u64,
    /// Reads from the publisher in flight here, and how many may be: the
    /// caller allows one once other consumers hold shards ([`gold_cap`]).
    pub gold_in_flight: usize,
    pub gold_cap: usize,
}

/// The next fetch, or `None` when no shard of `todo` has a usable holder.
pub fn pick(payload: &Payload, st: &PickState<'_>, rng: &mut impl Rng) -> Option<Pick> {
    let usable = |l: &Location| l.segment_name != st.me && !st.failed.contains(&l.segment_name);
    let load = |l: &Location| st.load.get(&l.segment_name).copied().unwrap_or(0);

    // Shards some consumer holds: the least loaded replica holder overall.
    let mut best: Vec<(usize, &Location)> = Vec::new();
    let mut best_load = usize::MAX;
    for &i in st.todo {
        let Some(shard) = payload.shards.get(i) else {
            continue;
        };
        for l in shard.replica_list.iter().filter(|l| usable(l)) {
            let n = load(l);
            if n < best_load {
                best_load = n;
                best.clear();
            }
            if n == best_load {
                best.push((i, l));
            }
        }
    }
    if let Some(&(shard, source)) = best.choose(rng) {
        return Some(Pick {
            shard,
            source: source.clone(),
            from_gold: false,
        });
    }

    // Publisher-only shards, in this consumer's order.
    if st.gold_in_flight >= st.gold_cap {
        return None;
    }
    let mut order: Vec<usize> = st.todo.to_vec();
    order.sort_by_key(|&i| rank(st.seed, i));
    for i in order.into_iter().filter(|i| !st.claimed.contains(i)) {
        let Some(shard) = payload.shards.get(i) else {
            continue;
        };
        let mut golds: Vec<&Location> = shard.gold.iter().filter(|l| usable(l)).collect();
        golds.shuffle(rng);
        if let Some(source) = golds.into_iter().min_by_key(|l| load(l)) {
            return Some(Pick {
                shard: i,
                source: source.clone(),
                from_gold: true,
            });
        }
    }
    None
}

/// Reads from the publisher one consumer may have in flight: all its
/// `parallel` reads while no other consumer holds a shard (nobody else to
/// read from), then one. Each consumer then takes a new shard from the
/// publisher only as it finishes one, and fetches the rest from its peers,
/// so few consumers ask the publisher for the same shard at the same time.
pub fn gold_cap(payload: &Payload, me: &str, parallel: usize) -> usize {
    let others = payload
        .shards
        .iter()
        .flat_map(|s| &s.replica_list)
        .any(|l| l.segment_name != me);
    if others {
        1
    } else {
        parallel.max(1)
    }
}

/// The seed of a consumer's shard order, from its segment name.
pub fn seed_for(me: &str) -> u64 {
    // FNV-1a: stable across processes and builds, unlike the std hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in me.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Shard `i`'s place in the order `seed` gives (splitmix64's mixer).
fn rank(seed: u64, i: usize) -> u64 {
    let mut z = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn loc(seg: &str, offset: u64) -> Location {
        Location {
            segment_name: seg.into(),
            offset,
        }
    }

    fn payload(shards: usize) -> Payload {
        Payload::published("p", "pub", &[(1 << 20, shards as u64 * 4096)], 4096)
    }

    struct Fixture {
        todo: Vec<usize>,
        failed: HashSet<String>,
        claimed: HashSet<usize>,
        load: HashMap<String, usize>,
        seed: u64,
        gold_in_flight: usize,
        gold_cap: usize,
    }

    impl Fixture {
        fn new(todo: Vec<usize>) -> Fixture {
            Fixture {
                todo,
                failed: HashSet::new(),
                claimed: HashSet::new(),
                load: HashMap::new(),
                seed: 0,
                gold_in_flight: 0,
                gold_cap: 4,
            }
        }
        fn pick(&self, p: &Payload, me: &str, seed: u64) -> Option<Pick> {
            let st = PickState {
                me,
                todo: &self.todo,
                failed: &self.failed,
                claimed: &self.claimed,
                load: &self.load,
                seed: self.seed,
                gold_in_flight: self.gold_in_flight,
                gold_cap: self.gold_cap,
            };
            pick(p, &st, &mut StdRng::seed_from_u64(seed))
        }
    }

    #[test]
    fn a_shard_held_by_a_consumer_goes_first_and_not_from_the_publisher() {
        let mut p = payload(4);
        p.add_replica(2, loc("c1", 99));
        let f = Fixture::new(vec![0, 1, 2, 3]);
        for seed in 0..20 {
            let got = f.pick(&p, "c2", seed).unwrap();
            assert_eq!(
                got,
                Pick {
                    shard: 2,
                    source: loc("c1", 99),
                    from_gold: false
                }
            );
        }
    }

    #[test]
    fn publisher_only_shards_come_in_the_consumers_own_order() {
        let p = payload(16);
        let mut f = Fixture::new((0..16).collect());
        let mut order = |seed: u64| {
            f.seed = seed;
            let mut todo: Vec<usize> = (0..16).collect();
            let mut got = Vec::new();
            while !todo.is_empty() {
                f.todo = todo.clone();
                let next = f.pick(&p, "c", 1).unwrap();
                assert!(next.from_gold);
                got.push(next.shard);
                todo.retain(|&i| i != next.shard);
            }
            got
        };
        let (a, b) = (
            order(seed_for("127.0.0.1:16001")),
            order(seed_for("127.0.0.1:16002")),
        );
        assert_eq!(a, order(seed_for("127.0.0.1:16001")), "deterministic");
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..16).collect::<Vec<_>>(), "every shard once");
        // Two consumers do not walk in step: their first picks differ.
        let same_first = a.iter().zip(&b).take(4).filter(|(x, y)| x == y).count();
        assert!(same_first < 4, "{a:?} {b:?}");
        assert_ne!(a, (0..16).collect::<Vec<_>>());
    }

    #[test]
    fn load_spreads_over_the_holders() {
        let mut p = payload(2);
        for s in 0..2 {
            p.add_replica(s, loc("c1", s as u64));
            p.add_replica(s, loc("c2", s as u64));
        }
        let mut f = Fixture::new(vec![0, 1]);
        f.load.insert("c1".into(), 2);
        f.load.insert("c2".into(), 1);
        for seed in 0..20 {
            assert_eq!(f.pick(&p, "c3", seed).unwrap().source.segment_name, "c2");
        }
        f.load.insert("c2".into(), 2);
        let mut seen = HashSet::new();
        for seed in 0..50 {
            seen.insert(f.pick(&p, "c3", seed).unwrap().source.segment_name);
        }
        assert_eq!(seen.len(), 2, "ties are broken at random: {seen:?}");
    }

    #[test]
    fn failed_holders_and_self_are_never_picked() {
        let mut p = payload(1);
        p.add_replica(0, loc("me", 1));
        p.add_replica(0, loc("dead", 2));
        let mut f = Fixture::new(vec![0]);
        f.failed.insert("dead".into());
        let got = f.pick(&p, "me", 3).unwrap();
        assert_eq!(got.source.segment_name, "pub");
        assert!(got.from_gold);
        f.failed.insert("pub".into());
        assert_eq!(f.pick(&p, "me", 3), None);
        // A shard not in the record is skipped, not a panic.
        let f = Fixture::new(vec![7]);
        assert_eq!(f.pick(&p, "me", 3), None);
    }

    #[test]
    fn one_read_from_the_publisher_at_a_time_once_peers_hold_shards() {
        let mut p = payload(4);
        assert_eq!(gold_cap(&p, "me", 4), 4, "nobody else to read from");
        p.add_replica(0, loc("me", 1));
        assert_eq!(gold_cap(&p, "me", 4), 4, "only this consumer holds shards");
        p.add_replica(1, loc("c1", 1));
        assert_eq!(gold_cap(&p, "me", 4), 1);
        assert_eq!(gold_cap(&p, "me", 0), 1);

        let mut f = Fixture::new(vec![1, 2, 3]);
        f.gold_cap = 1;
        f.gold_in_flight = 1;
        // The shard a peer holds is still taken; publisher-only ones wait.
        assert_eq!(f.pick(&p, "me", 1).unwrap().shard, 1);
        f.todo = vec![2, 3];
        assert_eq!(f.pick(&p, "me", 1), None);
        f.gold_in_flight = 0;
        assert!(f.pick(&p, "me", 1).unwrap().from_gold);
    }

    #[test]
    fn a_shard_another_consumer_reads_from_the_publisher_is_left_to_it() {
        let p = payload(3);
        let mut f = Fixture::new(vec![0, 1, 2]);
        f.claimed = [0, 2].into_iter().collect();
        for seed in 0..10 {
            assert_eq!(f.pick(&p, "me", seed).unwrap().shard, 1);
        }
        f.claimed.insert(1);
        assert_eq!(f.pick(&p, "me", 1), None);
        // A claimed shard a peer already holds is read from the peer.
        let mut p = p;
        p.add_replica(2, loc("c1", 5));
        assert_eq!(f.pick(&p, "me", 1).unwrap().source, loc("c1", 5));
    }
}
