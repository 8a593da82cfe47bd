//! Replies of an HTTP metadata server, as the HTTP metadata client parses
//! them (status line, headers, a body by length, chunks or close; several
//! pipelined on one connection).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::within_budget;
use mooncake_transfer::fuzzing::metadata_http_reply;

fuzz_target!(|data: &[u8]| {
    within_budget(data.len(), 4, || metadata_http_reply(data));
});
