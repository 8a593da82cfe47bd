//! The master process as a library: the async shell around
//! [`MasterService`].
//!
//! - RPC: one thread per long-lived client connection, blocking on its
//!   socket; each call is one request frame in and one response frame out,
//!   served inline (the state machine answers in microseconds). A blocking
//!   read wakes exactly the thread that answers, which saves the reactor's
//!   readiness round (a failed read, `epoll_wait`, a task wake-up): about a
//!   third of a loopback round trip. Connections are long-lived and few per
//!   client, so threads stay few.
//! - Timers: client expiry, put timeouts, delayed frees and eviction run
//!   every [`TICK_INTERVAL`].
//! - HTTP: metrics and admin queries on `metrics_port` (see [`super::http`]),
//!   and the transfer-engine metadata server when enabled.
//!
//! [`MasterServer::bind`] then [`MasterServer::serve`] run on the caller's
//! runtime; [`run`] builds a runtime and blocks; [`MasterHandle::spawn`] runs
//! a master on threads of its own (tests, `mooncake up`).

use std::collections::HashMap;
use std::future::Future;
use std::io::{self, BufRead, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_transfer::metadata::http_server;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::config::MasterConfig;
use super::http;
use super::metrics::MasterMetrics;
use super::service::MasterService;
use crate::proto::frame::{decode_payload, encode_frame, read_frame_within};
use crate::proto::{spin, Request, Response};

/// How often the timers run.
pub const TICK_INTERVAL: Duration = Duration::from_millis(100);
/// Most client connections served at once; more wait in the accept queue.
const MAX_CONNECTIONS: usize = 16 * 1024;
/// Read buffer per connection: a typical request arrives in one read.
const READ_BUFFER: usize = 64 * 1024;
/// Stack of a connection thread (the service needs little).
const CONNECTION_STACK: usize = 256 << 10;
/// Frame buffers larger than this are dropped after use.
const SHRINK_ABOVE: usize = 1 << 20;
/// Longest a request may take to arrive once its first byte has, and an
/// answer to be taken (`rpc_conn_timeout` when shorter).
const FRAME_TIMEOUT: Duration = Duration::from_secs(30);

/// Milliseconds on a monotonic clock, from the master's start.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    pub fn new() -> Self {
        Clock {
            start: Instant::now(),
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// What every task of a running master shares.
pub struct Shared {
    pub service: MasterService,
    pub metrics: MasterMetrics,
    pub clock: Clock,
    pub config: MasterConfig,
}

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
    http: TcpListener,
    metadata: Option<TcpListener>,
    shared: Arc<Shared>,
}

impl MasterServer {
    /// Binds the RPC, HTTP and (if enabled) metadata listeners. Port 0 picks a free port.
    pub async fn bind(config: MasterConfig) -> Result<MasterServer> {
        config.validate()?;
        let rpc = bind("RPC service", &config.rpc_address, config.rpc_listen_port()).await?;
        let http = bind("metrics service", &config.metrics_host, config.metrics_port).await?;
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
        let clock = Clock::new();
        let service = MasterService::new(&config);
        let epoch_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        service.set_epoch_offset(epoch_ms.saturating_sub(clock.now_ms()));
        let shared = Arc::new(Shared {
            service,
            metrics: MasterMetrics::new(),
            clock,
            config,
        });
        Ok(MasterServer {
            rpc,
            http,
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
        self.http
            .local_addr()
            .expect("bound listener has an address")
    }

    pub fn metadata_addr(&self) -> Option<SocketAddr> {
        self.metadata
            .as_ref()
            .map(|l| l.local_addr().expect("bound listener has an address"))
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets calls
    /// in flight finish and returns.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let MasterServer {
            rpc,
            http,
            metadata,
            shared,
        } = self;
        let config = &shared.config;
        tracing::info!(
            rpc = %rpc.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string()),
            http = %http.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string()),
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

        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let mut tasks = JoinSet::new();
        tasks.spawn(accept_loop(rpc, shared.clone(), stop_rx.clone()));
        tasks.spawn(timer_loop(shared.clone(), stop_rx.clone()));
        let router = http::router(shared.clone());
        let http_stop = stopped(stop_rx.clone());
        tasks.spawn(async move {
            if let Err(e) = axum::serve(http, router)
                .with_graceful_shutdown(http_stop)
                .await
            {
                tracing::error!("metrics service failed: {e}");
            }
        });
        if let Some(listener) = metadata {
            let meta_stop = stopped(stop_rx.clone());
            tasks.spawn(async move {
                if let Err(e) = http_server::serve(listener, meta_stop).await {
                    tracing::error!("HTTP metadata server failed: {e}");
                }
            });
        }

        shutdown.await;
        tracing::info!("mooncake master stopping");
        let _ = stop_tx.send(true);
        while tasks.join_next().await.is_some() {}
        Ok(())
    }
}

/// Binds and serves on the current runtime until `shutdown`.
pub async fn serve(config: MasterConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    MasterServer::bind(config).await?.serve(shutdown).await
}

/// Builds a runtime with `rpc_thread_num` workers and serves until
/// `shutdown` resolves (blocking). `on_bound` sees the bound server first
/// (to print its addresses); in HA mode, at the start of each term as leader.
pub fn run<F, B>(config: MasterConfig, shutdown: F, mut on_bound: B) -> Result<()>
where
    F: Future<Output = ()> + Send + 'static,
    B: FnMut(&MasterServer),
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.worker_threads())
        .thread_name("mc-master")
        .enable_all()
        .build()
        .map_err(|e| {
            Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("cannot start runtime: {e}"),
            )
        })?;
    rt.block_on(async move {
        if config.enable_ha {
            return super::ha::serve_ha(config, shutdown, on_bound).await;
        }
        let server = MasterServer::bind(config).await?;
        on_bound(&server);
        server.serve(shutdown).await
    })
}

