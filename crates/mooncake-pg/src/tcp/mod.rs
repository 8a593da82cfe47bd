//! The TCP transport: the shared-memory group's interface over a TCP mesh,
//! for ranks on different hosts.
//!
//! Every rank keeps a local copy of each peer's two collective slots and
//! control words. Posting a round's word sends, before the word, the bytes
//! this rank wrote into that round's slot (the range the plane touched),
//! so a peer that sees the word reads a complete slot from its copy. The
//! schedules are the same as over shared memory: a slot is only rewritten
//! after every peer posted Done for it, and TCP keeps the order, so a copy
//! is never overwritten while its reader still needs it. A post to several
//! peers writes its payload to them in turns of [`PIECE`] bytes, so all of
//! them receive at once.
//!
//! Every rank opens one connection to each peer (its frames to it) and
//! accepts one from each (the peer's frames, read by a thread of its own
//! straight into the peer's slot copy or a message buffer). Point-to-point
//! messages travel as frames into the receiver's inbox; the receiver
//! acknowledges each one it reads (a send completes when its peer has read
//! it, as with the mailboxes).
//!
//! A peer is dead when its connection ends without the goodbye a rank
//! sends when it closes its group: a killed process's sockets are closed
//! by its kernel at once; a host that vanishes is found by TCP keepalive
//! or the retransmission timeout of unacknowledged data
//! ([`KEEPALIVE`], `TCP_USER_TIMEOUT`), whichever applies.

pub mod frame;
mod net;
mod peers;
mod posted;

use std::alloc::{self, Layout as AllocLayout};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::group::{Flag, GroupError};
use crate::wait::reached;
use frame::{Header, Kind, HEADER_BYTES};
pub use net::KEEPALIVE;

/// Collective slots per rank (rounds alternate between them).
pub const SLOTS: usize = 2;
const FLAGS: usize = 5;
const LEFT: usize = Flag::Left as usize;
/// A post's payload goes to its peers in turns of this many bytes.
pub const PIECE: usize = 256 << 10;
/// Frames up to this size are written with their header in one call.
const GATHER_MAX: usize = 64 << 10;
/// `try_send` sends messages up to this size from the caller's thread.
pub const TRY_SEND_MAX: usize = 64 << 10;

/// The slots of every rank, this rank's and its copies of its peers'.
/// Written by this rank's plane (its own) and the reader threads (the
/// peers'), read through raw addresses handed to the plane: the control
/// words, under the state lock, order those accesses.
struct SlotMem {
    ptr: NonNull<u8>,
    layout: AllocLayout,
}

// SAFETY: the memory is plain bytes owned by this value; who writes which
// part when is ordered by the protocol above, not by Rust references.
unsafe impl Send for SlotMem {}
// SAFETY: as for Send.
unsafe impl Sync for SlotMem {}

