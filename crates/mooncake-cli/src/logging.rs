//! Log setup shared by every program.

/// Logs to stderr at `MC_LOG_LEVEL` (`TRACE`, `DEBUG`, `INFO`, `WARNING`,
/// `ERROR`; default `INFO`) or a full `RUST_LOG` filter; never over a
/// subscriber already installed (the Python console scripts' case).
pub fn init() {
    mooncake_common::logging::init("info");
}

/// [`init`] at `level` (same names) instead of `MC_LOG_LEVEL`, for programs
/// with a level flag of their own.
pub fn init_at(level: &str) {
    mooncake_common::logging::init_at(level, "info");
}
