//! Writes `target/<profile>/mooncake.pc`, pointing at the built library
//! and this crate's `include/`, so that
//! `PKG_CONFIG_PATH=target/<profile> pkg-config --cflags --libs mooncake`
//! works in the tree. Its `libdir` is `target/<profile>/deps/`: cargo
//! builds the library there for `cargo build` (which also copies it up to
//! `target/<profile>/`) and for `cargo test` (which does not).
//! `mooncake.pc.in` is the installable template.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=mooncake.pc.in");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out.
    let Some(profile) = out.ancestors().nth(3) else {
        return;
    };
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let template =
        std::fs::read_to_string(manifest.join("mooncake.pc.in")).expect("mooncake.pc.in");
    let pc = template
        .replace("@LIBDIR@", &profile.join("deps").to_string_lossy())
        .replace("@INCLUDEDIR@", &manifest.join("include").to_string_lossy())
        .replace(
            "@VERSION@",
            &std::env::var("CARGO_PKG_VERSION").unwrap_or_default(),
        );
    if let Err(e) = std::fs::write(profile.join("mooncake.pc"), pc) {
        println!("cargo:warning=could not write mooncake.pc: {e}");
    }
}
