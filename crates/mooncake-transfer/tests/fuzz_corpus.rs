//! The fuzz targets' seed corpus (`fuzz/corpus/<target>/`) for this
//! crate's decoders, made by the real encoders: this test fails when the
//! checked-in files differ from what the encoders produce now, or when a
//! target's properties fail on a seed.
//! `MOONCAKE_FUZZ_CORPUS=write cargo test -p mooncake-transfer --test fuzz_corpus`
//! rewrites them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mooncake_transfer::fuzzing::{self, seeds};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// Compares `seeds` with the target's corpus directory, or rewrites it.
fn check_or_write(target: &str, seeds: &BTreeMap<String, Vec<u8>>) {
    let dir = corpus_dir(target);
    if std::env::var("MOONCAKE_FUZZ_CORPUS").as_deref() == Ok("write") {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        return;
    }
    let mut on_disk = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        on_disk.insert(name, std::fs::read(&path).unwrap());
    }
    assert!(
        &on_disk == seeds,
        "fuzz/corpus/{target} is not what the encoders make now (files {:?}, expected {:?}); \
         rewrite it with MOONCAKE_FUZZ_CORPUS=write cargo test -p mooncake-transfer --test fuzz_corpus",
        on_disk.keys().collect::<Vec<_>>(),
        seeds.keys().collect::<Vec<_>>(),
    );
}

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
        check_or_write(target, seeds);
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
