//! The client's staging pool: a registered memory region carved into
//! short-lived buffers. Plain-bytes puts copy the value here once so the
//! engine can send it; gets land here before being handed to the caller.
//!
//! [`RangeAllocator`] is the pure best-fit logic; [`StagingPool`] adds the
//! memory, a lock and a bounded wait when the pool is momentarily full.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};

/// Every allocation starts on a cache line, so concurrent buffers never
/// share one.
pub const ALIGN: u64 = 64;

fn align_up(len: u64) -> Option<u64> {
    len.checked_add(ALIGN - 1).map(|v| v & !(ALIGN - 1))
}

/// Best-fit allocator over `[0, capacity)` with coalescing of free ranges.
#[derive(Debug)]
pub struct RangeAllocator {
    capacity: u64,
    /// Free ranges by offset → length.
    by_offset: BTreeMap<u64, u64>,
    /// The same free ranges ordered by (length, offset) for best fit.
    by_size: BTreeSet<(u64, u64)>,
    used: u64,
}

impl RangeAllocator {
    pub fn new(capacity: u64) -> Self {
        let capacity = capacity & !(ALIGN - 1);
        let mut a = RangeAllocator {
            capacity,
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            used: 0,
        };
        if capacity > 0 {
            a.insert_free(0, capacity);
        }
        a
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    /// The length actually reserved for a request of `len` bytes.
    pub fn reserved_len(len: u64) -> Option<u64> {
        align_up(len.max(1))
    }

    /// Reserves `len` bytes (rounded up to [`ALIGN`]); `None` when no free
    /// range is large enough.
    pub fn allocate(&mut self, len: u64) -> Option<u64> {
        let need = Self::reserved_len(len)?;
        let &(size, offset) = self.by_size.range((need, 0)..).next()?;
        self.remove_free(offset, size);
        if size > need {
            self.insert_free(offset + need, size - need);
        }
        self.used += need;
        Some(offset)
    }

    /// Returns a range given out by [`allocate`](Self::allocate) with the
    /// same `len`.
    pub fn free(&mut self, offset: u64, len: u64) {
        let Some(mut len) = Self::reserved_len(len) else {
            return;
        };
        debug_assert!(offset + len <= self.capacity, "freeing outside the pool");
        self.used -= len;
        let mut offset = offset;
        // Merge with the free range just before, then the one just after.
        if let Some((&prev_off, &prev_len)) = self.by_offset.range(..offset).next_back() {
            debug_assert!(prev_off + prev_len <= offset, "double free");
            if prev_off + prev_len == offset {
                self.remove_free(prev_off, prev_len);
                offset = prev_off;
                len += prev_len;
            }
        }
        if let Some(&next_len) = self.by_offset.get(&(offset + len)) {
            self.remove_free(offset + len, next_len);
            len += next_len;
        }
        self.insert_free(offset, len);
    }

    fn insert_free(&mut self, offset: u64, len: u64) {
        self.by_offset.insert(offset, len);
        self.by_size.insert((len, offset));
    }

    fn remove_free(&mut self, offset: u64, len: u64) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(len, offset));
    }
}

/// A memory region this process can read and write for its whole lifetime
/// (an anonymous mapping or a shared-memory mapping), seen as `(addr, len)`.
pub trait Region: Send + Sync + 'static {
    fn addr(&self) -> usize;
    fn size(&self) -> usize;
}

impl Region for memmap2::MmapMut {
    fn addr(&self) -> usize {
        self.as_ptr() as usize
    }
    fn size(&self) -> usize {
        <[u8]>::len(self)
    }
}

struct PoolInner {
    region: Box<dyn Region>,
    alloc: Mutex<RangeAllocator>,
    freed: Condvar,
    wait_limit: Duration,
}

/// A registered region handed out in [`StagingBuf`]s. Cheap to clone.
#[derive(Clone)]
pub struct StagingPool {
    inner: Arc<PoolInner>,
}

impl StagingPool {
    /// `wait_limit` bounds how long an allocation waits for other buffers to
    /// be returned when the pool is momentarily full.
    pub fn new(region: Box<dyn Region>, wait_limit: Duration) -> Self {
        let alloc = Mutex::new(RangeAllocator::new(region.size() as u64));
        StagingPool {
            inner: Arc::new(PoolInner {
                region,
                alloc,
                freed: Condvar::new(),
                wait_limit,
            }),
        }
    }

    pub fn base(&self) -> usize {
        self.inner.region.addr()
    }

    pub fn capacity(&self) -> u64 {
        self.inner.alloc.lock().capacity()
    }

    pub fn used(&self) -> u64 {
        self.inner.alloc.lock().used()
    }

