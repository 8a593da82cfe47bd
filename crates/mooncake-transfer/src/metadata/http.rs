//! Client for an HTTP metadata server (`http://host:port/metadata`), using
//! the reference protocol: `GET|PUT|DELETE <url>?key=KEY`, and 404 with body
//! `metadata not found` for a missing key.
//!
//! Built on ureq: a plain blocking client (std sockets, no runtime), so it is
//! safe on any thread, async context included, and it keeps idle connections
//! alive for reuse, saving a TCP handshake per call.

use std::io;

use mooncake_common::{Error, ErrorCode, Result};
use ureq::http::{Response, StatusCode};
use ureq::Body;

use super::{MetadataStore, CONNECT_TIMEOUT, MAX_VALUE_LEN, REQUEST_TIMEOUT};

/// The body the reference server sends with a 404 for a missing key.
pub const NOT_FOUND_BODY: &str = "metadata not found";

/// Key read (never written) by [`HttpStore::connect`] to check, within
/// [`CONNECT_TIMEOUT`], that the URL really is a metadata server.
const PROBE_KEY: &str = "mooncake/probe";

pub struct HttpStore {
    url: String,
    agent: ureq::Agent,
}

impl HttpStore {
    /// Checks the URL and that a metadata server answers there; a dead
    /// address or something that is not a metadata server is `ERR_METADATA`.
    pub fn connect(url: &str) -> Result<HttpStore> {
        let store = HttpStore::new(url)?;
        let mut resp = store.request(|| {
            let probe = store.agent.get(&store.url).query("key", PROBE_KEY);
            probe
                .config()
                .timeout_global(Some(CONNECT_TIMEOUT))
                .build()
                .call()
        })?;
        match resp.status() {
            StatusCode::OK => Ok(store),
            StatusCode::NOT_FOUND if is_missing_key(&store.url, &mut resp)? => Ok(store),
            _ => Err(status_error(&store.url, "GET", PROBE_KEY, &mut resp)),
        }
    }

    /// Builds the client without contacting the server.
    pub fn new(url: &str) -> Result<HttpStore> {
        let url = url.trim();
        if url.starts_with("https://") {
            return Err(Error::new(
                ErrorCode::ERR_METADATA,
                format!("{url}: https is not supported"),
            ));
        }
        match url.strip_prefix("http://") {
            Some(rest)
                if !rest.is_empty() && !rest.starts_with('/') && !rest.contains(['?', '#']) => {}
            _ => {
                return Err(Error::new(
                    ErrorCode::ERR_METADATA,
                    format!("invalid metadata URL {url:?}"),
                ))
            }
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_global(Some(REQUEST_TIMEOUT))
            // Statuses are part of the protocol (404 = missing key), not errors.
            .http_status_as_error(false)
            .max_idle_connections_per_host(16)
            .build()
            .into();
        Ok(HttpStore {
            url: url.to_string(),
            agent,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends one request; retried once on an I/O error, which is what a
    /// pooled connection that the server closed meanwhile looks like. All
    /// three verbs are idempotent, so a retry is harmless.
    fn request(
        &self,
        send: impl Fn() -> Result<Response<Body>, ureq::Error>,
    ) -> Result<Response<Body>> {
        match send() {
            Err(ureq::Error::Io(e)) if is_stale_connection(&e) => send(),
            other => other,
        }
        .map_err(|e| request_error(&self.url, e))
    }
}

impl MetadataStore for HttpStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let mut resp = self.request(|| self.agent.get(&self.url).query("key", key).call())?;
        match resp.status() {
            StatusCode::OK => Ok(Some(read_body(&self.url, &mut resp)?)),
            StatusCode::NOT_FOUND if is_missing_key(&self.url, &mut resp)? => Ok(None),
            _ => Err(status_error(&self.url, "GET", key, &mut resp)),
        }
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut resp = self.request(|| {
            self.agent
                .put(&self.url)
                .query("key", key)
                .content_type("application/json")
                .send(value)
        })?;
        match resp.status() {
            StatusCode::OK | StatusCode::CREATED | StatusCode::NO_CONTENT => Ok(()),
            _ => Err(status_error(&self.url, "PUT", key, &mut resp)),
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        let mut resp = self.request(|| self.agent.delete(&self.url).query("key", key).call())?;
        match resp.status() {
            StatusCode::OK | StatusCode::NO_CONTENT => Ok(()),
            // Deleting a missing key leaves the store as asked.
            StatusCode::NOT_FOUND if is_missing_key(&self.url, &mut resp)? => Ok(()),
            _ => Err(status_error(&self.url, "DELETE", key, &mut resp)),
        }
    }
}

fn is_stale_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

fn read_body(url: &str, resp: &mut Response<Body>) -> Result<Vec<u8>> {
    resp.body_mut()
        .with_config()
        .limit(MAX_VALUE_LEN as u64)
        .read_to_vec()
        .map_err(|e| request_error(url, e))
}

/// A 404 means "missing key" only with the protocol's body; any other 404
/// (say, a URL without `/metadata`) means this is not a metadata endpoint.
fn is_missing_key(url: &str, resp: &mut Response<Body>) -> Result<bool> {
    let body = read_body(url, resp)?;
    Ok(body.trim_ascii() == NOT_FOUND_BODY.as_bytes())
}

fn status_error(url: &str, verb: &str, key: &str, resp: &mut Response<Body>) -> Error {
    let status = resp.status();
    let body = read_body(url, resp).unwrap_or_default();
    let body = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    Error::new(
        ErrorCode::ERR_METADATA,
        format!("{verb} {url}?key={key}: HTTP {status}: {}", body.trim()),
    )
}

fn request_error(url: &str, e: ureq::Error) -> Error {
    Error::new(
        ErrorCode::ERR_METADATA,
        format!("metadata server {url}: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_urls_it_cannot_use() {
        for bad in [
            "https://h:1/metadata",
            "http://",
            "http:///metadata",
            "ftp://h:1",
            "http://h:1/m?key=x",
        ] {
            let e = HttpStore::new(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.code, ErrorCode::ERR_METADATA, "{bad:?}");
        }
        assert_eq!(
            HttpStore::new(" http://h:1/metadata ").unwrap().url(),
            "http://h:1/metadata"
        );
    }

    #[test]
    fn unreachable_server_is_err_metadata() {
        // Bind then drop: nothing listens on that port any more.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = HttpStore::connect(&format!("http://127.0.0.1:{port}/metadata"))
            .err()
            .unwrap();
        assert_eq!(e.code, ErrorCode::ERR_METADATA);
    }
}
