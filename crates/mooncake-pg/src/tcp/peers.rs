//! Who is connected: a listener that takes peers in at any time (the
//! initial mesh, a rank that joins later, a new process taking over a
//! dead rank's number), each peer's incarnation, and the peers a
//! collective's words go to.
//!
//! A dialer says its rank and its incarnation (a nonce drawn when its
//! group is made). This rank attaches to one incarnation per peer; a
//! connection from another one (a replacement this rank has not attached
//! yet, or a stale process) is held, unread, until this rank attaches to
//! it with [`TcpGroup::connect`]. Attaching to a new incarnation forgets
//! everything of the old one (words, messages, counts, death), and a
//! generation number per peer keeps the old connections' threads from
//! touching the new one's state when they end.
//!
//! The peer never writes on the connection this rank dialed; a thread
//! watches it all the same, so a peer this rank dialed but that has not
//! dialed back (a joiner not yet activated) is found dead when its
//! process ends.

use std::hash::{BuildHasher, Hasher};
use std::io::Read;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::frame::Header;
use super::{net, Shared, State, TcpGroup, FLAGS};
use crate::group::GroupError;

/// What a dialer sends first: its rank and incarnation.
pub(super) const HELLO_BYTES: usize = 12;
/// How long a dialer has to say who it is.
const GREET: Duration = Duration::from_secs(10);
/// How long the end of the connection this rank dialed waits for the
/// goodbye that may still be on its way on the peer's connection.
const BYE_GRACE: Duration = Duration::from_secs(2);

pub(super) fn hello(rank: usize, nonce: u64) -> [u8; HELLO_BYTES] {
    let mut b = [0u8; HELLO_BYTES];
    b[..4].copy_from_slice(&(rank as u32).to_le_bytes());
    b[4..].copy_from_slice(&nonce.to_le_bytes());
    b
}

pub(super) fn parse_hello(b: &[u8; HELLO_BYTES]) -> (usize, u64) {
    let rank = u32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
    let nonce = u64::from_le_bytes(b[4..].try_into().expect("8 bytes"));
    (rank as usize, nonce)
}

/// A fresh incarnation nonce (not secret: it tells processes apart).
pub(super) fn new_nonce() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Whether a connection from incarnation `nonce` of a peer is read at
/// once (true) or held until this rank attaches to it: read when this
/// rank is attached to that incarnation or to none yet.
pub(super) fn adopts(attached: Option<u64>, nonce: u64) -> bool {
    attached.is_none_or(|a| a == nonce)
}

/// Forgets what this rank holds of `peer`'s last incarnation.
fn reset(st: &mut State, peer: usize) {
    st.gen[peer] = st.gen[peer].wrapping_add(1);
    st.words[peer] = [0; FLAGS];
    st.inbox[peer].clear();
    st.spare[peer] = None;
    st.read[peer] = 0;
    st.sent[peer] = 0;
    st.acked[peer] = 0;
    st.dead[peer] = false;
    st.bye[peer] = false;
    st.accepted[peer] = false;
    st.reading[peer] = false;
}

/// Accepts peers until the group closes.
pub(super) fn accept_loop(sh: Arc<Shared>, listener: TcpListener) {
    loop {
        let accepted = listener.accept();
        if sh.closed.load(Ordering::SeqCst) {
            return;
        }
        let Ok((s, _)) = accepted else {
            // Out of descriptors or an aborted handshake: try again later.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let Some((peer, nonce)) = greet(&s) else {
            continue;
        };
        if peer >= sh.size || peer == sh.rank || net::tune(&s).is_err() {
            continue;
        }
        let mut st = sh.state.lock();
        if !adopts(st.inc[peer], nonce) {
            if let Some((_, old)) = st.held[peer].replace((nonce, s)) {
                let _ = old.shutdown(Shutdown::Both);
            }
            continue;
        }
        if st.reading[peer] {
            // The same incarnation dialed twice: keep the first.
            continue;
        }
        st.inc[peer] = Some(nonce);
        let gen = st.gen[peer];
        drop(st);
        start_reader(&sh, peer, gen, s);
    }
}

