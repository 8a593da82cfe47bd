//! `MasterConfig`: every `mooncake_master` flag with the reference's default.
//!
//! Each flag is declared once, as one row of the table in [`flags`] (name,
//! kind, default, what it does and, when implemented, the field it sets
//! and how its value is parsed), in the module of its concern; the flag
//! list for `--help`, the struct, its `Default` and [`MasterConfig::set`]
//! are generated from it.
//!
//! Flags and config files share one path: each setting is a `(name, value)`
//! pair applied with [`MasterConfig::set`], so `--client_ttl=5s` and
//! `client_ttl: 5s` in a YAML or JSON file mean the same. Precedence:
//! defaults, then `--config_path`, then command-line flags.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mooncake_common::gflags::parse_bool;
use mooncake_common::size::parse_size;
use mooncake_common::{Error, ErrorCode, Result};

use self::policy::{FilePolicy, HotKeyPolicy, LeasePolicy, OffloadPolicy, Policy, TaskPolicy};
use self::tenant_quotas::PolicyStore;
use parse::invalid;

mod flags;
pub(in crate::master) mod leader_label;
mod parse;
pub(in crate::master) mod policy;
pub(crate) mod tenant_quotas;

pub use flags::{bool_flag_names, Flag, FlagKind, MasterConfig, Support, FLAGS};

