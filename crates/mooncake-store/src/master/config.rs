//! `MasterConfig`: every `mooncake_master` flag with the reference's default.
//!
//! Flags and config files share one path: each setting is a `(name, value)`
//! pair applied with [`MasterConfig::set`], so `--client_ttl=5s` and
//! `client_ttl: 5s` in a YAML or JSON file mean the same. Precedence:
//! defaults, then `--config_path`, then command-line flags.

use std::path::Path;
use std::time::Duration;

use mooncake_common::duration::parse_duration;
use mooncake_common::gflags::parse_bool;
use mooncake_common::size::parse_size;
use mooncake_common::{Error, ErrorCode, Result};

/// How replicas are spread over segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocationStrategy {
    /// Random start, then consecutive segments.
    Random,
    /// Sample a few segments, fill the emptiest first.
    FreeRatioFirst,
}

impl AllocationStrategy {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "random" => Ok(AllocationStrategy::Random),
            "free_ratio_first" => Ok(AllocationStrategy::FreeRatioFirst),
            "cxl" => Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "allocation strategy cxl is not supported",
            )),
            _ => Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("unknown allocation strategy {s:?} (random, free_ratio_first)"),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AllocationStrategy::Random => "random",
            AllocationStrategy::FreeRatioFirst => "free_ratio_first",
        }
    }
}

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
    /// Accepted for compatibility; the feature is not implemented yet (a
    /// non-default value is reported in the log).
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

const fn flag(
    name: &'static str,
    kind: FlagKind,
    default: &'static str,
    help: &'static str,
) -> Flag {
    Flag {
        name,
        kind,
        default,
        help,
        support: Support::Full,
    }
}

const fn not_implemented(
    name: &'static str,
    kind: FlagKind,
    default: &'static str,
    help: &'static str,
) -> Flag {
    Flag {
        name,
        kind,
        default,
        help,
        support: Support::NotImplemented,
    }
}

const fn ignored(
    name: &'static str,
    kind: FlagKind,
    default: &'static str,
    help: &'static str,
) -> Flag {
    Flag {
        name,
        kind,
        default,
        help,
        support: Support::Ignored,
    }
}

use FlagKind::{Bool, Duration as Dur, Float, Int, Str};

