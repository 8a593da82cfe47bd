//! `mooncake_master`: the metadata service as a process.
//!
//! Accepts the reference's flags in gflags spellings (`--rpc_port=50051`,
//! `-rpc_port 50051`, `--enable_http_metadata_server`, `--noenable_ha`) and
//! `--config_path` (YAML or JSON with the same keys; flags win). Prints
//! `mooncake_master listening on rpc=ADDR http=ADDR [metadata=ADDR]` once
//! bound, serves until SIGINT/SIGTERM, then stops cleanly (exit 0).

use std::io::Write;

use clap::{Arg, ArgAction, Command};
use mooncake_common::gflags;
use mooncake_store::master::{bool_flag_names, FlagKind, Support, FLAGS};
use mooncake_store::master::{run, MasterConfig};

use crate::signals::shutdown_signal;

fn command() -> Command {
    let mut cmd = Command::new("mooncake_master")
        .about("Mooncake Store master: metadata and space allocation (object bytes never pass through it)")
        .disable_version_flag(true);
    for f in FLAGS {
        let kind = match f.kind {
            FlagKind::Bool => "BOOL",
            FlagKind::Int => "INT",
            FlagKind::Float => "FLOAT",
            FlagKind::Str => "STRING",
            FlagKind::Duration => "DURATION",
            FlagKind::Size => "SIZE",
        };
        let note = match f.support {
            Support::Full => "",
            Support::NotImplemented => " [accepted, not supported yet]",
            Support::Ignored => " [accepted, no effect]",
        };
        cmd = cmd.arg(
            Arg::new(f.name)
                .long(f.name)
                .value_name(kind)
                .num_args(1)
                .allow_hyphen_values(true)
                .action(ArgAction::Set)
                .help(format!("{}{note} (default: {:?})", f.help, f.default)),
        );
    }
    cmd
}

/// Why a command line was not accepted.
#[derive(Debug)]
pub enum CliError {
    /// From clap, including `--help` (printed to stdout, exit 0).
    Clap(clap::Error),
    /// A value clap accepted but the config rejects.
    Config(String),
}

/// Parses a command line into a config (flags over `--config_path` over defaults).
pub fn parse(argv: Vec<String>) -> Result<MasterConfig, CliError> {
    let argv = gflags::normalize(argv, &bool_flag_names());
    let matches = command()
        .try_get_matches_from(argv)
        .map_err(CliError::Clap)?;
    let settings: Vec<(&str, &str)> = FLAGS
        .iter()
        .filter_map(|f| {
            matches
                .get_one::<String>(f.name)
                .map(|v| (f.name, v.as_str()))
        })
        .collect();
    MasterConfig::from_settings(settings.iter().copied())
        .map_err(|e| CliError::Config(e.to_string()))
}

