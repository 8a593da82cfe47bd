//! The transfer engine's wire frames: 32-byte headers, and a stream of
//! frames as the engine's listener reads it (headers, then payloads).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::{within_budget, Pieces};
use mooncake_transfer::fuzzing::{FrameReader, Header, Kind, HEADER_LEN, MAX_DATA_FRAME};

/// `MC_HANDSHAKE_MAX_LENGTH` values to check limits against.
const CONTROL_MAX: [u64; 4] = [0, 64, 4096, 1 << 20];

fuzz_target!(|data: &[u8]| {
    // The first byte picks how the stream is cut and the control limit.
    let Some((&knobs, stream)) = data.split_first() else {
        return;
    };
    let piece = usize::from(knobs & 0x3f) + 1;
    let control_max = CONTROL_MAX[usize::from(knobs >> 6)];
    within_budget(data.len(), 2, || {
        for chunk in stream.chunks_exact(HEADER_LEN) {
            check_header(chunk.try_into().unwrap(), control_max);
        }
        read_stream(stream, piece, control_max);
    });
});

fn limit(kind: Kind, control_max: u64) -> u64 {
    match kind {
        Kind::WriteReq | Kind::ReadReq | Kind::ReadResp => MAX_DATA_FRAME,
        Kind::DescReq | Kind::DescResp | Kind::NotifyReq => control_max,
        Kind::WriteAck | Kind::NotifyAck => 0,
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
    let mut input = FrameReader::default();
    let mut at = 0usize;
    let mut dst = [0u8; 1024];
    loop {
        let hdr = match input.read_header(&mut r) {
            Ok(Some(h)) => h,
            Ok(None) => {
                assert_eq!(at, stream.len(), "clean end only between frames");
                return;
            }
            Err(_) => {
                assert!(stream.len() - at < HEADER_LEN, "error with a whole header left");
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
