//! High availability: which master leads. Masters of one cluster campaign
//! for leadership through a coordination service; at most one holds it at a
//! time, through a lease it must keep renewing. Clients and standbys follow
//! the leader's value (its RPC address).
//!
//! [`LeaderElection`] is the seam; [`etcd`], [`redis`] and [`k8s`] implement it. A
//! won election is a [`Leadership`] handle, the same for every backend: its
//! holder task (spawned by the backend) renews the lease, flags loss, and
//! gives the lease up on [`Leadership::resign`] or when the handle is
//! dropped.

pub mod etcd;
mod held;
pub mod k8s;
pub mod redis;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use tokio::sync::{oneshot, watch};

pub use held::HeldUntil;

/// Leadership lease: a dead leader is replaced within about this long.
pub const LEASE_TTL: Duration = Duration::from_secs(5);

/// Where the election of a cluster's masters runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElectionBackend {
    /// etcd endpoint URLs.
    Etcd(Vec<String>),
    /// One redis server, `host:port`.
    Redis(String),
    /// A Kubernetes Lease, `<namespace>/<lease>` ([`k8s::LeaseRef::parse`]),
    /// with the election's timings; the Lease names the election, so the
    /// cluster id plays no part.
    K8s(k8s::LeaseRef, k8s::Timings),
}

impl ElectionBackend {
    /// Parses a coordination address: `etcd://h1:p1;h2:p2`, `redis://h:p`,
    /// `k8s://<namespace>/<lease>` (default timings), or bare `;`-separated
    /// endpoints, which are etcd unless `redis` is set.
    pub fn parse(s: &str, redis: bool) -> Result<ElectionBackend> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("redis://") {
            return Self::redis(rest);
        }
        if s.starts_with("k8s://") {
            return Self::k8s(s, k8s::Timings::default());
        }
        if redis && !s.starts_with("etcd://") {
            return Self::redis(s);
        }
        etcd::parse_endpoints(s)
            .map(ElectionBackend::Etcd)
            .map_err(|e| Error::new(ErrorCode::INVALID_PARAMS, e.context))
    }

    /// The Lease `<namespace>/<lease>` (or `k8s://<namespace>/<lease>`),
    /// elected on with `timings`.
    pub fn k8s(s: &str, timings: k8s::Timings) -> Result<ElectionBackend> {
        timings.validate()?;
        let lease = k8s::LeaseRef::parse(s.trim().trim_start_matches("k8s://"))?;
        Ok(ElectionBackend::K8s(lease, timings))
    }

    fn redis(s: &str) -> Result<ElectionBackend> {
        let nodes: Vec<&str> = s
            .split(';')
            .map(|n| n.trim().trim_start_matches("redis://"))
            .filter(|n| !n.is_empty())
            .collect();
        match nodes[..] {
            [one] => Ok(ElectionBackend::Redis(one.to_string())),
            [] => Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "no redis address given",
            )),
            _ => Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("redis HA takes one server, got {s:?} (redis cluster is not supported)"),
            )),
        }
    }

    /// Joins the election of `cluster_id` with leases of `ttl` (a k8s
    /// election has timings of its own).
    pub async fn connect(
        &self,
        cluster_id: &str,
        ttl: Duration,
    ) -> Result<Arc<dyn LeaderElection>> {
        Ok(match self {
            ElectionBackend::Etcd(endpoints) => {
                Arc::new(etcd::EtcdElection::connect(endpoints, cluster_id, ttl).await?)
            }
            ElectionBackend::Redis(addr) => {
                Arc::new(redis::RedisElection::connect(addr, cluster_id, ttl).await?)
            }
            ElectionBackend::K8s(lease, timings) => {
                Arc::new(k8s::K8sElection::connect(lease.clone(), *timings)?)
            }
        })
    }
}

/// The leader as a client looking it up finds it: its value (RPC address)
/// and the election's term, read together from the coordination service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub address: String,
    /// The term of the election this leader won (etcd: its key's create
    /// revision; redis: the counter, which its winner increments while it
    /// holds the key; k8s: `leaseTransitions`).
    pub term: u64,
}

/// Blocking lookup of the current leader of `cluster_id` and its term, for
/// synchronous clients resolving an HA master address. Safe on any thread:
/// the lookup runs on a short-lived thread with a runtime of its own.
pub fn find_leader(backend: &ElectionBackend, cluster_id: &str) -> Result<Option<Leader>> {
    let (backend, cluster_id) = (backend.clone(), cluster_id.to_string());
    let failed = |what: String| Error::new(ErrorCode::RPC_FAIL, what);
    let lookup = std::thread::Builder::new()
        .name("mc-find-leader".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| failed(format!("leader lookup runtime: {e}")))?;
            rt.block_on(async {
                let election = backend.connect(&cluster_id, LEASE_TTL).await?;
                election.leader_with_term().await
            })
        })
        .map_err(|e| failed(format!("cannot start leader lookup: {e}")))?;
    lookup
        .join()
        .map_err(|_| failed("leader lookup panicked".into()))?
}

