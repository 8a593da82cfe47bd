//! `mooncake_client`: the standalone "real client". It mounts a storage
//! segment on the master and serves dummy clients on this host over a local
//! RPC port and the abstract Unix socket `@mooncake_client_<port>.sock`,
//! sharing memory with them.

use clap::{ArgAction, Parser};
use mooncake_common::auth::ClusterToken;
use mooncake_common::gflags::{normalize, parse_bool};
use mooncake_common::size::{format_size, parse_size};
use mooncake_store::client::http::{ClientHttpServer, DEFAULT_CLIENT_HTTP_PORT};
use mooncake_store::client::{ClientConfig, ServiceConfig, ServiceLimits, StoreService};

#[derive(Parser, Debug)]
#[command(name = "mooncake_client", rename_all = "snake_case")]
#[command(about = "Mooncake Store real client: owns a segment, serves dummy clients")]
pub struct Args {
    /// Master address, `host:port`, or an HA address (`etcd://…`, `redis://…`,
    /// `k8s://<namespace>/<lease>`).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub master_server_address: String,
    /// Address dummy clients connect to; also this node's engine host unless
    /// `--local_hostname` is given (an unspecified address uses the machine's
    /// name). Dummies share this host, so the service listens on loopback
    /// unless an address is given (the reference binds 0.0.0.0). It also
    /// listens on the abstract Unix socket `@mooncake_client_<port>.sock`,
    /// which dummies on this host use.
    #[arg(long)]
    pub host: Option<String>,
    #[arg(long, default_value_t = 50052)]
    pub port: u16,
    #[arg(long, default_value = "tcp")]
    pub protocol: String,
    /// RDMA NICs; ignored for tcp.
    #[arg(long, default_value = "")]
    pub device_names: String,
    #[arg(long, default_value = "4 GB", value_parser = size_arg)]
    pub global_segment_size: u64,
    /// Staging pool of the real client itself (dummies bring their own).
    #[arg(long, default_value = "0", value_parser = size_arg)]
    pub local_buffer_size: u64,
    #[arg(long, default_value = "http://127.0.0.1:8080/metadata")]
    pub metadata_server: String,
    /// Engine name `host[:port]` (default: from `--host`).
    #[arg(long, default_value = "")]
    pub local_hostname: String,
    /// Run an SSD tier next to the segment, configured by the
    /// `MOONCAKE_OFFLOAD_*` variables (the master needs `--enable_offload`).
    #[arg(long, default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub enable_offload: bool,
    /// Accepted for compatibility; each dummy connection gets its own thread.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Serve `/metrics` and `/health` over HTTP on `--http_port`.
    #[arg(long, default_value = "false", value_parser = parse_bool, action = ArgAction::Set)]
    pub enable_http_server: bool,
    /// Port of the HTTP server (only with `--enable_http_server`).
    #[arg(long, default_value_t = DEFAULT_CLIENT_HTTP_PORT)]
    pub http_port: u16,
    /// File holding the cluster token (default: `$MOONCAKE_CLUSTER_TOKEN`):
    /// presented to the master, the metadata server and engines, and
    /// required of dummy clients.
    #[arg(long, default_value = "")]
    pub cluster_token_file: String,
    /// Users (uids, comma-separated) whose processes may open dummy
    /// sessions besides this process's own user.
    #[arg(long, default_value = "", value_parser = uid_list)]
    pub allowed_uids: UidList,
    /// The tenant this client and its dummy clients act for on a master in
    /// multi-tenant mode (see docs/tenants.md).
    #[arg(long, default_value = "default")]
    pub tenant_id: String,
}

/// `--allowed_uids`: a comma-separated list of uids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UidList(pub Vec<u32>);

fn uid_list(s: &str) -> Result<UidList, String> {
    s.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| u.parse::<u32>().map_err(|e| format!("uid {u:?}: {e}")))
        .collect::<Result<_, _>>()
        .map(UidList)
}

/// Flags that may be given without a value.
const BOOL_FLAGS: &[&str] = &["enable_offload", "enable_http_server"];

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

impl Args {
    pub fn service_config(&self) -> ServiceConfig {
        let host = self.host.as_deref().unwrap_or("");
        let local_hostname = if !self.local_hostname.is_empty() {
            self.local_hostname.clone()
        } else if host == "0.0.0.0" || host == "::" || host.is_empty() {
            gethostname::gethostname().to_string_lossy().into_owned()
        } else {
            host.to_owned()
        };
        ServiceConfig {
            client: ClientConfig {
                local_hostname,
                metadata_server: self.metadata_server.clone(),
                global_segment_size: self.global_segment_size,
                local_buffer_size: self.local_buffer_size,
                protocol: self.protocol.clone(),
                device_name: self.device_names.clone(),
                master_server_address: self.master_server_address.clone(),
                enable_offload: self.enable_offload,
                tenant_id: mooncake_store::tenant::normalize(&self.tenant_id).to_owned(),
                ..ClientConfig::default()
            },
            host: match host {
                "" => "127.0.0.1".to_owned(),
                h => h.to_owned(),
            },
            port: self.port,
            limits: ServiceLimits::default(),
            allowed_uids: self.allowed_uids.0.clone(),
        }
    }
}

