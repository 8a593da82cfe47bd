//! A standby's side of replication: one thread that follows whoever leads.
//!
//! It keeps one `ReplicationPull` call outstanding on the leader's RPC
//! port, keeps every entry it receives (checksummed frames, in order),
//! applies those the leader says are committed, and follows the leader's
//! clock so that times in the state stay in one domain across leaders.
//!
//! When the leader changes, entries received but not applied are kept
//! but checked: the standby asks the new leader for what follows its last
//! entry known committed, keeps the resent entries it holds with the same
//! term and replaces the rest (never committed). Dropping them instead
//! would lose committed entries whose commit this standby had not heard
//! of yet, should it lead after all. When the leader's process is gone (the connection that worked
//! breaks and its port then refuses connections), the thread reports it,
//! so that the election can end its lease now rather than at expiry.
//!
//! `Follower::stop` ends the thread, then applies every entry received:
//! a standby being promoted serves everything its leader may have
//! committed.

#[cfg(test)]
mod tests;

use std::io::{self, ErrorKind};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};

use super::compaction::load_snapshot;
use crate::master::durable::oplog::decode_prefix;
use crate::master::durable::snapshot::Stores;
use crate::master::replication::Replication;
use crate::master::serve::shared::Shared;
use crate::master_client::authenticate;
use crate::proto::frame::{decode_payload, encode_frame};
use crate::proto::{Frames, Request, Response};
use crate::rpc::{connect_any, ClientOptions, Connection};

/// How long a standby spins on its socket for the leader's answer before
/// it blocks (`MC_REPL_SPIN_US`; the leader waits for acknowledgements
/// with the same window).
pub use crate::master::replication::spin_window;

/// Pause between attempts while there is no leader to follow.
const IDLE: Duration = Duration::from_millis(10);
/// A leader whose port refuses connections this long is reported gone.
const REFUSED_FOR: Duration = Duration::from_millis(60);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Largest snapshot a standby accepts from its leader.
const MAX_SNAPSHOT: usize = 16 << 30;

/// The follower thread of a standby.
pub(crate) struct Follower {
    stop: Arc<AtomicBool>,
    /// The socket of the current pull, to cut it short at stop.
    socket: Arc<Mutex<Option<TcpStream>>>,
    thread: Option<JoinHandle<Result<()>>>,
    /// Set when the thread has ended (stopped, or failed).
    ended: watch::Receiver<bool>,
    shared: Arc<Shared>,
}

impl Follower {
    /// Starts following the leader `leader` names (an RPC address; this
    /// master's own address `me` is skipped). Reports a leader found gone
    /// on `gone`. A snapshot loaded from the leader is stored in `stores`
    /// first where this master keeps its log on disk.
    pub(crate) fn spawn(
        shared: Arc<Shared>,
        me: String,
        leader: watch::Receiver<Option<String>>,
        gone: mpsc::UnboundedSender<String>,
        stores: Option<Arc<Stores>>,
    ) -> Result<Follower> {
        let stop = Arc::new(AtomicBool::new(false));
        let socket = Arc::new(Mutex::new(None));
        let run = Run {
            shared: shared.clone(),
            repl: shared.replication.clone().expect("a follower replicates"),
            me,
            leader,
            gone,
            stop: stop.clone(),
            socket: socket.clone(),
            stores,
        };
        let (ended_tx, ended) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("mc-follower".into())
            .spawn(move || {
                let r = run.run();
                let _ = ended_tx.send(true);
                r
            })
            .map_err(|e| {
                Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("cannot start follower: {e}"),
                )
            })?;
        Ok(Follower {
            stop,
            socket,
            thread: Some(thread),
            ended,
            shared,
        })
    }

    /// Resolves once the thread has ended by itself: it failed (its log
    /// on disk, its state against the leader's log), so this master no
    /// longer follows and [`Follower::stop`] returns why.
    pub(crate) async fn ended(&mut self) {
        let _ = self.ended.wait_for(|e| *e).await;
    }

    /// Stops following and applies every entry received. An error means
    /// this master's state does not fit its leader's log: it must not lead.
    pub(crate) fn stop(mut self) -> Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(s) = self.socket.lock().take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let joined = self.thread.take().map(|t| t.join());
        match joined {
            Some(Ok(r)) => r?,
            Some(Err(_)) => {
                return Err(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    "follower thread panicked",
                ))
            }
            None => {}
        }
        let repl = self
            .shared
            .replication
            .as_ref()
            .expect("a follower replicates");
        apply_up_to(&self.shared, repl, u64::MAX)
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(s) = self.socket.lock().take() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// The socket policy of a standby's connection to its leader, which
/// answers a pull within `poll` when it has nothing new.
pub fn pull_options(poll: Duration) -> ClientOptions {
    ClientOptions {
        connect_timeout: CONNECT_TIMEOUT,
        call_timeout: poll + Duration::from_secs(3),
        max_idle: 1,
        read_buffer: 64 << 10,
        poll: Duration::ZERO,
        drop_idle_on_failure: true,
    }
}

