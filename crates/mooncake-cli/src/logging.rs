//! Log setup shared by every program.

/// Logs to stderr at `MC_LOG_LEVEL` (`TRACE`, `DEBUG`, `INFO`, `WARNING`,
/// `ERROR`; default `INFO`) or a full `RUST_LOG` filter.
///
/// Uses `try_init`: inside the Python console scripts the extension module
/// has already installed a subscriber, and a second `init()` would panic.
pub fn init() {
    init_at(&std::env::var("MC_LOG_LEVEL").unwrap_or_default());
}

/// [`init`] at `level` (same names) instead of `MC_LOG_LEVEL`, for programs
/// with a level flag of their own.
pub fn init_at(level: &str) {
    use tracing_subscriber::EnvFilter;
    let level = match level.to_ascii_uppercase().as_str() {
        "TRACE" => "trace",
        "DEBUG" => "debug",
        "WARNING" | "WARN" => "warn",
        "ERROR" | "FATAL" | "CRITICAL" => "error",
        _ => "info",
    };
    let filter = EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
