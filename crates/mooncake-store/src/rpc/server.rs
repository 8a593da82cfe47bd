//! The server loop of a framed-RPC protocol.
//!
//! One thread accepts; each connection is served on a thread of its own,
//! blocking on its socket: a request frame in, the [`Handler`]'s answer
//! frame out, inline. A blocking read wakes exactly the thread that answers,
//! which saves a reactor's readiness round (a failed read, `epoll_wait`, a
//! task wake-up): about a third of a loopback round trip. Connections are
//! long-lived and few per client, so threads stay few.
//!
//! What every connection gets, whatever the protocol:
//! - a cap on connections served at once ([`ServerOptions::max_connections`]);
//!   past it a connection the protocol calls evictable (one that has not
//!   identified itself, [`Handler::evictable`]) is closed to make room, or
//!   else the new one waits in the accept queue or is closed ([`WhenFull`]);
//!   refusals are logged at most once per [`REFUSAL_LOG_EVERY`]; the cap is
//!   lowered to a quarter of the open-file limit when that is smaller, and a
//!   process out of file descriptors all the same sheds an evictable
//!   connection the way a full server does;
//! - an optional idle limit between frames (per connection state,
//!   [`Handler::idle_limit`]), and a deadline for a started frame
//!   ([`ServerOptions::frame_timeout`]), which also bounds how long an
//!   answer may wait to be taken;
//! - malformed frames answered with the protocol's error: a bad length
//!   closes the connection after the answer (the stream cannot be trusted),
//!   an undecodable payload does not (the framing is intact);
//! - frame buffers shrunk after a large call;
//! - a polling window before blocking for the next call ([`super::poll`]).

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, LogLimit};
use parking_lot::{Condvar, Mutex};

use super::poll::AdaptiveWindow;
use super::stream::{Listener, Peer, Stream};
use crate::proto::frame::{decode_payload, encode_frame, read_frame_within};
use crate::proto::wire::{Decode, Encode};

/// A protocol as the server loop sees it: how a request decodes, what it is
/// answered, and how an error travels.
pub trait Handler: Send + Sync + 'static {
    type Request<'a>: Decode<'a>;
    type Response: Encode;
    /// What a connection remembers between its calls.
    type Session: Send;
    /// Code of the error sent instead of an answer over the frame limit.
    const OVERSIZED_ANSWER: ErrorCode;

    /// A new connection's state; `peer` tells who is at the other end.
    fn session(&self, peer: &Peer) -> Self::Session;
    /// How long a connection in state `session` may stay silent between
    /// calls; `configured` is [`ServerOptions::idle_timeout`].
    fn idle_limit(
        &self,
        _session: &Self::Session,
        configured: Option<Duration>,
    ) -> Option<Duration> {
        configured
    }
    /// Whether a connection in state `session` may be closed to make room
    /// for a new one when the server is full.
    fn evictable(&self, _session: &Self::Session) -> bool {
        false
    }
    /// Answers one call, on the connection's thread.
    fn handle(&self, session: &mut Self::Session, req: Self::Request<'_>) -> Self::Response;
    /// An answer carrying only `error`: for frames that cannot be read.
    fn failure(&self, error: Error) -> Self::Response;
    /// Counts a malformed frame (metrics); called once for each.
    fn observe_malformed(&self) {}
}

/// What happens to a connection that arrives when the cap is reached and
/// no connection is evictable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenFull {
    /// It waits in the listener's accept queue until a connection closes
    /// (one that slips past the check is closed, and logged).
    Wait,
}

/// The limits and socket policy of one server.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Names the connection threads and the log lines.
    pub name: &'static str,
    /// Connections served at once (one thread each).
    pub max_connections: usize,
    pub when_full: WhenFull,
    /// Longest a connection may stay silent between calls (`None`: forever).
    pub idle_timeout: Option<Duration>,
    /// Longest a call may take to arrive once its first byte has, and an
    /// answer to be taken (the idle limit when that is shorter).
    pub frame_timeout: Duration,
    pub nodelay: bool,
    /// Read buffer per connection: a typical request arrives in one read.
    pub read_buffer: usize,
    /// Base polling window for a connection's next call (zero: block at
    /// once); it adapts per connection, see [`AdaptiveWindow`].
    pub poll: Duration,
    /// Stack of a connection thread (`None`: the platform's default).
    pub stack_size: Option<usize>,
}

/// Stack of a connection thread for a protocol whose calls need little
/// (the master's, the dummy service's): a thousand idle connections then
/// reserve a quarter of what the platform's default stacks would.
pub const CONNECTION_STACK: usize = 256 << 10;