struct Run {
    shared: Arc<Shared>,
    repl: Arc<Replication>,
    me: String,
    leader: watch::Receiver<Option<String>>,
    gone: mpsc::UnboundedSender<String>,
    stop: Arc<AtomicBool>,
    socket: Arc<Mutex<Option<TcpStream>>>,
    stores: Option<Arc<Stores>>,
}

/// The leader being followed.
struct Following {
    addr: String,
    conn: Option<Connection>,
    /// A pull was sent on `conn` and its answer not read yet.
    pulling: bool,
    /// A pull was answered: the leader's process was there.
    served: bool,
    refused_since: Option<Instant>,
    reported: bool,
}

impl Run {
    fn run(self) -> Result<()> {
        let opts = self.repl.options();
        let client = pull_options(opts.poll);
        let mut following: Option<Following> = None;
        let mut frame = Vec::new();
        let spin = spin_window();
        while !self.stop.load(Ordering::SeqCst) {
            let leader = self.leader.borrow().clone();
            self.repl.set_leader(leader.clone());
            let Some(addr) = leader.filter(|l| *l != self.me) else {
                std::thread::sleep(IDLE);
                continue;
            };
            if following.as_ref().map(|f| &f.addr) != Some(&addr) {
                self.repl.new_leader();
                following = Some(Following {
                    addr: addr.clone(),
                    conn: None,
                    pulling: false,
                    served: false,
                    refused_since: None,
                    reported: false,
                });
            }
            let f = following.as_mut().expect("set above");
            if f.conn.is_none() {
                match connect(&f.addr) {
                    Ok(stream) => {
                        *self.socket.lock() = stream.try_clone().ok();
                        f.conn = Connection::new(stream, &client).ok().and_then(|mut c| {
                            let token = self.shared.access.credential();
                            match token.map_or(Ok(()), |t| authenticate(&mut c, t)) {
                                Ok(()) => Some(c),
                                Err(e) => {
                                    tracing::warn!("leader {} refused this standby: {e}", f.addr);
                                    std::thread::sleep(Duration::from_secs(1));
                                    None
                                }
                            }
                        });
                        f.pulling = false;
                        f.refused_since = None;
                        self.repl.set_connected(f.conn.is_some());
                    }
                    Err(e) => {
                        self.refused(f, &e);
                        std::thread::sleep(IDLE);
                        continue;
                    }
                }
            }
            let Some(conn) = f.conn.as_mut() else {
                std::thread::sleep(IDLE);
                continue;
            };
            if !f.pulling {
                if let Err(e) = self.send_pull(conn, &mut frame) {
                    tracing::debug!(leader = %f.addr, "pull failed: {e}");
                    f.conn = None;
                    self.repl.set_connected(false);
                    continue;
                }
                f.pulling = true;
            }
            let answer = match conn.receive(spin) {
                Ok(payload) => decode_payload::<Response>(payload).map_err(Error::from),
                Err(e) => {
                    tracing::debug!(leader = %f.addr, "pull failed: {e}");
                    f.conn = None;
                    self.repl.set_connected(false);
                    continue;
                }
            };
            f.pulling = false;
            match answer {
                Ok(Response::Entries {
                    term,
                    committed,
                    leader_now,
                    frames,
                }) => {
                    f.served = true;
                    f.reported = false;
                    self.shared.clock.advance_to(leader_now);
                    let target = keep(&self.repl, term, committed, &frames)?;
                    // On this master's disk before it is acknowledged.
                    self.repl.write_kept()?;
                    // Acknowledge first (the next pull says what it holds),
                    // then apply while the leader works: applying is off
                    // the commit path.
                    match self.send_pull(conn, &mut frame) {
                        Ok(()) => f.pulling = true,
                        Err(e) => {
                            tracing::debug!(leader = %f.addr, "pull failed: {e}");
                            f.conn = None;
                            self.repl.set_connected(false);
                        }
                    }
                    apply_up_to(&self.shared, &self.repl, target)?;
                }
                Ok(Response::SnapshotChunk {
                    seq,
                    leader_now,
                    offset: 0,
                    total,
                    chunk,
                    ..
                }) => {
                    f.served = true;
                    self.shared.clock.advance_to(leader_now);
                    match self.fetch_snapshot(conn, seq, total, chunk.0) {
                        Ok(bytes) => {
                            let n = bytes.len();
                            self.store_snapshot(seq, &bytes)?;
                            load_snapshot(&self.shared, &self.repl, bytes).inspect_err(|e| {
                                tracing::error!("cannot catch up from the leader's snapshot: {e}")
                            })?;
                            tracing::info!(leader = %f.addr, seq, bytes = n, "loaded the leader's snapshot; pulling the log after it");
                        }
                        Err(e) => {
                            tracing::debug!(leader = %f.addr, "snapshot fetch failed: {e}");
                            f.conn = None;
                            self.repl.set_connected(false);
                        }
                    }
                }
                Ok(Response::Failed { error }) => {
                    tracing::debug!(leader = %f.addr, "pull refused: {error}");
                    if error.code == ErrorCode::INVALID_PARAMS {
                        // The leader does not hold the entry checked from:
                        // check again from what is applied. Not on any
                        // other refusal: a leader stepping down says so
                        // too, and this standby, which may lead next, must
                        // keep every entry it acknowledged.
                        self.repl.refused_log();
                    }
                    f.conn = None;
                    std::thread::sleep(IDLE * 5);
                }
                Ok(other) => {
                    tracing::warn!(leader = %f.addr, "unexpected answer {} to a pull", other.name());
                    f.conn = None;
                }
                Err(e) => {
                    tracing::warn!(leader = %f.addr, "bad answer to a pull: {e}");
                    f.conn = None;
                }
            }
        }
        Ok(())
    }

