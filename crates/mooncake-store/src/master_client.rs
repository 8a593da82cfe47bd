//! Blocking client for the master's RPC service.
//!
//! Calls run on the caller's thread over pooled long-lived TCP connections
//! (see `crate::rpc`): one request frame out, one response frame back, no
//! thread hops. A batch call is one round trip. Transport failures are
//! `RPC_FAIL`.

use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use mooncake_common::auth::ClusterToken;
use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;

use crate::ha;
use crate::proto::frame::{decode_payload, encode_frame};
use crate::proto::{Request, Response};
use crate::rpc::{self, connect_any, rpc_fail, ClientOptions, Connection, Connector, Pool};
use crate::types::{
    ClientId, GetReplicaListResponse, ReplicaDesc, SegmentInfo, TaskAssignment, TaskId, TaskInfo,
    WriteOptions,
};

mod election;
mod term;
mod tier;

use election::Election;
use term::Terms;

/// Connections kept idle per client; more can be open while calls run.
const MAX_IDLE_CONNECTIONS: usize = 32;
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Read buffer per pooled connection: most answers arrive in one read.
const READ_BUFFER: usize = 16 << 10;
/// The HA cluster a client follows unless told otherwise (the reference's
/// default `MC_STORE_CLUSTER_ID`).
pub const DEFAULT_CLUSTER_ID: &str = "mooncake_cluster";

/// Told of every call a [`MasterClient`] makes (the store client's metrics
/// implement it).
pub(crate) trait RpcObserver: Send + Sync {
    /// One call, `rpc` being the request's name, answered after `took`.
    fn observe_rpc(&self, rpc: &'static str, took: Duration);
}

/// The socket policy of a master client's connections.
pub fn client_options(connect_timeout: Duration, call_timeout: Duration) -> ClientOptions {
    ClientOptions {
        connect_timeout,
        call_timeout,
        max_idle: MAX_IDLE_CONNECTIONS,
        read_buffer: READ_BUFFER,
        poll: rpc::poll::client_window(),
        // The master did not answer (gone dark, or gone): the idle
        // connections lead to it too. Later calls connect anew (and an
        // HA client looks the leader up if that fails).
        drop_idle_on_failure: true,
    }
}

/// A handle to the master; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct MasterClient {
    pool: Arc<Pool<MasterAddr>>,
    /// Times every call, once a store client's metrics are attached.
    rpc_metrics: Arc<OnceLock<Arc<dyn RpcObserver>>>,
}

impl MasterClient {
    /// Connects to the master at `"host:port"` (one connection is opened now,
    /// so an unreachable master fails here with `RPC_FAIL`).
    /// An HA address (`etcd://…`, `redis://…`, `k8s://<namespace>/<lease>`)
    /// follows the leader of [`DEFAULT_CLUSTER_ID`] (a Lease names its
    /// election by itself).
    pub fn connect(master_addr: &str) -> Result<MasterClient> {
        Self::connect_in_cluster(master_addr, DEFAULT_CLUSTER_ID)
    }

    /// Like [`connect`](Self::connect); an HA address follows the leader of
    /// `cluster_id`.
    pub fn connect_in_cluster(master_addr: &str, cluster_id: &str) -> Result<MasterClient> {
        Self::connect_with(
            master_addr,
            cluster_id,
            DEFAULT_CONNECT_TIMEOUT,
            DEFAULT_CALL_TIMEOUT,
            None,
        )
    }

    /// Like [`connect`](Self::connect), with explicit connect and per-call timeouts.
    pub fn connect_with_timeouts(
        master_addr: &str,
        connect_timeout: Duration,
        call_timeout: Duration,
    ) -> Result<MasterClient> {
        Self::connect_with(
            master_addr,
            DEFAULT_CLUSTER_ID,
            connect_timeout,
            call_timeout,
            None,
        )
    }

