//! The engine's listening port: peers' data frames (reads and writes of our
//! registered memory), descriptor handshakes (P2P mode) and notifies all
//! arrive here. One thread per connection, blocking sockets; frames on a
//! connection are served in order.
//!
//! Also the initiator side of the control frames ([`fetch_descriptor`],
//! [`send_notify`]), each on a short-lived connection.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use mooncake_common::auth::{self, ClusterToken};
use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Mutex, RwLock};

use crate::conn::{is_timeout, read_header, write_all_parts, write_all_parts_paced, FrameReader};
use crate::frame::{decode_notify, encode_notify, Header, Kind, HEADER_LEN};
use crate::idle::IdleMark;
use crate::memory::{PinGuard, Registry};
use crate::rawmem;
use crate::segment::{local_host_id, SegmentDesc};
use crate::Notify;

/// What the listener needs from the engine.
pub(crate) struct LocalState {
    pub(crate) name: String,
    pub(crate) protocol: String,
    pub(crate) rpc_port: u16,
    /// Published so same-host peers may map our shared buffers (None with force_tcp).
    pub(crate) host_id: Option<String>,
    /// Published as the descriptor's `devices` (set by a multi-path
    /// engine layered on this one: its other endpoints).
    pub(crate) devices: RwLock<Vec<serde_json::Value>>,
    pub(crate) registry: RwLock<Registry>,
    pub(crate) notifies: Mutex<NotifyQueue>,
    pub(crate) control_max: u64,
    /// Bounds how long a peer may stall in the middle of a frame (each
    /// socket call); a frame's header, and then its payload, are each cut
    /// off after twice this.
    pub(crate) io_timeout: Duration,
    /// Required of every connection before anything else ([`admit`]).
    pub(crate) cluster_token: Option<ClusterToken>,
    /// Longest a connection may stay silent between frames.
    pub(crate) idle_timeout: Duration,
}

/// Most notifies held until the application drains them, and most bytes
/// (names + messages) they may hold together.
pub(crate) const MAX_QUEUED_NOTIFIES: usize = 64 * 1024;
pub(crate) const MAX_QUEUED_NOTIFY_BYTES: usize = 64 << 20;

/// Notifies received and not yet drained, bounded so that peers (or an
/// application that never calls `get_notifies`) cannot grow it without
/// limit. When full, a new notify is refused (`ERR_TOO_MANY_REQUESTS`, which
/// its sender sees) rather than dropping one already acknowledged.
#[derive(Default)]
pub(crate) struct NotifyQueue {
    queue: Vec<Notify>,
    bytes: usize,
}

impl NotifyQueue {
    pub(crate) fn push(&mut self, notify: Notify) -> Result<(), ErrorCode> {
        let size = notify.name.len() + notify.msg.len();
        if self.queue.len() >= MAX_QUEUED_NOTIFIES || self.bytes + size > MAX_QUEUED_NOTIFY_BYTES {
            return Err(ErrorCode::ERR_TOO_MANY_REQUESTS);
        }
        self.bytes += size;
        self.queue.push(notify);
        Ok(())
    }

    pub(crate) fn drain(&mut self) -> Vec<Notify> {
        self.bytes = 0;
        std::mem::take(&mut self.queue)
    }
}

impl LocalState {
    pub(crate) fn descriptor(&self) -> SegmentDesc {
        SegmentDesc {
            name: self.name.clone(),
            protocol: self.protocol.clone(),
            devices: self.devices.read().clone(),
            buffers: self.registry.read().buffers(),
            tcp_data_port: Some(self.rpc_port),
            host_id: self.host_id.clone(),
        }
    }
}

/// Binds the RPC listener: the given port, or a free one in `range`.
pub(crate) fn bind(host: &str, port: Option<u16>, range: (u16, u16)) -> Result<TcpListener> {
    let bind_err =
        |e: io::Error, what: String| Error::new(ErrorCode::ERR_SOCKET, format!("bind {what}: {e}"));
    if let Some(p) = port {
        return TcpListener::bind((host, p)).map_err(|e| bind_err(e, format!("{host}:{p}")));
    }
    let (lo, hi) = (range.0.min(range.1), range.0.max(range.1));
    let span = u32::from(hi - lo).max(1);
    let start = rand::random::<u32>() % span;
    for i in 0..span {
        let p = lo + ((start + i) % span) as u16;
        match TcpListener::bind((host, p)) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(bind_err(e, format!("{host}:{p}"))),
        }
    }
    Err(Error::new(
        ErrorCode::ERR_SOCKET,
        format!("no free port in {lo}..{hi}"),
    ))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Cuts off a peer that trickles a frame: checked before every socket call
