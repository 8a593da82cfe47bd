//! The programs the system tests run, found where cargo built them.
//!
//! A test target can name only its own package's binaries
//! (`CARGO_BIN_EXE_*`), and these are mooncake-cli's (and an example of
//! mooncake-store's): they sit in the profile directory above the test
//! executable (`target/<profile>/deps/<test>`). `cargo test --workspace`
//! builds them before it runs a test (cargo builds a package's binaries for
//! its integration tests: mooncake-cli's `tests/programs.rs`). A run of this
//! crate alone does not: it runs the programs as last built, and a missing
//! one stops the test with the command that builds it.
//!
//! [`nemesis`] is the fault-injection harness the nemesis tests and
//! `scripts/nemesis.sh` run (docs/ha.md, "Nemesis").

use std::path::{Path, PathBuf};

pub mod nemesis;

/// Path of mooncake-cli's program `name` (`mooncake_master`, ...).
pub fn program(name: &str) -> String {
    locate(&profile_dir().join(name), "-p mooncake-cli --bins")
}

/// Path of mooncake-store's example `name`.
pub fn store_example(name: &str) -> String {
    let path = profile_dir().join("examples").join(name);
    locate(&path, &format!("-p mooncake-store --example {name}"))
}

/// `target/<profile>`: the parent of the test executable's `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("own executable");
    let deps = exe.parent().expect("executable in a directory");
    deps.parent().unwrap_or(deps).to_path_buf()
}

fn locate(path: &Path, build: &str) -> String {
    assert!(
        path.is_file(),
        "{} is missing; build it first: cargo build {build} (cargo test --workspace does)",
        path.display()
    );
    path.to_string_lossy().into_owned()
}