/// The rank and incarnation an accepted connection says it comes from.
fn greet(s: &TcpStream) -> Option<(usize, u64)> {
    s.set_nonblocking(false).ok()?;
    s.set_read_timeout(Some(GREET)).ok()?;
    let mut b = [0u8; HELLO_BYTES];
    (&*s).read_exact(&mut b).ok()?;
    s.set_read_timeout(None).ok()?;
    Some(parse_hello(&b))
}

fn start_reader(sh: &Arc<Shared>, peer: usize, gen: u64, s: TcpStream) {
    let Ok(handle) = s.try_clone() else {
        sh.ended(peer, gen, false);
        return;
    };
    sh.inbound.lock().push((peer, handle));
    {
        let mut st = sh.state.lock();
        st.reading[peer] = true;
        st.accepted[peer] = true;
        sh.cv.notify_all();
    }
    let reader_sh = Arc::clone(sh);
    let started = std::thread::Builder::new()
        .name(format!("mooncake-pg-tcp-{peer}"))
        .spawn(move || super::reader(reader_sh, peer, gen, s));
    if started.is_err() {
        sh.ended(peer, gen, false);
    }
}

/// Waits for the end of the connection this rank dialed to `peer`.
fn watch(sh: Arc<Shared>, peer: usize, gen: u64, mut s: TcpStream) {
    let mut b = [0u8; 64];
    while matches!(s.read(&mut b), Ok(n) if n > 0) {}
    let deadline = Instant::now() + BYE_GRACE;
    let mut st = sh.state.lock();
    // A peer that closes its group says goodbye on its own connection:
    // give its reader the time to read it.
    while st.gen[peer] == gen && st.reading[peer] && !st.bye[peer] {
        if sh.cv.wait_until(&mut st, deadline).timed_out() {
            break;
        }
    }
    if st.gen[peer] == gen && !st.bye[peer] && !sh.closed.load(Ordering::SeqCst) {
        st.dead[peer] = true;
        sh.cv.notify_all();
    }
}

impl Shared {
    /// `peer`'s reader of generation `gen` ended, at a goodbye or not.
    pub(super) fn ended(&self, peer: usize, gen: u64, said_bye: bool) {
        let mut st = self.state.lock();
        if st.gen[peer] != gen {
            return;
        }
        st.reading[peer] = false;
        if said_bye {
            st.bye[peer] = true;
        } else {
            st.dead[peer] = true;
        }
        self.cv.notify_all();
    }
}

impl TcpGroup {
    /// Dials `peer` at `host:port` and attaches to its incarnation `nonce`
    /// (None: whichever dials this rank, as in the initial mesh). A new
    /// incarnation replaces what this rank held of the last one; a
    /// connection it dialed already is read from now on.
    pub fn connect(
        &self,
        peer: usize,
        host: &str,
        port: u16,
        nonce: Option<u64>,
        deadline: Instant,
    ) -> Result<(), GroupError> {
        let sh = &self.shared;
        if peer >= sh.size || peer == sh.rank {
            return Err(GroupError::Setup(format!(
                "rank {peer} is not a peer of rank {} in a group of {}",
                sh.rank, sh.size
            )));
        }
        let s = net::connect(host, port, &hello(sh.rank, sh.nonce), deadline).map_err(|e| {
            GroupError::Setup(format!("cannot reach rank {peer} at {host}:{port}: {e}"))
        })?;
        let watched = s
            .try_clone()
            .map_err(|e| GroupError::Setup(format!("connection to rank {peer}: {e}")))?;
        let mut out = sh.out[peer].lock();
        let (gen, fresh, held) = {
            let mut st = sh.state.lock();
            let fresh = nonce.is_some_and(|n| st.inc[peer] != Some(n));
            if fresh {
                reset(&mut st, peer);
                st.inc[peer] = nonce;
            }
            let held = match st.held[peer].take() {
                Some((n, hs)) if Some(n) == st.inc[peer] && !st.reading[peer] => Some(hs),
                other => {
                    st.held[peer] = other;
                    None
                }
            };
            st.linked[peer] = true;
            (st.gen[peer], fresh, held)
        };
        if fresh {
            sh.inbound.lock().retain(|(p, old)| {
                if *p == peer {
                    let _ = old.shutdown(Shutdown::Both);
                }
                *p != peer
            });
        }
        if let Some(old) = out.replace(s) {
            let _ = old.shutdown(Shutdown::Both);
        }
        drop(out);
        let watch_sh = Arc::clone(sh);
        std::thread::Builder::new()
            .name(format!("mooncake-pg-watch-{peer}"))
            .spawn(move || watch(watch_sh, peer, gen, watched))
            .map_err(|e| GroupError::Setup(format!("cannot start a thread: {e}")))?;
        if let Some(hs) = held {
            start_reader(sh, peer, gen, hs);
        }
        Ok(())
    }

