//! The payload of an engine notify frame: `u32 name length`, name, message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::within_budget;
use mooncake_transfer::fuzzing::engine_notify;

fuzz_target!(|data: &[u8]| {
    // Decoding and re-encoding: two copies of the input.
    within_budget(data.len(), 3, || engine_notify(data));
});
