//! Name → entry point table shared by the binaries and the Python package
//! (`mooncake._mooncake._run_cli`), so both run exactly the same code.

/// A binary's library entry point: full argv (argv[0] = program name) in,
/// process exit code out.
pub type Entry = fn(Vec<String>) -> i32;

/// Every program the Python wheel puts on PATH, in the reference's names.
pub const PROGRAMS: &[&str] = &[
    "mooncake_master",
    "mooncake_client",
    "mooncake_http_metadata_server",
    "transfer_engine_bench",
    "mooncake",
    "mooncake_conductor",
];

/// The entry point of `name`, if it is built into this crate.
pub fn lookup(name: &str) -> Option<Entry> {
    #[allow(clippy::match_single_binding)]
    match name {
        "mooncake_master" => Some(crate::master::main),
        "mooncake_client" => Some(crate::client::main),
        "mooncake" => Some(crate::umbrella::main),
        "mooncake_http_metadata_server" => Some(crate::http_metadata_server::main),
        "transfer_engine_bench" => Some(crate::te_bench::main),
        "mooncake_conductor" => Some(mooncake_conductor::main),
        _ => None,
    }
}

/// Runs program `name` with `argv`; 127 (the shell's "command not found")
/// when no such program is built in.
pub fn run(name: &str, argv: Vec<String>) -> i32 {
    match lookup(name) {
        Some(entry) => entry(argv),
        None => {
            eprintln!(
                "{name}: not a program of this build (known: {})",
                PROGRAMS.join(", ")
            );
            127
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_program_is_127() {
        assert_eq!(run("no_such_program", vec!["no_such_program".into()]), 127);
    }
}
