//! Decodes the operation log's entries (a WAL file's frames, a
//! replication message's payload), one frame and as a stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::{within_budget, BINARY_PER_BYTE};
use mooncake_store::master::durable::oplog::{decode, decode_prefix, OwnedEntry};

fuzz_target!(|data: &[u8]| {
    within_budget(data.len(), BINARY_PER_BYTE, || {
        if let Ok(entry) = decode(data) {
            check_round_trip(&entry);
        }
        let mut rest = data;
        while let Ok((entry, used)) = decode_prefix(rest) {
            check_round_trip(&entry);
            rest = &rest[used..];
        }
    });
});

/// A decoded entry encodes to a frame that decodes to the same entry.
/// (Its bytes may differ from the input's: a varint may be over-long.)
fn check_round_trip(entry: &OwnedEntry) {
    let frame = entry.to_frame();
    let back = decode(&frame).expect("a re-encoded entry decodes");
    assert_eq!(&back, entry);
}