    /// Sends the next pull on `conn`: what this standby holds, and how
    /// long the leader may hold the call when it has nothing new.
    fn send_pull(&self, conn: &mut Connection, frame: &mut Vec<u8>) -> Result<()> {
        let opts = self.repl.options();
        let pull = self.repl.pull_request(opts.batch_max as u32, opts.poll);
        frame.clear();
        let req = Request::ReplicationPull {
            standby: self.repl.member(),
            after: pull.after,
            after_term: pull.after_term,
            applied: pull.applied,
            max: pull.max,
            wait_ms: pull.wait_ms,
        };
        if encode_frame(&req, frame).is_err() {
            return Err(Error::new(
                ErrorCode::INTERNAL_ERROR,
                "pull does not encode",
            ));
        }
        conn.send(frame)
            .map_err(|e| Error::new(ErrorCode::RPC_FAIL, e.to_string()))
    }

    /// Fetches the rest of the leader's snapshot at `seq` (`total` bytes,
    /// of which `first` came with the pull's answer).
    /// Loading the leader's snapshot restarts the log on disk after it: a
    /// restart then needs that snapshot here, so it is stored (synced)
    /// first. Without, a standby killed before its own next snapshot could
    /// never start again (its log begins past every snapshot it has).
    fn store_snapshot(&self, seq: u64, bytes: &[u8]) -> Result<()> {
        let (Some(stores), Some(_)) = (&self.stores, self.repl.disk()) else {
            return Ok(());
        };
        stores.put(seq, bytes).inspect_err(|e| {
            tracing::error!("cannot store the leader's snapshot before loading it: {e}")
        })?;
        stores.retain(self.shared.config.snapshot_retention_count)?;
        Ok(())
    }