    /// Like [`connect_in_cluster`](Self::connect_in_cluster), presenting
    /// `token` as the cluster token (`None`: `$MOONCAKE_CLUSTER_TOKEN`, if
    /// set). `$MOONCAKE_ADMIN_TOKEN`, if set, is presented too.
    pub fn connect_with_token(
        master_addr: &str,
        cluster_id: &str,
        token: Option<ClusterToken>,
    ) -> Result<MasterClient> {
        Self::connect_with(
            master_addr,
            cluster_id,
            DEFAULT_CONNECT_TIMEOUT,
            DEFAULT_CALL_TIMEOUT,
            token,
        )
    }

    /// Like [`connect_with_token`](Self::connect_with_token), for the
    /// objects of `tenant` (a master in multi-tenant mode scopes this
    /// client's object calls to it; `default` states nothing, so any
    /// master takes it).
    pub fn connect_as(
        master_addr: &str,
        cluster_id: &str,
        token: Option<ClusterToken>,
        tenant: &str,
    ) -> Result<MasterClient> {
        Self::connect_tenant(
            master_addr,
            cluster_id,
            DEFAULT_CONNECT_TIMEOUT,
            DEFAULT_CALL_TIMEOUT,
            token,
            tenant,
        )
    }

    fn connect_with(
        master_addr: &str,
        cluster_id: &str,
        connect_timeout: Duration,
        call_timeout: Duration,
        token: Option<ClusterToken>,
    ) -> Result<MasterClient> {
        Self::connect_tenant(
            master_addr,
            cluster_id,
            connect_timeout,
            call_timeout,
            token,
            crate::tenant::DEFAULT_TENANT,
        )
    }

    fn connect_tenant(
        master_addr: &str,
        cluster_id: &str,
        connect_timeout: Duration,
        call_timeout: Duration,
        token: Option<ClusterToken>,
        tenant: &str,
    ) -> Result<MasterClient> {
        // HA: `etcd://h1:p1;h2:p2` (or `redis://h:p`, `k8s://ns/lease`)
        // names the coordination service; the master is whoever leads the
        // cluster there.
        let election = if ["etcd://", "redis://", "k8s://"]
            .iter()
            .any(|scheme| master_addr.starts_with(scheme))
        {
            Some(Election::new(
                ha::ElectionBackend::parse(master_addr, false)?,
                cluster_id.to_owned(),
            ))
        } else {
            None
        };
        let resolved = match &election {
            Some(e) => e.look_up(connect_timeout)?,
            None => rpc::resolve(master_addr, "master")?,
        };
        let target = MasterAddr {
            addr: master_addr.to_string(),
            tokens: credentials(token)?,
            tenant: Some(crate::tenant::normalize(tenant))
                .filter(|t| *t != crate::tenant::DEFAULT_TENANT)
                .map(str::to_owned),
            resolved: Mutex::new(resolved),
            election,
        };
        let pool = Pool::new(target, client_options(connect_timeout, call_timeout));
        let conn = open_first(&pool, connect_timeout)?;
        pool.put_idle(conn);
        Ok(MasterClient {
            pool: Arc::new(pool),
            rpc_metrics: Arc::default(),
        })
    }

    /// The address this client talks to.
    pub fn address(&self) -> &str {
        &self.pool.connector().addr
    }

    /// HA: the highest election term this client has found its leader
    /// under; its connections state it, and a master leading another
    /// term refuses their calls. `None` for a master given by address.
    pub fn term(&self) -> Option<u64> {
        self.pool.connector().election.as_ref()?.terms.highest()
    }

    /// Heartbeat: the master marks the client alive. `CLIENT_NOT_FOUND` means
    /// the master did not know this client (first contact, or it expired or
    /// the master restarted): it is registered now, and the caller should
    /// mount its segments again.
    pub fn ping(&self, client_id: ClientId) -> Result<()> {
        unit(self.call(&Request::Ping { client_id })?)
    }

    pub fn mount_segment(&self, client_id: ClientId, seg: &SegmentInfo) -> Result<()> {
        unit(self.call(&Request::MountSegment {
            client_id,
            segment: seg.clone(),
        })?)
    }