/// The RPC connections being served, so that a stopping master can close
/// their sockets (ending each thread's blocking read) and wait for them.
#[derive(Default)]
struct Connections {
    next_id: u64,
    open: HashMap<u64, std::net::TcpStream>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let conns = Arc::new(Mutex::new(Connections::default()));
    loop {
        let permit = tokio::select! {
            p = limit.clone().acquire_owned() => p.expect("semaphore is never closed"),
            _ = stop.wait_for(|s| *s) => break,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                if let Err(e) = spawn_connection(stream, &shared, &conns, permit) {
                    tracing::warn!(%peer, "cannot serve connection: {e}");
                }
            }
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop(listener);
    let threads = {
        let mut c = conns.lock();
        for s in c.open.values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        std::mem::take(&mut c.threads)
    };
    let _ = tokio::task::spawn_blocking(move || {
        for t in threads {
            let _ = t.join();
        }
    })
    .await;
}

/// Serves `stream` on a thread of its own until the peer closes it.
fn spawn_connection(
    stream: TcpStream,
    shared: &Arc<Shared>,
    conns: &Arc<Mutex<Connections>>,
    permit: OwnedSemaphorePermit,
) -> io::Result<()> {
    let stream = stream.into_std()?;
    stream.set_nonblocking(false)?;
    let peer = stream.peer_addr()?;
    let id = {
        let mut c = conns.lock();
        c.threads.retain(|t| !t.is_finished());
        let id = c.next_id;
        c.next_id += 1;
        c.open.insert(id, stream.try_clone()?);
        id
    };
    let (shared, registry) = (shared.clone(), conns.clone());
    let spawned = std::thread::Builder::new()
        .name("mc-master-rpc".into())
        .stack_size(CONNECTION_STACK)
        .spawn(move || {
            if let Err(e) = serve_connection(stream, &shared) {
                tracing::debug!(%peer, "connection closed: {e}");
            }
            registry.lock().open.remove(&id);
            drop(permit);
        });
    let mut c = conns.lock();
    match spawned {
        Ok(t) => {
            c.threads.push(t);
            Ok(())
        }
        Err(e) => {
            c.open.remove(&id);
            Err(e)
        }
    }
}

/// Waits for the next request frame: `Ok(false)` when the peer closed the
/// connection between frames. The wait for its first byte is bounded by
/// `idle` (`None`: unbounded); the rest must arrive within `limit`.
fn next_request(
    reader: &mut io::BufReader<std::net::TcpStream>,
    payload: &mut Vec<u8>,
    idle: Option<Duration>,
    limit: Duration,
    window: &mut spin::AdaptiveWindow,
) -> io::Result<bool> {
    // A client that just got an answer often calls again soon (a put's end
    // after its start and copy): poll for a while before sleeping (see
    // `proto::spin`), as long as this client's last gap suggests.
    let since = Instant::now();
    if reader.buffer().is_empty() {
        window.await_next(reader.get_ref(), spin::server_window());
    }
    loop {
        match reader.fill_buf() {
            Ok([]) => return Ok(false),
            Ok(_) => {
                window.observe(since.elapsed());
                break;
            }
            // The socket's read timeout: only an idle limit ends the wait.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if idle.is_some_and(|t| since.elapsed() >= t) {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "idle connection"));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    read_frame_within(reader, payload, limit, false)?;
    Ok(true)
}

/// Serves one client connection: frame in, frame out, until it closes.
fn serve_connection(stream: std::net::TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_nodelay(shared.config.rpc_enable_tcp_no_delay)?;
    let idle = shared.config.rpc_conn_timeout;
    let limit = idle.map_or(FRAME_TIMEOUT, |t| t.min(FRAME_TIMEOUT));
    // Reads wake at least this often so the deadlines above are checked; an
    // answer not taken within `limit` drops the client.
    stream.set_read_timeout(Some(limit))?;
    stream.set_write_timeout(Some(limit))?;
    let mut reader = io::BufReader::with_capacity(READ_BUFFER, stream);
    let mut payload = Vec::new();
    let mut out = Vec::with_capacity(256);
    let mut window = spin::AdaptiveWindow::default();
    loop {
        match next_request(&mut reader, &mut payload, idle, limit, &mut window) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                // A bad length: the stream cannot be resynchronised. Say
                // why, then close.
                shared.metrics.observe_malformed();
                let error = Error::new(ErrorCode::DESERIALIZE_FAIL, e.to_string());
                out.clear();
                encode_frame(&Response::Failed { error }, &mut out)?;
                reader.get_ref().write_all(&out)?;
                return Err(e);
            }
            Err(e) => return Err(e),
        }
        let resp = match decode_payload::<Request<'_>>(&payload) {
            Ok(req) => handle(shared, req),
            Err(e) => {
                shared.metrics.observe_malformed();
                tracing::debug!("malformed request: {e}");
                Response::Failed { error: e.into() }
            }
        };
        out.clear();
        if let Err(e) = encode_frame(&resp, &mut out) {
            let error = Error::new(ErrorCode::INVALID_PARAMS, e.to_string());
            encode_frame(&Response::Failed { error }, &mut out)?;
        }
        reader.get_ref().write_all(&out)?;
        // Do not keep a huge batch's buffers for the life of the connection.
        if payload.capacity() > SHRINK_ABOVE {
            payload = Vec::new();
        }
        if out.capacity() > SHRINK_ABOVE {
            out = Vec::with_capacity(256);
        }
    }
}

