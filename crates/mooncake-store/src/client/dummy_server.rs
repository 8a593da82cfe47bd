//! The standalone store service (`mooncake_client`): a real client that
//! owns the segment and serves dummy clients on the same host.
//!
//! Each dummy shares one sealed memfd region at its first call (see
//! [`super::shm`]); the service maps it, registers it with its engine, and
//! from then on every dummy call names memory as offsets into that region. A session lives while any of
//! the dummy's connections is open; when the last one closes the region is
//! unregistered and unmapped.
//!
//! Sessions are capabilities: a session id is a random 64-bit token, only
//! the process that shared the memory may open it (`Hello` must come over
//! a socket that process `pid` holds) or join it (`Attach` likewise, with
//! the token), and every call but `Hello`, `Attach` and `Health` needs a
//! session. The service listens twice, with the same protocol and limits:
//! on TCP, where the peer is found in the kernel's socket table
//! ([`super::peer`]), so only dummies on this host are served; and on the
//! Unix socket [`local_socket_name`] (abstract, named after the TCP port),
//! where the kernel tells who connected (`SO_PEERCRED`): the pid a dummy
//! names in `Hello` must be the peer's, its uid ours or an allowed one.
//!
//! Dummies are served by the framed-RPC server loop (`crate::rpc::server`),
//! a thread per connection: at most [`ServiceLimits::max_connections`] are
//! served at once on each listener. A connection that has not opened or joined a session
//! within [`ServiceLimits::handshake_timeout`] is closed, and is the first
//! to go when the service is full; past that, new connections wait in the
//! accept queue. A connection with a session may stay idle between calls up
//! to [`ServiceLimits::idle_timeout`] (by default as long as it likes: a
//! dummy's session lives while one of its connections is open), but a call
//! must arrive whole within [`ServiceLimits::frame_timeout`] of its first
//! byte, and its buffer grows only as bytes arrive. A frame whose length
//! cannot be trusted is answered with `DESERIALIZE_FAIL` and its connection
//! closed; one that does not decode is answered and the connection goes on.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::net::{SocketAddr, TcpListener};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{self as unix, UnixListener};
use std::sync::{Arc, Weak};
use std::time::Duration;

use mooncake_common::auth::{self, ClusterToken};
use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;

use super::config::ClientConfig;
use super::dummy_proto::{local_socket_name, Batch, DummyRequest, DummyResponse, RangeItem, Span};
use super::metered::Metered;
use super::metrics::ClientMetrics;
use super::peer::{self, PeerSocket};
use super::shm::ShmRegion;
use super::staging::Region;
use super::ClientImpl;
use super::{real::RealClient, Payload, RangeRead, Source, WriteCmd};
use crate::rpc::Peer;
use crate::rpc::{Handler, Server, ServerOptions, WhenFull};
use crate::types::WriteOptions;

/// Settings of `mooncake_client`.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// The real client this service runs (its segment, master, metadata).
    pub client: ClientConfig,
    /// Address dummy clients connect to (`--host`, `--port`; loopback
    /// unless `--host` names another).
    pub host: String,
    pub port: u16,
    pub limits: ServiceLimits,
    /// Users (uids) whose processes may open sessions besides this
    /// process's own (`--allowed_uids`).
    pub allowed_uids: Vec<u32>,
}

/// What dummy connections may cost the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceLimits {
    /// Connections served at once (one thread each); more wait, after
    /// the oldest without a session has been closed.
    pub max_connections: usize,
    /// Longest a call may take to arrive once its first byte has, and an
    /// answer to be taken.
    pub frame_timeout: Duration,
    /// Longest a connection with a session may stay silent between calls
    /// (`None`: as long as it likes). A dummy's session ends with its last
    /// connection.
    pub idle_timeout: Option<Duration>,
    /// Longest a connection may stay without a session (`Hello` or
    /// `Attach`).
    pub handshake_timeout: Duration,
}

