//! How a caller's raw address can be used.
//!
//! Raw addresses from Python are used in place only when they lie inside
//! memory registered through `register_buffer` (checked to be mapped then) or
//! handed out by `alloc_from_mem_pool`. Any other address is checked against
//! this process's mappings and, when valid, served through a copy (the
//! reference accepts unregistered memory); an invalid one is INVALID_PARAMS.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::mem::{self, Access};

/// How a caller's memory range can be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mem {
    /// Registered or pool memory: the client moves bytes in place.
    Direct,
    /// Valid memory the client does not know: served through a copy.
    Copy,
    Bad,
}

/// The memory one store vouches for.
#[derive(Default)]
pub(super) struct KnownMemory {
    /// Registered by the script (validated then): addr -> length.
    registered: Mutex<mem::Regions>,
    /// Handed out by `alloc_from_mem_pool`: addr -> length.
    pool: Mutex<BTreeMap<usize, usize>>,
}

impl KnownMemory {
    pub(super) fn register(&self, addr: usize, len: usize) {
        self.registered.lock().insert(addr, len);
    }

    pub(super) fn unregister(&self, addr: usize) {
        self.registered.lock().remove(addr);
    }

    pub(super) fn pooled(&self, addr: usize, len: usize) {
        self.pool.lock().insert(addr, len);
    }

    /// Forgets pool memory given back (a buffer pool's lease).
    pub(super) fn unpooled(&self, addr: usize) {
        self.pool.lock().remove(&addr);
    }

    /// End of the vouched-for region that contains `addr`.
    fn region_end(&self, addr: usize) -> Option<usize> {
        let r = self
            .registered
            .lock()
            .containing(addr)
            .or_else(|| mem::containing(&self.pool.lock(), addr));
        r.map(|(a, l)| a + l)
    }

    /// `len` cut at the end of the vouched-for region holding `addr`: a read
    /// into a registered buffer writes only the object's bytes, so it needs
    /// at most the rest of that buffer.
    pub(super) fn clamp(&self, addr: usize, len: usize) -> usize {
        match self.region_end(addr) {
            Some(end) => len.min(end - addr),
            None => len,
        }
    }

    /// Whether `addr..addr+len` lies inside one vouched-for region.
    fn direct(&self, addr: usize, len: usize) -> bool {
        match (self.region_end(addr), addr.checked_add(len)) {
            (Some(end), Some(stop)) => stop <= end,
            _ => false,
        }
    }

    pub(super) fn classify(&self, addr: usize, len: usize, access: Access) -> Mem {
        if addr == 0 || len == 0 {
            Mem::Bad
        } else if self.direct(addr, len) {
            Mem::Direct
        } else if mem::accessible(addr, len, access) {
            Mem::Copy
        } else {
            Mem::Bad
        }
    }

    /// [`classify`](Self::classify) for the parts of one object: `Direct`
    /// when all are, `Bad` when any is, else `Copy`.
    pub(super) fn classify_all(&self, addrs: &[usize], lens: &[usize], access: Access) -> Mem {
        let mut all = Mem::Direct;
        for (&a, &l) in addrs.iter().zip(lens) {
            match self.classify(a, l, access) {
                Mem::Bad => return Mem::Bad,
                Mem::Copy => all = Mem::Copy,
                Mem::Direct => {}
            }
        }
        all
    }
}

/// Copies `src` into caller memory.
///
/// # Safety
/// `classify(addr, n, Access::Write)` with `n >= src.len()` must have
/// answered `Direct` or `Copy` during the current call (so the range is
/// registered, pool or writable mapped memory of this process).
pub(super) unsafe fn copy_out(addr: usize, src: &[u8]) {
    // SAFETY: guaranteed by the caller.
    unsafe { mem::copy_to(addr, src) }
}

/// Borrows `len` bytes of caller memory for the rest of the current call.
///
/// # Safety
/// `classify(addr, len, Access::Read)` must have answered `Direct` or `Copy`
/// during the current call, and the slice must not outlive it (the script
/// may free the memory afterwards).
pub(super) unsafe fn view<'a>(addr: usize, len: usize) -> &'a [u8] {
    // SAFETY: guaranteed by the caller.
    unsafe { mem::slice_at(addr, len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_and_pool_memory_is_direct_to_its_end() {
        let mut reg = vec![0u8; 4096];
        let mut pool = vec![0u8; 4096];
        let (r, p) = (reg.as_mut_ptr() as usize, pool.as_mut_ptr() as usize);
        let known = KnownMemory::default();
        known.register(r, 1024);
        known.pooled(p, 1024);
        for base in [r, p] {
            assert_eq!(known.classify(base, 1024, Access::Write), Mem::Direct);
            assert_eq!(known.classify(base + 1000, 24, Access::Read), Mem::Direct);
            // Past the region's end, but still this process's memory.
            assert_eq!(known.classify(base + 1000, 25, Access::Write), Mem::Copy);
            assert_eq!(known.clamp(base + 1000, 4096), 24);
        }
        assert_eq!(known.clamp(r + 2048, 100), 100, "outside: unchanged");
        known.unregister(r);
        assert_eq!(known.classify(r, 1024, Access::Write), Mem::Copy);
        known.unpooled(p);
        assert_eq!(known.classify(p, 1024, Access::Write), Mem::Copy);
    }

    #[test]
    fn null_empty_and_unmapped_ranges_are_bad() {
        let known = KnownMemory::default();
        let v = [0u8; 64];
        let a = v.as_ptr() as usize;
        assert_eq!(known.classify(0, 8, Access::Read), Mem::Bad);
        assert_eq!(known.classify(a, 0, Access::Read), Mem::Bad);
        assert_eq!(known.classify(8, 8, Access::Read), Mem::Bad);
        assert_eq!(known.classify(usize::MAX - 4, 16, Access::Read), Mem::Bad);
        assert_eq!(known.classify(a, 64, Access::Read), Mem::Copy);
        let code = null_empty_and_unmapped_ranges_are_bad as fn() as usize;
        assert_eq!(known.classify(code, 1, Access::Read), Mem::Copy);
        assert_eq!(known.classify(code, 1, Access::Write), Mem::Bad);
    }

    #[test]
    fn parts_of_one_object() {
        let mut reg = vec![0u8; 256];
        let heap = vec![0u8; 256];
        let (r, h) = (reg.as_mut_ptr() as usize, heap.as_ptr() as usize);
        let known = KnownMemory::default();
        known.register(r, 256);
        let w = Access::Read;
        assert_eq!(
            known.classify_all(&[r, r + 128], &[128, 128], w),
            Mem::Direct
        );
        assert_eq!(known.classify_all(&[r, h], &[128, 128], w), Mem::Copy);
        assert_eq!(known.classify_all(&[r, h, 0], &[128, 128, 1], w), Mem::Bad);
        assert_eq!(known.classify_all(&[], &[], w), Mem::Direct);
    }
}
