//! Where the records live: etcd, as in the reference. Every change is a
//! compare-and-swap on the key's mod revision, so consumers that publish
//! their copies at once never lose one another's entries.
//!
//! Beside the records, claims: a consumer reading a shard from the
//! publisher holds a leased key for it, so the others wait for its copy
//! instead of asking the publisher for the same shard.
//!
//! [`Catalog`] is the interface the store needs; [`EtcdCatalog`] implements
//! it on etcd-client, blocking on a [`Driver`] runtime of its own.

use std::collections::HashSet;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use mooncake_transfer::metadata::etcd::endpoint_urls;
use mooncake_transfer::metadata::{Driver, MetadataUri};

use crate::error::{P2pError, Result};
use crate::record::{payload_key, Payload, KEY_PREFIX};

/// A record with the revision a conditional update must name.
pub type Versioned = (Payload, i64);

pub trait Catalog: Send + Sync {
    fn get(&self, name: &str) -> Result<Option<Versioned>>;
    /// Creates the record; false when the name exists.
    fn create(&self, payload: &Payload) -> Result<bool>;
    /// Writes the record whatever is there (`Register` with `force_create`).
    fn put(&self, payload: &Payload) -> Result<()>;
    /// Replaces the record if it is still at `revision`; an empty record
    /// (no holder left) is deleted instead. False when someone changed it.
    fn update(&self, payload: &Payload, revision: i64) -> Result<bool>;
    /// Every record whose name starts with `prefix`.
    fn list(&self, prefix: &str) -> Result<Vec<Payload>>;
    /// Shards of `name` that some consumer is reading from the publisher
    /// right now (claimed, the claim not expired).
    fn claimed(&self, name: &str) -> Result<HashSet<usize>>;
    /// Claims `shard` of `name` for `me` for [`CLAIM_TTL`]; false when
    /// another consumer holds the claim.
    fn claim(&self, name: &str, shard: usize, me: &str) -> Result<bool>;
    fn unclaim(&self, name: &str, shard: usize) -> Result<()>;
}

/// How long a claim lasts: a consumer that dies holding one delays that
/// shard by this much; a read longer than this may be duplicated.
pub const CLAIM_TTL: Duration = Duration::from_secs(10);

/// Prefix of the claims of `name`'s shards, beside (not under) the records'
/// prefix, so `list` never sees them.
pub fn claims_prefix(name: &str) -> String {
    format!("mooncake/checkpoint_claims/{name}/")
}

fn claim_key(name: &str, shard: usize) -> String {
    format!("{}{shard}", claims_prefix(name))
}

/// Reads, changes and conditionally writes `name`'s record until the write
/// wins. `change` returns false to stop without writing. Ok(None): no record.
pub fn modify(
    catalog: &dyn Catalog,
    name: &str,
    mut change: impl FnMut(&mut Payload) -> bool,
) -> Result<Option<Payload>> {
    loop {
        let Some((mut payload, revision)) = catalog.get(name)? else {
            return Ok(None);
        };
        if !change(&mut payload) {
            return Ok(Some(payload));
        }
        if catalog.update(&payload, revision)? {
            return Ok(Some(payload));
        }
    }
}

const TIMEOUT: Duration = Duration::from_secs(10);

pub struct EtcdCatalog {
    client: Client,
    // Last, so the client's connections close before the runtime stops.
    driver: Driver,
}

impl EtcdCatalog {
    /// Connects to the etcd a `metadata_server` string names (`etcd://h:p`,
    /// bare `h:p`, `;`-separated endpoints). Other backends have no
    /// transactions to keep concurrent holders' updates, so they are refused.
    pub fn connect(metadata_server: &str) -> Result<EtcdCatalog> {
        let endpoints = match MetadataUri::parse(metadata_server)? {
            MetadataUri::Etcd(e) => endpoint_urls(&e)?,
            other => {
                return Err(P2pError::Metadata(format!(
                    "the P2P store keeps its catalog in etcd; {other:?} is not etcd"
                )))
            }
        };
        let driver = Driver::start("mc-p2p-etcd")?;
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(TIMEOUT);
        let eps = endpoints.clone();
        let client = driver.run(async move {
            let connect = async {
                let mut c = Client::connect(eps.clone(), Some(options)).await?;
                // A read proves the service answers, not just the port.
                c.get(KEY_PREFIX, Some(GetOptions::new().with_count_only()))
                    .await?;
                Ok::<_, etcd_client::Error>(c)
            };
            match tokio::time::timeout(TIMEOUT, connect).await {
                Ok(Ok(c)) => Ok(c),
                Ok(Err(e)) => Err(meta_err(&eps, e)),
                Err(_) => Err(mooncake_common::Error::new(
                    mooncake_common::ErrorCode::ERR_METADATA,
                    format!("etcd {eps:?}: no answer within {TIMEOUT:?}"),
                )),
            }
        })?;
        Ok(EtcdCatalog { client, driver })
    }

