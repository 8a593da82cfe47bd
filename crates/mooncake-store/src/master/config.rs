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

/// One `mooncake_master` flag.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    pub name: &'static str,
    pub kind: FlagKind,
    pub default: &'static str,
    pub help: &'static str,
    /// Accepted for compatibility, but the feature is not implemented yet.
    pub unsupported: bool,
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
        unsupported: false,
    }
}

const fn later(
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
        unsupported: true,
    }
}

use FlagKind::{Bool, Duration as Dur, Float, Int, Size, Str};

/// Every flag the master accepts, in `--help` order.
pub const FLAGS: &[Flag] = &[
    flag("rpc_port", Int, "50051", "Port of the RPC service"),
    flag(
        "rpc_address",
        Str,
        "0.0.0.0",
        "Address the RPC service binds",
    ),
    flag(
        "rpc_thread_num",
        Int,
        "0",
        "RPC worker threads (0 = one per core)",
    ),
    flag(
        "rpc_conn_timeout_seconds",
        Int,
        "0",
        "Close idle client connections after this many seconds (0 = never)",
    ),
    flag(
        "rpc_enable_tcp_no_delay",
        Bool,
        "true",
        "Set TCP_NODELAY on client connections",
    ),
    flag(
        "enable_http_metadata_server",
        Bool,
        "false",
        "Run the transfer-engine HTTP metadata server in the master",
    ),
    flag(
        "http_metadata_server_host",
        Str,
        "0.0.0.0",
        "Host of the embedded HTTP metadata server",
    ),
    flag(
        "http_metadata_server_port",
        Int,
        "8080",
        "Port of the embedded HTTP metadata server",
    ),
    flag(
        "metrics_port",
        Int,
        "9003",
        "Port of the HTTP metrics and query service",
    ),
    flag(
        "enable_metric_reporting",
        Bool,
        "true",
        "Log a metrics summary periodically",
    ),
    flag(
        "metric_report_interval",
        Dur,
        "10",
        "Seconds between metrics summaries in the log",
    ),
    flag(
        "default_kv_lease_ttl",
        Dur,
        "5000",
        "Read lease granted on every get, ms (or 5s, 1m)",
    ),
    flag(
        "default_kv_soft_pin_ttl",
        Dur,
        "1800000",
        "Soft pin lifetime after the last access, ms",
    ),
    flag(
        "allow_evict_soft_pinned_objects",
        Bool,
        "true",
        "Evict soft-pinned objects when nothing else is left",
    ),
    flag(
        "eviction_ratio",
        Float,
        "0.05",
        "Share of capacity freed by one eviction round",
    ),
    flag(
        "eviction_high_watermark_ratio",
        Float,
        "0.95",
        "Usage ratio that starts eviction",
    ),
    flag(
        "client_ttl",
        Dur,
        "10",
        "Seconds without heartbeat before a client is dropped",
    ),
    flag(
        "put_start_discard_timeout_sec",
        Dur,
        "30",
        "Seconds after which an unfinished put is discarded",
    ),
    flag(
        "put_start_release_timeout_sec",
        Dur,
        "600",
        "Seconds after PutStart before a discarded put's space is reused",
    ),
    flag(
        "cluster_id",
        Str,
        "mooncake_cluster",
        "Cluster id (HA keys, metadata prefixes)",
    ),
    flag(
        "allocation_strategy",
        Str,
        "random",
        "Replica placement: random or free_ratio_first",
    ),
    flag(
        "memory_allocator",
        Str,
        "offset",
        "Segment allocator (offset)",
    ),
    flag(
        "log_level",
        Str,
        "info",
        "Log level: trace, debug, info, warn, error",
    ),
    flag(
        "config_path",
        Str,
        "",
        "YAML or JSON file with the same keys as these flags",
    ),
    later(
        "enable_ha",
        Bool,
        "false",
        "High availability with leader election (not supported yet)",
    ),
    later(
        "etcd_endpoints",
        Str,
        "",
        "HA coordination endpoints, ';'-separated (not supported yet)",
    ),
    later(
        "ha_backend_type",
        Str,
        "etcd",
        "HA backend: etcd, redis, k8s (not supported yet)",
    ),
    later(
        "enable_snapshot",
        Bool,
        "false",
        "Periodic metadata snapshots (not supported yet)",
    ),
    later(
        "snapshot_interval_seconds",
        Int,
        "600",
        "Seconds between snapshots (not supported yet)",
    ),
    later(
        "snapshot_retention_count",
        Int,
        "2",
        "Snapshots kept (not supported yet)",
    ),
    later(
        "snapshot_backend_type",
        Str,
        "local",
        "Snapshot backend: local or s3 (not supported yet)",
    ),
    later(
        "snapshot_backup_dir",
        Str,
        "",
        "Local copy of restored snapshots (not supported yet)",
    ),
    later(
        "enable_snapshot_restore",
        Bool,
        "false",
        "Restore metadata from the latest snapshot (not supported yet)",
    ),
    later(
        "enable_offload",
        Bool,
        "false",
        "SSD offload tier (not supported yet)",
    ),
    later(
        "root_fs_dir",
        Str,
        "",
        "Shared file-system root for disk replicas (not supported yet)",
    ),
    later(
        "global_file_segment_size",
        Size,
        "9223372036854775807",
        "Disk space for disk replicas (not supported yet)",
    ),
    later(
        "max_total_finished_tasks",
        Int,
        "10000",
        "Copy/move tasks kept after finishing (not supported yet)",
    ),
    later(
        "max_total_pending_tasks",
        Int,
        "10000",
        "Copy/move tasks waiting (not supported yet)",
    ),
    later(
        "max_total_processing_tasks",
        Int,
        "10000",
        "Copy/move tasks running (not supported yet)",
    ),
    later(
        "max_retry_attempts",
        Int,
        "10",
        "Retries of a failed task (not supported yet)",
    ),
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
    pub rpc_port: u16,
    pub rpc_address: String,
    /// 0 = one worker per core.
    pub rpc_thread_num: usize,
    /// Idle connection timeout; `None` = never close.
    pub rpc_conn_timeout: Option<Duration>,
    pub rpc_enable_tcp_no_delay: bool,
    pub enable_http_metadata_server: bool,
    pub http_metadata_server_host: String,
    pub http_metadata_server_port: u16,
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
    /// Flags accepted for compatibility whose feature is not implemented,
    /// set to a non-default value: `(name, value)`; the server logs them.
    pub unsupported: Vec<(String, String)>,
}

