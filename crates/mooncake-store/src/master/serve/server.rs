//! A serving master: the listeners and tasks around
//! [`MasterService`](crate::master::state::service::MasterService).
//!
//! - RPC: the framed-RPC server loop (`crate::rpc::server`: one thread per
//!   long-lived client connection, blocking on its socket); each call is
//!   decoded and answered inline, since the state machine answers in
//!   microseconds.
//! - Timers: client expiry, put timeouts, delayed frees and eviction run
//!   every [`TICK_INTERVAL`].
//! - HTTP: metrics and admin queries on `metrics_port` (see [`super::http`]),
//!   and the transfer-engine metadata server when enabled.
//!
//! [`MasterServer::bind`] then [`MasterServer::serve`] run on the caller's
//! runtime. Whether to serve at all (HA) is decided by the caller: see
//! [`crate::master::run`].

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::metadata::http_server;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::access::Access;
use super::http;
use super::shared::{Leading, Shared};
use crate::master::config::MasterConfig;
use crate::master::replication::{Replication, Role};
use crate::master::state::mutation::Release;
use crate::master::state::service::Answer;
use crate::proto::{Request, Response};
use crate::rpc::{self, Handler, Server, ServerOptions, WhenFull};

/// How often the timers run.
pub(crate) const TICK_INTERVAL: Duration = Duration::from_millis(100);
/// Most client connections served at once; past it an idle client
/// connection is closed to make room, else new ones wait in the accept queue.
const MAX_CONNECTIONS: usize = 16 * 1024;
/// Read buffer per connection: a typical request arrives in one read.
const READ_BUFFER: usize = 64 * 1024;
/// Longest a request may take to arrive once its first byte has, and an
/// answer to be taken (`rpc_conn_timeout` when shorter).
const FRAME_TIMEOUT: Duration = Duration::from_secs(30);

fn bind_error(what: &str, addr: &str, port: u16, e: io::Error) -> Error {
    Error::new(
        ErrorCode::INTERNAL_ERROR,
        format!("cannot bind {what} on {addr}:{port}: {e}"),
    )
}

async fn bind(what: &str, host: &str, port: u16) -> Result<TcpListener> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    TcpListener::bind((host, port))
        .await
        .map_err(|e| bind_error(what, host, port, e))
}

/// A master whose listeners are bound but not yet served.
pub struct MasterServer {
    rpc: TcpListener,
    /// `None` when the HTTP service runs apart (HA with replication: it
    /// serves standbys too).
    http: Option<TcpListener>,
    http_addr: SocketAddr,
    metadata: Option<TcpListener>,
    shared: Arc<Shared>,
}

impl MasterServer {
    /// Binds the RPC, HTTP and (if enabled) metadata listeners. Port 0 picks a free port.
    pub async fn bind(config: MasterConfig) -> Result<MasterServer> {
        config.validate()?;
        let http = bind_http(&config).await?;
        let http_addr = http.local_addr().map_err(|e| {
            bind_error(
                "metrics service",
                &config.metrics_host,
                config.metrics_port,
                e,
            )
        })?;
        // The HTTP port answers (restore progress) while the state opens.
        let t = std::time::Instant::now();
        let shared = super::startup::open_while_serving(config, &http).await?;
        let opened = t.elapsed();
        let mut server = Self::bind_serving(Arc::new(shared), http_addr).await?;
        tracing::info!(
            open_ms = opened.as_millis() as u64,
            ms = t.elapsed().as_millis() as u64,
            "startup: state open, ports bound"
        );
        server.http = Some(http);
        Ok(server)
    }

    /// Binds the RPC and (if enabled) metadata listeners around `shared`,
    /// whose HTTP service runs apart at `http_addr`.
    pub(crate) async fn bind_serving(
        shared: Arc<Shared>,
        http_addr: SocketAddr,
    ) -> Result<MasterServer> {
        let config = &shared.config;
        let rpc = bind("RPC service", &config.rpc_address, config.rpc_listen_port()).await?;
        let metadata = if config.enable_http_metadata_server {
            Some(
                bind(
                    "HTTP metadata server",
                    &config.http_metadata_server_host,
                    config.http_metadata_server_port,
                )
                .await?,
            )
        } else {
            None
        };
        let live: std::sync::Weak<dyn crate::master::durable::snapshot::LiveState> =
            Arc::downgrade(&shared) as _;
        shared.durability.start_snapshots(live)?;
        Ok(MasterServer {
            rpc,
            http: None,
            http_addr,
            metadata,
            shared,
        })
    }