    /// Waits until every rank of `peers` has dialed this rank.
    pub fn wait_connected(&self, peers: &[usize], deadline: Instant) -> Result<(), GroupError> {
        let sh = &self.shared;
        let ok = |st: &State| peers.iter().all(|&p| p >= sh.size || st.accepted[p]);
        match sh.wait_until(deadline, ok) {
            Ok(_) => Ok(()),
            Err(_) => {
                let st = sh.state.lock();
                let late: Vec<usize> = peers
                    .iter()
                    .copied()
                    .filter(|&p| p < sh.size && !st.accepted[p])
                    .collect();
                Err(GroupError::Setup(format!(
                    "ranks {late:?} did not connect back in time"
                )))
            }
        }
    }

    /// The peers this rank's collective words (Arrive, Reduced, Done) go
    /// to: the active ranks. A peer that becomes one gets this rank's
    /// words as they are, so it waits on the group's round, not the one it
    /// last heard of; a peer dialed but not activated gets nothing.
    pub fn set_members(&self, ranks: &[usize]) {
        let sh = &self.shared;
        for p in (0..sh.size).filter(|&p| p != sh.rank) {
            let want = ranks.contains(&p);
            let mut out = sh.out[p].lock();
            let was = sh.members[p].swap(want, Ordering::SeqCst);
            if want && !was && out.is_some() {
                let words = sh.state.lock().words[sh.rank];
                for (f, &v) in words.iter().enumerate() {
                    if !sh.send_locked(p, &mut out, &Header::word(f as u8, v, 0, 0, 0), &[]) {
                        break;
                    }
                }
            }
        }
    }