/// of the frame, on top of the socket's per-call timeout, so a frame takes at
/// most twice the I/O timeout however slowly its bytes come. (Checking beats
/// re-arming the socket timeout: no extra syscall per read.) The clock starts
/// at the first check, so frames already buffered never read it.
struct FrameDeadline {
    timeout: Duration,
    at: Option<Instant>,
}

impl FrameDeadline {
    fn start(timeout: Duration) -> FrameDeadline {
        FrameDeadline { timeout, at: None }
    }

    fn check(&mut self) -> io::Result<()> {
        let now = Instant::now();
        if now > *self.at.get_or_insert(now + self.timeout) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "peer too slow: frame not done within the I/O timeout",
            ));
        }
        Ok(())
    }
}

/// Responses waiting to be written in one `writev`: acks, errors, and read
/// data still in registered memory.
#[derive(Default)]
struct Responses {
    heads: Vec<[u8; HEADER_LEN]>,
    /// `(addr, len)` of each response's body in registered memory; `len` 0: none.
    bodies: Vec<(usize, usize)>,
    /// Keep the bodies' regions registered until they are written.
    pins: Vec<PinGuard>,
    bytes: usize,
}

impl Responses {
    /// Queues a response without a body.
    fn push(&mut self, head: Header) {
        self.heads.push(head.encode());
        self.bodies.push((0, 0));
        self.bytes += HEADER_LEN;
    }

    /// Queues a response whose body is `[addr, addr+len)`, which `pin`
    /// proves to lie in registered memory (`None`: the last pin queued
    /// covers it, see [`Self::last_pin_covers`]).
    fn push_body(&mut self, head: Header, addr: usize, len: usize, pin: Option<PinGuard>) {
        self.heads.push(head.encode());
        self.bodies.push((addr, len));
        self.pins.extend(pin);
        self.bytes += HEADER_LEN + len;
    }

    fn last_pin_covers(&self, addr: u64, len: u64) -> bool {
        self.pins.last().is_some_and(|p| p.covers(addr, len))
    }

    /// Enough queued that the initiator should get it now.
    fn is_full(&self) -> bool {
        self.heads.len() >= 256 || self.bytes >= 4 << 20
    }

    /// Holds registered memory (read data) until flushed.
    fn holds_memory(&self) -> bool {
        !self.pins.is_empty()
    }

    /// Writes everything queued, cut off like a frame if the peer reads too
    /// slowly; then releases the pins.
    fn flush(&mut self, w: &mut impl Write, timeout: Duration) -> io::Result<()> {
        if self.heads.is_empty() {
            return Ok(());
        }
        let mut parts: Vec<&[u8]> = Vec::with_capacity(self.heads.len() * 2);
        for (head, &(addr, len)) in self.heads.iter().zip(&self.bodies) {
            parts.push(head);
            if len > 0 {
                // SAFETY: `push_body` was given (or found) a pin on the
                // registered region holding this range; pins are released
                // only below, after writing.
                parts.push(unsafe { rawmem::bytes(addr, len) });
            }
        }
        let mut deadline = FrameDeadline::start(timeout);
        let written = write_all_parts_paced(w, &parts, || deadline.check());
        self.heads.clear();
        self.bodies.clear();
        self.pins.clear();
        self.bytes = 0;
        written
    }
}