impl Default for ServiceLimits {
    fn default() -> Self {
        ServiceLimits {
            max_connections: 1024,
            frame_timeout: Duration::from_secs(30),
            idle_timeout: None,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

impl ServiceLimits {
    fn server_options(&self) -> ServerOptions {
        ServerOptions {
            name: "mooncake-client",
            max_connections: self.max_connections,
            when_full: WhenFull::Wait,
            idle_timeout: self.idle_timeout,
            frame_timeout: self.frame_timeout,
            nodelay: true,
            read_buffer: 8 << 10,
            // A dummy's calls wait for the master and transfers: no polling.
            poll: Duration::ZERO,
            // Idle connections cost what the master's do.
            stack_size: Some(crate::rpc::server::CONNECTION_STACK),
        }
    }
}

struct Session {
    /// Unmapped when the session ends, unless a transfer may still use it.
    region: ManuallyDrop<ShmRegion>,
    client: Arc<dyn ClientImpl>,
    /// The process that shared the region: only its sockets may join.
    owner_pid: u32,
}

/// One dummy connection's state.
pub(crate) struct Conn {
    /// Who is at the other end: a TCP peer's process is looked up only
    /// when it asks for a session, so idle sockets cost no lookups.
    peer: Peer,
    session: Option<Arc<Session>>,
    /// Presented the cluster token (or none is required).
    authenticated: bool,
}

impl Conn {
    /// Whether the peer is process `pid` on this host, run by a user in
    /// `uids`.
    fn is_process(&self, pid: u32, uids: &[u32]) -> bool {
        match self.peer {
            // The kernel's word: the process that connected.
            Peer::Local(cred) => cred.pid == pid && uids.contains(&cred.uid),
            Peer::Tcp { remote, local } => {
                peer::local_peer(remote, local).is_some_and(|p: PeerSocket| {
                    uids.contains(&p.uid) && peer::process_holds(pid, p.inode)
                })
            }
            Peer::Unknown => false,
        }
    }
}

impl Session {
    fn base(&self) -> usize {
        self.region.addr()
    }

    /// The address of `span` in this process, if it lies in the region.
    fn addr(&self, span: Span) -> Result<(usize, usize)> {
        let ok = span
            .off
            .checked_add(span.len)
            .is_some_and(|end| end <= self.region.size() as u64);
        if !ok {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "span {}+{} outside the {} byte shared region",
                    span.off,
                    span.len,
                    self.region.size()
                ),
            ));
        }
        Ok((self.base() + span.off as usize, span.len as usize))
    }

    /// The addresses of `spans`, if all lie in the region.
    fn addrs(&self, spans: &[Span]) -> Result<Vec<(usize, usize)>> {
        spans.iter().map(|&span| self.addr(span)).collect()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let unregistered = self.client.unregister_buffer(self.base());
        // SAFETY: `region` is not used again; this is its only release.
        let region = unsafe { ManuallyDrop::take(&mut self.region) };
        release_region(region, unregistered);
    }
}

/// Unmaps a session's region once its unregistration says that nothing
/// uses it any more. `ERR_BATCH_BUSY` says a peer's transfer may still
/// touch it: then the mapping is leaked rather than unmapped under it.
fn release_region(region: ShmRegion, unregistered: Result<()>) {
    match unregistered {
        Err(e) if e.code == ErrorCode::ERR_BATCH_BUSY => {
            tracing::warn!(
                region = region.name(),
                "shared region leaked: a transfer may still use it: {e}"
            );
            std::mem::forget(region);
        }
        _ => drop(region),
    }
}

/// The dummy protocol's side of the service: the real client and the
/// sessions of the dummies it serves.
struct Inner {
    client: Arc<dyn ClientImpl>,
    /// Sessions by token.
    sessions: Mutex<HashMap<u64, Weak<Session>>>,
    handshake_timeout: Duration,
    /// Required of every connection before `Hello` or `Attach`.
    cluster_token: Option<ClusterToken>,
    /// Users whose processes may open sessions: ours, and those allowed.
    uids: Vec<u32>,
}

/// A running `mooncake_client`.
pub struct StoreService {
    client: Arc<dyn ClientImpl>,
    metrics: Option<Arc<ClientMetrics>>,
    server: Option<Server>,
    /// The Unix socket's server (`None` when its name was taken).
    local: Option<Server<unix::SocketAddr>>,
}

