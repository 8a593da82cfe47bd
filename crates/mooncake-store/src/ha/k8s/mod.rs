//! Leader election on a Kubernetes Lease (`coordination.k8s.io/v1`), with
//! the semantics of client-go's `LeaseLock` and `LeaderElector`, so that
//! masters in a cluster need no etcd or redis of their own.
//!
//! - The election is one Lease, `<namespace>/<name>` ([`LeaseRef`]). Its
//!   `holderIdentity` is the leader's identity: the master's advertised
//!   RPC address, which must be unique per master.
//! - A candidate creates the Lease if it is absent (a 409 AlreadyExists
//!   means another created it first), and takes it when `holderIdentity`
//!   is empty or when no change of the Lease has been seen for
//!   `leaseDurationSeconds`, timed by this process's monotonic clock from
//!   when it saw the change (never by comparing the remote `renewTime`
//!   with the local clock).
//! - Every new holder increments `leaseTransitions`: that number is the
//!   holder's term ([`K8sElection::campaign_with_term`]). Unlike client-go,
//!   a Lease still naming this master's identity from an earlier run (or a
//!   duplicate process) is not resumed: it is waited out and taken with a
//!   new term, so terms never repeat.
//! - Every write is a PUT carrying `metadata.resourceVersion`; a 409
//!   Conflict means another candidate won, and is never retried blindly.
//! - The holder renews every retry period and gives leadership up once no
//!   renewal got through within the renew deadline of the last one sent,
//!   without waiting for a hung request. On resign, on drop, and after
//!   losing, it clears `holderIdentity` (client-go's `ReleaseOnCancel`) if
//!   the Lease is still its own, so a standby takes over within a retry
//!   period.
//! - Candidates retry every retry period plus up to 20% jitter. Defaults:
//!   lease 5 s, renew deadline 3 s, retry 1 s ([`Timings`]).
//! - Clients find the leader with [`K8sElection::holder`]: `holderIdentity`,
//!   or none once `renewTime + leaseDurationSeconds` has passed by the local
//!   clock, as the reference's lookup reads it.
//!
//! - With `--enable_oplog`, the replication record (the in-sync replica
//!   set, `master::replication`) is the Lease's annotation
//!   [`RECORD_ANNOTATION`]. The holder writes it as a renewal over the
//!   version it last wrote, so the write lands only while the Lease is
//!   still its own, under its term (the fencing etcd's transaction gives);
//!   every other write of the Lease, client-go's included, keeps it.
//! - A standby that finds the leader's process gone deposes it: it clears
//!   `holderIdentity` over the version naming that leader, so the
//!   election moves on within a retry period rather than a lease.
//!
//! The API server is found as client-go finds it ([`config`]). An
//! unreachable server is retried for ever; a 403 is logged naming the verb
//! and resource RBAC refuses.
//!
//! ## Why a small REST client rather than `kube`
//!
//! The election uses four calls (get, create and update a Lease, patch a
//! pod). `kube` 5 with `k8s-openapi` would add 52 crates to the build,
//! `k8s-openapi`'s generated types for every API group among them, and
//! still no leader election matching client-go. The REST calls here ride
//! on reqwest (already a dependency) with rustls on ring: 13 more crates,
//! about 80 s of CPU in a dev build (see `docs/k8s.md`). Config loading
//! follows client-go's rules in [`config`]; token files are re-read every
//! minute and after a 401, as client-go does.

pub mod api;
pub mod config;
mod elector;
pub mod label;
pub mod record;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};

use self::api::{ApiClient, Failure};
use self::config::ClusterConfig;
use super::{BoxFuture, Leader, LeaderElection, Leadership};

/// The Lease an election runs on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseRef {
    pub namespace: String,
    pub name: String,
}

impl LeaseRef {
    /// Parses `<namespace>/<lease>`, or a bare `<lease>` in namespace
    /// `default`.
    pub fn parse(s: &str) -> Result<LeaseRef> {
        let invalid = |why: String| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("k8s lease {s:?}: {why}; expected <namespace>/<lease> or <lease>"),
            )
        };
        let parts: Vec<&str> = s.split('/').collect();
        let (namespace, name) = match parts[..] {
            [name] => ("default", name),
            [ns, name] => (ns, name),
            _ => return Err(invalid("more than one '/'".into())),
        };
        if namespace.is_empty() || name.is_empty() {
            return Err(invalid("empty namespace or lease name".into()));
        }
        if !is_dns_name(namespace, false) {
            return Err(invalid(format!(
                "namespace {namespace:?} is not a DNS label (lowercase letters, digits, '-', at most 63)"
            )));
        }
        if !is_dns_name(name, true) {
            return Err(invalid(format!(
                "lease name {name:?} is not a DNS subdomain (lowercase letters, digits, '-', '.')"
            )));
        }
        Ok(LeaseRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }
}