/// Serves one connection until it closes or breaks the protocol.
///
/// Frames are handled in order. Responses are queued and written together
/// when no further request is already buffered (or the queue is full), so a
/// pipelined batch gets its acks and read data in a few large writes.
///
/// No registry lock is held across socket I/O: a data frame pins the region
/// it touches (checked under a short read lock), and the pin is released
/// once its payload is read or its read data written. The frames of a burst
/// into one region share one pin (no registry lookup per frame); it is let
/// go before blocking on anything that is not that frame's own payload. Each
/// frame is cut off after at most twice the I/O timeout (see
/// [`FrameDeadline`]), and read data is flushed before blocking on a write's
/// payload, so an unregister waits for a slow peer at most about that long
/// (and nobody else waits at all).
///
/// Between frames the connection is marked idle (the listener may shed it)
/// and closed after the idle timeout.
pub(crate) fn serve(
    mut stream: &TcpStream,
    state: &LocalState,
    idle: &IdleMark,
    stop: &dyn Fn() -> bool,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let timeout = state.io_timeout;
    let mut authenticated = state.cluster_token.is_none();
    // Reads wake at least this often, so that the idle limit is checked.
    let wake = timeout
        .min(state.idle_timeout)
        .max(Duration::from_millis(10));
    stream.set_read_timeout(Some(wake))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut input = FrameReader::new();
    let mut out = Responses::default();
    // The region the last write landed in, for the next frames of a burst.
    let mut write_pin: Option<PinGuard> = None;
    loop {
        if !input.has_header() {
            write_pin = None; // about to wait for the peer
            out.flush(&mut stream, timeout)?;
        } else if out.is_full() {
            out.flush(&mut stream, timeout)?;
        }
        let waiting = !input.has_header();
        if waiting {
            idle.idle();
        }
        let since = Instant::now();
        let keep_waiting = || !stop() && since.elapsed() < state.idle_timeout;
        let mut deadline = FrameDeadline::start(timeout);
        let next = input.read_header_paced(&mut stream, keep_waiting, &mut || deadline.check());
        if waiting {
            idle.busy();
        }
        let Some(hdr) = next? else {
            return Ok(());
        };
        // Malformed or oversized: close the connection without reading on.
        let h =
            Header::decode_request(&hdr, state.control_max).map_err(|e| invalid(e.to_string()))?;
        if !authenticated && h.kind != Kind::AuthReq {
            out.flush(&mut stream, timeout)?;
            return refuse_unauthenticated(&mut stream, &h);
        }
        match h.kind {
            Kind::WriteReq => {
                if out.holds_memory() && !input.has(h.len) {
                    // Do not keep read data's regions pinned while waiting
                    // on this payload.
                    out.flush(&mut stream, timeout)?;
                }
                let mut deadline = FrameDeadline::start(timeout);
                let mut pace = || deadline.check();
                let covered = write_pin.as_ref().is_some_and(|p| p.covers(h.addr, h.len));
                let pinned = if covered {
                    Ok(())
                } else {
                    write_pin = None;
                    let pin = state.registry.read().pin_remote(h.addr, h.len);
                    pin.map(|p| write_pin = Some(p))
                };
                let status = match pinned {
                    Ok(()) => {
                        // SAFETY: the range lies inside registered, remote-
                        // accessible memory, kept registered by `write_pin`.
                        let dst = unsafe { rawmem::bytes_mut(h.addr as usize, h.len as usize) };
                        input.read_into_paced(&mut stream, dst, &mut pace)?;
                        0
                    }
                    Err(code) => {
                        input.skip_paced(&mut stream, h.len, &mut pace)?;
                        code.wire()
                    }
                };
                out.push(Header::response(Kind::WriteAck, &h, status, 0));
            }
            Kind::ReadReq => {
                let pinned = if out.last_pin_covers(h.addr, h.len) {
                    Ok(None)
                } else {
                    state.registry.read().pin_remote(h.addr, h.len).map(Some)
                };
                match pinned {
                    Ok(pin) => out.push_body(
                        Header::response(Kind::ReadResp, &h, 0, h.len),
                        h.addr as usize,
                        h.len as usize,
                        pin,
                    ),
                    Err(code) => out.push(Header::response(Kind::ReadResp, &h, code.wire(), 0)),
                }
            }
            Kind::DescReq | Kind::NotifyReq => {
                // Control frames are rare: answer them on their own.
                write_pin = None;
                out.flush(&mut stream, timeout)?;
                let mut deadline = FrameDeadline::start(timeout);
                let len = h.len as usize;
                let payload = input.read_vec_paced(&mut stream, len, &mut || deadline.check())?;
                control(&mut stream, state, &h, &payload)?;
            }
            Kind::AuthReq => {
                write_pin = None;
                out.flush(&mut stream, timeout)?;
                let mut deadline = FrameDeadline::start(timeout);
                let token =
                    input.read_vec_paced(&mut stream, h.len as usize, &mut || deadline.check())?;
                authenticated = admit(&mut stream, state, &h, &token)?;
            }
            Kind::WriteAck | Kind::ReadResp | Kind::DescResp | Kind::NotifyAck | Kind::AuthAck => {
                unreachable!("decode_request admits requests only")
            }
        }
    }
}

