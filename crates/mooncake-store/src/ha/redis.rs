//! Leader election on redis (`--ha_backend_type=redis`, endpoint
//! `redis://host:port`; `MC_REDIS_PASSWORD` / `MC_REDIS_DB_INDEX` apply).
//!
//! The leader is whoever holds one key, `mooncake-store/{<cluster>}/leader`
//! (the braces are a hash tag: in a redis cluster all of a cluster's keys
//! share a slot), set with `NX` and a millisecond expiry. Its value is the
//! leader's candidate string (RPC address), which must be unique per
//! master. The holder renews the expiry with a compare-and-expire script
//! and resigns with compare-and-delete, so it never touches a successor's
//! key. Candidates and observers poll: redis has no blocking campaign.
//!
//! Runs on the caller's tokio runtime.

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{Client, RedisError, Script};
use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::metadata::redis::{connection_info, RedisOptions};
use mooncake_transfer::metadata::CONNECT_TIMEOUT;
use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::{BoxFuture, HeldUntil, Leader, LeaderElection, Leadership, ResignRequest};

/// Bound on one redis command.
const OP_TIMEOUT: Duration = Duration::from_secs(3);

/// Renews the key's expiry if this candidate still holds it: 1, else 0.
const RENEW: &str = r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0";

/// Deletes the key if this candidate still holds it.
const RELEASE: &str = r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

/// Writes the replication record (KEYS[2]) if this candidate holds the
/// leader key (KEYS[1]): 1, else 0.
const RECORD: &str = r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2])
  return 1
end
return 0";

/// Counts a win (increments the term counter KEYS[2]) if this candidate
/// still holds the leader key (KEYS[1]): the new term, else 0. So the
/// counter never runs past the term of the key's holder, and a lookup
/// reading both at once never finds a term above its leader's.
const COUNT: &str = r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('INCR', KEYS[2])
end
return 0";

/// The leader key of a cluster. Braces are dropped from the id so that the
/// hash tag stays well-formed.
pub fn leader_key(cluster_id: &str) -> String {
    let tag: String = cluster_id
        .chars()
        .filter(|c| *c != '{' && *c != '}')
        .collect();
    format!("mooncake-store/{{{tag}}}/leader")
}

#[derive(Clone)]
pub struct RedisElection {
    shared: Arc<Shared>,
}

struct Shared {
    addr: String,
    client: Client,
    conn: Mutex<Option<MultiplexedConnection>>,
    key: String,
    /// Counts leaders: each winner's term.
    term_key: String,
    /// The replication record.
    record_key: String,
    ttl: Duration,
}

impl RedisElection {
    /// Connects to redis at `addr` (`host:port`, with or without
    /// `redis://`), credentials from the environment, for the election of
    /// `cluster_id` with keys expiring after `ttl` unless renewed.
    pub async fn connect(addr: &str, cluster_id: &str, ttl: Duration) -> Result<RedisElection> {
        RedisElection::connect_with(
            addr,
            &RedisOptions::from_env().map_err(redis_code)?,
            cluster_id,
            ttl,
        )
        .await
    }

    pub async fn connect_with(
        addr: &str,
        options: &RedisOptions,
        cluster_id: &str,
        ttl: Duration,
    ) -> Result<RedisElection> {
        let info = connection_info(addr, options).map_err(redis_code)?;
        let client = Client::open(info).map_err(|e| op_error(addr, "open", e))?;
        let shared = Shared {
            addr: addr.to_string(),
            client,
            conn: Mutex::new(None),
            key: leader_key(cluster_id),
            term_key: format!("{}-term", leader_key(cluster_id)),
            record_key: format!("{}-in-sync", leader_key(cluster_id)),
            ttl: ttl.max(Duration::from_millis(100)),
        };
        let election = RedisElection {
            shared: Arc::new(shared),
        };
        // A command, not just a connection: a missing or wrong password
        // only shows on the first one.
        let _: String = election
            .shared
            .run("PING", |mut c, _| async move {
                ::redis::cmd("PING").query_async(&mut c).await
            })
            .await?;
        Ok(election)
    }

    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// How often candidates retry and observers look.
    fn poll_every(&self) -> Duration {
        (self.shared.ttl / 5).clamp(Duration::from_millis(20), Duration::from_secs(1))
    }

