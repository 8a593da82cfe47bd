//! What a client needs to join a cluster, from arguments, a config dict
//! (JSON file or Python dict) or the `MOONCAKE_*` environment variables that
//! inference-engine integrations read.

use std::sync::Arc;
use std::time::Duration;

use mooncake_common::auth::ClusterToken;
use mooncake_common::gflags::parse_bool;
use mooncake_common::size::parse_size;
use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::EngineConfig;
use serde_json::Value;

use super::metrics::{self, ClientMetrics};
use super::slow_peers::HedgeConfig;
use crate::tier::TierConfig;

/// Default contributed segment (the reference's Python `setup` default).
pub const DEFAULT_GLOBAL_SEGMENT_SIZE: u64 = 16 << 20;
/// Default staging pool for put/get of plain bytes.
pub const DEFAULT_LOCAL_BUFFER_SIZE: u64 = 1 << 30;
pub const DEFAULT_MASTER_ADDRESS: &str = "127.0.0.1:50051";
pub const DEFAULT_METADATA_SERVER: &str = "http://127.0.0.1:8080/metadata";
pub use crate::master_client::DEFAULT_CLUSTER_ID;

/// Settings of an embedded ("real") client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    /// `host` or `host:port`; without a port one is picked in 12300..14300.
    pub local_hostname: String,
    /// Transfer-engine metadata: `P2PHANDSHAKE`, `http://…`, `etcd://…`, `redis://…`.
    pub metadata_server: String,
    /// Bytes this client contributes to the cluster; 0 makes a pure client.
    pub global_segment_size: u64,
    /// Registered staging pool for put/get of plain bytes; 0 makes a
    /// storage-only node whose byte puts and gets fail with a code.
    pub local_buffer_size: u64,
    /// `tcp` or `rdma`.
    pub protocol: String,
    /// NIC names for RDMA; ignored for tcp.
    pub device_name: String,
    /// `host:port` of the master, or an HA address (`etcd://h1:p1;h2:p2`,
    /// `redis://h:p`, `k8s://<namespace>/<lease>`) naming where the
    /// master's leader is published.
    pub master_server_address: String,
    /// With an HA master address, the cluster whose leader to follow.
    pub cluster_id: String,
    /// Copy with a plain memcpy when a replica lies in this process's own
    /// segment; off, those bytes go through the engine like any other.
    pub local_memcpy: bool,
    /// Runs an SSD tier next to the segment (`mooncake_client
    /// --enable_offload`, Python `enable_ssd_offload`), configured by the
    /// `MOONCAKE_OFFLOAD_*` variables.
    pub enable_offload: bool,
    /// The tier directory, instead of `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`
    /// (Python `ssd_offload_path`).
    pub offload_path: Option<String>,
    /// Presented to the master, the metadata server and peer engines
    /// (`None`: `$MOONCAKE_CLUSTER_TOKEN`, if set); see `docs/security.md`.
    pub cluster_token: Option<ClusterToken>,
    /// The tenant this client's objects belong to on a master in
    /// multi-tenant mode (`docs/tenants.md`); ignored by other masters.
    pub tenant_id: String,
    /// Segments and the local buffer on huge pages from the host's HugeTLB
    /// pool (`MC_STORE_USE_HUGEPAGE`, `MC_STORE_HUGEPAGE_SIZE`).
    pub huge_pages: HugePages,
}

/// Whether a client's memory comes from the HugeTLB pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HugePages {
    /// Ordinary pages (the default).
    #[default]
    Off,
    /// Huge pages of this many bytes; setup fails when the pool cannot
    /// hold the segment and the buffer (no quiet fall back, as the
    /// reference when asked for them).
    On(usize),
    /// `MC_STORE_HUGEPAGE_SIZE` named no size this host's pages come in:
    /// setup fails saying so.
    Invalid(String),
}

impl HugePages {
    /// The huge page size asked for, if any.
    pub fn size(&self) -> Option<usize> {
        match self {
            HugePages::On(n) => Some(*n),
            _ => None,
        }
    }
}

