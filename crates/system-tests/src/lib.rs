//! The programs the system tests run, found where cargo built them.
//!
//! A test target can name only its own package's binaries
//! (`CARGO_BIN_EXE_*`), and these are mooncake-cli's (and an example of
//! mooncake-store's): they sit in the profile directory above the test
//! executable (`target/<profile>/deps/<test>`). `cargo test --workspace`
//! builds every binary and example before it runs a test; a run of this
//! crate alone does not, so a missing program, or one older than the
//! library it is built from (a build of the tests alone rebuilt the library
//! but not the program), stops the test with the command that builds it.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Path of mooncake-cli's program `name` (`mooncake_master`, ...).
pub fn program(name: &str) -> String {
    let dir = profile_dir();
    locate(
        &dir,
        &dir.join(name),
        "mooncake_cli",
        "-p mooncake-cli --bins",
    )
}

/// Path of mooncake-store's example `name`.
pub fn store_example(name: &str) -> String {
    let dir = profile_dir();
    let build = format!("-p mooncake-store --example {name}");
    locate(
        &dir,
        &dir.join("examples").join(name),
        "mooncake_store",
        &build,
    )
}

/// `target/<profile>`: the parent of the test executable's `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("own executable");
    let deps = exe.parent().expect("executable in a directory");
    deps.parent().unwrap_or(deps).to_path_buf()
}

fn locate(dir: &Path, path: &Path, lib: &str, build: &str) -> String {
    let fix = format!("build it first: cargo build {build} (cargo test --workspace does)");
    let Some(built) = modified(path) else {
        panic!("{} is missing; {fix}", path.display());
    };
    if let Some(lib_built) = newest_lib(&dir.join("deps"), lib) {
        assert!(
            built >= lib_built,
            "{} is older than the {lib} library it is built from; {fix}",
            path.display()
        );
    }
    path.to_string_lossy().into_owned()
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).ok()?.modified().ok()
}

/// When the newest `lib<name>-*.rlib` in `deps` was written.
fn newest_lib(deps: &Path, name: &str) -> Option<SystemTime> {
    let prefix = format!("lib{name}-");
    std::fs::read_dir(deps)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with(&prefix) && n.ends_with(".rlib")
        })
        .filter_map(|e| modified(&e.path()))
        .max()
}