    async fn campaign_as(&self, candidate: &str) -> Result<Leadership> {
        let s = &self.shared;
        let ttl_ms = s.ttl.as_millis() as u64;
        loop {
            let asked = loop {
                // The key expires `ttl` after redis sets it: at the latest from here.
                let asked = Instant::now();
                let won: Option<String> = s
                    .run("SET NX", |mut c, key| {
                        let value = candidate.to_string();
                        async move {
                            ::redis::cmd("SET")
                                .arg(key)
                                .arg(value)
                                .arg("NX")
                                .arg("PX")
                                .arg(ttl_ms)
                                .query_async(&mut c)
                                .await
                        }
                    })
                    .await?;
                if won.is_some() {
                    break asked;
                }
                tokio::time::sleep(self.poll_every()).await;
            };
            let (lost_tx, lost_rx) = watch::channel(false);
            let (resign_tx, resign_rx) = oneshot::channel::<ResignRequest>();
            let held = HeldUntil::until((asked + s.ttl * 2 / 3).into_std());
            tokio::spawn(hold(
                self.shared.clone(),
                candidate.to_string(),
                asked,
                held.clone(),
                lost_tx,
                resign_rx,
            ));
            let leadership =
                Leadership::new(candidate.to_string(), lost_rx, resign_tx).with_held(held);
            // Counted after the win, while the key is still ours: a winner's
            // term exceeds every earlier one.
            let script = Script::new(COUNT);
            let mut invocation = script.key(&s.key);
            invocation.key(&s.term_key).arg(candidate);
            let term: u64 = s
                .run("count term", |mut c, _| async move {
                    invocation.invoke_async(&mut c).await
                })
                .await?;
            if term == 0 {
                // The key expired between the win and the count (a process or
                // host stalled for a whole TTL): this was no win. Its renewals
                // stop, and their release is awaited so that it cannot delete
                // the key of the next win (it holds the same value).
                tracing::warn!(candidate, key = %s.key, "leader key expired before the term was counted; campaigning again");
                let _ = leadership.resign().await;
                continue;
            }
            tracing::info!(candidate, key = %s.key, term, "won leader election");
            return Ok(leadership.with_term(term, Vec::new()));
        }
    }

    async fn follow(self, tx: watch::Sender<Option<String>>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.poll_every()) => {}
                _ = tx.closed() => return,
            }
            match self.shared.leader().await {
                Ok(leader) => {
                    tx.send_if_modified(|cur| {
                        let changed = *cur != leader;
                        *cur = leader;
                        changed
                    });
                }
                Err(e) => tracing::debug!("leader poll on {}: {e}", self.shared.key),
            }
        }
    }
}

impl RedisElection {
    async fn write_record(&self, leadership: &Leadership, record: &str) -> Result<()> {
        let s = &self.shared;
        let script = Script::new(RECORD);
        let mut invocation = script.key(&s.key);
        invocation
            .key(&s.record_key)
            .arg(leadership.candidate())
            .arg(record);
        let acted: i64 = s
            .run("record", |mut c, _| async move {
                invocation.invoke_async(&mut c).await
            })
            .await?;
        if acted != 1 {
            return Err(Error::new(
                ErrorCode::ETCD_OPERATION_ERROR,
                "redis record: this master no longer leads",
            ));
        }
        Ok(())
    }
}

impl LeaderElection for RedisElection {
    fn campaign<'a>(&'a self, candidate: &'a str) -> BoxFuture<'a, Result<Leadership>> {
        Box::pin(self.campaign_as(candidate))
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<String>>> {
        Box::pin(self.shared.leader())
    }

    fn leader_with_term(&self) -> BoxFuture<'_, Result<Option<Leader>>> {
        Box::pin(self.shared.leader_with_term())
    }

    fn observe(&self) -> BoxFuture<'_, Result<watch::Receiver<Option<String>>>> {
        Box::pin(async move {
            let (tx, rx) = watch::channel(self.shared.leader().await?);
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
        Box::pin(async move {
            let key = self.shared.record_key.clone();
            self.shared
                .run("GET record", |mut c, _| async move {
                    ::redis::cmd("GET").arg(key).query_async(&mut c).await
                })
                .await
        })
    }

    fn depose<'a>(&'a self, leader: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let release = Script::new(RELEASE);
            self.shared.script("depose", &release, leader, None).await
        })
    }
}

impl Shared {
    async fn connection(&self) -> Result<MultiplexedConnection> {
        if let Some(c) = self.conn.lock().clone() {
            return Ok(c);
        }
        let conn = match tokio::time::timeout(
            CONNECT_TIMEOUT,
            self.client.get_multiplexed_tokio_connection(),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(op_error(&self.addr, "connect", e)),
            Err(_) => return Err(timeout_error(&self.addr, "connect")),
        };
        *self.conn.lock() = Some(conn.clone());
        Ok(conn)
    }