    fn run<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(
                Client,
            ) -> std::pin::Pin<
                Box<
                    dyn std::future::Future<Output = std::result::Result<T, etcd_client::Error>>
                        + Send,
                >,
            > + Send
            + 'static,
    ) -> Result<T> {
        let client = self.client.clone();
        Ok(self.driver.run(async move {
            match tokio::time::timeout(TIMEOUT, f(client)).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(mooncake_common::Error::new(
                    mooncake_common::ErrorCode::ERR_METADATA,
                    format!("etcd {what}: {e}"),
                )),
                Err(_) => Err(mooncake_common::Error::new(
                    mooncake_common::ErrorCode::ERR_METADATA,
                    format!("etcd {what}: no answer within {TIMEOUT:?}"),
                )),
            }
        })?)
    }
}

fn meta_err(eps: &[String], e: etcd_client::Error) -> mooncake_common::Error {
    mooncake_common::Error::new(
        mooncake_common::ErrorCode::ERR_METADATA,
        format!("etcd {eps:?}: {e}"),
    )
}

impl Catalog for EtcdCatalog {
    fn get(&self, name: &str) -> Result<Option<Versioned>> {
        let key = payload_key(name);
        let k = key.clone();
        let resp = self.run("get", move |mut c| {
            Box::pin(async move { c.get(k, None).await })
        })?;
        match resp.kvs().first() {
            None => Ok(None),
            Some(kv) => Ok(Some((
                Payload::from_json(&key, kv.value())?,
                kv.mod_revision(),
            ))),
        }
    }

    fn create(&self, payload: &Payload) -> Result<bool> {
        let (key, value) = (payload_key(&payload.name), payload.to_json());
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value, None)]);
        let resp = self.run("create", move |mut c| {
            Box::pin(async move { c.txn(txn).await })
        })?;
        Ok(resp.succeeded())
    }

    fn put(&self, payload: &Payload) -> Result<()> {
        let (key, value) = (payload_key(&payload.name), payload.to_json());
        self.run("put", move |mut c| {
            Box::pin(async move { c.put(key, value, None).await })
        })?;
        Ok(())
    }

    fn update(&self, payload: &Payload, revision: i64) -> Result<bool> {
        let key = payload_key(&payload.name);
        let op = if payload.is_empty() {
            TxnOp::delete(key.clone(), None)
        } else {
            TxnOp::put(key.clone(), payload.to_json(), None)
        };
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, revision)])
            .and_then([op]);
        let resp = self.run("update", move |mut c| {
            Box::pin(async move { c.txn(txn).await })
        })?;
        Ok(resp.succeeded())
    }

    fn list(&self, prefix: &str) -> Result<Vec<Payload>> {
        let start = payload_key(prefix);
        let k = start.clone();
        let resp = self.run("list", move |mut c| {
            Box::pin(async move { c.get(k, Some(GetOptions::new().with_prefix())).await })
        })?;
        resp.kvs()
            .iter()
            .map(|kv| Payload::from_json(&String::from_utf8_lossy(kv.key()), kv.value()))
            .collect()
    }
    fn claimed(&self, name: &str) -> Result<HashSet<usize>> {
        let prefix = claims_prefix(name);
        let k = prefix.clone();
        let resp = self.run("claims", move |mut c| {
            Box::pin(async move {
                c.get(k, Some(GetOptions::new().with_prefix().with_keys_only()))
                    .await
            })
        })?;
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| kv.key().strip_prefix(prefix.as_bytes()))
            .filter_map(|i| std::str::from_utf8(i).ok()?.parse().ok())
            .collect())
    }

    fn claim(&self, name: &str, shard: usize, me: &str) -> Result<bool> {
        let (key, value) = (claim_key(name, shard), me.to_string());
        let resp = self.run("claim", move |mut c| {
            Box::pin(async move {
                let lease = c.lease_grant(CLAIM_TTL.as_secs() as i64, None).await?;
                let put = PutOptions::new().with_lease(lease.id());
                let txn = Txn::new()
                    .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key, value, Some(put))]);
                c.txn(txn).await
            })
        })?;
        Ok(resp.succeeded())
    }

    fn unclaim(&self, name: &str, shard: usize) -> Result<()> {
        let key = claim_key(name, shard);
        self.run("unclaim", move |mut c| {
            Box::pin(async move { c.delete(key, None).await })
        })?;
        Ok(())
    }
}

