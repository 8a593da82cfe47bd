//! Framing: every message travels as one frame.
//!
//! ```text
//! frame   := length:u32 (little-endian, payload bytes, 2..=MAX_FRAME_LEN) payload
//! payload := version:u8 message
//! ```
//!
//! A length outside the bounds means the stream cannot be trusted any more:
//! the reader closes the connection. A payload that does not decode is
//! answered with an error and the connection goes on, since the framing is
//! intact.

use std::io::{self, Read, Write};

use super::wire::{Decode, DecodeError, Encode, Reader};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 1;
/// Largest payload accepted in either direction.
pub const MAX_FRAME_LEN: usize = 64 << 20;
/// Bytes of the length prefix.
pub const LEN_PREFIX: usize = 4;
/// Smallest payload: the version byte plus a message tag.
const MIN_FRAME_LEN: usize = 2;

/// Appends one frame carrying `msg` to `out`. Fails (leaving `out` as it was)
/// when the message exceeds [`MAX_FRAME_LEN`].
pub fn encode_frame<M: Encode + ?Sized>(msg: &M, out: &mut Vec<u8>) -> io::Result<()> {
    let start = out.len();
    out.extend_from_slice(&[0; LEN_PREFIX]);
    out.push(PROTOCOL_VERSION);
    msg.encode(out);
    let len = out.len() - start - LEN_PREFIX;
    if len > MAX_FRAME_LEN {
        out.truncate(start);
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("message of {len} bytes exceeds the {MAX_FRAME_LEN}-byte frame limit"),
        ));
    }
    out[start..start + LEN_PREFIX].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(())
}

/// Checks a length prefix; an out-of-range length is an `InvalidData` error.
pub fn frame_len(prefix: [u8; LEN_PREFIX]) -> io::Result<usize> {
    let len = u32::from_le_bytes(prefix) as usize;
    if !(MIN_FRAME_LEN..=MAX_FRAME_LEN).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad frame length {len}"),
        ));
    }
    Ok(len)
}

/// Decodes a payload (without its length prefix): version, message, nothing after.
pub fn decode_payload<'a, M: Decode<'a>>(payload: &'a [u8]) -> Result<M, DecodeError> {
    let mut r = Reader::new(payload);
    let version = r.u8()?;
    if version != PROTOCOL_VERSION {
        return Err(DecodeError::BadVersion(version));
    }
    let msg = M::decode(&mut r)?;
    r.finish()?;
    Ok(msg)
}

/// Reads one frame's payload into `buf` (replacing its contents), blocking.
pub fn read_frame(stream: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut prefix = [0u8; LEN_PREFIX];
    stream.read_exact(&mut prefix)?;
    let len = frame_len(prefix)?;
    buf.clear();
    buf.resize(len, 0);
    stream.read_exact(buf)
}

/// Writes already-encoded frames, blocking.
pub fn write_frames(stream: &mut impl Write, frames: &[u8]) -> io::Result<()> {
    stream.write_all(frames)?;
    stream.flush()
}
