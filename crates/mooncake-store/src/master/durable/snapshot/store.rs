//! Where snapshots are kept: a local directory
//! (`MOONCAKE_SNAPSHOT_LOCAL_PATH`) or an S3 bucket (the reference's
//! `MOONCAKE_AWS_*` variables), both behind [`SnapshotStore`].
//!
//! Objects are named `snapshot-<seq, 20 digits>.mcs`, so names sort by
//! log position. A local snapshot is written to a temporary file,
//! synced and renamed into place, so a crash never leaves half of one
//! under its name; an S3 put is atomic.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mooncake_common::{Error, ErrorCode, Result};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload};

use crate::master::config::SNAPSHOT_DIR;

const PREFIX: &str = "snapshot-";
const SUFFIX: &str = ".mcs";

/// The name of the snapshot at `seq`.
pub fn snapshot_name(seq: u64) -> String {
    format!("{PREFIX}{seq:020}{SUFFIX}")
}

/// The seq a snapshot name stands for.
pub fn parse_name(name: &str) -> Option<u64> {
    name.strip_prefix(PREFIX)?
        .strip_suffix(SUFFIX)?
        .parse()
        .ok()
}

/// A place that keeps snapshots by name.
pub trait SnapshotStore: Send + Sync {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()>;
    /// Stores the file at `path` under `name`. By default it is read
    /// whole, then `put`.
    fn put_file(&self, name: &str, path: &Path) -> Result<()> {
        let bytes = std::fs::read(path)
            .map_err(|e| store_error(ErrorCode::FILE_READ_FAIL, &path.display().to_string(), e))?;
        self.put(name, &bytes)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>>;
    /// The seqs of the snapshots kept, ascending.
    fn list(&self) -> Result<Vec<u64>>;
    fn delete(&self, name: &str) -> Result<()>;
    /// Where it is, for logs.
    fn describe(&self) -> String;
}

fn store_error(code: ErrorCode, what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(code, format!("snapshot store: {what}: {e}"))
}

/// Snapshots in a local directory.
pub struct LocalStore {
    dir: PathBuf,
}

impl LocalStore {
    pub fn new(dir: impl Into<PathBuf>) -> Result<LocalStore> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)
            .map_err(|e| store_error(ErrorCode::FILE_OPEN_FAIL, &dir.display().to_string(), e))?;
        Ok(LocalStore { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl LocalStore {
    /// Writes `name` through a temporary file `fill` fills, synced and
    /// renamed into place.
    fn put_with(&self, name: &str, fill: impl FnOnce(&Path) -> std::io::Result<()>) -> Result<()> {
        // Per process: masters of one cluster may share the directory.
        let tmp = self.dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let path = self.dir.join(name);
        let io = |what: &str, e: std::io::Error| {
            store_error(
                ErrorCode::FILE_WRITE_FAIL,
                &format!("{what} {}", path.display()),
                e,
            )
        };
        fill(&tmp).map_err(|e| io("write", e))?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| io("sync", e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io("rename", e))?;
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("sync directory of", e))
    }
}

impl SnapshotStore for LocalStore {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.put_with(name, |tmp| {
            let mut f = std::fs::File::create(tmp)?;
            f.write_all(bytes)
        })
    }

    fn put_file(&self, name: &str, path: &Path) -> Result<()> {
        // Copied by the kernel, never held in memory.
        self.put_with(name, |tmp| std::fs::copy(path, tmp).map(|_| ()))
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let path = self.dir.join(name);
        std::fs::read(&path)
            .map_err(|e| store_error(ErrorCode::FILE_READ_FAIL, &path.display().to_string(), e))
    }

    fn list(&self) -> Result<Vec<u64>> {
        let read = std::fs::read_dir(&self.dir).map_err(|e| {
            store_error(
                ErrorCode::FILE_OPEN_FAIL,
                &self.dir.display().to_string(),
                e,
            )
        })?;
        let mut seqs: Vec<u64> = read
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(parse_name))
            .collect();
        seqs.sort_unstable();
        Ok(seqs)
    }

    fn delete(&self, name: &str) -> Result<()> {
        let path = self.dir.join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(store_error(
                ErrorCode::FILE_WRITE_FAIL,
                &path.display().to_string(),
                e,
            )),
            _ => Ok(()),
        }
    }

    fn describe(&self) -> String {
        format!("local:{}", self.dir.display())
    }
}

/// Snapshots in an S3 bucket (any S3-compatible server).
pub struct S3Store {
    store: Arc<dyn ObjectStore>,
    bucket: String,
    prefix: String,
    runtime: tokio::runtime::Runtime,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn env_bool(name: &str, default: bool) -> Result<bool> {
    match env(name) {
        None => Ok(default),
        Some(v) => mooncake_common::gflags::parse_bool(&v)
            .map_err(|e| Error::new(ErrorCode::INVALID_PARAMS, format!("{name}={v:?}: {e}"))),
    }
}

/// How to reach an S3 bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Settings {
    pub bucket: String,
    pub region: String,
    /// `http(s)://host:port` of an S3-compatible server (AWS when None).
    pub endpoint: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub virtual_hosted: bool,
    /// Prepended to every snapshot name.
    pub prefix: String,
}