/// Answers one request on the calling (connection) thread.
fn handle(shared: &Shared, req: Request<'_>) -> Response {
    shared.metrics.observe_values(&req);
    let tag = req.tag();
    let now = shared.clock.now_ms();
    let resp = shared.service.handle(req, now);
    shared.metrics.observe(tag, &resp);
    resp
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
        let report = tokio::task::block_in_place(|| shared.service.tick(now));
        if report.expired_clients > 0 || report.discarded_puts > 0 {
            tracing::info!(?report, "timers");
        }
        if shared.config.enable_metric_reporting && last_report.elapsed() >= report_every {
            last_report = Instant::now();
            tracing::info!("{}", http::summary_line(&shared));
        }
    }
}

/// A master running on threads of its own; stops when dropped.
pub struct MasterHandle {
    rpc_addr: SocketAddr,
    http_addr: SocketAddr,
    metadata_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl MasterHandle {
    /// Binds and starts serving; returns once the listeners are bound.
    pub fn spawn(config: MasterConfig) -> Result<MasterHandle> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let threads = config.worker_threads();
        let thread = std::thread::Builder::new()
            .name("mc-master".into())
            .spawn(move || -> Result<()> {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(threads)
                    .thread_name("mc-master")
                    .enable_all()
                    .build()
                    .map_err(|e| {
                        Error::new(
                            ErrorCode::INTERNAL_ERROR,
                            format!("cannot start runtime: {e}"),
                        )
                    })?;
                rt.block_on(async move {
                    let server = match MasterServer::bind(config).await {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.clone()));
                            return Err(e);
                        }
                    };
                    let addrs = (
                        server.rpc_addr(),
                        server.http_addr(),
                        server.metadata_addr(),
                        server.shared().clone(),
                    );
                    let _ = ready_tx.send(Ok(addrs));
                    server
                        .serve(async move {
                            let _ = stopped.await;
                        })
                        .await
                })
            })
            .map_err(|e| {
                Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("cannot start master thread: {e}"),
                )
            })?;
        match ready_rx.recv() {
            Ok(Ok((rpc_addr, http_addr, metadata_addr, shared))) => Ok(MasterHandle {
                rpc_addr,
                http_addr,
                metadata_addr,
                shared,
                stop: Some(stop),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let joined = thread.join();
                Err(match joined {
                    Ok(Err(e)) => e,
                    _ => Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        "master thread exited before binding",
                    ),
                })
            }
        }
    }

    pub fn rpc_addr(&self) -> SocketAddr {
        self.rpc_addr
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn metadata_addr(&self) -> Option<SocketAddr> {
        self.metadata_addr
    }

    /// The running state machine (for in-process inspection).
    pub fn service(&self) -> &MasterService {
        &self.shared.service
    }

    /// Stops the master and waits for it.
    pub fn stop(mut self) -> Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<()> {
        self.stop.take();
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    "master thread panicked",
                ))
            }),
            None => Ok(()),
        }
    }
}

impl Drop for MasterHandle {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}