/// `MC_STORE_HUGEPAGE_SIZE`: `2MB` (the default) or `1GB` (also `2M`,
/// `2MiB`, `1G`, `1GiB` or the byte count), any case.
fn huge_page_size(v: &str) -> Option<usize> {
    let t = v.trim().to_ascii_uppercase();
    let n = match t.trim_end_matches('B').trim_end_matches('I') {
        "2M" => 2 << 20,
        "1G" => 1 << 30,
        other => other.parse().ok()?,
    };
    mooncake_transfer::HUGE_PAGE_SIZES.contains(&n).then_some(n)
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            local_hostname: "localhost".into(),
            metadata_server: DEFAULT_METADATA_SERVER.into(),
            global_segment_size: DEFAULT_GLOBAL_SEGMENT_SIZE,
            local_buffer_size: DEFAULT_LOCAL_BUFFER_SIZE,
            protocol: "tcp".into(),
            device_name: String::new(),
            master_server_address: DEFAULT_MASTER_ADDRESS.into(),
            cluster_id: DEFAULT_CLUSTER_ID.into(),
            local_memcpy: true,
            enable_offload: false,
            offload_path: None,
            cluster_token: None,
            tenant_id: crate::tenant::DEFAULT_TENANT.into(),
            huge_pages: HugePages::Off,
        }
    }
}

/// The process environment. Private, so that this module is the one place
/// the client reads it: every other client module takes what it needs from
/// the functions below.
fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `MC_STORE_CLUSTER_ID` when set and not empty: the HA cluster to follow,
/// and the `cluster_id` label of the client's metrics.
fn cluster_id_env(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    var("MC_STORE_CLUSTER_ID").filter(|id| !id.is_empty())
}

/// `config` as a client runs it: the process variables applied (see
/// [`ClientConfig::apply_env`]), `$MOONCAKE_CLUSTER_TOKEN` when it names no
/// token.
pub(crate) fn resolve(config: &ClientConfig) -> Result<ClientConfig> {
    let mut config = config.clone();
    config.apply_env(process_env);
    if config.cluster_token.is_none() {
        config.cluster_token = cluster_token()?;
    }
    Ok(config)
}

/// `$MOONCAKE_CLUSTER_TOKEN`, if set.
pub(crate) fn cluster_token() -> Result<Option<ClusterToken>> {
    ClusterToken::from_env_with(process_env)
}

/// A client's metrics as `MC_STORE_CLIENT_METRIC*` ask (`None`: off),
/// labelled with its mode (`real`, `dummy`) and `MC_STORE_CLUSTER_ID`.
pub(crate) fn client_metrics(mode: &str) -> Option<Arc<ClientMetrics>> {
    let cluster = cluster_id_env(process_env);
    metrics::from_env(mode, cluster.as_deref(), process_env)
}

/// Where a client without a port in `local_hostname` looks for one:
/// `MC_STORE_CLIENT_MIN_PORT..MC_STORE_CLIENT_MAX_PORT`, tried
/// `MC_STORE_CLIENT_SETUP_RETRIES` times; an unset, unparsable or empty
/// range keeps the defaults.
pub(crate) fn auto_ports(default_range: (u16, u16), default_tries: u32) -> (u16, u16, u32) {
    let port = |name: &str, default: u16| {
        process_env(name)
            .and_then(|v| v.trim().parse::<u16>().ok())
            .filter(|&p| p > 0)
            .unwrap_or(default)
    };
    let (lo, hi) = (
        port("MC_STORE_CLIENT_MIN_PORT", default_range.0),
        port("MC_STORE_CLIENT_MAX_PORT", default_range.1),
    );
    let (lo, hi) = if lo < hi { (lo, hi) } else { default_range };
    let tries = process_env("MC_STORE_CLIENT_SETUP_RETRIES")
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default_tries);
    (lo, hi, tries)
}

/// The SSD tier's settings (`MOONCAKE_OFFLOAD_*`), `path` first for its
/// directory.
pub(crate) fn tier_config(path: Option<&str>) -> Result<TierConfig> {
    let path = path.filter(|p| !p.is_empty());
    let lookup = |name: &str| match (name, path) {
        ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", Some(p)) => Some(p.to_owned()),
        _ => process_env(name),
    };
    TierConfig::from_lookup(&lookup).map_err(|e| bad(e.to_string()))
}

/// Whether a segment's pages are populated ahead of use
/// (`MC_STORE_PREFAULT=0` leaves them to fault on first use).
pub(crate) fn prefault_enabled() -> bool {
    process_env("MC_STORE_PREFAULT").and_then(|v| parse_bool(&v).ok()) != Some(false)
}