/// Frame buffers larger than this are dropped after use.
const SHRINK_ABOVE: usize = 1 << 20;
/// Pause after a failed accept (out of file descriptors and the like)
/// instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How often a full server waiting for a slot looks for an evictable
/// connection again.
const EVICT_RECHECK: Duration = Duration::from_millis(100);

/// How long a stop waits for the answers of calls being handled to go out.
const STOP_ANSWER_GRACE: Duration = Duration::from_secs(2);

/// Connections held for a slot are logged at most this often (with a
/// count).
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// One served connection, as the accept loop sees it.
struct Open {
    /// A handle on its socket, to close it.
    socket: Box<dyn Shut>,
    /// Set by its thread between calls when the protocol says so.
    evictable: Arc<AtomicBool>,
}

/// The connections being served, so that a stopping server can close their
/// sockets (ending each thread's blocking read) and wait for them.
#[derive(Default)]
struct Connections {
    next_id: u64,
    open: HashMap<u64, Open>,
    threads: Vec<JoinHandle<()>>,
}

impl Connections {
    fn any_evictable(&self) -> bool {
        self.open
            .values()
            .any(|c| c.evictable.load(Ordering::Relaxed))
    }

    /// Closes the oldest evictable connection; whether there was one.
    fn evict_one(&mut self) -> bool {
        let victim = self
            .open
            .iter()
            .filter(|(_, c)| c.evictable.load(Ordering::Relaxed))
            .map(|(&id, _)| id)
            .min();
        let Some(id) = victim.and_then(|id| self.open.remove(&id)) else {
            return false;
        };
        id.socket.shut();
        true
    }
}

/// Closing a served connection from the accept loop or at stop.
trait Shut: Send {
    fn shut(&self);
    fn shut_read(&self);
}

impl<S: Stream> Shut for S {
    fn shut(&self) {
        let _ = Stream::shutdown(self);
    }
    fn shut_read(&self) {
        let _ = Stream::shutdown_read(self);
    }
}

struct Registry {
    stopping: AtomicBool,
    conns: Mutex<Connections>,
    /// Signalled when a connection ends (a slot frees) and at stop.
    freed: Condvar,
}

/// A running server on a listener of address type `A` (TCP by default);
/// dropping it stops it.
pub struct Server<A = SocketAddr> {
    addr: A,
    /// A handle on the listening socket, to wake the blocked accept at stop.
    listener: OwnedFd,
    registry: Arc<Registry>,
    accept: Option<JoinHandle<()>>,
}

impl<A: Clone + std::fmt::Debug + Send + 'static> Server<A> {
    /// Serves `listener` (blocking mode is set here) until stopped.
    pub fn start<L: Listener<Addr = A>, H: Handler>(
        listener: L,
        handler: Arc<H>,
        opts: ServerOptions,
    ) -> io::Result<Server<A>> {
        listener.set_nonblocking(false)?;
        let addr = listener.local_addr()?;
        let waker = listener.as_fd().try_clone_to_owned()?;
        let registry = Arc::new(Registry {
            stopping: AtomicBool::new(false),
            conns: Mutex::new(Connections::default()),
            freed: Condvar::new(),
        });
        let reg = registry.clone();
        let accept = std::thread::Builder::new()
            .name(format!("{}-accept", opts.name))
            .spawn(move || accept_loop(listener, &reg, &handler, &opts))?;
        Ok(Server {
            addr,
            listener: waker,
            registry,
            accept: Some(accept),
        })
    }

    pub fn local_addr(&self) -> A {
        self.addr.clone()
    }
}

impl<A> Server<A> {
    /// Stops accepting, closes every connection (a call being handled is
    /// answered first) and waits for their threads.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        self.registry.stopping.store(true, Ordering::SeqCst);
        {
            // Under the lock, so an accept loop waiting for a slot sees it.
            let _c = self.registry.conns.lock();
            self.registry.freed.notify_all();
        }
        // On Linux, shutting a listening socket down wakes a blocked
        // accept (EINVAL) and refuses further connections.
        // SAFETY: a valid socket fd owned by `self.listener`.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        let _ = accept.join();
        let threads = {
            let mut c = self.registry.conns.lock();
            // Reads end first: a call being handled still sends its answer
            // (closing both ways would drop it, and the client, taking the
            // close for a stale connection, would send the call again
            // though it was carried out). A peer that does not take its
            // answer holds the stop up for STOP_ANSWER_GRACE at most.
            for s in c.open.values() {
                s.socket.shut_read();
            }
            let deadline = Instant::now() + STOP_ANSWER_GRACE;
            while !c.open.is_empty()
                && !self.registry.freed.wait_until(&mut c, deadline).timed_out()
            {}
            for s in c.open.values() {
                s.socket.shut();
            }
            std::mem::take(&mut c.threads)
        };
        for t in threads {
            let _ = t.join();
        }
    }
}