/// Parses gflags-style `argv` into [`Args`], printing help or errors.
pub(crate) fn parse<T: Parser>(argv: Vec<String>, bools: &[&str]) -> Result<T, i32> {
    T::try_parse_from(normalize(argv, bools)).map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            2
        } else {
            0
        }
    })
}

pub fn main(argv: Vec<String>) -> i32 {
    let args: Args = match parse(argv, BOOL_FLAGS) {
        Ok(a) => a,
        Err(code) => return code,
    };
    crate::logging::init();
    mooncake_common::fd_limit::raise_to_hard();
    let mut config = args.service_config();
    match ClusterToken::resolve(&args.cluster_token_file) {
        Ok(token) => config.client.cluster_token = token,
        Err(e) => {
            eprintln!("mooncake_client: {e}");
            return 1;
        }
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mooncake_client: {e}");
            return 1;
        }
    };
    rt.block_on(async move {
        let service = match tokio::task::spawn_blocking(move || StoreService::start(&config)).await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                eprintln!("mooncake_client: {e}");
                return 1;
            }
            Err(e) => {
                eprintln!("mooncake_client: {e}");
                return 1;
            }
        };
        let http = if args.enable_http_server {
            // Metrics are scraped from other hosts: all interfaces unless
            // --host names one (the dummy service itself stays on loopback).
            let host = args.host.as_deref().unwrap_or("0.0.0.0");
            match http_server(&service, host, args.http_port) {
                Ok(server) => Some(server),
                Err(e) => {
                    eprintln!("mooncake_client: {e}");
                    let _ = tokio::task::spawn_blocking(move || service.stop()).await;
                    return 1;
                }
            }
        } else {
            None
        };
        // Handlers first: a stop sent right after "ready" must not be lost.
        let stop = crate::signals::shutdown_signal();
        println!(
            "mooncake_client ready: dummy clients connect to {}; segment {} ({})",
            service.local_addr(),
            service.hostname(),
            format_size(args.global_segment_size)
        );
        if let Some(name) = service.local_socket() {
            println!("mooncake_client local: dummy clients on this host use @{name}");
        }
        if let Some(h) = &http {
            println!("mooncake_client http: /metrics and /health on {}", h.addr());
        }
        stop.await;
        drop(http);
        let _ = tokio::task::spawn_blocking(move || service.stop()).await;
        0
    })
}

/// The client HTTP server over the service's metrics and health.
fn http_server(
    service: &StoreService,
    host: &str,
    port: u16,
) -> mooncake_common::Result<ClientHttpServer> {
    let metrics = service.metrics().cloned().ok_or_else(|| {
        mooncake_common::Error::new(
            mooncake_common::ErrorCode::INVALID_PARAMS,
            "--enable_http_server needs client metrics (MC_STORE_CLIENT_METRIC=0 turned them off)",
        )
    })?;
    let health = service.health_probe();
    ClientHttpServer::start(host, port, metrics, health)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_flags() {
        let args: Args = parse(
            [
                "mooncake_client",
                "--master_server_address=10.0.0.1:50051",
                "-port=50099",
                "--global_segment_size=4 GB",
                "--protocol=tcp",
                "--device_names=mlx5_0",
                "--metadata_server=P2PHANDSHAKE",
                "--enable_offload",
                "--threads=4",
                "--host=127.0.0.1",
                "--enable_http_server",
                "--http_port=9400",
            ]
            .map(String::from)
            .to_vec(),
            BOOL_FLAGS,
        )
        .unwrap();
        assert_eq!(args.port, 50099);
        assert_eq!(args.global_segment_size, 4 << 30);
        assert!(args.enable_offload);
        assert!(args.enable_http_server);
        assert_eq!(args.http_port, 9400);
        let cfg = args.service_config();
        assert_eq!(cfg.client.local_hostname, "127.0.0.1");
        assert_eq!(cfg.client.device_name, "mlx5_0");
        assert_eq!(cfg.client.metadata_server, "P2PHANDSHAKE");
    }

    #[test]
    fn rejects_bad_sizes() {
        let r: Result<Args, i32> = parse(
            vec!["mooncake_client".into(), "--global_segment_size=50%".into()],
            &["enable_offload"],
        );
        assert_eq!(r.unwrap_err(), 2);
    }
}
