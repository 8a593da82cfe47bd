//! How a dummy reaches its store service: one connection says `Hello`
//! (sharing the region, opening the session), every later one joins the
//! session with `Attach`; all of them are pooled (`crate::rpc`).

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use mooncake_common::auth::ClusterToken;
use mooncake_common::{Error, ErrorCode, Result};

use super::super::dummy_proto::{unexpected, DummyRequest, DummyResponse};
use super::super::shm::ShmRegion;
use super::super::staging::Region;
use crate::proto::frame::{decode_payload, encode_frame};
use crate::rpc::{connect_any, rpc_fail, ClientOptions, Connection, Connector, Pool};
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
    pub fn from_env() -> Timeouts {
        let mut engine = mooncake_transfer::EngineConfig::defaults("", "");
        engine.apply_env(|k| std::env::var(k).ok());
        Timeouts {
            hello: Duration::from_secs(6),
            call: Duration::from_secs(60) + 2 * engine.transfer_timeout,
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

/// The store service, and the session each new connection joins.
pub(super) struct Service {
    server: String,
    session: u64,
    /// Presented first on every connection (`$MOONCAKE_CLUSTER_TOKEN`).
    token: Option<ClusterToken>,
}

impl Service {
    fn authenticate(&self, conn: &mut Connection) -> Result<()> {
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

impl Connector for Service {
    fn peer(&self) -> String {
        format!("store service {}", self.server)
    }

    fn connect(&self, timeout: Duration) -> Result<TcpStream> {
        let addrs: Vec<_> = self
            .server
            .to_socket_addrs()
            .map_err(|e| {
                Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("bad server address {:?}: {e}", self.server),
                )
            })?
            .collect();
        if addrs.is_empty() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("{:?} resolves to nothing", self.server),
            ));
        }
        connect_any(&addrs, timeout).map_err(|e| rpc_fail(format!("{}: {e}", self.server)))
    }

    fn handshake(&self, conn: &mut Connection) -> Result<()> {
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
fn call_on(conn: &mut Connection, req: &DummyRequest) -> Result<DummyResponse> {
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

/// Opens the session for `region` with the service at `server`: the pool
/// of its connections, the service's client id and hostname.
pub(super) fn open(
    server: &str,
    timeouts: Timeouts,
    region: &ShmRegion,
) -> Result<(Pool<Service>, ClientId, String)> {
    let mut service = Service {
        server: server.to_owned(),
        session: 0,
        token: ClusterToken::from_env()?,
    };
    let opts = timeouts.options();
    let hello_opts = ClientOptions {
        call_timeout: timeouts.hello,
        ..opts
    };
    let stream = service.connect(CONNECT_TIMEOUT.min(timeouts.hello))?;
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
pub(super) fn call(conns: &Pool<Service>, req: &DummyRequest) -> Result<DummyResponse> {
    conns.call(&encode(req)?, |answer| Ok(decode_payload(answer)?))
}
