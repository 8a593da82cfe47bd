//! The floor's leader (process A): the master's RPC server loop and socket
//! options, an in-memory log of entry frames, and the commit rule of a
//! replicated master with both standbys in its in-sync set.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};

use super::{put_end_entry, put_start_entry, Mode, TERM};
use crate::master::config::MasterConfig;
use crate::master::server::rpc_options;
use crate::proto::frame::{decode_payload, encode_frame, read_frame_within};
use crate::proto::{Frames, Request, Response};
use crate::rpc::{self, Handler, Server};

/// Standbys a commit waits for.
pub(super) const STANDBYS: usize = 2;
/// Longest a call waits for its commit, or for the standbys to connect.
const COMMIT_WAIT: Duration = Duration::from_secs(15);
/// Longest an idle pull is held (the master's default poll interval).
const POLL: Duration = Duration::from_secs(1);

/// Entries `base + 1 ..= last` not yet acknowledged by every standby.
#[derive(Default)]
struct Log {
    base: u64,
    frames: VecDeque<Vec<u8>>,
    acked: BTreeMap<String, u64>,
    committed: u64,
}

impl Log {
    fn last(&self) -> u64 {
        self.base + self.frames.len() as u64
    }

    fn append(&mut self, frame: impl FnOnce(u64) -> Vec<u8>) -> u64 {
        let seq = self.last() + 1;
        self.frames.push_back(frame(seq));
        seq
    }

    /// The frames after `after` (at least `base`), back to back.
    fn copy_after(&self, after: u64, out: &mut Vec<u8>) {
        let skip = after.saturating_sub(self.base) as usize;
        for f in self.frames.iter().skip(skip) {
            out.extend_from_slice(f);
        }
    }

    /// `standby` holds every entry up to `after`; whether the commit point
    /// moved. Entries every standby holds are dropped.
    fn ack(&mut self, standby: &str, after: u64) -> bool {
        let after = after.min(self.last());
        let a = self.acked.entry(standby.to_string()).or_insert(after);
        *a = (*a).max(after);
        if self.acked.len() < STANDBYS {
            return false;
        }
        let all = self.acked.values().copied().min().unwrap_or(0);
        while self.base < all {
            self.frames.pop_front();
            self.base += 1;
        }
        let moved = all > self.committed;
        self.committed = self.committed.max(all);
        moved
    }
}

/// A standby's connection as the `PutEnd`'s thread drives it
/// ([`Mode::Direct`]).
struct Link {
    id: String,
    stream: BufReader<TcpStream>,
    buf: Vec<u8>,
    /// What it holds: the `after` of its last pull.
    after: u64,
}

struct Core {
    mode: Mode,
    log: Mutex<Log>,
    /// New entries: what pulls wait for.
    appended: Condvar,
    /// A new commit point: what `PutEnd`s wait for.
    committed: Condvar,
    /// [`Mode::Direct`]: the standbys, held by the thread writing to them.
    links: Mutex<Vec<Link>>,
    linked: Condvar,
}

/// A running floor leader; dropping it stops it.
pub struct Leader {
    _server: Server,
    rpc: SocketAddr,
    standbys: Option<SocketAddr>,
}

impl Leader {
    /// Where clients call, and ([`Mode::Direct`]) standbys pull; otherwise
    /// they pull on the client address, as from a master.
    pub fn addresses(&self) -> (SocketAddr, SocketAddr) {
        (self.rpc, self.standbys.unwrap_or(self.rpc))
    }
}

