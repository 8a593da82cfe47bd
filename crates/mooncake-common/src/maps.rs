//! Whether a range of this process's addresses is mapped with the access a
//! call needs, read from `/proc/self/maps`. The Python binding and the C ABI
//! take addresses as integers from their callers; they check here first, so
//! a bad pointer becomes an error code instead of a crash. Safe code: it
//! reads a text file.

use std::ops::Range;

/// Access a caller needs on a memory range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// `[addr, addr + len)` as a range, or None when it is empty-at-null or
/// wraps around the address space.
pub fn span(addr: usize, len: usize) -> Option<Range<usize>> {
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
pub fn accessible(addr: usize, len: usize, access: Access) -> bool {
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

#[cfg(test)]
mod tests {
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
