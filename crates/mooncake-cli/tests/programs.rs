//! Every program of the crate is built and answers `--help`.
//!
//! Also what makes `cargo test` build the programs as executables (cargo
//! builds a package's binaries for its integration tests only): the system
//! tests (crates/system-tests) run them from `target/<profile>/`.

use std::process::Command;

const PROGRAMS: [(&str, &str); 5] = [
    ("mooncake_master", env!("CARGO_BIN_EXE_mooncake_master")),
    ("mooncake_client", env!("CARGO_BIN_EXE_mooncake_client")),
    (
        "mooncake_http_metadata_server",
        env!("CARGO_BIN_EXE_mooncake_http_metadata_server"),
    ),
    (
        "transfer_engine_bench",
        env!("CARGO_BIN_EXE_transfer_engine_bench"),
    ),
    ("mooncake", env!("CARGO_BIN_EXE_mooncake")),
];

/// Programs whose binary another crate builds (the wheel still starts
/// them through this crate's entry table).
const ELSEWHERE: [&str; 1] = ["mooncake_conductor"];

#[test]
fn every_program_answers_help() {
    let names: Vec<&str> = PROGRAMS.iter().map(|(name, _)| *name).collect();
    let here: Vec<&str> = mooncake_cli::entry::PROGRAMS
        .iter()
        .copied()
        .filter(|p| !ELSEWHERE.contains(p))
        .collect();
    assert_eq!(names, here, "one binary per program");
    for name in ELSEWHERE {
        assert!(mooncake_cli::entry::PROGRAMS.contains(&name), "{name}");
        assert!(
            mooncake_cli::entry::lookup(name).is_some(),
            "{name} has an entry"
        );
    }
    for (name, path) in PROGRAMS {
        let out = Command::new(path).arg("--help").output().unwrap();
        assert!(out.status.success(), "{name} --help: {:?}", out.status);
        assert!(!out.stdout.is_empty(), "{name} --help printed nothing");
    }
}
