//! The buffers a caller registered for zero-copy calls. The client checks
//! every caller pointer against them before any byte moves: the local
//! memcpy paths bypass the engine, so without this check a bad pointer
//! would be dereferenced instead of rejected. Also the memory a caller took
//! from the pool with `alloc_from_mem_pool`.

use std::collections::{BTreeMap, HashMap};

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Mutex, RwLock};

use super::staging::StagingBuf;

#[derive(Default)]
pub(crate) struct BufferRegistry {
    /// start address → length; ranges never overlap.
    ranges: RwLock<BTreeMap<usize, usize>>,
}

impl BufferRegistry {
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// Records `[addr, addr+len)`. Overlapping an existing range is refused
    /// (`ERR_ADDRESS_OVERLAPPED`); a null or empty range is `INVALID_PARAMS`.
    pub(super) fn register(&self, addr: usize, len: usize) -> Result<()> {
        let end = checked_end(addr, len)?;
        let mut ranges = self.ranges.write();
        let before = ranges.range(..end).next_back();
        if let Some((&a, &l)) = before {
            if a + l > addr {
                return Err(Error::new(
                    ErrorCode::ERR_ADDRESS_OVERLAPPED,
                    format!("buffer {addr:#x}+{len} overlaps registered {a:#x}+{l}"),
                ));
            }
        }
        ranges.insert(addr, len);
        Ok(())
    }

    /// Forgets the range starting at `addr`; `ERR_ADDRESS_NOT_REGISTERED` if none.
    pub(super) fn unregister(&self, addr: usize) -> Result<usize> {
        self.ranges.write().remove(&addr).ok_or_else(|| {
            Error::new(
                ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
                format!("{addr:#x} is not a registered buffer"),
            )
        })
    }

    /// Checks that `[addr, addr+len)` lies inside one registered buffer.
    pub(super) fn check(&self, addr: usize, len: usize) -> Result<()> {
        self.containing(addr, len).map(|_| ())
    }

    /// The registered buffer `(start, len)` that holds `[addr, addr+len)`.
    pub(super) fn containing(&self, addr: usize, len: usize) -> Result<(usize, usize)> {
        let end = checked_end(addr, len.max(1))?;
        let ranges = self.ranges.read();
        match ranges.range(..=addr).next_back() {
            Some((&a, &l)) if end <= a + l => Ok((a, l)),
            Some((&a, &l)) if addr < a + l => Err(Error::new(
                ErrorCode::BUFFER_OVERFLOW,
                format!("{addr:#x}+{len} runs past the registered buffer {a:#x}+{l}"),
            )),
            _ => Err(Error::new(
                ErrorCode::ERR_ADDRESS_NOT_REGISTERED,
                format!("{addr:#x}+{len} is not inside a registered buffer"),
            )),
        }
    }

    pub(super) fn all(&self) -> Vec<(usize, usize)> {
        self.ranges.read().iter().map(|(&a, &l)| (a, l)).collect()
    }
}

/// Pool memory handed out by `alloc_from_mem_pool`, held until
/// `free_to_mem_pool` gives its address back.
#[derive(Default)]
pub(crate) struct PoolAllocations {
    by_addr: Mutex<HashMap<usize, StagingBuf>>,
}

impl PoolAllocations {
    /// Keeps `buf` until it is freed; returns its address.
    pub(super) fn keep(&self, buf: StagingBuf) -> usize {
        let addr = buf.addr();
        self.by_addr.lock().insert(addr, buf);
        addr
    }

    /// The length of the allocation that starts at `addr`, if one does.
    pub(super) fn len_at(&self, addr: usize) -> Option<usize> {
        self.by_addr.lock().get(&addr).map(StagingBuf::len)
    }

    /// Frees the allocation at `addr`; `INVALID_PARAMS` when there is none.
    pub(super) fn free(&self, addr: usize) -> Result<()> {
        self.by_addr.lock().remove(&addr).map(drop).ok_or_else(|| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("{addr:#x} was not allocated from the memory pool"),
            )
        })
    }
}

fn checked_end(addr: usize, len: usize) -> Result<usize> {
    if addr == 0 || len == 0 {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("buffer {addr:#x}+{len} is null or empty"),
        ));
    }
    addr.checked_add(len).ok_or_else(|| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("buffer {addr:#x}+{len} wraps around"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_containment() {
        let r = BufferRegistry::new();
        r.register(0x1000, 0x100).unwrap();
        r.register(0x2000, 0x100).unwrap();
        r.check(0x1000, 0x100).unwrap();
        r.check(0x10f0, 0x10).unwrap();
        assert_eq!(
            r.check(0x10f0, 0x11).unwrap_err().code,
            ErrorCode::BUFFER_OVERFLOW
        );
        assert_eq!(
            r.check(0x1800, 1).unwrap_err().code,
            ErrorCode::ERR_ADDRESS_NOT_REGISTERED
        );
        assert_eq!(
            r.check(0x500, 1).unwrap_err().code,
            ErrorCode::ERR_ADDRESS_NOT_REGISTERED
        );
        assert_eq!(r.check(0, 1).unwrap_err().code, ErrorCode::INVALID_PARAMS);
        assert_eq!(
            r.check(usize::MAX, 2).unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        assert_eq!(r.containing(0x2010, 4).unwrap(), (0x2000, 0x100));
    }

    #[test]
    fn refuses_overlap_and_unknown_unregister() {
        let r = BufferRegistry::new();
        r.register(0x1000, 0x100).unwrap();
        assert_eq!(
            r.register(0x10ff, 4).unwrap_err().code,
            ErrorCode::ERR_ADDRESS_OVERLAPPED
        );
        assert_eq!(
            r.register(0xf00, 0x101).unwrap_err().code,
            ErrorCode::ERR_ADDRESS_OVERLAPPED
        );
        r.register(0x1100, 4).unwrap();
        assert_eq!(
            r.unregister(0x1001).unwrap_err().code,
            ErrorCode::ERR_ADDRESS_NOT_REGISTERED
        );
        assert_eq!(r.unregister(0x1000).unwrap(), 0x100);
        assert_eq!(
            r.check(0x1000, 1).unwrap_err().code,
            ErrorCode::ERR_ADDRESS_NOT_REGISTERED
        );
        assert_eq!(r.all(), vec![(0x1100, 4)]);
    }
}
