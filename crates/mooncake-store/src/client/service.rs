//! The standalone store service (`mooncake_client`): a real client that
//! owns the segment and serves dummy clients on the same host.
//!
//! Each dummy shares one sealed memfd region at its first call (see
//! [`super::shm`]); the service maps it, registers it with its engine, and
//! from then on every dummy call names memory as offsets into that region. A session lives while any of
//! the dummy's connections is open; when the last one closes the region is
//! unregistered and unmapped.
//!
//! Each connection has a thread; at most [`ServiceLimits::max_connections`]
//! are served at once and further ones are closed at accept. A connection may
//! stay idle between calls for as long as it likes, but a call must arrive
//! whole within [`ServiceLimits::frame_timeout`] of its first byte, and its
//! buffer grows only as bytes arrive.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;

use super::config::ClientConfig;
use super::dummy_proto::{DummyRequest, DummyResponse, RangeItem, Span};
use super::shm::ShmRegion;
use super::staging::Region;
use super::Backend;
use super::{real::RealClient, Payload, RangeRead};
use crate::proto::frame::{decode_payload, encode_frame, read_frame_within, write_frames};

/// Settings of `mooncake_client`.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// The real client this service runs (its segment, master, metadata).
    pub client: ClientConfig,
    /// Address dummy clients connect to (`--host`, `--port`).
    pub host: String,
    pub port: u16,
    pub limits: ServiceLimits,
}

/// What dummy connections may cost the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceLimits {
    /// Connections served at once (one thread each); more are closed.
    pub max_connections: usize,
    /// Longest a call may take to arrive once its first byte has, and an
    /// answer to be taken.
    pub frame_timeout: Duration,
}

impl Default for ServiceLimits {
    fn default() -> Self {
        ServiceLimits {
            max_connections: 1024,
            frame_timeout: Duration::from_secs(30),
        }
    }
}

/// Frame buffers larger than this are dropped after use.
const SHRINK_ABOVE: usize = 1 << 20;

struct Session {
    region: ShmRegion,
    client: Arc<RealClient>,
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
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.client.unregister_buffer(self.base());
    }
}

struct Inner {
    client: Arc<RealClient>,
    sessions: Mutex<HashMap<u64, Weak<Session>>>,
    next_session: AtomicU64,
    stopping: AtomicBool,
    streams: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
    /// Connection threads running.
    live: AtomicUsize,
    limits: ServiceLimits,
}

/// A running `mooncake_client`.
pub struct StoreService {
    inner: Arc<Inner>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

impl StoreService {
    /// Starts the real client (mounting its segment) and listens for dummies.
    pub fn start(config: &ServiceConfig) -> Result<StoreService> {
        let client = Arc::new(RealClient::setup(&config.client)?);
        client.start_executor();
        let listener = TcpListener::bind((config.host.as_str(), config.port)).map_err(|e| {
            Error::new(
                ErrorCode::ERR_SOCKET,
                format!("listen on {}:{}: {e}", config.host, config.port),
            )
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::new(ErrorCode::ERR_SOCKET, e.to_string()))?;
        let inner = Arc::new(Inner {
            client,
            sessions: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            streams: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            live: AtomicUsize::new(0),
            limits: config.limits,
        });
        let acc = inner.clone();
        let accept = std::thread::Builder::new()
            .name("mooncake-client-accept".into())
            .spawn(move || accept_loop(acc, listener))
            .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, e.to_string()))?;
        tracing::info!(%addr, hostname = %inner.client.hostname(), "store service listening for dummy clients");
        Ok(StoreService {
            inner,
            addr,
            accept: Some(accept),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The real client's engine endpoint (its segment's name).
    pub fn hostname(&self) -> String {
        self.inner.client.hostname()
    }

    /// Stops accepting, disconnects dummies and unmounts the segment.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if self.inner.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the blocking accept.
        let wake = match self.addr {
            SocketAddr::V4(a) if a.ip().is_unspecified() => {
                SocketAddr::from(([127, 0, 0, 1], a.port()))
            }
            SocketAddr::V6(a) if a.ip().is_unspecified() => {
                SocketAddr::from(([0u16, 0, 0, 0, 0, 0, 0, 1], a.port()))
            }
            a => a,
        };
        let _ = TcpStream::connect(wake);
        if let Some(j) = self.accept.take() {
            let _ = j.join();
        }
        for (_, s) in self.inner.streams.lock().drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let _ = self.inner.client.close();
    }
}

impl Drop for StoreService {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Runs the service until `shutdown` resolves (the library form of the
/// `mooncake_client` binary).
pub async fn run(
    config: ServiceConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let service = tokio::task::spawn_blocking(move || StoreService::start(&config))
        .await
        .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, e.to_string()))??;
    shutdown.await;
    tokio::task::spawn_blocking(move || service.stop())
        .await
        .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, e.to_string()))
}