    pub fn rpc_addr(&self) -> SocketAddr {
        self.rpc
            .local_addr()
            .expect("bound listener has an address")
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn metadata_addr(&self) -> Option<SocketAddr> {
        self.metadata
            .as_ref()
            .map(|l| l.local_addr().expect("bound listener has an address"))
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Answers as leader of `term` only while `lease` holds (HA: the
    /// election's term and proven deadline, set once when this master
    /// starts leading, before it serves).
    pub(crate) fn lead(&self, term: u64, lease: crate::ha::HeldUntil) {
        let epoch_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.shared.service.kv_events_lead(epoch_ms);
        let _ = self.shared.leading.set(Leading { lease, term });
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets calls
    /// in flight finish and returns.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let self_http = self.http_addr;
        let MasterServer {
            rpc,
            http,
            metadata,
            shared,
            ..
        } = self;
        let config = &shared.config;
        tracing::info!(
            rpc = %rpc.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string()),
            http = %self_http,
            metadata = ?metadata.as_ref().and_then(|l| l.local_addr().ok()),
            lease_ttl = ?config.default_kv_lease_ttl,
            client_ttl = ?config.client_ttl,
            eviction_high_watermark_ratio = config.eviction_high_watermark_ratio,
            eviction_ratio = config.eviction_ratio,
            allocation_strategy = config.allocation_strategy.as_str(),
            "mooncake master serving"
        );
        for (name, value) in &config.unsupported {
            tracing::warn!("flag --{name}={value} is accepted but not supported yet; ignored");
        }
        let rpc = rpc
            .into_std()
            .and_then(|l| Server::start(l, Arc::new(Rpc(shared.clone())), rpc_options(config)))
            .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, format!("cannot serve RPC: {e}")))?;

        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let mut tasks = JoinSet::new();
        tasks.spawn(timer_loop(shared.clone(), stop_rx.clone()));
        if let Some(http) = http {
            tasks.spawn(serve_http(http, shared.clone(), stopped(stop_rx.clone())));
        }
        if let Some(listener) = metadata {
            let meta_stop = stopped(stop_rx.clone());
            let policy = metadata_policy(&shared);
            let store = shared.metadata.clone().unwrap_or_default();
            tasks.spawn(async move {
                if let Err(e) = http_server::serve_store(listener, store, policy, meta_stop).await {
                    tracing::error!("HTTP metadata server failed: {e}");
                }
            });
        }

        shutdown.await;
        tracing::info!("mooncake master stopping");
        let _ = stop_tx.send(true);
        let _ = tokio::task::spawn_blocking(move || rpc.stop()).await;
        while tasks.join_next().await.is_some() {}
        let s = shared.clone();
        let _ = tokio::task::spawn_blocking(move || s.durability.stop()).await;
        Ok(())
    }
}

/// Binds the HTTP service (`metrics_port`).
pub(crate) async fn bind_http(config: &MasterConfig) -> Result<TcpListener> {
    bind("metrics service", &config.metrics_host, config.metrics_port).await
}

/// Serves the HTTP service until `stop`.
pub(crate) async fn serve_http(
    listener: TcpListener,
    shared: Arc<Shared>,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    super::startup::serve_http_router(listener, http::router(shared), stop).await;
}

/// What the embedded metadata server accepts, from the master's flags.
fn metadata_policy(shared: &Shared) -> http_server::ServerPolicy {
    let config = &shared.config;
    http_server::ServerPolicy {
        max_value_size: usize::try_from(config.http_metadata_server_max_value_size)
            .unwrap_or(usize::MAX),
        max_keys: config.http_metadata_server_max_keys,
        cluster_token: shared.access.credential().cloned(),
    }
}