    pub fn unmount_segment(&self, client_id: ClientId, segment_name: &str) -> Result<()> {
        unit(self.call(&Request::UnmountSegment {
            client_id,
            name: segment_name,
        })?)
    }

    /// Allocates space for a new object (with `opts.upsert`, for the new
    /// value of an existing one); write every replica, then `put_end`.
    pub fn put_start(
        &self,
        client_id: ClientId,
        key: &str,
        value_len: u64,
        opts: &WriteOptions,
    ) -> Result<Vec<ReplicaDesc>> {
        let req = Request::PutStart {
            client_id,
            key,
            value_len,
            config: opts.config.clone(),
            upsert: opts.upsert,
        };
        match self.call(&req)? {
            Response::Replicas { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    pub fn put_end(&self, client_id: ClientId, key: &str) -> Result<()> {
        unit(self.call(&Request::PutEnd { client_id, key })?)
    }

    pub fn put_revoke(&self, client_id: ClientId, key: &str) -> Result<()> {
        unit(self.call(&Request::PutRevoke { client_id, key })?)
    }

    /// [`put_start`](Self::put_start) for many keys in one round trip.
    pub fn batch_put_start(
        &self,
        client_id: ClientId,
        keys: &[String],
        value_lens: &[u64],
        opts: &WriteOptions,
    ) -> Result<Vec<Result<Vec<ReplicaDesc>>>> {
        if keys.len() != value_lens.len() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("{} keys but {} value lengths", keys.len(), value_lens.len()),
            ));
        }
        let req = Request::BatchPutStart {
            client_id,
            keys: strs(keys),
            value_lens: value_lens.to_vec(),
            config: opts.config.clone(),
            upsert: opts.upsert,
        };
        match self.call(&req)? {
            Response::BatchReplicas { results } => same_len(results, keys.len()),
            other => Err(unexpected(&other)),
        }
    }

    pub fn batch_put_end(&self, client_id: ClientId, keys: &[String]) -> Result<Vec<Result<()>>> {
        units(
            self.call(&Request::BatchPutEnd {
                client_id,
                keys: strs(keys),
            })?,
            keys.len(),
        )
    }

    pub fn batch_put_revoke(
        &self,
        client_id: ClientId,
        keys: &[String],
    ) -> Result<Vec<Result<()>>> {
        units(
            self.call(&Request::BatchPutRevoke {
                client_id,
                keys: strs(keys),
            })?,
            keys.len(),
        )
    }

