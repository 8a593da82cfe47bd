//! The HTTP metadata server, as a library: an in-memory KV behind
//! `GET|PUT|DELETE /metadata?key=KEY`, speaking the reference protocol
//! (404 `metadata not found` for a missing key).
//!
//! - [`serve`] runs it on a listener the caller owns, until `shutdown`
//!   resolves; spawn it on any tokio runtime.
//! - [`MetadataServer::bind`] (on the current runtime) and
//!   [`MetadataServer::spawn`] (on a thread of its own) bind `host:port`
//!   and return a handle with the bound address that stops the server.
//!
//! The master embeds it (`--enable_http_metadata_server`) and the
//! `mooncake_http_metadata_server` binary is a shell around it.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::RwLock;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::guard;
pub use super::guard::{ServerPolicy, DEFAULT_MAX_KEYS, DEFAULT_MAX_VALUE_SIZE};
use super::http::NOT_FOUND_BODY;
use super::{MetadataStore, MAX_VALUE_LEN};
use crate::http_serve::HttpLimits;

/// What [`MemoryStore::put_checked`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PutOutcome {
    Updated,
    Unchanged,
    DuplicateRpcMeta,
    /// A new key, and the store already holds its most keys.
    Full,
}

/// The server's KV: a map from key to value. Values are [`Bytes`], so a GET
/// hands out a reference count rather than a copy. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct MemoryStore {
    map: Arc<RwLock<HashMap<String, Bytes>>>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    pub fn get_bytes(&self, key: &str) -> Option<Bytes> {
        self.map.read().get(key).cloned()
    }

    pub(crate) fn insert(&self, key: String, value: Bytes) {
        self.map.write().insert(key, value);
    }

    /// A PUT as the reference's servers take it: an engine's location
    /// (`.../rpc_meta/<name>`) is never overwritten with another value, so
    /// a second engine of the same name cannot take over the first's.
    pub(crate) fn put_checked(&self, key: String, value: Bytes, max_keys: usize) -> PutOutcome {
        let mut map = self.map.write();
        if map.len() >= max_keys && !map.contains_key(&key) {
            return PutOutcome::Full;
        }
        if key.contains("rpc_meta") {
            if let Some(old) = map.get(&key) {
                return if *old == value {
                    PutOutcome::Unchanged
                } else {
                    PutOutcome::DuplicateRpcMeta
                };
            }
        }
        map.insert(key, value);
        PutOutcome::Updated
    }

    /// Whether the key was there.
    pub(crate) fn remove(&self, key: &str) -> bool {
        self.map.write().remove(key).is_some()
    }

    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl MetadataStore for MemoryStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.get_bytes(key).map(|b| b.to_vec()))
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.insert(key.to_string(), Bytes::copy_from_slice(value));
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.remove(key);
        Ok(())
    }
}

/// What the handlers share: the KV and what it accepts.
#[derive(Clone)]
struct Served {
    store: MemoryStore,
    policy: Arc<ServerPolicy>,
}

/// The routes, over `store`.
pub(crate) fn router(store: MemoryStore, policy: ServerPolicy) -> Router {
    let body_limit = policy.max_value_size.min(MAX_VALUE_LEN);
    Router::new()
        .route("/metadata", get(get_key).put(put_key).delete(delete_key))
        // What the reference master's embedded server answers to probes.
        .route("/health", get(|| async { "OK" }))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(Served {
            store,
            policy: Arc::new(policy),
        })
}

/// Serves a fresh, empty store on `listener` until `shutdown` resolves, then
/// lets requests in flight finish.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_with(listener, ServerPolicy::default(), shutdown).await
}

/// [`serve`] under `policy` (budgets, cluster token).
pub async fn serve_with(
    listener: TcpListener,
    policy: ServerPolicy,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_store(listener, MemoryStore::new(), policy, shutdown).await
}

/// [`serve_with`] over a store the caller keeps a handle to.
pub async fn serve_store(
    listener: TcpListener,
    store: MemoryStore,
    policy: ServerPolicy,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let limits = HttpLimits::default();
    crate::http_serve::serve(
        "metadata",
        listener,
        router(store, policy),
        limits,
        shutdown,
    )
    .await
}

#[derive(Deserialize)]
struct KeyParam {
    key: Option<String>,
}

/// A request the server refuses, with a message saying why.
type Rejection = (StatusCode, &'static str);

impl KeyParam {
    fn key(self) -> std::result::Result<String, Rejection> {
        match self.key {
            Some(k) if !k.is_empty() => Ok(k),
            _ => Err((
                StatusCode::BAD_REQUEST,
                "missing 'key' query parameter: use /metadata?key=KEY",
            )),
        }
    }
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, NOT_FOUND_BODY).into_response()
}

