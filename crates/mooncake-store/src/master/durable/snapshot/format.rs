//! The snapshot format: the replicated state of a master at one log
//! position, in one checksummed frame.
//!
//! ```text
//! 0..4   magic "MCSN"
//! 4      format version (3; 2 and 1 are read too: 2 has no object
//!        groups, 1 no reserved space either)
//! 5..8   zero
//! 8..16  payload length, u64 little-endian
//! 16..20 CRC-32C of bytes 4..16 and the payload
//! 20..   payload (varint-based wire encoding, `crate::proto::wire`):
//!        seq, term, now, then the state machine's image (`state::image`:
//!        segments, clients, objects, tasks, retired ranges, SSD tiers,
//!        their copies, reserved space from version 2 on, object groups
//!        from version 3 on)
//! ```
//!
//! Decoding checks the frame before it reads anything, then has a fresh
//! [`MasterService`] load the image, which refuses a state that does not
//! hold together rather than serving it.

use std::fmt;

use mooncake_common::{Error, ErrorCode};

use super::progress::RestoreProgress;
use crate::master::state::image::{ImageError, LoadProgress};
use crate::master::state::service::MasterService;
use crate::proto::wire::{self, Decode, Encode, Reader};

pub const MAGIC: [u8; 4] = *b"MCSN";
pub const VERSION: u8 = 3;
/// The oldest version still read.
const OLDEST: u8 = 1;
pub const HEADER_LEN: usize = 20;

/// Where in the log a snapshot stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SnapshotMeta {
    /// The last log entry it includes.
    pub seq: u64,
    /// The term of that entry.
    pub term: u64,
    /// The master clock (ms) of the latest mutation it includes.
    pub now: u64,
}

/// Why bytes are not a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    Truncated,
    BadMagic,
    UnknownVersion(u8),
    Checksum {
        stored: u32,
        computed: u32,
    },
    /// The checksum matches but the payload does not decode.
    Malformed(wire::DecodeError),
    /// It decodes, but its state does not hold together.
    Inconsistent(String),
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Truncated => write!(f, "snapshot is truncated"),
            SnapshotError::BadMagic => write!(f, "not a snapshot (bad magic)"),
            SnapshotError::UnknownVersion(v) => write!(f, "unknown snapshot version {v}"),
            SnapshotError::Checksum { stored, computed } => write!(
                f,
                "snapshot checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
            SnapshotError::Malformed(e) => write!(f, "malformed snapshot: {e}"),
            SnapshotError::Inconsistent(why) => write!(f, "inconsistent snapshot: {why}"),
        }
    }
}

impl std::error::Error for SnapshotError {}

impl From<SnapshotError> for Error {
    fn from(e: SnapshotError) -> Self {
        let code = match e {
            SnapshotError::UnknownVersion(_) => ErrorCode::INVALID_VERSION,
            _ => ErrorCode::DESERIALIZE_FAIL,
        };
        Error::new(code, e.to_string())
    }
}

impl From<wire::DecodeError> for SnapshotError {
    fn from(e: wire::DecodeError) -> Self {
        SnapshotError::Malformed(e)
    }
}

impl From<ImageError> for SnapshotError {
    fn from(e: ImageError) -> Self {
        match e {
            ImageError::Malformed(e) => SnapshotError::Malformed(e),
            ImageError::Inconsistent(why) => SnapshotError::Inconsistent(why),
        }
    }
}

/// A restore's progress through the objects of the snapshot at `seq`.
struct Objects<'a> {
    progress: &'a RestoreProgress,
    seq: u64,
}

impl LoadProgress for Objects<'_> {
    fn begin(&self, objects: u64) {
        self.progress.begin(self.seq, objects);
    }

    fn restored(&self, done: u64) {
        self.progress.restored(done);
    }
}

fn checksum(header: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(header), payload)
}

/// Encodes the state of `s` (which nothing changes meanwhile) as a
/// snapshot at `meta`.
pub fn encode(s: &MasterService, meta: SnapshotMeta) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&[VERSION, 0, 0, 0]);
    out.extend_from_slice(&[0; 12]);
    meta.seq.encode(&mut out);
    meta.term.encode(&mut out);
    meta.now.encode(&mut out);
    s.encode_image(&mut out);

    let len = (out.len() - HEADER_LEN) as u64;
    out[8..16].copy_from_slice(&len.to_le_bytes());
    let crc = checksum(&out[4..16], &out[HEADER_LEN..]);
    out[16..20].copy_from_slice(&crc.to_le_bytes());
    out
}

/// The checked payload of a snapshot (frame checks only).
pub fn payload(buf: &[u8]) -> std::result::Result<&[u8], SnapshotError> {
    let seen = buf.len().min(4);
    if buf[..seen] != MAGIC[..seen] {
        return Err(SnapshotError::BadMagic);
    }
    if let Some(&v) = buf.get(4) {
        if !(OLDEST..=VERSION).contains(&v) {
            return Err(SnapshotError::UnknownVersion(v));
        }
    }
    if buf.len() < HEADER_LEN {
        return Err(SnapshotError::Truncated);
    }
    let len = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
    let rest = (buf.len() - HEADER_LEN) as u64;
    if len > rest {
        return Err(SnapshotError::Truncated);
    }
    if len < rest {
        return Err(SnapshotError::Malformed(wire::DecodeError::TrailingBytes(
            (rest - len) as usize,
        )));
    }
    let stored = u32::from_le_bytes(buf[16..20].try_into().expect("4 bytes"));
    let payload = &buf[HEADER_LEN..];
    let computed = checksum(&buf[4..16], payload);
    if stored != computed {
        return Err(SnapshotError::Checksum { stored, computed });
    }
    Ok(payload)
}

/// The position a snapshot stands at, from its frame alone.
pub fn read_meta(buf: &[u8]) -> std::result::Result<SnapshotMeta, SnapshotError> {
    let mut r = Reader::new(payload(buf)?);
    Ok(SnapshotMeta {
        seq: u64::decode(&mut r)?,
        term: u64::decode(&mut r)?,
        now: u64::decode(&mut r)?,
    })
}

/// Rebuilds the state a snapshot holds into `s`, a fresh master (with
/// the policy the snapshot was taken under). On an error `s` holds part
/// of it and must be thrown away.
pub fn decode_into(
    buf: &[u8],
    s: &MasterService,
    progress: &RestoreProgress,
) -> std::result::Result<SnapshotMeta, SnapshotError> {
    let mut r = Reader::new(payload(buf)?);
    let meta = SnapshotMeta {
        seq: u64::decode(&mut r)?,
        term: u64::decode(&mut r)?,
        now: u64::decode(&mut r)?,
    };
    let objects = Objects {
        progress,
        seq: meta.seq,
    };
    s.decode_image(&mut r, meta.now, buf[4], &objects)?;
    r.finish()?;
    Ok(meta)
}
