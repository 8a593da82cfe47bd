use proptest::prelude::*;
use rand::{Rng, SeedableRng};

use super::*;

/// The master's granularity.
type Fine = OffsetAllocator<8>;
/// The staging pool's (a cache line).
type Coarse = OffsetAllocator<64>;

#[test]
fn allocates_until_full_and_coalesces() {
    let mut a = Fine::new(4096);
    let blocks: Vec<u64> = (0..4).map(|_| a.allocate(1024).unwrap()).collect();
    assert_eq!(blocks, [0, 1024, 2048, 3072]);
    assert_eq!(a.allocate(1), None);
    a.free(1024, 1024).unwrap();
    a.free(3072, 1024).unwrap();
    assert_eq!(a.largest_free(), 1024);
    // Freeing the middle block merges three ranges into one.
    a.free(2048, 1024).unwrap();
    assert_eq!(a.free_ranges(), 1);
    assert_eq!(a.largest_free(), 3072);
    assert_eq!(a.allocate(3000), Some(1024));
    a.check();
}

#[test]
fn best_fit_picks_the_smallest_hole() {
    let mut a = Fine::new(10_000);
    let x = a.allocate(100).unwrap();
    let _y = a.allocate(800).unwrap();
    let z = a.allocate(40).unwrap();
    let _w = a.allocate(800).unwrap();
    a.free(x, 100).unwrap();
    a.free(z, 40).unwrap();
    // 40 fits the 40-byte hole exactly, not the 104-byte one.
    assert_eq!(a.allocate(33), Some(z));
    assert_eq!(a.allocate(90), Some(x));
    a.check();
}

#[test]
fn best_fit_and_coalescing_at_cache_line_granularity() {
    let mut a = Coarse::new(1024);
    let x = a.allocate(100).unwrap();
    let y = a.allocate(64).unwrap();
    let z = a.allocate(200).unwrap();
    assert_eq!((x, y, z), (0, 128, 192));
    a.free(y, 64).unwrap();
    // The 64-byte hole is the best fit for a small request.
    assert_eq!(a.allocate(10).unwrap(), 128);
    a.free(128, 10).unwrap();
    a.free(x, 100).unwrap();
    a.free(z, 200).unwrap();
    assert_eq!(a.used(), 0);
    assert_eq!(a.allocate(1024), Some(0), "all ranges merged back into one");
    assert_eq!(a.allocate(1), None);
    a.check();
}

#[test]
fn rejects_bad_frees() {
    let mut a = Fine::new(1024);
    let x = a.allocate(64).unwrap();
    assert!(a.free(x + 8, 64).is_err(), "overlaps the free tail");
    assert!(a.free(3, 8).is_err(), "misaligned");
    assert!(a.free(1000, 64).is_err(), "past the end");
    assert!(a.free(u64::MAX - 3, 8).is_err(), "wraps around");
    assert!(a.free(0, u64::MAX).is_err(), "length overflows");
    a.free(x, 64).unwrap();
    assert!(a.free(x, 64).is_err(), "double free");
    a.check();
    assert_eq!(a.used(), 0);
}

#[test]
fn rounding_and_zero_capacity() {
    let mut a = Fine::new(100);
    assert_eq!(a.capacity(), 96);
    assert_eq!(a.allocate(1), Some(0));
    assert_eq!(a.used(), 8);
    assert_eq!(a.allocate(u64::MAX), None);
    let mut empty = Fine::new(0);
    assert_eq!(empty.allocate(1), None);
    let mut c = Coarse::new(100);
    assert_eq!(c.capacity(), 64);
    assert_eq!(c.allocate(65), None);
    assert_eq!(c.allocate(u64::MAX), None);
    assert_eq!(Coarse::new(0).allocate(1), None);
    assert_eq!(Fine::aligned_len(0), Some(0));
    assert_eq!(Fine::reserved_len(0), Some(8));
    assert_eq!(Coarse::reserved_len(65), Some(128));
    assert_eq!(Fine::aligned_len(u64::MAX), None);
}

#[test]
fn random_workload_keeps_invariants() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut a = Fine::new(1 << 20);
    let mut live: Vec<(u64, u64)> = Vec::new();
    for _ in 0..20_000 {
        if live.is_empty() || rng.gen_bool(0.55) {
            let size = rng.gen_range(1..8192);
            if let Some(off) = a.allocate(size) {
                live.push((off, size));
            }
        } else {
            let (off, size) = live.swap_remove(rng.gen_range(0..live.len()));
            a.free(off, size).unwrap();
        }
    }
    a.check();
    // Live blocks never overlap.
    live.sort();
    for w in live.windows(2) {
        assert!(w[0].0 + Fine::aligned_len(w[0].1).unwrap() <= w[1].0);
    }
    for (off, size) in live.drain(..) {
        a.free(off, size).unwrap();
    }
    a.check();
    assert_eq!(a.free_ranges(), 1);
}