/// Logs at `--log_level`, unless `MC_LOG_LEVEL` or `RUST_LOG` say otherwise.
fn init_tracing(level: &str) {
    if std::env::var_os("MC_LOG_LEVEL").is_some() || std::env::var_os("RUST_LOG").is_some() {
        return crate::logging::init();
    }
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The master's metadata grows in large tables (object-map shards double
/// as they fill). With glibc's dynamic mmap threshold, the first freed table
/// raises the threshold and later tables come from the heap, where the freed
/// ones stay resident: 230-282 bytes per object at 1M objects over three
/// runs, against 205 in each of three with the threshold fixed at 128 KiB
/// (`benchmarks/master_memory.py`).
fn tune_malloc() {
    mooncake_common::malloc::tune(mooncake_common::malloc::Thresholds {
        mmap: Some(128 << 10),
        trim: None,
    });
}

/// gflags' `--version` (also `-version`, `--version=true`): print the
/// version and build type and exit 0, before any other flag is looked at.
fn wants_version(argv: &[String]) -> bool {
    argv.iter().skip(1).fold(false, |on, a| {
        let flag = a.strip_prefix("--").or_else(|| a.strip_prefix('-'));
        match flag {
            Some("version") => true,
            Some("noversion") => false,
            Some(f) => match f.strip_prefix("version=") {
                Some(v) => gflags::parse_bool(v).unwrap_or(on),
                None => on,
            },
            None => on,
        }
    })
}

fn version_text() -> String {
    let build = if cfg!(debug_assertions) {
        "Debug build"
    } else {
        "Release build"
    };
    format!(
        "mooncake_master version {} (mooncake-rs)\n{build}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Entry point (see [`crate::entry`]): argv in, exit code out.
pub fn main(argv: Vec<String>) -> i32 {
    if wants_version(&argv) {
        println!("{}", version_text());
        return 0;
    }
    tune_malloc();
    mooncake_common::fd_limit::raise_to_hard();
    let config = match parse(argv) {
        Ok(c) => c,
        Err(CliError::Clap(e)) => {
            let _ = e.print();
            return e.exit_code();
        }
        Err(CliError::Config(msg)) => {
            eprintln!("mooncake_master: {msg}");
            return 2;
        }
    };
    init_tracing(&config.log_level);
    let served = run(config, shutdown_signal(), |server| {
        let meta = server
            .metadata_addr()
            .map(|a| format!(" metadata={a}"))
            .unwrap_or_default();
        println!(
            "mooncake_master listening on rpc={} http={}{meta}",
            server.rpc_addr(),
            server.http_addr()
        );
        let _ = std::io::stdout().flush();
    });
    match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("mooncake_master: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse_args(args: &[&str]) -> Result<MasterConfig, CliError> {
        parse(
            std::iter::once("mooncake_master")
                .chain(args.iter().copied())
                .map(String::from)
                .collect(),
        )
    }

    #[test]
    fn version_flag() {
        let argv = |args: &[&str]| -> Vec<String> {
            std::iter::once("mooncake_master")
                .chain(args.iter().copied())
                .map(String::from)
                .collect()
        };
        for on in [
            &["--version"][..],
            &["-version"],
            &["--version=true"],
            &["--rpc_port=1", "--version=1"],
        ] {
            assert!(wants_version(&argv(on)), "{on:?}");
        }
        for off in [
            &[][..],
            &["--version=false"],
            &["--version", "--noversion"],
            &["--rpc_port=1"],
        ] {
            assert!(!wants_version(&argv(off)), "{off:?}");
        }
        assert!(version_text().starts_with("mooncake_master version "));
    }

    #[test]
    fn gflags_spellings() {
        let c = parse_args(&[
            "-rpc_port=6000",
            "--enable_http_metadata_server",
            "--noallow_evict_soft_pinned_objects",
            "--default_kv_lease_ttl=5s",
            "--client_ttl",
            "3",
            "--eviction_ratio=0.1",
            "--enable_cxl",
            "--logtostderr",
            "--v=2",
        ])
        .unwrap();
        assert_eq!(c.rpc_listen_port(), 6000);
        assert!(c.enable_http_metadata_server);
        assert!(!c.allow_evict_soft_pinned_objects);
        assert_eq!(c.default_kv_lease_ttl, Duration::from_secs(5));
        assert_eq!(c.client_ttl, Duration::from_secs(3));
        assert_eq!(c.eviction_ratio, 0.1);
        assert_eq!(
            c.unsupported,
            [("enable_cxl".to_string(), "true".to_string())]
        );
    }

    #[test]
    fn every_surface_flag_is_accepted() {
        let flags = [
            "--rpc_port=50051",
            "--rpc_address=0.0.0.0",
            "--rpc_thread_num=4",
            "--enable_http_metadata_server=false",
            "--http_metadata_server_host=0.0.0.0",
            "--http_metadata_server_port=8080",
            "--metrics_port=9003",
            "--enable_metric_reporting=true",
            "--default_kv_lease_ttl=5000",
            "--default_kv_soft_pin_ttl=1800000",
            "--allow_evict_soft_pinned_objects=true",
            "--eviction_ratio=0.05",
            "--eviction_high_watermark_ratio=0.95",
            "--client_ttl=10",
            "--cluster_id=mooncake_cluster",
            "--allocation_strategy=free_ratio_first",
            "--enable_ha=false",
            "--etcd_endpoints=",
            "--ha_backend_type=etcd",
            "--enable_snapshot=false",
            "--snapshot_interval_seconds=600",
            "--snapshot_retention_count=2",
            "--snapshot_backend_type=local",
            "--enable_snapshot_restore=false",
            "--enable_offload=false",
            "--root_fs_dir=",
            "--global_file_segment_size=1048576",
            "--config_path=",
            "--max_total_finished_tasks=10",
            "--max_total_pending_tasks=10",
            "--max_total_processing_tasks=10",
            "--max_retry_attempts=3",
        ];
        let c = parse_args(&flags).unwrap();
        assert_eq!(c.rpc_thread_num, 4);
        assert_eq!(c.eviction_high_watermark_ratio, 0.95);
    }

    #[test]
    fn bad_flags_are_errors() {
        assert!(parse_args(&["--no_such_flag=1"]).is_err());
        assert!(parse_args(&["--rpc_port=notaport"]).is_err());
        assert!(parse_args(&["--allocation_strategy=fastest"]).is_err());
        assert!(parse_args(&[
            "--eviction_ratio=0.99",
            "--eviction_high_watermark_ratio=0.5"
        ])
        .is_err());
    }

    #[test]
    fn help_lists_flags() {
        let help = command().render_long_help().to_string();
        assert!(help.contains("--default_kv_lease_ttl"));
        assert!(help.contains("not supported yet"));
    }
}