/// The engine's transfer timeout as the process variables set it
/// (`MC_TRANSFER_TIMEOUT`), which bounds how long a dummy waits for its
/// service.
pub(crate) fn transfer_timeout() -> Duration {
    let mut engine = EngineConfig::defaults("", "");
    engine.apply_env(process_env);
    engine.transfer_timeout
}

/// The master's default `--client_suspect_ms`: an owner silent that long
/// is stalled, so a read from it gets as long again.
const DEFAULT_SUSPECT_READ_TIMEOUT: Duration = Duration::from_millis(2000);

/// How long a read from a replica whose owner is Suspected may take
/// (`MC_STORE_SUSPECT_READ_TIMEOUT_MS`, read once; `None`: `0`, the
/// transfer timeout as for any replica). The engine caps it at the
/// transfer timeout.
pub(crate) fn suspect_read_timeout() -> Option<Duration> {
    static TIMEOUT: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *TIMEOUT.get_or_init(|| {
        parse_suspect_read_timeout(process_env("MC_STORE_SUSPECT_READ_TIMEOUT_MS").as_deref())
    })
}

/// `MC_STORE_SUSPECT_READ_TIMEOUT_MS`: milliseconds, `0` for no shorter
/// deadline; unset or not a number: the default (with a warning).
fn parse_suspect_read_timeout(v: Option<&str>) -> Option<Duration> {
    let Some(v) = v else {
        return Some(DEFAULT_SUSPECT_READ_TIMEOUT);
    };
    match v.trim().parse::<u64>() {
        Ok(0) => None,
        Ok(ms) => Some(Duration::from_millis(ms)),
        Err(_) => {
            tracing::warn!(
                "ignoring MC_STORE_SUSPECT_READ_TIMEOUT_MS={v:?}: not a number of milliseconds"
            );
            Some(DEFAULT_SUSPECT_READ_TIMEOUT)
        }
    }
}

/// Hedged reads' settings, read once: `MC_STORE_HEDGE_READ_MS` (the
/// shortest wait before a late read asks another replica; `0` turns
/// hedging off) and `MC_STORE_SLOW_PEER_HOLD_MS` (how long a late peer is
/// passed over before a read tries it again).
pub(crate) fn hedge_config() -> Option<HedgeConfig> {
    static CONFIG: std::sync::OnceLock<Option<HedgeConfig>> = std::sync::OnceLock::new();
    *CONFIG.get_or_init(|| {
        parse_hedge_config(
            process_env("MC_STORE_HEDGE_READ_MS").as_deref(),
            process_env("MC_STORE_SLOW_PEER_HOLD_MS").as_deref(),
        )
    })
}

const DEFAULT_HEDGE_FLOOR_MS: u64 = 50;
const DEFAULT_SLOW_PEER_HOLD_MS: u64 = 2000;

/// Milliseconds from `var`'s value `v`; unset or not a number: `default`
/// (with a warning).
fn millis_or(var: &str, v: Option<&str>, default: u64) -> u64 {
    let Some(v) = v else {
        return default;
    };
    v.trim().parse::<u64>().unwrap_or_else(|_| {
        tracing::warn!("ignoring {var}={v:?}: not a number of milliseconds");
        default
    })
}

fn parse_hedge_config(floor: Option<&str>, hold: Option<&str>) -> Option<HedgeConfig> {
    let floor = millis_or("MC_STORE_HEDGE_READ_MS", floor, DEFAULT_HEDGE_FLOOR_MS);
    let hold = millis_or(
        "MC_STORE_SLOW_PEER_HOLD_MS",
        hold,
        DEFAULT_SLOW_PEER_HOLD_MS,
    );
    (floor > 0).then(|| HedgeConfig {
        floor: Duration::from_millis(floor),
        hold: Duration::from_millis(hold),
    })
}

fn bad(msg: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, msg)
}

/// A size given as a JSON number or a string such as `"16 MB"`.
fn size_value(key: &str, v: &Value) -> Result<u64> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| bad(format!("{key}: {n} is not a byte count"))),
        Value::String(s) => parse_size(s).map_err(|e| e.with_context(key)),
        other => Err(bad(format!("{key}: expected a size, got {other}"))),
    }
}

fn string_value(key: &str, v: &Value) -> Result<String> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| bad(format!("{key}: expected a string, got {v}")))
}