impl S3Settings {
    /// The reference's variables: `MOONCAKE_AWS_BUCKET_NAME` (required),
    /// `MOONCAKE_AWS_REGION`, `MOONCAKE_AWS_S3_ENDPOINT`,
    /// `MOONCAKE_AWS_ACCESS_KEY_ID`, `MOONCAKE_AWS_SECRET_ACCESS_KEY`,
    /// `MOONCAKE_AWS_USE_HTTPS`, `MOONCAKE_AWS_USE_VIRTUAL_ADDRESSING`;
    /// snapshots go under `MOONCAKE_SNAPSHOT_S3_PREFIX` (the deployment
    /// guide's name, as is `MOONCAKE_SNAPSHOT_S3_BUCKET`), then
    /// `mooncake_master_snapshot/<cluster>/`.
    pub fn from_env(cluster: &str) -> Result<S3Settings> {
        let bucket = env("MOONCAKE_AWS_BUCKET_NAME")
            .or_else(|| env("MOONCAKE_SNAPSHOT_S3_BUCKET"))
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::INVALID_PARAMS,
                    "S3 snapshots need MOONCAKE_AWS_BUCKET_NAME",
                )
            })?;
        let https = env_bool("MOONCAKE_AWS_USE_HTTPS", true)?;
        let endpoint = env("MOONCAKE_AWS_S3_ENDPOINT").map(|e| {
            if e.contains("://") {
                e
            } else {
                format!("{}://{e}", if https { "https" } else { "http" })
            }
        });
        Ok(S3Settings {
            bucket,
            region: env("MOONCAKE_AWS_REGION").unwrap_or_else(|| "us-east-1".into()),
            endpoint,
            access_key_id: env("MOONCAKE_AWS_ACCESS_KEY_ID"),
            secret_access_key: env("MOONCAKE_AWS_SECRET_ACCESS_KEY"),
            virtual_hosted: env_bool("MOONCAKE_AWS_USE_VIRTUAL_ADDRESSING", true)?,
            prefix: format!(
                "{}{SNAPSHOT_DIR}/{cluster}/",
                env("MOONCAKE_SNAPSHOT_S3_PREFIX").unwrap_or_default()
            ),
        })
    }
}

impl S3Store {
    /// The store of `cluster` the environment describes
    /// ([`S3Settings::from_env`]).
    pub fn from_env(cluster: &str) -> Result<S3Store> {
        S3Store::new(S3Settings::from_env(cluster)?)
    }

    pub fn new(s: S3Settings) -> Result<S3Store> {
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&s.bucket)
            .with_region(&s.region)
            .with_virtual_hosted_style_request(s.virtual_hosted);
        if let Some(endpoint) = &s.endpoint {
            b = b
                .with_allow_http(endpoint.starts_with("http://"))
                .with_endpoint(endpoint);
        }
        if let (Some(id), Some(secret)) = (&s.access_key_id, &s.secret_access_key) {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
        }
        let store = b
            .build()
            .map_err(|e| store_error(ErrorCode::INVALID_PARAMS, "S3 configuration", e))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("mc-snapshot-s3")
            .enable_all()
            .build()
            .map_err(|e| store_error(ErrorCode::INTERNAL_ERROR, "runtime", e))?;
        Ok(S3Store {
            store: Arc::new(store),
            bucket: s.bucket,
            prefix: s.prefix,
            runtime,
        })
    }

    fn path(&self, name: &str) -> ObjectPath {
        ObjectPath::from(format!("{}{name}", self.prefix))
    }

    /// Runs `f` on the store's runtime from any thread (also from inside
    /// another runtime, where blocking on this one directly is refused).
    fn block<T: Send>(&self, f: impl std::future::Future<Output = T> + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| self.runtime.block_on(f))
                .join()
                .expect("S3 call panicked")
        })
    }
}

impl SnapshotStore for S3Store {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let path = self.path(name);
        let payload = PutPayload::from(bytes.to_vec());
        self.block(self.store.put(&path, payload))
            .map(|_| ())
            .map_err(|e| store_error(ErrorCode::FILE_WRITE_FAIL, &format!("put {path}"), e))
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let path = self.path(name);
        self.block(async {
            let r = self.store.get(&path).await?;
            r.bytes().await
        })
        .map(|b| b.to_vec())
        .map_err(|e| store_error(ErrorCode::FILE_READ_FAIL, &format!("get {path}"), e))
    }

    fn list(&self) -> Result<Vec<u64>> {
        use futures::TryStreamExt as _;
        let prefix = (!self.prefix.is_empty()).then(|| ObjectPath::from(self.prefix.as_str()));
        let metas: Vec<_> = self
            .block(self.store.list(prefix.as_ref()).try_collect::<Vec<_>>())
            .map_err(|e| store_error(ErrorCode::FILE_READ_FAIL, "list", e))?;
        let mut seqs: Vec<u64> = metas
            .iter()
            .filter_map(|m| m.location.filename().and_then(parse_name))
            .collect();
        seqs.sort_unstable();
        Ok(seqs)
    }

    fn delete(&self, name: &str) -> Result<()> {
        let path = self.path(name);
        match self.block(self.store.delete(&path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error(
                ErrorCode::FILE_WRITE_FAIL,
                &format!("delete {path}"),
                e,
            )),
        }
    }

    fn describe(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }
}