/// A boxed future, so [`LeaderElection`] stays object-safe (the backend is
/// picked at run time by `--ha_backend_type`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Leader election for the masters of one cluster.
pub trait LeaderElection: Send + Sync + 'static {
    /// Waits until `candidate` (the caller's RPC address) leads. While it
    /// waits its candidacy is kept alive; dropping the future withdraws it.
    fn campaign<'a>(&'a self, candidate: &'a str) -> BoxFuture<'a, Result<Leadership>>;

    /// The current leader's value, if there is a leader.
    fn leader(&self) -> BoxFuture<'_, Result<Option<String>>>;

    /// The current leader's value and term, read together, if there is a
    /// leader.
    fn leader_with_term(&self) -> BoxFuture<'_, Result<Option<Leader>>>;

    /// Follows the leader: the receiver holds the current leader (`None`
    /// between leaders) and is updated on every change, until dropped.
    fn observe(&self) -> BoxFuture<'_, Result<watch::Receiver<Option<String>>>>;

    /// Writes the replication record of the cluster (the in-sync replica
    /// set, see `master::replication`) if, and only if, `leadership` still
    /// holds the election in the coordination service: a deposed leader's
    /// write fails with `ETCD_OPERATION_ERROR`.
    fn record_in_sync<'a>(
        &'a self,
        leadership: &'a Leadership,
        record: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        let _ = (leadership, record);
        Box::pin(async { Err(no_record()) })
    }

    /// The cluster's replication record, as last written by a leader.
    fn in_sync(&self) -> BoxFuture<'_, Result<Option<String>>> {
        Box::pin(async { Err(no_record()) })
    }

    /// Ends the leadership of `leader` (a leader value) if it still holds
    /// the election, so that a candidate wins now rather than at lease
    /// expiry. For a standby that saw the leader's process gone (its RPC
    /// port refuses connections). Returns whether it ended one.
    fn depose<'a>(&'a self, leader: &'a str) -> BoxFuture<'a, Result<bool>> {
        let _ = leader;
        Box::pin(async { Ok(false) })
    }
}

fn no_record() -> Error {
    Error::new(
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
        "this coordination service keeps no replication record",
    )
}

/// Asks the holder task to give leadership up; it answers once done.
pub type ResignRequest = oneshot::Sender<Result<()>>;

/// Leadership won by [`LeaderElection::campaign`].
///
/// Dropping it gives leadership up too (without waiting); use
/// [`resign`](Self::resign) to wait until others can take over.
pub struct Leadership {
    candidate: String,
    /// The election's term: increases with every new leader (etcd: the
    /// leader key's create revision; redis: a counter; k8s:
    /// `leaseTransitions`). Replicated entries carry it.
    term: u64,
    /// What the backend compares to prove this leadership still holds
    /// (etcd: the leader key).
    proof: Vec<u8>,
    lost: watch::Receiver<bool>,
    /// Until when the lease is proven (calls check it: [`HeldUntil`]).
    held: HeldUntil,
    resign: Option<oneshot::Sender<ResignRequest>>,
}

impl Leadership {
    /// For backends: a handle over the holder task's channels. The task sets
    /// `lost` to true when leadership ends, and gives it up when `resign`
    /// fires or is dropped.
    pub fn new(
        candidate: String,
        lost: watch::Receiver<bool>,
        resign: oneshot::Sender<ResignRequest>,
    ) -> Leadership {
        Leadership {
            candidate,
            term: 0,
            proof: Vec::new(),
            lost,
            held: HeldUntil::forever(),
            resign: Some(resign),
        }
    }

    /// Sets the term of this leadership and the backend's proof of it.
    pub fn with_term(mut self, term: u64, proof: Vec<u8>) -> Leadership {
        self.term = term;
        self.proof = proof;
        self
    }

    /// Sets the deadline the backend's holder task keeps: extended at each
    /// accepted renewal, ended when leadership ends.
    pub fn with_held(mut self, held: HeldUntil) -> Leadership {
        self.held = held;
        self
    }

    /// Until when this leadership is proven, for threads that answer as
    /// leader without waiting for the holder task to flag a loss.
    pub fn held_until(&self) -> HeldUntil {
        self.held.clone()
    }

    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    pub(crate) fn proof(&self) -> &[u8] {
        &self.proof
    }