impl StoreService {
    /// Starts the real client (mounting its segment) and listens for dummies.
    pub fn start(config: &ServiceConfig) -> Result<StoreService> {
        let cluster_token = match &config.client.cluster_token {
            Some(t) => Some(t.clone()),
            None => super::config::cluster_token()?,
        };
        let real = Arc::new(RealClient::setup(&config.client, None)?);
        real.start_executor();
        let metrics = real.metrics.clone();
        let client: Arc<dyn ClientImpl> = match &metrics {
            Some(m) => Arc::new(Metered {
                inner: real,
                metrics: m.clone(),
            }),
            None => real,
        };
        let socket_error = |e: std::io::Error| {
            Error::new(
                ErrorCode::ERR_SOCKET,
                format!("listen on {}:{}: {e}", config.host, config.port),
            )
        };
        let listener =
            TcpListener::bind((config.host.as_str(), config.port)).map_err(socket_error)?;
        let inner = Arc::new(Inner {
            client: client.clone(),
            sessions: Mutex::new(HashMap::new()),
            handshake_timeout: config.limits.handshake_timeout,
            cluster_token,
            // SAFETY: geteuid has no preconditions.
            uids: std::iter::once(unsafe { libc::geteuid() })
                .chain(config.allowed_uids.iter().copied())
                .collect(),
        });
        let opts = config.limits.server_options();
        let server = Server::start(listener, inner.clone(), opts.clone()).map_err(socket_error)?;
        let port = server.local_addr().port();
        let local = serve_local(port, inner, opts);
        tracing::info!(addr = %server.local_addr(), hostname = %client.hostname(), local = local.is_some(), "store service listening for dummy clients");
        Ok(StoreService {
            client,
            metrics,
            server: Some(server),
            local,
        })
    }

    /// The name of the abstract Unix socket dummies on this host connect
    /// to (`None` when it could not be bound: they use TCP then).
    pub fn local_socket(&self) -> Option<String> {
        self.local
            .as_ref()
            .map(|_| local_socket_name(self.local_addr().port()))
    }

    /// The real client's metrics, counting what it serves for dummies
    /// (`None` with `MC_STORE_CLIENT_METRIC=0`).
    pub fn metrics(&self) -> Option<&Arc<ClientMetrics>> {
        self.metrics.as_ref()
    }

    /// Whether the real client reaches the master, as the HTTP server's
    /// `/health` asks it.
    pub fn health_probe(&self) -> super::http::HealthCheck {
        let client = self.client.clone();
        Arc::new(move || client.health_check().is_ok())
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.server
            .as_ref()
            .expect("a service serves until stopped")
            .local_addr()
    }

    /// The real client's engine endpoint (its segment's name).
    pub fn hostname(&self) -> String {
        self.client.hostname()
    }

    /// Stops accepting, disconnects dummies and unmounts the segment.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if let Some(local) = self.local.take() {
            local.stop();
        }
        if let Some(server) = self.server.take() {
            server.stop();
            let _ = self.client.close();
        }
    }
}

impl Drop for StoreService {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// The dummy protocol on the RPC server loop.
impl Handler for Inner {
    type Request<'a> = DummyRequest;
    type Response = DummyResponse;
    /// Who the peer is and its session, once `Hello` or `Attach` named it.
    type Session = Conn;
    const OVERSIZED_ANSWER: ErrorCode = ErrorCode::SERIALIZE_FAIL;

    fn session(&self, peer: &Peer) -> Conn {
        Conn {
            peer: *peer,
            session: None,
            authenticated: self.cluster_token.is_none(),
        }
    }

    fn idle_limit(&self, conn: &Conn, configured: Option<Duration>) -> Option<Duration> {
        match conn.session {
            Some(_) => configured,
            None => {
                Some(configured.map_or(self.handshake_timeout, |t| t.min(self.handshake_timeout)))
            }
        }
    }

    fn evictable(&self, conn: &Conn) -> bool {
        conn.session.is_none()
    }

    fn handle(&self, conn: &mut Conn, req: DummyRequest) -> DummyResponse {
        handle(self, conn, req)
    }

    fn failure(&self, error: Error) -> DummyResponse {
        DummyResponse::Unit { result: Err(error) }
    }
}

/// Serves the dummy protocol on the abstract Unix socket named after `port`,
/// unless another process holds that name (then dummies use TCP: before
/// they trust the socket they check that its owner listens on the TCP port).
fn serve_local(
    port: u16,
    inner: Arc<Inner>,
    opts: ServerOptions,
) -> Option<Server<unix::SocketAddr>> {
    let name = local_socket_name(port);
    let served = unix::SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|addr| UnixListener::bind_addr(&addr))
        .and_then(|listener| Server::start(listener, inner, opts));
    match served {
        Ok(server) => Some(server),
        Err(e) => {
            tracing::warn!("cannot listen on the Unix socket @{name} (dummies use TCP): {e}");
            None
        }
    }
}

