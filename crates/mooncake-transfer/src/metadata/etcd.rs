//! etcd backend (`etcd://h1:p1;h2:p2` or bare `h:p`). Keys are stored
//! exactly as given (`mooncake/ram/<segment>`), as the reference does.
//!
//! etcd-client is async (tonic); it runs on a [`Driver`] runtime of this
//! store's own, so calls block without ever touching the caller's runtime.

use std::future::Future;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};
use mooncake_common::{Error, ErrorCode, Result};
use tokio::time::Instant;

use super::driver::Driver;
use super::{MetadataStore, CONNECT_TIMEOUT, REQUEST_TIMEOUT};

pub(crate) struct EtcdStore {
    client: Client,
    endpoints: Vec<String>,
    // Last, so the client's connections are gone before the runtime stops.
    driver: Driver,
}

impl EtcdStore {
    /// Connects to any of `endpoints` (`host:port`, optionally with an
    /// `http://` scheme) and checks that etcd answers.
    pub(crate) fn connect(endpoints: &[String]) -> Result<EtcdStore> {
        let endpoints = endpoint_urls(endpoints)?;
        // tonic connects lazily and keeps retrying a dead endpoint; a plain
        // TCP dial first turns "nothing listens" into an immediate error.
        if !endpoints.iter().any(|e| dials(e, CONNECT_TIMEOUT)) {
            return Err(Error::new(
                ErrorCode::ERR_METADATA,
                format!("etcd {endpoints:?}: no endpoint is reachable"),
            ));
        }
        let driver = Driver::start("mc-etcd-metadata")?;
        let options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(Duration::from_secs(10), CONNECT_TIMEOUT);
        let eps = endpoints.clone();
        let client = driver.run(async move {
            let client = bounded(&eps, "connect", CONNECT_TIMEOUT, || {
                Client::connect(eps.clone(), Some(options.clone()))
            })
            .await?;
            // A cheap read proves the gRPC service answers, not just the port.
            let kv = client.kv_client();
            bounded(&eps, "probe", CONNECT_TIMEOUT, || {
                let mut kv = kv.clone();
                async move {
                    kv.get("mooncake/", Some(GetOptions::new().with_count_only()))
                        .await
                }
            })
            .await?;
            Ok(client)
        })?;
        Ok(EtcdStore {
            client,
            endpoints,
            driver,
        })
    }
}

impl MetadataStore for EtcdStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let (kv, key, eps) = (
            self.client.kv_client(),
            key.to_string(),
            self.endpoints.clone(),
        );
        self.driver.run(async move {
            let resp = bounded(&eps, "get", REQUEST_TIMEOUT, || {
                let (mut kv, key) = (kv.clone(), key.clone());
                async move { kv.get(key, None).await }
            })
            .await?;
            Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
        })
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let (kv, key, eps) = (
            self.client.kv_client(),
            key.to_string(),
            self.endpoints.clone(),
        );
        let value = value.to_vec();
        self.driver.run(async move {
            bounded(&eps, "put", REQUEST_TIMEOUT, || {
                let (mut kv, key, value) = (kv.clone(), key.clone(), value.clone());
                async move { kv.put(key, value, None).await }
            })
            .await?;
            Ok(())
        })
    }

    fn delete(&self, key: &str) -> Result<()> {
        let (kv, key, eps) = (
            self.client.kv_client(),
            key.to_string(),
            self.endpoints.clone(),
        );
        self.driver.run(async move {
            bounded(&eps, "delete", REQUEST_TIMEOUT, || {
                let (mut kv, key) = (kv.clone(), key.clone());
                async move { kv.delete(key, None).await }
            })
            .await?;
            Ok(())
        })
    }
}

/// gRPC's UNAVAILABLE status: the endpoint the balancer picked is down.
const GRPC_UNAVAILABLE: i32 = 14;

/// Pause before retrying an unavailable endpoint.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Runs `op` until it succeeds or `limit` has passed. The balancer treats a
/// dead endpoint as ready until a call fails on it, so with several
/// endpoints an UNAVAILABLE answer is retried: another endpoint may be
/// up. Timeouts and etcd errors are `ERR_METADATA`.
async fn bounded<T, F, Fut>(
    endpoints: &[String],
    what: &str,
    limit: Duration,
    mut op: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let err = match tokio::time::timeout_at(deadline, op()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => e,
            Err(_) => {
                return Err(Error::new(
                    ErrorCode::ERR_METADATA,
                    format!("etcd {endpoints:?} {what}: no answer within {limit:?}"),
                ))
            }
        };
        let unavailable = matches!(&err, etcd_client::Error::GRpcStatus(s) if i32::from(s.code()) == GRPC_UNAVAILABLE);
        if !unavailable || Instant::now() + RETRY_PAUSE >= deadline {
            return Err(Error::new(
                ErrorCode::ERR_METADATA,
                format!("etcd {endpoints:?} {what}: {err}"),
            ));
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// `h:p` → `http://h:p`; an explicit `http://` or `https://` stays.
pub fn endpoint_urls(endpoints: &[String]) -> Result<Vec<String>> {
    if endpoints.is_empty() {
        return Err(Error::new(
            ErrorCode::ERR_METADATA,
            "no etcd endpoint given",
        ));
    }
    endpoints
        .iter()
        .map(|e| {
            let e = e.trim();
            let url = if e.contains("://") {
                e.to_string()
            } else {
                format!("http://{e}")
            };
            match host_port(&url) {
                Some(_) => Ok(url),
                None => Err(Error::new(
                    ErrorCode::ERR_METADATA,
                    format!("invalid etcd endpoint {e:?}"),
                )),
            }
        })
        .collect()
}

/// The `host:port` part of an endpoint URL, if it has a numeric port.
fn host_port(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    let hp = rest.trim_end_matches('/');
    let (host, port) = hp.rsplit_once(':')?;
    (!host.is_empty() && !hp.contains('/') && port.parse::<u16>().is_ok()).then_some(hp)
}

fn dials(url: &str, limit: Duration) -> bool {
    let Some(hp) = host_port(url) else {
        return false;
    };
    let Ok(addrs) = hp.to_socket_addrs() else {
        return false;
    };
    addrs
        .into_iter()
        .any(|a| TcpStream::connect_timeout(&a, limit).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_become_urls() {
        let eps = vec![
            "127.0.0.1:2379".to_string(),
            " http://h:1 ".to_string(),
            "https://h:2/".to_string(),
        ];
        assert_eq!(
            endpoint_urls(&eps).unwrap(),
            ["http://127.0.0.1:2379", "http://h:1", "https://h:2/"]
        );
        for bad in ["h", "h:", ":1", "h:port", "h:99999", "http://h:1/x"] {
            assert_eq!(
                endpoint_urls(&[bad.to_string()]).unwrap_err().code,
                ErrorCode::ERR_METADATA,
                "{bad:?}"
            );
        }
        assert!(endpoint_urls(&[]).is_err());
    }

    #[test]
    fn unreachable_etcd_is_err_metadata() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = EtcdStore::connect(&[format!("127.0.0.1:{port}")])
            .err()
            .unwrap();
        assert_eq!(e.code, ErrorCode::ERR_METADATA);
    }
}
