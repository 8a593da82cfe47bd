//! TENT's configuration: defaults, then the `transfer-engine.json` shape
//! the reference reads (`MC_TENT_CONF`: a file path or the JSON itself),
//! then the `TENT_METRICS_*` variables for the metrics keys not in the file.
//!
//! Keys this build gives a meaning (others, such as `transports/rdma/*`,
//! are named in one warning, not silently dropped):
//!
//! ```json
//! {
//!   "local_segment_name": "node1", "metadata_type": "p2p", "metadata_servers": "",
//!   "max_failover_attempts": 16,
//!   "policy": [{"name": "all", "segment_type": "memory", "transports": ["shm", "tcp"]}],
//!   "transports": {
//!     "tcp": {"addresses": ["10.1.0.1", "10.2.0.1"], "connections_per_path": 2,
//!             "slice_size": 1048576, "max_inflight_slices": 8,
//!             "bandwidth_learning_rate": 0.5, "stall_timeout_ms": 2000,
//!             "rail_error_threshold": 1, "rail_error_window_secs": 10,
//!             "rail_cooldown_ms": 100, "rail_max_cooldown_ms": 500},
//!     "shm": {"enabled": true}
//!   },
//!   "transfer_timeout_ms": 30000,
//!   "metrics": {"enabled": true, "http_port": 9100, "http_host": "0.0.0.0",
//!               "http_server_threads": 2, "report_interval_seconds": 30}
//! }
//! ```

use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use serde_json::Value;

use crate::health::HealthPolicy;
use crate::selector::TransportKind;

#[derive(Clone, Debug, PartialEq)]
pub struct MetricsConfig {
    pub enabled: bool,
    pub http_port: u16,
    pub http_host: String,
    pub http_server_threads: usize,
    /// Seconds between summary log lines; 0: none.
    pub report_interval_seconds: u64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            http_port: 9100,
            http_host: "0.0.0.0".into(),
            http_server_threads: 2,
            report_interval_seconds: 30,
        }
    }
}

#[derive(Clone, Debug)]
pub struct TentConfig {
    /// This engine's name (P2P: a host; the published name becomes host:port).
    pub local_segment_name: String,
    /// `P2PHANDSHAKE` or a metadata URI, as the classic engine takes it.
    pub metadata_server: String,
    /// Local addresses, one path (listener and connections) each. Empty:
    /// one path on the host of `local_segment_name`.
    pub addresses: Vec<String>,
    /// Data connections per path (None: the classic engine's default).
    pub connections_per_path: Option<usize>,
    pub slice_size: usize,
    pub max_inflight_slices: usize,
    pub bandwidth_learning_rate: f64,
    /// A slice not finished after this long fails on its path (the path's
    /// connections are closed) and is retried on another.
    pub stall_timeout: Duration,
    /// A path whose slice runs this many times past its prediction (and
    /// past `stall_floor`) leaves rotation while that slice finishes.
    pub stall_factor: f64,
    pub stall_floor: Duration,
    /// A request that finds no path for this long fails.
    pub transfer_timeout: Duration,
    pub health: HealthPolicy,
    /// Retries of one slice before the request fails.
    pub max_failover_attempts: u32,
    /// Transport preference (the first memory policy's `transports`).
    pub transports: Vec<TransportKind>,
    pub metrics: MetricsConfig,
}

impl TentConfig {
    pub fn defaults(metadata_server: &str, local_segment_name: &str) -> TentConfig {
        TentConfig {
            local_segment_name: local_segment_name.to_string(),
            metadata_server: metadata_server.to_string(),
            addresses: Vec::new(),
            connections_per_path: None,
            slice_size: 1 << 20,
            max_inflight_slices: 8,
            bandwidth_learning_rate: 0.5,
            stall_timeout: Duration::from_secs(2),
            stall_factor: 16.0,
            stall_floor: Duration::from_millis(500),
            transfer_timeout: Duration::from_secs(30),
            health: HealthPolicy {
                error_threshold: 1,
                window: Duration::from_secs(10),
                cooldown: Duration::from_millis(100),
                max_cooldown: Duration::from_millis(500),
            },
            max_failover_attempts: 16,
            transports: vec![TransportKind::Shm, TransportKind::Tcp],
            metrics: MetricsConfig::default(),
        }
    }

