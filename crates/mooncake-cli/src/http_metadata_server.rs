//! `mooncake_http_metadata_server`: the HTTP metadata server
//! ([`mooncake_transfer::metadata::http_server`]) as a process.
//!
//! Prints `listening on HOST:PORT` once bound (with `--port=0`, the port
//! picked), serves until SIGINT/SIGTERM, then stops cleanly (exit 0).

use std::io::Write;
use std::time::Duration;

use clap::Parser;
use mooncake_common::auth::ClusterToken;
use mooncake_common::gflags;
use mooncake_transfer::metadata::http_server::{
    self as guard_defaults, MetadataServer, ServerPolicy,
};

use crate::signals::shutdown_signal;

#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(
    name = "mooncake_http_metadata_server",
    about = "Metadata KV over HTTP: GET|PUT|DELETE /metadata?key=KEY"
)]
pub struct Args {
    /// Port to listen on; 0 picks a free one.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Address to bind.
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,
    /// DEBUG, INFO, WARNING, ERROR or CRITICAL (the reference's
    /// `--log-level`); `MC_LOG_LEVEL` when not given.
    #[arg(long = "log_level")]
    pub log_level: Option<String>,
    /// File holding the cluster token that PUT and DELETE must carry
    /// (`Authorization: Bearer`); default `$MOONCAKE_CLUSTER_TOKEN`.
    #[arg(long = "cluster_token_file", default_value = "")]
    pub cluster_token_file: String,
    /// Largest value stored.
    #[arg(long = "max_value_size", default_value = "16MB", value_parser = size_arg)]
    pub max_value_size: u64,
    /// Most keys held.
    #[arg(long = "max_keys", default_value_t = guard_defaults::DEFAULT_MAX_KEYS)]
    pub max_keys: usize,
}

fn size_arg(s: &str) -> Result<u64, String> {
    mooncake_common::size::parse_size(s).map_err(|e| e.to_string())
}

/// Entry point (see [`crate::entry`]): argv in, exit code out.
pub fn main(argv: Vec<String>) -> i32 {
    let args = match Args::try_parse_from(gflags::normalize(argv, &[])) {
        Ok(args) => args,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    match &args.log_level {
        Some(level) => crate::logging::init_at(level),
        None => crate::logging::init(),
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mooncake_http_metadata_server: cannot start runtime: {e}");
            return 1;
        }
    };
    let served = rt.block_on(async {
        // Poll the signal future once so its handlers are installed before
        // "listening" is announced: a stop sent right after it is not lost.
        let mut stop = Box::pin(shutdown_signal());
        let _ = tokio::time::timeout(Duration::ZERO, &mut stop).await;
        let policy = ServerPolicy {
            max_value_size: usize::try_from(args.max_value_size).unwrap_or(usize::MAX),
            max_keys: args.max_keys,
            cluster_token: ClusterToken::resolve(&args.cluster_token_file)?,
        };
        let server = MetadataServer::bind_with(&args.host, args.port, policy).await?;
        println!(
            "mooncake_http_metadata_server listening on {}",
            server.local_addr()
        );
        let _ = std::io::stdout().flush();
        stop.await;
        server.shutdown().await
    });
    match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("mooncake_http_metadata_server: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(gflags::normalize(args.iter().copied(), &[]))
    }

    #[test]
    fn flags_in_gflags_spellings() {
        let default = Args {
            port: 8080,
            host: "0.0.0.0".into(),
            log_level: None,
            cluster_token_file: String::new(),
            max_value_size: 16 << 20,
            max_keys: 1 << 20,
        };
        assert_eq!(parse(&["prog"]).unwrap(), default);
        let want = Args {
            port: 9000,
            host: "127.0.0.1".into(),
            log_level: None,
            ..default.clone()
        };
        assert_eq!(
            parse(&["prog", "--port=9000", "--host=127.0.0.1"]).unwrap(),
            want
        );
        assert_eq!(
            parse(&["prog", "-port=9000", "-host", "127.0.0.1"]).unwrap(),
            want
        );
        assert_eq!(
            parse(&["prog", "--port", "9000", "--host", "127.0.0.1"]).unwrap(),
            want
        );
        // The reference spells it --log-level.
        assert_eq!(
            parse(&["prog", "--log-level=DEBUG"])
                .unwrap()
                .log_level
                .as_deref(),
            Some("DEBUG")
        );
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        for bad in [
            &["prog", "--port=http"][..],
            &["prog", "--port=70000"],
            &["prog", "--nosuchflag=1"],
        ] {
            assert_eq!(
                main(bad.iter().map(|s| s.to_string()).collect()),
                2,
                "{bad:?}"
            );
        }
    }
}
