//! The engine's wire format: fixed 32-byte headers, optionally followed by a
//! payload. Pure encode/decode/validate, no I/O (see `rpc.rs` and
//! `transport/tcp.rs` for the connections).
//!
//! ```text
//! 0      4   5    6     8       12    16       24       32
//! | magic|ver|kind|flags| status | seq | addr   | len    | payload (len bytes, some kinds)
//! ```
//! All integers little-endian. Requests travel initiator → target on one
//! connection, responses come back in the same order with the same `seq`.
//! Anything that does not decode, or announces more bytes than the kind
//! allows, is a protocol error: the receiver closes the connection.

use std::fmt;

use mooncake_common::auth::MAX_TOKEN_LEN;

pub(crate) const MAGIC: u32 = u32::from_le_bytes(*b"MCTE");
pub(crate) const VERSION: u8 = 1;
pub(crate) const HEADER_LEN: usize = 32;
/// Largest data payload in one frame. Senders slice below it; it also bounds
/// what a receiver drains when it refuses a write.
pub(crate) const MAX_DATA_FRAME: u64 = 64 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// Write `len` payload bytes at `addr` of the target's memory.
    WriteReq = 1,
    /// Result of a `WriteReq` (`status`), no payload.
    WriteAck = 2,
    /// Read `len` bytes at `addr` of the target's memory.
    ReadReq = 3,
    /// Result of a `ReadReq`: `len` payload bytes when `status` is 0, none otherwise.
    ReadResp = 4,
    /// Ask for the target's segment descriptor; payload: the segment name asked for.
    DescReq = 5,
    /// Payload: the descriptor JSON (when `status` is 0).
    DescResp = 6,
    /// Deliver a notify; payload: see [`encode_notify`].
    NotifyReq = 7,
    NotifyAck = 8,
    /// Present the cluster token (the payload); with a token configured,
    /// the first frame of every connection.
    AuthReq = 9,
    /// Result of an `AuthReq` (`status`), no payload.
    AuthAck = 10,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::WriteReq,
            2 => Kind::WriteAck,
            3 => Kind::ReadReq,
            4 => Kind::ReadResp,
            5 => Kind::DescReq,
            6 => Kind::DescResp,
            7 => Kind::NotifyReq,
            8 => Kind::NotifyAck,
            9 => Kind::AuthReq,
            10 => Kind::AuthAck,
            _ => return None,
        })
    }

    /// Kinds an engine accepts on its listening port.
    pub(crate) fn is_request(self) -> bool {
        matches!(
            self,
            Kind::WriteReq | Kind::ReadReq | Kind::DescReq | Kind::NotifyReq | Kind::AuthReq
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) kind: Kind,
    /// 0, or the failure's `ErrorCode::wire` number (responses).
    pub(crate) status: i32,
    pub(crate) seq: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum FrameError {
    BadMagic(u32),
    BadVersion(u8),
    UnknownKind(u8),
    BadFlags(u16),
    /// The header announces more payload than this kind allows.
    TooLong {
        kind: Kind,
        len: u64,
        max: u64,
    },
    /// A kind that carries no payload announced one.
    UnexpectedPayload(Kind),
    /// A kind that the receiving side of the connection does not accept.
    WrongDirection(Kind),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::BadMagic(m) => write!(f, "bad magic {m:#x}"),
            FrameError::BadVersion(v) => write!(f, "unsupported version {v}"),
            FrameError::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            FrameError::BadFlags(x) => write!(f, "unknown flags {x:#x}"),
            FrameError::TooLong { kind, len, max } => {
                write!(f, "{kind:?} of {len} bytes exceeds {max}")
            }
            FrameError::UnexpectedPayload(k) => write!(f, "{k:?} must not carry a payload"),
            FrameError::WrongDirection(k) => write!(f, "{k:?} not accepted here"),
        }
    }
}

impl std::error::Error for FrameError {}

impl Header {
    pub(crate) fn new(kind: Kind, seq: u32, addr: u64, len: u64) -> Header {
        Header {
            kind,
            status: 0,
            seq,
            addr,
            len,
        }
    }

    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.kind as u8;
        // b[6..8]: flags, zero.
        b[8..12].copy_from_slice(&self.status.to_le_bytes());
        b[12..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(FrameError::BadVersion(b[4]));
        }
        let kind = Kind::from_u8(b[5]).ok_or(FrameError::UnknownKind(b[5]))?;
        let flags = u16::from_le_bytes([b[6], b[7]]);
        if flags != 0 {
            return Err(FrameError::BadFlags(flags));
        }
        Ok(Header {
            kind,
            status: u32_at(8) as i32,
            seq: u32_at(12),
            addr: u64_at(16),
            len: u64_at(24),
        })
    }

    /// Bytes of payload that follow this header on the wire.
    pub(crate) fn payload_len(&self) -> u64 {
        match self.kind {
            Kind::WriteReq | Kind::DescReq | Kind::NotifyReq | Kind::AuthReq => self.len,
            Kind::ReadResp | Kind::DescResp if self.status == 0 => self.len,
            _ => 0,
        }
    }

    /// Checks sizes against the limits; `control_max` bounds descriptor and
    /// notify payloads (`MC_HANDSHAKE_MAX_LENGTH`).
    pub(crate) fn check_limits(&self, control_max: u64) -> Result<(), FrameError> {
        let max = match self.kind {
            Kind::WriteReq | Kind::ReadReq | Kind::ReadResp => MAX_DATA_FRAME,
            Kind::DescReq | Kind::DescResp | Kind::NotifyReq => control_max,
            Kind::AuthReq => MAX_TOKEN_LEN as u64,
            Kind::WriteAck | Kind::NotifyAck | Kind::AuthAck => {
                return if self.len == 0 {
                    Ok(())
                } else {
                    Err(FrameError::UnexpectedPayload(self.kind))
                };
            }
        };
        if self.len > max {
            return Err(FrameError::TooLong {
                kind: self.kind,
                len: self.len,
                max,
            });
        }
        Ok(())
    }

    /// Decodes and validates a frame arriving at a listening engine.
    pub(crate) fn decode_request(
        b: &[u8; HEADER_LEN],
        control_max: u64,
    ) -> Result<Header, FrameError> {
        let h = Header::decode(b)?;
        if !h.kind.is_request() {
            return Err(FrameError::WrongDirection(h.kind));
        }
        h.check_limits(control_max)?;
        Ok(h)
    }

    /// Decodes and validates a frame arriving at an initiator.
    pub(crate) fn decode_response(
        b: &[u8; HEADER_LEN],
        control_max: u64,
    ) -> Result<Header, FrameError> {
        let h = Header::decode(b)?;
        if h.kind.is_request() {
            return Err(FrameError::WrongDirection(h.kind));
        }
        h.check_limits(control_max)?;
        Ok(h)
    }

    pub(crate) fn response(kind: Kind, to: &Header, status: i32, len: u64) -> Header {
        Header {
            kind,
            status,
            seq: to.seq,
            addr: to.addr,
            len,
        }
    }
}

