//! Entry points for the fuzz targets (`fuzz/`, built with the `fuzzing`
//! feature): each takes one raw input, runs the crate's decoder of
//! untrusted bytes on it and panics when a property of that decoder fails.
//! The heap budget is checked around these calls by the targets (which own
//! the global allocator). Not a stable API: it follows the crate's internals.

mod seeds;

use std::io::BufReader;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::conn::{FrameReader, Pieces};
use crate::frame::{decode_notify, encode_notify, Header, Kind, HEADER_LEN, MAX_DATA_FRAME};
use crate::metadata::http::read_reply;
use crate::metadata::MAX_VALUE_LEN;
use crate::segment::{RpcMeta, SegmentDesc};

pub use seeds::{seeds, Corpus, Seeds};

/// `MC_HANDSHAKE_MAX_LENGTH` values to check limits against.
const CONTROL_MAX: [u64; 4] = [0, 64, 4096, 1 << 20];

/// The knobs byte an engine-frame input starts with: `piece` bytes per read
/// (1..=64) and the index of the control limit in [`CONTROL_MAX`].
pub(crate) fn frame_knobs(piece: u8, control: u8) -> u8 {
    (control << 6) | (piece - 1)
}

/// The engine's wire frames: 32-byte headers, and a stream of frames as the
/// engine's listener reads it (headers, then payloads). The first byte
/// picks how the stream is cut and the control limit.
pub fn engine_frames(data: &[u8]) {
    let Some((&knobs, stream)) = data.split_first() else {
        return;
    };
    let piece = usize::from(knobs & 0x3f) + 1;
    let control_max = CONTROL_MAX[usize::from(knobs >> 6)];
    for chunk in stream.chunks_exact(HEADER_LEN) {
        check_header(chunk.try_into().expect("a whole header"), control_max);
    }
    read_stream(stream, piece, control_max);
}

fn limit(kind: Kind, control_max: u64) -> u64 {
    match kind {
        Kind::WriteReq | Kind::ReadReq | Kind::ReadResp => MAX_DATA_FRAME,
        Kind::DescReq | Kind::DescResp | Kind::NotifyReq => control_max,
        Kind::AuthReq => mooncake_common::auth::MAX_TOKEN_LEN as u64,
        Kind::WriteAck | Kind::NotifyAck | Kind::AuthAck => 0,
    }
}

/// A header decodes to what encodes to the same bytes (the format is
/// canonical), or is refused; a validated one respects its kind's limits.
fn check_header(b: &[u8; HEADER_LEN], control_max: u64) {
    if let Ok(h) = Header::decode(b) {
        assert_eq!(&h.encode(), b);
    }
    if let Ok(h) = Header::decode_request(b, control_max) {
        assert!(h.kind.is_request());
        assert!(h.len <= limit(h.kind, control_max));
        assert!(h.payload_len() <= h.len);
    }
    if let Ok(h) = Header::decode_response(b, control_max) {
        assert!(!h.kind.is_request());
        assert!(h.len <= limit(h.kind, control_max));
        assert!(h.payload_len() <= h.len);
    }
}

/// Reads `stream`, `piece` bytes per read call, as the listener does: a
/// header, then its payload (into a destination, or skipped like a refused
/// write's), until the stream ends or a header is refused. The frame reader
/// must hand back exactly the bytes of the stream, in order.
fn read_stream(stream: &[u8], piece: usize, control_max: u64) {
    let mut r = Pieces {
        data: stream,
        piece,
    };
    let mut input = FrameReader::new();
    let mut at = 0usize;
    let mut dst = [0u8; 1024];
    loop {
        let hdr = match input.read_header(&mut r, || false) {
            Ok(Some(h)) => h,
            Ok(None) => {
                assert_eq!(at, stream.len(), "clean end only between frames");
                return;
            }
            Err(_) => {
                assert!(
                    stream.len() - at < HEADER_LEN,
                    "error with a whole header left"
                );
                return;
            }
        };
        assert_eq!(&hdr[..], &stream[at..at + HEADER_LEN]);
        at += HEADER_LEN;
        let Ok(h) = Header::decode_request(&hdr, control_max) else {
            return;
        };
        let mut left = h.payload_len();
        let have = (stream.len() - at) as u64;
        if input.has(left) {
            assert!(have >= left);
        }
        if h.kind == Kind::WriteReq && h.seq % 2 == 1 {
            // A refused write: its payload is drained.
            match input.skip(&mut r, left) {
                Ok(()) => at += left as usize,
                Err(_) => {
                    assert!(have < left);
                    return;
                }
            }
            continue;
        }
        while left > 0 {
            let n = left.min(dst.len() as u64) as usize;
            if input.read_into(&mut r, &mut dst[..n]).is_err() {
                assert!(((stream.len() - at) as u64) < left);
                return;
            }
            assert_eq!(&dst[..n], &stream[at..at + n]);
            at += n;
            left -= n as u64;
        }
    }
}

