//! Whether a range of addresses is mapped in this process with the access a
//! call needs, from `/proc/self/maps`: memory a caller registers or hands
//! to `mooncake_store_put` is checked here first, so a bad pointer is an
//! error code instead of a crash. Safe code: it reads a text file.

use std::ops::Range;

/// Access a call needs on a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

struct Mapping {
    range: Range<usize>,
    read: bool,
    write: bool,
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.as_bytes();
    Some(Mapping {
        range: usize::from_str_radix(start, 16).ok()?..usize::from_str_radix(end, 16).ok()?,
        read: perms.first() == Some(&b'r'),
        write: perms.get(1) == Some(&b'w'),
    })
}

/// Whether consecutive mappings of `maps` (sorted, as the kernel lists
/// them) cover `range`, all granting `access`.
fn covered(maps: &str, range: &Range<usize>, access: Access) -> bool {
    let mut next = range.start;
    for m in maps.lines().filter_map(parse_line) {
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

/// Whether the `len` bytes at `addr` are mapped with `access`. A null
/// address, or a range that wraps, is not; an empty range at a non-null
/// address is.
pub(crate) fn accessible(addr: usize, len: usize, access: Access) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    if addr == 0 {
        return false;
    }
    if len == 0 {
        return true;
    }
    match std::fs::read_to_string("/proc/self/maps") {
        Ok(maps) => covered(&maps, &(addr..end), access),
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
";

    #[test]
    fn coverage() {
        assert!(
            covered(MAPS, &(0x401000..0x404000), Access::Write),
            "adjacent"
        );
        assert!(covered(MAPS, &(0x400000..0x401000), Access::Read));
        assert!(!covered(MAPS, &(0x400000..0x401000), Access::Write), "code");
        assert!(!covered(MAPS, &(0x403000..0x405000), Access::Read), "hole");
        assert!(!covered(MAPS, &(0x500000..0x500010), Access::Write));
        assert!(!covered(MAPS, &(0x100..0x200), Access::Read));
    }

    #[test]
    fn this_process() {
        let v = vec![0u8; 1 << 16];
        let addr = v.as_ptr() as usize;
        assert!(accessible(addr, v.len(), Access::Write));
        assert!(accessible(addr, 0, Access::Write));
        assert!(!accessible(0, 8, Access::Read));
        assert!(!accessible(8, 8, Access::Read));
        assert!(!accessible(usize::MAX - 4, 16, Access::Read));
    }
}