fn handle(inner: &Inner, conn: &mut Conn, req: DummyRequest) -> DummyResponse {
    let client = &inner.client;
    let unit = |result| DummyResponse::Unit { result };
    if let DummyRequest::Authenticate { token } = &req {
        return unit(authenticate(inner, conn, token));
    }
    let needs_session = !matches!(
        req,
        DummyRequest::Hello { .. } | DummyRequest::Attach { .. } | DummyRequest::Health {}
    );
    if needs_session && conn.session.is_none() {
        return no_session();
    }
    if !conn.authenticated && !matches!(req, DummyRequest::Health {}) {
        return unit(Err(Error::new(
            ErrorCode::ILLEGAL_CLIENT,
            "this service requires the cluster token: authenticate first",
        )));
    }
    match req {
        DummyRequest::Authenticate { .. } => unreachable!("answered above"),
        DummyRequest::Hello {
            shm_name,
            region_len,
            pid,
            fd,
        } => match hello(inner, conn, pid, fd, &shm_name, region_len) {
            Ok(id) => DummyResponse::Session {
                session: id,
                client_id: client.client_id(),
                hostname: client.hostname(),
            },
            Err(e) => unit(Err(e)),
        },
        DummyRequest::Attach { session: id } => {
            let found = inner.sessions.lock().get(&id).and_then(Weak::upgrade);
            // A stranger learns nothing: a wrong token and another
            // process's token are the same error.
            let uids = &inner.uids;
            match found.filter(|s| conn.session.is_none() && conn.is_process(s.owner_pid, uids)) {
                Some(s) => {
                    conn.session = Some(s);
                    DummyResponse::Session {
                        session: id,
                        client_id: client.client_id(),
                        hostname: client.hostname(),
                    }
                }
                None => unit(Err(Error::new(
                    ErrorCode::CLIENT_NOT_FOUND,
                    "no such dummy session for this process",
                ))),
            }
        }
        DummyRequest::Health {} => unit(client.health_check()),
        DummyRequest::GetSize { keys } => DummyResponse::Counts {
            result: Ok(ClientImpl::get_size(&**client, &keys)),
        },
        DummyRequest::IsExist { keys } => DummyResponse::Bools {
            result: client.is_exist(&keys),
        },
        DummyRequest::Remove { keys, force } => DummyResponse::Units {
            result: client.remove(&keys, force),
        },
        DummyRequest::RemoveByRegex { pattern, force } => DummyResponse::Count {
            result: client.remove_by_regex(&pattern, force),
        },
        DummyRequest::RemoveAll { force } => DummyResponse::Count {
            result: client.remove_all(force),
        },
        DummyRequest::ReplicaDesc { keys } => DummyResponse::Replicas {
            result: client.replica_desc(&keys),
        },
        DummyRequest::CreateCopyTask { key, targets } => DummyResponse::Task {
            result: client.create_copy_task(&key, &targets),
        },
        DummyRequest::CreateMoveTask {
            key,
            source,
            target,
        } => DummyResponse::Task {
            result: client.create_move_task(&key, &source, &target),
        },
        DummyRequest::QueryTask { id } => DummyResponse::TaskState {
            result: client.query_task(id),
        },
        DummyRequest::BatchReplicaClear { keys, segment_name } => DummyResponse::Keys {
            result: client.batch_replica_clear(&keys, &segment_name),
        },
        DummyRequest::Write {
            upsert,
            config,
            items,
        } => {
            let Some(s) = conn.session.as_ref() else {
                return no_session();
            };
            let batch = Batch::prepare(
                items
                    .into_iter()
                    .map(|item| Ok(((item.key, Payload::Mem(s.addrs(&item.parts)?)), ()))),
            );
            let (results, _) = batch.finish(|items| {
                let (keys, payloads): (Vec<_>, Vec<_>) = items.into_iter().unzip();
                let opts = WriteOptions { config, upsert };
                let cmd = WriteCmd {
                    opts: &opts,
                    source: Source::Mem,
                };
                Ok(client.write(&keys, payloads, &cmd))
            });
            DummyResponse::Units {
                result: Ok(results),
            }
        }
        DummyRequest::ReadInto { items } => {
            let Some(s) = conn.session.as_ref() else {
                return no_session();
            };
            let batch = Batch::prepare(
                items
                    .into_iter()
                    .map(|item| Ok(((item.key, s.addrs(&item.dests)?), ()))),
            );
            let (results, _) = batch.finish(|items| {
                let (keys, dests): (Vec<_>, Vec<_>) = items.into_iter().unzip();
                Ok(client.read_into(&keys, &dests))
            });
            DummyResponse::Counts {
                result: Ok(results),
            }
        }
        DummyRequest::ReadRanges { items } => {
            let Some(s) = conn.session.as_ref() else {
                return no_session();
            };
            let batch = Batch::prepare(items.into_iter().map(|item| {
                let RangeItem {
                    buffer,
                    key,
                    dst_off,
                    src_off,
                    len,
                } = item;
                let (addr, buffer_len) = s.addr(buffer)?;
                let read = RangeRead {
                    buffer: addr,
                    buffer_len: Some(buffer_len),
                    key,
                    dst_off,
                    src_off,
                    len: len as usize,
                };
                Ok((read, ()))
            }));
            let (results, _) = batch.finish(|reqs| Ok(client.read_ranges(&reqs)));
            DummyResponse::Counts {
                result: Ok(results),
            }
        }
    }
}

