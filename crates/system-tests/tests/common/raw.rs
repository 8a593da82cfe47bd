//! Calls over a connection of the test's own, one frame at a time: the
//! master's and the dummy service's protocols alike.

use std::io::{Read, Write};

use mooncake_store::proto::frame::read_frame;
use mooncake_store::proto::{decode_payload, encode_frame, Decode, Encode};

/// The answer to raw `bytes` (one or more frames, or garbage) on `s`.
pub fn answer<R: for<'a> Decode<'a>>(s: &mut (impl Read + Write), bytes: &[u8]) -> R {
    s.write_all(bytes).unwrap();
    let mut buf = Vec::new();
    read_frame(s, &mut buf).unwrap();
    decode_payload(&buf).unwrap()
}

/// The answer to `req` on `s`.
pub fn call<R: for<'a> Decode<'a>>(s: &mut (impl Read + Write), req: &impl Encode) -> R {
    let mut frame = Vec::new();
    encode_frame(req, &mut frame).unwrap();
    answer(s, &frame)
}