/// Where a cluster's snapshots go under the local path or the S3 prefix, as
/// the reference lays them out.
pub(crate) const SNAPSHOT_DIR: &str = "mooncake_master_snapshot";

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
        // The environment's spelling of `--put_fence=false`, under the
        // config file and the flags.
        if std::env::var("MC_PUT_FENCE").as_deref() == Ok("0") {
            c.put_fence = false;
        }
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
        if self.enable_kv_events {
            // The reference logs these and publishes nothing; a router
            // waiting for events is better told at start.
            for (flag, value) in [
                ("kv_events_bind_endpoint", &self.kv_events_bind_endpoint),
                ("kv_events_backend_id", &self.kv_events_backend_id),
            ] {
                if value.trim().is_empty() {
                    return Err(Error::new(
                        ErrorCode::INVALID_PARAMS,
                        format!("--enable_kv_events needs --{flag}"),
                    ));
                }
            }
        }
        if self.enable_multi_tenants {
            self.tenant_policies()?;
        }
        if self.enable_ha {
            self.ha_backend()?;
            self::leader_label::pod(self)?;
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

    /// Where multi-tenancy's quota policies live (`tenant_quotas`).
    pub(crate) fn tenant_policy_store(&self) -> Result<PolicyStore> {
        PolicyStore::new(
            &self.tenant_quota_connector_type,
            &self.tenant_quota_connector_uri,
            &self.cluster_id,
        )
    }

    /// The quota policies the connector holds; a missing or bad file, or
    /// an etcd that does not answer, stops the start, as the reference's
    /// does.
    pub(crate) fn tenant_policies(&self) -> Result<(PolicyStore, crate::tenant::Policies)> {
        let store = self.tenant_policy_store()?;
        let policies = store.load()?;
        Ok((store, policies))
    }

    /// The coordination service of HA mode: `--ha_backend_connstring`, else
    /// `--etcd_endpoints`; a `redis://` address means redis whatever
    /// `--ha_backend_type` says, as in the reference's deployment guide.
    /// The k8s backend takes `<namespace>/<lease>` from
    /// `--ha_backend_connstring` only, as the reference does.
    pub fn ha_backend(&self) -> Result<crate::ha::ElectionBackend> {
        if self.ha_backend_type == "k8s" {
            if self.ha_backend_connstring.trim().is_empty() {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    "--ha_backend_type=k8s needs --ha_backend_connstring=<namespace>/<lease>",
                ));
            }
            return crate::ha::ElectionBackend::k8s(
                &self.ha_backend_connstring,
                self.k8s_timings(),
            );
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
        crate::ha::ElectionBackend::parse(conn, self.ha_backend_type == "redis")
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

    /// This master's log directory: `--wal_dir`, else
    /// `$MOONCAKE_SNAPSHOT_LOCAL_PATH/mooncake_master_wal/<cluster_id>`, and
    /// `/<rpc_address>_<rpc_port>` under it in HA mode, where the masters
    /// of a cluster may share the variable. `None`: no log on disk.
    pub fn log_dir(&self) -> Option<PathBuf> {
        self.log_dir_under(snapshot_local_path())
    }

    /// [`log_dir`](Self::log_dir) with `root` for the variable.
    fn log_dir_under(&self, root: Option<PathBuf>) -> Option<PathBuf> {
        if !self.wal_dir.is_empty() {
            return Some(PathBuf::from(&self.wal_dir));
        }
        let dir = root?.join("mooncake_master_wal").join(&self.cluster_id);
        if !self.enable_ha {
            return Some(dir);
        }
        let me = format!("{}_{}", self.rpc_address, self.rpc_listen_port()).replace(
            |c: char| !c.is_ascii_alphanumeric() && c != '.' && c != '_',
            "_",
        );
        Some(dir.join(me))
    }

    /// Where local snapshots go:
    /// `$MOONCAKE_SNAPSHOT_LOCAL_PATH/mooncake_master_snapshot/<cluster_id>`,
    /// as the reference lays it out. `None`: the variable is not set.
    pub fn local_snapshot_dir(&self) -> Option<PathBuf> {
        Some(
            snapshot_local_path()?
                .join(SNAPSHOT_DIR)
                .join(&self.cluster_id),
        )
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
    /// Silence after which a client is Suspected, ms (0: never).
    pub fn suspect_after(&self) -> u64 {
        ms(self.client_suspect)
    }

    /// How long a newly mounted segment's placement weight ramps, ms.
    pub fn segment_ramp(&self) -> u64 {
        ms(self.segment_ramp)
    }

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
            eviction_policy: self.eviction_policy,
            strategy: self.allocation_strategy,
            put_fence: self.put_fence,
        }
    }

    /// The SSD tier's rules.
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
            promote_round_ms: OffloadPolicy::default().promote_round_ms,
            promote_limit: self.promotion_queue_limit,
        }
    }

    /// Hot-key fan-out; a window or replica cap of 0 counts as 1, as in
    /// the reference.
    pub fn hot_key_policy(&self) -> HotKeyPolicy {
        HotKeyPolicy {
            mode: self.dynamic_replication_mode,
            window_ms: self.dynamic_replication_heat_window_seconds.max(1) * 1000,
            qps_threshold: self.dynamic_replication_admission_qps_threshold,
            max_memory_replicas: self.dynamic_replication_max_memory_replicas.max(1),
        }
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

/// `$MOONCAKE_SNAPSHOT_LOCAL_PATH` when set and not empty: the root of the
/// local snapshots and of the default log directory, read here only.
fn snapshot_local_path() -> Option<PathBuf> {
    std::env::var_os("MOONCAKE_SNAPSHOT_LOCAL_PATH")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::policy::AllocationStrategy;
    use super::*;

    #[test]
    fn one_log_directory_per_master_in_ha_mode() {
        let root = || Some(PathBuf::from("/snap"));
        let mut c = MasterConfig::default();
        c.set("cluster_id", "c1").unwrap();
        assert_eq!(c.log_dir_under(None), None);
        assert_eq!(
            c.log_dir_under(root()),
            Some(PathBuf::from("/snap/mooncake_master_wal/c1"))
        );
        for (k, v) in [
            ("enable_ha", "true"),
            ("rpc_address", "10.0.0.1"),
            ("rpc_port", "5005"),
        ] {
            c.set(k, v).unwrap();
        }
        assert_eq!(
            c.log_dir_under(root()),
            Some(PathBuf::from("/snap/mooncake_master_wal/c1/10.0.0.1_5005"))
        );
        c.set("wal_dir", "/wal").unwrap();
        assert_eq!(c.log_dir_under(root()), Some(PathBuf::from("/wal")));
    }

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
    fn the_put_fence_is_a_policy_the_flag_sets() {
        assert!(MasterConfig::default().policy().put_fence);
        let c = MasterConfig::from_settings([("put_fence", "false")]).unwrap();
        assert!(!c.policy().put_fence);
    }

    #[test]
    fn the_eviction_policy_is_frequency_unless_asked() {
        use super::policy::EvictionPolicy;
        let p = MasterConfig::default().policy().eviction_policy;
        assert_eq!(p, EvictionPolicy::Frequency);
        let c = MasterConfig::from_settings([("eviction_policy", "lru")]).unwrap();
        assert_eq!(c.policy().eviction_policy, EvictionPolicy::Lru);
        for p in [EvictionPolicy::Lru, EvictionPolicy::Frequency] {
            assert_eq!(EvictionPolicy::parse(p.as_str()).unwrap(), p);
        }
        let e = MasterConfig::from_settings([("eviction_policy", "LRU")]).unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
    }

    #[test]
    fn a_takeover_without_record_is_off_unless_asked() {
        assert!(!MasterConfig::default().ha_allow_takeover_without_record);
        let c =
            MasterConfig::from_settings([("ha_allow_takeover_without_record", "true")]).unwrap();
        assert!(c.ha_allow_takeover_without_record);
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
        for (name, strategy) in [
            (
                "ssd_free_ratio_first",
                AllocationStrategy::SsdFreeRatioFirst,
            ),
            ("local_first", AllocationStrategy::LocalFirst),
        ] {
            c.set("allocation_strategy", name).unwrap();
            assert_eq!(c.allocation_strategy, strategy);
            assert_eq!(strategy.as_str(), name);
        }
        // Case-sensitive, as the reference's.
        assert!(c.set("allocation_strategy", "Local_First").is_err());
        c.set("allocation_strategy", "free_ratio_first").unwrap();
        // Idle client connections close after 5 minutes unless told
        // otherwise; 0 means never, as in the reference.
        assert_eq!(
            MasterConfig::default().rpc_conn_timeout,
            Some(Duration::from_secs(300))
        );
        c.set("rpc_conn_timeout_seconds", "0").unwrap();
        assert_eq!(c.rpc_conn_timeout, None);
        c.set("rpc_conn_timeout_seconds", "7").unwrap();
        assert_eq!(c.rpc_conn_timeout, Some(Duration::from_secs(7)));
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
        c.set("enable_cxl", "false").unwrap();
        c.set("global_file_segment_size", "9223372036854775807")
            .unwrap();
        assert!(c.unsupported.is_empty());
        c.set("enable_cxl", "true").unwrap();
        c.set("enable_cxl", "1").unwrap();
        assert_eq!(c.unsupported, [("enable_cxl".to_string(), "1".to_string())]);
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
