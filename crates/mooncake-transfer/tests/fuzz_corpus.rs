//! The fuzz targets' seed corpus (`fuzz/corpus/<target>/`) for this
//! crate's decoders, made by the real encoders: this test fails when the
//! checked-in files differ from what the encoders produce now, or when a
//! target's properties fail on a seed.
//! `MOONCAKE_FUZZ_CORPUS=write cargo test -p mooncake-transfer --test fuzz_corpus`
//! rewrites them.

use mooncake_transfer::fuzzing::{self, seeds};
use test_support::corpus::check_or_write;

#[test]
fn corpus_is_what_the_encoders_make() {
    let all = seeds();
    assert_eq!(
        all.keys().copied().collect::<Vec<_>>(),
        [
            "engine_frame",
            "engine_notify",
            "metadata_http_reply",
            "segment_desc"
        ]
    );
    for (target, seeds) in &all {
        check_or_write("mooncake-transfer", target, seeds);
    }
}

/// The targets' properties hold on every seed (what a fuzz run starts from).
#[test]
fn targets_pass_on_their_seeds() {
    for (target, seeds) in seeds() {
        for data in seeds.values() {
            match target {
                "engine_frame" => fuzzing::engine_frames(data),
                "engine_notify" => fuzzing::engine_notify(data),
                "segment_desc" => fuzzing::Descriptors::decode(data).check(),
                "metadata_http_reply" => fuzzing::metadata_http_reply(data),
                other => panic!("no entry point for {other}"),
            }
        }
    }
}
