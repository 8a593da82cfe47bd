//! How a dummy reaches its store service: one connection says `Hello`
//! (sharing the region, opening the session), every later one joins the
//! session with `Attach`; all of them are pooled (`crate::rpc`).
//!
//! A service on this host is reached over its abstract Unix socket
//! ([`local_socket_name`] of the port given), where the kernel tells the
//! service who connected. Abstract names have no owner, so the dummy first
//! checks who holds it: the process behind the socket (`SO_PEERCRED`) must
//! be the one listening on the TCP address the dummy was given, else it
//! uses TCP (a service on another host, a name held by a stranger, a
//! service run by a user whose processes this one cannot inspect).

use std::net::SocketAddr;
use std::time::Duration;

use mooncake_common::auth::ClusterToken;
use mooncake_common::{Error, ErrorCode, Result};

use super::super::config;
use super::super::dummy_proto::{local_socket_name, unexpected, DummyRequest, DummyResponse};
use super::super::peer;
use super::super::shm::ShmRegion;
use super::super::staging::Region;
use crate::proto::frame::{decode_payload, encode_frame};
use crate::rpc::{
    connect_abstract, connect_any, peer_credentials, resolve, rpc_fail, AnyStream, ClientOptions,
    Connection, Connector, Pool,
};
use crate::types::ClientId;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the dummy waits for the service before a call fails with
/// `RPC_FAIL` (and its connection is dropped).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    /// Connect and `Hello` (the reference gives up after about 6 s).
    pub hello: Duration,
    /// Any other call, which may wait for the master and a transfer.
    pub call: Duration,
}

impl Timeouts {
    /// A call may take two master round trips (30 s each at most) and
    /// transfers bounded by `MC_TRANSFER_TIMEOUT`, as the service sees them.
    pub(crate) fn from_env() -> Timeouts {
        Timeouts {
            hello: Duration::from_secs(6),
            call: Duration::from_secs(60) + 2 * config::transfer_timeout(),
        }
    }

    /// The dummy's connections: every one kept (each holds the session),
    /// no polling (a call waits for the master and a transfer anyway).
    fn options(&self) -> ClientOptions {
        ClientOptions {
            connect_timeout: CONNECT_TIMEOUT.min(self.call),
            call_timeout: self.call,
            max_idle: usize::MAX,
            read_buffer: 8 << 10,
            poll: Duration::ZERO,
            drop_idle_on_failure: false,
        }
    }
}

/// How a dummy reaches its store service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DummyTransport {
    /// The service's Unix socket when the service is on this host (and
    /// proven to be the one at the address given), else TCP.
    #[default]
    Auto,
    /// TCP only.
    Tcp,
    /// The Unix socket only: setup fails without one.
    Unix,
}

/// The store service's Unix socket, once the dummy trusts it.
#[derive(Clone, Debug)]
pub(super) struct Local {
    name: String,
    /// The service's process: every connection must lead to it.
    pub(super) pid: u32,
}

/// The store service, and the session each new connection joins.
pub(super) struct Service {
    server: String,
    addrs: Vec<SocketAddr>,
    /// Connections go here rather than over TCP.
    local: Option<Local>,
    session: u64,
    /// Presented first on every connection (`$MOONCAKE_CLUSTER_TOKEN`).
    token: Option<ClusterToken>,
}

impl Service {
    fn authenticate(&self, conn: &mut Connection<AnyStream>) -> Result<()> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        let req = DummyRequest::Authenticate {
            token: token.as_str().to_owned(),
        };
        match call_on(conn, &req)? {
            DummyResponse::Unit { result } => result,
            other => Err(unexpected(&other)),
        }
    }
}

/// The Unix socket of the service listening at `addrs`, when it is on this
/// host: connected, and its owner proven to hold that TCP listener.
pub(super) fn local_service(addrs: &[SocketAddr], timeout: Duration) -> Option<(Local, AnyStream)> {
    let name = local_socket_name(addrs.first()?.port());
    let stream = connect_abstract(&name, timeout).ok()?;
    let pid = peer_credentials(&stream).ok()?.pid;
    if !peer::holds_listener(pid, addrs) {
        tracing::info!(
            socket = %format!("@{name}"),
            pid,
            "not the store service at {addrs:?}: using TCP"
        );
        return None;
    }
    Some((Local { name, pid }, AnyStream::Unix(stream)))
}