/// Starts a floor leader of `mode` on loopback (ports chosen by the
/// kernel).
pub fn serve_leader(mode: Mode) -> Result<Leader> {
    let fail = |e: io::Error| Error::new(ErrorCode::INTERNAL_ERROR, format!("floor leader: {e}"));
    let core = Arc::new(Core {
        mode,
        log: Mutex::new(Log::default()),
        appended: Condvar::new(),
        committed: Condvar::new(),
        links: Mutex::new(Vec::new()),
        linked: Condvar::new(),
    });
    let standbys = if mode == Mode::Direct {
        let l = TcpListener::bind("127.0.0.1:0").map_err(fail)?;
        let addr = l.local_addr().map_err(fail)?;
        let c = core.clone();
        std::thread::Builder::new()
            .name("floor-links".into())
            .spawn(move || accept_links(&l, &c))
            .map_err(fail)?;
        Some(addr)
    } else {
        None
    };
    let listener = TcpListener::bind("127.0.0.1:0").map_err(fail)?;
    let opts = rpc_options(&MasterConfig::default());
    let server = Server::start(listener, Arc::new(Floor(core)), opts).map_err(fail)?;
    Ok(Leader {
        rpc: server.local_addr(),
        _server: server,
        standbys,
    })
}

/// Takes the standbys' connections ([`Mode::Direct`]): each is kept once
/// its first pull says who it is and what it holds.
fn accept_links(l: &TcpListener, core: &Core) {
    while let Ok((stream, _)) = l.accept() {
        let link = (|| -> Result<Link> {
            stream.set_nodelay(true).map_err(io_error)?;
            stream
                .set_read_timeout(Some(COMMIT_WAIT))
                .map_err(io_error)?;
            stream
                .set_write_timeout(Some(COMMIT_WAIT))
                .map_err(io_error)?;
            let mut link = Link {
                id: String::new(),
                stream: BufReader::with_capacity(64 << 10, stream),
                buf: Vec::new(),
                after: 0,
            };
            read_pull(&mut link, Duration::ZERO)?;
            Ok(link)
        })();
        match link {
            Ok(link) => {
                core.log.lock().ack(&link.id, link.after);
                core.links.lock().push(link);
                core.linked.notify_all();
            }
            Err(e) => tracing::warn!("floor standby refused: {e}"),
        }
    }
}

/// Reads a standby's next pull into `link` (polling for `window` first).
fn read_pull(link: &mut Link, window: Duration) -> Result<()> {
    if link.stream.buffer().is_empty() {
        rpc::poll::await_readable(link.stream.get_ref(), window);
    }
    read_frame_within(&mut link.stream, &mut link.buf, COMMIT_WAIT, false).map_err(io_error)?;
    match decode_payload::<Request<'_>>(&link.buf)? {
        Request::ReplicationPull { standby, after, .. } => {
            link.id = standby.to_string();
            link.after = after;
            Ok(())
        }
        other => Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("a standby sent {other:?}"),
        )),
    }
}

fn entries(committed: u64, frames: Vec<u8>) -> Response {
    Response::Entries {
        term: TERM,
        committed,
        leader_now: 0,
        frames: Frames(frames),
    }
}

impl Core {
    /// Appends the entries of a call; returns the last one's position.
    fn append(&self, frames: &[&dyn Fn(u64) -> Vec<u8>]) -> u64 {
        let mut log = self.log.lock();
        let mut seq = 0;
        for f in frames {
            seq = log.append(f);
        }
        drop(log);
        if self.mode != Mode::Direct {
            self.appended.notify_all();
        }
        seq
    }

    /// Waits until both standbys hold entry `seq`, woken by the threads
    /// that read their pulls.
    fn wait_committed(&self, seq: u64) -> Result<()> {
        let deadline = Instant::now() + COMMIT_WAIT;
        let mut log = self.log.lock();
        while log.committed < seq {
            if self.committed.wait_until(&mut log, deadline).timed_out() {
                return Err(not_in_time(seq));
            }
        }
        Ok(())
    }

    /// Answers a standby's pull on its connection's thread, as a leader
    /// does: acknowledges what it holds, waits for entries after it.
    fn serve_pull(&self, standby: &str, after: u64, wait: Duration) -> Response {
        let mut log = self.log.lock();
        if log.ack(standby, after) {
            self.committed.notify_all();
        }
        let deadline = Instant::now() + wait.min(POLL);
        while log.last() <= after {
            if self.appended.wait_until(&mut log, deadline).timed_out() {
                break;
            }
        }
        let mut frames = Vec::new();
        log.copy_after(after.max(log.base), &mut frames);
        entries(log.committed, frames)
    }

