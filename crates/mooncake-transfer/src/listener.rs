//! Admission on the engine's RPC port: which connections are served, one
//! thread each, and which are shed.
//!
//! - At most [`ListenerLimits::max_connections`] are served at once. When
//!   full, the connection idle the longest is closed to make room; when none
//!   is idle, the listener stops accepting (new peers wait in the kernel's
//!   accept queue) until one closes or goes idle.
//! - At most [`ListenerLimits::max_per_peer`] per peer address: past it the
//!   peer's own longest-idle connection is closed, or, when all of them are
//!   busy, the new one is refused.
//! - A connection idle for [`ListenerLimits::idle_timeout`] between frames
//!   is closed (the initiator reconnects on its next transfer).
//! - Refusals are logged at most once per [`REFUSAL_LOG_EVERY`], with a count.
//!
//! So idle sockets, however many, cost at most the caps and never keep a
//! working peer out.

use std::collections::HashMap;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, LogLimit, Result};
use parking_lot::{Condvar, Mutex};

use crate::idle::IdleMark;
use crate::rpc::{serve, LocalState};

/// What the RPC port may cost the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections served at once (`MC_TCP_MAX_CONNECTIONS`).
    pub max_connections: usize,
    /// Connections served at once from one peer address
    /// (`MC_TCP_MAX_CONNECTIONS_PER_PEER`).
    pub max_per_peer: usize,
    /// Longest a connection may stay silent between frames
    /// (`MC_TCP_IDLE_TIMEOUT`, seconds).
    pub idle_timeout: Duration,
}

pub(crate) const DEFAULT_LIMITS: ListenerLimits = ListenerLimits {
    max_connections: 4096,
    max_per_peer: 256,
    idle_timeout: Duration::from_secs(60),
};

impl Default for ListenerLimits {
    fn default() -> Self {
        DEFAULT_LIMITS
    }
}

/// Refused connections are logged at most this often (with a count).
pub(crate) const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);
/// How often a full listener with nothing idle looks again.
const RECHECK: Duration = Duration::from_millis(100);
/// Stack of a connection thread (the serving loop needs little).
const CONNECTION_STACK: usize = 512 << 10;

struct Entry<C> {
    peer: IpAddr,
    idle: Arc<IdleMark>,
    conn: C,
}

/// What to do with a connection just accepted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit<C> {
    /// Serve it, after closing these.
    Serve(Vec<C>),
    /// Close it: its peer has too many busy connections.
    Refuse,
    /// Hold it until a slot frees (every connection is busy).
    Wait,
}

/// The connections being served, by id: pure bookkeeping, `C` is what
/// closes one.
pub(crate) struct Table<C> {
    limits: ListenerLimits,
    next_id: u64,
    open: HashMap<u64, Entry<C>>,
    per_peer: HashMap<IpAddr, usize>,
}

impl<C> Table<C> {
    pub(crate) fn new(limits: ListenerLimits) -> Table<C> {
        Table {
            limits,
            next_id: 0,
            open: HashMap::new(),
            per_peer: HashMap::new(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether a new connection could be served now (a free slot, or an
    /// idle one to shed).
    pub(crate) fn has_room(&self) -> bool {
        self.open.len() < self.limits.max_connections.max(1)
            || self.open.values().any(|e| e.idle.idle_since().is_some())
    }

    /// The id of the connection idle the longest (of `peer` if given).
    fn longest_idle(&self, peer: Option<IpAddr>) -> Option<u64> {
        self.open
            .iter()
            .filter(|(_, e)| peer.is_none_or(|p| e.peer == p))
            .filter_map(|(&id, e)| e.idle.idle_since().map(|t| (t, id)))
            .min()
            .map(|(_, id)| id)
    }

    /// Decides about a new connection from `peer`; the connections to close
    /// leave the table.
    pub(crate) fn admit(&mut self, peer: IpAddr) -> Admit<C> {
        let mut shed = Vec::new();
        if self.per_peer.get(&peer).copied().unwrap_or(0) >= self.limits.max_per_peer.max(1) {
            match self.longest_idle(Some(peer)) {
                Some(id) => shed.extend(self.remove(id)),
                None => return Admit::Refuse,
            }
        }
        if self.open.len() >= self.limits.max_connections.max(1) {
            match self.longest_idle(None) {
                Some(id) => shed.extend(self.remove(id)),
                None if shed.is_empty() => return Admit::Wait,
                // The peer's own shed made room after all (cannot happen
                // with per-peer <= total, but stay correct).
                None => {}
            }
        }
        Admit::Serve(shed)
    }

    /// Records a connection to serve; its id.
    pub(crate) fn insert(&mut self, peer: IpAddr, idle: Arc<IdleMark>, conn: C) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        *self.per_peer.entry(peer).or_default() += 1;
        self.open.insert(id, Entry { peer, idle, conn });
        id
    }

    /// Forgets connection `id` (ended or shed); its closer if it was there.
    pub(crate) fn remove(&mut self, id: u64) -> Option<C> {
        let e = self.open.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&e.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&e.peer);
            }
        }
        Some(e.conn)
    }

