//! A stand-in for the Kubernetes API server's wire contract, for tests of
//! clients that elect a leader on a `coordination.k8s.io/v1` Lease and
//! label their pod. No cluster can run on the test machines; this serves
//! the few endpoints such a client uses, with the server's rules:
//!
//! - `/apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]`: GET
//!   (one or a list), POST, PUT, PATCH, DELETE;
//! - `/api/v1/namespaces/{ns}/pods/{name}`: GET, PATCH (pods are made with
//!   [`StandIn::add_pod`]);
//! - `resourceVersion` compare-and-swap (409 `Conflict`), 404 `NotFound`,
//!   409 `AlreadyExists` on POST, 422 on a PUT without `resourceVersion`
//!   (the Lease strategy allows no unconditional update), `Status` bodies;
//! - MicroTime fields (`acquireTime`, `renewTime`) parsed with exactly six
//!   fractional digits, as Go's layout demands, and written back in UTC;
//! - bearer tokens (401 when unknown, once any token is configured);
//! - plain HTTP or HTTPS with a CA made at run time ([`tls::TestCa`]);
//! - faults: [`freeze`](StandIn::freeze) holds every request unanswered
//!   (an unreachable server that keeps connections open), and
//!   [`deny`](StandIn::deny) answers 403 for a verb on a resource, worded
//!   as RBAC words it.
//!
//! Only JSON is spoken. client-go can send protobuf
//! (`application/vnd.kubernetes.protobuf`) when configured to; such a body
//! gets 415 and a client accepting nothing but protobuf gets 406, where a
//! real server would answer. Every Kubernetes client accepts JSON answers,
//! and a client asking for protobuf-or-JSON gets JSON, as a real server
//! may serve it. Strategic merge patches are applied as JSON merge patches,
//! which is the same on maps such as labels but not on lists.

mod http;
pub mod kind;
pub mod micro_time;
pub mod status;
pub mod store;
pub mod tls;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use status::ApiError;
pub use store::Kind;
use store::Store;

/// The user requests are made as when no token is configured.
pub const ANONYMOUS: &str = "system:anonymous";

/// A handle on one stand-in's state; clones share it.
#[derive(Clone, Default)]
pub struct StandIn {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    store: Mutex<Store>,
    /// Bearer token → user name. Empty: no authentication.
    tokens: Mutex<HashMap<String, String>>,
    /// `(verb, resource)` pairs RBAC refuses.
    denied: Mutex<HashSet<(String, String)>>,
    frozen: FreezeSwitch,
    requests: AtomicU64,
}

struct FreezeSwitch(watch::Sender<bool>);

impl Default for FreezeSwitch {
    fn default() -> Self {
        FreezeSwitch(watch::channel(false).0)
    }
}

impl StandIn {
    pub fn new() -> StandIn {
        StandIn::default()
    }

    /// Accepts `token` for `user`. Once a token is known, requests without
    /// a known one get 401.
    pub fn add_token(&self, token: &str, user: &str) {
        self.inner
            .tokens
            .lock()
            .insert(token.to_string(), user.to_string());
    }

    /// Stops accepting `token` (a rotated-out service-account token).
    pub fn revoke_token(&self, token: &str) {
        self.inner.tokens.lock().remove(token);
    }

    /// From now on requests are held unanswered, connections kept open.
    pub fn freeze(&self) {
        self.inner.frozen.0.send_replace(true);
    }

    /// Answers again, held requests first.
    pub fn thaw(&self) {
        self.inner.frozen.0.send_replace(false);
    }

    /// RBAC refuses `verb` (get, list, create, update, patch, delete) on
    /// `resource` (leases, pods).
    pub fn deny(&self, verb: &str, resource: &str) {
        self.inner
            .denied
            .lock()
            .insert((verb.to_string(), resource.to_string()));
    }

    pub fn allow(&self, verb: &str, resource: &str) {
        self.inner
            .denied
            .lock()
            .remove(&(verb.to_string(), resource.to_string()));
    }

    /// Creates pod `ns/name` (the API serves pods only for GET and PATCH).
    pub fn add_pod(&self, ns: &str, name: &str) {
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": name, "labels": { "app": "mooncake-master" } },
            "spec": { "containers": [{ "name": "master", "image": "mooncake" }] },
        });
        self.with_store(|s| s.create(Kind::Pod, ns, pod, std::time::SystemTime::now()))
            .expect("a new pod");
    }

    /// The stored object, as a GET would return it.
    pub fn object(&self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        self.with_store(|s| s.get(kind, ns, name)).ok()
    }

    /// API requests answered or held so far (control requests not counted).
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::SeqCst)
    }

    fn with_store<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        f(&mut self.inner.store.lock())
    }

    fn count_request(&self) {
        self.inner.requests.fetch_add(1, Ordering::SeqCst);
    }

    async fn wait_thawed(&self) {
        let mut rx = self.inner.frozen.0.subscribe();
        let _ = rx.wait_for(|frozen| !frozen).await;
    }

    fn authenticate(&self, token: Option<&str>) -> Result<String, ApiError> {
        let tokens = self.inner.tokens.lock();
        if tokens.is_empty() {
            return Ok(ANONYMOUS.to_string());
        }
        token
            .and_then(|t| tokens.get(t).cloned())
            .ok_or_else(ApiError::unauthorized)
    }

    fn is_denied(&self, verb: &str, resource: &str) -> bool {
        self.inner
            .denied
            .lock()
            .contains(&(verb.to_string(), resource.to_string()))
    }
}

/// Serves the API on `listener` until the task is dropped, over TLS when
/// `tls` is given.
pub async fn run(
    listener: TcpListener,
    standin: StandIn,
    tls: Option<TlsAcceptor>,
) -> std::io::Result<()> {
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let (si, tls) = (standin.clone(), tls.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let si = si.clone();
                async move { Ok::<_, std::convert::Infallible>(http::handle(si, req).await) }
            });
            let served = match tls {
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(stream) => {
                        http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                    Err(e) => {
                        tracing::debug!("TLS handshake: {e}");
                        return;
                    }
                },
                None => {
                    http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await
                }
            };
            if let Err(e) = served {
                tracing::debug!("connection: {e}");
            }
        });
    }
}

/// Binds a free loopback port and serves `standin` there on the current
/// runtime: the server's base URL (`http://` or `https://127.0.0.1:port`).
pub async fn spawn(standin: StandIn, tls: Option<TlsAcceptor>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr: SocketAddr = listener.local_addr().unwrap();
    let scheme = if tls.is_some() { "https" } else { "http" };
    tokio::spawn(run(listener, standin, tls));
    format!("{scheme}://{addr}")
}
