//! Decodes the master's RPC calls (every request type), as a payload and as a stream of frames.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::{check_round_trip, within_budget, BINARY_PER_BYTE};
use mooncake_store::proto::frame::{decode_payload, read_frame};
use mooncake_store::proto::Request;

fuzz_target!(|data: &[u8]| {
    within_budget(data.len(), BINARY_PER_BYTE, || {
        if let Ok(msg) = decode_payload::<Request<'_>>(data) {
            check_round_trip!(Request<'_>, data, &msg);
        }
        let mut stream = data;
        let mut payload = Vec::new();
        while read_frame(&mut stream, &mut payload).is_ok() {
            if let Ok(msg) = decode_payload::<Request<'_>>(&payload) {
                check_round_trip!(Request<'_>, &payload, &msg);
            }
        }
    });
});