/// The payload of an engine notify frame: `u32 name length`, name,
/// message. The format is canonical.
pub fn engine_notify(data: &[u8]) {
    if let Some((name, msg)) = decode_notify(data) {
        assert_eq!(encode_notify(&name, &msg), data);
    }
}

/// Segment descriptors (`mooncake/ram/<name>`, a P2P handshake's answer)
/// and `mooncake/rpc_meta/<name>` records, decoded: [`Descriptors::check`]
/// runs the properties, apart from the decoding the heap is measured on.
pub struct Descriptors {
    desc: mooncake_common::Result<SegmentDesc>,
    meta: mooncake_common::Result<RpcMeta>,
}

impl Descriptors {
    pub fn decode(data: &[u8]) -> Descriptors {
        Descriptors {
            desc: SegmentDesc::from_json(data),
            meta: RpcMeta::from_json(data),
        }
    }

    /// What was decoded encodes to JSON that decodes to the same; lookups
    /// with the descriptor's own numbers (a peer chooses them) stay inside.
    pub fn check(self) {
        if let Ok(d) = self.desc {
            let back = SegmentDesc::from_json(&d.to_json()).expect("our JSON reads back");
            // `devices` is carried, not read; serde_json may read a float in
            // it one unit in the last place off (its parsing is not
            // correctly rounded), so those compare with that tolerance.
            assert!(same_json(&back.devices, &d.devices), "{back:?} != {d:?}");
            assert_eq!(
                SegmentDesc {
                    devices: vec![],
                    ..back
                },
                SegmentDesc {
                    devices: vec![],
                    ..d.clone()
                }
            );
            for b in &d.buffers {
                for (addr, len) in [
                    (b.addr, b.length),
                    (b.addr, b.length.wrapping_add(1)),
                    (b.addr.wrapping_add(b.length), 1),
                    (b.addr.wrapping_sub(1), 2),
                    (u64::MAX, 1),
                ] {
                    if let Some(found) = d.find_buffer(addr, len) {
                        assert!(found.contains(addr, len));
                        assert!(addr >= found.addr && addr - found.addr + len <= found.length);
                    }
                }
            }
            let _ = d.first_buffer_address();
        }
        if let Ok(m) = self.meta {
            assert_eq!(RpcMeta::from_json(&m.to_json()).expect("reads back"), m);
        }
    }
}

fn same_json(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_value(a, b))
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() && y.is_f64() => {
            let (Some(x), Some(y)) = (x.as_f64(), y.as_f64()) else {
                return false;
            };
            (x.to_bits() as i64 - y.to_bits() as i64).abs() <= 1
        }
        (Value::Array(x), Value::Array(y)) => same_json(x, y),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kx, vx), (ky, vy))| kx == ky && same_value(vx, vy))
        }
        _ => a == b,
    }
}

/// Replies of an HTTP metadata server, as the HTTP metadata client parses
/// them (status line, headers, a body by length, chunks or close; several
/// pipelined on one connection). The first byte sizes the client's socket
/// reads.
pub fn metadata_http_reply(data: &[u8]) {
    let Some((&knobs, stream)) = data.split_first() else {
        return;
    };
    let piece = usize::from(knobs) + 1;
    let mut r = BufReader::with_capacity(
        piece * 4,
        Pieces {
            data: stream,
            piece,
        },
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..8 {
        let Ok(reply) = read_reply(&mut r, deadline) else {
            return;
        };
        assert!(
            (200..600).contains(&reply.status),
            "interim replies are skipped"
        );
        assert!(reply.body.len() <= MAX_VALUE_LEN);
        assert!(reply.body.len() <= stream.len());
        if !reply.keep_alive {
            return;
        }
    }
}
