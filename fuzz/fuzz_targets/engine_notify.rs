//! The payload of an engine notify frame: `u32 name length`, name, message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::within_budget;
use mooncake_transfer::fuzzing::{decode_notify, encode_notify};

fuzz_target!(|data: &[u8]| {
    let decoded = within_budget(data.len(), 2, || decode_notify(data));
    if let Some((name, msg)) = decoded {
        // The format is canonical.
        assert_eq!(encode_notify(&name, &msg), data);
    }
});