/// Every flag the master accepts (the reference's, same names and defaults), in `--help` order.
#[rustfmt::skip]
pub const FLAGS: &[Flag] = &[
    flag("rpc_port", Int, "0", "Port of the RPC service (0 = use --port)"),
    flag("port", Int, "50051", "Port of the RPC service (deprecated, use rpc_port)"),
    flag("rpc_address", Str, "0.0.0.0", "Address the RPC service binds"),
    flag("rpc_thread_num", Int, "0", "RPC worker threads (0 = min(max_threads, cores))"),
    flag("max_threads", Int, "16", "Maximum worker threads (deprecated, use rpc_thread_num)"),
    flag("rpc_conn_timeout_seconds", Int, "0", "Close idle client connections after this many seconds (0 = never)"),
    flag("rpc_enable_tcp_no_delay", Bool, "true", "Set TCP_NODELAY on client connections"),
    flag("enable_http_metadata_server", Bool, "false", "Run the transfer-engine HTTP metadata server in the master"),
    flag("http_metadata_server_host", Str, "0.0.0.0", "Host of the embedded HTTP metadata server"),
    flag("http_metadata_server_port", Int, "8080", "Port of the embedded HTTP metadata server"),
    flag("metrics_host", Str, "0.0.0.0", "Address of the HTTP metrics and admin service"),
    flag("metrics_port", Int, "9003", "Port of the HTTP metrics and admin service"),
    flag("enable_metric_reporting", Bool, "true", "Log a metrics summary periodically"),
    flag("default_kv_lease_ttl", Dur, "10000", "Read lease granted on every read, ms (or 5s, 1m)"),
    flag("default_kv_soft_pin_ttl", Dur, "1800000", "Soft pin lifetime after the last access, ms"),
    flag("allow_evict_soft_pinned_objects", Bool, "true", "Evict soft-pinned objects when nothing else is left"),
    flag("eviction_ratio", Float, "0.05", "Share of capacity freed by one eviction round"),
    flag("eviction_high_watermark_ratio", Float, "0.9", "Usage ratio that starts eviction"),
    flag("client_ttl", Dur, "10", "Seconds without heartbeat before a client is dropped"),
    flag("put_start_discard_timeout_sec", Dur, "30", "Seconds after which an unfinished put is discarded"),
    flag("put_start_release_timeout_sec", Dur, "600", "Seconds after PutStart before a discarded put's space is reused"),
    flag("cluster_id", Str, "mooncake_cluster", "Cluster id (HA keys, metadata prefixes)"),
    flag("allocation_strategy", Str, "random", "Replica placement: random or free_ratio_first"),
    flag("memory_allocator", Str, "offset", "Segment allocator (offset)"),
    flag("log_level", Str, "info", "Log level: trace, debug, info, warn, error (RUST_LOG overrides)"),
    flag("config_path", Str, "", "YAML or JSON file with the same keys as these flags"),
    not_implemented("batch_oplog_retry_timeout_sec", Int, "180", "Maximum time to retry transient batch OpLog standby errors."),
    not_implemented("cxl_path", Str, "/dev/dax0.0", "DAX device path for CXL memory"),
    not_implemented("cxl_size", Int, "8589934592", "CXL memory size in bytes"),
    not_implemented("dynamic_replication_admission_qps_threshold", Float, "0.8", "Per-key access frequency threshold for dynamic MEMORY replication"),
    not_implemented("dynamic_replication_heat_window_seconds", Int, "10", "Heat observation window for dynamic MEMORY replication"),
    not_implemented("dynamic_replication_max_memory_replicas", Int, "2", "Maximum MEMORY replicas allowed for one dynamically replicated key"),
    not_implemented("dynamic_replication_mode", Str, "off", "Dynamic MEMORY replica fanout mode: off, observe, or enforce"),
    not_implemented("enable_cxl", Bool, "false", "Whether to enable CXL memory support"),
    not_implemented("enable_disk_eviction", Bool, "true", "Enable disk eviction feature for storage backend (default: true)"),
    flag("enable_ha", Bool, "false", "Campaign for leadership through the HA backend; serve only while leading"),
    not_implemented("enable_kv_events", Bool, "false", "Enable RFC #1527 KV cache event publisher over ZMQ"),
    not_implemented("enable_metadata_cleanup_on_timeout", Bool, "false", "Enable cleanup of HTTP metadata (mooncake/ram/*, mooncake/rpc_meta/..."),
    not_implemented("enable_multi_tenants", Bool, "false", "Enable strict multi-tenant namespace and quota admission"),
    not_implemented("enable_offload", Bool, "false", "Enable offload availability"),
    not_implemented("enable_oplog", Bool, "false", "Enable HA metadata replication through batch-record OpLog"),
    not_implemented("enable_snapshot", Bool, "false", "Enable periodic snapshot of master data"),
    not_implemented("enable_snapshot_restore", Bool, "false", "enable restore from snapshot"),
    flag("etcd_endpoints", Str, "", "HA backend endpoints, separated by semicolon (etcd, or redis://host:port)"),
    not_implemented("global_file_segment_size", Int, "9223372036854775807", "Size of global NFS/3FS segment in bytes"),
    flag("ha_backend_connstring", Str, "", "HA backend connection string; if unset, --etcd_endpoints is used"),
    flag("ha_backend_type", Str, "etcd", "HA backend type: etcd or redis"),
    not_implemented("kv_events_additional_salt", Str, "", "Deprecated: not emitted on events; use indexer POST /register"),
    not_implemented("kv_events_backend_id", Str, "", "backend_id for published KV events (cache owner identity)"),
    not_implemented("kv_events_bind_endpoint", Str, "", "ZMQ PUB bind endpoint for KV events, e.g. tcp://0.0.0.0:5557"),
    not_implemented("kv_events_block_size", Int, "0", "Deprecated: not emitted on events; use indexer POST /register"),
    not_implemented("kv_events_dp_rank", Int, "0", "Deprecated: not emitted on events; use indexer POST /register"),
    not_implemented("kv_events_emit_legacy_compat", Bool, "true", "Include vLLM/SGLang-compatible type/block_hashes fields"),
    not_implemented("kv_events_emit_object_key", Bool, "true", "Include Mooncake object_key in published KV events"),
    not_implemented("kv_events_lora_name", Str, "", "Deprecated: not emitted on events (no LoRA context in master)"),
    not_implemented("kv_events_model_name", Str, "", "Deprecated: not emitted on events; use indexer POST /register"),
    not_implemented("kv_events_queue_capacity", Int, "65536", "Maximum pending KV events; oldest events are dropped when the queue..."),
    not_implemented("kv_events_tenant_id", Str, "default", "Deprecated: tenant_id comes from each object on events"),
    not_implemented("max_kv_soft_pin_ttl", Str, "86400000", "Maximum request-level soft pin TTL for kv objects. Supports raw mil..."),
    not_implemented("max_retry_attempts", Int, "10", "Maximum number of retry attempts for failed tasks"),
    flag("max_total_finished_tasks", Int, "10000", "Maximum number of finished tasks to keep in memory"),
    flag("max_total_pending_tasks", Int, "10000", "Maximum number of pending tasks to keep in memory"),
    flag("max_total_processing_tasks", Int, "10000", "Maximum number of processing tasks to keep in memory"),
    not_implemented("nof_eviction_high_watermark_ratio", Float, "0.9", "Ratio of high watermark trigger eviction in NoF SSD"),
    not_implemented("nof_eviction_ratio", Float, "0.05", "Ratio of objects to evict when NoF SSD space is full"),
    not_implemented("nof_heartbeat_failures_threshold", Int, "3", "Consecutive NoF heartbeat failures required before unmounting a NoF..."),
    not_implemented("nof_heartbeat_interval_sec", Int, "10", "How often master probes each mounted NoF segment"),
    not_implemented("nof_heartbeat_probe_timeout_ms", Int, "1000", "Timeout in milliseconds for a single NoF heartbeat probe"),
    not_implemented("offload_cap_ratio", Float, "0.5", "Per-cycle offload cap as a fraction of offloading_queue_limit. Cont..."),
    not_implemented("offload_force_evict", Bool, "false", "Force-evict objects exceeding offload cap without disk offload"),
    not_implemented("offload_on_evict", Bool, "false", "Defer LOCAL_DISK offload to eviction time instead of PutEnd"),
    not_implemented("offloading_queue_limit", Int, "50000", "Maximum number of objects allowed in the offloading queue per local..."),
    not_implemented("oplog_batch_max_entries", Int, "1024", "Maximum number of committed/reserved entries in the open batch-reco..."),
    not_implemented("oplog_poll_interval_ms", Int, "1000", "Batch-record standby poll interval."),
    flag("pending_task_timeout_sec", Int, "300", "Timeout in seconds for pending tasks (0 = no timeout)"),
    not_implemented("pod_name", Str, "", "Pod name for K8s label-based routing (default: $POD_NAME)"),
    not_implemented("pod_namespace", Str, "", "Pod namespace for K8s label-based routing (default: $POD_NAMESPACE)"),
    flag("processing_task_timeout_sec", Int, "300", "Timeout in seconds for processing tasks (0 = no timeout)"),
    not_implemented("promotion_admission_threshold", Int, "2", "Min CountMinSketch count for a key before promotion fires (set 1 to..."),
    not_implemented("promotion_max_per_heartbeat", Int, "1", "Max promotion tasks returned to a single client per PromotionObject..."),
    not_implemented("promotion_on_hit", Bool, "false", "Promote LOCAL_DISK-only keys to MEMORY on read access (mirror of of..."),
    not_implemented("promotion_queue_limit", Int, "50000", "Max in-flight promotion tasks across all shards"),
    not_implemented("quota_bytes", Int, "0", "Quota for storage backend in bytes (0 = use default 90% of capacity)"),
    not_implemented("root_fs_dir", Str, "", "Root directory for storage backend, used in HA mode"),
    not_implemented("rpc_interface", Str, "", "Network interface name for RPC server address resolution. When set,..."),
    not_implemented("snapshot_backup_dir", Str, "", "Optional local directory for snapshot and restore backup. If empty,..."),
    not_implemented("snapshot_catalog_backend_connstring", Str, "", "Deprecated alias of --snapshot_catalog_store_connstring"),
    not_implemented("snapshot_catalog_backend_type", Str, "", "Deprecated alias of --snapshot_catalog_store_type"),
    not_implemented("snapshot_catalog_store_connstring", Str, "", "Optional connection string for snapshot catalog store"),
    not_implemented("snapshot_catalog_store_type", Str, "", "Snapshot catalog store type: ''/'embedded' or 'redis' ('payload' is..."),
    not_implemented("snapshot_child_timeout_seconds", Int, "300", "Timeout for snapshot child process in seconds"),
    not_implemented("snapshot_interval_seconds", Int, "600", "Interval in second between periodic snapshots of master data"),
    not_implemented("snapshot_object_store_type", Str, "", "Snapshot object store type: 'local' for local filesystem, 's3' for..."),
    not_implemented("snapshot_payload_backend_type", Str, "", "Deprecated alias of --snapshot_object_store_type"),
    not_implemented("snapshot_payload_store_type", Str, "", "Deprecated alias of --snapshot_object_store_type"),
    not_implemented("snapshot_retention_count", Int, "2", "Number of recent snapshots to keep (older snapshots will be automat..."),
    not_implemented("snapshot_backend_type", Str, "local", "Snapshot backend: local or s3 (older spelling)"),
    not_implemented("tenant_quota_connector_type", Str, "file", "Tenant quota policy connector type"),
    not_implemented("tenant_quota_connector_uri", Str, "", "Tenant quota policy connector URI"),
    not_implemented("mmap_arena_pool_size", Int, "8589934592", "Arena allocator pool size in bytes"),
    not_implemented("use_mmap_arena_allocator", Bool, "false", "Enable the lock-free mmap arena allocator for mmap buffers"),
    ignored("alsologtoemail", Str, "", "log messages go to these email addresses in addition to logfiles"),
    ignored("alsologtostderr", Bool, "false", "log messages go to stderr in addition to logfiles"),
    ignored("colorlogtostderr", Bool, "false", "color messages logged to stderr (if supported by terminal)"),
    ignored("drop_log_memory", Bool, "true", "Drop in-memory buffers of log contents. Logs can grow very quickly..."),
    ignored("log_backtrace_at", Str, "", "Emit a backtrace when logging at file:linenum."),
    ignored("log_dir", Str, "", "If specified, logfiles are written into this directory instead of t..."),
    ignored("log_link", Str, "", "Put additional links to the log files in this directory"),
    ignored("log_prefix", Bool, "true", "Prepend the log prefix to the start of each log line"),
    ignored("logbuflevel", Int, "0", "Buffer log messages logged at this level or lower (-1 means don't b..."),
    ignored("logbufsecs", Int, "30", "Buffer log messages for at most this many seconds"),
    ignored("logemaillevel", Int, "999", "Email log messages logged at this level or higher (0 means email al..."),
    ignored("logfile_mode", Int, "436", "Log file mode/permissions."),
    ignored("logmailer", Str, "/bin/mail", "Mailer used to send logging email"),
    ignored("logtostderr", Bool, "false", "log messages go to stderr instead of logfiles"),
    ignored("max_log_size", Int, "1800", "approx. maximum log file size (in MB). A value of 0 will be silentl..."),
    ignored("minloglevel", Int, "0", "Messages logged at a lower level than this don't actually get logge..."),
    ignored("stderrthreshold", Int, "2", "log messages at or above this level are copied to stderr in additio..."),
    ignored("stop_logging_if_full_disk", Bool, "false", "Stop attempting to log to disk if the disk is full."),
    ignored("symbolize_stacktrace", Bool, "true", "Symbolize the stack trace in the tombstone"),
    ignored("v", Int, "0", "Show all VLOG(m) messages for m <= this. Overridable by --vmodule."),
    ignored("vmodule", Str, "", "per-module verbose level. Argument is a comma-separated list of <mo..."),
];

