//! Leader election on etcd, using etcd's own election service: each
//! candidate is a key `<election>/<lease id>` bound to a lease of its own;
//! the oldest key (lowest create revision) leads. A leader that stops
//! renewing its lease (crash, partition) loses the key when the lease
//! expires, and the next candidate in line wins.
//!
//! The election is `mooncake-store/<cluster_id>/leader`; the value of a
//! candidate's key is its RPC address, which is what clients look up.
//!
//! Runs on the caller's tokio runtime (the master's); [`super::find_leader`]
//! is a blocking lookup for synchronous clients.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, LeaseKeepAliveStream, LeaseKeeper,
    SortOrder, SortTarget, Txn, TxnOp, WatchOptions,
};
use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::metadata::etcd::endpoint_urls;
use mooncake_transfer::metadata::CONNECT_TIMEOUT;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::{BoxFuture, HeldUntil, Leader, LeaderElection, Leadership, ResignRequest};

/// Bound on one unary etcd call (grant, get, revoke).
const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause before retrying after an unavailable endpoint or a broken stream.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// gRPC's UNAVAILABLE status: the endpoint the balancer picked is down.
const GRPC_UNAVAILABLE: i32 = 14;

/// The election (key prefix) of a cluster's masters.
pub fn election_name(cluster_id: &str) -> String {
    format!("mooncake-store/{cluster_id}/leader")
}

/// Splits `--etcd_endpoints` (`h1:p1;h2:p2`, entries optionally with
/// `http://`; an `etcd://` prefix on the whole is accepted) into endpoint
/// URLs.
pub fn parse_endpoints(s: &str) -> Result<Vec<String>> {
    let s = s.trim();
    let s = s.strip_prefix("etcd://").unwrap_or(s);
    let parts: Vec<String> = s
        .split([';', ','])
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    endpoint_urls(&parts).map_err(|e| Error::new(ErrorCode::ETCD_OPERATION_ERROR, e.context))
}

#[derive(Clone)]
pub struct EtcdElection {
    client: Client,
    /// Election name; candidate keys live under `<name>/`.
    name: String,
    ttl: Duration,
}

impl EtcdElection {
    /// Connects to `endpoints` (see [`parse_endpoints`]) for the election of
    /// `cluster_id`, with leases of `ttl` (whole seconds, at least 1; etcd
    /// may raise it to its minimum). Fails with `ETCD_OPERATION_ERROR`
    /// within a few seconds when no endpoint answers.
    pub async fn connect(
        endpoints: &[String],
        cluster_id: &str,
        ttl: Duration,
    ) -> Result<EtcdElection> {
        if endpoints.is_empty() {
            return Err(Error::new(
                ErrorCode::ETCD_OPERATION_ERROR,
                "no etcd endpoint given",
            ));
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            // HTTP/2 pings notice a dead connection under a long campaign or watch.
            .with_keep_alive(Duration::from_secs(2), CONNECT_TIMEOUT)
            .with_keep_alive_while_idle(true);
        let client = retrying("connect", CONNECT_TIMEOUT, || {
            Client::connect(endpoints, Some(options.clone()))
        })
        .await?;
        let kv = client.kv_client();
        retrying("probe", CONNECT_TIMEOUT, || {
            let mut kv = kv.clone();
            async move {
                kv.get("mooncake-store/", Some(GetOptions::new().with_count_only()))
                    .await
            }
        })
        .await?;
        Ok(EtcdElection {
            client,
            name: election_name(cluster_id),
            ttl: ttl.max(Duration::from_secs(1)),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the replication record lives (beside the election, not under
    /// its prefix).
    fn record_key(&self) -> String {
        format!("{}-in-sync", self.name)
    }

    async fn write_record(&self, leadership: &Leadership, record: &str) -> Result<()> {
        let (key, term) = (leadership.proof().to_vec(), leadership.term() as i64);
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, term)])
            .and_then([TxnOp::put(self.record_key(), record, None)]);
        let mut kv = self.client.kv_client();
        let resp = tokio::time::timeout(OP_TIMEOUT, kv.txn(txn))
            .await
            .map_err(|_| Error::new(ErrorCode::ETCD_OPERATION_ERROR, "etcd record: no answer"))?
            .map_err(|e| etcd_error("record", e))?;
        if !resp.succeeded() {
            return Err(Error::new(
                ErrorCode::ETCD_OPERATION_ERROR,
                "etcd record: this master no longer leads",
            ));
        }
        Ok(())
    }

    async fn read_record(&self) -> Result<Option<String>> {
        let kv = self.client.kv_client();
        let key = self.record_key();
        let resp = retrying("get record", OP_TIMEOUT, || {
            let (mut kv, key) = (kv.clone(), key.clone());
            async move { kv.get(key, None).await }
        })
        .await?;
        Ok(resp
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }

    async fn depose_leader(&self, leader: &str) -> Result<bool> {
        let prefix = format!("{}/", self.name);
        let mut kv = self.client.kv_client();
        let oldest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let resp = tokio::time::timeout(OP_TIMEOUT, kv.get(prefix, Some(oldest)))
            .await
            .map_err(|_| Error::new(ErrorCode::ETCD_OPERATION_ERROR, "etcd depose: no answer"))?
            .map_err(|e| etcd_error("depose", e))?;
        let Some(held) = resp.kvs().first() else {
            return Ok(false);
        };
        if held.value() != leader.as_bytes() {
            return Ok(false);
        }
        let mut client = self.client.clone();
        match tokio::time::timeout(OP_TIMEOUT, client.lease_revoke(held.lease())).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(e)) => Err(etcd_error("depose", e)),
            Err(_) => Err(Error::new(
                ErrorCode::ETCD_OPERATION_ERROR,
                "etcd depose: no answer",
            )),
        }
    }

    /// Current leader and the store revision it was read at.
    async fn leader_at(&self) -> Result<(Option<String>, i64)> {
        let (leader, rev) = self.leader_term_at().await?;
        Ok((leader.map(|l| l.address), rev))
    }

    /// Current leader with its term (its key's create revision, the term
    /// its campaign won), and the store revision they were read at.
    async fn leader_term_at(&self) -> Result<(Option<Leader>, i64)> {
        let prefix = format!("{}/", self.name);
        let kv = self.client.kv_client();
        let resp = retrying("get leader", OP_TIMEOUT, || {
            let (mut kv, prefix) = (kv.clone(), prefix.clone());
            let oldest = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1);
            async move { kv.get(prefix, Some(oldest)).await }
        })
        .await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let leader = resp.kvs().first().map(|kv| Leader {
            address: String::from_utf8_lossy(kv.value()).into_owned(),
            term: kv.create_revision().max(0) as u64,
        });
        Ok((leader, rev))
    }

