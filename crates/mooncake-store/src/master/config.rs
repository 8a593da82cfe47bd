//! `MasterConfig`: every `mooncake_master` flag with the reference's default.
//!
//! Each flag is declared once, in the [`master_flags!`] table below (name,
//! kind, default, what it does and, when implemented, the field it sets
//! and how its value is parsed); the flag list for `--help`, the struct,
//! its `Default` and [`MasterConfig::set`] are generated from it.
//!
//! Flags and config files share one path: each setting is a `(name, value)`
//! pair applied with [`MasterConfig::set`], so `--client_ttl=5s` and
//! `client_ttl: 5s` in a YAML or JSON file mean the same. Precedence:
//! defaults, then `--config_path`, then command-line flags.

use std::path::Path;
use std::time::Duration;

use mooncake_common::gflags::parse_bool;
use mooncake_common::size::parse_size;
use mooncake_common::{Error, ErrorCode, Result};

use super::policy::{
    AllocationStrategy, FilePolicy, LeasePolicy, OffloadPolicy, Policy, TaskPolicy,
};
use parse::invalid;

/// Kind of value a flag takes (for `--help` and boolean spellings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagKind {
    Bool,
    Int,
    Float,
    Str,
    /// A duration: bare number in the flag's unit, or `5s`, `30m`, `1h`.
    Duration,
    /// A byte size: `1073741824`, `1GB`, `16 MB`.
    Size,
}

/// What a flag does in this implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Implemented.
    Full,
    /// Accepted for compatibility, feature not implemented: the value's form
    /// is checked and a non-default value is reported in the log.
    NotImplemented,
    /// A glog logging flag: accepted, no effect (logging is `--log_level`/`RUST_LOG`).
    Ignored,
}

/// One `mooncake_master` flag.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    pub name: &'static str,
    pub kind: FlagKind,
    pub default: &'static str,
    pub help: &'static str,
    pub support: Support,
}