/// Names of the boolean flags, for `gflags::normalize`.
pub fn bool_flag_names() -> Vec<&'static str> {
    FLAGS
        .iter()
        .filter(|f| f.kind == Bool)
        .map(|f| f.name)
        .collect()
}

/// Master settings. `Default` gives the reference's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct MasterConfig {
    /// 0 = use `port`.
    pub rpc_port: u16,
    pub port: u16,
    pub rpc_address: String,
    /// 0 = min(max_threads, cores).
    pub rpc_thread_num: usize,
    pub max_threads: usize,
    /// Idle connection timeout; `None` = never close.
    pub rpc_conn_timeout: Option<Duration>,
    pub rpc_enable_tcp_no_delay: bool,
    pub enable_http_metadata_server: bool,
    pub http_metadata_server_host: String,
    pub http_metadata_server_port: u16,
    pub metrics_host: String,
    pub metrics_port: u16,
    pub enable_metric_reporting: bool,
    pub metric_report_interval: Duration,
    pub default_kv_lease_ttl: Duration,
    pub default_kv_soft_pin_ttl: Duration,
    pub allow_evict_soft_pinned_objects: bool,
    pub eviction_ratio: f64,
    pub eviction_high_watermark_ratio: f64,
    pub client_ttl: Duration,
    pub put_start_discard_timeout: Duration,
    pub put_start_release_timeout: Duration,
    pub cluster_id: String,
    pub allocation_strategy: AllocationStrategy,
    pub log_level: String,
    pub max_total_finished_tasks: usize,
    pub max_total_pending_tasks: usize,
    pub max_total_processing_tasks: usize,
    /// `None` = no timeout.
    pub pending_task_timeout: Option<Duration>,
    pub processing_task_timeout: Option<Duration>,
    /// Leader election (`--enable_ha`) and where it runs.
    pub enable_ha: bool,
    pub etcd_endpoints: String,
    pub ha_backend_type: String,
    pub ha_backend_connstring: String,
    /// Flags accepted for compatibility whose feature is not implemented,
    /// set to a non-default value: `(name, value)`; the server logs them.
    pub unsupported: Vec<(String, String)>,
}