async fn get_key(
    State(Served { store, .. }): State<Served>,
    Query(param): Query<KeyParam>,
) -> std::result::Result<Response, Rejection> {
    Ok(match store.get_bytes(&param.key()?) {
        Some(value) => ([(header::CONTENT_TYPE, "application/json")], value).into_response(),
        None => not_found(),
    })
}

const UNAUTHORIZED: Rejection = (
    StatusCode::UNAUTHORIZED,
    "this metadata server requires Authorization: Bearer <cluster token> on writes",
);
const OWNER_ALIVE: Rejection = (
    StatusCode::CONFLICT,
    "the engine owning this key is alive; only it may replace or delete it",
);

/// Whether the engine owning `key` (a segment or location key) accepts
/// connections at the location it published.
async fn owner_alive(store: &MemoryStore, key: &str) -> bool {
    let Some(name) = guard::engine_of(key) else {
        return false;
    };
    match store.get_bytes(&super::rpc_meta_key(name)) {
        Some(meta) => guard::is_alive(&meta).await,
        None => false,
    }
}

async fn put_key(
    State(Served { store, policy }): State<Served>,
    Query(param): Query<KeyParam>,
    headers: HeaderMap,
    body: Bytes,
) -> std::result::Result<Response, Rejection> {
    let key = param.key()?;
    if !policy.authorizes(headers.get(header::AUTHORIZATION).map(|v| v.as_bytes())) {
        return Err(UNAUTHORIZED);
    }
    if body.len() > policy.max_value_size {
        return Err((StatusCode::PAYLOAD_TOO_LARGE, "metadata value too large"));
    }
    if policy.guards_live_keys() && key.starts_with("mooncake/ram/") {
        let replaces_server = store
            .get_bytes(&key)
            .is_some_and(|old| guard::changes_server(&old, &body));
        if replaces_server && owner_alive(&store, &key).await {
            return Err(OWNER_ALIVE);
        }
    }
    Ok(match store.put_checked(key, body, policy.max_keys) {
        PutOutcome::Updated => (StatusCode::OK, "metadata updated"),
        PutOutcome::Unchanged => (StatusCode::OK, "metadata unchanged"),
        PutOutcome::DuplicateRpcMeta => (
            StatusCode::BAD_REQUEST,
            "Duplicate rpc_meta key not allowed",
        ),
        PutOutcome::Full => (
            StatusCode::INSUFFICIENT_STORAGE,
            "metadata server holds its most keys",
        ),
    }
    .into_response())
}

async fn delete_key(
    State(Served { store, policy }): State<Served>,
    Query(param): Query<KeyParam>,
    headers: HeaderMap,
) -> std::result::Result<Response, Rejection> {
    let key = param.key()?;
    if !policy.authorizes(headers.get(header::AUTHORIZATION).map(|v| v.as_bytes())) {
        return Err(UNAUTHORIZED);
    }
    if policy.guards_live_keys() && owner_alive(&store, &key).await {
        return Err(OWNER_ALIVE);
    }
    Ok(if store.remove(&key) {
        (StatusCode::OK, "metadata deleted").into_response()
    } else {
        not_found()
    })
}

/// A running server. Dropping the handle stops it too (without waiting).
pub struct MetadataServer {
    addr: SocketAddr,
    store: MemoryStore,
    /// Dropping or firing this ends [`serve_store`].
    stop: Option<oneshot::Sender<()>>,
    runner: Option<Runner>,
}

enum Runner {
    Task(tokio::task::JoinHandle<io::Result<()>>),
    Thread(std::thread::JoinHandle<io::Result<()>>),
}

impl MetadataServer {
    /// Binds `host:port` (port 0 picks a free one) and serves on the current
    /// tokio runtime.
    pub async fn bind(host: &str, port: u16) -> Result<MetadataServer> {
        Self::bind_with(host, port, ServerPolicy::default()).await
    }

    /// [`bind`](Self::bind) under `policy`.
    pub async fn bind_with(host: &str, port: u16, policy: ServerPolicy) -> Result<MetadataServer> {
        let listener = TcpListener::bind((unbracket(host), port))
            .await
            .map_err(|e| bind_error(host, port, e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| bind_error(host, port, e))?;
        let store = MemoryStore::new();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_store(listener, store.clone(), policy, async move {
            let _ = stopped.await;
        }));
        Ok(MetadataServer {
            addr,
            store,
            stop: Some(stop),
            runner: Some(Runner::Task(task)),
        })
    }