/// The obvious allocator: the live blocks in a list, free space is what
/// lies between them, best fit by scanning every gap.
#[derive(Default)]
struct Model {
    capacity: u64,
    /// (offset, reserved length), sorted by offset.
    live: Vec<(u64, u64)>,
}

impl Model {
    fn gaps(&self) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut at = 0;
        for &(off, len) in &self.live {
            if off > at {
                gaps.push((at, off - at));
            }
            at = off + len;
        }
        if self.capacity > at {
            gaps.push((at, self.capacity - at));
        }
        gaps
    }

    /// The smallest gap that fits, the lowest offset among equals.
    fn allocate(&mut self, need: u64) -> Option<u64> {
        let (off, _) = self
            .gaps()
            .into_iter()
            .filter(|&(_, len)| len >= need)
            .min_by_key(|&(off, len)| (len, off))?;
        let at = self.live.partition_point(|&(o, _)| o < off);
        self.live.insert(at, (off, need));
        Some(off)
    }
}

#[derive(Clone, Debug)]
enum Op {
    Allocate(u64),
    /// Frees the live block chosen by the index, then tries to free it again.
    Free(usize, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..700).prop_map(Op::Allocate),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(i, twice)| Op::Free(i, twice)),
    ]
}

/// Runs `ops` on the allocator and the model: same offsets, same free
/// space, and every double free refused without a trace.
fn against_model<const A: u64>(capacity: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut a = OffsetAllocator::<A>::new(capacity);
    let mut m = Model {
        capacity: a.capacity(),
        ..Model::default()
    };
    // The sizes asked for, by offset (a free passes the asked size).
    let mut asked = std::collections::HashMap::new();
    for op in ops {
        match *op {
            Op::Allocate(size) => {
                let need = OffsetAllocator::<A>::reserved_len(size).unwrap();
                let got = a.allocate(size);
                prop_assert_eq!(got, m.allocate(need), "allocate({})", size);
                if let Some(off) = got {
                    prop_assert_eq!(off % A, 0);
                    asked.insert(off, size);
                }
            }
            Op::Free(_, _) if m.live.is_empty() => {}
            Op::Free(i, twice) => {
                let (off, _) = m.live.remove(i % m.live.len());
                let size = asked.remove(&off).unwrap();
                prop_assert!(a.free(off, size).is_ok());
                if twice {
                    prop_assert_eq!(
                        a.free(off, size),
                        Err(BadFree {
                            offset: off,
                            len: size
                        })
                    );
                }
            }
        }
        a.check();
        let gaps = m.gaps();
        prop_assert_eq!(a.used(), m.live.iter().map(|&(_, l)| l).sum::<u64>());
        prop_assert_eq!(a.free_ranges(), gaps.len());
        prop_assert_eq!(
            a.largest_free(),
            gaps.iter().map(|&(_, l)| l).max().unwrap_or(0)
        );
    }
    Ok(())
}

proptest! {
    #[test]
    fn matches_a_model_at_both_granularities(
        capacity in 0u64..8192,
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        against_model::<8>(capacity, &ops)?;
        against_model::<64>(capacity, &ops)?;
    }

    #[test]
    fn never_overlaps(ops in proptest::collection::vec((1u64..300, any::<bool>()), 1..200)) {
        let mut a = Coarse::new(4096);
        let mut live: Vec<(u64, u64)> = Vec::new();
        for (len, free_first) in ops {
            if free_first && !live.is_empty() {
                let (o, l) = live.swap_remove(len as usize % live.len());
                a.free(o, l).unwrap();
            }
            if let Some(o) = a.allocate(len) {
                let end = o + Coarse::reserved_len(len).unwrap();
                prop_assert!(end <= 4096);
                for &(lo, ll) in &live {
                    let lend = lo + Coarse::reserved_len(ll).unwrap();
                    prop_assert!(end <= lo || o >= lend, "overlap");
                }
                live.push((o, len));
            }
            let sum: u64 = live.iter().map(|&(_, l)| Coarse::reserved_len(l).unwrap()).sum();
            prop_assert_eq!(a.used(), sum);
        }
        for (o, l) in live { a.free(o, l).unwrap(); }
        prop_assert_eq!(a.allocate(4096), Some(0));
    }
}