impl Default for MasterConfig {
    fn default() -> Self {
        let mut c = MasterConfig {
            rpc_port: 0,
            port: 0,
            rpc_address: String::new(),
            rpc_thread_num: 0,
            max_threads: 0,
            rpc_conn_timeout: None,
            rpc_enable_tcp_no_delay: true,
            enable_http_metadata_server: false,
            http_metadata_server_host: String::new(),
            http_metadata_server_port: 0,
            metrics_host: String::new(),
            metrics_port: 0,
            enable_metric_reporting: true,
            metric_report_interval: Duration::from_secs(10),
            default_kv_lease_ttl: Duration::ZERO,
            default_kv_soft_pin_ttl: Duration::ZERO,
            allow_evict_soft_pinned_objects: true,
            eviction_ratio: 0.0,
            eviction_high_watermark_ratio: 0.0,
            client_ttl: Duration::ZERO,
            put_start_discard_timeout: Duration::ZERO,
            put_start_release_timeout: Duration::ZERO,
            cluster_id: String::new(),
            allocation_strategy: AllocationStrategy::Random,
            log_level: String::new(),
            max_total_finished_tasks: 0,
            max_total_pending_tasks: 0,
            max_total_processing_tasks: 0,
            pending_task_timeout: None,
            processing_task_timeout: None,
            enable_ha: false,
            etcd_endpoints: String::new(),
            ha_backend_type: String::new(),
            ha_backend_connstring: String::new(),
            unsupported: Vec::new(),
        };
        for f in FLAGS {
            c.set(f.name, f.default).expect("flag defaults parse");
        }
        c.unsupported.clear();
        c
    }
}