    /// Whether leadership is still held, as far as this process knows.
    pub fn is_held(&self) -> bool {
        !*self.lost.borrow() && self.lost.has_changed().is_ok()
    }

    /// A receiver that turns true when leadership is lost (for tasks that
    /// watch while others hold the handle).
    pub fn lost_watch(&self) -> watch::Receiver<bool> {
        self.lost.clone()
    }

    /// Resolves once leadership is lost (lease expired, key deleted, or the
    /// coordination service unreachable for too long). A leader that sees
    /// this must stop acting as leader at once.
    pub async fn lost(&mut self) {
        // An error means the holder task is gone, which also ends leadership.
        let _ = self.lost.wait_for(|lost| *lost).await;
    }

    /// Gives leadership up and waits until the coordination service has
    /// released it, so another candidate can win right away.
    pub async fn resign(mut self) -> Result<()> {
        let Some(resign) = self.resign.take() else {
            return Ok(());
        };
        let (done_tx, done_rx) = oneshot::channel();
        if resign.send(done_tx).is_err() {
            return Ok(()); // holder already gone: nothing left to give up
        }
        done_rx.await.unwrap_or(Ok(()))
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("candidate", &self.candidate)
            .field("term", &self.term)
            .field("held", &self.is_held())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_from_address() {
        let etcd = |v: &[&str]| ElectionBackend::Etcd(v.iter().map(|s| s.to_string()).collect());
        assert_eq!(
            ElectionBackend::parse("etcd://h1:1;h2:2", false).unwrap(),
            etcd(&["http://h1:1", "http://h2:2"])
        );
        assert_eq!(
            ElectionBackend::parse("h:1", false).unwrap(),
            etcd(&["http://h:1"])
        );
        assert_eq!(
            ElectionBackend::parse("redis://h:6379", false).unwrap(),
            ElectionBackend::Redis("h:6379".into())
        );
        assert_eq!(
            ElectionBackend::parse("h:6379", true).unwrap(),
            ElectionBackend::Redis("h:6379".into())
        );
        assert_eq!(
            ElectionBackend::parse("k8s://mooncake/store", false).unwrap(),
            ElectionBackend::K8s(
                k8s::LeaseRef::parse("mooncake/store").unwrap(),
                k8s::Timings::default()
            )
        );
        let bare = ElectionBackend::parse("k8s://store", false).unwrap();
        assert!(matches!(bare, ElectionBackend::K8s(l, _) if l.namespace == "default"));
        for bad in [
            "",
            "redis://",
            "redis://a:1;redis://b:1",
            "h",
            "etcd://",
            "k8s://",
            "k8s://a/b/c",
            "k8s:///lease",
            "k8s://ns/",
        ] {
            assert_eq!(
                ElectionBackend::parse(bad, false).unwrap_err().code,
                ErrorCode::INVALID_PARAMS,
                "{bad:?}"
            );
        }
    }

    #[tokio::test]
    async fn resign_asks_the_holder_and_waits() {
        let (lost_tx, lost_rx) = watch::channel(false);
        let (resign_tx, resign_rx) = oneshot::channel::<ResignRequest>();
        let l = Leadership::new("a:1".into(), lost_rx, resign_tx);
        assert!(l.is_held());
        assert_eq!(l.candidate(), "a:1");
        let holder = tokio::spawn(async move {
            let done = resign_rx.await.unwrap();
            lost_tx.send_replace(true);
            done.send(Ok(())).unwrap();
        });
        l.resign().await.unwrap();
        holder.await.unwrap();
    }

    #[tokio::test]
    async fn dropping_the_handle_releases_the_holder() {
        let (resign_tx, resign_rx) = oneshot::channel::<ResignRequest>();
        drop(Leadership::new(
            "a".into(),
            watch::channel(false).1,
            resign_tx,
        ));
        assert!(resign_rx.await.is_err());
    }

    #[tokio::test]
    async fn lost_resolves_when_holder_flags_or_vanishes() {
        let (lost_tx, lost_rx) = watch::channel(false);
        let mut l = Leadership::new("a".into(), lost_rx, oneshot::channel().0);
        lost_tx.send_replace(true);
        l.lost().await;
        assert!(!l.is_held());

        let (lost_tx, lost_rx) = watch::channel(false);
        let mut l = Leadership::new("a".into(), lost_rx, oneshot::channel().0);
        drop(lost_tx);
        l.lost().await;
        assert!(!l.is_held());
        // Resigning after the holder is gone is not an error.
        l.resign().await.unwrap();
    }
}