impl<A> Drop for Server<A> {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn accept_loop<L: Listener, H: Handler>(
    listener: L,
    reg: &Arc<Registry>,
    handler: &Arc<H>,
    opts: &ServerOptions,
) {
    let stopping = || reg.stopping.load(Ordering::SeqCst);
    let refusals = LogLimit::new(REFUSAL_LOG_EVERY);
    let cap = descriptor_cap(descriptor_limit());
    let opts = &if cap < opts.max_connections {
        tracing::info!(
            server = opts.name,
            configured = opts.max_connections,
            cap,
            "connections capped by the open-file limit (RLIMIT_NOFILE)"
        );
        ServerOptions {
            max_connections: cap,
            ..opts.clone()
        }
    } else {
        opts.clone()
    };
    loop {
        if opts.when_full == WhenFull::Wait {
            // Accept only when a slot is free or can be made by eviction
            // (timed: a connection becoming evictable signals nothing).
            let mut c = reg.conns.lock();
            while c.open.len() >= opts.max_connections && !stopping() && !c.any_evictable() {
                reg.freed.wait_for(&mut c, EVICT_RECHECK);
            }
        }
        if stopping() {
            return;
        }
        let (stream, peer) = match listener.accept() {
            Ok(a) => a,
            Err(_) if stopping() => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if out_of_descriptors(&e) => {
                shed_for_descriptors(reg, &refusals, opts);
                continue;
            }
            Err(e) => {
                tracing::warn!(server = opts.name, "accept failed: {e}");
                std::thread::sleep(ACCEPT_BACKOFF);
                continue;
            }
        };
        // Make room: evict, or hold the new connection until a slot frees.
        {
            let mut c = reg.conns.lock();
            let mut counted = false;
            while c.open.len() >= opts.max_connections && !stopping() && !c.evict_one() {
                let first = !std::mem::replace(&mut counted, true);
                if let Some(suppressed) = first.then(|| refusals.should_log()).flatten() {
                    tracing::warn!(
                        server = opts.name,
                        ?peer,
                        max = opts.max_connections,
                        suppressed,
                        "too many connections; a new one waits for a slot"
                    );
                }
                reg.freed.wait_for(&mut c, EVICT_RECHECK);
            }
        }
        if stopping() {
            return;
        }
        // A served connection holds a second descriptor (the handle that
        // closes it).
        let handle = loop {
            match stream.try_clone() {
                Err(e) if out_of_descriptors(&e) && shed_for_descriptors(reg, &refusals, opts) => {}
                other => break other,
            }
        };
        let served =
            handle.and_then(|h| spawn_connection(stream, h, peer.clone(), reg, handler, opts));
        if let Err(e) = served {
            tracing::warn!(server = opts.name, ?peer, "cannot serve connection: {e}");
        }
    }
}

/// The process's open-file limit (`RLIMIT_NOFILE`, soft); `None` when
/// unlimited or unknown.
fn descriptor_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    (ok && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// Connections one server may hold under an open-file limit of `limit`:
/// each holds two descriptors, so a quarter of the limit per server keeps
/// half of it for the process (its other listener, its engine, the files a
/// call opens), and the cap, not a failed `accept`, is what a storm of
/// connections meets.
pub(super) fn descriptor_cap(limit: Option<u64>) -> usize {
    limit.map_or(usize::MAX, |l| {
        usize::try_from(l / 4).unwrap_or(usize::MAX).max(16)
    })
}

/// Whether an accept failed for want of file descriptors (the process's
/// or the system's).
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// The process ran out of descriptors before the cap: closes the oldest
/// evictable connection, as a full server would (else every new
/// connection, a working client's too, waits behind the ones held), and
/// waits for a connection's thread to close its socket. Whether one was
/// closed.
fn shed_for_descriptors(reg: &Registry, refusals: &LogLimit, opts: &ServerOptions) -> bool {
    let mut c = reg.conns.lock();
    let shed = c.evict_one();
    if let Some(suppressed) = refusals.should_log() {
        tracing::warn!(
            server = opts.name,
            shed,
            suppressed,
            "out of file descriptors; an idle connection is closed to make room"
        );
    }
    reg.freed.wait_for(&mut c, ACCEPT_BACKOFF);
    shed
}

/// Serves `stream` on a thread of its own until the peer closes it;
/// `handle` is a second handle on it, to close it from outside.
fn spawn_connection<S: Stream, A: std::fmt::Debug + Send + 'static, H: Handler>(
    stream: S,
    handle: S,
    peer: A,
    reg: &Arc<Registry>,
    handler: &Arc<H>,
    opts: &ServerOptions,
) -> io::Result<()> {
    let evictable = Arc::new(AtomicBool::new(false));
    let id = {
        let mut c = reg.conns.lock();
        c.threads.retain(|t| !t.is_finished());
        let id = c.next_id;
        c.next_id += 1;
        let open = Open {
            socket: Box::new(handle),
            evictable: evictable.clone(),
        };
        c.open.insert(id, open);
        id
    };
    let (registry, handler, thread_opts) = (reg.clone(), handler.clone(), opts.clone());
    let mut builder = std::thread::Builder::new().name(opts.name.to_owned());
    if let Some(size) = opts.stack_size {
        builder = builder.stack_size(size);
    }
    let spawned = builder.spawn(move || {
        if let Err(e) = serve_connection(stream, &*handler, &thread_opts, &evictable) {
            tracing::debug!(server = thread_opts.name, ?peer, "connection closed: {e}");
        }
        registry.conns.lock().open.remove(&id);
        registry.freed.notify_one();
    });
    let mut c = reg.conns.lock();
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
fn next_request<S: Stream>(
    reader: &mut BufReader<S>,
    payload: &mut Vec<u8>,
    idle: Option<Duration>,
    limit: Duration,
    window: &mut AdaptiveWindow,
    base: Duration,
) -> io::Result<bool> {
    // A client that just got an answer often calls again soon (a put's end
    // after its start and copy): poll for a while before sleeping, as long
    // as this client's last gaps suggest.
    let since = Instant::now();
    if reader.buffer().is_empty() {
        window.await_next(reader.get_ref(), base);
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

/// Serves one connection: frame in, frame out, until it closes.
fn serve_connection<S: Stream, H: Handler>(
    stream: S,
    handler: &H,
    opts: &ServerOptions,
    evictable: &AtomicBool,
) -> io::Result<()> {
    stream.set_nodelay(opts.nodelay)?;
    let mut session = handler.session(&stream.peer());
    let mut reader = BufReader::with_capacity(opts.read_buffer, stream);
    let mut payload = Vec::new();
    let mut out = Vec::with_capacity(256);
    let mut window = AdaptiveWindow::default();
    let mut wake = None;
    loop {
        let idle = handler.idle_limit(&session, opts.idle_timeout);
        let limit = idle.map_or(opts.frame_timeout, |t| t.min(opts.frame_timeout));
        if wake != Some(limit) {
            // Reads wake at least this often so the deadlines are checked;
            // an answer not taken within `limit` drops the peer.
            reader.get_ref().set_read_timeout(Some(limit))?;
            reader.get_ref().set_write_timeout(Some(limit))?;
            wake = Some(limit);
        }
        evictable.store(handler.evictable(&session), Ordering::Relaxed);
        let next = next_request(
            &mut reader,
            &mut payload,
            idle,
            limit,
            &mut window,
            opts.poll,
        );
        match next {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                // A bad length: the stream cannot be resynchronised. Say
                // why, then close.
                handler.observe_malformed();
                let error = Error::new(ErrorCode::DESERIALIZE_FAIL, e.to_string());
                out.clear();
                encode_frame(&handler.failure(error), &mut out)?;
                reader.get_mut().write_all(&out)?;
                return Err(e);
            }
            Err(e) => return Err(e),
        }
        evictable.store(false, Ordering::Relaxed);
        let resp = match decode_payload::<H::Request<'_>>(&payload) {
            Ok(req) => handler.handle(&mut session, req),
            Err(e) => {
                handler.observe_malformed();
                tracing::debug!(server = opts.name, "malformed request: {e}");
                handler.failure(e.into())
            }
        };
        out.clear();
        if let Err(e) = encode_frame(&resp, &mut out) {
            let error = Error::new(H::OVERSIZED_ANSWER, e.to_string());
            encode_frame(&handler.failure(error), &mut out)?;
        }
        drop(resp);
        reader.get_mut().write_all(&out)?;
        // Do not keep a huge call's buffers for the life of the connection,
        // nor the heap its answer took (glibc keeps freed arena memory).
        let large = payload.capacity() > SHRINK_ABOVE || out.capacity() > SHRINK_ABOVE;
        if payload.capacity() > SHRINK_ABOVE {
            payload = Vec::new();
        }
        if out.capacity() > SHRINK_ABOVE {
            out = Vec::with_capacity(256);
        }
        if large {
            release_heap();
        }
    }
}

/// Returns freed heap to the system after a large call.
fn release_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}