/// The election key, `<namespace>/<lease>`.
impl std::fmt::Display for LeaseRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// RFC 1123 label (or, with `dots`, subdomain) as the API server checks it.
fn is_dns_name(s: &str, dots: bool) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if dots {
        s.len() <= 253 && s.split('.').all(label_ok)
    } else {
        label_ok(s)
    }
}

/// client-go's LeaderElectionConfig timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How long others wait, after the last change they saw, before taking
    /// the lease. Whole seconds: `leaseDurationSeconds` is an integer.
    pub lease: Duration,
    /// The holder gives up once no renewal got through for this long.
    pub renew_deadline: Duration,
    /// How often the holder renews and candidates retry.
    pub retry: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            lease: Duration::from_secs(5),
            renew_deadline: Duration::from_secs(3),
            retry: Duration::from_secs(1),
        }
    }
}

impl Timings {
    /// The defaults' proportions for a lease of `lease` (rounded up to
    /// whole seconds, at least 1).
    pub fn for_lease(lease: Duration) -> Timings {
        let lease = Duration::from_secs(lease.as_secs_f64().ceil().max(1.0) as u64);
        Timings {
            lease,
            renew_deadline: lease * 3 / 5,
            retry: lease / 5,
        }
    }

    /// client-go's rules: lease > renew deadline > 1.2 × retry > 0; and
    /// the lease in whole seconds.
    pub fn validate(&self) -> Result<()> {
        let invalid = |why: &str| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("k8s lease timings {self:?}: {why}"),
            )
        };
        if self.lease.subsec_nanos() != 0 || self.lease.is_zero() {
            return Err(invalid(
                "the lease duration must be a whole number of seconds, at least 1",
            ));
        }
        if self.retry.is_zero() {
            return Err(invalid("the retry period must be positive"));
        }
        if self.renew_deadline >= self.lease {
            return Err(invalid(
                "the lease duration must be longer than the renew deadline",
            ));
        }
        if self.renew_deadline.as_secs_f64() <= self.retry.as_secs_f64() * 1.2 {
            return Err(invalid(
                "the renew deadline must be longer than 1.2 × the retry period",
            ));
        }
        Ok(())
    }

    fn lease_secs(&self) -> i64 {
        self.lease.as_secs() as i64
    }

    fn jittered_retry(&self) -> Duration {
        self.retry.mul_f64(1.0 + rand::random::<f64>() * 0.2)
    }
}

/// The lease's holder, as a client looking for the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holder {
    /// None: no holder, or its last renewal ran out.
    pub identity: Option<String>,
    /// `leaseTransitions`: the current (or last) holder's term.
    pub transitions: i64,
}

/// The record writer of each won term: (identity, term) to its holder.
type Writers = HashMap<(String, i64), mpsc::UnboundedSender<elector::RecordWrite>>;

/// The Lease annotation holding the replication record.
pub const RECORD_ANNOTATION: &str = "mooncake.io/in-sync";

#[derive(Clone)]
pub struct K8sElection {
    api: Arc<ApiClient>,
    lease: LeaseRef,
    timings: Timings,
    /// The holder task of each won term (identity, term) of this process,
    /// which writes the replication record.
    writers: Arc<Mutex<Writers>>,
}

impl K8sElection {
    /// The election on `lease` through the API server of `config`. Checks
    /// the settings only: the server is first contacted by a campaign or a
    /// lookup.
    pub fn new(config: &ClusterConfig, lease: LeaseRef, timings: Timings) -> Result<K8sElection> {
        timings.validate()?;
        Ok(K8sElection {
            api: Arc::new(ApiClient::new(config, timings.renew_deadline)?),
            lease,
            timings,
            writers: Arc::default(),
        })
    }

