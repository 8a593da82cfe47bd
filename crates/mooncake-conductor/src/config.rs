//! Start-up configuration: the JSON file named by `CONDUCTOR_CONFIG_PATH`
//! (default `~/.mooncake/conductor_config.json`), as the reference's
//! Conductor reads it, then command-line flags over it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Parser;
use serde::Deserialize;

use crate::hash::DEFAULT_SEED;
use crate::index::{Kind, Namespace, SubInfo};

pub const DEFAULT_PORT: u16 = 13333;

/// A publisher to subscribe to: the body of `POST /register`, and an entry
/// of the file's `kvevent_instance` list.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Registration {
    pub endpoint: String,
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    pub modelname: String,
    #[serde(default)]
    pub lora_name: Option<String>,
    #[serde(default)]
    pub tenant_id: Option<String>,
    pub instance_id: String,
    pub block_size: u32,
    pub dp_rank: u32,
    #[serde(default)]
    pub additionalsalt: Option<String>,
    /// Settings of the reference's development branch this indexer does not
    /// implement (recomputing vLLM's hash chain, cache groups): refused
    /// rather than ignored.
    #[serde(default)]
    pub hash_profile: Option<serde_json::Value>,
    #[serde(default)]
    pub cache_group: Option<serde_json::Value>,
}

impl Registration {
    /// What the index keeps of it, or what is wrong with it.
    pub fn sub_info(&self) -> Result<SubInfo, String> {
        let kind = Kind::parse(&self.kind)
            .ok_or_else(|| format!("type {:?} is not one of vLLM, SGLang, Mooncake", self.kind))?;
        if self.endpoint.trim().is_empty() {
            return Err("endpoint is empty".into());
        }
        if self
            .replay_endpoint
            .as_deref()
            .is_some_and(|r| r.trim().is_empty())
        {
            return Err("replay_endpoint is empty".into());
        }
        if self.modelname.is_empty() {
            return Err("modelname is empty".into());
        }
        if self.instance_id.is_empty() {
            return Err("instance_id is empty".into());
        }
        if self.block_size == 0 {
            return Err("block_size must be positive".into());
        }
        for (name, v) in [
            ("hash_profile", &self.hash_profile),
            ("cache_group", &self.cache_group),
        ] {
            if v.is_some() {
                return Err(format!(
                    "{name} is not supported: events must carry the block hashes routers query"
                ));
            }
        }
        Ok(SubInfo {
            instance_id: self.instance_id.clone(),
            kind,
            dp_rank: self.dp_rank,
            namespace: Namespace {
                tenant: self.tenant().to_string(),
                model: self.modelname.clone(),
                lora: self.lora_name.clone().unwrap_or_default(),
                salt: self.additionalsalt.clone().unwrap_or_default(),
                block_size: self.block_size,
            },
        })
    }

    pub fn tenant(&self) -> &str {
        self.tenant_id
            .as_deref()
            .filter(|t| !t.is_empty())
            .unwrap_or("default")
    }
}

/// The configuration file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub http_server_port: Option<u16>,
    #[serde(default, deserialize_with = "instances")]
    pub kvevent_instance: Vec<Registration>,
    #[serde(default)]
    pub hash_seed: Option<u64>,
    #[serde(default)]
    pub replay_timeout_ms: Option<u64>,
}

#[derive(Debug, Parser)]
#[command(
    name = "mooncake_conductor",
    about = "The Conductor KV indexer: KV events in, prefix hits out over HTTP"
)]
pub struct Flags {
    /// The configuration file (overrides CONDUCTOR_CONFIG_PATH).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The HTTP port (overrides the file's http_server_port; 0 picks a free one).
    #[arg(long, alias = "http_server_port")]
    pub port: Option<u16>,
    /// The address the HTTP server binds.
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,
    /// The XXH3 seed of the hashing standard (overrides the file's hash_seed).
    #[arg(long, alias = "hash_seed")]
    pub hash_seed: Option<u64>,
    /// How long a replay request may wait for each answer, in milliseconds.
    #[arg(long, alias = "replay_timeout_ms")]
    pub replay_timeout_ms: Option<u64>,
    /// The log filter (overrides CONDUCTOR_LOG_LEVEL; default info).
    #[arg(long, alias = "log_level")]
    pub log_level: Option<String>,
}