fn invalid(name: &str, value: &str, why: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorCode::INVALID_PARAMS,
        format!("invalid value {value:?} for {name}: {why}"),
    )
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
        let bool_ = || parse_bool(v).map_err(|e| invalid(name, value, e));
        let int = || v.parse::<u64>().map_err(|e| invalid(name, value, e));
        let any_int = || v.parse::<i64>().map_err(|e| invalid(name, value, e));
        let float = || v.parse::<f64>().map_err(|e| invalid(name, value, e));
        let port = || v.parse::<u16>().map_err(|e| invalid(name, value, e));
        let ms = || {
            parse_duration(v, Duration::from_millis(1)).map_err(|e| invalid(name, value, e.context))
        };
        let secs = || {
            parse_duration(v, Duration::from_secs(1)).map_err(|e| invalid(name, value, e.context))
        };
        let ratio = || -> Result<f64> {
            let r: f64 = v.parse().map_err(|e| invalid(name, value, e))?;
            if !(0.0..=1.0).contains(&r) {
                return Err(invalid(name, value, "must be between 0 and 1"));
            }
            Ok(r)
        };
        match name {
            "rpc_port" => self.rpc_port = port()?,
            "port" => self.port = port()?,
            "rpc_address" => self.rpc_address = v.to_string(),
            "rpc_thread_num" => self.rpc_thread_num = int()? as usize,
            "max_threads" => self.max_threads = int()? as usize,
            "rpc_conn_timeout_seconds" => {
                let d = secs()?;
                self.rpc_conn_timeout = (!d.is_zero()).then_some(d);
            }
            "rpc_enable_tcp_no_delay" => self.rpc_enable_tcp_no_delay = bool_()?,
            "enable_http_metadata_server" => self.enable_http_metadata_server = bool_()?,
            "http_metadata_server_host" => self.http_metadata_server_host = v.to_string(),
            "http_metadata_server_port" => self.http_metadata_server_port = port()?,
            "metrics_host" => self.metrics_host = v.to_string(),
            "metrics_port" => self.metrics_port = port()?,
            "enable_metric_reporting" => self.enable_metric_reporting = bool_()?,
            "default_kv_lease_ttl" => self.default_kv_lease_ttl = ms()?,
            "default_kv_soft_pin_ttl" => self.default_kv_soft_pin_ttl = ms()?,
            "allow_evict_soft_pinned_objects" => self.allow_evict_soft_pinned_objects = bool_()?,
            "eviction_ratio" => self.eviction_ratio = ratio()?,
            "eviction_high_watermark_ratio" => self.eviction_high_watermark_ratio = ratio()?,
            "client_ttl" => {
                let d = secs()?;
                if d.is_zero() {
                    return Err(invalid(name, value, "must be positive"));
                }
                self.client_ttl = d;
            }
            "put_start_discard_timeout_sec" => self.put_start_discard_timeout = secs()?,
            "put_start_release_timeout_sec" => self.put_start_release_timeout = secs()?,
            "cluster_id" => self.cluster_id = v.to_string(),
            "allocation_strategy" => self.allocation_strategy = AllocationStrategy::parse(v)?,
            "memory_allocator" => {
                if v != "offset" {
                    return Err(invalid(
                        name,
                        value,
                        "only the offset allocator is available",
                    ));
                }
            }
            "log_level" => self.log_level = v.to_string(),
            "max_total_finished_tasks" => self.max_total_finished_tasks = int()? as usize,
            "max_total_pending_tasks" => self.max_total_pending_tasks = int()? as usize,
            "max_total_processing_tasks" => self.max_total_processing_tasks = int()? as usize,
            "pending_task_timeout_sec" => {
                let d = secs()?;
                self.pending_task_timeout = (!d.is_zero()).then_some(d);
            }
            "processing_task_timeout_sec" => {
                let d = secs()?;
                self.processing_task_timeout = (!d.is_zero()).then_some(d);
            }
            "enable_ha" => self.enable_ha = bool_()?,
            "etcd_endpoints" => self.etcd_endpoints = v.to_string(),
            "ha_backend_type" => {
                if !matches!(v, "etcd" | "redis") {
                    return Err(invalid(name, value, "HA backends are etcd and redis"));
                }
                self.ha_backend_type = v.to_string();
            }
            "ha_backend_connstring" => self.ha_backend_connstring = v.to_string(),
            // Read by `load`; meaningless inside a file.
            "config_path" => {}
            _ => {
                // Accepted for compatibility: check the value's form and note it.
                let is_default = match flag.kind {
                    Bool => bool_()? == parse_bool(flag.default).unwrap_or(false),
                    Int => any_int()? == flag.default.parse::<i64>().unwrap_or(0),
                    Float => float()? == flag.default.parse::<f64>().unwrap_or(0.0),
                    FlagKind::Size => {
                        parse_size(v).map_err(|e| invalid(name, value, e.context))?
                            == parse_size(flag.default)?
                    }
                    Str | Dur => v == flag.default,
                };
                debug_assert!(flag.support != Support::Full, "flag {name} has no setter");
                self.unsupported.retain(|(n, _)| n != name);
                if !is_default && flag.support == Support::NotImplemented {
                    self.unsupported.push((name.to_string(), v.to_string()));
                }
            }
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
    pub fn ha_backend(&self) -> Result<crate::ha::Backend> {
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

    /// The port the RPC service listens on (`rpc_port`, or `port` when it is 0).
    pub fn rpc_listen_port(&self) -> u16 {
        if self.rpc_port != 0 {
            self.rpc_port
        } else {
            self.port
        }
    }

    /// Task limits and timeouts for the state machine.
    pub fn task_policy(&self) -> super::tasks::TaskPolicy {
        let ms = |d: Option<Duration>| d.map_or(0, |d| d.as_millis() as u64);
        super::tasks::TaskPolicy {
            max_pending: self.max_total_pending_tasks,
            max_processing: self.max_total_processing_tasks,
            max_finished: self.max_total_finished_tasks,
            pending_timeout: ms(self.pending_task_timeout),
            processing_timeout: ms(self.processing_task_timeout),
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
        c.set("enable_snapshot", "false").unwrap();
        c.set("snapshot_retention_count", "2").unwrap();
        assert!(c.unsupported.is_empty());
        c.set("enable_snapshot", "true").unwrap();
        c.set("enable_snapshot", "1").unwrap();
        assert_eq!(
            c.unsupported,
            [("enable_snapshot".to_string(), "1".to_string())]
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
