//! Decodes the real client's answers to a dummy client, as a payload and as a stream of frames.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::{check_round_trip, within_budget, BINARY_PER_BYTE};
use mooncake_store::proto::frame::{decode_payload, read_frame};
use mooncake_store::client::dummy_proto::DummyResponse;

fuzz_target!(|data: &[u8]| {
    within_budget(data.len(), BINARY_PER_BYTE, || {
        if let Ok(msg) = decode_payload::<DummyResponse>(data) {
            check_round_trip!(DummyResponse, data, &msg);
        }
        let mut stream = data;
        let mut payload = Vec::new();
        while read_frame(&mut stream, &mut payload).is_ok() {
            if let Ok(msg) = decode_payload::<DummyResponse>(&payload) {
                check_round_trip!(DummyResponse, &payload, &msg);
            }
        }
    });
});
