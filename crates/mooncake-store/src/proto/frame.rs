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
//!
//! Readers never trust the declared length with memory: the body buffer grows
//! as bytes arrive, so a peer that declares 64 MiB and sends one byte costs
//! a few KiB. Servers also give a frame a deadline once its first byte has
//! arrived (see [`read_frame_within`], [`read_frame_async`]); the wait between
//! frames stays unbounded, since clients keep connections open.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};

use super::wire::{Decode, DecodeError, Encode, EncodeLimit, Reader};

/// The protocol version this build speaks. Raised whenever a message's
/// layout changes (fields are positional), so that a peer of another build
/// is refused with `INVALID_VERSION` instead of misreading fields.
pub const PROTOCOL_VERSION: u8 = 2;
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
    {
        // Past this the frame is refused below: stop building it.
        let _limit = EncodeLimit::new(start + LEN_PREFIX + MAX_FRAME_LEN);
        msg.encode(out);
    }
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

/// First step of a body buffer; each further step at most doubles it.
const FIRST_STEP: usize = 64 << 10;

/// Bytes to add to a body buffer holding `have` of `len` bytes: the buffer
/// never exceeds twice what arrived (or [`FIRST_STEP`]).
fn next_step(have: usize, len: usize) -> usize {
    (len - have).min(have.max(FIRST_STEP))
}

/// Reads one frame's payload into `buf` (replacing its contents), blocking.
pub fn read_frame(stream: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut prefix = [0u8; LEN_PREFIX];
    stream.read_exact(&mut prefix)?;
    let len = frame_len(prefix)?;
    buf.clear();
    while buf.len() < len {
        let have = buf.len();
        buf.resize(have + next_step(have, len), 0);
        stream.read_exact(&mut buf[have..])?;
    }
    Ok(())
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what)
}

/// Reads one frame from a blocking socket, which must have a read timeout
/// (`set_read_timeout`) of at most `limit`. The frame must be complete
/// `limit` after its first byte (`idle`: a server waiting for the next call,
/// however long) or after now (not `idle`: a client awaiting an answer).
/// The deadline is checked before every read that follows a short read or a
/// read timeout (a frame read in full reads no clock), so a stalled or
/// trickling frame fails at most one read timeout late, with `TimedOut`; the
/// stream is then out of step and must be closed.
pub fn read_frame_within(
    stream: &mut impl Read,
    buf: &mut Vec<u8>,
    limit: Duration,
    idle: bool,
) -> io::Result<()> {
    let mut timed = Timed {
        inner: stream,
        since: (!idle).then(Instant::now),
        limit,
        waited: false,
    };
    read_frame(&mut timed, buf)
}

/// A reader whose reads fail once `limit` has passed since `since` (set by
/// the first byte when it starts unset).
struct Timed<'a, R> {
    inner: &'a mut R,
    since: Option<Instant>,
    limit: Duration,
    /// The last read came back short or timed out: the data may be stalling.
    waited: bool,
}

impl<R: Read> Read for Timed<'_, R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.waited && self.since.is_some_and(|t| t.elapsed() > self.limit) {
                return Err(timed_out("frame not complete in time"));
            }
            match self.inner.read(out) {
                Ok(n) => {
                    if n > 0 && self.since.is_none() {
                        self.since = Some(Instant::now());
                    }
                    self.waited = n < out.len();
                    return Ok(n);
                }
                // The socket's read timeout: between frames keep waiting,
                // within one the deadline check above decides.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    self.waited = true
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Reads one frame (async). The wait for its first byte is bounded by `idle`
/// (`None`: unbounded); the rest of the frame must arrive within `limit` of
/// that byte. `Ok(false)` means the peer closed the stream between frames.
/// A bad length is `InvalidData`, a deadline `TimedOut`; either way the
/// stream is out of step and must be closed.
pub async fn read_frame_async<R: AsyncRead + Unpin>(
    stream: &mut R,
    buf: &mut Vec<u8>,
    idle: Option<Duration>,
    limit: Duration,
) -> io::Result<bool> {
    let mut first = [0u8; 1];
    let n = match idle {
        Some(t) => tokio::time::timeout(t, stream.read(&mut first))
            .await
            .map_err(|_| timed_out("idle connection"))??,
        None => stream.read(&mut first).await?,
    };
    if n == 0 {
        return Ok(false);
    }
    let rest = async {
        let mut prefix = [first[0], 0, 0, 0];
        stream.read_exact(&mut prefix[1..]).await?;
        let len = frame_len(prefix)?;
        buf.clear();
        while buf.len() < len {
            let have = buf.len();
            buf.resize(have + next_step(have, len), 0);
            stream.read_exact(&mut buf[have..]).await?;
        }
        Ok::<(), io::Error>(())
    };
    tokio::time::timeout(limit, rest)
        .await
        .map_err(|_| timed_out("frame not complete in time"))??;
    Ok(true)
}

/// Writes already-encoded frames, blocking.
pub fn write_frames(stream: &mut impl Write, frames: &[u8]) -> io::Result<()> {
    stream.write_all(frames)?;
    stream.flush()
}
