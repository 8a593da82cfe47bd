//! Fuzz seed corpora (`fuzz/corpus/<target>/`) checked against the seeds
//! the real encoders make now.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Seed file name to bytes.
pub type Seeds = BTreeMap<String, Vec<u8>>;

/// The corpus directory of a fuzz target.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// Compares `seeds` with the target's corpus directory, or rewrites it when
/// `MOONCAKE_FUZZ_CORPUS=write`. `package` is the crate whose `fuzz_corpus`
/// test makes these seeds (named in the failure's hint).
pub fn check_or_write(package: &str, target: &str, seeds: &Seeds) {
    let dir = corpus_dir(target);
    if std::env::var("MOONCAKE_FUZZ_CORPUS").as_deref() == Ok("write") {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        return;
    }
    let mut on_disk = Seeds::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        on_disk.insert(name, std::fs::read(&path).unwrap());
    }
    assert!(
        &on_disk == seeds,
        "fuzz/corpus/{target} is not what the encoders make now (files {:?}, expected {:?}); \
         rewrite it with MOONCAKE_FUZZ_CORPUS=write cargo test -p {package} --test fuzz_corpus",
        on_disk.keys().collect::<Vec<_>>(),
        seeds.keys().collect::<Vec<_>>(),
    );
}
