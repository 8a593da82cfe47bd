//! Replies of an HTTP metadata server, as the HTTP metadata client parses
//! them (status line, headers, a body by length, chunks or close; several
//! pipelined on one connection).
#![no_main]

use std::io::BufReader;

use libfuzzer_sys::fuzz_target;
use mooncake_fuzz::{within_budget, Pieces};
use mooncake_transfer::fuzzing::read_http_reply;
use mooncake_transfer::metadata::MAX_VALUE_LEN;

fuzz_target!(|data: &[u8]| {
    // The first byte sizes the client's read buffer (its socket reads).
    let Some((&knobs, stream)) = data.split_first() else {
        return;
    };
    let piece = usize::from(knobs) + 1;
    within_budget(data.len(), 4, || {
        let mut r = BufReader::with_capacity(
            piece * 4,
            Pieces {
                data: stream,
                piece,
            },
        );
        for _ in 0..8 {
            let Ok(reply) = read_http_reply(&mut r) else {
                return;
            };
            assert!((200..600).contains(&reply.status), "interim replies are skipped");
            assert!(reply.body.len() <= MAX_VALUE_LEN);
            assert!(reply.body.len() <= stream.len());
            if !reply.keep_alive {
                return;
            }
        }
    });
});