impl Connector<AnyStream> for Service {
    fn peer(&self) -> String {
        match &self.local {
            Some(l) => format!("store service {} (@{})", self.server, l.name),
            None => format!("store service {}", self.server),
        }
    }

    fn connect(&self, timeout: Duration) -> Result<AnyStream> {
        let Some(local) = &self.local else {
            return connect_any(&self.addrs, timeout)
                .map(AnyStream::Tcp)
                .map_err(|e| rpc_fail(format!("{}: {e}", self.server)));
        };
        let fail = |e: std::io::Error| rpc_fail(format!("{}: {e}", self.peer()));
        let stream = connect_abstract(&local.name, timeout).map_err(fail)?;
        // The name may have changed hands since the session opened.
        match peer_credentials(&stream).map_err(fail)?.pid {
            pid if pid == local.pid => Ok(AnyStream::Unix(stream)),
            pid => Err(rpc_fail(format!(
                "{}: now held by process {pid}, not the service's {}",
                self.peer(),
                local.pid
            ))),
        }
    }

    fn handshake(&self, conn: &mut Connection<AnyStream>) -> Result<()> {
        self.authenticate(conn)?;
        let attach = DummyRequest::Attach {
            session: self.session,
        };
        session_of(call_on(conn, &attach)?).map(drop)
    }
}

fn encode(req: &DummyRequest) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_frame(req, &mut out)
        .map_err(|e| Error::new(ErrorCode::SERIALIZE_FAIL, e.to_string()))?;
    Ok(out)
}

/// One call on a connection outside the pool (`Hello`, `Attach`).
fn call_on(conn: &mut Connection<AnyStream>, req: &DummyRequest) -> Result<DummyResponse> {
    let answer = conn
        .round_trip(&encode(req)?, Duration::ZERO)
        .map_err(|e| rpc_fail(format!("no answer from the store service: {e}")))?;
    Ok(decode_payload::<DummyResponse>(answer)?)
}

fn session_of(resp: DummyResponse) -> Result<(u64, ClientId, String)> {
    match resp {
        DummyResponse::Session {
            session,
            client_id,
            hostname,
        } => Ok((session, client_id, hostname)),
        DummyResponse::Unit { result: Err(e) } => Err(e),
        other => Err(unexpected(&other)),
    }
}

/// Opens the session for `region` with the service at `server`, over
/// `transport`: the pool of its connections, the service's client id and
/// hostname.
pub(super) fn open(
    server: &str,
    transport: DummyTransport,
    timeouts: Timeouts,
    region: &ShmRegion,
) -> Result<(Pool<Service, AnyStream>, ClientId, String)> {
    let connect_timeout = CONNECT_TIMEOUT.min(timeouts.hello);
    let addrs = resolve(server, "server")?;
    let local = match transport {
        DummyTransport::Tcp => None,
        DummyTransport::Auto | DummyTransport::Unix => local_service(&addrs, connect_timeout),
    };
    if transport == DummyTransport::Unix && local.is_none() {
        return Err(rpc_fail(format!(
            "no store service for {server} on this host's Unix socket @{}",
            local_socket_name(addrs[0].port())
        )));
    }
    let (local, first) = local.unzip();
    let token = config::cluster_token()?;
    let mut service = Service {
        server: server.to_owned(),
        addrs,
        local,
        session: 0,
        token,
    };
    let opts = timeouts.options();
    let hello_opts = ClientOptions {
        call_timeout: timeouts.hello,
        ..opts
    };
    let stream = match first {
        Some(stream) => stream,
        None => service.connect(connect_timeout)?,
    };
    let mut conn = Connection::new(stream, &hello_opts).map_err(rpc_fail)?;
    service.authenticate(&mut conn)?;
    let hello = DummyRequest::Hello {
        shm_name: region.name().to_owned(),
        region_len: region.size() as u64,
        pid: std::process::id(),
        fd: region.raw_fd(),
    };
    let (session, client_id, hostname) = session_of(call_on(&mut conn, &hello)?)?;
    conn.set_call_timeout(timeouts.call).map_err(rpc_fail)?;
    service.session = session;
    let conns = Pool::new(service, opts);
    conns.put_idle(conn);
    Ok((conns, client_id, hostname))
}

/// One call on a pooled connection.
pub(super) fn call(conns: &Pool<Service, AnyStream>, req: &DummyRequest) -> Result<DummyResponse> {
    conns.call(&encode(req)?, |answer| Ok(decode_payload(answer)?))
}
