//! Offset allocator over `[0, capacity)`: best fit over free ranges,
//! coalescing neighbours on free. The master carves segments with it
//! (`master::allocator`), the client its staging pool (`client::staging`);
//! each picks its granularity `ALIGN`.
//!
//! Free ranges are indexed twice: by offset (to find neighbours when a range
//! comes back) and by (length, offset) (to find the smallest range that
//! fits, the lowest such offset first). Both are B-trees, so allocation and
//! free are O(log free ranges) and fragmentation stays bounded by the number
//! of live allocations. Only free ranges are stored: a live allocation costs
//! nothing here.

use std::collections::{BTreeMap, BTreeSet};

/// Best-fit allocator whose offsets and lengths are multiples of `ALIGN`
/// (a power of two).
#[derive(Debug)]
pub struct OffsetAllocator<const ALIGN: u64> {
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

impl<const ALIGN: u64> OffsetAllocator<ALIGN> {
    const MASK: u64 = {
        assert!(ALIGN.is_power_of_two(), "ALIGN must be a power of two");
        ALIGN - 1
    };

    /// `size` rounded up to the granularity (`None` on overflow).
    pub fn aligned_len(size: u64) -> Option<u64> {
        size.checked_add(Self::MASK).map(|n| n & !Self::MASK)
    }

    /// The length reserved for a request of `size` bytes (at least one unit).
    pub fn reserved_len(size: u64) -> Option<u64> {
        Self::aligned_len(size.max(1))
    }

    /// An allocator over `[0, capacity)`; capacity is rounded down to the alignment.
    pub fn new(capacity: u64) -> Self {
        let capacity = capacity & !Self::MASK;
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

    /// The free ranges (offset, length), by offset.
    pub fn free_list(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_offset.iter().map(|(&o, &l)| (o, l))
    }

    /// Number of free ranges (a fragmentation measure).
    pub fn free_ranges(&self) -> usize {
        self.by_offset.len()
    }

    /// Allocates `size` bytes (rounded up); returns the offset, or `None`
    /// when no free range fits.
    pub fn allocate(&mut self, size: u64) -> Option<u64> {
        let need = Self::reserved_len(size)?;
        let &(len, offset) = self.by_len.range((need, 0)..).next()?;
        self.remove_free(offset, len);
        if len > need {
            self.insert_free(offset + need, len - need);
        }
        self.used += need;
        Some(offset)
    }

    /// Returns `[offset, offset + size)` (size as passed to `allocate`).
    /// A range that is misaligned, out of bounds or overlaps free space is
    /// refused and changes nothing.
    pub fn free(&mut self, offset: u64, size: u64) -> Result<(), BadFree> {
        let bad = BadFree { offset, len: size };
        let Some(len) = Self::reserved_len(size) else {
            return Err(bad);
        };
        let Some(end) = offset.checked_add(len) else {
            return Err(bad);
        };
        if offset & Self::MASK != 0 || end > self.capacity || len > self.used {
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

    /// Allocates exactly `[offset, offset + size)` (size rounded up as by
    /// `allocate`): how a replayed log or a restored snapshot takes the
    /// ranges the leader chose. A range that is misaligned, out of bounds
    /// or not wholly free is refused and changes nothing.
    pub fn reserve(&mut self, offset: u64, size: u64) -> Result<(), BadFree> {
        let bad = BadFree { offset, len: size };
        let Some(need) = Self::reserved_len(size) else {
            return Err(bad);
        };
        let Some(end) = offset.checked_add(need) else {
            return Err(bad);
        };
        if offset & Self::MASK != 0 || end > self.capacity {
            return Err(bad);
        }
        let Some((&f_off, &f_len)) = self.by_offset.range(..=offset).next_back() else {
            return Err(bad);
        };
        if f_off + f_len < end {
            return Err(bad);
        }
        self.remove_free(f_off, f_len);
        if f_off < offset {
            self.insert_free(f_off, offset - f_off);
        }
        if end < f_off + f_len {
            self.insert_free(end, f_off + f_len - end);
        }
        self.used += need;
        Ok(())
    }

    /// Takes every `(offset, size)` of `ranges` as [`reserve`](Self::reserve)
    /// would one by one, in one pass over the free list: a restored
    /// snapshot lists its objects in no particular order, and reserving
    /// them one at a time would fragment the free list into millions of
    /// ranges on the way. Sorts `ranges`. On a range that is not wholly
    /// free (or taken twice) nothing changes and that range is returned.
    pub fn reserve_all(&mut self, ranges: &mut [(u64, u64)]) -> Result<(), BadFree> {
        ranges.sort_unstable();
        let mut kept: Vec<(u64, u64)> = Vec::new();
        let mut free = self.by_offset.iter().map(|(&o, &l)| (o, o + l));
        // The free range being carved, as [start, end).
        let mut cur: Option<(u64, u64)> = None;
        let mut used = self.used;
        for &(offset, size) in ranges.iter() {
            let bad = || BadFree { offset, len: size };
            let need = Self::reserved_len(size).ok_or_else(bad)?;
            let end = offset.checked_add(need).ok_or_else(bad)?;
            if offset & Self::MASK != 0 || end > self.capacity {
                return Err(bad());
            }
            let (start, stop) = loop {
                match cur {
                    Some((s, e)) if offset < e => break (s, e),
                    Some((s, e)) => {
                        if s < e {
                            kept.push((s, e - s));
                        }
                        cur = None;
                    }
                    None => cur = Some(free.next().ok_or_else(bad)?),
                }
            };
            if offset < start || end > stop {
                return Err(bad());
            }
            if offset > start {
                kept.push((start, offset - start));
            }
            cur = Some((end, stop));
            used += need;
        }
        if let Some((s, e)) = cur {
            if s < e {
                kept.push((s, e - s));
            }
        }
        kept.extend(free.map(|(s, e)| (s, e - s)));
        self.by_len = kept.iter().map(|&(o, l)| (l, o)).collect();
        self.by_offset = kept.into_iter().collect();
        self.used = used;
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
    pub(crate) fn check(&self) {
        let mut free = 0;
        let mut prev_end = None;
        for (&off, &len) in &self.by_offset {
            assert!(len > 0);
            assert_eq!(off & Self::MASK, 0, "misaligned free range");
            assert_eq!(len & Self::MASK, 0, "free range of a partial unit");
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
mod tests;