    /// Binds `host:port` and serves on a thread of its own with its own
    /// runtime. Callable from anywhere, async context or not.
    pub fn spawn(host: &str, port: u16) -> Result<MetadataServer> {
        Self::spawn_with(host, port, ServerPolicy::default())
    }

    /// [`spawn`](Self::spawn) under `policy`.
    pub fn spawn_with(host: &str, port: u16, policy: ServerPolicy) -> Result<MetadataServer> {
        let std_listener = std::net::TcpListener::bind((unbracket(host), port))
            .map_err(|e| bind_error(host, port, e))?;
        let addr = std_listener
            .local_addr()
            .map_err(|e| bind_error(host, port, e))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| bind_error(host, port, e))?;
        let store = MemoryStore::new();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread_store = store.clone();
        let thread = std::thread::Builder::new()
            .name("mc-http-metadata".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let listener = TcpListener::from_std(std_listener)?;
                    serve_store(listener, thread_store, policy, async move {
                        let _ = stopped.await;
                    })
                    .await
                })
            })
            .map_err(|e| {
                Error::new(
                    ErrorCode::ERR_METADATA,
                    format!("cannot start metadata server thread: {e}"),
                )
            })?;
        Ok(MetadataServer {
            addr,
            store,
            stop: Some(stop),
            runner: Some(Runner::Thread(thread)),
        })
    }

    /// The bound address (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A URL clients on this host can use; a wildcard bind address becomes
    /// loopback.
    pub fn url(&self) -> String {
        let ip = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        format!("http://{}/metadata", SocketAddr::new(ip, self.addr.port()))
    }

    /// The served KV, for in-process readers.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    /// Stops the server. With [`spawn`](Self::spawn) this waits until the
    /// listener is closed; with [`bind`](Self::bind) it only asks (use
    /// [`shutdown`](Self::shutdown) to wait there).
    pub fn stop(mut self) {
        self.stop.take();
        if let Some(Runner::Thread(thread)) = self.runner.take() {
            let _ = thread.join();
        }
    }

    /// Stops the server and waits until it has finished.
    pub async fn shutdown(mut self) -> Result<()> {
        self.stop.take();
        let served = match self.runner.take() {
            Some(Runner::Task(task)) => task.await.map_err(|e| io::Error::other(e.to_string())),
            Some(Runner::Thread(thread)) => tokio::task::spawn_blocking(move || thread.join())
                .await
                .map_err(|e| io::Error::other(e.to_string()))
                .and_then(|joined| {
                    joined.map_err(|_| io::Error::other("metadata server thread panicked"))
                }),
            None => Ok(Ok(())),
        };
        served.and_then(|r| r).map_err(|e| {
            Error::new(
                ErrorCode::ERR_METADATA,
                format!("metadata server on {}: {e}", self.addr),
            )
        })
    }
}

impl Drop for MetadataServer {
    fn drop(&mut self) {
        // Dropping the sender resolves the shutdown future.
        self.stop.take();
    }
}

/// `[::1]` → `::1`, so IPv6 literals can be written as in URLs.
fn unbracket(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

fn bind_error(host: &str, port: u16, e: io::Error) -> Error {
    Error::new(
        ErrorCode::ERR_SOCKET,
        format!("cannot bind metadata server to {host}:{port}: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_store_round_trip() {
        let s = MemoryStore::new();
        assert!(s.is_empty());
        s.put("k", b"v1").unwrap();
        s.put("k", b"v2").unwrap();
        assert_eq!(s.get("k").unwrap().as_deref(), Some(&b"v2"[..]));
        assert_eq!(s.len(), 1);
        s.delete("k").unwrap();
        s.delete("k").unwrap();
        assert_eq!(s.get("k").unwrap(), None);
    }

    #[test]
    fn url_uses_loopback_for_wildcard_binds() {
        let server = MetadataServer::spawn("0.0.0.0", 0).unwrap();
        let port = server.local_addr().port();
        assert_ne!(port, 0);
        assert_eq!(server.url(), format!("http://127.0.0.1:{port}/metadata"));
        server.stop();
        // The port is free again once stop() returns.
        std::net::TcpListener::bind(("0.0.0.0", port)).unwrap();
    }

    #[test]
    fn bind_error_is_reported() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let e = MetadataServer::spawn("127.0.0.1", port).err().unwrap();
        assert_eq!(e.code, ErrorCode::ERR_SOCKET);
        assert!(e.context.contains(&port.to_string()));
    }

    #[test]
    fn unbracket_ipv6() {
        assert_eq!(unbracket("[::1]"), "::1");
        assert_eq!(unbracket("::1"), "::1");
        assert_eq!(unbracket("host"), "host");
    }
}