    async fn campaign_as(&self, candidate: &str) -> Result<Leadership> {
        let mut client = self.client.clone();
        let ttl_secs = self.ttl.as_secs().max(1) as i64;
        // The lease runs from when etcd grants it: at the latest from here.
        let asked = Instant::now();
        let grant = retrying("lease grant", OP_TIMEOUT, || {
            let mut c = client.clone();
            async move { c.lease_grant(ttl_secs, None).await }
        })
        .await?;
        let lease = grant.id();
        let ttl = Duration::from_secs(grant.ttl().max(1) as u64);
        let (lost_tx, lost_rx) = watch::channel(false);
        let (resign_tx, resign_rx) = oneshot::channel::<ResignRequest>();
        let (elected_tx, elected_rx) = oneshot::channel::<Vec<u8>>();
        let held = HeldUntil::until((asked + ttl * 2 / 3).into_std());
        // From here on, dropping `resign_tx` (this future cancelled, or an
        // error below) makes the holder revoke the lease: no stale candidacy.
        tokio::spawn(hold(
            self.client.clone(),
            Grant { lease, ttl, asked },
            held.clone(),
            lost_tx,
            resign_rx,
            elected_rx,
        ));

        let mut lost = lost_rx.clone();
        let lost = async move {
            // The guard `wait_for` returns is not Send: drop it here.
            let _ = lost.wait_for(|l| *l).await;
        };
        tokio::pin!(lost);
        let won = loop {
            tokio::select! {
                r = client.campaign(self.name.as_str(), candidate, lease) => match r {
                    Ok(won) => break won,
                    // Campaigning again with the same lease resumes the same candidacy.
                    Err(e) if is_unavailable(&e) => tokio::time::sleep(RETRY_PAUSE).await,
                    Err(e) => return Err(etcd_error("campaign", e)),
                },
                _ = &mut lost => {
                    return Err(Error::new(ErrorCode::ETCD_OPERATION_ERROR, "campaign: lease lost while waiting"));
                }
            }
        };
        let (key, term) = won
            .leader()
            .map(|k| (k.key().to_vec(), k.rev()))
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::ETCD_OPERATION_ERROR,
                    "campaign: etcd returned no leader key",
                )
            })?;
        let _ = elected_tx.send(key.clone());
        tracing::info!(candidate, election = %self.name, lease, term, "won leader election");
        Ok(Leadership::new(candidate.to_string(), lost_rx, resign_tx)
            .with_term(term as u64, key)
            .with_held(held))
    }

    async fn follow(self, tx: watch::Sender<Option<String>>) {
        let prefix = format!("{}/", self.name);
        loop {
            // Read the leader, then watch the prefix from just after that
            // read, re-reading on every change; start over on any error.
            let watched = async {
                let (leader, rev) = self.leader_at().await?;
                tx.send_if_modified(|cur| replace_if_changed(cur, leader));
                let mut client = self.client.clone();
                let opts = WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(rev + 1);
                let (_watcher, mut events) = client
                    .watch(prefix.as_str(), Some(opts))
                    .await
                    .map_err(|e| etcd_error("watch", e))?;
                while let Some(resp) = events.message().await.map_err(|e| etcd_error("watch", e))? {
                    if resp.canceled() {
                        break;
                    }
                    if !resp.events().is_empty() {
                        let (leader, _) = self.leader_at().await?;
                        tx.send_if_modified(|cur| replace_if_changed(cur, leader));
                    }
                }
                Ok::<(), Error>(())
            };
            tokio::select! {
                r = watched => if let Err(e) = r {
                    tracing::debug!("leader watch on {}: {e}; retrying", self.name);
                },
                _ = tx.closed() => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(RETRY_PAUSE) => {}
                _ = tx.closed() => return,
            }
        }
    }
}