    /// Like [`new`](Self::new), with the cluster found as client-go finds it.
    pub fn connect(lease: LeaseRef, timings: Timings) -> Result<K8sElection> {
        Self::new(&ClusterConfig::infer()?, lease, timings)
    }

    pub fn lease(&self) -> &LeaseRef {
        &self.lease
    }

    pub fn timings(&self) -> Timings {
        self.timings
    }

    /// Waits until `candidate` holds the lease, retrying through any API
    /// failure: leadership with its term (`leaseTransitions`). Dropping the
    /// future withdraws the candidacy.
    pub async fn campaign_with_term(&self, candidate: &str) -> Result<(Leadership, i64)> {
        if candidate.is_empty() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "empty leader-election identity",
            ));
        }
        let (won_tx, won_rx) = oneshot::channel();
        tokio::spawn(elector::run(self.clone(), candidate.to_string(), won_tx));
        won_rx.await.map_err(|_| {
            Error::new(
                ErrorCode::K8S_LEASE_OPERATION_ERROR,
                format!("campaign for lease {} ended", self.lease),
            )
        })
    }

    /// Reads the holder (the reference's `getHolder`); a missing lease has
    /// none.
    pub async fn holder(&self) -> Result<Holder> {
        match self.api.get_lease(&self.lease).await {
            Ok(l) => Ok(Holder {
                identity: record::holder_at(&l.record, SystemTime::now()),
                transitions: l.record.transitions,
            }),
            Err(e) if e.failure == Failure::NotFound => Ok(Holder::default()),
            Err(e) => Err(e.into_error()),
        }
    }

    /// Writes the replication record as the holder of `term`; fails once
    /// the Lease is not its own (or the holder task has ended).
    pub async fn write_record(&self, identity: &str, term: i64, value: &str) -> Result<()> {
        let fenced = || {
            Error::new(
                ErrorCode::K8S_LEASE_OPERATION_ERROR,
                format!(
                    "lease {}: {identity} does not hold term {term}: record not written",
                    self.lease
                ),
            )
        };
        let writer = self
            .writers
            .lock()
            .get(&(identity.to_string(), term))
            .cloned();
        let writer = writer.ok_or_else(fenced)?;
        let (done, answer) = oneshot::channel();
        writer
            .send(elector::RecordWrite {
                value: value.to_string(),
                done,
            })
            .map_err(|_| fenced())?;
        match answer.await {
            Ok(r) => r.map_err(api::ApiError::into_error),
            Err(_) => Err(fenced()),
        }
    }

    /// The replication record, as the Lease carries it.
    pub async fn read_record(&self) -> Result<Option<String>> {
        match self.api.get_lease(&self.lease).await {
            Ok(l) => Ok(l.annotation(RECORD_ANNOTATION).map(str::to_string)),
            Err(e) if e.failure == Failure::NotFound => Ok(None),
            Err(e) => Err(e.into_error()),
        }
    }

    /// Clears the holder if it is still `leader` (a compare-and-swap over
    /// the version read): candidates take the Lease at their next retry.
    pub async fn depose_holder(&self, leader: &str) -> Result<bool> {
        let current = match self.api.get_lease(&self.lease).await {
            Ok(l) => l,
            Err(e) if e.failure == Failure::NotFound => return Ok(false),
            Err(e) => return Err(e.into_error()),
        };
        if current.record.holder != leader {
            return Ok(false);
        }
        let released = current.record.released(SystemTime::now());
        match self
            .api
            .update_lease(&self.lease, &current, &released)
            .await
        {
            Ok(_) => Ok(true),
            // Renewed or taken meanwhile: not the lease read.
            Err(e) if matches!(e.failure, Failure::Conflict | Failure::NotFound) => Ok(false),
            Err(e) => Err(e.into_error()),
        }
    }

    /// Sets (`Some`) or removes (`None`) label `key` of pod
    /// `namespace/name` with a JSON merge patch.
    pub async fn label_pod(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<()> {
        self.api
            .label_pod(namespace, name, key, value)
            .await
            .map_err(api::ApiError::into_error)
    }

    async fn follow(self, tx: watch::Sender<Option<String>>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.timings.retry) => {}
                _ = tx.closed() => return,
            }
            match self.holder().await {
                Ok(h) => {
                    tx.send_if_modified(|cur| {
                        let changed = *cur != h.identity;
                        *cur = h.identity;
                        changed
                    });
                }
                Err(e) => tracing::debug!("leader poll on lease {}: {e}", self.lease),
            }
        }
    }
}

