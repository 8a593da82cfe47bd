//! The decoders of untrusted input that the fuzz targets (`fuzz/`) drive,
//! reachable from outside the crate. Not a stable API: it follows the
//! crate's internals.

use std::io::{self, BufRead, Read};
use std::time::{Duration, Instant};

pub use crate::frame::{
    decode_notify, encode_notify, FrameError, Header, Kind, HEADER_LEN, MAX_DATA_FRAME,
};
pub use crate::segment::{BufferDesc, RpcMeta, SegmentDesc, ShmDesc};

/// The engine's buffered frame input (what its listener and the TCP
/// transport read frames with).
pub struct FrameReader(crate::conn::FrameReader);

impl Default for FrameReader {
    fn default() -> Self {
        FrameReader(crate::conn::FrameReader::new())
    }
}

impl FrameReader {
    /// The next header; `None` when the stream ended between frames.
    pub fn read_header(&mut self, r: &mut impl Read) -> io::Result<Option<[u8; HEADER_LEN]>> {
        self.0.read_header(r, || false)
    }

    /// Whether the next `n` bytes are already buffered.
    pub fn has(&self, n: u64) -> bool {
        self.0.has(n)
    }

    pub fn read_into(&mut self, r: &mut impl Read, dst: &mut [u8]) -> io::Result<()> {
        self.0.read_into(r, dst)
    }

    pub fn skip(&mut self, r: &mut impl Read, n: u64) -> io::Result<()> {
        self.0.skip(r, n)
    }
}

/// An HTTP metadata server's reply, as the HTTP metadata client parses it.
#[derive(Debug, PartialEq, Eq)]
pub struct HttpReply {
    pub status: u16,
    pub body: Vec<u8>,
    pub keep_alive: bool,
}

/// Parses one reply from `r` (the client reads its replies with this).
pub fn read_http_reply(r: &mut impl BufRead) -> io::Result<HttpReply> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let reply = crate::metadata::http::read_reply(r, deadline)?;
    Ok(HttpReply {
        status: reply.status,
        body: reply.body,
        keep_alive: reply.keep_alive,
    })
}