    /// Whether `[addr, addr+len)` lies inside the pool's region.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let base = self.base();
        addr >= base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= base + self.inner.region.size())
    }

    /// A buffer of `len` bytes. Waits up to the pool's wait limit for space;
    /// a request larger than the whole pool fails at once.
    pub fn allocate(&self, len: u64) -> Result<StagingBuf> {
        let mut alloc = self.inner.alloc.lock();
        let reserved = RangeAllocator::reserved_len(len).unwrap_or(u64::MAX);
        if reserved > alloc.capacity() {
            return Err(Error::new(
                ErrorCode::NO_AVAILABLE_HANDLE,
                format!(
                    "{len} bytes do not fit the {} byte local buffer",
                    alloc.capacity()
                ),
            ));
        }
        let deadline = Instant::now() + self.inner.wait_limit;
        loop {
            if let Some(offset) = alloc.allocate(len) {
                return Ok(StagingBuf {
                    pool: self.clone(),
                    offset,
                    len: len as usize,
                });
            }
            if self
                .inner
                .freed
                .wait_until(&mut alloc, deadline)
                .timed_out()
            {
                return Err(Error::new(
                    ErrorCode::NO_AVAILABLE_HANDLE,
                    format!("local buffer stayed full for {:?}", self.inner.wait_limit),
                ));
            }
        }
    }

    fn release(&self, offset: u64, len: usize) {
        self.inner.alloc.lock().free(offset, len as u64);
        self.inner.freed.notify_all();
    }
}

/// An allocation in a [`StagingPool`], returned on drop.
pub struct StagingBuf {
    pool: StagingPool,
    offset: u64,
    len: usize,
}

impl StagingBuf {
    pub fn addr(&self) -> usize {
        self.pool.base() + self.offset as usize
    }

    /// Offset inside the pool's region.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: [addr, addr+len) lies in the pool's region, which lives as
        // long as `self.pool`; the allocator gives this range to no one else
        // until `self` drops.
        unsafe { std::slice::from_raw_parts(self.addr() as *const u8, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.addr() as *mut u8, self.len) }
    }
}

impl Drop for StagingBuf {
    fn drop(&mut self) {
        self.pool.release(self.offset, self.len);
    }
}

impl std::fmt::Debug for StagingBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagingBuf")
            .field("addr", &self.addr())
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn best_fit_and_coalescing() {
        let mut a = RangeAllocator::new(1024);
        let x = a.allocate(100).unwrap();
        let y = a.allocate(64).unwrap();
        let z = a.allocate(200).unwrap();
        assert_eq!((x, y, z), (0, 128, 192));
        a.free(y, 64);
        // The 64-byte hole is the best fit for a small request.
        assert_eq!(a.allocate(10).unwrap(), 128);
        a.free(128, 10);
        a.free(x, 100);
        a.free(z, 200);
        assert_eq!(a.used(), 0);
        assert_eq!(a.allocate(1024), Some(0), "all ranges merged back into one");
        assert_eq!(a.allocate(1), None);
    }

    #[test]
    fn rejects_impossible_sizes() {
        let mut a = RangeAllocator::new(100);
        assert_eq!(a.capacity(), 64);
        assert_eq!(a.allocate(65), None);
        assert_eq!(a.allocate(u64::MAX), None);
        assert_eq!(RangeAllocator::new(0).allocate(1), None);
    }

    proptest! {
        #[test]
        fn never_overlaps(ops in proptest::collection::vec((1u64..300, any::<bool>()), 1..200)) {
            let mut a = RangeAllocator::new(4096);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (len, free_first) in ops {
                if free_first && !live.is_empty() {
                    let (o, l) = live.swap_remove(len as usize % live.len());
                    a.free(o, l);
                }
                if let Some(o) = a.allocate(len) {
                    let end = o + RangeAllocator::reserved_len(len).unwrap();
                    prop_assert!(end <= 4096);
                    for &(lo, ll) in &live {
                        let lend = lo + RangeAllocator::reserved_len(ll).unwrap();
                        prop_assert!(end <= lo || o >= lend, "overlap");
                    }
                    live.push((o, len));
                }
                let sum: u64 = live.iter().map(|&(_, l)| RangeAllocator::reserved_len(l).unwrap()).sum();
                prop_assert_eq!(a.used(), sum);
            }
            for (o, l) in live { a.free(o, l); }
            prop_assert_eq!(a.allocate(4096), Some(0));
        }
    }

    #[test]
    fn pool_waits_then_gives_up() {
        let region = memmap2::MmapMut::map_anon(4096).unwrap();
        let pool = StagingPool::new(Box::new(region), Duration::from_millis(20));
        let mut a = pool.allocate(4000).unwrap();
        a.as_mut_slice().fill(7);
        assert!(pool.contains(a.addr(), a.len()));
        assert!(!pool.contains(a.addr(), 8192));
        assert_eq!(
            pool.allocate(200).unwrap_err().code,
            ErrorCode::NO_AVAILABLE_HANDLE
        );
        assert_eq!(
            pool.allocate(5000).unwrap_err().code,
            ErrorCode::NO_AVAILABLE_HANDLE
        );
        drop(a);
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn returned_buffer_wakes_a_waiter() {
        let pool = StagingPool::new(
            Box::new(memmap2::MmapMut::map_anon(4096).unwrap()),
            Duration::from_secs(60),
        );
        let held = pool.allocate(4096).unwrap();
        let p2 = pool.clone();
        let waiter = std::thread::spawn(move || p2.allocate(4096).map(|b| b.len()));
        drop(held);
        assert_eq!(waiter.join().unwrap().unwrap(), 4096);
        assert_eq!(pool.used(), 0);
    }
}