fn replace_if_changed(cur: &mut Option<String>, new: Option<String>) -> bool {
    if *cur == new {
        return false;
    }
    *cur = new;
    true
}

impl LeaderElection for EtcdElection {
    fn campaign<'a>(&'a self, candidate: &'a str) -> BoxFuture<'a, Result<Leadership>> {
        Box::pin(self.campaign_as(candidate))
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<String>>> {
        Box::pin(async move { Ok(self.leader_at().await?.0) })
    }

    fn leader_with_term(&self) -> BoxFuture<'_, Result<Option<Leader>>> {
        Box::pin(async move { Ok(self.leader_term_at().await?.0) })
    }

    fn observe(&self) -> BoxFuture<'_, Result<watch::Receiver<Option<String>>>> {
        Box::pin(async move {
            let (leader, _) = self.leader_at().await?;
            let (tx, rx) = watch::channel(leader);
            tokio::spawn(self.clone().follow(tx));
            Ok(rx)
        })
    }

    fn record_in_sync<'a>(
        &'a self,
        leadership: &'a Leadership,
        record: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.write_record(leadership, record))
    }

    fn in_sync(&self) -> BoxFuture<'_, Result<Option<String>>> {
        Box::pin(self.read_record())
    }

    fn depose<'a>(&'a self, leader: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.depose_leader(leader))
    }
}

/// A lease etcd granted: its id, its TTL, and when the grant was asked
/// for (the lease runs from then at the latest).
struct Grant {
    lease: i64,
    ttl: Duration,
    asked: Instant,
}

/// The holder task of one candidacy: renews the lease every `ttl / 3`,
/// flags `lost` when the lease expired, the leader key vanished or no
/// renewal got through for 2/3 of the TTL (the leader must stop before etcd
/// lets the next one in), and revokes the lease on resign or when the
/// [`Leadership`] is dropped. It extends `held` at each renewal etcd
/// accepts and ends it with the leadership.
///
/// A renewal that hangs (etcd cut off without a reset) is given up at that
/// 2/3 mark, not waited for: the mark is a deadline, checked on the clock.
async fn hold(
    mut client: Client,
    Grant { lease, ttl, asked }: Grant,
    held: HeldUntil,
    lost: watch::Sender<bool>,
    mut resign: oneshot::Receiver<ResignRequest>,
    mut elected: oneshot::Receiver<Vec<u8>>,
) {
    let every = ttl / 3;
    let grace = ttl * 2 / 3;
    let mut renewed_at = asked;
    let mut keeper: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    let mut key: Option<Vec<u8>> = None;
    let mut awaiting_key = true;
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let reply = loop {
        tokio::select! {
            r = &mut resign => break r.ok(),
            k = &mut elected, if awaiting_key => {
                awaiting_key = false;
                key = k.ok();
            }
            _ = tick.tick() => {
                let sent = Instant::now();
                let by = (sent + every).min(renewed_at + grace);
                match tokio::time::timeout_at(by, renew(&mut client, &mut keeper, lease)).await {
                    Ok(Ok(true)) => {
                        renewed_at = sent;
                        held.extend_to((sent + grace).into_std());
                    }
                    Ok(Ok(false)) => {
                        tracing::warn!(lease, "leader lease expired");
                        break None;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(lease, "lease renewal failed: {e}");
                        keeper = None;
                    }
                    Err(_) => keeper = None,
                }
                if Instant::now() >= renewed_at + grace {
                    tracing::warn!(lease, "etcd unreachable for too long; giving leadership up");
                    break None;
                }
                if let Some(k) = &key {
                    let mut kv = client.kv_client();
                    let by = (Instant::now() + every).min(renewed_at + grace);
                    let gone = matches!(
                        tokio::time::timeout_at(by, kv.get(k.clone(), Some(GetOptions::new().with_count_only()))).await,
                        Ok(Ok(resp)) if resp.count() == 0
                    );
                    if gone {
                        tracing::warn!(lease, "leader key deleted");
                        break None;
                    }
                }
            }
        }
    };
    held.end();
    lost.send_replace(true);
    // Revoking deletes the candidate key, so the next candidate wins now
    // rather than at lease expiry.
    let revoked = match tokio::time::timeout(OP_TIMEOUT, client.lease_revoke(lease)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(etcd_error("lease revoke", e)),
        Err(_) => Err(Error::new(
            ErrorCode::ETCD_OPERATION_ERROR,
            "lease revoke: no answer",
        )),
    };
    if let Some(reply) = reply {
        let _ = reply.send(revoked);
    }
}