impl ClientConfig {
    /// Reads the reference's config-dict keys (`local_hostname`,
    /// `metadata_server`, `global_segment_size`, `local_buffer_size`,
    /// `protocol`, `device_name` (or `rdma_devices`), `master_server_address`
    /// (or `master_server_addr`)); missing keys keep their defaults, unknown
    /// keys are ignored as the reference does.
    pub fn from_json(v: &Value) -> Result<ClientConfig> {
        let obj = v
            .as_object()
            .ok_or_else(|| bad("config must be a JSON object"))?;
        let mut cfg = ClientConfig::default();
        for (key, val) in obj {
            match key.as_str() {
                "local_hostname" => cfg.local_hostname = string_value(key, val)?,
                "metadata_server" => cfg.metadata_server = string_value(key, val)?,
                "protocol" => cfg.protocol = string_value(key, val)?,
                "device_name" | "rdma_devices" => cfg.device_name = string_value(key, val)?,
                "master_server_address" | "master_server_addr" => {
                    cfg.master_server_address = string_value(key, val)?
                }
                "global_segment_size" => cfg.global_segment_size = size_value(key, val)?,
                "local_buffer_size" => cfg.local_buffer_size = size_value(key, val)?,
                "tenant_id" => {
                    cfg.tenant_id = crate::tenant::normalize(&string_value(key, val)?).into()
                }
                _ => {}
            }
        }
        Ok(cfg)
    }

    /// Parses a JSON config file's text.
    pub fn from_json_str(text: &str) -> Result<ClientConfig> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("config is not JSON: {e}")))?;
        Self::from_json(&v)
    }

    /// The integrations' environment: `MOONCAKE_CONFIG_PATH` (a JSON file)
    /// first, then `MOONCAKE_MASTER`, `MOONCAKE_PROTOCOL`, `MOONCAKE_DEVICE`,
    /// `MOONCAKE_TE_META_DATA_SERVER`, `MOONCAKE_LOCAL_HOSTNAME`,
    /// `MOONCAKE_GLOBAL_SEGMENT_SIZE`, `MOONCAKE_LOCAL_BUFFER_SIZE`,
    /// `MOONCAKE_TENANT_ID` override it.
    pub fn from_env() -> Result<ClientConfig> {
        Self::from_env_with(process_env)
    }

    /// The master to join when the caller names none: `$MOONCAKE_MASTER`,
    /// else [`DEFAULT_MASTER_ADDRESS`].
    pub fn master_from_env() -> String {
        process_env("MOONCAKE_MASTER").unwrap_or_else(|| DEFAULT_MASTER_ADDRESS.into())
    }

    /// [`from_env`](Self::from_env) with an injectable lookup, for tests.
    pub fn from_env_with(get: impl Fn(&str) -> Option<String>) -> Result<ClientConfig> {
        let mut cfg = match get("MOONCAKE_CONFIG_PATH") {
            Some(path) => {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| Error::new(ErrorCode::FILE_OPEN_FAIL, format!("{path}: {e}")))?;
                Self::from_json_str(&text)?
            }
            None => ClientConfig::default(),
        };
        if let Some(v) = get("MOONCAKE_MASTER") {
            cfg.master_server_address = v;
        }
        if let Some(v) = get("MOONCAKE_PROTOCOL") {
            cfg.protocol = v;
        }
        if let Some(v) = get("MOONCAKE_DEVICE") {
            cfg.device_name = v;
        }
        if let Some(v) = get("MOONCAKE_TE_META_DATA_SERVER") {
            cfg.metadata_server = v;
        }
        if let Some(v) = get("MOONCAKE_LOCAL_HOSTNAME") {
            cfg.local_hostname = v;
        }
        if let Some(v) = get("MOONCAKE_GLOBAL_SEGMENT_SIZE") {
            cfg.global_segment_size =
                parse_size(&v).map_err(|e| e.with_context("MOONCAKE_GLOBAL_SEGMENT_SIZE"))?;
        }
        if let Some(v) = get("MOONCAKE_LOCAL_BUFFER_SIZE") {
            cfg.local_buffer_size =
                parse_size(&v).map_err(|e| e.with_context("MOONCAKE_LOCAL_BUFFER_SIZE"))?;
        }
        if let Some(v) = get("MOONCAKE_TENANT_ID") {
            cfg.tenant_id = crate::tenant::normalize(&v).into();
        }
        Ok(cfg)
    }

    /// Overrides settings from the variables the reference's client reads
    /// whatever its configuration (setup calls this, so they win over the
    /// fields):
    /// - `MC_STORE_MEMCPY` (a gflags boolean: `0`/`false`/`no`/…): whether
    ///   replicas in this process's own segment are copied with a memcpy
    ///   ([`local_memcpy`](Self::local_memcpy)); a value that is not a
    ///   boolean is ignored;
    /// - `MC_STORE_CLUSTER_ID`: the HA cluster to follow
    ///   ([`cluster_id`](Self::cluster_id)); empty is ignored;
    /// - `MC_STORE_USE_HUGEPAGE` (a boolean) with `MC_STORE_HUGEPAGE_SIZE`
    ///   (`2MB` or `1GB`, default `2MB`): segments and the local buffer on
    ///   huge pages ([`huge_pages`](Self::huge_pages)).
    ///
    /// The transfer engine reads its own variables (`MC_FORCE_TCP`,
    /// `MC_TRANSFER_TIMEOUT`, …) in `EngineConfig::apply_env`; the
    /// integrations' `MOONCAKE_*` variables are read by
    /// [`from_env`](Self::from_env) only.
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) {
        if let Some(on) = var("MC_STORE_MEMCPY").and_then(|v| parse_bool(&v).ok()) {
            self.local_memcpy = on;
        }
        if let Some(id) = cluster_id_env(&var) {
            self.cluster_id = id;
        }
        if var("MC_STORE_USE_HUGEPAGE").and_then(|v| parse_bool(&v).ok()) == Some(true) {
            let size = var("MC_STORE_HUGEPAGE_SIZE").unwrap_or_else(|| "2MB".into());
            self.huge_pages = match huge_page_size(&size) {
                Some(n) => HugePages::On(n),
                None => HugePages::Invalid(size),
            };
        }
    }

    /// Rejects settings no client can start with.
    pub fn validate(&self) -> Result<()> {
        if self.local_hostname.trim().is_empty() {
            return Err(bad("local_hostname is empty"));
        }
        if self.master_server_address.trim().is_empty() {
            return Err(bad("master_server_address is empty"));
        }
        if self.metadata_server.trim().is_empty() {
            return Err(bad("metadata_server is empty"));
        }
        split_host_port(&self.local_hostname)?;
        if let HugePages::Invalid(size) = &self.huge_pages {
            return Err(bad(format!(
                "MC_STORE_HUGEPAGE_SIZE={size:?}: huge pages come in 2MB or 1GB"
            )));
        }
        Ok(())
    }
}

