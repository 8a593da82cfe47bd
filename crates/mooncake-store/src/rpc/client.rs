//! The pooled blocking client of a framed-RPC server.
//!
//! Calls run on the caller's thread over long-lived TCP connections: one
//! request frame out, one answer frame back, no thread hops. A [`Pool`]
//! keeps idle connections for the next call. A stale pooled connection (the
//! server restarted, or closed it as idle) is detected by an immediate close
//! before any answer byte, and the call is retried once on a new one. A call
//! that gets no answer in time fails with `RPC_FAIL` and its connection is
//! dropped, since the stream is then out of step.
//!
//! Where connections go and what each does first is the [`Connector`]'s
//! business: the HA master client looks the leader up there, a dummy client
//! joins its session.

use std::io::{self, BufReader, ErrorKind};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;

use super::poll;
use super::stream::Stream;
use crate::proto::frame::{read_frame_within, write_frames};

/// The limits and socket policy of one client.
#[derive(Clone, Copy, Debug)]
pub struct ClientOptions {
    pub connect_timeout: Duration,
    /// Longest a request may take to be sent, and its answer to arrive whole.
    pub call_timeout: Duration,
    /// Connections kept idle; more can be open while calls run.
    pub max_idle: usize,
    /// Read buffer per connection: most answers arrive in one read.
    pub read_buffer: usize,
    /// How long a call polls for its answer before blocking (zero: block at
    /// once); see [`poll`].
    pub poll: Duration,
    /// Whether a call that got no answer also drops the idle connections
    /// (they lead to the same server, and a call that took one would wait
    /// out its own timeout), or only its own.
    pub drop_idle_on_failure: bool,
}

/// Where a pool's connections go (over transport `S`, TCP unless said),
/// and what each does before its first call.
pub trait Connector<S: Stream = TcpStream>: Send + Sync {
    /// The server, as error messages name it.
    fn peer(&self) -> String;
    /// A new stream to the server.
    fn connect(&self, timeout: Duration) -> Result<S>;
    /// Runs on each new connection before it carries calls.
    fn handshake(&self, _conn: &mut Connection<S>) -> Result<()> {
        Ok(())
    }
    /// Whether an idle connection may carry another call (what its
    /// handshake stated, its [`tag`](Connection::tag), may have gone out
    /// of date); one that may not is dropped.
    fn reusable(&self, _conn: &Connection<S>) -> bool {
        true
    }
}

/// `RPC_FAIL`: the server could not be reached or did not answer.
pub fn rpc_fail(what: impl std::fmt::Display) -> Error {
    Error::new(ErrorCode::RPC_FAIL, what.to_string())
}

/// The addresses of `addr` (`host:port`) of a `what` server (named in the
/// errors), or `INVALID_PARAMS`.
pub fn resolve(addr: &str, what: &str) -> Result<Vec<SocketAddr>> {
    let resolved: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("bad {what} address {addr:?}: {e}"),
            )
        })?
        .collect();
    if resolved.is_empty() {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("{what} address {addr:?} resolves to nothing"),
        ));
    }
    Ok(resolved)
}

/// Connects to the first of `addrs` that accepts.
pub fn connect_any(addrs: &[SocketAddr], timeout: Duration) -> io::Result<TcpStream> {
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect_timeout(addr, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(ErrorKind::NotFound, "no address")))
}

/// One connection to the server.
pub struct Connection<S = TcpStream> {
    /// Buffered so an answer usually takes one read system call.
    stream: BufReader<S>,
    buf: Vec<u8>,
    /// The answer deadline; the socket's timeouts match it.
    timeout: Duration,
    /// What the [`Connector`]'s handshake stated on it (the HA master
    /// client: the election term), for [`Connector::reusable`].
    pub tag: u64,
}

impl<S: Stream> Connection<S> {
    /// Sets `stream` up for calls (no delay, timeouts of `opts`).
    pub fn new(stream: S, opts: &ClientOptions) -> io::Result<Connection<S>> {
        stream.set_nodelay(true)?;
        let mut conn = Connection {
            stream: BufReader::with_capacity(opts.read_buffer, stream),
            buf: Vec::new(),
            timeout: opts.call_timeout,
            tag: 0,
        };
        conn.set_call_timeout(opts.call_timeout)?;
        Ok(conn)
    }

