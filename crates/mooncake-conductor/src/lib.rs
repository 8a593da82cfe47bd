//! The Conductor KV indexer: subscribes to the KV events of inference
//! engines (vLLM, SGLang) and of the Mooncake master, keeps a prefix index
//! of which instance holds which block on which medium, and answers
//! cache-aware routers over HTTP (see `docs/conductor.md`).
//!
//! Layers, top-down (each imports only those above it): `event` and `hash`
//! (plain types and the hashing standard), `index` (the pure prefix index),
//! `decode`/`encode` (the publishers' wire formats), `config`, `metrics`,
//! `ingest` (ZMQ subscriptions), `service`, `http`; `run` and `main` are the
//! process's shell.

pub mod config;
pub mod decode;
pub mod encode;
pub mod event;
pub mod hash;
pub mod http;
pub mod index;
pub mod ingest;
pub mod metrics;
pub mod service;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

pub use config::{Config, Flags, Registration};
pub use service::Conductor;

/// Builds the service from `config`: its static subscriptions registered,
/// not yet serving.
pub fn build(config: &Config) -> anyhow::Result<Arc<Conductor>> {
    let c = Conductor::new(
        config.hash_seed,
        Duration::from_millis(config.replay_timeout_ms),
    );
    for (i, reg) in config.instances.iter().enumerate() {
        c.register(reg.clone())
            .with_context(|| format!("kvevent_instance[{i}]"))?;
    }
    Ok(c)
}

/// Serves the HTTP API on `listener` until `shutdown` resolves.
pub async fn serve(
    c: Arc<Conductor>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    axum::serve(listener, http::router(c.clone()))
        .with_graceful_shutdown(shutdown)
        .await
        .context("HTTP server")?;
    c.shutdown();
    Ok(())
}

/// Runs the service until SIGINT or SIGTERM.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let c = build(&config)?;
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr()?;
    tracing::info!("mooncake_conductor listening on {local}");
    println!("mooncake_conductor listening on {local}");
    serve(c, listener, stop_signal()).await
}

async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("mooncake_conductor: log level {filter:?} is not a filter ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    // A host process (the Python package) may have set one up already.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The program: argv in (argv[0] = its name), exit code out.
pub fn main(argv: Vec<String>) -> i32 {
    let flags = match Flags::try_parse_from(&argv) {
        Ok(f) => f,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let level = flags
        .log_level
        .clone()
        .or_else(|| std::env::var("CONDUCTOR_LOG_LEVEL").ok())
        .unwrap_or_else(|| "info".into());
    init_logging(&level);
    let env_path = std::env::var("CONDUCTOR_CONFIG_PATH").ok();
    let home = std::env::var("HOME").ok();
    let config = match Config::load(&flags, env_path.as_deref(), home.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mooncake_conductor: {e:#}");
            return 1;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mooncake_conductor: {e}");
            return 1;
        }
    };
    match rt.block_on(run(config)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("mooncake_conductor: {e:#}");
            1
        }
    }
}