/// The settings the service runs with.
#[derive(Clone, Debug)]
pub struct Config {
    pub host: String,
    pub port: u16,
    pub hash_seed: u64,
    pub replay_timeout_ms: u64,
    pub instances: Vec<Registration>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            host: "0.0.0.0".into(),
            port: DEFAULT_PORT,
            hash_seed: DEFAULT_SEED,
            replay_timeout_ms: 2000,
            instances: Vec::new(),
        }
    }
}

/// The file to read: the flag, else `CONDUCTOR_CONFIG_PATH`, else the
/// default; `true` when it was named explicitly (then it must exist).
pub fn config_path(
    flag: Option<&Path>,
    env: Option<&str>,
    home: Option<&str>,
) -> Option<(PathBuf, bool)> {
    if let Some(p) = flag {
        return Some((p.to_path_buf(), true));
    }
    if let Some(p) = env.filter(|p| !p.is_empty()) {
        return Some((PathBuf::from(p), true));
    }
    home.map(|h| (Path::new(h).join(".mooncake/conductor_config.json"), false))
}

/// `kvevent_instance` as the reference writes it, an object of
/// registrations by name (a missing `instance_id` is the name), or a list.
fn instances<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Registration>, D::Error> {
    use serde::de::Error;
    use serde_json::Value;
    let entry = |v: Value, name: Option<&str>| -> Result<Registration, D::Error> {
        let mut v = v;
        if let (Some(name), Some(o)) = (name, v.as_object_mut()) {
            o.entry("instance_id")
                .or_insert_with(|| Value::String(name.to_string()));
        }
        let what = name.map_or_else(String::new, |n| format!("{n:?}: "));
        serde_json::from_value(v).map_err(|e| D::Error::custom(format!("{what}{e}")))
    };
    match Value::deserialize(d)? {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items.into_iter().map(|v| entry(v, None)).collect(),
        Value::Object(by_name) => by_name
            .into_iter()
            .map(|(name, v)| entry(v, Some(&name)))
            .collect(),
        other => Err(D::Error::custom(format!(
            "kvevent_instance must be an object or a list, not {other}"
        ))),
    }
}

pub fn parse_file(text: &str) -> anyhow::Result<FileConfig> {
    let f: FileConfig = serde_json::from_str(text).context("not a conductor configuration")?;
    for (i, r) in f.kvevent_instance.iter().enumerate() {
        if let Err(e) = r.sub_info() {
            bail!("kvevent_instance[{i}]: {e}");
        }
    }
    Ok(f)
}

