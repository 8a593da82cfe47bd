//! The frame of a log entry: a fixed header, then the entry (`entry`).
//!
//! ```text
//! 0..4   magic "MCOL"
//! 4      format version (1)
//! 5..8   zero
//! 8..12  payload length, u32 little-endian
//! 12..16 CRC-32C of bytes 4..12 and the payload, u32 little-endian
//! 16..   payload: seq, term, mutations (varint-based wire encoding)
//! ```
//!
//! Decoding checks, in order, magic, version, length (against
//! [`MAX_ENTRY_LEN`] and the input), checksum, then parses the payload
//! strictly; it never panics and allocates at most in proportion to the
//! input. A frame cut short is [`DecodeError::Truncated`], which a log
//! reader takes as the torn tail of an unacknowledged write.

use std::fmt;

use mooncake_common::{Error, ErrorCode};

use super::entry::OwnedEntry;
use crate::proto::wire::{self, Decode, Encode, Reader};

pub const MAGIC: [u8; 4] = *b"MCOL";
/// The format this build writes and reads.
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 16;
/// The largest payload accepted (a frame claiming more is refused before
/// anything is read or allocated).
pub const MAX_ENTRY_LEN: usize = 64 << 20;

/// Why bytes are not a log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ends inside the frame.
    Truncated,
    /// Not the start of a log entry.
    BadMagic,
    /// A format version this build does not read.
    UnknownVersion(u8),
    /// The header claims a payload over [`MAX_ENTRY_LEN`].
    TooLarge(u64),
    /// The checksum does not match: the bytes were damaged.
    Checksum { stored: u32, computed: u32 },
    /// The checksum matches but the payload is not a valid entry.
    Malformed(wire::DecodeError),
    /// Bytes after the frame (for [`decode`], which takes exactly one).
    TrailingBytes(usize),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "log entry is truncated"),
            DecodeError::BadMagic => write!(f, "not a log entry (bad magic)"),
            DecodeError::UnknownVersion(v) => write!(f, "unknown log entry version {v}"),
            DecodeError::TooLarge(n) => {
                write!(f, "log entry of {n} bytes exceeds {MAX_ENTRY_LEN}")
            }
            DecodeError::Checksum { stored, computed } => write!(
                f,
                "log entry checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
            DecodeError::Malformed(e) => write!(f, "malformed log entry: {e}"),
            DecodeError::TrailingBytes(n) => write!(f, "{n} bytes after the log entry"),
        }
    }
}

impl std::error::Error for DecodeError {}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Self {
        let code = match e {
            DecodeError::UnknownVersion(_) => ErrorCode::INVALID_VERSION,
            _ => ErrorCode::DESERIALIZE_FAIL,
        };
        Error::new(code, e.to_string())
    }
}

impl OwnedEntry {
    /// Appends this entry's frame to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[VERSION, 0, 0, 0]);
        out.extend_from_slice(&[0; 8]);
        self.encode(out);
        seal(out, start);
    }

    /// This entry's frame.
    pub fn to_frame(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }
}

/// Fills in the length and checksum of the frame that starts at `start`
/// and runs to the end of `out` (its payload already written).
pub(crate) fn seal(out: &mut [u8], start: usize) {
    let len = out.len() - start - HEADER_LEN;
    assert!(
        len <= MAX_ENTRY_LEN,
        "log entry of {len} bytes is too large"
    );
    out[start + 8..start + 12].copy_from_slice(&(len as u32).to_le_bytes());
    let crc = checksum(&out[start + 4..start + 12], &out[start + HEADER_LEN..]);
    out[start + 12..start + 16].copy_from_slice(&crc.to_le_bytes());
}

fn checksum(header: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(header), payload)
}

/// Decodes exactly one frame.
pub fn decode(buf: &[u8]) -> Result<OwnedEntry, DecodeError> {
    let (entry, used) = decode_prefix(buf)?;
    match buf.len() - used {
        0 => Ok(entry),
        n => Err(DecodeError::TrailingBytes(n)),
    }
}

/// Decodes the frame at the start of `buf`; returns it and its length in
/// bytes (where the next frame starts).
pub fn decode_prefix(buf: &[u8]) -> Result<(OwnedEntry, usize), DecodeError> {
    let payload = frame_payload(buf)?;
    let mut r = Reader::new(payload);
    let entry = OwnedEntry::decode(&mut r).map_err(DecodeError::Malformed)?;
    r.finish().map_err(DecodeError::Malformed)?;
    Ok((entry, HEADER_LEN + payload.len()))
}

/// The checked payload of the frame at the start of `buf`.
pub(crate) fn frame_payload(buf: &[u8]) -> Result<&[u8], DecodeError> {
    let magic_seen = buf.len().min(4);
    if buf[..magic_seen] != MAGIC[..magic_seen] {
        return Err(DecodeError::BadMagic);
    }
    if buf.len() < HEADER_LEN {
        if let Some(&v) = buf.get(4) {
            if v != VERSION {
                return Err(DecodeError::UnknownVersion(v));
            }
        }
        return Err(DecodeError::Truncated);
    }
    if buf[4] != VERSION {
        return Err(DecodeError::UnknownVersion(buf[4]));
    }
    let word = |at: usize| u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
    let len = word(8) as usize;
    if len > MAX_ENTRY_LEN {
        return Err(DecodeError::TooLarge(len as u64));
    }
    let Some(payload) = buf.get(HEADER_LEN..HEADER_LEN + len) else {
        return Err(DecodeError::Truncated);
    };
    let stored = word(12);
    let computed = checksum(&buf[4..12], payload);
    if stored != computed {
        return Err(DecodeError::Checksum { stored, computed });
    }
    Ok(payload)
}