impl LeaderElection for K8sElection {
    fn campaign<'a>(&'a self, candidate: &'a str) -> BoxFuture<'a, Result<Leadership>> {
        Box::pin(async move {
            let (leadership, term) = self.campaign_with_term(candidate).await?;
            Ok(leadership.with_term(term.max(0) as u64, Vec::new()))
        })
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<String>>> {
        Box::pin(async move { Ok(self.holder().await?.identity) })
    }

    fn leader_with_term(&self) -> BoxFuture<'_, Result<Option<Leader>>> {
        Box::pin(async move {
            let holder = self.holder().await?;
            Ok(holder.identity.map(|address| Leader {
                address,
                term: holder.transitions.max(0) as u64,
            }))
        })
    }

    fn observe(&self) -> BoxFuture<'_, Result<watch::Receiver<Option<String>>>> {
        Box::pin(async move {
            let (tx, rx) = watch::channel(self.holder().await?.identity);
            tokio::spawn(self.clone().follow(tx));
            Ok(rx)
        })
    }

    fn record_in_sync<'a>(
        &'a self,
        leadership: &'a Leadership,
        record: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.write_record(leadership.candidate(), leadership.term() as i64, record))
    }

    fn in_sync(&self) -> BoxFuture<'_, Result<Option<String>>> {
        Box::pin(self.read_record())
    }

    fn depose<'a>(&'a self, leader: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.depose_holder(leader))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connstring_is_namespace_slash_lease() {
        let l = LeaseRef::parse("mooncake/store-leader").unwrap();
        assert_eq!(
            (l.namespace.as_str(), l.name.as_str()),
            ("mooncake", "store-leader")
        );
        let bare = LeaseRef::parse("store-leader").unwrap();
        assert_eq!(bare.namespace, "default");
        for (bad, why) in [
            ("", "empty"),
            ("/lease", "empty"),
            ("ns/", "empty"),
            ("/", "empty"),
            ("a/b/c", "more than one '/'"),
            ("ns//l", "more than one '/'"),
            ("Upper/l", "DNS label"),
            ("ns/under_score", "DNS subdomain"),
            ("ns.dotted/l", "DNS label"),
        ] {
            let e = LeaseRef::parse(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{bad:?}");
            assert!(e.context.contains(why), "{bad:?}: {e}");
            assert!(e.context.contains("<namespace>/<lease>"), "{e}");
        }
    }

    #[test]
    fn election_key_format() {
        // The reference's electionKey(namespace, lease).
        for (ns, name, key) in [
            ("default", "leader", "default/leader"),
            ("kube-system", "my-lock", "kube-system/my-lock"),
        ] {
            let l = LeaseRef::parse(key).unwrap();
            assert_eq!((l.namespace.as_str(), l.name.as_str()), (ns, name));
            assert_eq!(l.to_string(), key);
        }
        // The reference allows an empty namespace ("/bare"); a Lease needs one.
        assert!(LeaseRef::parse("/bare").is_err());
    }

    #[test]
    fn timings_follow_client_go_rules() {
        let d = Timings::default();
        assert_eq!(
            (d.lease, d.renew_deadline, d.retry),
            (
                Duration::from_secs(5),
                Duration::from_secs(3),
                Duration::from_secs(1)
            )
        );
        d.validate().unwrap();
        assert_eq!(Timings::for_lease(Duration::from_secs(5)), d);
        let short = Timings::for_lease(Duration::from_millis(500));
        assert_eq!(short.lease, Duration::from_secs(1));
        short.validate().unwrap();
        let ms = Duration::from_millis;
        for bad in [
            Timings {
                lease: ms(1500),
                ..d
            },
            Timings { lease: ms(0), ..d },
            Timings {
                renew_deadline: ms(5000),
                ..d
            },
            Timings {
                retry: ms(2500),
                ..d
            },
            Timings { retry: ms(0), ..d },
        ] {
            assert_eq!(
                bad.validate().unwrap_err().code,
                ErrorCode::INVALID_PARAMS,
                "{bad:?}"
            );
        }
        for _ in 0..100 {
            let j = d.jittered_retry();
            assert!(j >= d.retry && j <= d.retry.mul_f64(1.2), "{j:?}");
        }
    }
}
