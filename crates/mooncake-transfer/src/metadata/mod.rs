//! Where segment descriptors live. The `metadata_server` string picks the
//! backend: `http://host:port/metadata`, `etcd://host:port` (or a bare
//! `host:port`), `redis://host:port`, or `P2PHANDSHAKE` (no central store:
//! peers ask each other over the engine's RPC port, see the engine).
//!
//! Every KV backend implements [`MetadataStore`]; one file per backend:
//! [`http`] (client), [`http_server`] (the server, as a library), [`etcd`],
//! [`redis`]. [`connect`] opens the one a [`MetadataUri`] names;
//! [`MetadataStoreExt`] adds JSON get/put on top of any of them.

pub mod etcd;
pub(crate) mod http;
pub mod http_server;
pub mod redis;

mod driver;
mod guard;

/// The private runtime the async backends block on; the P2P store's etcd
/// catalog runs on one too.
pub use driver::Driver;

use std::sync::Arc;
use std::time::Duration;

use mooncake_common::auth::ClusterToken;
use mooncake_common::{Error, ErrorCode, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Bound on reaching a metadata server: past it the server counts as
/// unreachable (`ERR_METADATA`).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Bound on one metadata request, connection included.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest value the HTTP client and server accept (segment descriptors
/// are kilobytes; this only stops a runaway peer).
pub(crate) const MAX_VALUE_LEN: usize = 64 << 20;

/// Key under which a server publishes `{ip_or_host_name, rpc_port}`.
pub(crate) fn rpc_meta_key(server_name: &str) -> String {
    format!("mooncake/rpc_meta/{server_name}")
}

/// Key under which a RAM segment's descriptor is published.
pub fn segment_key(segment_name: &str) -> String {
    format!("mooncake/ram/{segment_name}")
}

/// A key-value store for segment metadata.
///
/// Calls block. They must work from any thread, including a tokio
/// `spawn_blocking` thread; backends that need async I/O drive it on a runtime
/// of their own. An unreachable server is `ERR_METADATA`; a missing key on
/// `get` is `Ok(None)`, not an error.
pub trait MetadataStore: Send + Sync + 'static {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;
    fn put(&self, key: &str, value: &[u8]) -> Result<()>;
    fn delete(&self, key: &str) -> Result<()>;
}

/// JSON on top of any [`MetadataStore`]: descriptors are JSON documents.
/// A value that does not parse is `ERR_MALFORMED_JSON`.
pub trait MetadataStoreExt: MetadataStore {
    fn get_json<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
        match self.get(key)? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                Error::new(
                    ErrorCode::ERR_MALFORMED_JSON,
                    format!("metadata key {key:?}: {e}"),
                )
            }),
        }
    }

    fn put_json<T: Serialize + ?Sized>(&self, key: &str, value: &T) -> Result<()> {
        let bytes = serde_json::to_vec(value).map_err(|e| {
            Error::new(
                ErrorCode::ERR_MALFORMED_JSON,
                format!("metadata key {key:?}: {e}"),
            )
        })?;
        self.put(key, &bytes)
    }
}

impl<S: MetadataStore + ?Sized> MetadataStoreExt for S {}

/// A parsed `metadata_server` connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataUri {
    /// Full URL, e.g. `http://127.0.0.1:8080/metadata`.
    Http(String),
    /// One or more `host:port` endpoints (`;` or `,` separated in the string).
    Etcd(Vec<String>),
    /// `host:port` of a redis server.
    Redis(String),
    /// `P2PHANDSHAKE`: descriptors are exchanged peer to peer.
    P2p,
}

impl MetadataUri {
    pub fn parse(conn: &str) -> Result<MetadataUri> {
        let conn = conn.trim();
        let bad = || {
            Error::new(
                ErrorCode::ERR_METADATA,
                format!("invalid metadata server {conn:?}"),
            )
        };
        if conn.eq_ignore_ascii_case("P2PHANDSHAKE") {
            return Ok(MetadataUri::P2p);
        }
        if conn.starts_with("http://") || conn.starts_with("https://") {
            return Ok(MetadataUri::Http(conn.to_string()));
        }
        if let Some(rest) = conn.strip_prefix("redis://") {
            if rest.is_empty() {
                return Err(bad());
            }
            return Ok(MetadataUri::Redis(rest.trim_end_matches('/').to_string()));
        }
        let rest = conn.strip_prefix("etcd://").unwrap_or(conn);
        if rest.contains("://") {
            return Err(bad());
        }
        let endpoints: Vec<String> = rest
            .split([';', ','])
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        if endpoints.is_empty() || endpoints.iter().any(|e| !e.contains(':')) {
            return Err(bad());
        }
        Ok(MetadataUri::Etcd(endpoints))
    }
}

/// Opens the KV backend named by `uri` and checks that its server answers,
/// so a wrong or dead address fails here with `ERR_METADATA` (within
/// [`CONNECT_TIMEOUT`] or so) rather than at first use. `P2p` has no KV store
/// and is an error here; the engine handles it itself.
///
/// Redis reads `MC_REDIS_PASSWORD` and `MC_REDIS_DB_INDEX` from the
/// environment.
pub fn connect(uri: &MetadataUri) -> Result<Arc<dyn MetadataStore>> {
    connect_with_token(uri, None)
}

/// [`connect`], presenting `token` to an HTTP metadata server
/// (`Authorization: Bearer`); etcd and Redis have their own credentials.
pub fn connect_with_token(
    uri: &MetadataUri,
    token: Option<&ClusterToken>,
) -> Result<Arc<dyn MetadataStore>> {
    match uri {
        MetadataUri::Http(url) => Ok(Arc::new(http::HttpStore::connect(url, token)?)),
        MetadataUri::Etcd(endpoints) => Ok(Arc::new(etcd::EtcdStore::connect(endpoints)?)),
        MetadataUri::Redis(addr) => Ok(Arc::new(redis::RedisStore::connect(addr)?)),
        MetadataUri::P2p => Err(Error::new(
            ErrorCode::ERR_METADATA,
            "P2PHANDSHAKE has no metadata store to connect to",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_connection_strings() {
        assert_eq!(
            MetadataUri::parse("P2PHANDSHAKE").unwrap(),
            MetadataUri::P2p
        );
        assert_eq!(
            MetadataUri::parse("http://127.0.0.1:8080/metadata").unwrap(),
            MetadataUri::Http("http://127.0.0.1:8080/metadata".into())
        );
        assert_eq!(
            MetadataUri::parse("etcd://10.0.0.1:2379").unwrap(),
            MetadataUri::Etcd(vec!["10.0.0.1:2379".into()])
        );
        assert_eq!(
            MetadataUri::parse("10.0.0.1:2379;10.0.0.2:2379").unwrap(),
            MetadataUri::Etcd(vec!["10.0.0.1:2379".into(), "10.0.0.2:2379".into()])
        );
        assert_eq!(
            MetadataUri::parse("redis://h:6379").unwrap(),
            MetadataUri::Redis("h:6379".into())
        );
        for bad in ["", "redis://", "ftp://x:1", "justahost"] {
            assert_eq!(
                MetadataUri::parse(bad).unwrap_err().code,
                ErrorCode::ERR_METADATA,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn key_names_match_the_reference() {
        assert_eq!(rpc_meta_key("node0"), "mooncake/rpc_meta/node0");
        assert_eq!(segment_key("node0"), "mooncake/ram/node0");
    }
}
