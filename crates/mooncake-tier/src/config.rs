//! The tier's configuration: every `MOONCAKE_OFFLOAD_*` variable, with the
//! reference's names, fallbacks and defaults, parsed in one place.
//!
//! [`TierConfig::from_lookup`] takes the variable lookup as a function so tests
//! never touch the process environment. Unlike the reference, which logs a
//! warning and keeps the default, a value that does not parse is an error: a
//! tier that silently runs with other limits than the operator asked for is
//! worse than one that refuses to start.

use super::TierError;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// `MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR`: how objects are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageBackend {
    /// `bucket_storage_backend` (default): many objects per data file, one
    /// metadata file per bucket.
    Bucket,
    /// `file_per_key_storage_backend`: one file per object under
    /// `MOONCAKE_OFFLOAD_FSDIR`.
    FilePerKey,
}

/// `MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY`: which bucket leaves the disk
/// first when the tier is over its size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Never evict: a write that does not fit is refused (back-pressure).
    None,
    /// The oldest bucket first.
    Fifo,
    /// The least recently read bucket first (never-read buckets before any
    /// read one, oldest first among them).
    Lru,
}

/// The SSD tier's settings. Field docs name the variable and its default.
#[derive(Debug, Clone, PartialEq)]
pub struct TierConfig {
    /// `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH` (`/data/file_storage`): an
    /// absolute, existing, writable directory; no `..`, not a symlink.
    pub storage_path: PathBuf,
    /// `MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR` (`bucket_storage_backend`).
    pub backend: StorageBackend,
    /// `MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES` (1280 MiB): the staging
    /// buffer that disk reads land in before they move to a reader.
    pub local_buffer_size: u64,
    /// `MOONCAKE_OFFLOAD_SCANMETA_ITERATOR_KEYS_LIMIT` (20000; fallback
    /// `MOONCAKE_SCANMETA_ITERATOR_KEYS_LIMIT`): keys per re-registration batch
    /// after the restart scan.
    pub scanmeta_iterator_keys_limit: u64,
    /// `MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT` (10 000 000): most objects on disk.
    pub total_keys_limit: u64,
    /// `MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES` (2 TiB): most bytes on disk;
    /// also the capacity reported to the master.
    pub total_size_limit: u64,
    /// `MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS` (10 s).
    pub heartbeat_interval: Duration,
    /// `MOONCAKE_OFFLOAD_CLIENT_BUFFER_GC_INTERVAL_SECONDS` (1 s).
    pub client_buffer_gc_interval: Duration,
    /// `MOONCAKE_OFFLOAD_CLIENT_BUFFER_GC_TTL_MS` (5000 ms): how long a staged
    /// read waits for its reader to release it.
    pub client_buffer_gc_ttl: Duration,
    /// `MOONCAKE_OFFLOAD_USE_URING` (false; fallback `MOONCAKE_USE_URING`):
    /// `true`/`false`/`1`/`0`, any case.
    pub use_uring: bool,
    /// `MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION` (true): evict when
    /// the filesystem holding the tier passes the high ratio of its size,
    /// down to the low one (the tier's own size is kept by admission).
    pub enable_disk_watermark_eviction: bool,
    /// `MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO` (0.90; fallback
    /// `MOONCAKE_DISK_EVICTION_HIGH_WATERMARK_RATIO`): in (0, 1].
    pub disk_eviction_high_watermark_ratio: f64,
    /// `MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO` (0.80; fallback
    /// `MOONCAKE_DISK_EVICTION_LOW_WATERMARK_RATIO`): in (0, high).
    pub disk_eviction_low_watermark_ratio: f64,
    /// `MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES` (256 MiB): a bucket is sealed
    /// once this full (an object larger than the limit gets a bucket of its own).
    pub bucket_size_limit: u64,
    /// `MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT` (500): a bucket is sealed at this
    /// many objects.
    pub bucket_keys_limit: u64,
    /// `MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE` (0; fallback
    /// `MOONCAKE_BUCKET_MAX_TOTAL_SIZE`): the eviction threshold in bytes; 0
    /// means 90% of the filesystem's size (statvfs), not unlimited.
    pub bucket_max_total_size: u64,
    /// `MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES` (0 = off): a hard cap on
    /// the bytes the tier's files occupy. The tier accounts its files exactly
    /// (block-rounded), so this is one more limit, not a directory scan.
    pub bucket_max_physical_bytes: u64,
    /// `MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY` (`fifo` when unset, as the
    /// reference's environment parser defaults; `none`, `fifo`, `lru`).
    pub eviction_policy: EvictionPolicy,
    /// `MOONCAKE_OFFLOAD_FSDIR` (`file_per_key_dir`): the file-per-key
    /// layout's subdirectory of the storage path.
    pub fsdir: String,
    /// `MOONCAKE_OFFLOAD_ENABLE_EVICTION` (true; fallback `ENABLE_EVICTION`):
    /// whether the file-per-key layout evicts (fifo) or refuses when full.
    pub file_per_key_eviction: bool,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            storage_path: PathBuf::from("/data/file_storage"),
            backend: StorageBackend::Bucket,
            local_buffer_size: 1280 * MIB,
            scanmeta_iterator_keys_limit: 20_000,
            total_keys_limit: 10_000_000,
            total_size_limit: 2 << 40,
            heartbeat_interval: Duration::from_secs(10),
            client_buffer_gc_interval: Duration::from_secs(1),
            client_buffer_gc_ttl: Duration::from_millis(5000),
            use_uring: false,
            enable_disk_watermark_eviction: true,
            disk_eviction_high_watermark_ratio: 0.90,
            disk_eviction_low_watermark_ratio: 0.80,
            bucket_size_limit: 256 * MIB,
            bucket_keys_limit: 500,
            bucket_max_total_size: 0,
            bucket_max_physical_bytes: 0,
            eviction_policy: EvictionPolicy::Fifo,
            fsdir: "file_per_key_dir".to_string(),
            file_per_key_eviction: true,
        }
    }
}

