//! The floor's leader (process A): the master's RPC server loop and socket
//! options, an in-memory log of entry frames, and a commit rule: its
//! [`Quorum`] (both standbys, as a replicated master's in-sync set, or one).

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};

use super::model::{put_end_entry, put_start_entry, Mode, Quorum, TERM};
use mooncake_store::master::serve::server::rpc_options;
use mooncake_store::master::MasterConfig;
use mooncake_store::proto::frame::{decode_payload, encode_frame, read_frame_within};
use mooncake_store::proto::{Frames, Request, Response};
use mooncake_store::rpc::{self, Handler, Server};

/// Longest a call waits for its commit, or for the standbys to connect.
const COMMIT_WAIT: Duration = Duration::from_secs(15);
/// Longest an idle pull is held (the master's default poll interval).
const POLL: Duration = Duration::from_secs(1);

/// Entries `base + 1 ..= last` not yet acknowledged by every standby.
struct Log {
    quorum: Quorum,
    base: u64,
    frames: VecDeque<Vec<u8>>,
    acked: BTreeMap<String, u64>,
    committed: u64,
}

impl Log {
    fn new(quorum: Quorum) -> Log {
        Log {
            quorum,
            base: 0,
            frames: VecDeque::new(),
            acked: BTreeMap::new(),
            committed: 0,
        }
    }

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
    /// (what the quorum's number of standbys hold) moved. Entries every
    /// standby holds are dropped.
    fn ack(&mut self, standby: &str, after: u64) -> bool {
        let after = after.min(self.last());
        let a = self.acked.entry(standby.to_string()).or_insert(after);
        *a = (*a).max(after);
        if self.acked.len() >= self.quorum.standbys() {
            let all = self.acked.values().copied().min().unwrap_or(0);
            while self.base < all {
                self.frames.pop_front();
                self.base += 1;
            }
        }
        let acks = self.quorum.acks();
        let held = self
            .acked
            .values()
            .copied()
            .filter(|&a| self.acked.values().filter(|&&b| b >= a).count() >= acks);
        let Some(held) = held.max() else {
            return false;
        };
        let moved = held > self.committed;
        self.committed = self.committed.max(held);
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
    /// Entries were sent to it and its next pull is not read yet.
    sent: bool,
}

struct Core {
    mode: Mode,
    quorum: Quorum,
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

/// Starts a floor leader of `mode` committing at `quorum` on loopback
/// (ports chosen by the kernel).
pub fn serve_leader(mode: Mode, quorum: Quorum) -> Result<Leader> {
    let fail = |e: io::Error| Error::new(ErrorCode::INTERNAL_ERROR, format!("floor leader: {e}"));
    let core = Arc::new(Core {
        mode,
        quorum,
        log: Mutex::new(Log::new(quorum)),
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
                sent: false,
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

    /// Waits until the quorum holds entry `seq`, woken by the threads
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

    /// [`Mode::Direct`]: sends every entry appended so far to each standby
    /// that lacks `seq` and is not sent entries already, from this thread,
    /// and reads their next pulls, until the quorum holds `seq` (unless
    /// another thread already committed it). A standby whose pull is not
    /// read by then is sent its next entries by a later commit.
    fn commit_directly(&self, seq: u64) -> Result<()> {
        let deadline = Instant::now() + COMMIT_WAIT;
        let mut links = self.links.lock();
        while links.len() < self.quorum.standbys() {
            if self.linked.wait_until(&mut links, deadline).timed_out() {
                return Err(not_in_time(seq));
            }
        }
        let mut out = Vec::new();
        let window = rpc::poll::server_window();
        while self.log.lock().committed < seq {
            for link in links.iter_mut().filter(|l| !l.sent && l.after < seq) {
                let mut frames = Vec::new();
                let committed = {
                    let log = self.log.lock();
                    log.copy_after(link.after.max(log.base), &mut frames);
                    log.committed
                };
                out.clear();
                encode_frame(&entries(committed, frames), &mut out).map_err(io_error)?;
                link.stream.get_mut().write_all(&out).map_err(io_error)?;
                link.sent = true;
            }
            let ready = await_pulls(&links, window, deadline)?;
            for (link, _) in links.iter_mut().zip(ready).filter(|(_, r)| *r) {
                read_pull(link, Duration::ZERO)?;
                link.sent = false;
                self.log.lock().ack(&link.id, link.after);
            }
        }
        drop(links);
        self.committed.notify_all();
        Ok(())
    }
}

/// Which of `links` that were sent entries have their next pull to read:
/// polled for `window`, then waited for until `deadline`.
fn await_pulls(links: &[Link], window: Duration, deadline: Instant) -> Result<Vec<bool>> {
    let buffered: Vec<bool> = links
        .iter()
        .map(|l| l.sent && !l.stream.buffer().is_empty())
        .collect();
    if buffered.contains(&true) {
        return Ok(buffered);
    }
    let mut fds: Vec<libc::pollfd> = links
        .iter()
        .map(|l| libc::pollfd {
            // A link not sent entries is not polled (a negative fd).
            fd: if l.sent {
                l.stream.get_ref().as_raw_fd()
            } else {
                -1
            },
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ready = |fds: &[libc::pollfd]| fds.iter().map(|p| p.revents != 0).collect();
    // Ready, hung up or failed: the read tells which.
    if rpc::poll::spin_fds(&mut fds, window).map_err(io_error)? {
        return Ok(ready(&fds));
    }
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(io_error(io::Error::from(io::ErrorKind::TimedOut)));
        }
        let timeout = (deadline - now).as_millis().clamp(1, i32::MAX as u128) as i32;
        match rpc::poll::poll_fds(&mut fds, timeout) {
            Ok(0) => {}
            Ok(_) => return Ok(ready(&fds)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(e)),
        }
    }
}

fn io_error(e: io::Error) -> Error {
    Error::new(ErrorCode::RPC_FAIL, format!("floor standby link: {e}"))
}

fn not_in_time(seq: u64) -> Error {
    Error::new(
        ErrorCode::RPC_FAIL,
        format!("floor entry {seq} not held by the standbys within {COMMIT_WAIT:?}"),
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
        let mut log = Log::new(Quorum::BothOf2);
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

    #[test]
    fn commits_when_one_standby_holds_an_entry() {
        let mut log = Log::new(Quorum::FirstOf2);
        for _ in 0..3 {
            log.append(|seq| vec![seq as u8]);
        }
        assert!(log.ack("b", 2), "the first standby commits");
        assert_eq!((log.committed, log.base), (2, 0), "kept for the second");
        assert!(!log.ack("c", 1));
        assert_eq!((log.committed, log.base), (2, 1));
        assert!(log.ack("c", 3));
        assert_eq!((log.committed, log.base), (3, 2));

        let mut log = Log::new(Quorum::OneOf1);
        log.append(|seq| vec![seq as u8]);
        assert!(log.ack("b", 1));
        assert_eq!((log.committed, log.base, log.last()), (1, 1, 1));
    }
}
