//! The TCP mesh's wire format, as pure functions: a fixed 32-byte header,
//! then for `Word` and `Msg` frames `len` payload bytes.

/// Bytes of a frame header.
pub const HEADER_BYTES: usize = 32;

/// Largest payload of one message frame: a peer announcing more is
/// broken (the receiver would have to allocate it).
pub const MAX_MSG_BYTES: u64 = 1 << 40;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A control word, after `len` bytes of the sender's slot `slot` from
    /// `offset` (the part it wrote since the round began).
    Word = 1,
    /// A point-to-point message of `len` bytes under `tag`.
    Msg = 2,
    /// The sender has read `offset` messages from the receiver.
    Ack = 3,
    /// The sender closed its group; its connection ends without it dying.
    Bye = 4,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub flag: u8,
    pub slot: u16,
    pub value: u32,
    pub tag: i64,
    pub offset: u64,
    pub len: u64,
}

impl Header {
    pub fn word(flag: u8, value: u32, slot: u16, offset: usize, len: usize) -> Header {
        Header {
            kind: Kind::Word,
            flag,
            slot,
            value,
            tag: 0,
            offset: offset as u64,
            len: len as u64,
        }
    }

    pub fn msg(tag: i64, len: usize) -> Header {
        Header {
            kind: Kind::Msg,
            flag: 0,
            slot: 0,
            value: 0,
            tag,
            offset: 0,
            len: len as u64,
        }
    }

    pub fn ack(count: u32) -> Header {
        Header {
            kind: Kind::Ack,
            flag: 0,
            slot: 0,
            value: 0,
            tag: 0,
            offset: u64::from(count),
            len: 0,
        }
    }

    pub fn bye() -> Header {
        Header {
            kind: Kind::Bye,
            flag: 0,
            slot: 0,
            value: 0,
            tag: 0,
            offset: 0,
            len: 0,
        }
    }

    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0] = self.kind as u8;
        b[1] = self.flag;
        b[2..4].copy_from_slice(&self.slot.to_le_bytes());
        b[4..8].copy_from_slice(&self.value.to_le_bytes());
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// The header in `b`, or why it cannot be one.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Result<Header, String> {
        let kind = match b[0] {
            1 => Kind::Word,
            2 => Kind::Msg,
            3 => Kind::Ack,
            4 => Kind::Bye,
            k => return Err(format!("bad frame kind {k}")),
        };
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(Header {
            kind,
            flag: b[1],
            slot: u16::from_le_bytes([b[2], b[3]]),
            value: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            tag: i64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            offset: u64_at(16),
            len: u64_at(24),
        })
    }

    /// The byte range of a `Word` frame's payload within a slot of
    /// `slot_bytes` (of `slots` slots), or why it does not fit.
    pub fn slot_range(&self, slots: usize, slot_bytes: usize) -> Result<(usize, usize), String> {
        if usize::from(self.slot) >= slots {
            return Err(format!("frame names slot {} of {slots}", self.slot));
        }
        let end = self.offset.checked_add(self.len);
        match end {
            Some(end) if end <= slot_bytes as u64 => Ok((self.offset as usize, end as usize)),
            _ => Err(format!(
                "frame writes {} bytes at {} of a {slot_bytes}-byte slot",
                self.len, self.offset
            )),
        }
    }
}

/// `(start, end)` of the pieces `len` bytes are written in, each at most
/// `piece` bytes: a large payload goes out in pieces so that a peer's
/// writer sharing the core makes progress between them.
pub fn pieces(len: usize, piece: usize) -> impl Iterator<Item = (usize, usize)> {
    let piece = piece.max(1);
    (0..len.div_ceil(piece)).map(move |i| (i * piece, ((i + 1) * piece).min(len)))
}

/// The bytes of `lo..hi` that turn `turn` of a write in pieces of
/// `piece` covers (empty once the range is done).
pub fn turn(lo: usize, hi: usize, turn: usize, piece: usize) -> (usize, usize) {
    let piece = piece.max(1);
    let a = lo.saturating_add(turn.saturating_mul(piece)).min(hi);
    (a, a.saturating_add(piece).min(hi))
}

/// The union of two written byte ranges (what goes with a round's post).
pub fn widen(cur: Option<(usize, usize)>, lo: usize, hi: usize) -> (usize, usize) {
    match cur {
        None => (lo, hi),
        Some((a, b)) => (a.min(lo), b.max(hi)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        for h in [
            Header::word(4, u32::MAX, 1, 17, 4 << 20),
            Header::msg(-5, 0),
            Header::msg(i64::MAX, 1 << 30),
            Header::ack(123),
            Header::bye(),
        ] {
            assert_eq!(Header::decode(&h.encode()), Ok(h));
        }
    }

    #[test]
    fn unknown_kinds_are_refused() {
        let mut b = Header::bye().encode();
        for k in [0u8, 5, 255] {
            b[0] = k;
            assert!(Header::decode(&b).unwrap_err().contains("bad frame kind"));
        }
    }

    #[test]
    fn slot_ranges_must_fit_the_slot() {
        let h = Header::word(0, 1, 1, 100, 28);
        assert_eq!(h.slot_range(2, 128), Ok((100, 128)));
        assert!(h.slot_range(2, 127).is_err());
        assert!(h.slot_range(1, 128).is_err(), "slot 1 of 1");
        let mut huge = Header::word(0, 1, 0, 0, 0);
        huge.offset = u64::MAX;
        huge.len = 2;
        assert!(huge.slot_range(2, 1 << 20).is_err(), "overflowing range");
        huge.offset = 0;
        huge.len = u64::MAX;
        assert!(huge.slot_range(2, 1 << 20).is_err());
    }

    #[test]
    fn pieces_cover_a_payload_once() {
        for len in [0usize, 1, 99, 100, 101, 1000, (1 << 20) + 7] {
            for piece in [1usize, 7, 100, 1 << 20] {
                let got: Vec<_> = pieces(len, piece).collect();
                assert_eq!(got.len(), len.div_ceil(piece));
                let mut at = 0;
                for (a, b) in got {
                    assert_eq!(a, at);
                    assert!(b > a && b - a <= piece);
                    at = b;
                }
                assert_eq!(at, len);
            }
        }
        assert_eq!(pieces(5, 0).count(), 5, "a zero piece size means bytes");
    }

    #[test]
    fn turns_cover_a_range_once_then_nothing() {
        for (lo, hi) in [(0usize, 0usize), (3, 4), (100, 1000), (7, (1 << 20) + 9)] {
            for piece in [1usize, 64, 1 << 18] {
                let turns = (hi - lo).div_ceil(piece);
                let mut at = lo;
                for t in 0..turns {
                    let (a, b) = turn(lo, hi, t, piece);
                    assert_eq!(a, at);
                    assert!(b > a && b - a <= piece);
                    at = b;
                }
                assert_eq!(at, hi);
                let (a, b) = turn(lo, hi, turns + 3, piece);
                assert_eq!(a, b, "nothing after the last turn");
            }
        }
    }

    #[test]
    fn widen_takes_the_union() {
        assert_eq!(widen(None, 3, 9), (3, 9));
        assert_eq!(widen(Some((3, 9)), 0, 4), (0, 9));
        assert_eq!(widen(Some((3, 9)), 5, 20), (3, 20));
    }
}
