//! Log setup: the reference's `MC_LOG_LEVEL` names mapped onto a `tracing`
//! filter, for the programs (default `info`) and the libraries loaded into
//! someone else's process (default `warn`).

use tracing_subscriber::EnvFilter;

/// The `tracing` level for an `MC_LOG_LEVEL` value (`TRACE`, `DEBUG`,
/// `INFO`, `WARNING`, `ERROR`, any case); `default` for anything else.
pub fn level_name<'a>(mc_log_level: &str, default: &'a str) -> &'a str {
    match mc_log_level.to_ascii_uppercase().as_str() {
        "TRACE" => "trace",
        "DEBUG" => "debug",
        "INFO" => "info",
        "WARNING" | "WARN" => "warn",
        "ERROR" | "FATAL" | "CRITICAL" => "error",
        _ => default,
    }
}

/// Logs to stderr at `level` (an `MC_LOG_LEVEL` name, else `default`), or
/// as a full `RUST_LOG` filter says.
///
/// Uses `try_init`: a host process (or the Python extension module before a
/// console script) may already have installed a subscriber, and a second
/// `init()` would panic.
pub fn init_at(level: &str, default: &str) {
    let level = level_name(level, default);
    let filter = EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// [`init_at`] with the level from `MC_LOG_LEVEL`.
pub fn init(default: &str) {
    init_at(&std::env::var("MC_LOG_LEVEL").unwrap_or_default(), default);
}

/// [`init`] once per process: for libraries, which set up logs when their
/// first object is made rather than at load.
pub fn init_once(default: &'static str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| init(default));
}

#[cfg(test)]
mod tests {
    use super::level_name;

    #[test]
    fn reference_names_map_onto_tracing_levels() {
        assert_eq!(level_name("trace", "info"), "trace");
        assert_eq!(level_name("DEBUG", "info"), "debug");
        assert_eq!(level_name("Info", "warn"), "info");
        assert_eq!(level_name("WARNING", "info"), "warn");
        assert_eq!(level_name("critical", "info"), "error");
        assert_eq!(level_name("FATAL", "info"), "error");
        assert_eq!(level_name("", "warn"), "warn");
        assert_eq!(level_name("verbose", "info"), "info");
    }
}