/// Notify payload: `u32 name length`, name, message.
pub(crate) fn encode_notify(name: &str, msg: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + name.len() + msg.len());
    v.extend_from_slice(&(name.len() as u32).to_le_bytes());
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(msg.as_bytes());
    v
}

pub(crate) fn decode_notify(p: &[u8]) -> Option<(String, String)> {
    let n = u32::from_le_bytes(p.get(0..4)?.try_into().ok()?) as usize;
    let name = p.get(4..4usize.checked_add(n)?)?;
    let msg = &p[4 + n..];
    Some((
        String::from_utf8(name.to_vec()).ok()?,
        String::from_utf8(msg.to_vec()).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let h = Header {
            kind: Kind::ReadResp,
            status: -12,
            seq: 7,
            addr: 0xdead_beef,
            len: 4096,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        assert_eq!(h.payload_len(), 0, "an error response carries no payload");
        assert_eq!(Header { status: 0, ..h }.payload_len(), 4096);
    }

    #[test]
    fn rejects_malformed_headers() {
        let good = Header::new(Kind::WriteReq, 1, 4096, 10).encode();
        let mut b = good;
        b[0] ^= 1;
        assert!(matches!(Header::decode(&b), Err(FrameError::BadMagic(_))));
        let mut b = good;
        b[4] = 9;
        assert_eq!(Header::decode(&b), Err(FrameError::BadVersion(9)));
        let mut b = good;
        b[5] = 0;
        assert_eq!(Header::decode(&b), Err(FrameError::UnknownKind(0)));
        b[5] = 200;
        assert_eq!(Header::decode(&b), Err(FrameError::UnknownKind(200)));
        let mut b = good;
        b[6] = 1;
        assert_eq!(Header::decode(&b), Err(FrameError::BadFlags(1)));
    }

    #[test]
    fn rejects_oversized_and_misdirected_frames() {
        let big = Header::new(Kind::WriteReq, 1, 0, MAX_DATA_FRAME + 1).encode();
        assert!(matches!(
            Header::decode_request(&big, 1024),
            Err(FrameError::TooLong { .. })
        ));
        let desc = Header::new(Kind::DescReq, 1, 0, 1025).encode();
        assert!(matches!(
            Header::decode_request(&desc, 1024),
            Err(FrameError::TooLong { .. })
        ));
        let ack = Header::new(Kind::WriteAck, 1, 0, 0).encode();
        assert_eq!(
            Header::decode_request(&ack, 1024),
            Err(FrameError::WrongDirection(Kind::WriteAck))
        );
        let req = Header::new(Kind::ReadReq, 1, 0, 8).encode();
        assert_eq!(
            Header::decode_response(&req, 1024),
            Err(FrameError::WrongDirection(Kind::ReadReq))
        );
        let ack_with_len = Header::new(Kind::WriteAck, 1, 0, 5).encode();
        assert_eq!(
            Header::decode_response(&ack_with_len, 1024),
            Err(FrameError::UnexpectedPayload(Kind::WriteAck))
        );
    }

    #[test]
    fn notify_payload() {
        let p = encode_notify("node", "hello");
        assert_eq!(decode_notify(&p), Some(("node".into(), "hello".into())));
        assert_eq!(decode_notify(&p[..3]), None);
        let mut bad = p.clone();
        bad[0] = 200;
        assert_eq!(decode_notify(&bad), None);
        assert_eq!(
            decode_notify(&[0, 0, 0, 0]),
            Some((String::new(), String::new()))
        );
        assert_eq!(
            decode_notify(&[1, 0, 0, 0, 0xff]),
            None,
            "names must be UTF-8"
        );
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::array::uniform32(any::<u8>()), max in 0u64..1 << 24) {
            if let Ok(h) = Header::decode_request(&bytes, max) {
                prop_assert!(h.kind.is_request());
                prop_assert!(h.payload_len() <= MAX_DATA_FRAME.max(max));
            }
            let _ = Header::decode_response(&bytes, max);
        }

        #[test]
        fn notify_payload_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_notify(&bytes);
        }
    }
}
