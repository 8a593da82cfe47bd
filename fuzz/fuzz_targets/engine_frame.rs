//! The transfer engine's wire frames: 32-byte headers, and a stream of
//! frames as the engine's listener reads it (headers, then payloads).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::within_budget;
use mooncake_transfer::fuzzing::engine_frames;

fuzz_target!(|data: &[u8]| {
    within_budget(data.len(), 2, || engine_frames(data));
});
