//! `mooncake`: the umbrella command. `mooncake up` starts a whole
//! single-node cluster in one process — the master with its embedded HTTP
//! metadata server, and a storage segment that also serves dummy clients —
//! prints the addresses clients should use and runs until Ctrl-C.

use clap::{Parser, Subcommand};
use mooncake_common::size::{format_size, parse_size};
use mooncake_store::client::{ClientConfig, ServiceConfig, ServiceLimits, StoreService};
use mooncake_store::master::MasterConfig;
use mooncake_store::master::MasterHandle;

use crate::client::parse;

#[derive(Parser, Debug)]
#[command(name = "mooncake", about = "Mooncake: KV-cache pool for LLM serving")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Start a single-node cluster (master, metadata server, storage) and wait for Ctrl-C.
    Up(UpArgs),
}

#[derive(Parser, Debug, Clone)]
#[command(rename_all = "snake_case")]
pub struct UpArgs {
    /// Address every service binds and advertises.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Master RPC port (0 = any free port).
    #[arg(long, default_value_t = 50051)]
    pub rpc_port: u16,
    /// Embedded HTTP metadata server port.
    #[arg(long, default_value_t = 8080)]
    pub http_metadata_server_port: u16,
    /// Master metrics and admin HTTP port.
    #[arg(long, default_value_t = 9003)]
    pub metrics_port: u16,
    /// Port dummy clients (`setup_dummy`) connect to.
    #[arg(long, default_value_t = 50052)]
    pub port: u16,
    /// Memory this node contributes to the pool.
    #[arg(long, default_value = "1 GB", value_parser = size_arg)]
    pub global_segment_size: u64,
    #[arg(long, default_value = "tcp")]
    pub protocol: String,
    #[arg(long, default_value = "")]
    pub device_names: String,
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// A running single-node cluster.
pub struct Up {
    pub master: MasterHandle,
    pub storage: StoreService,
    pub metadata_server: String,
}

impl Up {
    /// Starts the master (with metadata server) and the storage node.
    pub fn start(args: &UpArgs) -> mooncake_common::Result<Up> {
        let mut config = MasterConfig::default();
        for (k, v) in [
            // The master reads 0 in `rpc_port` as "use `port`"; set both.
            ("port", args.rpc_port.to_string()),
            ("rpc_port", args.rpc_port.to_string()),
            ("rpc_address", args.host.clone()),
            ("enable_http_metadata_server", "true".into()),
            ("http_metadata_server_host", args.host.clone()),
            (
                "http_metadata_server_port",
                args.http_metadata_server_port.to_string(),
            ),
            ("metrics_host", args.host.clone()),
            ("metrics_port", args.metrics_port.to_string()),
        ] {
            config.set(k, &v)?;
        }
        let master = MasterHandle::spawn(config)?;
        let meta = master
            .metadata_addr()
            .expect("metadata server enabled above");
        let metadata_server = format!("http://{meta}/metadata");
        let storage = StoreService::start(&ServiceConfig {
            client: ClientConfig {
                local_hostname: args.host.clone(),
                metadata_server: metadata_server.clone(),
                global_segment_size: args.global_segment_size,
                local_buffer_size: 0,
                protocol: args.protocol.clone(),
                device_name: args.device_names.clone(),
                master_server_address: master.rpc_addr().to_string(),
                ..ClientConfig::default()
            },
            host: args.host.clone(),
            port: args.port,
            limits: ServiceLimits::default(),
            allowed_uids: Vec::new(),
        })?;
        Ok(Up {
            master,
            storage,
            metadata_server,
        })
    }

    /// What a client needs, as printed by `mooncake up`.
    pub fn banner(&self, segment_size: u64) -> String {
        format!(
            "mooncake up: cluster ready\n  master_server_address = {}\n  metadata_server       = {}\n  \
             dummy clients connect to {} (setup_dummy)\n  segment {} ({})\n  metrics http://{}/metrics\n\
             Press Ctrl-C to stop.",
            self.master.rpc_addr(),
            self.metadata_server,
            self.storage.local_addr(),
            self.storage.hostname(),
            format_size(segment_size),
            self.master.http_addr(),
        )
    }

    pub fn stop(self) {
        self.storage.stop();
        let _ = self.master.stop();
    }
}

pub fn main(argv: Vec<String>) -> i32 {
    let cli: Cli = match parse(argv, &[]) {
        Ok(c) => c,
        Err(code) => return code,
    };
    crate::logging::init();
    mooncake_common::fd_limit::raise_to_hard();
    match cli.command {
        Cmd::Up(args) => up(args),
    }
}

fn up(args: UpArgs) -> i32 {
    let up = match Up::start(&args) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("mooncake up: {e}");
            return 1;
        }
    };
    println!("{}", up.banner(args.global_segment_size));
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mooncake up: {e}");
            return 1;
        }
    };
    rt.block_on(crate::signals::shutdown_signal());
    up.stop();
    println!("mooncake up: stopped");
    0
}
