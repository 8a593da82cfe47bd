//! Where multi-tenancy's quota policies live
//! (`--tenant_quota_connector_type`, `--tenant_quota_connector_uri`), as
//! the reference keeps them: a YAML file, or the same text under the etcd
//! key `mooncake-store/<cluster_id>/tenant_quota_policy` (the URI naming
//! the etcd endpoints; a missing key holds no policy).

use std::path::PathBuf;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};

use crate::tenant::{self, Policies};

/// Bound on connecting to etcd and on one etcd call.
const ETCD_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PolicyStore {
    File(PathBuf),
    Etcd { endpoints: Vec<String>, key: String },
}

/// The etcd key of a cluster's policies: an empty cluster id is the
/// default one, trailing slashes go.
pub(crate) fn etcd_key(cluster_id: &str) -> String {
    let id = cluster_id.trim_end_matches('/');
    let id = if id.is_empty() {
        "mooncake_cluster"
    } else {
        id
    };
    format!("mooncake-store/{id}/tenant_quota_policy")
}

impl PolicyStore {
    /// The store `connector` and `uri` name for the cluster `cluster_id`.
    pub(crate) fn new(connector: &str, uri: &str, cluster_id: &str) -> Result<PolicyStore> {
        let bad = |what: String| Error::new(ErrorCode::INVALID_PARAMS, what);
        if uri.trim().is_empty() {
            return Err(bad(format!(
                "--enable_multi_tenants needs --tenant_quota_connector_uri (the {connector} connector's location)"
            )));
        }
        match connector {
            "file" => Ok(PolicyStore::File(PathBuf::from(uri))),
            "etcd" => Ok(PolicyStore::Etcd {
                endpoints: crate::ha::etcd::parse_endpoints(uri)?,
                key: etcd_key(cluster_id),
            }),
            other => Err(bad(format!(
                "--tenant_quota_connector_type={other:?}: the connectors are \"file\" and \"etcd\""
            ))),
        }
    }

    /// The policies stored: a missing or bad file, an etcd that does not
    /// answer or a bad value is an error.
    pub(crate) fn load(&self) -> Result<Policies> {
        match self {
            PolicyStore::File(path) => tenant::load_policies(path),
            PolicyStore::Etcd { endpoints, key } => {
                let Some(text) = etcd_call(endpoints, key, None)? else {
                    return Ok(Policies::new());
                };
                tenant::parse_policies(&text).map_err(|e| e.with_context(format!("etcd key {key}")))
            }
        }
    }

    /// Replaces the stored policies with `policies`.
    pub(crate) fn store(&self, policies: &Policies) -> Result<()> {
        match self {
            PolicyStore::File(path) => tenant::store_policies(path, policies),
            PolicyStore::Etcd { endpoints, key } => {
                let text = tenant::format_policies(policies);
                etcd_call(endpoints, key, Some(text)).map(drop)
            }
        }
    }
}

/// Reads `key` (`value` `None`) or writes `value` to it, blocking: on a
/// thread of its own with its own runtime, so a caller inside or outside
/// the master's runtime may wait for it.
fn etcd_call(endpoints: &[String], key: &str, value: Option<String>) -> Result<Option<String>> {
    let failed = |what: String| {
        Error::new(
            ErrorCode::ETCD_OPERATION_ERROR,
            format!("tenant quota policy, etcd key {key}: {what}"),
        )
    };
    let (endpoints, owned_key) = (endpoints.to_vec(), key.to_string());
    let call = move || -> std::result::Result<Option<String>, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let options = etcd_client::ConnectOptions::new()
                .with_connect_timeout(ETCD_TIMEOUT)
                .with_timeout(ETCD_TIMEOUT);
            let op = async {
                let mut client = etcd_client::Client::connect(&endpoints, Some(options)).await?;
                match value {
                    Some(v) => client.put(owned_key, v, None).await.map(|_| None),
                    None => {
                        let got = client.get(owned_key, None).await?;
                        match got.kvs().first() {
                            Some(kv) => kv.value_str().map(|s| Some(s.to_string())),
                            None => Ok(None),
                        }
                    }
                }
            };
            tokio::time::timeout(2 * ETCD_TIMEOUT, op)
                .await
                .map_err(|_| "no answer".to_string())?
                .map_err(|e| e.to_string())
        })
    };
    std::thread::Builder::new()
        .name("mc-tenant-quotas".into())
        .spawn(call)
        .map_err(|e| failed(e.to_string()))?
        .join()
        .map_err(|_| failed("the etcd call panicked".into()))?
        .map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connectors_name_their_store() {
        assert_eq!(
            PolicyStore::new("file", "/q.yaml", "c").unwrap(),
            PolicyStore::File("/q.yaml".into())
        );
        let etcd = PolicyStore::new("etcd", "h1:1;h2:2", "c/").unwrap();
        let PolicyStore::Etcd { endpoints, key } = etcd else {
            panic!("{etcd:?}")
        };
        assert_eq!(endpoints.len(), 2);
        assert_eq!(key, "mooncake-store/c/tenant_quota_policy");
        assert_eq!(
            etcd_key(""),
            "mooncake-store/mooncake_cluster/tenant_quota_policy"
        );
        for (connector, uri) in [("file", ""), ("etcd", " "), ("s3", "x"), ("", "x")] {
            let e = PolicyStore::new(connector, uri, "c").unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{connector} {uri}");
        }
    }

    #[test]
    fn an_etcd_that_does_not_answer_is_an_error() {
        let port = test_support::ports::free_port();
        let s = PolicyStore::new("etcd", &format!("127.0.0.1:{port}"), "c").unwrap();
        assert_eq!(s.load().unwrap_err().code, ErrorCode::ETCD_OPERATION_ERROR);
        let e = s.store(&Policies::new()).unwrap_err();
        assert_eq!(e.code, ErrorCode::ETCD_OPERATION_ERROR);
    }
}