/// A catalog in memory with etcd's revision semantics, for the store's
/// logic tests.
#[cfg(test)]
pub(crate) mod memory {
    use std::collections::BTreeMap;

    use parking_lot::Mutex;

    use super::*;

    #[derive(Default)]
    pub(crate) struct MemoryCatalog {
        inner: Mutex<(i64, BTreeMap<String, Versioned>)>,
        claims: Mutex<std::collections::BTreeSet<(String, usize)>>,
    }

    impl Catalog for MemoryCatalog {
        fn get(&self, name: &str) -> Result<Option<Versioned>> {
            Ok(self.inner.lock().1.get(name).cloned())
        }
        fn create(&self, payload: &Payload) -> Result<bool> {
            let mut g = self.inner.lock();
            if g.1.contains_key(&payload.name) {
                return Ok(false);
            }
            g.0 += 1;
            let rev = g.0;
            g.1.insert(payload.name.clone(), (payload.clone(), rev));
            Ok(true)
        }
        fn put(&self, payload: &Payload) -> Result<()> {
            let mut g = self.inner.lock();
            g.0 += 1;
            let rev = g.0;
            g.1.insert(payload.name.clone(), (payload.clone(), rev));
            Ok(())
        }
        fn update(&self, payload: &Payload, revision: i64) -> Result<bool> {
            let mut g = self.inner.lock();
            if g.1.get(&payload.name).map(|v| v.1) != Some(revision) {
                return Ok(false);
            }
            g.0 += 1;
            let rev = g.0;
            if payload.is_empty() {
                g.1.remove(&payload.name);
            } else {
                g.1.insert(payload.name.clone(), (payload.clone(), rev));
            }
            Ok(true)
        }
        fn list(&self, prefix: &str) -> Result<Vec<Payload>> {
            let g = self.inner.lock();
            Ok(g.1
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(_, v)| v.0.clone())
                .collect())
        }
        fn claimed(&self, name: &str) -> Result<HashSet<usize>> {
            Ok(self
                .claims
                .lock()
                .iter()
                .filter(|c| c.0 == name)
                .map(|c| c.1)
                .collect())
        }
        fn claim(&self, name: &str, shard: usize, _me: &str) -> Result<bool> {
            Ok(self.claims.lock().insert((name.to_string(), shard)))
        }
        fn unclaim(&self, name: &str, shard: usize) -> Result<()> {
            self.claims.lock().remove(&(name.to_string(), shard));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::memory::MemoryCatalog;
    use super::*;
    use crate::record::Location;

    #[test]
    fn modify_retries_until_its_write_wins_and_deletes_empty_records() {
        let c = MemoryCatalog::default();
        let p = Payload::published("a", "pub", &[(4096, 8192)], 4096);
        assert!(c.create(&p).unwrap());
        assert!(!c.create(&p).unwrap(), "created twice");
        let mut first = true;
        let got = modify(&c, "a", |p| {
            if first {
                // Someone else's write lands between our read and our write.
                first = false;
                let (mut other, rev) = c.get("a").unwrap().unwrap();
                other.add_replica(
                    0,
                    Location {
                        segment_name: "x".into(),
                        offset: 1,
                    },
                );
                assert!(c.update(&other, rev).unwrap());
            }
            p.add_replica(
                0,
                Location {
                    segment_name: "me".into(),
                    offset: 2,
                },
            )
        })
        .unwrap()
        .unwrap();
        let holders: Vec<&str> = got.shards[0]
            .replica_list
            .iter()
            .map(|l| l.segment_name.as_str())
            .collect();
        assert_eq!(holders, ["x", "me"], "the concurrent entry survives");

        modify(&c, "a", |p| {
            p.remove_gold();
            p.remove_replicas_of("x");
            p.remove_replicas_of("me");
            true
        })
        .unwrap();
        assert!(c.get("a").unwrap().is_none(), "an empty record is deleted");
        assert!(modify(&c, "a", |_| true).unwrap().is_none());
    }

    #[test]
    fn only_etcd_holds_the_catalog() {
        for bad in [
            "P2PHANDSHAKE",
            "redis://h:1",
            "http://h:1/metadata",
            "nonsense",
        ] {
            let e = EtcdCatalog::connect(bad).err().unwrap();
            assert!(matches!(e, P2pError::Metadata(_)), "{bad}: {e}");
        }
    }
}
