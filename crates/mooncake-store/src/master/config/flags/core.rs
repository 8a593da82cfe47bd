//! Core flags: the RPC and HTTP services, placement, clients, logging, the config file.

/// Appends this group's rows to the flag table and hands it on (see
/// `super::master_flags!`).
macro_rules! core_flags {
    ([$next:ident $(, $rest:ident)*] $($table:tt)*) => { $next! { [$($rest),*] $($table)*
    rpc_port: Int = "0", Full, "Port of the RPC service (0 = use --port)"
        => rpc_port: u16 = port;
    port: Int = "50051", Full, "Port of the RPC service (deprecated, use rpc_port)"
        => port: u16 = port;
    rpc_address: Str = "0.0.0.0", Full, "Address the RPC service binds"
        => rpc_address: String = text;
    rpc_thread_num: Int = "0", Full, "RPC worker threads (0 = min(max_threads, cores))"
        => rpc_thread_num: usize = count;
    max_threads: Int = "16", Full, "Maximum worker threads (deprecated, use rpc_thread_num)"
        => max_threads: usize = count;
    rpc_conn_timeout_seconds: Int = "300", Full, "Connection timeout in seconds: close client connections idle this long (0 = no timeout)"
        => rpc_conn_timeout: Option<Duration> = seconds_or_never;
    rpc_enable_tcp_no_delay: Bool = "true", Full, "Set TCP_NODELAY on client connections"
        => rpc_enable_tcp_no_delay: bool = boolean;
    enable_http_metadata_server: Bool = "false", Full, "Run the transfer-engine HTTP metadata server in the master"
        => enable_http_metadata_server: bool = boolean;
    http_metadata_server_host: Str = "0.0.0.0", Full, "Host of the embedded HTTP metadata server"
        => http_metadata_server_host: String = text;
    http_metadata_server_port: Int = "8080", Full, "Port of the embedded HTTP metadata server"
        => http_metadata_server_port: u16 = port;
    metrics_host: Str = "0.0.0.0", Full, "Address of the HTTP metrics and admin service"
        => metrics_host: String = text;
    metrics_port: Int = "9003", Full, "Port of the HTTP metrics and admin service"
        => metrics_port: u16 = port;
    enable_metric_reporting: Bool = "true", Full, "Log a metrics summary periodically"
        => enable_metric_reporting: bool = boolean;
    client_ttl: Duration = "10", Full, "Seconds without heartbeat before a client is dropped"
        => client_ttl: Duration = positive_seconds;
    client_suspect_ms: Duration = "2000", Full, "Milliseconds without heartbeat after which a client is Suspected: reads skip its replicas while another replica is served elsewhere (0: off; at least client_ttl: off)"
        => client_suspect: Duration = millis;
    segment_ramp_ms: Duration = "0", Full, "Milliseconds over which a newly mounted segment's share of new replicas ramps up from 5% (0: off, full share at once)"
        => segment_ramp: Duration = millis;
    cluster_id: Str = "mooncake_cluster", Full, "Cluster id (HA keys, metadata prefixes)"
        => cluster_id: String = text;
    allocation_strategy: Str = "random", Full, "Replica placement: random, free_ratio_first, ssd_free_ratio_first or local_first"
        => allocation_strategy: AllocationStrategy = strategy;
    memory_allocator: Str = "offset", Full, "Segment allocator (offset)"
        => memory_allocator: String = offset_allocator;
    log_level: Str = "info", Full, "Log level: trace, debug, info, warn, error (RUST_LOG overrides)"
        => log_level: String = text;
    config_path: Str = "", Full, "YAML or JSON file with the same keys as these flags"
        => config_path: String = text;
    cluster_token_file: Str = "", Full, "File holding the cluster token every peer must present (default: $MOONCAKE_CLUSTER_TOKEN; none: no authentication)"
        => cluster_token_file: String = text;
    admin_token_file: Str = "", Full, "File holding the admin token, needed for RemoveAll with force (default: $MOONCAKE_ADMIN_TOKEN)"
        => admin_token_file: String = text;
    allow_force_remove_all: Bool = "false", Full, "Let any client call RemoveAll with force (otherwise only connections that presented the admin token)"
        => allow_force_remove_all: bool = boolean;
    max_metadata_bytes: Size = "16GB", Full, "Budget for object metadata (key bytes plus a fixed overhead per object); puts past it fail with NO_AVAILABLE_HANDLE"
        => max_metadata_bytes: u64 = size;
    metadata_eviction_watermark_ratio: Float = "0.9", Full, "Share of --max_metadata_bytes at which the timer evicts the oldest objects until metadata is eviction_ratio of the budget below it (0: off)"
        => metadata_eviction_watermark_ratio: f64 = ratio;
    http_metadata_server_max_value_size: Size = "16MB", Full, "Largest value the embedded HTTP metadata server stores"
        => http_metadata_server_max_value_size: u64 = size;
    http_metadata_server_max_keys: Int = "1048576", Full, "Most keys the embedded HTTP metadata server holds"
        => http_metadata_server_max_keys: usize = count;
    rpc_interface: Str = "", NotImplemented, "Network interface name for RPC server address resolution. When set,...";
    } };
}
