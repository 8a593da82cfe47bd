//! The reference's `p2p-store-example`: `--cmd=trainer` publishes a
//! simulated model file, `--cmd=inferencer` pulls it from its holders.

use clap::Parser;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = mooncake_p2p_store::example::Args::parse();
    if let Err(e) = mooncake_p2p_store::example::run(args) {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