/// One keep-alive round trip: `Ok(false)` when etcd says the lease is gone.
async fn renew(
    client: &mut Client,
    keeper: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    lease: i64,
) -> std::result::Result<bool, etcd_client::Error> {
    let Some((k, stream)) = keeper else {
        // Opening the stream performs a first renewal itself.
        return match client.lease_keep_alive(lease).await {
            Ok(opened) => {
                *keeper = Some(opened);
                Ok(true)
            }
            Err(etcd_client::Error::LeaseKeepAliveError(msg)) if msg.contains("not found") => {
                Ok(false)
            }
            Err(e) => Err(e),
        };
    };
    k.keep_alive().await?;
    match stream.message().await? {
        Some(resp) => Ok(resp.ttl() > 0),
        None => Err(etcd_client::Error::LeaseKeepAliveError(
            "keep-alive stream closed".into(),
        )),
    }
}

fn is_unavailable(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if i32::from(s.code()) == GRPC_UNAVAILABLE)
}

fn etcd_error(what: &str, e: etcd_client::Error) -> Error {
    Error::new(ErrorCode::ETCD_OPERATION_ERROR, format!("etcd {what}: {e}"))
}

/// Runs `op` until it succeeds or `limit` has passed, retrying UNAVAILABLE
/// (with several endpoints, the balancer may have picked a dead one).
async fn retrying<T, F, Fut>(what: &str, limit: Duration, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let deadline = Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, op()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if is_unavailable(&e) && Instant::now() + RETRY_PAUSE < deadline => {
                tokio::time::sleep(RETRY_PAUSE).await
            }
            Ok(Err(e)) => return Err(etcd_error(what, e)),
            Err(_) => {
                return Err(Error::new(
                    ErrorCode::ETCD_OPERATION_ERROR,
                    format!("etcd {what}: no answer within {limit:?}"),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_from_flag() {
        assert_eq!(
            parse_endpoints("h1:1;h2:2").unwrap(),
            ["http://h1:1", "http://h2:2"]
        );
        assert_eq!(
            parse_endpoints("http://e0:2379; http://e1:2379").unwrap(),
            ["http://e0:2379", "http://e1:2379"]
        );
        assert_eq!(
            parse_endpoints("etcd://h:1,h:2").unwrap(),
            ["http://h:1", "http://h:2"]
        );
        for bad in ["", ";", "h", "h:x"] {
            assert_eq!(
                parse_endpoints(bad).unwrap_err().code,
                ErrorCode::ETCD_OPERATION_ERROR,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn election_is_per_cluster() {
        assert_eq!(election_name("prod"), "mooncake-store/prod/leader");
    }

    #[test]
    fn replace_only_on_change() {
        let mut cur = None;
        assert!(!replace_if_changed(&mut cur, None));
        assert!(replace_if_changed(&mut cur, Some("a".into())));
        assert!(!replace_if_changed(&mut cur, Some("a".into())));
        assert!(replace_if_changed(&mut cur, None));
    }

    #[test]
    fn unreachable_etcd_fails_fast() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let backend = super::super::ElectionBackend::Etcd(vec![format!("http://127.0.0.1:{port}")]);
        let e = super::super::find_leader(&backend, "c").unwrap_err();
        assert_eq!(e.code, ErrorCode::ETCD_OPERATION_ERROR);
    }
}