    fn fetch_snapshot(
        &self,
        conn: &mut Connection,
        seq: u64,
        total: u64,
        first: Vec<u8>,
    ) -> Result<Vec<u8>> {
        let total = usize::try_from(total)
            .ok()
            .filter(|t| *t <= MAX_SNAPSHOT)
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("snapshot of {total} bytes"),
                )
            })?;
        let mut bytes = first;
        bytes.reserve(total.saturating_sub(bytes.len()));
        let mut frame = Vec::new();
        while bytes.len() < total {
            frame.clear();
            let req = Request::SnapshotFetch {
                standby: self.repl.member(),
                seq,
                offset: bytes.len() as u64,
            };
            encode_frame(&req, &mut frame)
                .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, e.to_string()))?;
            let payload = conn
                .round_trip(&frame, Duration::ZERO)
                .map_err(|e| Error::new(ErrorCode::RPC_FAIL, e.to_string()))?;
            match decode_payload::<Response>(payload).map_err(Error::from)? {
                Response::SnapshotChunk {
                    seq: s,
                    offset,
                    chunk,
                    ..
                } if s == seq && offset == bytes.len() as u64 && !chunk.0.is_empty() => {
                    bytes.extend_from_slice(&chunk.0);
                }
                Response::Failed { error } => return Err(error),
                other => {
                    return Err(Error::new(
                        ErrorCode::INVALID_PARAMS,
                        format!("unexpected answer {} to a snapshot fetch", other.name()),
                    ))
                }
            }
        }
        if bytes.len() != total {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "snapshot longer than announced",
            ));
        }
        Ok(bytes)
    }

    /// A connection attempt failed: a leader that served and now refuses
    /// connections for a while is gone.
    fn refused(&self, f: &mut Following, e: &io::Error) {
        if !f.served || f.reported || e.kind() != ErrorKind::ConnectionRefused {
            f.refused_since = None;
            return;
        }
        let since = *f.refused_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= REFUSED_FOR {
            tracing::warn!(leader = %f.addr, "leader's port refuses connections: its process is gone");
            f.reported = true;
            let _ = self.gone.send(f.addr.clone());
        }
    }
}

/// Keeps the entries of an answer from the leader of `term` and applies
/// what is committed.
#[cfg(test)]
pub(crate) fn receive(
    shared: &Shared,
    repl: &Replication,
    term: u64,
    committed: u64,
    frames: &Frames,
) -> Result<()> {
    let target = keep(repl, term, committed, frames)?;
    apply_up_to(shared, repl, target)
}

/// Keeps the entries of an answer from the leader of `term`; returns up to
/// where they may be applied (what the leader has committed).
fn keep(repl: &Replication, term: u64, committed: u64, frames: &Frames) -> Result<u64> {
    let mut rest = &frames.0[..];
    let mut batch = Vec::new();
    while !rest.is_empty() {
        let (entry, used) = decode_prefix(rest).map_err(|e| {
            Error::new(
                ErrorCode::DESERIALIZE_FAIL,
                format!("entry from leader: {e}"),
            )
        })?;
        batch.push((entry.seq, entry.term, rest[..used].to_vec()));
        rest = &rest[used..];
    }
    repl.keep(term, committed, batch)
}

/// Applies the kept entries up to `target` (at most those received).
pub(crate) fn apply_up_to(shared: &Shared, repl: &Replication, target: u64) -> Result<()> {
    loop {
        let Some((seq, frame)) = repl.next_to_apply(target) else {
            return Ok(());
        };
        let entry = crate::master::durable::oplog::decode(&frame).map_err(|e| {
            Error::new(
                ErrorCode::DESERIALIZE_FAIL,
                format!("kept entry {seq}: {e}"),
            )
        })?;
        entry.apply_to(&shared.service).inspect_err(|e| {
            tracing::error!(
                "entry {seq} does not fit this standby's state: {e}; it stops following"
            );
        })?;
        repl.applied_to(seq);
    }
}

fn connect(addr: &str) -> io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
    connect_any(&addrs, CONNECT_TIMEOUT)
}