/// One variable read through the lookup, with the reference's fallback name.
struct Vars<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl Vars<'_> {
    fn get(&self, name: &str, fallback: Option<&str>) -> Option<(String, String)> {
        if let Some(v) = (self.lookup)(name) {
            return Some((name.to_string(), v));
        }
        let fallback = fallback?;
        (self.lookup)(fallback).map(|v| (fallback.to_string(), v))
    }

    fn uint(&self, name: &str, fallback: Option<&str>, default: u64) -> Result<u64, TierError> {
        let Some((name, raw)) = self.get(name, fallback) else {
            return Ok(default);
        };
        let t = raw.trim();
        let digits = t.strip_prefix('+').unwrap_or(t);
        digits.parse::<u64>().map_err(|_| {
            TierError::Config(format!("{name}={raw:?}: expected a non-negative integer"))
        })
    }

    /// A signed integer where the reference reads one; negative means "unset"
    /// for the size thresholds whose 0 already means "default".
    fn size_or_default(&self, name: &str, fallback: Option<&str>) -> Result<u64, TierError> {
        let Some((name, raw)) = self.get(name, fallback) else {
            return Ok(0);
        };
        let t = raw.trim();
        let v: i64 = t
            .strip_prefix('+')
            .unwrap_or(t)
            .parse()
            .map_err(|_| TierError::Config(format!("{name}={raw:?}: expected an integer")))?;
        Ok(v.max(0) as u64)
    }

    /// `true`/`false`/`1`/`0` in any case, untrimmed, as the reference's
    /// `kTrueFalse` token set.
    fn true_false(
        &self,
        name: &str,
        fallback: Option<&str>,
        default: bool,
    ) -> Result<bool, TierError> {
        let Some((name, raw)) = self.get(name, fallback) else {
            return Ok(default);
        };
        match raw.to_ascii_lowercase().as_str() {
            "1" | "true" => Ok(true),
            "0" | "false" => Ok(false),
            _ => Err(TierError::Config(format!(
                "{name}={raw:?}: expected true, false, 1 or 0"
            ))),
        }
    }

    /// The reference's canonical booleans (also yes/no/on/off/enable/disable), trimmed.
    fn canonical_bool(
        &self,
        name: &str,
        fallback: Option<&str>,
        default: bool,
    ) -> Result<bool, TierError> {
        let Some((name, raw)) = self.get(name, fallback) else {
            return Ok(default);
        };
        match raw.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" | "enable" => Ok(true),
            "0" | "false" | "no" | "off" | "disable" => Ok(false),
            _ => Err(TierError::Config(format!(
                "{name}={raw:?}: expected a boolean"
            ))),
        }
    }

    fn ratio(&self, name: &str, fallback: Option<&str>, default: f64) -> Result<f64, TierError> {
        let Some((name, raw)) = self.get(name, fallback) else {
            return Ok(default);
        };
        if raw.is_empty() {
            return Ok(default);
        }
        match raw.trim_end().parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 && v <= 1.0 => Ok(v),
            _ => Err(TierError::Config(format!(
                "{name}={raw:?}: expected a ratio in (0, 1]"
            ))),
        }
    }
}

