//! TCP: a few long-lived connections per peer, requests pipelined on each.
//!
//! Each connection has a sender thread and a receiver thread. Submitting cuts
//! requests into slices of at most `slice_size` bytes, deals them round-robin
//! over the peer's connections, and hands each connection its share in one
//! message. The sender writes headers and write payloads with `writev`
//! straight from registered memory, after queueing the slices as in flight;
//! the receiver matches responses to that queue in order (same `seq`) and
//! reads read payloads straight into registered memory.
//!
//! A slice always reports exactly once: on success, on an error status, or,
//! if it is dropped unreported (dead connection, engine shutdown), as a
//! socket failure. So no path can leave a task waiting forever.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use mooncake_common::auth::ClusterToken;
use mooncake_common::ErrorCode;
use parking_lot::Mutex;

use crate::batch::{Abort, Task};
use crate::conn::{write_all_parts, FrameReader};
use crate::frame::{Header, Kind, HEADER_LEN, MAX_DATA_FRAME};
use crate::rawmem;
use crate::transport::{OpenSegment, Route, Transport, Work};
use crate::Opcode;

pub(crate) struct TcpTransport {
    peers: Mutex<HashMap<SocketAddr, Arc<Peer>>>,
    conns_per_peer: usize,
    slice_size: usize,
    limits: Limits,
}

/// Bounds on a connection's waits and frames, and what it presents first.
#[derive(Clone)]
pub(crate) struct Limits {
    pub(crate) connect_timeout: Duration,
    /// A write blocked this long (peer not reading) breaks the connection,
    /// so a submitting thread never hangs on a stalled peer.
    pub(crate) write_timeout: Duration,
    /// Largest control payload accepted in a response.
    pub(crate) control_max: u64,
    /// Presented on every new connection (`crate::rpc::present_token`).
    pub(crate) cluster_token: Option<ClusterToken>,
    /// A connection unused for this long is replaced before use: peers
    /// close connections idle for their idle timeout (ours by default, twice
    /// this), and a request must not race that close.
    pub(crate) reuse_within: Duration,
}

impl TcpTransport {
    pub(crate) fn new(conns_per_peer: usize, slice_size: usize, limits: Limits) -> Self {
        TcpTransport {
            peers: Mutex::new(HashMap::new()),
            conns_per_peer: conns_per_peer.max(1),
            slice_size: slice_size.clamp(1, MAX_DATA_FRAME as usize),
            limits,
        }
    }

    fn peer(&self, addr: SocketAddr) -> Arc<Peer> {
        self.peers
            .lock()
            .entry(addr)
            .or_insert_with(|| {
                Arc::new(Peer {
                    addr,
                    slots: (0..self.conns_per_peer).map(|_| Mutex::new(None)).collect(),
                    next: AtomicUsize::new(0),
                    limits: self.limits.clone(),
                })
            })
            .clone()
    }

    /// Closes every connection; in-flight slices fail.
    pub(crate) fn shutdown(&self) {
        let peers: Vec<_> = self.peers.lock().drain().map(|(_, p)| p).collect();
        for p in peers {
            p.abort();
        }
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn route(&self, segment: &OpenSegment) -> Option<Box<dyn Route>> {
        let addr = segment.rpc_addr?;
        Some(Box::new(TcpRoute {
            peer: self.peer(addr),
            slice_size: self.slice_size,
        }))
    }
}

struct TcpRoute {
    peer: Arc<Peer>,
    slice_size: usize,
}

impl Route for TcpRoute {
    fn serves(&self, _remote: u64, _len: usize) -> bool {
        true
    }

    fn submit(&self, work: Vec<Work>) {
        let peer = &self.peer;
        let n = peer.slots.len();
        let mut per_conn: Vec<Vec<Slice>> = (0..n).map(|_| Vec::new()).collect();
        let mut next = peer.next.fetch_add(1, Ordering::Relaxed) % n;
        for w in work {
            // Huge requests get bigger slices rather than millions of them.
            let slice = self
                .slice_size
                .max(w.len.div_ceil(MAX_SLICES_PER_REQUEST))
                .min(MAX_DATA_FRAME as usize);
            let count = w.len.div_ceil(slice);
            w.task.set_abort(peer.clone());
            w.task.expect_slices(count);
            for i in 0..count {
                let off = i * slice;
                let len = slice.min(w.len - off);
                per_conn[next].push(Slice {
                    task: Some(w.task.clone()),
                    op: w.opcode,
                    local: w.local + off,
                    remote: w.remote + off as u64,
                    len,
                    seq: 0,
                });
                next = (next + 1) % n;
            }
        }
        for (i, slices) in per_conn.into_iter().enumerate() {
            if slices.is_empty() {
                continue;
            }
            match peer.conn(i) {
                Ok(c) => c.submit(slices),
                Err(e) => {
                    tracing::warn!("tcp: cannot connect to {}: {e}", peer.addr);
                    drop(slices);
                }
            }
        }
    }
}

/// Bounds the bookkeeping of one request (with 64 KiB slices it only
/// matters past 4 GiB).
const MAX_SLICES_PER_REQUEST: usize = 65536;

/// One slice of a request, owned by exactly one connection at a time.
struct Slice {
    task: Option<Arc<Task>>,
    op: Opcode,
    local: usize,
    remote: u64,
    len: usize,
    seq: u32,
}

impl Slice {
    fn done(mut self, result: Result<usize, ErrorCode>) {
        if let Some(t) = self.task.take() {
            t.slice_done(result);
        }
    }
}

impl Drop for Slice {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.slice_done(Err(ErrorCode::ERR_SOCKET));
        }
    }
}