    /// Runs one command under [`OP_TIMEOUT`]; a broken connection is
    /// dropped so the next command reconnects.
    async fn run<T, F, Fut>(&self, what: &str, op: F) -> Result<T>
    where
        F: FnOnce(MultiplexedConnection, String) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, RedisError>>,
    {
        let conn = self.connection().await?;
        match tokio::time::timeout(OP_TIMEOUT, op(conn, self.key.clone())).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_unrecoverable_error()
                    || e.is_timeout()
                {
                    self.conn.lock().take();
                }
                Err(op_error(&self.addr, what, e))
            }
            Err(_) => {
                self.conn.lock().take();
                Err(timeout_error(&self.addr, what))
            }
        }
    }

    async fn leader(&self) -> Result<Option<String>> {
        self.run("GET", |mut c, key| async move {
            ::redis::cmd("GET").arg(key).query_async(&mut c).await
        })
        .await
    }

    /// The leader key and the term counter, read at once (`MGET`).
    async fn leader_with_term(&self) -> Result<Option<Leader>> {
        let term_key = self.term_key.clone();
        let (leader, term): (Option<String>, Option<u64>) = self
            .run("MGET", |mut c, key| async move {
                ::redis::cmd("MGET")
                    .arg(key)
                    .arg(term_key)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok(leader.map(|address| Leader {
            address,
            term: term.unwrap_or(0),
        }))
    }

    /// Runs a compare-and-act script for `candidate`: whether it acted.
    async fn script(
        &self,
        what: &str,
        script: &Script,
        candidate: &str,
        arg: Option<u64>,
    ) -> Result<bool> {
        let mut invocation = script.key(&self.key);
        invocation.arg(candidate);
        if let Some(a) = arg {
            invocation.arg(a);
        }
        let acted: i64 = self
            .run(what, |mut c, _| async move {
                invocation.invoke_async(&mut c).await
            })
            .await?;
        Ok(acted == 1)
    }
}

/// The holder task: renews every `ttl / 3`, flags `lost` when the key is
/// gone or someone else's, or when no renewal got through for 2/3 of the
/// TTL; deletes the key (if still ours) on resign or when the
/// [`Leadership`] is dropped. `won` is when the winning `SET` was sent.
///
/// A renewal that hangs (redis cut off without a reset) is given up at that
/// 2/3 mark, not waited for: the mark is a deadline, checked on the clock.
async fn hold(
    s: Arc<Shared>,
    candidate: String,
    won: Instant,
    held: HeldUntil,
    lost: watch::Sender<bool>,
    mut resign: oneshot::Receiver<ResignRequest>,
) {
    let (renew, release) = (Script::new(RENEW), Script::new(RELEASE));
    let every = s.ttl / 3;
    let grace = s.ttl * 2 / 3;
    let ttl_ms = s.ttl.as_millis() as u64;
    let mut renewed_at = won;
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let reply = loop {
        tokio::select! {
            r = &mut resign => break r.ok(),
            _ = tick.tick() => {
                let sent = Instant::now();
                let renewal = s.script("renew", &renew, &candidate, Some(ttl_ms));
                match tokio::time::timeout_at(renewed_at + grace, renewal).await {
                    Ok(Ok(true)) => {
                        renewed_at = sent;
                        held.extend_to((sent + grace).into_std());
                    }
                    Ok(Ok(false)) => {
                        tracing::warn!(key = %s.key, "leader key expired or taken over");
                        break None;
                    }
                    Ok(Err(e)) => tracing::debug!("leader renewal failed: {e}"),
                    Err(_) => {
                        // Hung: the connection may be dead; start a new one.
                        s.conn.lock().take();
                    }
                }
                if Instant::now() >= renewed_at + grace {
                    tracing::warn!(key = %s.key, "redis unreachable for too long; giving leadership up");
                    break None;
                }
            }
        }
    };
    held.end();
    lost.send_replace(true);
    let released = s
        .script("release", &release, &candidate, None)
        .await
        .map(drop);
    if let Some(reply) = reply {
        let _ = reply.send(released);
    }
}

/// Address and option errors from the metadata layer carry ERR_METADATA;
/// here they are coordination-service errors.
fn redis_code(e: Error) -> Error {
    Error::new(ErrorCode::ETCD_OPERATION_ERROR, e.context)
}

fn op_error(addr: &str, what: &str, e: RedisError) -> Error {
    Error::new(
        ErrorCode::ETCD_OPERATION_ERROR,
        format!("redis {addr} {what}: {e}"),
    )
}

fn timeout_error(addr: &str, what: &str) -> Error {
    Error::new(
        ErrorCode::ETCD_OPERATION_ERROR,
        format!("redis {addr} {what}: no answer"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_hash_tagged_per_cluster() {
        assert_eq!(leader_key("prod"), "mooncake-store/{prod}/leader");
        assert_eq!(leader_key("a{b}c"), "mooncake-store/{abc}/leader");
    }

    #[tokio::test]
    async fn unreachable_redis_fails_fast() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let e = RedisElection::connect_with(
            &addr,
            &RedisOptions::default(),
            "c",
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(e.err().unwrap().code, ErrorCode::ETCD_OPERATION_ERROR);
    }
}