impl SlotMem {
    fn new(bytes: usize) -> Result<SlotMem, GroupError> {
        let layout = AllocLayout::from_size_align(bytes.max(1), 64)
            .map_err(|e| GroupError::Setup(format!("slots of {bytes} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| GroupError::Setup(format!("cannot allocate {bytes} bytes of slots")))?;
        Ok(SlotMem { ptr, layout })
    }
}

impl Drop for SlotMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

struct State {
    words: Vec<[u32; FLAGS]>,
    inbox: Vec<VecDeque<(i64, Vec<u8>)>>,
    /// A message buffer read out, kept to receive the peer's next one.
    spare: Vec<Option<Vec<u8>>>,
    /// A receive from each peer waiting to be filled by its reader.
    posted: Vec<Option<posted::Posted>>,
    /// A round's payload from each peer to go into a caller's buffer.
    redirect: Vec<Option<posted::Redirect>>,
    read: Vec<u32>,
    sent: Vec<u32>,
    acked: Vec<u32>,
    dead: Vec<bool>,
    accepted: Vec<bool>,
    /// The incarnation of each peer this rank is attached to.
    inc: Vec<Option<u64>>,
    /// A connection from another incarnation, until this rank attaches.
    held: Vec<Option<(u64, TcpStream)>>,
    /// Bumped when this rank attaches to a new incarnation: the old
    /// connections' threads then leave the peer's state alone.
    gen: Vec<u64>,
    /// The peer's reader runs / ended at its goodbye.
    reading: Vec<bool>,
    bye: Vec<bool>,
    /// This rank dialed the peer (it is mapped, in shared memory's terms).
    linked: Vec<bool>,
}

impl State {
    /// Whether `peer` is out of the group: dead, or it left (or this rank
    /// left, when every peer counts: its pending waits end too).
    fn gone(&self, me: usize, peer: usize) -> bool {
        self.dead[peer] || self.words[peer][LEFT] != 0 || self.words[me][LEFT] != 0
    }
}

struct Shared {
    rank: usize,
    size: usize,
    nonce: u64,
    /// The peers collective words go to ([`TcpGroup::set_members`]).
    members: Vec<AtomicBool>,
    slot_bytes: usize,
    mem: SlotMem,
    state: Mutex<State>,
    cv: Condvar,
    /// This rank's connection to each peer.
    out: Vec<Mutex<Option<TcpStream>>>,
    /// Handles of the accepted connections, to end their readers on close.
    inbound: Mutex<Vec<(usize, TcpStream)>>,
    /// The range of each of this rank's slots written since its round began.
    dirty: Mutex<[Option<(usize, usize)>; SLOTS]>,
    closed: AtomicBool,
}

impl Shared {
    fn slot_ptr(&self, rank: usize, slot: usize) -> *mut u8 {
        debug_assert!(rank < self.size && slot < SLOTS);
        // SAFETY: within the allocation of size * SLOTS * slot_bytes.
        unsafe {
            self.mem
                .ptr
                .as_ptr()
                .add((rank * SLOTS + slot) * self.slot_bytes)
        }
    }

    fn mark_dead(&self, peer: usize) {
        let mut st = self.state.lock();
        st.dead[peer] = true;
        self.cv.notify_all();
    }

    /// Waits until `ready` holds or `deadline` passes.
    fn wait_until(
        &self,
        deadline: Instant,
        mut ready: impl FnMut(&State) -> bool,
    ) -> Result<parking_lot::MutexGuard<'_, State>, GroupError> {
        let mut st = self.state.lock();
        while !ready(&st) {
            if self.cv.wait_until(&mut st, deadline).timed_out() && !ready(&st) {
                return Err(GroupError::Timeout);
            }
        }
        Ok(st)
    }

    /// Writes one frame to `peer`; false (the peer is marked dead) when
    /// its connection is gone.
    fn send_frame(&self, peer: usize, h: &Header, data: &[u8]) -> bool {
        let mut out = self.out[peer].lock();
        self.send_locked(peer, &mut out, h, data)
    }

    /// Numbers the next message to `dst` (what its reader's count reaches
    /// once it read it); `Dead` when `dst` is gone.
    fn count_send(&self, dst: usize) -> Result<u32, GroupError> {
        let mut st = self.state.lock();
        if st.gone(self.rank, dst) {
            return Err(GroupError::Dead(vec![dst]));
        }
        st.sent[dst] = st.sent[dst].wrapping_add(1);
        Ok(st.sent[dst])
    }

    fn send_locked(
        &self,
        peer: usize,
        out: &mut Option<TcpStream>,
        h: &Header,
        data: &[u8],
    ) -> bool {
        let Some(s) = out.as_mut() else {
            return false;
        };
        let ok = if data.len() <= GATHER_MAX {
            let mut buf = Vec::with_capacity(HEADER_BYTES + data.len());
            buf.extend_from_slice(&h.encode());
            buf.extend_from_slice(data);
            s.write_all(&buf).is_ok()
        } else {
            s.write_all(&h.encode()).is_ok() && s.write_all(data).is_ok()
        };
        if !ok {
            let _ = s.shutdown(Shutdown::Both);
            *out = None;
            self.mark_dead(peer);
        }
        ok
    }
}

/// One rank's connections to its peers, with the calls the plane and the
/// backend make on a shared-memory group.
pub struct TcpGroup {
    shared: Arc<Shared>,
    listener: Mutex<Option<TcpListener>>,
    port: u16,
}

impl TcpGroup {
    /// Slots for `size` ranks of `slot_bytes` each and a listening socket
    /// on every interface (its port: [`TcpGroup::port`]), which takes
    /// peers in for as long as the group lives.
    pub fn new(rank: usize, size: usize, slot_bytes: usize) -> Result<TcpGroup, GroupError> {
        if rank >= size {
            return Err(GroupError::Setup(format!(
                "rank {rank} of a group of {size}"
            )));
        }
        if slot_bytes == 0 || !slot_bytes.is_multiple_of(64) {
            return Err(GroupError::Setup(format!(
                "slot of {slot_bytes} bytes: expected a positive multiple of 64"
            )));
        }
        let total = size
            .checked_mul(SLOTS * slot_bytes)
            .ok_or_else(|| GroupError::Setup("slots overflow the address space".into()))?;
        let listener = TcpListener::bind(("0.0.0.0", 0))
            .map_err(|e| GroupError::Setup(format!("cannot listen: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| GroupError::Setup(format!("cannot listen: {e}")))?
            .port();
        let shared = Arc::new(Shared {
            rank,
            size,
            nonce: peers::new_nonce(),
            members: (0..size).map(|_| AtomicBool::new(true)).collect(),
            slot_bytes,
            mem: SlotMem::new(total)?,
            state: Mutex::new(State {
                words: vec![[0; FLAGS]; size],
                inbox: vec![VecDeque::new(); size],
                spare: vec![None; size],
                posted: vec![None; size],
                redirect: vec![None; size],
                read: vec![0; size],
                sent: vec![0; size],
                acked: vec![0; size],
                dead: vec![false; size],
                accepted: vec![false; size],
                inc: vec![None; size],
                held: (0..size).map(|_| None).collect(),
                gen: vec![0; size],
                reading: vec![false; size],
                bye: vec![false; size],
                linked: vec![false; size],
            }),
            cv: Condvar::new(),
            out: (0..size).map(|_| Mutex::new(None)).collect(),
            inbound: Mutex::new(Vec::new()),
            dirty: Mutex::new([None; SLOTS]),
            closed: AtomicBool::new(false),
        });
        let accepting = listener
            .try_clone()
            .map_err(|e| GroupError::Setup(format!("listener: {e}")))?;
        let accept_sh = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("mooncake-pg-accept".into())
            .spawn(move || peers::accept_loop(accept_sh, accepting))
            .map_err(|e| GroupError::Setup(format!("cannot start a thread: {e}")))?;
        Ok(TcpGroup {
            shared,
            listener: Mutex::new(Some(listener)),
            port,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    pub fn size(&self) -> usize {
        self.shared.size
    }

    pub fn slot_bytes(&self) -> usize {
        self.shared.slot_bytes
    }

    /// Opens a connection to every peer of `peers` (`(rank, host, port)`)
    /// and waits until each has dialed this rank, by `deadline`.
    pub fn connect_all(
        &self,
        peers: &[(usize, String, u16)],
        deadline: Instant,
    ) -> Result<(), GroupError> {
        for (peer, host, port) in peers {
            self.connect(*peer, host, *port, None, deadline)?;
        }
        let ranks: Vec<usize> = peers.iter().map(|p| p.0).collect();
        self.wait_connected(&ranks, deadline)
    }

    /// Whether `rank` is this rank or a peer it dialed.
    pub fn connected(&self, rank: usize) -> bool {
        rank == self.shared.rank
            || (rank < self.shared.size && self.shared.state.lock().linked[rank])
    }

    /// The address of `rank`'s slot `slot` (this rank's own, or its copy
    /// of a peer's): `slot_bytes` bytes that live as long as the group.
    pub fn slot_addr(&self, rank: usize, slot: usize) -> Option<usize> {
        (rank < self.shared.size && slot < SLOTS).then(|| self.shared.slot_ptr(rank, slot) as usize)
    }

    /// This rank wrote bytes `lo..hi` of its slot: they go with the
    /// round's next Arrive or Reduced post.
    pub fn touch(&self, slot: usize, lo: usize, hi: usize) -> Result<(), GroupError> {
        if slot >= SLOTS || lo > hi || hi > self.shared.slot_bytes {
            return Err(GroupError::Setup(format!(
                "bytes {lo}..{hi} of slot {slot} are not in a {}-byte slot",
                self.shared.slot_bytes
            )));
        }
        let mut d = self.shared.dirty.lock();
        d[slot] = Some(frame::widen(d[slot], lo, hi));
        Ok(())
    }

    /// Forgets what was written into `slot` (a new round begins in it).
    pub fn clean(&self, slot: usize) {
        if slot < SLOTS {
            self.shared.dirty.lock()[slot] = None;
        }
    }

    /// Sets this rank's `flag` to `value` at every live peer, after the
    /// bytes written into the round's slot when it is an Arrive or Reduced.
    pub fn post(&self, flag: Flag, value: u32) {
        let sh = &self.shared;
        let slot = (value & 1) as usize;
        let range = match flag {
            Flag::Arrive | Flag::Reduced => sh.dirty.lock()[slot],
            _ => None,
        };
        let base = sh.slot_ptr(sh.rank, slot).cast_const();
        self.post_each(flag, value, base, |_| range.unwrap_or((0, 0)));
    }

    /// `post` that sends each peer `p` bytes `parts[p]` of the round's
    /// slot instead of what was touched: in a reduce-scatter a peer needs
    /// only the part it reduces. With `src`, the bytes come from `src` at
    /// the same offsets (the caller's tensor, sent without first copying
    /// it into the slot); they land in the peer's copy of the slot.
    pub fn post_parts(
        &self,
        flag: Flag,
        value: u32,
        parts: &[(usize, usize)],
        src: Option<&[u8]>,
    ) -> Result<(), GroupError> {
        let sh = &self.shared;
        if parts.len() != sh.size {
            return Err(GroupError::Setup(format!(
                "{} parts for a group of {}",
                parts.len(),
                sh.size
            )));
        }
        let limit = src.map_or(sh.slot_bytes, |b| b.len().min(sh.slot_bytes));
        if let Some((lo, hi)) = parts.iter().find(|&&(lo, hi)| lo > hi || hi > limit) {
            return Err(GroupError::Setup(format!(
                "bytes {lo}..{hi} are not in a {limit}-byte slot or source"
            )));
        }
        let base = match src {
            Some(b) => b.as_ptr(),
            None => sh.slot_ptr(sh.rank, (value & 1) as usize).cast_const(),
        };
        self.post_each(flag, value, base, |p| parts[p]);
        Ok(())
    }

    /// Sets the word at every live peer `p` after bytes `range(p)` from
    /// `base` (this rank's slot of the round, or a caller's buffer that
    /// holds every range).
    fn post_each(
        &self,
        flag: Flag,
        value: u32,
        base: *const u8,
        range: impl Fn(usize) -> (usize, usize),
    ) {
        let sh = &self.shared;
        let slot = (value & 1) as usize;
        sh.state.lock().words[sh.rank][flag as usize] = value;
        // A collective's words go to the active ranks only.
        let collective = matches!(flag, Flag::Arrive | Flag::Reduced | Flag::Done);
        let mut peers: Vec<(usize, parking_lot::MutexGuard<'_, Option<TcpStream>>)> = (0..sh.size)
            .filter(|&p| p != sh.rank)
            .map(|p| (p, sh.out[p].lock()))
            .filter(|(p, s)| s.is_some() && (!collective || sh.members[*p].load(Ordering::SeqCst)))
            .collect();
        let ranges: Vec<(usize, usize)> = peers.iter().map(|(p, _)| range(*p)).collect();
        // SAFETY: every range lies in the memory at `base` (the callers
        // check), which nothing writes until this post returns.
        let data =
            |(lo, hi): (usize, usize)| unsafe { std::slice::from_raw_parts(base.add(lo), hi - lo) };
        let head =
            |(lo, hi): (usize, usize)| Header::word(flag as u8, value, slot as u16, lo, hi - lo);
        let longest = ranges.iter().map(|(lo, hi)| hi - lo).max().unwrap_or(0);
        if longest <= GATHER_MAX || peers.len() <= 1 {
            for ((p, s), r) in peers.iter_mut().zip(&ranges) {
                sh.send_locked(*p, s, &head(*r), data(*r));
            }
            return;
        }
        // Large: every peer gets its header, then its payload in turns.
        let mut live: Vec<bool> = peers
            .iter_mut()
            .zip(&ranges)
            .map(|((p, s), r)| write_or_drop(sh, *p, s, &head(*r).encode()))
            .collect();
        for turn in 0..longest.div_ceil(PIECE) {
            for (i, ((p, s), &(lo, hi))) in peers.iter_mut().zip(&ranges).enumerate() {
                let (a, b) = frame::turn(lo, hi, turn, PIECE);
                if live[i] && b > a {
                    live[i] = write_or_drop(sh, *p, s, data((a, b)));
                }
            }
        }
    }

    pub fn flag(&self, rank: usize, flag: Flag) -> u32 {
        self.shared.state.lock().words[rank][flag as usize]
    }

    pub fn dead(&self, ranks: &[usize]) -> Vec<usize> {
        let st = self.shared.state.lock();
        ranks
            .iter()
            .copied()
            .filter(|&r| {
                r < self.shared.size && r != self.shared.rank && st.gone(self.shared.rank, r)
            })
            .collect()
    }

    /// Waits until every rank of `ranks` (but this one) reached `value` of
    /// `flag` or died; returns the dead ones that did not reach it.
    pub fn wait(
        &self,
        ranks: &[usize],
        flag: Flag,
        value: u32,
        deadline: Instant,
    ) -> Result<Vec<usize>, GroupError> {
        let sh = &self.shared;
        let f = flag as usize;
        let others: Vec<usize> = ranks
            .iter()
            .copied()
            .filter(|&r| r != sh.rank && r < sh.size)
            .collect();
        let st = sh.wait_until(deadline, |st| {
            others
                .iter()
                .all(|&r| reached(st.words[r][f], value) || st.gone(sh.rank, r))
        })?;
        Ok(others
            .into_iter()
            .filter(|&r| !reached(st.words[r][f], value))
            .collect())
    }

    /// Sends `data` to `dst` under `tag`; returns the count `wait_read`
    /// waits for. A write stalled past `deadline` breaks the connection.
    pub fn send(
        &self,
        dst: usize,
        tag: i64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<u32, GroupError> {
        let sh = &self.shared;
        let mut out = sh.out[dst].lock();
        if let Some(s) = out.as_ref() {
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = s.set_write_timeout(Some(left.max(Duration::from_millis(1))));
        }
        let count = sh.count_send(dst)?;
        if !sh.send_locked(dst, &mut out, &Header::msg(tag, data.len()), data) {
            return Err(if Instant::now() >= deadline {
                GroupError::Timeout
            } else {
                GroupError::Dead(vec![dst])
            });
        }
        if let Some(s) = out.as_ref() {
            let _ = s.set_write_timeout(None);
        }
        Ok(count)
    }

    /// `send` for a message of at most [`TRY_SEND_MAX`] bytes when no
    /// other write to `dst` is under way; None (nothing sent) otherwise.
    pub fn try_send(&self, dst: usize, tag: i64, data: &[u8]) -> Result<Option<u32>, GroupError> {
        let sh = &self.shared;
        if data.len() > TRY_SEND_MAX {
            return Ok(None);
        }
        let Some(mut out) = sh.out[dst].try_lock() else {
            return Ok(None);
        };
        let count = sh.count_send(dst)?;
        if !sh.send_locked(dst, &mut out, &Header::msg(tag, data.len()), data) {
            return Err(GroupError::Dead(vec![dst]));
        }
        Ok(Some(count))
    }

    /// Waits until `dst` has read this rank's messages up to `end`.
    pub fn wait_read(&self, dst: usize, end: u32, deadline: Instant) -> Result<(), GroupError> {
        let me = self.shared.rank;
        let st = self.shared.wait_until(deadline, |st| {
            reached(st.acked[dst], end) || st.gone(me, dst)
        })?;
        if reached(st.acked[dst], end) {
            Ok(())
        } else {
            Err(GroupError::Dead(vec![dst]))
        }
    }

    /// The tag and length of the next message from `src`.
    pub fn recv_header(&self, src: usize, deadline: Instant) -> Result<(i64, usize), GroupError> {
        let st = self.shared.wait_until(deadline, |st| {
            !st.inbox[src].is_empty() || st.gone(self.shared.rank, src)
        })?;
        match st.inbox[src].front() {
            Some((tag, data)) => Ok((*tag, data.len())),
            None => Err(GroupError::Dead(vec![src])),
        }
    }

    /// Copies the next message from `src` into `out`, which must be its
    /// length (else nothing is read), and acknowledges it.
    pub fn recv_body(
        &self,
        src: usize,
        out: &mut [u8],
        deadline: Instant,
    ) -> Result<(), GroupError> {
        let sh = &self.shared;
        let mut st = sh.wait_until(deadline, |st| {
            !st.inbox[src].is_empty() || st.gone(sh.rank, src)
        })?;
        let Some((_, data)) = st.inbox[src].front() else {
            return Err(GroupError::Dead(vec![src]));
        };
        if data.len() != out.len() {
            return Err(GroupError::Setup(format!(
                "the message from rank {src} has {} bytes, not {}",
                data.len(),
                out.len()
            )));
        }
        let (_, data) = st.inbox[src].pop_front().expect("front checked");
        st.read[src] = st.read[src].wrapping_add(1);
        let count = st.read[src];
        drop(st);
        out.copy_from_slice(&data);
        {
            let mut st = sh.state.lock();
            if st.spare[src]
                .as_ref()
                .is_none_or(|s| s.capacity() < data.capacity())
            {
                st.spare[src] = Some(data);
            }
        }
        sh.send_frame(src, &Header::ack(count), &[]);
        Ok(())
    }

    /// Whether a message from `src` waits to be read.
    pub fn pending(&self, src: usize) -> bool {
        !self.shared.state.lock().inbox[src].is_empty()
    }

    /// Says goodbye to every peer and ends the connections. Idempotent.
    pub fn close(&self) {
        let sh = &self.shared;
        if sh.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(l) = self.listener.lock().take() {
            // Wakes the accepting thread, which then sees the group closed.
            let _ = socket2::SockRef::from(&l).shutdown(Shutdown::Both);
            let _ = TcpStream::connect_timeout(
                &std::net::SocketAddr::from(([127, 0, 0, 1], self.port)),
                Duration::from_millis(100),
            );
        }
        for held in sh.state.lock().held.iter_mut() {
            if let Some((_, s)) = held.take() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        for peer in 0..sh.size {
            let mut out = sh.out[peer].lock();
            if let Some(s) = out.as_mut() {
                let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                let _ = s.write_all(&Header::bye().encode());
                let _ = s.shutdown(Shutdown::Both);
            }
            *out = None;
        }
        for (_, s) in sh.inbound.lock().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for TcpGroup {
    fn drop(&mut self) {
        self.close();
    }
}

fn write_or_drop(sh: &Shared, peer: usize, out: &mut Option<TcpStream>, bytes: &[u8]) -> bool {
    let Some(s) = out.as_mut() else {
        return false;
    };
    if s.write_all(bytes).is_ok() {
        return true;
    }
    let _ = s.shutdown(Shutdown::Both);
    *out = None;
    sh.mark_dead(peer);
    false
}

/// Reads `peer`'s frames until its goodbye or its connection ends (then
/// the peer is dead).
fn reader(sh: Arc<Shared>, peer: usize, gen: u64, mut s: TcpStream) {
    let said_bye = read_frames(&sh, peer, &mut s).unwrap_or(false);
    let _ = s.shutdown(Shutdown::Both);
    sh.ended(peer, gen, said_bye);
}

/// Ok(true) at a goodbye; Err when the connection failed or the peer sent
/// what cannot be a frame.
fn read_frames(sh: &Shared, peer: usize, s: &mut TcpStream) -> Result<bool, String> {
    let mut head = [0u8; HEADER_BYTES];
    loop {
        s.read_exact(&mut head).map_err(|e| e.to_string())?;
        let h = Header::decode(&head)?;
        match h.kind {
            Kind::Word => {
                let f = usize::from(h.flag);
                if f >= FLAGS {
                    return Err(format!("bad flag {f}"));
                }
                let (lo, hi) = h.slot_range(SLOTS, sh.slot_bytes)?;
                if hi > lo && !posted::read_redirected(sh, peer, s, &h, lo, hi)? {
                    // SAFETY: lo..hi lies in the peer's slot copy (checked
                    // above), which nothing else writes, and which the
                    // plane reads only after this word arrives.
                    let buf = unsafe {
                        std::slice::from_raw_parts_mut(
                            sh.slot_ptr(peer, usize::from(h.slot)).add(lo),
                            hi - lo,
                        )
                    };
                    s.read_exact(buf).map_err(|e| e.to_string())?;
                }
                let mut st = sh.state.lock();
                st.words[peer][f] = h.value;
                sh.cv.notify_all();
            }
            Kind::Msg => posted::read_msg(sh, peer, s, &h)?,
            Kind::Ack => {
                let mut st = sh.state.lock();
                st.acked[peer] = h.offset as u32;
                sh.cv.notify_all();
            }
            Kind::Bye => return Ok(true),
        }
    }
}

#[cfg(test)]
mod tests;