/// Answers an `AuthReq`: whether `token` is the cluster token (anything is,
/// when none is configured). A wrong token is answered, then the
/// connection closes.
fn admit(
    stream: &mut impl Write,
    state: &LocalState,
    h: &Header,
    token: &[u8],
) -> io::Result<bool> {
    if auth::admits(state.cluster_token.as_ref(), token) {
        stream.write_all(&Header::response(Kind::AuthAck, h, 0, 0).encode())?;
        return Ok(true);
    }
    let code = ErrorCode::ERR_REJECT_HANDSHAKE.wire();
    stream.write_all(&Header::response(Kind::AuthAck, h, code, 0).encode())?;
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        "wrong cluster token",
    ))
}

/// Answers a first frame that is not an `AuthReq` (a token is required)
/// with `ERR_REJECT_HANDSHAKE`, then closes the connection: no byte of
/// memory is read or written, and nothing is described.
fn refuse_unauthenticated(stream: &mut impl Write, h: &Header) -> io::Result<()> {
    let kind = match h.kind {
        Kind::WriteReq => Kind::WriteAck,
        Kind::ReadReq => Kind::ReadResp,
        Kind::DescReq => Kind::DescResp,
        _ => Kind::NotifyAck,
    };
    let code = ErrorCode::ERR_REJECT_HANDSHAKE.wire();
    let _ = stream.write_all(&Header::response(kind, h, code, 0).encode());
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{:?} before the cluster token", h.kind),
    ))
}

/// Presents `token` on a new connection to an engine and waits for its
/// answer: the first exchange of every connection when a cluster token
/// is configured.
pub(crate) fn present_token(
    stream: &mut TcpStream,
    token: &ClusterToken,
    timeout: Duration,
) -> io::Result<()> {
    let restore = stream.read_timeout()?;
    stream.set_read_timeout(Some(timeout))?;
    let t = token.as_str().as_bytes();
    let head = Header::new(Kind::AuthReq, 0, 0, t.len() as u64).encode();
    write_all_parts(stream, &[&head, t])?;
    let mut hdr = [0u8; HEADER_LEN];
    if !read_header(stream, &mut hdr, || false)? {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let h = Header::decode_response(&hdr, 0).map_err(|e| invalid(e.to_string()))?;
    if h.kind != Kind::AuthAck || h.status != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the peer refused the cluster token ({:?} status {})",
                h.kind, h.status
            ),
        ));
    }
    stream.set_read_timeout(restore)
}

/// Answers a descriptor request or a notify.
fn control(
    stream: &mut impl Write,
    state: &LocalState,
    h: &Header,
    payload: &[u8],
) -> io::Result<()> {
    if h.kind == Kind::DescReq {
        let json = state.descriptor().to_json();
        if json.len() as u64 > state.control_max {
            let code = ErrorCode::ERR_REJECT_HANDSHAKE.wire();
            return stream.write_all(&Header::response(Kind::DescResp, h, code, 0).encode());
        }
        let head = Header::response(Kind::DescResp, h, 0, json.len() as u64).encode();
        return write_all_parts(stream, &[&head, &json]);
    }
    let status = match decode_notify(payload) {
        Some((name, msg)) => match state.notifies.lock().push(Notify { name, msg }) {
            Ok(()) => 0,
            Err(code) => code.wire(),
        },
        None => ErrorCode::ERR_INVALID_ARGUMENT.wire(),
    };
    stream.write_all(&Header::response(Kind::NotifyAck, h, status, 0).encode())
}

/// Resolves `host:port` (the host may be a name) to a socket address.
pub(crate) fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let mut addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::new(ErrorCode::ERR_DNS, format!("cannot resolve {host}: {e}")))?
        .collect();
    addrs.sort_by_key(|a| !a.is_ipv4()); // prefer IPv4, as the reference does
    addrs
        .into_iter()
        .next()
        .ok_or_else(|| Error::new(ErrorCode::ERR_DNS, format!("no address for {host}")))
}