impl Config {
    /// The file (when there is one) with the flags over it.
    pub fn load(
        flags: &Flags,
        env_path: Option<&str>,
        home: Option<&str>,
    ) -> anyhow::Result<Config> {
        let mut file = FileConfig::default();
        if let Some((path, explicit)) = config_path(flags.config.as_deref(), env_path, home) {
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    file = parse_file(&text).with_context(|| format!("{}", path.display()))?
                }
                Err(e) if !explicit && e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            }
        }
        let d = Config::default();
        Ok(Config {
            host: flags.host.clone(),
            port: flags.port.or(file.http_server_port).unwrap_or(d.port),
            hash_seed: flags.hash_seed.or(file.hash_seed).unwrap_or(d.hash_seed),
            replay_timeout_ms: flags
                .replay_timeout_ms
                .or(file.replay_timeout_ms)
                .unwrap_or(d.replay_timeout_ms)
                .max(1),
            instances: file.kvevent_instance,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"{"http_server_port": 14000, "kvevent_instance": [
        {"endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558", "type": "vLLM",
         "modelname": "m", "instance_id": "i", "block_size": 16, "dp_rank": 0}]}"#;

    #[test]
    fn file_then_flags() {
        let f = parse_file(FILE).unwrap();
        assert_eq!(f.http_server_port, Some(14000));
        let r = &f.kvevent_instance[0];
        assert_eq!(r.tenant(), "default");
        let info = r.sub_info().unwrap();
        assert_eq!((info.kind, info.namespace.salt.as_str()), (Kind::Vllm, ""));
        let dir = std::env::temp_dir().join(format!("conductor-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.json");
        std::fs::write(&path, FILE).unwrap();
        let flags = Flags::parse_from(["x", "--hash-seed", "7"]);
        let c = Config::load(&flags, path.to_str(), None).unwrap();
        assert_eq!((c.port, c.hash_seed, c.instances.len()), (14000, 7, 1));
        let flags = Flags::parse_from(["x", "--port", "0"]);
        assert_eq!(Config::load(&flags, path.to_str(), None).unwrap().port, 0);
        // The default file may be absent; a named one may not.
        let none =
            Config::load(&Flags::parse_from(["x"]), None, Some(dir.to_str().unwrap())).unwrap();
        assert_eq!((none.port, none.hash_seed), (DEFAULT_PORT, DEFAULT_SEED));
        assert!(
            Config::load(&Flags::parse_from(["x"]), Some("/nonexistent/c.json"), None).is_err()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The reference's own layout: registrations by stream name, the name
    /// standing for a missing `instance_id`.
    #[test]
    fn instances_by_name() {
        let f = parse_file(
            r#"{"http_server_port": 13333, "kvevent_instance": {
            "vllm-prefill-node1": {"endpoint": "tcp://127.0.0.1:5557", "type": "vLLM",
              "modelname": "qwen2.5", "lora_name": "", "tenant_id": "default",
              "block_size": 128, "dp_rank": 0, "additionalsalt": ""},
            "pool": {"endpoint": "tcp://127.0.0.1:5560", "type": "Mooncake",
              "modelname": "qwen2.5", "instance_id": "vllm-prefill-node1",
              "block_size": 128, "dp_rank": 0}}}"#,
        )
        .unwrap();
        let mut ids: Vec<(&str, &str)> = f
            .kvevent_instance
            .iter()
            .map(|r| (r.instance_id.as_str(), r.kind.as_str()))
            .collect();
        ids.sort();
        assert_eq!(
            ids,
            [
                ("vllm-prefill-node1", "Mooncake"),
                ("vllm-prefill-node1", "vLLM")
            ]
        );
        let err = parse_file(r#"{"kvevent_instance": {"a": {"type": "vLLM"}}}"#).unwrap_err();
        assert!(format!("{err:#}").contains("\"a\""), "{err:#}");
        assert!(parse_file(r#"{"kvevent_instance": 3}"#).is_err());
        assert!(parse_file(r#"{"kvevent_instance": null}"#)
            .unwrap()
            .kvevent_instance
            .is_empty());
    }

    #[test]
    fn bad_files_are_errors() {
        assert!(parse_file("{").is_err());
        assert!(
            parse_file(r#"{"http_server_prot": 1}"#).is_err(),
            "unknown keys are typos"
        );
        let bad = FILE.replace("vLLM", "TensorRT");
        assert!(parse_file(&bad)
            .unwrap_err()
            .to_string()
            .contains("kvevent_instance[0]"));
        assert!(parse_file(&FILE.replace("16", "0")).is_err());
        for unsupported in ["hash_profile", "cache_group"] {
            let f = FILE.replace(
                r#""dp_rank": 0"#,
                &format!(r#""dp_rank": 0, "{unsupported}": {{}}"#),
            );
            let err = parse_file(&f).unwrap_err().to_string();
            assert!(err.contains(unsupported), "{err}");
        }
    }
}