/// Declares the flags. A row is
/// `name: Kind = "default", Support, "help"`, followed for an implemented
/// flag by `=> field: Type = parser`, where `parser` is a function of
/// [`parse`] turning the value into the field's type.
macro_rules! master_flags {
    (
        extra {
            $( $(#[$xdoc:meta])* $xfield:ident : $xty:ty = $xdefault:expr; )*
        }
        $(
            $name:ident : $kind:ident = $default:literal, $support:ident, $help:literal
            $( => $field:ident : $ty:ty = $parse:ident )?;
        )*
    ) => {
        /// Every flag the master accepts (the reference's, same names and
        /// defaults), in `--help` order.
        pub const FLAGS: &[Flag] = &[
            $(
                Flag {
                    name: stringify!($name),
                    kind: FlagKind::$kind,
                    default: $default,
                    help: $help,
                    support: Support::$support,
                },
            )*
        ];

        /// Master settings. `Default` gives the reference's defaults.
        #[derive(Debug, Clone, PartialEq)]
        pub struct MasterConfig {
            $( $( #[doc = $help] pub $field: $ty, )? )*
            $( $(#[$xdoc])* pub $xfield: $xty, )*
        }

        impl Default for MasterConfig {
            fn default() -> Self {
                MasterConfig {
                    $( $(
                        $field: parse::$parse(stringify!($name), $default, $default)
                            .expect("flag defaults parse"),
                    )? )*
                    $( $xfield: $xdefault, )*
                }
            }
        }

        impl MasterConfig {
            /// Sets the field of an implemented flag; `None` for the others.
            fn set_field(&mut self, name: &str, value: &str, v: &str) -> Option<Result<()>> {
                match name {
                    $( $(
                        stringify!($name) => {
                            Some(parse::$parse(name, value, v).map(|x| self.$field = x))
                        }
                    )? )*
                    _ => None,
                }
            }
        }
    };
}

master_flags! {
    extra {
        /// How often the metrics summary is logged.
        metric_report_interval: Duration = Duration::from_secs(10);
        /// Flags accepted for compatibility whose feature is not implemented,
        /// set to a non-default value: `(name, value)`; the server logs them.
        unsupported: Vec<(String, String)> = Vec::new();
    }
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
    rpc_conn_timeout_seconds: Int = "0", Full, "Close idle client connections after this many seconds (0 = never)"
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
    default_kv_lease_ttl: Duration = "10000", Full, "Read lease granted on every read, ms (or 5s, 1m)"
        => default_kv_lease_ttl: Duration = millis;
    default_kv_soft_pin_ttl: Duration = "1800000", Full, "Soft pin lifetime after the last access, ms"
        => default_kv_soft_pin_ttl: Duration = millis;
    allow_evict_soft_pinned_objects: Bool = "true", Full, "Evict soft-pinned objects when nothing else is left"
        => allow_evict_soft_pinned_objects: bool = boolean;
    eviction_ratio: Float = "0.05", Full, "Share of capacity freed by one eviction round"
        => eviction_ratio: f64 = ratio;
    eviction_high_watermark_ratio: Float = "0.9", Full, "Usage ratio that starts eviction"
        => eviction_high_watermark_ratio: f64 = ratio;
    client_ttl: Duration = "10", Full, "Seconds without heartbeat before a client is dropped"
        => client_ttl: Duration = positive_seconds;
    put_start_discard_timeout_sec: Duration = "30", Full, "Seconds after which an unfinished put is discarded"
        => put_start_discard_timeout: Duration = seconds;
    put_start_release_timeout_sec: Duration = "600", Full, "Seconds after PutStart before a discarded put's space is reused"
        => put_start_release_timeout: Duration = seconds;
    cluster_id: Str = "mooncake_cluster", Full, "Cluster id (HA keys, metadata prefixes)"
        => cluster_id: String = text;
    allocation_strategy: Str = "random", Full, "Replica placement: random or free_ratio_first"
        => allocation_strategy: AllocationStrategy = strategy;
    memory_allocator: Str = "offset", Full, "Segment allocator (offset)"
        => memory_allocator: String = offset_allocator;
    log_level: Str = "info", Full, "Log level: trace, debug, info, warn, error (RUST_LOG overrides)"
        => log_level: String = text;
    config_path: Str = "", Full, "YAML or JSON file with the same keys as these flags"
        => config_path: String = text;
    batch_oplog_retry_timeout_sec: Int = "180", NotImplemented, "Maximum time to retry transient batch OpLog standby errors.";
    cxl_path: Str = "/dev/dax0.0", NotImplemented, "DAX device path for CXL memory";
    cxl_size: Int = "8589934592", NotImplemented, "CXL memory size in bytes";
    dynamic_replication_admission_qps_threshold: Float = "0.8", NotImplemented, "Per-key access frequency threshold for dynamic MEMORY replication";
    dynamic_replication_heat_window_seconds: Int = "10", NotImplemented, "Heat observation window for dynamic MEMORY replication";
    dynamic_replication_max_memory_replicas: Int = "2", NotImplemented, "Maximum MEMORY replicas allowed for one dynamically replicated key";
    dynamic_replication_mode: Str = "off", NotImplemented, "Dynamic MEMORY replica fanout mode: off, observe, or enforce";
    enable_cxl: Bool = "false", NotImplemented, "Whether to enable CXL memory support";
    enable_disk_eviction: Bool = "true", Full, "Shared-filesystem tier: when full, drop its oldest files (false: puts back off with -200 instead)"
        => enable_disk_eviction: bool = boolean;
    enable_ha: Bool = "false", Full, "Campaign for leadership through the HA backend; serve only while leading"
        => enable_ha: bool = boolean;
    enable_kv_events: Bool = "false", NotImplemented, "Enable RFC #1527 KV cache event publisher over ZMQ";
    enable_metadata_cleanup_on_timeout: Bool = "false", NotImplemented, "Enable cleanup of HTTP metadata (mooncake/ram/*, mooncake/rpc_meta/...";
    enable_multi_tenants: Bool = "false", NotImplemented, "Enable strict multi-tenant namespace and quota admission";
    enable_offload: Bool = "false", Full, "Enable offload availability: storage clients may mount an SSD tier and objects are copied there"
        => enable_offload: bool = boolean;
    enable_oplog: Bool = "false", Full, "Log every metadata change: replicated with --enable_ha, else a local write-ahead log in --wal_dir (fdatasync before each acknowledgement)"
        => enable_oplog: bool = boolean;
    enable_snapshot: Bool = "false", Full, "Enable periodic snapshot of master data"
        => enable_snapshot: bool = boolean;
    enable_snapshot_restore: Bool = "false", Full, "enable restore from snapshot"
        => enable_snapshot_restore: bool = boolean;
    etcd_endpoints: Str = "", Full, "HA backend endpoints, separated by semicolon (etcd, or redis://host:port)"
        => etcd_endpoints: String = text;
    global_file_segment_size: Int = "9223372036854775807", Full, "Size of global NFS/3FS segment in bytes (the shared-filesystem tier's capacity)"
        => global_file_segment_size: usize = count;
    ha_backend_connstring: Str = "", Full, "HA backend connection string; if unset, --etcd_endpoints is used"
        => ha_backend_connstring: String = text;
    ha_backend_type: Str = "etcd", Full, "HA backend type: etcd, redis or k8s"
        => ha_backend_type: String = ha_backend_type;
    k8s_lease_duration_sec: Duration = "5", Full, "k8s HA: seconds a standby waits after the last renewal it saw before taking the Lease"
        => k8s_lease_duration: Duration = whole_seconds;
    k8s_renew_deadline_sec: Duration = "3", Full, "k8s HA: the leader stops serving once no renewal got through for this long (s, or 2500ms)"
        => k8s_renew_deadline: Duration = seconds;
    k8s_retry_period_sec: Duration = "1", Full, "k8s HA: how often the leader renews and standbys retry (s, or 500ms)"
        => k8s_retry_period: Duration = seconds;
    kv_events_additional_salt: Str = "", NotImplemented, "Deprecated: not emitted on events; use indexer POST /register";
    kv_events_backend_id: Str = "", NotImplemented, "backend_id for published KV events (cache owner identity)";
    kv_events_bind_endpoint: Str = "", NotImplemented, "ZMQ PUB bind endpoint for KV events, e.g. tcp://0.0.0.0:5557";
    kv_events_block_size: Int = "0", NotImplemented, "Deprecated: not emitted on events; use indexer POST /register";
    kv_events_dp_rank: Int = "0", NotImplemented, "Deprecated: not emitted on events; use indexer POST /register";
    kv_events_emit_legacy_compat: Bool = "true", NotImplemented, "Include vLLM/SGLang-compatible type/block_hashes fields";
    kv_events_emit_object_key: Bool = "true", NotImplemented, "Include Mooncake object_key in published KV events";
    kv_events_lora_name: Str = "", NotImplemented, "Deprecated: not emitted on events (no LoRA context in master)";
    kv_events_model_name: Str = "", NotImplemented, "Deprecated: not emitted on events; use indexer POST /register";
    kv_events_queue_capacity: Int = "65536", NotImplemented, "Maximum pending KV events; oldest events are dropped when the queue...";
    kv_events_tenant_id: Str = "default", NotImplemented, "Deprecated: tenant_id comes from each object on events";
    max_kv_soft_pin_ttl: Str = "86400000", NotImplemented, "Maximum request-level soft pin TTL for kv objects. Supports raw mil...";
    max_retry_attempts: Int = "10", NotImplemented, "Maximum number of retry attempts for failed tasks";
    max_total_finished_tasks: Int = "10000", Full, "Maximum number of finished tasks to keep in memory"
        => max_total_finished_tasks: usize = count;
    max_total_pending_tasks: Int = "10000", Full, "Maximum number of pending tasks to keep in memory"
        => max_total_pending_tasks: usize = count;
    max_total_processing_tasks: Int = "10000", Full, "Maximum number of processing tasks to keep in memory"
        => max_total_processing_tasks: usize = count;
    nof_eviction_high_watermark_ratio: Float = "0.9", NotImplemented, "Ratio of high watermark trigger eviction in NoF SSD";
    nof_eviction_ratio: Float = "0.05", NotImplemented, "Ratio of objects to evict when NoF SSD space is full";
    nof_heartbeat_failures_threshold: Int = "3", NotImplemented, "Consecutive NoF heartbeat failures required before unmounting a NoF...";
    nof_heartbeat_interval_sec: Int = "10", NotImplemented, "How often master probes each mounted NoF segment";
    nof_heartbeat_probe_timeout_ms: Int = "1000", NotImplemented, "Timeout in milliseconds for a single NoF heartbeat probe";
    offload_cap_ratio: Float = "0.5", Full, "Per-cycle offload cap as a fraction of offloading_queue_limit"
        => offload_cap_ratio: f64 = ratio;
    offload_force_evict: Bool = "false", Full, "Force-evict objects exceeding offload cap without disk offload"
        => offload_force_evict: bool = boolean;
    offload_on_evict: Bool = "false", Full, "Defer LOCAL_DISK offload to eviction time instead of PutEnd"
        => offload_on_evict: bool = boolean;
    offloading_queue_limit: Int = "50000", Full, "Maximum number of objects allowed in the offloading queue per local disk owner"
        => offloading_queue_limit: usize = count;
    oplog_batch_max_entries: Int = "1024", Full, "Most log entries sent to a standby in one batch"
        => oplog_batch_max_entries: usize = count;
    oplog_poll_interval_ms: Int = "1000", Full, "Longest an idle standby waits before asking its leader again"
        => oplog_poll_interval: Duration = millis;
    pending_task_timeout_sec: Int = "300", Full, "Timeout in seconds for pending tasks (0 = no timeout)"
        => pending_task_timeout: Option<Duration> = seconds_or_never;
    pod_name: Str = "", Full, "Pod name for K8s label-based routing (default: $POD_NAME)"
        => pod_name: String = text;
    pod_namespace: Str = "", Full, "Pod namespace for K8s label-based routing (default: $POD_NAMESPACE)"
        => pod_namespace: String = text;
    processing_task_timeout_sec: Int = "300", Full, "Timeout in seconds for processing tasks (0 = no timeout)"
        => processing_task_timeout: Option<Duration> = seconds_or_never;
    promotion_admission_threshold: Int = "2", Full, "Reads of a disk-only key before it is promoted (1 = on the first)"
        => promotion_admission_threshold: usize = count;
    promotion_max_per_heartbeat: Int = "1", Full, "Max promotion tasks handed to a client per offload poll"
        => promotion_max_per_heartbeat: usize = count;
    promotion_on_hit: Bool = "false", Full, "Promote LOCAL_DISK-only keys to MEMORY on read access"
        => promotion_on_hit: bool = boolean;
    promotion_queue_limit: Int = "50000", Full, "Max in-flight promotion tasks"
        => promotion_queue_limit: usize = count;
    quota_bytes: Int = "0", Full, "Quota for storage backend in bytes (0 = use default 90% of capacity)"
        => quota_bytes: usize = count;
    root_fs_dir: Str = "", Full, "Root directory of the shared-filesystem tier (every client mounts it at this path; empty = off)"
        => root_fs_dir: String = text;
    rpc_interface: Str = "", NotImplemented, "Network interface name for RPC server address resolution. When set,...";
    snapshot_backup_dir: Str = "", Full, "Optional local directory for snapshot and restore backup. If empty, local backup is disabled"
        => snapshot_backup_dir: String = text;
    snapshot_catalog_backend_connstring: Str = "", NotImplemented, "Deprecated alias of --snapshot_catalog_store_connstring";
    snapshot_catalog_backend_type: Str = "", NotImplemented, "Deprecated alias of --snapshot_catalog_store_type";
    snapshot_catalog_store_connstring: Str = "", NotImplemented, "Optional connection string for snapshot catalog store";
    snapshot_catalog_store_type: Str = "", NotImplemented, "Snapshot catalog store type: ''/'embedded' or 'redis' ('payload' is...";
    snapshot_child_timeout_seconds: Int = "300", NotImplemented, "Timeout for snapshot child process in seconds";
    snapshot_interval_seconds: Duration = "600", Full, "Interval in second between periodic snapshots of master data"
        => snapshot_interval: Duration = positive_seconds;
    snapshot_object_store_type: Str = "", Full, "Snapshot object store type: 'local' for local filesystem (MOONCAKE_SNAPSHOT_LOCAL_PATH), 's3' for S3 storage (MOONCAKE_AWS_*)"
        => snapshot_object_store_type: String = snapshot_store;
    snapshot_payload_backend_type: Str = "", Full, "Deprecated alias of --snapshot_object_store_type"
        => snapshot_payload_backend_type: String = snapshot_store;
    snapshot_payload_store_type: Str = "", Full, "Deprecated alias of --snapshot_object_store_type"
        => snapshot_payload_store_type: String = snapshot_store;
    snapshot_retention_count: Int = "2", Full, "Number of recent snapshots to keep (older snapshots will be automatically deleted)"
        => snapshot_retention_count: usize = positive_count;
    snapshot_backend_type: Str = "", Full, "Snapshot backend: local or s3 (older spelling of --snapshot_object_store_type)"
        => snapshot_backend_type: String = snapshot_store;
    wal_dir: Str = "", Full, "Directory of the local write-ahead log (default: $MOONCAKE_SNAPSHOT_LOCAL_PATH/mooncake_master_wal/<cluster_id>)"
        => wal_dir: String = text;
    tenant_quota_connector_type: Str = "file", NotImplemented, "Tenant quota policy connector type";
    tenant_quota_connector_uri: Str = "", NotImplemented, "Tenant quota policy connector URI";
    mmap_arena_pool_size: Int = "8589934592", NotImplemented, "Arena allocator pool size in bytes";
    use_mmap_arena_allocator: Bool = "false", NotImplemented, "Enable the lock-free mmap arena allocator for mmap buffers";
    alsologtoemail: Str = "", Ignored, "log messages go to these email addresses in addition to logfiles";
    alsologtostderr: Bool = "false", Ignored, "log messages go to stderr in addition to logfiles";
    colorlogtostderr: Bool = "false", Ignored, "color messages logged to stderr (if supported by terminal)";
    drop_log_memory: Bool = "true", Ignored, "Drop in-memory buffers of log contents. Logs can grow very quickly...";
    log_backtrace_at: Str = "", Ignored, "Emit a backtrace when logging at file:linenum.";
    log_dir: Str = "", Ignored, "If specified, logfiles are written into this directory instead of t...";
    log_link: Str = "", Ignored, "Put additional links to the log files in this directory";
    log_prefix: Bool = "true", Ignored, "Prepend the log prefix to the start of each log line";
    logbuflevel: Int = "0", Ignored, "Buffer log messages logged at this level or lower (-1 means don't b...";
    logbufsecs: Int = "30", Ignored, "Buffer log messages for at most this many seconds";
    logemaillevel: Int = "999", Ignored, "Email log messages logged at this level or higher (0 means email al...";
    logfile_mode: Int = "436", Ignored, "Log file mode/permissions.";
    logmailer: Str = "/bin/mail", Ignored, "Mailer used to send logging email";
    logtostderr: Bool = "false", Ignored, "log messages go to stderr instead of logfiles";
    max_log_size: Int = "1800", Ignored, "approx. maximum log file size (in MB). A value of 0 will be silentl...";
    minloglevel: Int = "0", Ignored, "Messages logged at a lower level than this don't actually get logge...";
    stderrthreshold: Int = "2", Ignored, "log messages at or above this level are copied to stderr in additio...";
    stop_logging_if_full_disk: Bool = "false", Ignored, "Stop attempting to log to disk if the disk is full.";
    symbolize_stacktrace: Bool = "true", Ignored, "Symbolize the stack trace in the tombstone";
    v: Int = "0", Ignored, "Show all VLOG(m) messages for m <= this. Overridable by --vmodule.";
    vmodule: Str = "", Ignored, "per-module verbose level. Argument is a comma-separated list of <mo...";
}

/// Names of the boolean flags, for `gflags::normalize`.
pub fn bool_flag_names() -> Vec<&'static str> {
    FLAGS
        .iter()
        .filter(|f| f.kind == FlagKind::Bool)
        .map(|f| f.name)
        .collect()
}

/// Value parsers of the flag table: `(flag name, value as given, value
/// trimmed)` in, the field's value or an `INVALID_PARAMS` naming the flag out.
mod parse {
    use std::time::Duration;

    use mooncake_common::duration::parse_duration;
    use mooncake_common::gflags::parse_bool;
    use mooncake_common::{Error, ErrorCode, Result};

    use crate::master::policy::AllocationStrategy;

    /// The error for a value `name` does not take.
    pub(super) fn invalid(name: &str, value: &str, why: impl std::fmt::Display) -> Error {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("invalid value {value:?} for {name}: {why}"),
        )
    }

    pub(super) fn boolean(name: &str, value: &str, v: &str) -> Result<bool> {
        parse_bool(v).map_err(|e| invalid(name, value, e))
    }

    pub(super) fn count(name: &str, value: &str, v: &str) -> Result<usize> {
        let n = v.parse::<u64>().map_err(|e| invalid(name, value, e))?;
        Ok(n as usize)
    }

    pub(super) fn port(name: &str, value: &str, v: &str) -> Result<u16> {
        v.parse::<u16>().map_err(|e| invalid(name, value, e))
    }

    pub(super) fn ratio(name: &str, value: &str, v: &str) -> Result<f64> {
        let r: f64 = v.parse().map_err(|e| invalid(name, value, e))?;
        if !(0.0..=1.0).contains(&r) {
            return Err(invalid(name, value, "must be between 0 and 1"));
        }
        Ok(r)
    }

    pub(super) fn text(_: &str, _: &str, v: &str) -> Result<String> {
        Ok(v.to_string())
    }

    fn duration(name: &str, value: &str, v: &str, unit: Duration) -> Result<Duration> {
        parse_duration(v, unit).map_err(|e| invalid(name, value, e.context))
    }

    /// A duration, bare numbers in milliseconds.
    pub(super) fn millis(name: &str, value: &str, v: &str) -> Result<Duration> {
        duration(name, value, v, Duration::from_millis(1))
    }

    /// A duration, bare numbers in seconds.
    pub(super) fn seconds(name: &str, value: &str, v: &str) -> Result<Duration> {
        duration(name, value, v, Duration::from_secs(1))
    }

    /// Whole seconds (a Lease's `leaseDurationSeconds` is an integer), at least 1.
    pub(super) fn whole_seconds(name: &str, value: &str, v: &str) -> Result<Duration> {
        let d = seconds(name, value, v)?;
        if d.is_zero() || d.subsec_nanos() != 0 {
            return Err(invalid(
                name,
                value,
                "must be a whole number of seconds, at least 1",
            ));
        }
        Ok(d)
    }

    pub(super) fn positive_seconds(name: &str, value: &str, v: &str) -> Result<Duration> {
        let d = seconds(name, value, v)?;
        if d.is_zero() {
            return Err(invalid(name, value, "must be positive"));
        }
        Ok(d)
    }

    /// Seconds, with 0 meaning never.
    pub(super) fn seconds_or_never(name: &str, value: &str, v: &str) -> Result<Option<Duration>> {
        let d = seconds(name, value, v)?;
        Ok((!d.is_zero()).then_some(d))
    }

    pub(super) fn strategy(_: &str, _: &str, v: &str) -> Result<AllocationStrategy> {
        AllocationStrategy::parse(v)
    }

    pub(super) fn offset_allocator(name: &str, value: &str, v: &str) -> Result<String> {
        if v != "offset" {
            return Err(invalid(
                name,
                value,
                "only the offset allocator is available",
            ));
        }
        Ok(v.to_string())
    }

    pub(super) fn positive_count(name: &str, value: &str, v: &str) -> Result<usize> {
        let n = count(name, value, v)?;
        if n == 0 {
            return Err(invalid(name, value, "must be positive"));
        }
        Ok(n)
    }

    pub(super) fn snapshot_store(name: &str, value: &str, v: &str) -> Result<String> {
        if !matches!(v, "" | "local" | "s3") {
            return Err(invalid(name, value, "snapshot stores are local and s3"));
        }
        Ok(v.to_string())
    }

    pub(super) fn ha_backend_type(name: &str, value: &str, v: &str) -> Result<String> {
        if !matches!(v, "etcd" | "redis" | "k8s") {
            return Err(invalid(name, value, "HA backends are etcd, redis and k8s"));
        }
        Ok(v.to_string())
    }
}

impl MasterConfig {
    /// Applies one setting by flag name. Unknown names are `INVALID_PARAMS`.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let flag = FLAGS.iter().find(|f| f.name == name).ok_or_else(|| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("unknown master flag {name:?}"),
            )
        })?;
        let v = value.trim();
        if let Some(set) = self.set_field(name, value, v) {
            return set;
        }
        debug_assert!(flag.support != Support::Full, "flag {name} has no field");
        // Accepted for compatibility: check the value's form and note it.
        let is_default = match flag.kind {
            FlagKind::Bool => {
                parse::boolean(name, value, v)? == parse_bool(flag.default).unwrap_or(false)
            }
            FlagKind::Int => {
                v.parse::<i64>().map_err(|e| invalid(name, value, e))?
                    == flag.default.parse::<i64>().unwrap_or(0)
            }
            FlagKind::Float => {
                v.parse::<f64>().map_err(|e| invalid(name, value, e))?
                    == flag.default.parse::<f64>().unwrap_or(0.0)
            }
            FlagKind::Size => {
                parse_size(v).map_err(|e| invalid(name, value, e.context))?
                    == parse_size(flag.default)?
            }
            FlagKind::Str | FlagKind::Duration => v == flag.default,
        };
        self.unsupported.retain(|(n, _)| n != name);
        if !is_default && flag.support == Support::NotImplemented {
            self.unsupported.push((name.to_string(), v.to_string()));
        }
        Ok(())
    }

    /// Builds a config: defaults, then the file named by a `config_path`
    /// setting (if any), then the settings themselves.
    pub fn from_settings<'a>(
        settings: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
    ) -> Result<Self> {
        let mut c = MasterConfig::default();
        if let Some((_, path)) = settings
            .clone()
            .into_iter()
            .filter(|(n, _)| *n == "config_path")
            .last()
        {
            if !path.is_empty() {
                c.apply_file(Path::new(path))?;
            }
        }
        for (name, value) in settings {
            c.set(name, value)?;
        }
        c.validate()?;
        Ok(c)
    }

    /// Applies a YAML or JSON file whose top level maps flag names to values.
    pub fn apply_file(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::new(
                ErrorCode::FILE_OPEN_FAIL,
                format!("config file {}: {e}", path.display()),
            )
        })?;
        // YAML is a superset of JSON, so one parser reads both.
        let doc: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|e| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("config file {}: {e}", path.display()),
            )
        })?;
        let map = match doc {
            serde_yaml::Value::Mapping(m) => m,
            serde_yaml::Value::Null => return Ok(()),
            _ => {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!(
                        "config file {}: top level must be a mapping",
                        path.display()
                    ),
                ))
            }
        };
        for (k, v) in map {
            let key = match k {
                serde_yaml::Value::String(s) => s,
                other => {
                    return Err(Error::new(
                        ErrorCode::INVALID_PARAMS,
                        format!("config key {other:?} is not a string"),
                    ))
                }
            };
            let value = match v {
                serde_yaml::Value::String(s) => s,
                serde_yaml::Value::Bool(b) => b.to_string(),
                serde_yaml::Value::Number(n) => n.to_string(),
                serde_yaml::Value::Null => String::new(),
                other => {
                    return Err(Error::new(
                        ErrorCode::INVALID_PARAMS,
                        format!("config key {key}: value {other:?} is not a scalar"),
                    ))
                }
            };
            self.set(&key, &value)
                .map_err(|e| e.with_context(format!("config file {}", path.display())))?;
        }
        Ok(())
    }

    /// Checks settings that only make sense together.
    pub fn validate(&self) -> Result<()> {
        if self.eviction_ratio > self.eviction_high_watermark_ratio {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "eviction_ratio must not exceed eviction_high_watermark_ratio",
            ));
        }
        if self.enable_ha {
            self.ha_backend()?;
            super::leader_label::pod(self)?;
            if self.rpc_listen_port() == 0 {
                // The port is published as the leader's address before binding.
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    "HA mode needs a fixed --rpc_port",
                ));
            }
        }
        Ok(())
    }

    /// The coordination service of HA mode: `--ha_backend_connstring`, else
    /// `--etcd_endpoints`; a `redis://` address means redis whatever
    /// `--ha_backend_type` says, as in the reference's deployment guide.
    /// The k8s backend takes `<namespace>/<lease>` from
    /// `--ha_backend_connstring` only, as the reference does.
    pub fn ha_backend(&self) -> Result<crate::ha::Backend> {
        if self.ha_backend_type == "k8s" {
            if self.ha_backend_connstring.trim().is_empty() {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    "--ha_backend_type=k8s needs --ha_backend_connstring=<namespace>/<lease>",
                ));
            }
            return crate::ha::Backend::k8s(&self.ha_backend_connstring, self.k8s_timings());
        }
        let conn = if self.ha_backend_connstring.is_empty() {
            &self.etcd_endpoints
        } else {
            &self.ha_backend_connstring
        };
        if conn.trim().is_empty() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "HA mode needs --etcd_endpoints (or --ha_backend_connstring)",
            ));
        }
        crate::ha::Backend::parse(conn, self.ha_backend_type == "redis")
    }

    /// The k8s backend's LeaderElectionConfig timings.
    pub fn k8s_timings(&self) -> crate::ha::k8s::Timings {
        crate::ha::k8s::Timings {
            lease: self.k8s_lease_duration,
            renew_deadline: self.k8s_renew_deadline,
            retry: self.k8s_retry_period,
        }
    }

    /// The snapshot store: `--snapshot_object_store_type`, else its older
    /// spellings in the reference's order; `local` when none is set.
    pub fn snapshot_store_type(&self) -> &str {
        [
            &self.snapshot_object_store_type,
            &self.snapshot_payload_store_type,
            &self.snapshot_payload_backend_type,
            &self.snapshot_backend_type,
        ]
        .into_iter()
        .find(|t| !t.is_empty())
        .map_or("local", String::as_str)
    }

    /// Whether this master keeps a local write-ahead log (`--enable_oplog`
    /// without an HA backend).
    pub fn local_wal(&self) -> bool {
        self.enable_oplog && !self.enable_ha
    }

    /// The port the RPC service listens on (`rpc_port`, or `port` when it is 0).
    pub fn rpc_listen_port(&self) -> u16 {
        if self.rpc_port != 0 {
            self.rpc_port
        } else {
            self.port
        }
    }

    /// The state machine's rules, in milliseconds.
    pub fn policy(&self) -> Policy {
        Policy {
            lease: LeasePolicy {
                lease_ttl: ms(self.default_kv_lease_ttl),
                soft_pin_ttl: ms(self.default_kv_soft_pin_ttl),
            },
            client_ttl: ms(self.client_ttl),
            discard_after: ms(self.put_start_discard_timeout),
            release_after: ms(self.put_start_release_timeout)
                .max(ms(self.put_start_discard_timeout)),
            high_watermark: self.eviction_high_watermark_ratio,
            eviction_ratio: self.eviction_ratio,
            evict_soft_pinned: self.allow_evict_soft_pinned_objects,
            strategy: self.allocation_strategy,
        }
    }

    /// The SSD tier's rules.
    pub fn offload_policy(&self) -> OffloadPolicy {
        OffloadPolicy {
            enabled: self.enable_offload,
            on_evict: self.offload_on_evict,
            queue_limit: self.offloading_queue_limit.max(1),
            cap_ratio: self.offload_cap_ratio,
            force_evict: self.offload_force_evict,
            promote_on_hit: self.promotion_on_hit,
            promote_after: self.promotion_admission_threshold.max(1),
            promote_per_poll: self.promotion_max_per_heartbeat.max(1),
            promote_limit: self.promotion_queue_limit,
        }
    }

    /// The shared-filesystem tier (`--root_fs_dir`).
    pub fn file_policy(&self) -> FilePolicy {
        FilePolicy::new(
            &self.root_fs_dir,
            &self.cluster_id,
            self.global_file_segment_size as u64,
            self.quota_bytes as u64,
            self.enable_disk_eviction,
        )
    }

    /// Task limits and timeouts for the state machine.
    pub fn task_policy(&self) -> TaskPolicy {
        let or_zero = |d: Option<Duration>| d.map_or(0, |d| d.as_millis() as u64);
        TaskPolicy {
            max_pending: self.max_total_pending_tasks,
            max_processing: self.max_total_processing_tasks,
            max_finished: self.max_total_finished_tasks,
            pending_timeout: or_zero(self.pending_task_timeout),
            processing_timeout: or_zero(self.processing_task_timeout),
        }
    }

    /// Worker threads for the RPC runtime.
    pub fn worker_threads(&self) -> usize {
        if self.rpc_thread_num > 0 {
            return self.rpc_thread_num;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        cores.min(self.max_threads.max(1))
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_reference() {
        let c = MasterConfig::default();
        assert_eq!(c.rpc_listen_port(), 50051);
        assert_eq!(c.metrics_port, 9003);
        assert_eq!(c.default_kv_lease_ttl, Duration::from_millis(10_000));
        assert_eq!(c.default_kv_soft_pin_ttl, Duration::from_secs(1800));
        assert_eq!(c.client_ttl, Duration::from_secs(10));
        assert_eq!(c.eviction_ratio, 0.05);
        assert_eq!(c.eviction_high_watermark_ratio, 0.9);
        assert_eq!(c.allocation_strategy, AllocationStrategy::Random);
        assert!(c.allow_evict_soft_pinned_objects);
        assert!(!c.enable_http_metadata_server);
        assert!(c.unsupported.is_empty());
    }

    #[test]
    fn implemented_flags_and_only_they_set_a_field() {
        let mut c = MasterConfig::default();
        for f in FLAGS {
            let set = c.set_field(f.name, f.default, f.default);
            assert_eq!(set.is_some(), f.support == Support::Full, "{}", f.name);
            assert!(set.is_none_or(|r| r.is_ok()), "{}", f.name);
        }
        assert_eq!(c, MasterConfig::default(), "defaults are a fixed point");
    }

    #[test]
    fn parses_units_and_rejects_garbage() {
        let mut c = MasterConfig::default();
        c.set("default_kv_lease_ttl", "5s").unwrap();
        assert_eq!(c.default_kv_lease_ttl, Duration::from_secs(5));
        c.set("client_ttl", "2").unwrap();
        assert_eq!(c.client_ttl, Duration::from_secs(2));
        c.set("allocation_strategy", "free_ratio_first").unwrap();
        assert_eq!(c.allocation_strategy, AllocationStrategy::FreeRatioFirst);
        for (k, v) in [
            ("rpc_port", "70000"),
            ("eviction_ratio", "1.5"),
            ("allocation_strategy", "fastest"),
            ("client_ttl", "0"),
            ("enable_ha", "maybe"),
            ("no_such_flag", "1"),
        ] {
            assert_eq!(
                c.set(k, v).unwrap_err().code,
                ErrorCode::INVALID_PARAMS,
                "{k}={v}"
            );
        }
    }

    #[test]
    fn unsupported_flags_are_recorded_when_changed() {
        let mut c = MasterConfig::default();
        c.set("enable_multi_tenants", "false").unwrap();
        c.set("global_file_segment_size", "9223372036854775807")
            .unwrap();
        assert!(c.unsupported.is_empty());
        c.set("enable_multi_tenants", "true").unwrap();
        c.set("enable_multi_tenants", "1").unwrap();
        assert_eq!(
            c.unsupported,
            [("enable_multi_tenants".to_string(), "1".to_string())]
        );
    }

    #[test]
    fn file_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = dir.path().join("m.yaml");
        std::fs::write(
            &yaml,
            "rpc_port: 6000\nclient_ttl: 3s\nenable_http_metadata_server: true\n",
        )
        .unwrap();
        let path = yaml.to_str().unwrap();
        let c = MasterConfig::from_settings([("config_path", path), ("rpc_port", "6001")]).unwrap();
        assert_eq!(c.rpc_port, 6001, "flags override the file");
        assert_eq!(c.client_ttl, Duration::from_secs(3));
        assert!(c.enable_http_metadata_server);

        let json = dir.path().join("m.json");
        std::fs::write(&json, r#"{"metrics_port": 9100, "eviction_ratio": 0.1}"#).unwrap();
        let c = MasterConfig::from_settings([("config_path", json.to_str().unwrap())]).unwrap();
        assert_eq!(c.metrics_port, 9100);
        assert_eq!(c.eviction_ratio, 0.1);

        std::fs::write(&json, r#"{"bogus": 1}"#).unwrap();
        assert!(MasterConfig::from_settings([("config_path", json.to_str().unwrap())]).is_err());
        assert_eq!(
            MasterConfig::from_settings([("config_path", "/nonexistent/x.yaml")])
                .unwrap_err()
                .code,
            ErrorCode::FILE_OPEN_FAIL
        );
    }
}