    /// [`Mode::Direct`]: sends every entry appended so far to both standbys
    /// from this thread and reads their next pulls, unless another thread
    /// already committed `seq`.
    fn commit_directly(&self, seq: u64) -> Result<()> {
        let deadline = Instant::now() + COMMIT_WAIT;
        let mut links = self.links.lock();
        while links.len() < STANDBYS {
            if self.linked.wait_until(&mut links, deadline).timed_out() {
                return Err(not_in_time(seq));
            }
        }
        if self.log.lock().committed >= seq {
            return Ok(());
        }
        let mut out = Vec::new();
        for link in links.iter_mut() {
            let mut frames = Vec::new();
            let committed = {
                let log = self.log.lock();
                log.copy_after(link.after.max(log.base), &mut frames);
                log.committed
            };
            out.clear();
            encode_frame(&entries(committed, frames), &mut out).map_err(io_error)?;
            link.stream.get_mut().write_all(&out).map_err(io_error)?;
        }
        let window = rpc::poll::server_window();
        for link in links.iter_mut() {
            read_pull(link, window)?;
        }
        let mut log = self.log.lock();
        for link in links.iter() {
            log.ack(&link.id, link.after);
        }
        drop(log);
        self.committed.notify_all();
        Ok(())
    }
}

fn io_error(e: io::Error) -> Error {
    Error::new(ErrorCode::RPC_FAIL, format!("floor standby link: {e}"))
}

fn not_in_time(seq: u64) -> Error {
    Error::new(
        ErrorCode::RPC_FAIL,
        format!("floor entry {seq} not held by both standbys within {COMMIT_WAIT:?}"),
    )
}

struct Floor(Arc<Core>);

impl Handler for Floor {
    type Request<'a> = Request<'a>;
    type Response = Response;
    type Session = ();
    const OVERSIZED_ANSWER: ErrorCode = ErrorCode::INVALID_PARAMS;

    fn session(&self, _: &rpc::Peer) {}

    fn handle(&self, _: &mut (), req: Request<'_>) -> Response {
        let core = &*self.0;
        let unit = |result| Response::Unit { result };
        match req {
            Request::PutStart { key, value_len, .. } => {
                if core.mode == Mode::Pull {
                    core.append(&[&|seq| put_start_entry(seq, key, value_len)]);
                }
                unit(Ok(()))
            }
            Request::PutEnd { key, .. } => {
                let start = |seq| put_start_entry(seq, key, 4096);
                let end = |seq| put_end_entry(seq, key);
                match core.mode {
                    Mode::Alone => unit(Ok(())),
                    Mode::Pull => unit(core.wait_committed(core.append(&[&end]))),
                    Mode::PullAtCommit => unit(core.wait_committed(core.append(&[&start, &end]))),
                    Mode::Direct => unit(core.commit_directly(core.append(&[&start, &end]))),
                }
            }
            Request::ReplicationPull {
                standby,
                after,
                wait_ms,
                ..
            } if core.mode != Mode::Direct => {
                core.serve_pull(standby, after, Duration::from_millis(wait_ms.into()))
            }
            other => Response::Failed {
                error: Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("the floor leader does not serve {other:?}"),
                ),
            },
        }
    }

    fn failure(&self, error: Error) -> Response {
        Response::Failed { error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_when_both_standbys_hold_an_entry() {
        let mut log = Log::default();
        for _ in 0..3 {
            log.append(|seq| vec![seq as u8]);
        }
        assert!(!log.ack("b", 3), "one standby commits nothing");
        assert_eq!((log.committed, log.base), (0, 0));
        assert!(log.ack("c", 2));
        assert_eq!((log.committed, log.base, log.last()), (2, 2, 3));
        let mut out = Vec::new();
        log.copy_after(2, &mut out);
        assert_eq!(out, [3]);
        assert!(!log.ack("c", 1), "never back");
        assert!(log.ack("c", 9), "at most the last");
        assert_eq!((log.committed, log.base), (3, 3));
    }
}