/// The master's RPC listener policy, from its flags.
pub fn rpc_options(config: &MasterConfig) -> ServerOptions {
    ServerOptions {
        name: "mc-master-rpc",
        max_connections: MAX_CONNECTIONS,
        when_full: WhenFull::Wait,
        idle_timeout: config.rpc_conn_timeout,
        frame_timeout: FRAME_TIMEOUT,
        nodelay: config.rpc_enable_tcp_no_delay,
        read_buffer: READ_BUFFER,
        // A client that just got an answer often calls again soon.
        poll: rpc::poll::server_window(),
        stack_size: Some(rpc::server::CONNECTION_STACK),
    }
}

/// The master protocol on the RPC server loop.
struct Rpc(Arc<Shared>);

/// A connection a standby pulls on: when it closes, the leader counts the
/// standby as silent at once.
struct Session {
    standby: Option<(Arc<Replication>, String)>,
    /// What the connection has proven (`super::access`).
    access: Access,
    /// The election term the connection stated (`LeaderTerm`); its calls
    /// are answered only while this master leads that term.
    term: Option<u64>,
    /// The tenant the connection stated (`Tenant`).
    tenant: String,
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some((r, id)) = self.standby.take() {
            r.standby_gone(&id);
        }
    }
}

impl Handler for Rpc {
    type Request<'a> = Request<'a>;
    type Response = Response;
    type Session = Session;
    const OVERSIZED_ANSWER: ErrorCode = ErrorCode::INVALID_PARAMS;

    fn session(&self, _: &rpc::Peer) -> Session {
        Session {
            standby: None,
            access: self.0.access.initial(),
            term: None,
            tenant: crate::tenant::DEFAULT_TENANT.to_string(),
        }
    }

    /// When the master is full, a client connection idle between calls
    /// may be closed to make room (the client's pool reconnects); a
    /// standby's is kept.
    fn evictable(&self, session: &Session) -> bool {
        session.standby.is_none()
    }

    /// Answers one request on the calling (connection) thread. With
    /// replication, a call that changed state is answered once its
    /// entries are committed.
    fn handle(&self, session: &mut Session, req: Request<'_>) -> Response {
        let shared = &*self.0;
        if let Request::Authenticate { token } = req {
            let result = shared.access.authenticate(session.access, token);
            return Response::Unit {
                result: result.map(|a| session.access = a),
            };
        }
        if let Err(error) = shared.access.check(session.access, &req) {
            return Response::Failed { error };
        }
        if let Request::Tenant { tenant_id } = req {
            session.tenant = crate::tenant::normalize(tenant_id).to_string();
            return Response::Unit { result: Ok(()) };
        }
        if let (Request::MountSegment { segment, .. }, Some(store)) = (&req, &shared.metadata) {
            if let Err(error) = super::published::check_mount(store, segment) {
                return Response::Unit { result: Err(error) };
            }
        }
        let now = shared.clock.now_ms();
        if let (
            Some(r),
            Request::ReplicationPull {
                standby,
                after,
                after_term,
                applied,
                max,
                wait_ms,
            },
        ) = (&shared.replication, &req)
        {
            if session.standby.is_none() {
                session.standby = Some((r.clone(), standby.to_string()));
            }
            let wait = Duration::from_millis(u64::from(*wait_ms));
            return r.serve_pull(standby, *after, *after_term, *applied, *max, wait, now);
        }
        if let (Some(r), Request::SnapshotFetch { seq, offset, .. }) = (&shared.replication, &req) {
            if r.role() != Role::Leader {
                return not_leading("this master no longer leads its cluster");
            }
            return r.snapshot_chunk(Some(*seq), *offset, now);
        }
        if let Some(r) = &shared.replication {
            if r.role() != Role::Leader {
                // Deposed (or not yet leading): its sink no longer logs,
                // so a change made now would be answered unreplicated.
                return not_leading("this master no longer leads its cluster");
            }
        }
        if let Some(leading) = shared.leading.get() {
            if !leading.lease.holds() {
                // Past the proven lease (a process frozen past it, say, whose
                // holder task has not run yet): a newer leader may have moved
                // on, so even a read could answer from a stale state.
                return not_leading("this master's leadership lease has run out");
            }
            if let Request::LeaderTerm { term } = req {
                session.term = Some(term);
                let result = same_term(session.term, leading.term);
                return match result {
                    Ok(()) => Response::Unit { result },
                    Err(error) => Response::Failed { error },
                };
            }
            if let Err(error) = same_term(session.term, leading.term) {
                // The client has seen another election than the one this
                // master won: a newer one (this master is deposed and does
                // not know yet), or an older one (it looks the leader up).
                return Response::Failed { error };
            }
        }
        let call = shared.metrics.classify(&shared.service, &req);
        // A put keeps a copy of itself, and the count of ended copies
        // before its try, to wait for room (`room_wait`).
        let retry = super::room_wait::may_wait(&req)
            .then(|| (req.clone(), shared.service.room_signal().generation()));
        let answer = shared.service.handle_as(req, &session.tenant, now);
        let answer = match retry {
            Some((req, seen)) => {
                super::room_wait::until_room(shared, req, &session.tenant, answer, seen)
            }
            None => answer,
        };
        let Answer {
            mut response,
            release,
        } = answer;
        // Answered only once its release holds: its mutations durable in
        // the log (`Durable`), or held by the in-sync standbys (`Committed`).
        let waited = match (release, &shared.durability.wal, &shared.replication) {
            (Release::Now, ..) => Ok(()),
            (Release::Durable(pos), Some(wal), _) => wal.wait_for(pos),
            (Release::Committed(seq), _, Some(r)) => r.wait_committed(seq),
            (other, ..) => unreachable!("{other:?} from a master without that log"),
        };
        if let Err(error) = waited {
            response = Response::Failed { error };
        }
        if let Some(r) = &shared.replication {
            if release == Release::Now && r.role() != Role::Leader {
                // Deposed during the call: the sink may have skipped its
                // changes (it stops logging before the role is read here).
                response = not_leading("this master no longer leads its cluster");
            }
        }
        shared.metrics.observe(call, &response);
        response
    }

