//! Segment descriptors (`mooncake/ram/<name>`, and a P2P handshake's
//! answer) and `mooncake/rpc_meta/<name>` records, as read from a metadata
//! store or a peer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::within_budget;
use mooncake_transfer::fuzzing::Descriptors;

fuzz_target!(|data: &[u8]| {
    // serde_json's values (the `devices` list) take up to ~100 bytes of
    // heap per byte of JSON: a one-entry object is a B-tree node.
    within_budget(data.len(), 256, || Descriptors::decode(data)).check();
});