    /// Applies a `transfer-engine.json` document. Returns the keys it
    /// does not use (for one warning).
    pub fn apply_json(&mut self, text: &str) -> Result<Vec<String>> {
        let doc: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("TENT config: {e}")))?;
        let Value::Object(top) = doc else {
            return Err(bad("TENT config: not a JSON object".into()));
        };
        let mut unused = Vec::new();
        for (k, v) in &top {
            match k.as_str() {
                "local_segment_name" => self.local_segment_name = string(k, v)?,
                "metadata_servers" => self.metadata_server = string(k, v)?,
                "metadata_type" => {}
                "max_failover_attempts" => self.max_failover_attempts = uint(k, v)? as u32,
                "transfer_timeout_ms" => self.transfer_timeout = millis(k, v)?,
                "policy" => self.apply_policy(v)?,
                "transports" => self.apply_transports(v, &mut unused)?,
                "metrics" => self.apply_metrics(v, &mut unused)?,
                other => unused.push(other.to_string()),
            }
        }
        // `metadata_type` names the backend of a bare `host:port` server.
        let kind = top
            .get("metadata_type")
            .and_then(Value::as_str)
            .unwrap_or("");
        let server = self.metadata_server.trim();
        self.metadata_server = match kind.to_ascii_lowercase().as_str() {
            "" | "p2p" | "p2phandshake" if server.is_empty() => "P2PHANDSHAKE".into(),
            "" | "p2p" | "p2phandshake" => server.to_string(),
            _ if server.contains("://") => server.to_string(),
            k => format!("{k}://{server}"),
        };
        if self.addresses.is_empty() && self.transports.contains(&TransportKind::Tcp) {
            tracing::debug!("TENT config: no tcp addresses, one path");
        }
        Ok(unused)
    }

    fn apply_policy(&mut self, v: &Value) -> Result<()> {
        let Some(list) = v.as_array() else {
            return Err(bad("TENT config: policy is not a list".into()));
        };
        // The first memory policy without narrower filters sets the order.
        for p in list {
            if p.get("segment_type").and_then(Value::as_str) != Some("memory") {
                continue;
            }
            let Some(ts) = p.get("transports").and_then(Value::as_array) else {
                continue;
            };
            let kinds: Vec<_> = ts
                .iter()
                .filter_map(Value::as_str)
                .filter_map(TransportKind::parse)
                .collect();
            if kinds.is_empty() {
                return Err(bad(format!(
                    "TENT config: policy {} names no transport of this build (shm, tcp)",
                    p.get("name").unwrap_or(&Value::Null)
                )));
            }
            self.transports = kinds;
            return Ok(());
        }
        Ok(())
    }

    fn apply_transports(&mut self, v: &Value, unused: &mut Vec<String>) -> Result<()> {
        let Some(map) = v.as_object() else {
            return Err(bad("TENT config: transports is not an object".into()));
        };
        for (name, t) in map {
            match name.as_str() {
                "tcp" => self.apply_tcp(t, unused)?,
                "shm" => {
                    if t.get("enabled").and_then(Value::as_bool) == Some(false) {
                        self.transports.retain(|k| *k != TransportKind::Shm);
                    }
                }
                other => unused.push(format!("transports/{other}")),
            }
        }
        Ok(())
    }

    fn apply_tcp(&mut self, t: &Value, unused: &mut Vec<String>) -> Result<()> {
        let Some(map) = t.as_object() else {
            return Err(bad("TENT config: transports/tcp is not an object".into()));
        };
        for (k, v) in map {
            match k.as_str() {
                "addresses" => {
                    let list = v
                        .as_array()
                        .ok_or_else(|| bad("TENT config: tcp addresses is not a list".into()))?;
                    self.addresses = list
                        .iter()
                        .map(|a| string("transports/tcp/addresses", a))
                        .collect::<Result<_>>()?;
                }
                "connections_per_path" => self.connections_per_path = Some(uint(k, v)? as usize),
                "slice_size" => self.slice_size = (uint(k, v)? as usize).max(4096),
                "max_inflight_slices" => self.max_inflight_slices = (uint(k, v)? as usize).max(1),
                "bandwidth_learning_rate" => {
                    self.bandwidth_learning_rate = v
                        .as_f64()
                        .filter(|x| (0.0..=1.0).contains(x))
                        .ok_or_else(|| bad(format!("TENT config: {k} must be in [0, 1]")))?
                }
                "stall_timeout_ms" => self.stall_timeout = millis(k, v)?,
                "rail_error_threshold" => self.health.error_threshold = uint(k, v)?.max(1) as u32,
                "rail_error_window_secs" => self.health.window = Duration::from_secs(uint(k, v)?),
                "rail_cooldown_ms" => self.health.cooldown = millis(k, v)?,
                "rail_max_cooldown_ms" => self.health.max_cooldown = millis(k, v)?,
                other => unused.push(format!("transports/tcp/{other}")),
            }
        }
        Ok(())
    }

    fn apply_metrics(&mut self, v: &Value, unused: &mut Vec<String>) -> Result<()> {
        let Some(map) = v.as_object() else {
            return Err(bad("TENT config: metrics is not an object".into()));
        };
        let m = &mut self.metrics;
        for (k, v) in map {
            match k.as_str() {
                "enabled" => {
                    m.enabled = v
                        .as_bool()
                        .ok_or_else(|| bad("TENT config: metrics/enabled is not a bool".into()))?
                }
                "http_port" => {
                    m.http_port = u16::try_from(uint(k, v)?)
                        .map_err(|_| bad("TENT config: metrics/http_port out of range".into()))?
                }
                "http_host" => m.http_host = string(k, v)?,
                "http_server_threads" => m.http_server_threads = (uint(k, v)? as usize).max(1),
                "report_interval_seconds" => m.report_interval_seconds = uint(k, v)?,
                other => unused.push(format!("metrics/{other}")),
            }
        }
        Ok(())
    }

    /// `MC_TENT_CONF` (a file, else inline JSON) over the defaults, then
    /// the `TENT_METRICS_*` variables. The configuration file wins over
    /// the variables for keys it sets, as the reference documents.
    pub fn from_env(
        metadata_server: &str,
        local_segment_name: &str,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<TentConfig> {
        let mut c = TentConfig::defaults(metadata_server, local_segment_name);
        c.apply_metrics_env(&var)?;
        if let Some(conf) = var("MC_TENT_CONF").filter(|s| !s.trim().is_empty()) {
            let text = if std::path::Path::new(&conf).is_file() {
                std::fs::read_to_string(&conf)
                    .map_err(|e| bad(format!("MC_TENT_CONF={conf}: {e}")))?
            } else {
                conf
            };
            let unused = c.apply_json(&text)?;
            if !unused.is_empty() {
                tracing::warn!("TENT config: keys without meaning in this build: {unused:?}");
            }
        }
        Ok(c)
    }

    fn apply_metrics_env(&mut self, var: &impl Fn(&str) -> Option<String>) -> Result<()> {
        let m = &mut self.metrics;
        let num = |name: &str| -> Result<Option<u64>> {
            var(name)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| bad(format!("{name}={v:?} is not a number")))
                })
                .transpose()
        };
        if let Some(v) = var("TENT_METRICS_ENABLED") {
            m.enabled = match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => return Err(bad(format!("TENT_METRICS_ENABLED={v:?} is not a bool"))),
            };
        }
        if let Some(p) = num("TENT_METRICS_HTTP_PORT")? {
            m.http_port = u16::try_from(p)
                .map_err(|_| bad(format!("TENT_METRICS_HTTP_PORT={p} out of range")))?;
        }
        if let Some(h) = var("TENT_METRICS_HTTP_HOST") {
            m.http_host = h.trim().to_string();
        }
        if let Some(n) = num("TENT_METRICS_HTTP_SERVER_THREADS")? {
            m.http_server_threads = (n as usize).max(1);
        }
        if let Some(n) = num("TENT_METRICS_REPORT_INTERVAL")? {
            m.report_interval_seconds = n;
        }
        Ok(())
    }
}