impl TierConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<TierConfig, TierError> {
        Self::from_lookup(&|name| std::env::var(name).ok())
    }

    /// Reads every variable through `lookup` (name → value), applying the
    /// reference's fallbacks and defaults, then checks the values that need
    /// no filesystem ([`TierConfig::validate`]).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<TierConfig, TierError> {
        let v = Vars { lookup };
        let d = TierConfig::default();
        let backend = match v.get("MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR", None) {
            None => d.backend,
            Some((_, s)) => match s.as_str() {
                "bucket_storage_backend" => StorageBackend::Bucket,
                "file_per_key_storage_backend" => StorageBackend::FilePerKey,
                "offset_allocator_storage_backend"
                | "distributed_storage_backend"
                | "nvme_kv_storage_backend" => {
                    return Err(TierError::Config(format!(
                    "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR={s}: not supported by this build \
                         (use bucket_storage_backend or file_per_key_storage_backend)"
                )))
                }
                _ => {
                    return Err(TierError::Config(format!(
                        "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR={s:?}: unknown backend"
                    )))
                }
            },
        };
        let eviction_policy = match v.get(
            "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY",
            Some("MOONCAKE_BUCKET_EVICTION_POLICY"),
        ) {
            None => d.eviction_policy,
            Some((name, s)) => match s.to_ascii_lowercase().as_str() {
                "none" => EvictionPolicy::None,
                "fifo" => EvictionPolicy::Fifo,
                "lru" => EvictionPolicy::Lru,
                _ => {
                    return Err(TierError::Config(format!(
                        "{name}={s:?}: expected none, fifo or lru"
                    )))
                }
            },
        };
        let config = TierConfig {
            storage_path: v
                .get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", None)
                .map(|(_, p)| PathBuf::from(p))
                .unwrap_or(d.storage_path),
            backend,
            local_buffer_size: v.uint(
                "MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES",
                None,
                d.local_buffer_size,
            )?,
            scanmeta_iterator_keys_limit: v.uint(
                "MOONCAKE_OFFLOAD_SCANMETA_ITERATOR_KEYS_LIMIT",
                Some("MOONCAKE_SCANMETA_ITERATOR_KEYS_LIMIT"),
                d.scanmeta_iterator_keys_limit,
            )?,
            total_keys_limit: v.uint(
                "MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT",
                None,
                d.total_keys_limit,
            )?,
            total_size_limit: v.uint(
                "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES",
                None,
                d.total_size_limit,
            )?,
            heartbeat_interval: Duration::from_secs(v.uint(
                "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS",
                None,
                d.heartbeat_interval.as_secs(),
            )?),
            client_buffer_gc_interval: Duration::from_secs(v.uint(
                "MOONCAKE_OFFLOAD_CLIENT_BUFFER_GC_INTERVAL_SECONDS",
                None,
                d.client_buffer_gc_interval.as_secs(),
            )?),
            client_buffer_gc_ttl: Duration::from_millis(v.uint(
                "MOONCAKE_OFFLOAD_CLIENT_BUFFER_GC_TTL_MS",
                None,
                d.client_buffer_gc_ttl.as_millis() as u64,
            )?),
            use_uring: v.true_false(
                "MOONCAKE_OFFLOAD_USE_URING",
                Some("MOONCAKE_USE_URING"),
                d.use_uring,
            )?,
            enable_disk_watermark_eviction: v.true_false(
                "MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION",
                None,
                d.enable_disk_watermark_eviction,
            )?,
            disk_eviction_high_watermark_ratio: v.ratio(
                "MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO",
                Some("MOONCAKE_DISK_EVICTION_HIGH_WATERMARK_RATIO"),
                d.disk_eviction_high_watermark_ratio,
            )?,
            disk_eviction_low_watermark_ratio: v.ratio(
                "MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO",
                Some("MOONCAKE_DISK_EVICTION_LOW_WATERMARK_RATIO"),
                d.disk_eviction_low_watermark_ratio,
            )?,
            bucket_size_limit: v.uint(
                "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES",
                None,
                d.bucket_size_limit,
            )?,
            bucket_keys_limit: v.uint(
                "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT",
                None,
                d.bucket_keys_limit,
            )?,
            bucket_max_total_size: v.size_or_default(
                "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE",
                Some("MOONCAKE_BUCKET_MAX_TOTAL_SIZE"),
            )?,
            bucket_max_physical_bytes: v
                .size_or_default("MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES", None)?,
            eviction_policy,
            fsdir: v
                .get("MOONCAKE_OFFLOAD_FSDIR", None)
                .map(|(_, s)| s)
                .unwrap_or(d.fsdir),
            file_per_key_eviction: v.canonical_bool(
                "MOONCAKE_OFFLOAD_ENABLE_EVICTION",
                Some("ENABLE_EVICTION"),
                d.file_per_key_eviction,
            )?,
        };
        config.validate()?;
        Ok(config)
    }

    /// The checks that need no filesystem (the reference's `Validate`, minus
    /// the path, which [`TierConfig::validate_path`] checks).
    pub fn validate(&self) -> Result<(), TierError> {
        let bad = |m: &str| Err(TierError::Config(m.to_string()));
        if self.total_keys_limit == 0 {
            return bad("MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT must be > 0");
        }
        if self.total_size_limit == 0 {
            return bad("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES must be > 0");
        }
        if self.heartbeat_interval.is_zero() {
            return bad("MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS must be > 0");
        }
        if self.bucket_size_limit == 0 {
            return bad("MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES must be > 0");
        }
        if self.bucket_keys_limit == 0 {
            return bad("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT must be > 0");
        }
        if self.disk_eviction_low_watermark_ratio >= self.disk_eviction_high_watermark_ratio {
            return bad("MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO must be below the high watermark");
        }
        if self.fsdir.is_empty()
            || Path::new(&self.fsdir)
                .components()
                .any(|c| !matches!(c, Component::Normal(_)))
        {
            return bad("MOONCAKE_OFFLOAD_FSDIR must be a plain relative directory name");
        }
        Ok(())
    }

    /// The reference's path rules: absolute, no `..`, an existing writable
    /// directory that is not a symlink.
    pub fn validate_path(&self) -> Result<(), TierError> {
        let p = &self.storage_path;
        let bad = |m: String| {
            Err(TierError::Config(format!(
                "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH={}: {m}",
                p.display()
            )))
        };
        if !p.is_absolute() {
            return bad("must be an absolute path".into());
        }
        if p.components().any(|c| c == Component::ParentDir) {
            return bad("must not contain ..".into());
        }
        match std::fs::symlink_metadata(p) {
            Err(e) => return bad(format!("{e}")),
            Ok(m) if m.file_type().is_symlink() => return bad("must not be a symbolic link".into()),
            Ok(m) if !m.is_dir() => return bad("is not a directory".into()),
            Ok(_) => {}
        }
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
            .map_err(|_| TierError::Config("storage path contains a NUL byte".into()))?;
        // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
        if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
            return bad(format!("not writable: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// The byte limit eviction keeps the tier under: the smallest of
    /// `BUCKET_MAX_TOTAL_SIZE` (or 90% of `fs_capacity` when it is 0),
    /// `TOTAL_SIZE_LIMIT_BYTES` and `BUCKET_MAX_PHYSICAL_BYTES` when set.
    pub fn byte_limit(&self, fs_capacity: u64) -> u64 {
        let quota = if self.bucket_max_total_size > 0 {
            self.bucket_max_total_size
        } else {
            (fs_capacity as f64 * 0.9) as u64
        };
        let mut limit = quota.min(self.total_size_limit);
        if self.bucket_max_physical_bytes > 0 {
            limit = limit.min(self.bucket_max_physical_bytes);
        }
        limit
    }

    /// The eviction policy of the configured layout.
    pub fn effective_policy(&self) -> EvictionPolicy {
        match self.backend {
            StorageBackend::Bucket => self.eviction_policy,
            StorageBackend::FilePerKey if self.file_per_key_eviction => EvictionPolicy::Fifo,
            StorageBackend::FilePerKey => EvictionPolicy::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<TierConfig, TierError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        TierConfig::from_lookup(&move |name| map.get(name).cloned())
    }

    #[test]
    fn defaults_are_the_references() {
        let c = parse(&[]).unwrap();
        assert_eq!(c, TierConfig::default());
        assert_eq!(c.storage_path, PathBuf::from("/data/file_storage"));
        assert_eq!(c.local_buffer_size, 1_342_177_280);
        assert_eq!(c.total_size_limit, 2_199_023_255_552);
        assert_eq!(c.total_keys_limit, 10_000_000);
        assert_eq!(c.bucket_size_limit, 268_435_456);
        assert_eq!(c.bucket_keys_limit, 500);
        assert_eq!(c.heartbeat_interval, Duration::from_secs(10));
        assert_eq!(c.eviction_policy, EvictionPolicy::Fifo);
        assert!(!c.use_uring);
    }

    #[test]
    fn every_variable_is_read() {
        let c = parse(&[
            ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/nvme/x"),
            (
                "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR",
                "file_per_key_storage_backend",
            ),
            ("MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES", "4096"),
            ("MOONCAKE_OFFLOAD_SCANMETA_ITERATOR_KEYS_LIMIT", " +7 "),
            ("MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT", "9"),
            ("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "1000"),
            ("MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS", "1"),
            ("MOONCAKE_OFFLOAD_CLIENT_BUFFER_GC_INTERVAL_SECONDS", "3"),
            ("MOONCAKE_OFFLOAD_CLIENT_BUFFER_GC_TTL_MS", "250"),
            ("MOONCAKE_OFFLOAD_USE_URING", "1"),
            ("MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION", "FALSE"),
            ("MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO", "0.7"),
            ("MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO", "0.5"),
            ("MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES", "10485760"),
            ("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "10"),
            ("MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE", "123456"),
            ("MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES", "99999"),
            ("MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", "lru"),
            ("MOONCAKE_OFFLOAD_FSDIR", "objs"),
            ("MOONCAKE_OFFLOAD_ENABLE_EVICTION", " off"),
        ])
        .unwrap();
        assert_eq!(c.storage_path, PathBuf::from("/nvme/x"));
        assert_eq!(c.backend, StorageBackend::FilePerKey);
        assert_eq!(c.local_buffer_size, 4096);
        assert_eq!(c.scanmeta_iterator_keys_limit, 7);
        assert_eq!(c.total_keys_limit, 9);
        assert_eq!(c.total_size_limit, 1000);
        assert_eq!(c.heartbeat_interval, Duration::from_secs(1));
        assert_eq!(c.client_buffer_gc_interval, Duration::from_secs(3));
        assert_eq!(c.client_buffer_gc_ttl, Duration::from_millis(250));
        assert!(c.use_uring);
        assert!(!c.enable_disk_watermark_eviction);
        assert_eq!(c.disk_eviction_high_watermark_ratio, 0.7);
        assert_eq!(c.disk_eviction_low_watermark_ratio, 0.5);
        assert_eq!(c.bucket_size_limit, 10 << 20);
        assert_eq!(c.bucket_keys_limit, 10);
        assert_eq!(c.bucket_max_total_size, 123456);
        assert_eq!(c.bucket_max_physical_bytes, 99999);
        assert_eq!(c.eviction_policy, EvictionPolicy::Lru);
        assert_eq!(c.fsdir, "objs");
        assert!(!c.file_per_key_eviction);
        assert_eq!(c.effective_policy(), EvictionPolicy::None);
    }

    #[test]
    fn fallback_names_apply_only_when_the_primary_is_unset() {
        let c = parse(&[
            ("MOONCAKE_USE_URING", "true"),
            ("MOONCAKE_BUCKET_EVICTION_POLICY", "none"),
            ("MOONCAKE_BUCKET_MAX_TOTAL_SIZE", "77"),
            ("MOONCAKE_SCANMETA_ITERATOR_KEYS_LIMIT", "5"),
            ("ENABLE_EVICTION", "no"),
        ])
        .unwrap();
        assert!(c.use_uring);
        assert_eq!(c.eviction_policy, EvictionPolicy::None);
        assert_eq!(c.bucket_max_total_size, 77);
        assert_eq!(c.scanmeta_iterator_keys_limit, 5);
        assert!(!c.file_per_key_eviction);
        let c = parse(&[
            ("MOONCAKE_OFFLOAD_USE_URING", "false"),
            ("MOONCAKE_USE_URING", "true"),
        ])
        .unwrap();
        assert!(!c.use_uring);
    }

    #[test]
    fn bad_values_are_errors_naming_the_variable() {
        for (k, v) in [
            ("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "ten"),
            ("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "0"),
            ("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "-1"),
            ("MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS", "0"),
            ("MOONCAKE_OFFLOAD_USE_URING", "yes"),
            ("MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", "random"),
            ("MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO", "1.5"),
            ("MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO", "0.95"),
            ("MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR", "bucket"),
            (
                "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR",
                "offset_allocator_storage_backend",
            ),
            ("MOONCAKE_OFFLOAD_FSDIR", "../up"),
        ] {
            let err = parse(&[(k, v)]).expect_err(k).to_string();
            assert!(err.contains("MOONCAKE_OFFLOAD_"), "{k}={v}: {err}");
        }
    }

    #[test]
    fn byte_limit_defaults_to_ninety_percent_of_the_filesystem() {
        let mut c = TierConfig::default();
        assert_eq!(c.byte_limit(1000), 900);
        c.bucket_max_total_size = 500;
        assert_eq!(c.byte_limit(1000), 500);
        c.total_size_limit = 400;
        assert_eq!(c.byte_limit(1000), 400);
        c.bucket_max_physical_bytes = 300;
        assert_eq!(c.byte_limit(1000), 300);
        // A negative threshold is "unset", as the reference's `<= 0` check.
        let c = parse(&[("MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE", "-5")]).unwrap();
        assert_eq!(c.byte_limit(1000), 900);
    }

    #[test]
    fn storage_path_rules() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = TierConfig {
            storage_path: dir.path().to_path_buf(),
            ..TierConfig::default()
        };
        c.validate_path().unwrap();
        c.storage_path = PathBuf::from("relative/dir");
        assert!(c.validate_path().is_err());
        c.storage_path = dir.path().join("a/../b");
        assert!(c.validate_path().is_err());
        c.storage_path = dir.path().join("missing");
        assert!(c.validate_path().is_err());
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        c.storage_path = link;
        assert!(c.validate_path().is_err());
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        c.storage_path = file;
        assert!(c.validate_path().is_err());
    }
}