    /// Where the object's complete replicas are; grants the read lease.
    pub fn get_replica_list(&self, key: &str) -> Result<GetReplicaListResponse> {
        match self.call(&Request::GetReplicaList { key })? {
            Response::ReplicaList { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    pub fn batch_get_replica_list(
        &self,
        keys: &[String],
    ) -> Result<Vec<Result<GetReplicaListResponse>>> {
        match self.call(&Request::BatchGetReplicaList { keys: strs(keys) })? {
            Response::BatchReplicaList { results } => same_len(results, keys.len()),
            other => Err(unexpected(&other)),
        }
    }

    /// Whether a complete object exists under `key` (a put in flight does not count).
    pub fn exist_key(&self, key: &str) -> Result<bool> {
        match self.call(&Request::ExistKey { key })? {
            Response::Bool { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    pub fn batch_exist_key(&self, keys: &[String]) -> Result<Vec<Result<bool>>> {
        match self.call(&Request::BatchExistKey { keys: strs(keys) })? {
            Response::Bools { results } => same_len(results, keys.len()),
            other => Err(unexpected(&other)),
        }
    }

    /// Size in bytes of a complete object (no lease is granted).
    pub fn get_size(&self, key: &str) -> Result<u64> {
        count(self.call(&Request::GetSize { key })?)
    }

    pub fn remove(&self, key: &str, force: bool) -> Result<()> {
        unit(self.call(&Request::Remove { key, force })?)
    }

    pub fn batch_remove(&self, keys: &[String], force: bool) -> Result<Vec<Result<()>>> {
        units(
            self.call(&Request::BatchRemove {
                keys: strs(keys),
                force,
            })?,
            keys.len(),
        )
    }

    /// Removes every complete object whose key matches `pattern`; returns the count removed.
    pub fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64> {
        count(self.call(&Request::RemoveByRegex { pattern, force })?)
    }

    /// Removes every complete object (leased ones only with `force`); returns the count removed.
    pub fn remove_all(&self, force: bool) -> Result<u64> {
        count(self.call(&Request::RemoveAll { force })?)
    }

    /// Drops the replicas on `segment_name` (all replicas when empty) of those
    /// `keys` whose lease has expired; returns the keys cleared.
    pub fn batch_replica_clear(
        &self,
        client_id: ClientId,
        keys: &[String],
        segment_name: &str,
    ) -> Result<Vec<String>> {
        let req = Request::BatchReplicaClear {
            client_id,
            keys: strs(keys),
            segment_name,
        };
        match self.call(&req)? {
            Response::Keys { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    /// Queues a copy of `key` onto each of `targets` (segment names); returns the task id.
    pub fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<TaskId> {
        task_id(self.call(&Request::CreateCopyTask {
            key,
            targets: strs(targets),
        })?)
    }

    /// Queues a move of `key`'s replica on `source` to `target`; returns the task id.
    pub fn create_move_task(&self, key: &str, source: &str, target: &str) -> Result<TaskId> {
        task_id(self.call(&Request::CreateMoveTask {
            key,
            source,
            target,
        })?)
    }

    /// A task's state (`TASK_NOT_FOUND` for unknown or long-finished ids).
    pub fn query_task(&self, id: TaskId) -> Result<TaskInfo> {
        match self.call(&Request::QueryTask { id })? {
            Response::TaskState { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    /// Executor side: up to `max` tasks assigned to this client (now Processing).
    pub fn fetch_tasks(&self, client_id: ClientId, max: u32) -> Result<Vec<TaskAssignment>> {
        match self.call(&Request::FetchTasks { client_id, max })? {
            Response::Tasks { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    /// Executor side: reports a fetched task's outcome.
    pub fn mark_task_complete(
        &self,
        client_id: ClientId,
        id: TaskId,
        success: bool,
        message: &str,
    ) -> Result<()> {
        unit(self.call(&Request::MarkTaskComplete {
            client_id,
            id,
            success,
            message,
        })?)
    }

    /// Executor side: allocates the new replicas of `key` on `targets` (a move
    /// when `source` is not empty). Write them, then `replica_transfer_end`.
    /// An empty answer means every target already holds a replica.
    pub fn replica_transfer_start(
        &self,
        client_id: ClientId,
        key: &str,
        source: &str,
        targets: &[String],
    ) -> Result<Vec<ReplicaDesc>> {
        let req = Request::ReplicaTransferStart {
            client_id,
            key,
            source,
            targets: strs(targets),
        };
        match self.call(&req)? {
            Response::Replicas { result } => result,
            other => Err(unexpected(&other)),
        }
    }

    /// The new replicas are written: they join the object (a move drops its source).
    pub fn replica_transfer_end(&self, client_id: ClientId, key: &str) -> Result<()> {
        unit(self.call(&Request::ReplicaTransferEnd { client_id, key })?)
    }

    /// Abandons a transfer; its new replicas are freed.
    pub fn replica_transfer_revoke(&self, client_id: ClientId, key: &str) -> Result<()> {
        unit(self.call(&Request::ReplicaTransferRevoke { client_id, key })?)
    }

    /// Sends one request and waits for its answer (see [`rpc::client`]).
    /// Reports every later call (and its clones') to `observer`.
    pub(crate) fn observe_rpcs(&self, observer: Arc<dyn RpcObserver>) {
        let _ = self.rpc_metrics.set(observer);
    }

    fn call(&self, req: &Request<'_>) -> Result<Response> {
        let started = Instant::now();
        let resp = self.call_unmetered(req);
        if let Some(m) = self.rpc_metrics.get() {
            m.observe_rpc(req.name(), started.elapsed());
        }
        resp
    }

    fn call_unmetered(&self, req: &Request<'_>) -> Result<Response> {
        let mut frame = Vec::with_capacity(64);
        encode_frame(req, &mut frame)
            .map_err(|e| Error::new(ErrorCode::INVALID_PARAMS, e.to_string()))?;
        let resp = self.pool.call(&frame, |payload| {
            decode_payload::<Response>(payload)
                .map_err(|e| rpc_fail(format!("bad answer from master: {e}")))
        })?;
        match resp {
            Response::Failed { error } => {
                if error.code == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS {
                    self.not_leading();
                }
                Err(error)
            }
            resp => Ok(resp),
        }
    }

    /// A master refused a call as not leading (deposed, past its lease,
    /// under another term): in HA mode the next call looks the leader up
    /// afresh, on a new connection, rather than go back to it.
    fn not_leading(&self) {
        let addr = self.pool.connector();
        if let Some(election) = &addr.election {
            election.forget();
            addr.resolved.lock().clear();
            self.pool.drop_idle();
        }
    }
}

/// How often the first connection to an HA master is tried again.
const FIRST_CONNECT_RETRY: Duration = Duration::from_millis(100);

/// The first connection. In HA mode the leader the election names may not
/// listen yet (it won a moment ago) or any more (it just died, and its
/// lease has not run out): until `wait` is over, that is tried again, each
/// time after a fresh lookup.
fn open_first(pool: &Pool<MasterAddr>, wait: Duration) -> Result<Connection> {
    let deadline = Instant::now() + wait;
    let ha = pool.connector().election.is_some();
    loop {
        match pool.open() {
            // Refused: that master leads another term than the lookup found
            // (it was replaced, or won a moment ago).
            Err(e)
                if ha
                    && matches!(
                        e.code,
                        ErrorCode::RPC_FAIL | ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
                    )
                    && Instant::now() + FIRST_CONNECT_RETRY < deadline =>
            {
                std::thread::sleep(FIRST_CONNECT_RETRY)
            }
            opened => return opened,
        }
    }
}

/// The tokens a client presents: `token` or `$MOONCAKE_CLUSTER_TOKEN`,
/// then `$MOONCAKE_ADMIN_TOKEN`.
fn credentials(token: Option<ClusterToken>) -> Result<Vec<ClusterToken>> {
    let cluster = match token {
        Some(t) => Some(t),
        None => ClusterToken::from_env()?,
    };
    let admin = match std::env::var(mooncake_common::auth::ADMIN_TOKEN_ENV) {
        Ok(v) if !v.trim().is_empty() => Some(ClusterToken::new(&v)?),
        _ => None,
    };
    Ok(cluster.into_iter().chain(admin).collect())
}

/// Presents `token` on a new connection to a master (`Authenticate`); a
/// refusal is the master's `ILLEGAL_CLIENT`.
pub(crate) fn authenticate(conn: &mut Connection, token: &ClusterToken) -> Result<()> {
    let req = Request::Authenticate {
        token: token.as_str(),
    };
    handshake_call(conn, &req, "authenticating to master")
}

/// One call of a connection's handshake, answered `Unit`.
fn handshake_call(conn: &mut Connection, req: &Request<'_>, what: &str) -> Result<()> {
    let mut frame = Vec::with_capacity(64);
    encode_frame(req, &mut frame)
        .map_err(|e| Error::new(ErrorCode::INVALID_PARAMS, e.to_string()))?;
    let payload = conn
        .round_trip(&frame, Duration::ZERO)
        .map_err(|e| rpc_fail(format!("{what}: {e}")))?;
    match decode_payload::<Response>(payload)
        .map_err(|e| rpc_fail(format!("bad answer from master: {e}")))?
    {
        Response::Unit { result } => result,
        Response::Failed { error } => Err(error),
        other => Err(unexpected(&other)),
    }
}

/// The master: where it is, and in HA mode how to find it again.
struct MasterAddr {
    addr: String,
    /// Presented on every new connection, in order (the cluster token,
    /// then the admin token).
    tokens: Vec<ClusterToken>,
    /// The tenant stated on every new connection (none: `default`).
    tenant: Option<String>,
    /// The master's socket addresses; in HA mode the current leader's.
    resolved: Mutex<Vec<SocketAddr>>,
    /// HA mode: where to look the leader up when it cannot be reached.
    election: Option<Election>,
}

impl MasterAddr {
    fn connect_to(&self, addrs: &[SocketAddr], timeout: Duration) -> Result<TcpStream> {
        connect_any(addrs, timeout)
            .map_err(|e| rpc_fail(format!("cannot connect to master {}: {e}", self.addr)))
    }
}

impl Connector for MasterAddr {
    fn peer(&self) -> String {
        format!("master {}", self.addr)
    }

    /// Connects to the master; in HA mode, when the known leader cannot be
    /// reached, looks the leader up again and tries that.
    fn connect(&self, timeout: Duration) -> Result<TcpStream> {
        let known = self.resolved.lock().clone();
        let e = match self.connect_to(&known, timeout) {
            Ok(stream) => return Ok(stream),
            Err(e) => e,
        };
        let Some(election) = &self.election else {
            return Err(e);
        };
        let leader = election.leader(timeout, &known)?;
        if leader == known {
            return Err(e); // still the one that just failed
        }
        let stream = self.connect_to(&leader, timeout)?;
        *self.resolved.lock() = leader;
        Ok(stream)
    }

    /// Presents the tokens; in HA mode then states the highest term seen
    /// (`LeaderTerm`). A master that refuses the term leads another one:
    /// the next connection looks the leader up again rather than go back
    /// to it (a lookup naming it again with an older term than this
    /// client has seen is refused: [`Terms::learn`]).
    fn handshake(&self, conn: &mut Connection) -> Result<()> {
        self.tokens.iter().try_for_each(|t| authenticate(conn, t))?;
        if let Some(tenant_id) = &self.tenant {
            let req = Request::Tenant { tenant_id };
            handshake_call(conn, &req, "stating the tenant")?;
        }
        let Some(election) = &self.election else {
            return Ok(());
        };
        conn.tag = election.terms.stamp();
        let Some(term) = Terms::term_of(conn.tag) else {
            return Ok(());
        };
        let stated = handshake_call(conn, &Request::LeaderTerm { term }, "stating the term");
        if let Err(e) = &stated {
            if e.code == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS {
                election.forget();
                self.resolved.lock().clear();
            }
        }
        stated
    }

    /// A pooled connection carries calls only while it states the highest
    /// term this client has seen.
    fn reusable(&self, conn: &Connection) -> bool {
        self.election
            .as_ref()
            .is_none_or(|e| e.terms.current(conn.tag))
    }
}

fn strs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

fn unexpected(resp: &Response) -> Error {
    rpc_fail(format!("unexpected answer {} from master", resp.name()))
}

fn unit(resp: Response) -> Result<()> {
    match resp {
        Response::Unit { result } => result,
        other => Err(unexpected(&other)),
    }
}

fn units(resp: Response, n: usize) -> Result<Vec<Result<()>>> {
    match resp {
        Response::Units { results } => same_len(results, n),
        other => Err(unexpected(&other)),
    }
}

fn task_id(resp: Response) -> Result<TaskId> {
    match resp {
        Response::Task { result } => result,
        other => Err(unexpected(&other)),
    }
}

fn count(resp: Response) -> Result<u64> {
    match resp {
        Response::Count { result } => result,
        other => Err(unexpected(&other)),
    }
}

fn same_len<T>(results: Vec<T>, n: usize) -> Result<Vec<T>> {
    if results.len() != n {
        return Err(rpc_fail(format!(
            "master answered {} results for {n} keys",
            results.len()
        )));
    }
    Ok(results)
}