    /// Changes how long a call may take on this connection.
    pub fn set_call_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        let s = self.stream.get_ref();
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        self.timeout = timeout;
        Ok(())
    }

    /// Sends one encoded request frame and returns its answer's payload.
    /// Any error leaves the stream out of step: drop the connection.
    pub fn round_trip(&mut self, frame: &[u8], window: Duration) -> io::Result<&[u8]> {
        self.send(frame)?;
        self.receive(window)
    }

    /// Sends one encoded request frame without waiting for its answer
    /// ([`receive`](Self::receive) reads it), so the caller can work
    /// meanwhile.
    pub fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        write_frames(self.stream.get_mut(), frame)
    }

    /// Reads the answer to the request sent last, polling for it for
    /// `window` before blocking.
    pub fn receive(&mut self, window: Duration) -> io::Result<&[u8]> {
        // The answer usually comes within microseconds: poll for it rather
        // than sleep and be woken.
        if self.stream.buffer().is_empty() {
            poll::await_readable(self.stream.get_ref(), window);
        }
        read_frame_within(&mut self.stream, &mut self.buf, self.timeout, false)?;
        Ok(&self.buf)
    }
}

/// Connections to one server over transport `S`; usable from any thread.
pub struct Pool<C, S = TcpStream> {
    connector: C,
    opts: ClientOptions,
    idle: Mutex<Vec<Connection<S>>>,
    closed: AtomicBool,
}

impl<S: Stream, C: Connector<S>> Pool<C, S> {
    pub fn new(connector: C, opts: ClientOptions) -> Pool<C, S> {
        Pool {
            connector,
            opts,
            idle: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
        }
    }

    pub fn connector(&self) -> &C {
        &self.connector
    }

    /// A new connection, handshake done.
    pub fn open(&self) -> Result<Connection<S>> {
        let stream = self.connector.connect(self.opts.connect_timeout)?;
        let mut conn = Connection::new(stream, &self.opts)
            .map_err(|e| rpc_fail(format!("{}: {e}", self.connector.peer())))?;
        self.connector.handshake(&mut conn)?;
        Ok(conn)
    }

    /// Keeps `conn` for a later call (unless the pool is full or closed).
    pub fn put_idle(&self, conn: Connection<S>) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() < self.opts.max_idle {
            idle.push(conn);
        }
    }

    /// Connections waiting for a call.
    #[cfg(test)]
    pub fn idle_count(&self) -> usize {
        self.idle.lock().len()
    }

    /// Whether the oldest idle connection has something to read (an end of
    /// stream: the server closed it) within `wait`.
    #[cfg(test)]
    pub fn oldest_idle_readable_within(&self, wait: Duration) -> bool {
        let idle = self.idle.lock();
        idle.first()
            .is_some_and(|c| poll::await_readable(c.stream.get_ref(), wait))
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Drops the idle connections: later calls open new ones.
    pub fn drop_idle(&self) {
        self.idle.lock().clear();
    }

    /// Drops the idle connections; later calls fail.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.idle.lock().clear();
    }

    /// Sends one encoded request frame and decodes its answer with
    /// `decode`. The connection goes back to the pool unless the call or
    /// the decoding failed.
    pub fn call<T>(&self, frame: &[u8], decode: impl FnOnce(&[u8]) -> Result<T>) -> Result<T> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                "client is closed",
            ));
        }
        let pooled = loop {
            let pooled = self.idle.lock().pop();
            match pooled {
                Some(c) if !self.connector.reusable(&c) => continue,
                pooled => break pooled,
            }
        };
        let (mut conn, reused) = match pooled {
            Some(c) => (c, true),
            None => (self.open()?, false),
        };
        let window = self.opts.poll;
        let stale = match conn.round_trip(frame, window) {
            Ok(_) => false,
            Err(e) if reused && is_stale(&e) => true,
            Err(e) => return Err(self.no_answer(e)),
        };
        if stale {
            conn = self.open()?;
            if let Err(e) = conn.round_trip(frame, window) {
                return Err(self.no_answer(e));
            }
        }
        let answer = decode(&conn.buf)?;
        self.put_idle(conn);
        Ok(answer)
    }

    fn no_answer(&self, e: io::Error) -> Error {
        if self.opts.drop_idle_on_failure {
            self.idle.lock().clear();
        }
        rpc_fail(format!("{}: {e}", self.connector.peer()))
    }
}

/// Errors meaning the peer had closed the connection before our request.
fn is_stale(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::ConnectionAborted
    )
}
