//! The few REST calls the election makes: get, create and update one
//! Lease, and merge-patch a pod's labels. JSON over HTTP/1.1 (reqwest with
//! rustls), bearer tokens re-read from their file as it rotates.

use std::path::PathBuf;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::config::{Auth, ClusterConfig};
use super::record::LeaseRecord;
use super::LeaseRef;

/// client-go re-reads a service-account token file this often.
const TOKEN_REREAD: Duration = Duration::from_secs(60);

/// Why a request failed, as far as the election cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    NotFound,
    AlreadyExists,
    /// The resourceVersion was stale: someone else wrote first.
    Conflict,
    /// RBAC refused: the message names the verb and resource.
    Forbidden,
    Unauthorized,
    /// Any other answer: its status code.
    Status(u16),
    /// No answer: connection refused, reset, TLS failure or timeout.
    Transport,
}

/// A failed API request.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub failure: Failure,
    pub message: String,
}

impl ApiError {
    pub fn into_error(self) -> Error {
        Error::new(ErrorCode::K8S_LEASE_OPERATION_ERROR, self.message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A Lease as read or written: the whole object (written back on update,
/// carrying its `metadata.resourceVersion`) and its election record.
#[derive(Debug, Clone)]
pub struct Lease {
    pub object: Value,
    pub record: LeaseRecord,
}

impl Lease {
    fn from_object(object: Value) -> Lease {
        let record = LeaseRecord::from_spec(object.get("spec"));
        Lease { object, record }
    }

    /// The value of annotation `key`, if set.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.object
            .get("metadata")?
            .get("annotations")?
            .get(key)?
            .as_str()
    }

    pub fn resource_version(&self) -> &str {
        self.object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
    }
}

enum Token {
    None,
    Fixed(String),
    File {
        path: PathBuf,
        /// The token and when it was read.
        cached: Mutex<Option<(String, Instant)>>,
    },
}

impl Token {
    /// The token to send; a file is re-read once [`TOKEN_REREAD`] old, or
    /// at once with `fresh` (after a 401).
    fn get(&self, fresh: bool) -> std::result::Result<Option<String>, ApiError> {
        let (path, cached) = match self {
            Token::None => return Ok(None),
            Token::Fixed(t) => return Ok(Some(t.clone())),
            Token::File { path, cached } => (path, cached),
        };
        let mut cached = cached.lock();
        if let Some((t, at)) = &*cached {
            if !fresh && at.elapsed() < TOKEN_REREAD {
                return Ok(Some(t.clone()));
            }
        }
        let token = std::fs::read_to_string(path)
            .map_err(|e| ApiError {
                failure: Failure::Unauthorized,
                message: format!("kubernetes token file {}: {e}", path.display()),
            })?
            .trim()
            .to_string();
        *cached = Some((token.clone(), Instant::now()));
        Ok(Some(token))
    }

    fn is_file(&self) -> bool {
        matches!(self, Token::File { .. })
    }
}

pub struct ApiClient {
    http: reqwest::Client,
    server: String,
    token: Token,
    basic: Option<(String, String)>,
}

impl ApiClient {
    /// A client for `config` whose requests give up after `timeout` (the
    /// renew deadline, as client-go's leader election configures it).
    pub fn new(config: &ClusterConfig, timeout: Duration) -> Result<ApiClient> {
        let bad = |what: &str, e: reqwest::Error| {
            Error::new(
                ErrorCode::K8S_LEASE_OPERATION_ERROR,
                format!("kubernetes client: {what}: {e}"),
            )
        };
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .user_agent(concat!("mooncake-store/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = &config.ca_pem {
            b = b.tls_built_in_root_certs(false);
            for cert in reqwest::Certificate::from_pem_bundle(pem).map_err(|e| bad("CA", e))? {
                b = b.add_root_certificate(cert);
            }
        }
        if config.insecure_skip_tls_verify {
            b = b.danger_accept_invalid_certs(true);
        }
        let (mut token, mut basic) = (Token::None, None);
        match &config.auth {
            Auth::None => {}
            Auth::Token(t) => token = Token::Fixed(t.clone()),
            Auth::TokenFile(path) => {
                token = Token::File {
                    path: path.clone(),
                    cached: Mutex::new(None),
                }
            }
            Auth::ClientCert { cert_pem, key_pem } => {
                let mut pem = cert_pem.clone();
                pem.push(b'\n');
                pem.extend_from_slice(key_pem);
                let id =
                    reqwest::Identity::from_pem(&pem).map_err(|e| bad("client certificate", e))?;
                b = b.identity(id);
            }
            Auth::Basic { username, password } => {
                basic = Some((username.clone(), password.clone()))
            }
        }
        Ok(ApiClient {
            http: b.build().map_err(|e| bad("TLS setup", e))?,
            server: config.server.clone(),
            token,
            basic,
        })
    }

    pub async fn get_lease(&self, l: &LeaseRef) -> std::result::Result<Lease, ApiError> {
        let v = self
            .call(Method::GET, &lease_url(l, true), None, "get", l)
            .await?;
        Ok(Lease::from_object(v))
    }

    pub async fn create_lease(
        &self,
        l: &LeaseRef,
        record: &LeaseRecord,
    ) -> std::result::Result<Lease, ApiError> {
        let body = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": { "name": l.name, "namespace": l.namespace },
            "spec": record.to_spec(),
        });
        let v = self
            .call(
                Method::POST,
                &lease_url(l, false),
                Some(("application/json", body)),
                "create",
                l,
            )
            .await?;
        Ok(Lease::from_object(v))
    }

    /// PUT `record` over `read`, as of its resourceVersion: a 409 Conflict
    /// means someone wrote in between.
    pub async fn update_lease(
        &self,
        l: &LeaseRef,
        read: &Lease,
        record: &LeaseRecord,
    ) -> std::result::Result<Lease, ApiError> {
        self.update_lease_annotated(l, read, record, None).await
    }

    /// [`update_lease`](Self::update_lease) that also sets annotation
    /// `(key, value)`; the object's other annotations are kept, as every
    /// update keeps them (client-go's LeaseLock writes the object back too).
    pub async fn update_lease_annotated(
        &self,
        l: &LeaseRef,
        read: &Lease,
        record: &LeaseRecord,
        annotation: Option<(&str, &str)>,
    ) -> std::result::Result<Lease, ApiError> {
        let mut body = read.object.clone();
        body["spec"] = record.to_spec();
        if let Some((key, value)) = annotation {
            let meta = &mut body["metadata"];
            if !meta["annotations"].is_object() {
                meta["annotations"] = json!({});
            }
            meta["annotations"][key] = json!(value);
        }
        let v = self
            .call(
                Method::PUT,
                &lease_url(l, true),
                Some(("application/json", body)),
                "update",
                l,
            )
            .await?;
        Ok(Lease::from_object(v))
    }

    /// Sets (`Some`) or removes (`None`) one label of pod `namespace/name`.
    pub async fn label_pod(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> std::result::Result<(), ApiError> {
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
        let patch = json!({ "metadata": { "labels": { key: value } } });
        let target = LeaseRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        self.call(
            Method::PATCH,
            &path,
            Some(("application/merge-patch+json", patch)),
            "patch",
            &target,
        )
        .await
        .map(drop)
    }

    /// One request; after a 401 with a token file, the file is re-read and
    /// the request retried once (the token may just have rotated).
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<(&str, Value)>,
        verb: &str,
        target: &LeaseRef,
    ) -> std::result::Result<Value, ApiError> {
        let resource = if path.contains("/pods/") {
            "pods"
        } else {
            "leases.coordination.k8s.io"
        };
        let mut fresh = false;
        loop {
            let mut req = self
                .http
                .request(method.clone(), format!("{}{path}", self.server))
                .header(reqwest::header::ACCEPT, "application/json");
            if let Some(t) = self.token.get(fresh)? {
                req = req.bearer_auth(t);
            } else if let Some((u, p)) = &self.basic {
                req = req.basic_auth(u, Some(p));
            }
            if let Some((content_type, b)) = &body {
                req = req
                    .header(reqwest::header::CONTENT_TYPE, *content_type)
                    .body(serde_json::to_vec(b).unwrap());
            }
            let what = format!("{verb} {resource} {}/{}", target.namespace, target.name);
            let resp = req.send().await.map_err(|e| ApiError {
                failure: Failure::Transport,
                message: format!(
                    "kubernetes API {}: {what}: {}",
                    self.server,
                    error_chain(&e)
                ),
            })?;
            let status = resp.status();
            let text = resp.text().await.map_err(|e| ApiError {
                failure: Failure::Transport,
                message: format!(
                    "kubernetes API {}: {what}: {}",
                    self.server,
                    error_chain(&e)
                ),
            })?;
            if status.is_success() {
                return serde_json::from_str(&text).map_err(|e| ApiError {
                    failure: Failure::Status(status.as_u16()),
                    message: format!("kubernetes API: {what}: bad JSON answer: {e}"),
                });
            }
            if status == StatusCode::UNAUTHORIZED && self.token.is_file() && !fresh {
                fresh = true;
                continue;
            }
            return Err(failure(
                status,
                &text,
                &what,
                verb,
                resource,
                &target.namespace,
            ));
        }
    }
}

fn lease_url(l: &LeaseRef, named: bool) -> String {
    let base = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
        l.namespace
    );
    if named {
        format!("{base}/{}", l.name)
    } else {
        base
    }
}

/// Maps an error answer, reading the `Status` body's reason.
fn failure(
    status: StatusCode,
    body: &str,
    what: &str,
    verb: &str,
    resource: &str,
    ns: &str,
) -> ApiError {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let field = |k: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (reason, server_says) = (field("reason"), field("message"));
    let failure = match (status.as_u16(), reason.as_str()) {
        (404, _) => Failure::NotFound,
        (409, "AlreadyExists") => Failure::AlreadyExists,
        (409, _) => Failure::Conflict,
        (403, _) => Failure::Forbidden,
        (401, _) => Failure::Unauthorized,
        (code, _) => Failure::Status(code),
    };
    let message = match failure {
        Failure::Forbidden => format!(
            "kubernetes RBAC forbids verb {verb:?} on resource {resource:?} in namespace {ns:?} \
             ({server_says}); the masters' Role needs get, create and update on \
             leases.coordination.k8s.io, and get and patch on pods"
        ),
        Failure::Unauthorized => format!(
            "kubernetes API: {what}: 401 Unauthorized: the token or certificate was not accepted"
        ),
        _ => format!("kubernetes API: {what}: {status} {server_says}"),
    };
    ApiError { failure, message }
}

/// reqwest's error with its causes (the useful part is often a cause).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}