pub(crate) struct Peer {
    addr: SocketAddr,
    slots: Vec<Mutex<Option<Arc<Conn>>>>,
    next: AtomicUsize,
    limits: Limits,
}

impl Peer {
    /// Connection `i`, (re)connecting if it is missing or broken.
    fn conn(&self, i: usize) -> io::Result<Arc<Conn>> {
        let mut slot = self.slots[i].lock();
        if let Some(c) = slot.as_ref() {
            let fresh = c.used.lock().elapsed() < self.limits.reuse_within || !c.is_quiet();
            if fresh && !c.broken.load(Ordering::Acquire) {
                *c.used.lock() = Instant::now();
                return Ok(c.clone());
            }
        }
        let c = Arc::new(Conn::open(self.addr, &self.limits)?);
        *slot = Some(c.clone());
        Ok(c)
    }
}

impl Abort for Peer {
    fn abort(&self) {
        for slot in &self.slots {
            let c = slot.lock().take();
            drop(c); // Conn::drop shuts the socket down.
        }
    }
}

struct Conn {
    tx: Sender<Vec<Slice>>,
    writer: Arc<Mutex<Writer>>,
    stream: TcpStream,
    broken: Arc<AtomicBool>,
    /// When a submission last took this connection.
    used: Mutex<Instant>,
    inflight: Arc<Mutex<Inflight>>,
}

/// Slices whose requests were (or are being) written, in wire order.
struct Inflight {
    queue: VecDeque<Slice>,
    /// The receiver has stopped: nothing more will be matched.
    dead: bool,
}

/// The write half. Whoever holds it numbers slices, queues them in flight
/// and writes them, so the in-flight queue is always in wire order.
struct Writer {
    stream: TcpStream,
    inflight: Arc<Mutex<Inflight>>,
    seq: u32,
    headers: Vec<[u8; HEADER_LEN]>,
    payloads: Vec<(usize, usize)>,
}

impl Writer {
    /// Writes `batch`. On error the connection is unusable: the caller shuts
    /// it down, and the receiver fails what was queued.
    fn send(&mut self, mut batch: Vec<Slice>) -> io::Result<()> {
        self.headers.clear();
        self.payloads.clear();
        for s in batch.iter_mut() {
            self.seq = self.seq.wrapping_add(1);
            s.seq = self.seq;
            let kind = match s.op {
                Opcode::Write => Kind::WriteReq,
                Opcode::Read => Kind::ReadReq,
            };
            self.headers
                .push(Header::new(kind, self.seq, s.remote, s.len as u64).encode());
            self.payloads.push(if s.op == Opcode::Write {
                (s.local, s.len)
            } else {
                (0, 0)
            });
        }
        {
            // Queue before the bytes leave, so the receiver always finds them.
            let mut q = self.inflight.lock();
            if q.dead {
                return Err(io::ErrorKind::BrokenPipe.into()); // `batch` drops: failures reported
            }
            q.queue.extend(batch);
        }
        let mut parts: Vec<&[u8]> = Vec::with_capacity(self.headers.len() * 2);
        for (h, &(addr, len)) in self.headers.iter().zip(&self.payloads) {
            parts.push(h);
            if len > 0 {
                // SAFETY: the engine checked `addr..addr+len` against the
                // registry at submit; it stays registered while the request runs.
                parts.push(unsafe { rawmem::bytes(addr, len) });
            }
        }
        write_all_parts(&mut self.stream, &parts)
    }
}

/// Submissions at most this large are written by the submitting thread when
/// the connection is free, saving a thread handoff on small requests; larger
/// ones go to the connection's sender thread so `submit` does not block on
/// the socket.
const DIRECT_BYTES: usize = 64 * 1024;

impl Conn {
    fn open(addr: SocketAddr, limits: &Limits) -> io::Result<Conn> {
        let mut stream = TcpStream::connect_timeout(&addr, limits.connect_timeout)?;
        stream.set_nodelay(true)?;
        if let Some(token) = &limits.cluster_token {
            crate::rpc::present_token(&mut stream, token, limits.connect_timeout)?;
        }
        stream.set_write_timeout(Some(limits.write_timeout))?;
        let control_max = limits.control_max;
        let (tx, rx) = crossbeam_channel::unbounded();
        let broken = Arc::new(AtomicBool::new(false));
        let inflight = Arc::new(Mutex::new(Inflight {
            queue: VecDeque::new(),
            dead: false,
        }));
        let writer = Arc::new(Mutex::new(Writer {
            stream: stream.try_clone()?,
            inflight: inflight.clone(),
            seq: 0,
            headers: Vec::new(),
            payloads: Vec::new(),
        }));
        let (w, b1) = (writer.clone(), broken.clone());
        let (r, b2, q) = (stream.try_clone()?, broken.clone(), inflight.clone());
        thread::Builder::new()
            .name("mc-tcp-send".into())
            .spawn(move || send_loop(rx, w, b1))?;
        thread::Builder::new()
            .name("mc-tcp-recv".into())
            .spawn(move || recv_loop(r, q, b2, control_max))?;
        Ok(Conn {
            tx,
            writer,
            stream,
            broken,
            used: Mutex::new(Instant::now()),
            inflight,
        })
    }