impl Default for MasterConfig {
    fn default() -> Self {
        let mut c = MasterConfig {
            rpc_port: 0,
            rpc_address: String::new(),
            rpc_thread_num: 0,
            rpc_conn_timeout: None,
            rpc_enable_tcp_no_delay: true,
            enable_http_metadata_server: false,
            http_metadata_server_host: String::new(),
            http_metadata_server_port: 0,
            metrics_port: 0,
            enable_metric_reporting: true,
            metric_report_interval: Duration::ZERO,
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
            "rpc_address" => self.rpc_address = v.to_string(),
            "rpc_thread_num" => self.rpc_thread_num = int()? as usize,
            "rpc_conn_timeout_seconds" => {
                let d = secs()?;
                self.rpc_conn_timeout = (!d.is_zero()).then_some(d);
            }
            "rpc_enable_tcp_no_delay" => self.rpc_enable_tcp_no_delay = bool_()?,
            "enable_http_metadata_server" => self.enable_http_metadata_server = bool_()?,
            "http_metadata_server_host" => self.http_metadata_server_host = v.to_string(),
            "http_metadata_server_port" => self.http_metadata_server_port = port()?,
            "metrics_port" => self.metrics_port = port()?,
            "enable_metric_reporting" => self.enable_metric_reporting = bool_()?,
            "metric_report_interval" => self.metric_report_interval = secs()?,
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
            // Read by `load`; meaningless inside a file.
            "config_path" => {}
            _ => {
                // Accepted for compatibility: check the value's form and note it.
                match flag.kind {
                    Bool => drop(bool_()?),
                    Int => drop(int()?),
                    Size => drop(parse_size(v).map_err(|e| invalid(name, value, e.context))?),
                    Float | Str | Dur => {}
                }
                debug_assert!(flag.unsupported, "flag {name} has no setter");
                let is_default = v == flag.default
                    || (flag.kind == Bool && bool_()? == parse_bool(flag.default).unwrap());
                self.unsupported.retain(|(n, _)| n != name);
                if !is_default {
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
        Ok(())
    }

    /// Time values in milliseconds, as the state machine uses them.
    pub fn lease_ttl_ms(&self) -> u64 {
        self.default_kv_lease_ttl.as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_reference() {
        let c = MasterConfig::default();
        assert_eq!(c.rpc_port, 50051);
        assert_eq!(c.metrics_port, 9003);
        assert_eq!(c.default_kv_lease_ttl, Duration::from_millis(5000));
        assert_eq!(c.default_kv_soft_pin_ttl, Duration::from_secs(1800));
        assert_eq!(c.client_ttl, Duration::from_secs(10));
        assert_eq!(c.eviction_ratio, 0.05);
        assert_eq!(c.eviction_high_watermark_ratio, 0.95);
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
        c.set("enable_ha", "false").unwrap();
        c.set("snapshot_retention_count", "2").unwrap();
        assert!(c.unsupported.is_empty());
        c.set("enable_ha", "true").unwrap();
        c.set("enable_ha", "1").unwrap();
        assert_eq!(c.unsupported, [("enable_ha".to_string(), "1".to_string())]);
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
