//! Offset allocator for one segment: best-fit over free ranges, coalescing
//! neighbours on free.
//!
//! Free ranges are indexed twice: by offset (to find neighbours when a range
//! comes back) and by (length, offset) (to find the smallest range that fits).
//! Both are B-trees, so allocation and free are O(log free ranges) and
//! fragmentation stays bounded by the number of live allocations.

use std::collections::{BTreeMap, BTreeSet};

/// Every allocation is rounded up to this many bytes, so offsets stay aligned.
pub const ALIGNMENT: u64 = 8;

/// Rounds a request up to the allocation granularity (`None` on overflow).
pub fn aligned_len(size: u64) -> Option<u64> {
    size.checked_add(ALIGNMENT - 1)
        .map(|n| n & !(ALIGNMENT - 1))
}

#[derive(Debug)]
pub struct OffsetAllocator {
    capacity: u64,
    used: u64,
    by_offset: BTreeMap<u64, u64>,
    by_len: BTreeSet<(u64, u64)>,
}

/// A free that does not match what was allocated (a bug upstream); the
/// allocator refuses it and stays consistent.
#[derive(Debug, PartialEq, Eq)]
pub struct BadFree {
    pub offset: u64,
    pub len: u64,
}

impl OffsetAllocator {
    /// An allocator over `[0, capacity)`; capacity is rounded down to the alignment.
    pub fn new(capacity: u64) -> Self {
        let capacity = capacity & !(ALIGNMENT - 1);
        let mut a = OffsetAllocator {
            capacity,
            used: 0,
            by_offset: BTreeMap::new(),
            by_len: BTreeSet::new(),
        };
        if capacity > 0 {
            a.insert_free(0, capacity);
        }
        a
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes handed out (after rounding).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Length of the largest free range: the biggest allocation that can succeed.
    pub fn largest_free(&self) -> u64 {
        self.by_len.last().map_or(0, |&(len, _)| len)
    }

    /// Number of free ranges (a fragmentation measure).
    pub fn free_ranges(&self) -> usize {
        self.by_offset.len()
    }

    /// Allocates `size` bytes (rounded up); returns the offset, or `None` when no free range fits.
    pub fn allocate(&mut self, size: u64) -> Option<u64> {
        let need = aligned_len(size.max(1))?;
        let &(len, offset) = self.by_len.range((need, 0)..).next()?;
        self.remove_free(offset, len);
        if len > need {
            self.insert_free(offset + need, len - need);
        }
        self.used += need;
        Some(offset)
    }

    /// Returns `[offset, offset + size)` (size as passed to `allocate`).
    pub fn free(&mut self, offset: u64, size: u64) -> Result<(), BadFree> {
        let bad = BadFree { offset, len: size };
        let len = aligned_len(size.max(1)).ok_or(BadFree { offset, len: size })?;
        let end = offset
            .checked_add(len)
            .ok_or(BadFree { offset, len: size })?;
        if offset & (ALIGNMENT - 1) != 0 || end > self.capacity || len > self.used {
            return Err(bad);
        }
        let mut start = offset;
        let mut stop = end;
        // The free range before must end at or before us; merge if it touches.
        if let Some((&p_off, &p_len)) = self.by_offset.range(..offset).next_back() {
            if p_off + p_len > offset {
                return Err(bad);
            }
            if p_off + p_len == offset {
                start = p_off;
            }
        }
        // The free range at or after us must start at or after our end.
        if let Some((&n_off, &n_len)) = self.by_offset.range(offset..).next() {
            if n_off < end {
                return Err(bad);
            }
            if n_off == end {
                self.remove_free(n_off, n_len);
                stop = n_off + n_len;
            }
        }
        if start != offset {
            self.remove_free(start, offset - start);
        }
        self.insert_free(start, stop - start);
        self.used -= len;
        Ok(())
    }

    fn insert_free(&mut self, offset: u64, len: u64) {
        self.by_offset.insert(offset, len);
        self.by_len.insert((len, offset));
    }

    fn remove_free(&mut self, offset: u64, len: u64) {
        self.by_offset.remove(&offset);
        self.by_len.remove(&(len, offset));
    }

    /// Checks the internal invariants (tests).
    #[cfg(test)]
    pub fn check(&self) {
        let mut free = 0;
        let mut prev_end = None;
        for (&off, &len) in &self.by_offset {
            assert!(len > 0);
            assert!(self.by_len.contains(&(len, off)));
            if let Some(e) = prev_end {
                assert!(off > e, "free ranges overlap or touch without merging");
            }
            prev_end = Some(off + len);
            free += len;
        }
        assert_eq!(self.by_len.len(), self.by_offset.len());
        assert_eq!(free + self.used, self.capacity);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn allocates_until_full_and_coalesces() {
        let mut a = OffsetAllocator::new(4096);
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
        let mut a = OffsetAllocator::new(10_000);
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
    fn rejects_bad_frees() {
        let mut a = OffsetAllocator::new(1024);
        let x = a.allocate(64).unwrap();
        assert!(a.free(x + 8, 64).is_err(), "overlaps the free tail");
        assert!(a.free(3, 8).is_err(), "misaligned");
        assert!(a.free(1000, 64).is_err(), "past the end");
        a.free(x, 64).unwrap();
        assert!(a.free(x, 64).is_err(), "double free");
        a.check();
        assert_eq!(a.used(), 0);
    }

    #[test]
    fn rounding_and_zero_capacity() {
        let mut a = OffsetAllocator::new(100);
        assert_eq!(a.capacity(), 96);
        assert_eq!(a.allocate(1), Some(0));
        assert_eq!(a.used(), 8);
        assert_eq!(a.allocate(u64::MAX), None);
        let mut empty = OffsetAllocator::new(0);
        assert_eq!(empty.allocate(1), None);
    }

    #[test]
    fn random_workload_keeps_invariants() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut a = OffsetAllocator::new(1 << 20);
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
            assert!(w[0].0 + aligned_len(w[0].1).unwrap() <= w[1].0);
        }
        for (off, size) in live.drain(..) {
            a.free(off, size).unwrap();
        }
        a.check();
        assert_eq!(a.free_ranges(), 1);
    }
}