fn bad(msg: String) -> Error {
    Error::new(ErrorCode::ERR_INVALID_ARGUMENT, msg)
}

fn string(k: &str, v: &Value) -> Result<String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| bad(format!("TENT config: {k} is not a string")))
}

fn uint(k: &str, v: &Value) -> Result<u64> {
    v.as_u64()
        .ok_or_else(|| bad(format!("TENT config: {k} is not a non-negative integer")))
}

fn millis(k: &str, v: &Value) -> Result<Duration> {
    Ok(Duration::from_millis(uint(k, v)?.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_shape_and_ours() {
        let mut c = TentConfig::defaults("", "n");
        let unused = c
            .apply_json(
                r#"{"local_segment_name": "node1", "metadata_type": "etcd",
                "metadata_servers": "10.0.0.1:2379", "log_level": "warning",
                "max_failover_attempts": 3,
                "policy": [{"name": "f", "segment_type": "file", "transports": ["gds"]},
                           {"name": "m", "segment_type": "memory", "transports": ["rdma", "tcp"]}],
                "transports": {"rdma": {"rail_cooldown_secs": 30},
                               "tcp": {"addresses": ["10.1.0.1", "10.2.0.1"], "stall_timeout_ms": 700,
                                       "rail_cooldown_ms": 50, "max_inflight_slices": 4}},
                "metrics": {"enabled": false, "http_port": 9200, "report_interval_seconds": 0}}"#,
            )
            .unwrap();
        assert_eq!(c.local_segment_name, "node1");
        assert_eq!(c.metadata_server, "etcd://10.0.0.1:2379");
        assert_eq!(c.max_failover_attempts, 3);
        assert_eq!(c.transports, vec![TransportKind::Tcp]);
        assert_eq!(c.addresses, vec!["10.1.0.1", "10.2.0.1"]);
        assert_eq!(c.stall_timeout, Duration::from_millis(700));
        assert_eq!(c.health.cooldown, Duration::from_millis(50));
        assert_eq!(c.max_inflight_slices, 4);
        assert!(!c.metrics.enabled);
        assert_eq!(c.metrics.http_port, 9200);
        assert_eq!(c.metrics.report_interval_seconds, 0);
        assert_eq!(unused, vec!["log_level", "transports/rdma"]);
    }

    #[test]
    fn p2p_by_default() {
        let mut c = TentConfig::defaults("", "n");
        c.apply_json(r#"{"metadata_type": "p2p"}"#).unwrap();
        assert_eq!(c.metadata_server, "P2PHANDSHAKE");
    }

    #[test]
    fn bad_inputs_are_errors() {
        for doc in [
            "[1]",
            "{",
            r#"{"transports": {"tcp": {"addresses": "x"}}}"#,
            r#"{"transports": {"tcp": {"bandwidth_learning_rate": 2}}}"#,
            r#"{"metrics": {"http_port": 70000}}"#,
            r#"{"policy": [{"name": "r", "segment_type": "memory", "transports": ["rdma"]}]}"#,
            r#"{"max_failover_attempts": -1}"#,
        ] {
            let mut c = TentConfig::defaults("", "n");
            let e = c.apply_json(doc).unwrap_err();
            assert_eq!(e.code, ErrorCode::ERR_INVALID_ARGUMENT, "{doc}");
        }
    }

    #[test]
    fn environment() {
        let env = |k: &str| match k {
            "TENT_METRICS_HTTP_PORT" => Some("9301".to_string()),
            "TENT_METRICS_ENABLED" => Some("false".to_string()),
            "TENT_METRICS_REPORT_INTERVAL" => Some("0".to_string()),
            "MC_TENT_CONF" => Some(r#"{"metrics": {"http_port": 9400}}"#.to_string()),
            _ => None,
        };
        let c = TentConfig::from_env("P2PHANDSHAKE", "h", env).unwrap();
        assert_eq!(c.metrics.http_port, 9400, "the file wins");
        assert!(!c.metrics.enabled);
        assert_eq!(c.metrics.report_interval_seconds, 0);
        let bad_env = |k: &str| (k == "TENT_METRICS_HTTP_PORT").then(|| "x".to_string());
        assert!(TentConfig::from_env("", "h", bad_env).is_err());
    }
}
