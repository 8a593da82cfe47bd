//! Raw-pointer helpers for the Python API, which passes addresses as ints.
//!
//! The reference dereferences whatever address a script hands it; we check
//! first, so a bad pointer becomes an error code instead of a crash. A range
//! is usable when every byte lies in a mapping of this process with the
//! needed permissions (read from `/proc/self/maps`). Callers check ranges they
//! already validated (registered buffers) against their own tables first; the
//! maps scan is the slow path.

use std::collections::BTreeMap;

pub(crate) use mooncake_common::maps::{accessible, span, Access};
use parking_lot::Mutex;

/// Copies `src` to `dst` (memmove: the ranges may overlap). Checks nothing:
/// callers have established that `dst..dst + src.len()` is writable memory of
/// this process (registered with us, or [`accessible`] for writing).
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes.
pub(crate) unsafe fn copy_to(dst: usize, src: &[u8]) {
    // SAFETY: guaranteed by the caller; `copy` tolerates overlap.
    unsafe { std::ptr::copy(src.as_ptr(), dst as *mut u8, src.len()) }
}

/// Views `len` bytes at `addr`.
///
/// # Safety
/// `addr..addr + len` must be readable memory of this process that nobody
/// writes for the lifetime of the returned slice (or the caller accepts
/// reading a torn value, which is what a racing writer means for raw bytes).
pub(crate) unsafe fn slice_at<'a>(addr: usize, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

/// Every range registered with a store or an engine of this process, as
/// `(addr, len)` (a multiset: two clients may register the same memory).
static REGISTERED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// Whether any byte of `[addr, addr + len)` is registered with a store or an
/// engine. Memory must not be unmapped while it is: transfers would then
/// write into whatever is mapped there next, or fault.
pub(crate) fn is_registered(addr: usize, len: usize) -> bool {
    let end = addr.saturating_add(len);
    REGISTERED
        .lock()
        .iter()
        .any(|&(a, l)| a < end && addr < a.saturating_add(l))
}

/// Known-valid memory of one store or engine (`addr -> len`), mirrored in
/// the process-wide table [`is_registered`] reads; dropping it forgets its
/// ranges there.
#[derive(Default)]
pub(crate) struct Regions {
    map: BTreeMap<usize, usize>,
}

impl Regions {
    pub(crate) fn insert(&mut self, addr: usize, len: usize) {
        let mut all = REGISTERED.lock();
        if let Some(old) = self.map.insert(addr, len) {
            forget(&mut all, addr, old);
        }
        all.push((addr, len));
    }

    pub(crate) fn remove(&mut self, addr: usize) -> Option<usize> {
        let len = self.map.remove(&addr)?;
        forget(&mut REGISTERED.lock(), addr, len);
        Some(len)
    }

    /// The region holding `addr`, as `(start, len)`.
    pub(crate) fn containing(&self, addr: usize) -> Option<(usize, usize)> {
        containing(&self.map, addr)
    }
}

impl Drop for Regions {
    fn drop(&mut self) {
        let mut all = REGISTERED.lock();
        for (&a, &l) in &self.map {
            forget(&mut all, a, l);
        }
    }
}

/// The entry of `map` (`addr -> len`, not overlapping) whose range holds
/// `addr`, as `(start, len)`.
pub(crate) fn containing(map: &BTreeMap<usize, usize>, addr: usize) -> Option<(usize, usize)> {
    map.range(..=addr)
        .next_back()
        .map(|(&a, &l)| (a, l))
        .filter(|&(a, l)| addr - a < l)
}

fn forget(all: &mut Vec<(usize, usize)>, addr: usize, len: usize) {
    if let Some(i) = all.iter().position(|&e| e == (addr, len)) {
        all.swap_remove(i);
    }
}

#[cfg(test)]
mod tests {
    use super::{is_registered, Regions};

    #[test]
    fn regions_are_mirrored_process_wide_until_dropped() {
        // Addresses no other test registers.
        let base = 0x7fff_0000_0000usize;
        let mut a = Regions::default();
        let mut b = Regions::default();
        a.insert(base, 4096);
        b.insert(base, 4096);
        assert!(is_registered(base + 4095, 1));
        assert!(is_registered(base - 10, 11), "overlap at the start");
        assert!(!is_registered(base - 10, 10), "ends right before");
        assert!(!is_registered(base + 4096, 100), "starts right after");
        assert_eq!(a.containing(base + 100), Some((base, 4096)));
        assert_eq!(a.containing(base + 4096), None);
        assert_eq!(a.remove(base), Some(4096));
        assert_eq!(a.remove(base), None);
        assert!(is_registered(base, 1), "still registered by b");
        a.insert(base + 8192, 10);
        a.insert(base + 8192, 20); // re-registered with another length
        assert!(is_registered(base + 8192 + 15, 1));
        drop(b);
        assert!(!is_registered(base, 4096));
        drop(a);
        assert!(!is_registered(base + 8192, 20));
    }
}