#[test]
fn reserve_takes_exactly_the_range_asked_for() {
    let mut a = Fine::new(4096);
    a.reserve(1024, 100).unwrap();
    a.check();
    assert_eq!(a.used(), 104);
    // Overlapping, misaligned, out of bounds: refused, nothing changes.
    assert!(a.reserve(1000, 100).is_err());
    assert!(a.reserve(1100, 8).is_err());
    assert!(a.reserve(1, 8).is_err());
    assert!(a.reserve(4090, 16).is_err());
    assert!(a.reserve(u64::MAX - 7, 16).is_err());
    assert_eq!(a.used(), 104);
    a.check();
    // The holes on both sides stay usable and the range frees normally.
    a.reserve(0, 1024).unwrap();
    a.reserve(1128, 2968).unwrap();
    assert_eq!(a.allocate(1), None);
    a.free(1024, 100).unwrap();
    assert_eq!(a.allocate(100), Some(1024));
    a.check();
}

#[test]
fn reserving_what_allocate_chose_rebuilds_the_same_allocator() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut a = Fine::new(1 << 20);
    let mut live = Vec::new();
    for _ in 0..500 {
        if live.is_empty() || rng.gen_bool(0.6) {
            let size = rng.gen_range(1..5000);
            if let Some(off) = a.allocate(size) {
                live.push((off, size));
            }
        } else {
            let (off, size) = live.swap_remove(rng.gen_range(0..live.len()));
            a.free(off, size).unwrap();
        }
    }
    let mut b = Fine::new(1 << 20);
    for &(off, size) in &live {
        b.reserve(off, size).unwrap();
    }
    b.check();
    assert_eq!((a.used(), a.free_ranges()), (b.used(), b.free_ranges()));
    assert_eq!(a.largest_free(), b.largest_free());
}

#[test]
fn reserve_all_matches_reserving_one_by_one() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for round in 0..50 {
        let mut one = Fine::new(1 << 20);
        // Some allocations and frees first, so the free list has holes.
        let taken: Vec<u64> = (0..40)
            .filter_map(|_| one.allocate(rng.gen_range(1..4000)))
            .collect();
        for (i, &o) in taken.iter().enumerate() {
            if i % 3 == 0 {
                let _ = one.free(o, 1);
            }
        }
        let mut all = Fine::new(1 << 20);
        let mut ranges = Vec::new();
        for (o, l) in one.free_list().collect::<Vec<_>>() {
            // Carve ranges that fit each free range, in shuffled order.
            let mut at = o;
            while at + 64 <= o + l && ranges.len() < 500 {
                let size = rng.gen_range(1..=64);
                ranges.push((at, size));
                at += Fine::reserved_len(size).unwrap() + rng.gen_range(0..3) * 8;
            }
        }
        // `all` starts with the same free list as `one`.
        let mut used = Vec::new();
        let mut prev = 0;
        for (o, l) in one.free_list() {
            if o > prev {
                used.push((prev, o - prev));
            }
            prev = o + l;
        }
        if prev < one.capacity() {
            used.push((prev, one.capacity() - prev));
        }
        for &(o, l) in &used {
            all.reserve(o, l).unwrap();
        }
        assert!(ranges.len() > 10, "round {round}: {} ranges", ranges.len());
        for i in (1..ranges.len()).rev() {
            ranges.swap(i, rng.gen_range(0..=i));
        }
        for &(o, s) in &ranges {
            one.reserve(o, s).unwrap();
        }
        all.reserve_all(&mut ranges.clone()).unwrap();
        assert_eq!(
            all.free_list().collect::<Vec<_>>(),
            one.free_list().collect::<Vec<_>>(),
            "round {round}"
        );
        assert_eq!(all.used(), one.used());
        all.check();
        // Taken twice, or not free: refused, nothing changes.
        if let Some(&(o, s)) = ranges.first() {
            let before: Vec<_> = all.free_list().collect();
            assert_eq!(
                all.reserve_all(&mut [(o, s)]),
                Err(BadFree { offset: o, len: s })
            );
            let mut dup = vec![(o, s), (o, s)];
            assert!(Fine::new(1 << 20).reserve_all(&mut dup).is_err());
            assert_eq!(all.free_list().collect::<Vec<_>>(), before);
        }
    }
}
