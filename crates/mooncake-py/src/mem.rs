//! Raw-pointer helpers for the Python API, which passes addresses as ints.
//!
//! The reference dereferences whatever address a script hands it; we check
//! first, so a bad pointer becomes an error code instead of a crash. A range
//! is usable when every byte lies in a mapping of this process with the
//! needed permissions (read from `/proc/self/maps`). Callers check ranges they
//! already validated (registered buffers) against their own tables first; the
//! maps scan is the slow path.

use std::collections::BTreeMap;
use std::ops::Range;

use parking_lot::Mutex;

/// Access a caller needs on a memory range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

/// `[addr, addr + len)` as a range, or None when it is empty-at-null or
/// wraps around the address space.
pub(crate) fn span(addr: usize, len: usize) -> Option<Range<usize>> {
    let end = addr.checked_add(len)?;
    (addr != 0).then_some(addr..end)
}

/// One line of `/proc/self/maps`: address range and permissions.
#[derive(Debug, PartialEq, Eq)]
struct Mapping {
    range: Range<usize>,
    read: bool,
    write: bool,
}

fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.as_bytes();
    Some(Mapping {
        range: usize::from_str_radix(start, 16).ok()?..usize::from_str_radix(end, 16).ok()?,
        read: perms.first() == Some(&b'r'),
        write: perms.get(1) == Some(&b'w'),
    })
}

/// True when `range` is fully covered by consecutive mappings in `maps`
/// (sorted, as the kernel lists them) that all grant `access`.
fn covered(maps: &str, range: &Range<usize>, access: Access) -> bool {
    let mut next = range.start;
    for m in maps.lines().filter_map(parse_maps_line) {
        if next >= range.end {
            break;
        }
        if m.range.end <= next {
            continue;
        }
        let allowed = m.read && (access == Access::Read || m.write);
        if m.range.start > next || !allowed {
            return false;
        }
        next = m.range.end;
    }
    next >= range.end
}

/// True when `len` bytes at `addr` are mapped in this process with `access`.
/// A zero-length range at a non-null address is trivially accessible.
pub(crate) fn accessible(addr: usize, len: usize, access: Access) -> bool {
    let Some(range) = span(addr, len) else {
        return false;
    };
    if range.is_empty() {
        return true;
    }
    match std::fs::read_to_string("/proc/self/maps") {
        Ok(maps) => covered(&maps, &range, access),
        Err(_) => false,
    }
}

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
    use super::*;

    const MAPS: &str = "\
00400000-00401000 r-xp 00000000 08:01 1 /bin/x
00401000-00403000 rw-p 00000000 00:00 0
00403000-00404000 rw-p 00000000 00:00 0 [heap]
00500000-00501000 r--p 00000000 00:00 0
00600000-00601000 ---p 00000000 00:00 0
";

    #[test]
    fn parses_lines() {
        let m = parse_maps_line("7f00-7f10 rw-p 0 0:0 0 [stack]").unwrap();
        assert_eq!(
            m,
            Mapping {
                range: 0x7f00..0x7f10,
                read: true,
                write: true
            }
        );
        assert!(parse_maps_line("garbage").is_none());
    }

    #[test]
    fn coverage_spans_adjacent_mappings() {
        assert!(covered(MAPS, &(0x401000..0x404000), Access::Write));
        assert!(covered(MAPS, &(0x402fff..0x403001), Access::Write));
        assert!(covered(MAPS, &(0x400000..0x401000), Access::Read));
    }

    #[test]
    fn coverage_rejects_holes_and_missing_permissions() {
        assert!(
            !covered(MAPS, &(0x400000..0x401000), Access::Write),
            "read-only code"
        );
        assert!(
            !covered(MAPS, &(0x403000..0x405000), Access::Read),
            "hole after heap"
        );
        assert!(
            !covered(MAPS, &(0x500000..0x500010), Access::Write),
            "read-only data"
        );
        assert!(
            !covered(MAPS, &(0x600000..0x600010), Access::Read),
            "no access"
        );
        assert!(
            !covered(MAPS, &(0x100..0x200), Access::Read),
            "below every mapping"
        );
    }

    #[test]
    fn real_process_memory() {
        let mut v = vec![0u8; 1 << 16];
        let addr = v.as_mut_ptr() as usize;
        assert!(accessible(addr, v.len(), Access::Write));
        assert!(accessible(addr + 5, 0, Access::Write));
        assert!(!accessible(0, 8, Access::Read));
        assert!(!accessible(8, 8, Access::Read));
        assert!(!accessible(usize::MAX - 4, 16, Access::Read));
        let code = accessible as fn(usize, usize, Access) -> bool as usize;
        assert!(accessible(code, 1, Access::Read));
        assert!(!accessible(code, 1, Access::Write));
    }
}