fn accept_loop(inner: Arc<Inner>, listener: TcpListener) {
    for stream in listener.incoming() {
        if inner.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        if inner.live.load(Ordering::SeqCst) >= inner.limits.max_connections {
            tracing::warn!(
                peer = ?stream.peer_addr().ok(),
                max = inner.limits.max_connections,
                "too many dummy connections; closing a new one"
            );
            continue;
        }
        let timeout = Some(inner.limits.frame_timeout);
        let set = stream
            .set_read_timeout(timeout)
            .and_then(|()| stream.set_write_timeout(timeout));
        if set.is_err() {
            continue;
        }
        let _ = stream.set_nodelay(true);
        let id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
        if let Ok(clone) = stream.try_clone() {
            inner.streams.lock().insert(id, clone);
        }
        inner.live.fetch_add(1, Ordering::SeqCst);
        let conn_inner = inner.clone();
        let spawned = std::thread::Builder::new()
            .name("mooncake-client-conn".into())
            .spawn(move || {
                serve(&conn_inner, stream);
                conn_inner.streams.lock().remove(&id);
                conn_inner.live.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            inner.streams.lock().remove(&id);
            inner.live.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn serve(inner: &Inner, stream: TcpStream) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = BufWriter::new(stream);
    let mut session: Option<Arc<Session>> = None;
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let limit = inner.limits.frame_timeout;
    loop {
        if read_frame_within(&mut reader, &mut buf, limit, true).is_err() {
            return; // closed, stalled, or a frame length that cannot be trusted
        }
        let resp = match decode_payload::<DummyRequest>(&buf) {
            Ok(req) => handle(inner, &mut session, req),
            Err(e) => DummyResponse::Unit {
                result: Err(e.into()),
            },
        };
        out.clear();
        if encode_frame(&resp, &mut out).is_err() {
            let e = Error::new(ErrorCode::SERIALIZE_FAIL, "answer exceeds the frame limit");
            out.clear();
            let _ = encode_frame(&DummyResponse::Unit { result: Err(e) }, &mut out);
        }
        if write_frames(&mut writer, &out).is_err() {
            return;
        }
        // Do not keep a huge call's buffers for the life of the connection.
        if buf.capacity() > SHRINK_ABOVE {
            buf = Vec::new();
        }
        if out.capacity() > SHRINK_ABOVE {
            out = Vec::new();
        }
    }
}

fn handle(inner: &Inner, session: &mut Option<Arc<Session>>, req: DummyRequest) -> DummyResponse {
    let client = &inner.client;
    let unit = |result| DummyResponse::Unit { result };
    match req {
        DummyRequest::Hello {
            shm_name,
            region_len,
            pid,
            fd,
        } => match hello(inner, session, pid, fd, &shm_name, region_len) {
            Ok(id) => DummyResponse::Session {
                session: id,
                client_id: client.client_id(),
                hostname: client.hostname(),
            },
            Err(e) => unit(Err(e)),
        },
        DummyRequest::Attach { session: id } => {
            let found = inner.sessions.lock().get(&id).and_then(Weak::upgrade);
            match found {
                Some(s) => {
                    *session = Some(s);
                    DummyResponse::Session {
                        session: id,
                        client_id: client.client_id(),
                        hostname: client.hostname(),
                    }
                }
                None => unit(Err(Error::new(
                    ErrorCode::CLIENT_NOT_FOUND,
                    format!("no dummy session {id}"),
                ))),
            }
        }
        DummyRequest::Health {} => unit(client.health_check()),
        DummyRequest::GetSize { keys } => DummyResponse::Counts {
            result: Ok(Backend::get_size(&**client, &keys)),
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
            let Some(s) = session.as_ref() else {
                return no_session();
            };
            let mut results: Vec<Result<()>> = Vec::with_capacity(items.len());
            let (mut keys, mut payloads, mut owners) = (Vec::new(), Vec::new(), Vec::new());
            for (i, item) in items.into_iter().enumerate() {
                match item
                    .parts
                    .iter()
                    .map(|&p| s.addr(p))
                    .collect::<Result<Vec<_>>>()
                {
                    Ok(parts) => {
                        keys.push(item.key);
                        payloads.push(Payload::Mem(parts));
                        owners.push(i);
                        results.push(Ok(()));
                    }
                    Err(e) => results.push(Err(e)),
                }
            }
            for (r, i) in client
                .write(
                    &keys,
                    payloads,
                    &crate::types::WriteOptions { config, upsert },
                )
                .into_iter()
                .zip(owners)
            {
                results[i] = r;
            }
            DummyResponse::Units {
                result: Ok(results),
            }
        }
        DummyRequest::ReadInto { items } => {
            let Some(s) = session.as_ref() else {
                return no_session();
            };
            let mut results: Vec<Result<u64>> = Vec::with_capacity(items.len());
            let (mut keys, mut dests, mut owners) = (Vec::new(), Vec::new(), Vec::new());
            for (i, item) in items.into_iter().enumerate() {
                match item
                    .dests
                    .iter()
                    .map(|&p| s.addr(p))
                    .collect::<Result<Vec<_>>>()
                {
                    Ok(d) => {
                        keys.push(item.key);
                        dests.push(d);
                        owners.push(i);
                        results.push(Ok(0));
                    }
                    Err(e) => results.push(Err(e)),
                }
            }
            for (r, i) in client.read_into(&keys, &dests).into_iter().zip(owners) {
                results[i] = r;
            }
            DummyResponse::Counts {
                result: Ok(results),
            }
        }
        DummyRequest::ReadRanges { items } => {
            let Some(s) = session.as_ref() else {
                return no_session();
            };
            let mut results: Vec<Result<u64>> = Vec::with_capacity(items.len());
            let (mut reqs, mut owners) = (Vec::new(), Vec::new());
            for (
                i,
                RangeItem {
                    buffer,
                    key,
                    dst_off,
                    src_off,
                    len,
                },
            ) in items.into_iter().enumerate()
            {
                match s.addr(buffer) {
                    Ok((addr, blen)) => {
                        reqs.push(RangeRead {
                            buffer: addr,
                            buffer_len: Some(blen),
                            key,
                            dst_off,
                            src_off,
                            len: len as usize,
                        });
                        owners.push(i);
                        results.push(Ok(0));
                    }
                    Err(e) => results.push(Err(e)),
                }
            }
            for (r, i) in client.read_ranges(&reqs).into_iter().zip(owners) {
                results[i] = r;
            }
            DummyResponse::Counts {
                result: Ok(results),
            }
        }
    }
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
    session: &mut Option<Arc<Session>>,
    pid: u32,
    fd: i32,
    shm_name: &str,
    region_len: u64,
) -> Result<u64> {
    if session.is_some() {
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
    let region = ShmRegion::open(pid, fd, shm_name, len)?;
    inner.client.register_buffer(region.addr(), len)?;
    let s = Arc::new(Session {
        region,
        client: inner.client.clone(),
    });
    let id = inner.next_session.fetch_add(1, Ordering::Relaxed);
    let mut sessions = inner.sessions.lock();
    sessions.retain(|_, w| w.strong_count() > 0);
    sessions.insert(id, Arc::downgrade(&s));
    *session = Some(s);
    Ok(id)
}