    pub(crate) fn drain(&mut self) -> Vec<C> {
        self.per_peer.clear();
        self.open.drain().map(|(_, e)| e.conn).collect()
    }
}

struct Shared {
    stop: AtomicBool,
    table: Mutex<Table<TcpStream>>,
    /// Signalled when a connection ends.
    freed: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
    epoch: Instant,
}

/// The running listener; [`RpcServer::stop`] (or drop) closes it and every
/// connection and waits for their threads.
pub(crate) struct RpcServer {
    shared: Arc<Shared>,
    /// Where to connect to wake the blocking accept.
    wake: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

impl RpcServer {
    pub(crate) fn start(
        listener: TcpListener,
        state: Arc<LocalState>,
        limits: ListenerLimits,
    ) -> Result<RpcServer> {
        let mut wake = listener
            .local_addr()
            .map_err(|e| Error::new(ErrorCode::ERR_SOCKET, e.to_string()))?;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() {
                [127, 0, 0, 1].into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            table: Mutex::new(Table::new(limits)),
            freed: Condvar::new(),
            threads: Mutex::default(),
            epoch: Instant::now(),
        });
        let s = shared.clone();
        let accept = thread::Builder::new()
            .name("mc-rpc-accept".into())
            .spawn(move || accept_loop(listener, state, &s))
            .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, e.to_string()))?;
        Ok(RpcServer {
            shared,
            wake,
            accept: Some(accept),
        })
    }

    pub(crate) fn stop(&mut self) {
        if self.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        {
            // Under the lock, so an accept loop waiting for room sees it.
            let _t = self.shared.table.lock();
            self.shared.freed.notify_all();
        }
        // Wake the blocking accept with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.wake, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        for s in self.shared.table.lock().drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let threads = std::mem::take(&mut *self.shared.threads.lock());
        for h in threads {
            let _ = h.join();
        }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: TcpListener, state: Arc<LocalState>, shared: &Arc<Shared>) {
    let stopping = || shared.stop.load(Ordering::Acquire);
    let refusals = LogLimit::new(REFUSAL_LOG_EVERY);
    loop {
        {
            // Backpressure: accept only when a connection can be served.
            let mut t = shared.table.lock();
            while !t.has_room() && !stopping() {
                shared.freed.wait_for(&mut t, RECHECK);
            }
        }
        let accepted = listener.accept();
        if stopping() {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // e.g. out of file descriptors: back off instead of spinning.
                if let Some(suppressed) = refusals.should_log() {
                    tracing::warn!(suppressed, "rpc: accept failed: {e}");
                }
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let mut t = shared.table.lock();
        let shed = loop {
            match t.admit(peer.ip()) {
                Admit::Serve(shed) => break Some(shed),
                Admit::Refuse => break None,
                Admit::Wait if stopping() => return,
                Admit::Wait => shared.freed.wait_for(&mut t, RECHECK).timed_out(),
            };
        };
        let Some(shed) = shed else {
            drop(t);
            if let Some(suppressed) = refusals.should_log() {
                tracing::warn!(
                    %peer,
                    suppressed,
                    "rpc: too many busy connections from this peer; refusing one"
                );
            }
            continue;
        };
        for s in shed {
            let _ = s.shutdown(Shutdown::Both);
        }
        let Ok(closer) = stream.try_clone() else {
            continue;
        };
        let idle = Arc::new(IdleMark::new(shared.epoch));
        let id = t.insert(peer.ip(), idle.clone(), closer);
        drop(t);
        let (state, s) = (state.clone(), shared.clone());
        let spawned = thread::Builder::new()
            .name("mc-rpc-conn".into())
            .stack_size(CONNECTION_STACK)
            .spawn(move || {
                let stop = || s.stop.load(Ordering::Acquire);
                if let Err(e) = serve(&stream, &state, &idle, &stop) {
                    tracing::debug!("rpc connection closed: {e}");
                }
                // The table holds a duplicate of the socket: shut it down so
                // the peer sees the close now.
                let _ = stream.shutdown(Shutdown::Both);
                s.table.lock().remove(id);
                s.freed.notify_one();
            });
        let mut threads = shared.threads.lock();
        threads.retain(|h| !h.is_finished());
        match spawned {
            Ok(h) => threads.push(h),
            Err(_) => {
                if let Some(c) = shared.table.lock().remove(id) {
                    let _ = c.shutdown(Shutdown::Both);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_peer: usize) -> ListenerLimits {
        ListenerLimits {
            max_connections: total,
            max_per_peer: per_peer,
            idle_timeout: Duration::from_secs(60),
        }
    }

    fn ip(last: u8) -> IpAddr {
        [127, 0, 0, last].into()
    }

    struct Marks {
        epoch: Instant,
        marks: Vec<Arc<IdleMark>>,
    }

    impl Marks {
        fn add(&mut self, t: &mut Table<usize>, peer: IpAddr) -> usize {
            let n = self.marks.len();
            let m = Arc::new(IdleMark::new(self.epoch));
            self.marks.push(m.clone());
            t.insert(peer, m, n);
            n
        }
        /// Marks connection `n` idle since `ms`.
        fn idle_at(&self, n: usize, ms: u64) {
            self.marks[n].idle_at(ms);
        }
    }

    #[test]
    fn a_full_table_sheds_the_longest_idle_or_waits() {
        let mut m = Marks {
            epoch: Instant::now(),
            marks: vec![],
        };
        let mut t = Table::new(limits(3, 3));
        for last in 1..=3 {
            assert_eq!(t.admit(ip(last)), Admit::Serve(vec![]));
            m.add(&mut t, ip(last));
        }
        // All busy: no room, the new one waits.
        assert!(!t.has_room());
        assert_eq!(t.admit(ip(9)), Admit::Wait);
        assert_eq!(t.len(), 3);
        // Idle ones: the longest idle goes first.
        m.idle_at(2, 50);
        m.idle_at(1, 10);
        assert!(t.has_room());
        assert_eq!(t.admit(ip(9)), Admit::Serve(vec![1]));
        m.add(&mut t, ip(9));
        assert_eq!(t.admit(ip(9)), Admit::Serve(vec![2]));
        m.add(&mut t, ip(9));
        assert_eq!(t.len(), 3);
        assert_eq!(t.admit(ip(9)), Admit::Wait);
        // A busy connection again is not shed.
        m.idle_at(0, 5);
        m.marks[0].busy();
        assert_eq!(t.admit(ip(9)), Admit::Wait);
    }

    #[test]
    fn a_peer_over_its_cap_sheds_its_own_idle_or_is_refused() {
        let mut m = Marks {
            epoch: Instant::now(),
            marks: vec![],
        };
        let mut t = Table::new(limits(10, 2));
        m.add(&mut t, ip(1));
        m.add(&mut t, ip(1));
        m.add(&mut t, ip(2));
        m.idle_at(2, 1); // the other peer's idle one is not touched
        assert_eq!(t.admit(ip(1)), Admit::Refuse);
        m.idle_at(1, 7);
        assert_eq!(t.admit(ip(1)), Admit::Serve(vec![1]));
        m.add(&mut t, ip(1));
        assert_eq!(t.len(), 3);
        // Another peer is under its cap.
        assert_eq!(t.admit(ip(3)), Admit::Serve(vec![]));
        // Removal keeps the per-peer count.
        assert_eq!(t.remove(0), Some(0));
        assert_eq!(t.remove(0), None);
        assert_eq!(t.admit(ip(1)), Admit::Serve(vec![]));
        assert_eq!(t.drain().len(), 2);
        assert_eq!(t.len(), 0);
    }
}