/// Splits `host[:port]`; IPv6 literals are written `[::1]:port`.
pub(crate) fn split_host_port(s: &str) -> Result<(String, Option<u16>)> {
    let s = s.trim();
    if let Some(rest) = s.strip_prefix('[') {
        let (host, tail) = rest
            .split_once(']')
            .ok_or_else(|| bad(format!("bad address {s:?}")))?;
        return match tail.strip_prefix(':') {
            Some(p) => Ok((host.to_owned(), Some(parse_port(s, p)?))),
            None if tail.is_empty() => Ok((host.to_owned(), None)),
            None => Err(bad(format!("bad address {s:?}"))),
        };
    }
    match s.rsplit_once(':') {
        // A bare IPv6 literal has several colons and no port.
        Some((host, _)) if host.contains(':') => Ok((s.to_owned(), None)),
        Some((host, port)) => Ok((host.to_owned(), Some(parse_port(s, port)?))),
        None => Ok((s.to_owned(), None)),
    }
}

fn parse_port(whole: &str, p: &str) -> Result<u16> {
    p.parse::<u16>()
        .map_err(|_| bad(format!("bad port in {whole:?}")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn suspect_read_timeout_is_milliseconds_zero_off_default_two_seconds() {
        use super::parse_suspect_read_timeout as parse;
        assert_eq!(parse(None), Some(Duration::from_secs(2)));
        assert_eq!(parse(Some(" 750 ")), Some(Duration::from_millis(750)));
        assert_eq!(parse(Some("0")), None, "0: the transfer timeout");
        assert_eq!(parse(Some("1.5s")), Some(Duration::from_secs(2)));
        assert_eq!(parse(Some("-1")), Some(Duration::from_secs(2)));
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn hedging_is_milliseconds_zero_off_defaults_otherwise() {
        let ms = Duration::from_millis;
        let on = |floor, hold| Some(HedgeConfig { floor, hold });
        assert_eq!(parse_hedge_config(None, None), on(ms(50), ms(2000)));
        assert_eq!(
            parse_hedge_config(Some(" 5 "), Some("300")),
            on(ms(5), ms(300))
        );
        assert_eq!(parse_hedge_config(Some("0"), Some("300")), None, "off");
        assert_eq!(
            parse_hedge_config(Some("fast"), Some("-1")),
            on(ms(50), ms(2000))
        );
    }

    #[test]
    fn dict_with_string_sizes() {
        let cfg = ClientConfig::from_json(&json!({
            "local_hostname": "node1",
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": "3GB",
            "local_buffer_size": "16 MB",
            "protocol": "tcp",
            "device_name": "mlx5_0",
            "master_server_address": "10.0.0.1:50051",
            "unknown_key": 1,
        }))
        .unwrap();
        assert_eq!(cfg.global_segment_size, 3 << 30);
        assert_eq!(cfg.local_buffer_size, 16 << 20);
        assert_eq!(cfg.device_name, "mlx5_0");
        assert_eq!(cfg.master_server_address, "10.0.0.1:50051");
    }

    #[test]
    fn dict_rejects_percentages_and_bad_types() {
        for v in [
            json!({"global_segment_size": "50%"}),
            json!({"local_buffer_size": -1}),
            json!({"local_buffer_size": [1]}),
            json!({"protocol": 3}),
            json!([1, 2]),
        ] {
            assert_eq!(
                ClientConfig::from_json(&v).unwrap_err().code,
                ErrorCode::INVALID_PARAMS,
                "{v}"
            );
        }
    }

    #[test]
    fn env_overrides_file_defaults() {
        let cfg = ClientConfig::from_env_with(|k| match k {
            "MOONCAKE_MASTER" => Some("m:1".into()),
            "MOONCAKE_GLOBAL_SEGMENT_SIZE" => Some("0".into()),
            "MOONCAKE_LOCAL_HOSTNAME" => Some("h:5".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(cfg.master_server_address, "m:1");
        assert_eq!(cfg.global_segment_size, 0);
        assert_eq!(cfg.local_buffer_size, DEFAULT_LOCAL_BUFFER_SIZE);
        assert_eq!(cfg.local_hostname, "h:5");
        let err = ClientConfig::from_env_with(|k| {
            (k == "MOONCAKE_CONFIG_PATH").then(|| "/nonexistent/x.json".into())
        })
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::FILE_OPEN_FAIL);
    }

    #[test]
    fn process_variables_override_the_fields() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(name, _)| *name == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let mut cfg = ClientConfig::default();
        cfg.apply_env(env(&[]));
        assert_eq!(cfg, ClientConfig::default(), "nothing set, nothing changes");
        assert!(cfg.local_memcpy);
        assert_eq!(cfg.cluster_id, "mooncake_cluster");

        cfg.apply_env(env(&[
            ("MC_STORE_MEMCPY", "0"),
            ("MC_STORE_CLUSTER_ID", "c1"),
        ]));
        assert!(!cfg.local_memcpy);
        assert_eq!(cfg.cluster_id, "c1");
        cfg.apply_env(env(&[
            ("MC_STORE_MEMCPY", "maybe"),
            ("MC_STORE_CLUSTER_ID", ""),
        ]));
        assert!(!cfg.local_memcpy, "not a boolean: ignored");
        assert_eq!(cfg.cluster_id, "c1", "empty: ignored");
        cfg.apply_env(env(&[("MC_STORE_MEMCPY", "true")]));
        assert!(cfg.local_memcpy);
    }

    #[test]
    fn host_port_forms() {
        assert_eq!(split_host_port("node1").unwrap(), ("node1".into(), None));
        assert_eq!(
            split_host_port("node1:123").unwrap(),
            ("node1".into(), Some(123))
        );
        assert_eq!(split_host_port("[::1]:9").unwrap(), ("::1".into(), Some(9)));
        assert_eq!(split_host_port("::1").unwrap(), ("::1".into(), None));
        assert!(split_host_port("node1:99999").is_err());
        assert!(split_host_port("node1:x").is_err());
        let mut cfg = ClientConfig {
            local_hostname: " ".into(),
            ..Default::default()
        };
        assert!(cfg.validate().is_err());
        cfg.local_hostname = "ok".into();
        cfg.validate().unwrap();
    }
}