    /// Hands `slices` to the connection: written right here if small and the
    /// writer is free, else queued for the sender thread.
    fn submit(&self, slices: Vec<Slice>) {
        let bytes: usize = slices
            .iter()
            .map(|s| if s.op == Opcode::Write { s.len } else { 0 })
            .sum();
        if bytes <= DIRECT_BYTES {
            if let Some(mut w) = self.writer.try_lock() {
                if let Err(e) = w.send(slices) {
                    tracing::debug!("tcp send: {e}");
                    self.close();
                }
                return;
            }
        }
        // A send error hands the slices back; dropping them reports failure.
        drop(self.tx.send(slices));
    }

    /// Nothing queued or in flight: replacing it loses nothing.
    fn is_quiet(&self) -> bool {
        self.tx.is_empty() && self.inflight.lock().queue.is_empty()
    }

    fn close(&self) {
        self.broken.store(true, Ordering::Release);
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close();
    }
}

fn send_loop(rx: Receiver<Vec<Slice>>, writer: Arc<Mutex<Writer>>, broken: Arc<AtomicBool>) {
    while let Ok(mut batch) = rx.recv() {
        while batch.len() < 512 {
            match rx.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        let mut w = writer.lock();
        if let Err(e) = w.send(batch) {
            tracing::debug!("tcp send: {e}");
            // Stop the receiver too; it fails whatever is still in flight.
            broken.store(true, Ordering::Release);
            let _ = w.stream.shutdown(Shutdown::Both);
            break;
        }
    }
    // Anything still queued (or queued later) drops and reports failure.
}

fn recv_loop(
    mut stream: TcpStream,
    inflight: Arc<Mutex<Inflight>>,
    broken: Arc<AtomicBool>,
    control_max: u64,
) {
    if let Err(e) = recv_responses(&mut stream, &inflight, control_max) {
        tracing::debug!("tcp recv: {e}");
    }
    broken.store(true, Ordering::Release);
    let _ = stream.shutdown(Shutdown::Both);
    let rest = {
        let mut q = inflight.lock();
        q.dead = true;
        std::mem::take(&mut q.queue)
    };
    drop(rest); // each slice reports a socket failure
}

fn protocol_error(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn recv_responses(
    stream: &mut TcpStream,
    inflight: &Mutex<Inflight>,
    control_max: u64,
) -> io::Result<()> {
    let mut input = FrameReader::new();
    loop {
        let Some(hdr) = input.read_header(stream, || true)? else {
            return Err(io::ErrorKind::UnexpectedEof.into());
        };
        let h = Header::decode_response(&hdr, control_max)
            .map_err(|e| protocol_error(e.to_string()))?;
        let slice = inflight
            .lock()
            .queue
            .pop_front()
            .ok_or_else(|| protocol_error("unsolicited response".into()))?;
        if h.seq != slice.seq {
            return Err(protocol_error(format!(
                "response seq {} for request {}",
                h.seq, slice.seq
            )));
        }
        let status = || Err(ErrorCode::from_wire(h.status).unwrap_or(ErrorCode::INTERNAL_ERROR));
        match (h.kind, slice.op) {
            (Kind::WriteAck, Opcode::Write) if h.status == 0 => {
                let n = slice.len;
                slice.done(Ok(n))
            }
            (Kind::WriteAck, Opcode::Write) => slice.done(status()),
            (Kind::ReadResp, Opcode::Read) if h.status != 0 => slice.done(status()),
            (Kind::ReadResp, Opcode::Read) => {
                if h.len != slice.len as u64 {
                    return Err(protocol_error(format!(
                        "read response of {} bytes for {}",
                        h.len, slice.len
                    )));
                }
                let landing = slice.task.as_ref().and_then(|t| t.begin_landing());
                if landing.is_some() {
                    // SAFETY: checked against the registry at submit. The
                    // landing keeps the task from reporting a timeout until
                    // this read ends (an abort shuts the socket, ending it),
                    // so bytes never land in memory the application released.
                    input
                        .read_into(stream, unsafe { rawmem::bytes_mut(slice.local, slice.len) })?;
                } else {
                    input.skip(stream, h.len)?;
                }
                drop(landing);
                let n = slice.len;
                slice.done(Ok(n));
            }
            (kind, op) => return Err(protocol_error(format!("{kind:?} in answer to {op:?}"))),
        }
    }
}