    fn failure(&self, error: Error) -> Response {
        Response::Failed { error }
    }

    fn observe_malformed(&self) {
        self.0.metrics.observe_malformed();
    }
}

/// The refusal of a master that cannot answer as leader: the client looks
/// the leader up again.
fn not_leading(why: &'static str) -> Response {
    Response::Failed {
        error: Error::new(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, why),
    }
}

/// The term fence: a call on a connection that stated the term `stated`
/// is answered only by the leader of that very term (`None`: the
/// connection stated none, as plain and standby connections).
pub(crate) fn same_term(stated: Option<u64>, leading: u64) -> Result<()> {
    match stated {
        Some(term) if term != leading => Err(Error::new(
            ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
            format!(
                "this master leads term {leading}, the call was made under term {term}{}",
                if term > leading {
                    ": a newer leader was elected"
                } else {
                    ": look the leader up again"
                }
            ),
        )),
        _ => Ok(()),
    }
}

async fn timer_loop(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(TICK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let report_every = shared.config.metric_report_interval;
    let mut last_report = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let now = shared.clock.now_ms();
        let report = tokio::task::block_in_place(|| {
            let report = shared.service.tick(now);
            shared
                .drain
                .step(&shared.service, now, super::shared::wall_ms());
            report
        });
        if report.expired_clients > 0 || report.discarded_puts > 0 {
            tracing::info!(?report, "timers");
        }
        if shared.config.enable_metric_reporting && last_report.elapsed() >= report_every {
            last_report = Instant::now();
            tracing::info!("{}", http::summary_line(&shared));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_answered_only_under_the_term_its_connection_stated() {
        assert!(same_term(None, 7).is_ok(), "no term stated: not fenced");
        assert!(same_term(Some(7), 7).is_ok());
        for (stated, why) in [(8, "newer leader"), (6, "look the leader up")] {
            let e = same_term(Some(stated), 7).unwrap_err();
            assert_eq!(e.code, ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
            assert!(e.context.contains("term 7"), "{e:?}");
            assert!(e.context.contains(&format!("term {stated}")), "{e:?}");
            assert!(e.context.contains(why), "{e:?}");
        }
    }
}
