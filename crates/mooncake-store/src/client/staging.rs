//! The client's staging pool: a registered memory region carved into
//! short-lived buffers. Plain-bytes puts copy the value here once so the
//! engine can send it; gets land here before being handed to the caller.
//!
//! The crate's best-fit offset allocator places buffers; [`StagingPool`]
//! adds the memory, a lock and a bounded wait when the pool is momentarily
//! full.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};

use crate::allocator::OffsetAllocator;

/// Every allocation starts on a cache line, so concurrent buffers never
/// share one.
pub(crate) const ALIGN: u64 = 64;

/// The pool's allocator.
type RangeAllocator = OffsetAllocator<ALIGN>;

/// A memory region this process can read and write for its whole lifetime
/// (an anonymous mapping or a shared-memory mapping), seen as `(addr, len)`.
pub(crate) trait Region: Send + Sync + 'static {
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
pub(crate) struct StagingPool {
    inner: Arc<PoolInner>,
}

impl StagingPool {
    /// `wait_limit` bounds how long an allocation waits for other buffers to
    /// be returned when the pool is momentarily full.
    pub(crate) fn new(region: Box<dyn Region>, wait_limit: Duration) -> Self {
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

    pub(crate) fn base(&self) -> usize {
        self.inner.region.addr()
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.inner.alloc.lock().capacity()
    }

    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.inner.alloc.lock().used()
    }

    /// Whether `[addr, addr+len)` lies inside the pool's region.
    pub(crate) fn contains(&self, addr: usize, len: usize) -> bool {
        let base = self.base();
        addr >= base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= base + self.inner.region.size())
    }

    /// A buffer of `len` bytes. Waits up to the pool's wait limit for space;
    /// a request larger than the whole pool fails at once.
    pub(crate) fn allocate(&self, len: u64) -> Result<StagingBuf> {
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

    /// A buffer of `len` bytes if the pool has room for it now; `None` when
    /// it does not (including a request larger than the whole pool). Never
    /// waits: callers that lend pool memory for a long time (the Python
    /// buffer pool) choose for themselves what to do when it is full.
    pub(crate) fn try_allocate(&self, len: u64) -> Option<StagingBuf> {
        let offset = self.inner.alloc.lock().allocate(len)?;
        Some(StagingBuf {
            pool: self.clone(),
            offset,
            len: len as usize,
        })
    }

    fn release(&self, offset: u64, len: usize) {
        let freed = self.inner.alloc.lock().free(offset, len as u64);
        debug_assert!(freed.is_ok(), "staging buffer freed twice: {freed:?}");
        self.inner.freed.notify_all();
    }
}

/// An allocation in a [`StagingPool`], returned on drop.
pub(crate) struct StagingBuf {
    pool: StagingPool,
    offset: u64,
    len: usize,
}

impl StagingBuf {
    pub(crate) fn addr(&self) -> usize {
        self.pool.base() + self.offset as usize
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: [addr, addr+len) lies in the pool's region, which lives as
        // long as `self.pool`; the allocator gives this range to no one else
        // until `self` drops.
        unsafe { std::slice::from_raw_parts(self.addr() as *const u8, self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
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
    fn try_allocate_answers_at_once() {
        let pool = StagingPool::new(
            Box::new(memmap2::MmapMut::map_anon(4096).unwrap()),
            Duration::from_secs(60),
        );
        let a = pool.try_allocate(3000).expect("room for 3000 bytes");
        assert_eq!((a.len(), a.addr() % ALIGN as usize), (3000, 0));
        assert!(pool.try_allocate(2000).is_none(), "full: no wait");
        assert!(pool.try_allocate(8192).is_none(), "larger than the pool");
        let b = pool.try_allocate(1000).expect("the rest still fits");
        assert!(b.addr() >= a.addr() + a.len() || b.addr() + b.len() <= a.addr());
        drop((a, b));
        assert_eq!(pool.used(), 0);
        assert_eq!(pool.try_allocate(4096).map(|b| b.len()), Some(4096));
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