/// `Authenticate`: whether `token` is the cluster token (anything is, when
/// none is configured).
fn authenticate(inner: &Inner, conn: &mut Conn, token: &str) -> Result<()> {
    if !auth::admits(inner.cluster_token.as_ref(), token.as_bytes()) {
        return Err(Error::new(ErrorCode::ILLEGAL_CLIENT, "wrong cluster token"));
    }
    conn.authenticated = true;
    Ok(())
}

fn no_session() -> DummyResponse {
    DummyResponse::Unit {
        result: Err(Error::new(
            ErrorCode::ILLEGAL_CLIENT,
            "call Hello or Attach first",
        )),
    }
}

fn hello(
    inner: &Inner,
    conn: &mut Conn,
    pid: u32,
    fd: i32,
    shm_name: &str,
    region_len: u64,
) -> Result<u64> {
    if conn.session.is_some() {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            "this connection already has a session",
        ));
    }
    if region_len == 0 {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            "a dummy client must share some memory",
        ));
    }
    let len = usize::try_from(region_len)
        .map_err(|_| Error::new(ErrorCode::INVALID_PARAMS, "region too large"))?;
    // Only the process holding the memory may share it: otherwise any
    // peer could name another process's descriptor.
    if !conn.is_process(pid, &inner.uids) {
        return Err(Error::new(
            ErrorCode::ILLEGAL_CLIENT,
            format!(
                "Hello for process {pid} must come from a socket of that process on this host, \
                 run by this service's user or an allowed one"
            ),
        ));
    }
    let region = ShmRegion::open(pid, fd, shm_name, len)?;
    inner.client.register_buffer(region.addr(), len)?;
    let s = Arc::new(Session {
        region: ManuallyDrop::new(region),
        client: inner.client.clone(),
        owner_pid: pid,
    });
    let mut sessions = inner.sessions.lock();
    sessions.retain(|_, w| w.strong_count() > 0);
    // A random token (the OS-seeded CSPRNG); 0 means "none" to dummies.
    let id = loop {
        let t = rand::random::<u64>();
        if t != 0 && !sessions.contains_key(&t) {
            break t;
        }
    };
    sessions.insert(id, Arc::downgrade(&s));
    conn.session = Some(s);
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this process maps the memfd region called `name`.
    fn mapped(name: &str) -> bool {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .contains(name)
    }

    #[test]
    fn a_region_still_in_use_is_never_unmapped() {
        let busy = ShmRegion::create(4096).unwrap();
        let name = busy.name().to_string();
        assert!(mapped(&name));
        let in_use = Err(Error::new(ErrorCode::ERR_BATCH_BUSY, "a frame holds it"));
        release_region(busy, in_use);
        assert!(mapped(&name), "unmapped while a transfer may use it");

        for unregistered in [
            Ok(()),
            Err(Error::new(ErrorCode::ERR_ADDRESS_NOT_REGISTERED, "gone")),
        ] {
            let idle = ShmRegion::create(4096).unwrap();
            let name = idle.name().to_string();
            release_region(idle, unregistered);
            assert!(!mapped(&name), "a region nothing uses stays mapped");
        }
    }
}