    /// This rank's incarnation, as its peers' [`TcpGroup::connect`] name it.
    pub fn nonce(&self) -> u64 {
        self.shared.nonce
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::Flag;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    const SLOT: usize = 64 << 10;

    /// `g` dials `peer` (its incarnation) and waits for it to dial back.
    fn link(g: &TcpGroup, peer: &TcpGroup) {
        g.connect(
            peer.rank(),
            "127.0.0.1",
            peer.port(),
            Some(peer.nonce()),
            soon(),
        )
        .unwrap();
    }

    #[test]
    fn a_hello_says_rank_and_incarnation() {
        let b = hello(7, 0xdead_beef_0123_4567);
        assert_eq!(parse_hello(&b), (7, 0xdead_beef_0123_4567));
        assert_ne!(new_nonce(), new_nonce());
    }

    #[test]
    fn only_the_attached_incarnation_or_the_first_is_read() {
        assert!(adopts(None, 5), "nothing attached yet: the first is read");
        assert!(adopts(Some(5), 5));
        assert!(!adopts(Some(5), 6), "another incarnation waits");
    }

    #[test]
    fn a_rank_joins_after_setup_and_gets_only_the_active_ranks_words() {
        let a = TcpGroup::new(0, 2, SLOT).unwrap();
        let j = TcpGroup::new(1, 2, SLOT).unwrap();
        // The active rank dials the joiner, which runs alone meanwhile:
        // its collective words go nowhere, the active rank's neither.
        link(&a, &j);
        a.set_members(&[0]);
        j.set_members(&[1]);
        a.post(Flag::Arrive, 7);
        j.post(Flag::Arrive, 3);
        j.wait_connected(&[0], soon()).unwrap();
        assert!(!j.connected(0), "the joiner has not dialed back yet");
        // Activated: the joiner dials back, both count the other in and
        // each gets the other's words as they are now.
        link(&j, &a);
        a.wait_connected(&[1], soon()).unwrap();
        j.set_members(&[0, 1]);
        a.set_members(&[0, 1]);
        assert_eq!(
            j.wait(&[0], Flag::Arrive, 7, soon()).unwrap(),
            Vec::<usize>::new()
        );
        assert_eq!(
            a.wait(&[1], Flag::Arrive, 3, soon()).unwrap(),
            Vec::<usize>::new()
        );
        assert_eq!(j.flag(0, Flag::Arrive), 7);
    }

    #[test]
    fn a_new_process_takes_over_a_dead_ranks_number() {
        let a = TcpGroup::new(0, 2, SLOT).unwrap();
        let old = TcpGroup::new(1, 2, SLOT).unwrap();
        link(&a, &old);
        link(&old, &a);
        a.wait_connected(&[1], soon()).unwrap();
        old.post(Flag::Arrive, 5);
        assert_eq!(
            a.wait(&[1], Flag::Arrive, 5, soon()).unwrap(),
            Vec::<usize>::new()
        );
        // Dies without a goodbye: its sockets end.
        for s in old.shared.out.iter() {
            if let Some(s) = s.lock().take() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        assert_eq!(a.wait(&[1], Flag::Done, 1, soon()).unwrap(), vec![1]);
        assert_eq!(a.dead(&[1]), vec![1]);
        // Its replacement: a fresh incarnation, its words from zero.
        let new = TcpGroup::new(1, 2, SLOT).unwrap();
        link(&a, &new);
        assert!(a.dead(&[1]).is_empty(), "the replacement is alive");
        assert_eq!(
            a.flag(1, Flag::Arrive),
            0,
            "the old incarnation's words are gone"
        );
        link(&new, &a);
        a.wait_connected(&[1], soon()).unwrap();
        new.post(Flag::Arrive, 1);
        assert_eq!(
            a.wait(&[1], Flag::Arrive, 1, soon()).unwrap(),
            Vec::<usize>::new()
        );
        a.send(1, 9, b"hi", soon()).unwrap();
        let mut got = [0u8; 2];
        assert_eq!(new.recv_header(0, soon()).unwrap(), (9, 2));
        new.recv_body(0, &mut got, soon()).unwrap();
        assert_eq!(&got, b"hi");
        // The old one's end, late, does not touch the new one.
        drop(old);
        std::thread::sleep(Duration::from_millis(200));
        assert!(a.dead(&[1]).is_empty());
    }

    #[test]
    fn a_rank_that_left_is_gone_for_its_peers_and_they_for_it() {
        let a = TcpGroup::new(0, 2, SLOT).unwrap();
        let b = TcpGroup::new(1, 2, SLOT).unwrap();
        link(&a, &b);
        link(&b, &a);
        a.wait_connected(&[1], soon()).unwrap();
        b.wait_connected(&[0], soon()).unwrap();
        b.post(Flag::Left, 1);
        assert_eq!(a.wait(&[1], Flag::Arrive, 1, soon()).unwrap(), vec![1]);
        assert_eq!(b.dead(&[0]), vec![0], "a rank that left waits on no one");
    }

    #[test]
    fn a_peer_that_closes_says_goodbye_and_is_not_dead() {
        let a = TcpGroup::new(0, 2, SLOT).unwrap();
        let b = TcpGroup::new(1, 2, SLOT).unwrap();
        link(&a, &b);
        link(&b, &a);
        a.wait_connected(&[1], soon()).unwrap();
        b.close();
        std::thread::sleep(BYE_GRACE + Duration::from_millis(500));
        assert!(a.dead(&[1]).is_empty());
    }
}