/// One request/response exchange on a fresh connection.
fn call(
    addr: SocketAddr,
    kind: Kind,
    payload: &[u8],
    timeout: Duration,
    local: &LocalState,
) -> io::Result<(Header, Vec<u8>)> {
    let control_max = local.control_max;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    if let Some(token) = &local.cluster_token {
        present_token(&mut stream, token, timeout)?;
    }
    let head = Header::new(kind, 1, 0, payload.len() as u64).encode();
    write_all_parts(&mut stream, &[&head, payload])?;
    let mut hdr = [0u8; HEADER_LEN];
    if !read_header(&mut stream, &mut hdr, || false)? {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let h = Header::decode_response(&hdr, control_max).map_err(|e| invalid(e.to_string()))?;
    if h.seq != 1 {
        return Err(invalid(format!("response seq {}", h.seq)));
    }
    let mut body = vec![0u8; h.payload_len() as usize];
    stream.read_exact(&mut body)?;
    Ok((h, body))
}

/// P2P handshake: asks the engine at `addr` for its segment descriptor.
pub(crate) fn fetch_descriptor(
    addr: SocketAddr,
    name: &str,
    timeout: Duration,
    local: &LocalState,
) -> Result<SegmentDesc> {
    let (h, body) = call(addr, Kind::DescReq, name.as_bytes(), timeout, local).map_err(|e| {
        let code = if is_timeout(&e) {
            ErrorCode::ERR_REJECT_HANDSHAKE
        } else {
            ErrorCode::ERR_METADATA
        };
        Error::new(code, format!("handshake with {name} ({addr}): {e}"))
    })?;
    if h.kind != Kind::DescResp || h.status != 0 {
        return Err(Error::new(
            ErrorCode::ERR_REJECT_HANDSHAKE,
            format!(
                "{name} ({addr}) refused the handshake: {:?} status {}",
                h.kind, h.status
            ),
        ));
    }
    SegmentDesc::from_json(&body)
}

/// Delivers a notify to the engine at `addr`.
pub(crate) fn send_notify(
    addr: SocketAddr,
    notify: &Notify,
    timeout: Duration,
    local: &LocalState,
) -> Result<()> {
    let payload = encode_notify(&notify.name, &notify.msg);
    if payload.len() as u64 > local.control_max {
        return Err(Error::new(
            ErrorCode::ERR_INVALID_ARGUMENT,
            "notify longer than MC_HANDSHAKE_MAX_LENGTH",
        ));
    }
    let (h, _) = call(addr, Kind::NotifyReq, &payload, timeout, local)
        .map_err(|e| Error::new(ErrorCode::ERR_SOCKET, format!("notify to {addr}: {e}")))?;
    if h.kind != Kind::NotifyAck || h.status != 0 {
        return Err(Error::new(
            ErrorCode::from_wire(h.status).unwrap_or(ErrorCode::INTERNAL_ERROR),
            format!("notify refused by {addr}"),
        ));
    }
    Ok(())
}

/// Host id to publish: none when the engine must never use shared memory.
pub(crate) fn published_host_id(force_tcp: bool) -> Option<String> {
    (!force_tcp).then(local_host_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notify(name: &str, len: usize) -> Notify {
        Notify {
            name: name.into(),
            msg: "x".repeat(len),
        }
    }

    #[test]
    fn notify_queue_is_bounded_by_count_and_bytes() {
        let mut q = NotifyQueue::default();
        for _ in 0..MAX_QUEUED_NOTIFIES {
            q.push(notify("", 0)).unwrap();
        }
        assert_eq!(q.push(notify("", 0)), Err(ErrorCode::ERR_TOO_MANY_REQUESTS));
        assert_eq!(q.drain().len(), MAX_QUEUED_NOTIFIES);

        let big = MAX_QUEUED_NOTIFY_BYTES / 4;
        for _ in 0..4 {
            q.push(notify("", big)).unwrap();
        }
        assert_eq!(
            q.push(notify("a", 0)),
            Err(ErrorCode::ERR_TOO_MANY_REQUESTS)
        );
        assert_eq!(q.drain().len(), 4);
        // Drained: room again, and what was refused is not there.
        q.push(notify("a", 3)).unwrap();
        assert_eq!(q.drain(), vec![notify("a", 3)]);
        assert!(q.drain().is_empty());
    }
}
