//! One rank's view of a same-host group: its own segment and its peers'.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::time::Instant;

use memmap2::MmapMut;
use parking_lot::Mutex;

use crate::layout::{Layout, MAGIC};
use crate::wait::{reached, wait_word, Line, ProcessWatch, WaitError};

/// A rank's collective control words. Each only grows (wrapping), so a
/// waiter asks "has the peer reached round k" and a skipped post of an
/// earlier round is implied by a later one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flag {
    /// The rank's input of round k is in its slot.
    Arrive = 0,
    /// The rank's part of round k is reduced in its slot.
    Reduced = 1,
    /// The rank has read all it needs of round k from the others' slots.
    Done = 2,
    /// The rank has mapped every peer (setup only).
    Ready = 3,
    /// Non-zero once the rank has left the group for good (it deactivated
    /// itself): its peers treat it as dead although its process may run.
    Left = 4,
}

impl Flag {
    /// The flag numbered `n`, as the Python glue names them.
    pub fn from_index(n: usize) -> Option<Flag> {
        [
            Flag::Arrive,
            Flag::Reduced,
            Flag::Done,
            Flag::Ready,
            Flag::Left,
        ]
        .get(n)
        .copied()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GroupError {
    #[error("ranks {0:?} of the group are dead")]
    Dead(Vec<usize>),
    #[error("timed out waiting for a peer")]
    Timeout,
    #[error("{0}")]
    Setup(String),
}

impl From<WaitError> for GroupError {
    fn from(e: WaitError) -> Self {
        match e {
            WaitError::Dead(r) => GroupError::Dead(r),
            WaitError::Timeout => GroupError::Timeout,
        }
    }
}

const HDR_WORLD: usize = 8;
const HDR_RANK: usize = 16;
const HDR_SLOT: usize = 24;
const HDR_RING: usize = 32;
/// A mailbox message: tag (i64) then payload length (u64).
const MSG_HEADER: usize = 16;

/// One rank's mapping of its own and its peers' segments. A peer can be
/// mapped again (a replacement process taking over its rank); every
/// mapping ever made stays until the group is dropped, so an address
/// handed out earlier never dangles.
pub struct ShmGroup {
    rank: usize,
    layout: Layout,
    path: PathBuf,
    unlinked: AtomicBool,
    bases: Vec<AtomicPtr<u8>>,
    held: Mutex<Vec<MmapMut>>,
    watches: Vec<Mutex<Option<ProcessWatch>>>,
    tx: Vec<Mutex<()>>,
    rx: Vec<Mutex<()>>,
}

fn setup(what: &str, path: &Path, e: impl std::fmt::Display) -> GroupError {
    GroupError::Setup(format!("{what} {}: {e}", path.display()))
}

impl ShmGroup {
    /// Creates this rank's segment as a new file `path` (which must not
    /// exist) and maps it. Peers are added with [`ShmGroup::connect`].
    pub fn create(path: &Path, rank: usize, layout: Layout) -> Result<ShmGroup, GroupError> {
        if rank >= layout.world {
            return Err(GroupError::Setup(format!(
                "rank {rank} outside a group of {}",
                layout.world
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| setup("cannot create", path, e))?;
        file.set_len(layout.len() as u64)
            .map_err(|e| setup("cannot size", path, e))?;
        // SAFETY: the file is ours, just created with this length; peers
        // only map it after its name is published.
        let mut map =
            unsafe { MmapMut::map_mut(&file) }.map_err(|e| setup("cannot map", path, e))?;
        map[HDR_WORLD..HDR_WORLD + 8].copy_from_slice(&(layout.world as u64).to_le_bytes());
        map[HDR_RANK..HDR_RANK + 8].copy_from_slice(&(rank as u64).to_le_bytes());
        map[HDR_SLOT..HDR_SLOT + 8].copy_from_slice(&(layout.slot_bytes as u64).to_le_bytes());
        map[HDR_RING..HDR_RING + 8].copy_from_slice(&(layout.ring_bytes as u64).to_le_bytes());
        map[..8].copy_from_slice(&MAGIC.to_le_bytes());
        let bases: Vec<AtomicPtr<u8>> = (0..layout.world)
            .map(|_| AtomicPtr::new(std::ptr::null_mut()))
            .collect();
        bases[rank].store(map.as_ptr() as *mut u8, Ordering::Release);
        Ok(ShmGroup {
            rank,
            layout,
            path: path.to_owned(),
            unlinked: AtomicBool::new(false),
            bases,
            held: Mutex::new(vec![map]),
            watches: (0..layout.world).map(|_| Mutex::new(None)).collect(),
            tx: (0..layout.world).map(|_| Mutex::new(())).collect(),
            rx: (0..layout.world).map(|_| Mutex::new(())).collect(),
        })
    }

    /// Maps `peer`'s segment at `path`, checks it was made for this group,
    /// and watches its process `pid`. Connecting a peer again (a new
    /// process for its rank) starts both mailboxes with it afresh; the
    /// caller does so only for a peer that is dead or left, so no
    /// operation is using it.
    pub fn connect(&self, peer: usize, path: &Path, pid: i32) -> Result<(), GroupError> {
        if peer >= self.layout.world || peer == self.rank {
            return Err(GroupError::Setup(format!("cannot connect to rank {peer}")));
        }
        let file = File::options()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| setup("cannot open", path, e))?;
        // SAFETY: a peer's segment, shared on purpose; we only touch it
        // through atomics and the byte ranges the protocol hands to us.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| setup("cannot map", path, e))?;
        let word = |at: usize| u64::from_le_bytes(map[at..at + 8].try_into().unwrap());
        let ok = map.len() == self.layout.len()
            && word(0) == MAGIC
            && word(HDR_WORLD) == self.layout.world as u64
            && word(HDR_RANK) == peer as u64
            && word(HDR_SLOT) == self.layout.slot_bytes as u64
            && word(HDR_RING) == self.layout.ring_bytes as u64;
        if !ok {
            return Err(GroupError::Setup(format!(
                "{} is not rank {peer}'s segment of this group",
                path.display()
            )));
        }
        let base = map.as_ptr() as *mut u8;
        self.held.lock().push(map);
        {
            let _tx = self.tx[peer].lock();
            let _rx = self.rx[peer].lock();
            if self.connected(peer) {
                for at in [self.layout.tx_head(peer), self.layout.rx_tail(peer)] {
                    self.word(self.rank, at).store(0, Ordering::Release);
                }
            }
            *self.watches[peer].lock() = Some(ProcessWatch::new(pid));
            self.bases[peer].store(base, Ordering::Release);
        }
        Ok(())
    }

    /// Removes this rank's file (its peers keep their mappings); done once
    /// every peer has mapped it, so a crash later leaves nothing behind.
    pub fn unlink(&self) {
        if !self.unlinked.swap(true, Ordering::AcqRel) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    fn base(&self, rank: usize) -> *mut u8 {
        let p = self.bases[rank].load(Ordering::Acquire);
        assert!(!p.is_null(), "rank {rank} is not connected");
        p
    }

    fn word(&self, rank: usize, offset: usize) -> &Line {
        // SAFETY: offsets come from the layout: a whole 64-byte line
        // (WORD_STRIDE), aligned, inside the mapping, which lives as long
        // as self.
        unsafe { &*(self.base(rank).add(offset) as *const Line) }
    }

    /// Whether `rank` is mapped (itself, or a connected peer).
    pub fn connected(&self, rank: usize) -> bool {
        self.bases
            .get(rank)
            .is_some_and(|p| !p.load(Ordering::Acquire).is_null())
    }

    /// The ranks among `ranks` whose processes have exited or that left
    /// the group. Once this rank has left, every peer counts: its own
    /// pending waits (a receive its peers will no longer serve) end too.
    pub fn dead(&self, ranks: &[usize]) -> Vec<usize> {
        let left = self.flag(self.rank, Flag::Left) != 0;
        ranks
            .iter()
            .copied()
            .filter(|&r| {
                r != self.rank
                    && self.connected(r)
                    && (left
                        || self.flag(r, Flag::Left) != 0
                        || self.watches[r].lock().as_ref().is_some_and(|w| !w.alive()))
            })
            .collect()
    }

    /// Announces that this rank reached `value` of `flag`.
    pub fn post(&self, flag: Flag, value: u32) {
        self.word(self.rank, self.layout.flag(flag as usize))
            .publish(value);
    }

    /// The value of `rank`'s `flag`.
    pub fn flag(&self, rank: usize, flag: Flag) -> u32 {
        self.word(rank, self.layout.flag(flag as usize))
            .load(Ordering::Acquire)
    }

    /// Waits until every rank in `ranks` (itself excepted) reached `value`
    /// of `flag`, or is found dead without having reached it. Returns the
    /// dead ones that never reached it: every survivor that waits on the
    /// same word sees the same set, as a dead rank's word no longer moves.
    /// Only the deadline passing with a live laggard is an error.
    pub fn wait(
        &self,
        ranks: &[usize],
        flag: Flag,
        value: u32,
        deadline: Instant,
    ) -> Result<Vec<usize>, GroupError> {
        let mut missing = Vec::new();
        for &r in ranks {
            if r == self.rank {
                continue;
            }
            let w = self.word(r, self.layout.flag(flag as usize));
            let is_dead = || self.dead(&[r]);
            // A rank already known dead costs no sleep.
            if !reached(w.load(Ordering::Acquire), value) && !is_dead().is_empty() {
                if !reached(w.load(Ordering::Acquire), value) {
                    missing.push(r);
                }
                continue;
            }
            match wait_word(w, |v| reached(v, value), deadline, &is_dead) {
                Ok(()) => {}
                Err(WaitError::Dead(_)) => missing.push(r),
                Err(WaitError::Timeout) => return Err(GroupError::Timeout),
            }
        }
        Ok(missing)
    }

    /// Address of `rank`'s collective slot `slot`.
    pub fn slot_addr(&self, rank: usize, slot: usize) -> usize {
        self.base(rank) as usize + self.layout.slot(slot)
    }

    /// Sends one message to `dst`: it waits in `dst`'s mailbox until
    /// `dst` receives it; blocks while the ring is full. Returns the
    /// stream position just past the message, for [`ShmGroup::wait_read`].
    pub fn send(
        &self,
        dst: usize,
        tag: i64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<u32, GroupError> {
        let _one_writer = self.tx[dst].lock();
        let mut header = [0u8; MSG_HEADER];
        header[..8].copy_from_slice(&tag.to_le_bytes());
        header[8..].copy_from_slice(&(data.len() as u64).to_le_bytes());
        self.write_stream(dst, &header, deadline)?;
        self.write_stream(dst, data, deadline)?;
        Ok(self
            .word(self.rank, self.layout.tx_head(dst))
            .load(Ordering::Relaxed))
    }

    /// [`ShmGroup::send`] without waiting: the whole message goes into
    /// `dst`'s mailbox at once, or nothing does (`None`: the mailbox lacks
    /// the room, or another send to `dst` is under way). Lets a caller
    /// send from its own thread whenever that cannot block.
    pub fn try_send(&self, dst: usize, tag: i64, data: &[u8]) -> Option<u32> {
        let _one_writer = self.tx[dst].try_lock()?;
        let size = self.layout.ring_bytes as u32;
        let head_w = self.word(self.rank, self.layout.tx_head(dst));
        let tail_w = self.word(dst, self.layout.rx_tail(self.rank));
        let head = head_w.load(Ordering::Relaxed);
        let free = size - head.wrapping_sub(tail_w.load(Ordering::Acquire));
        if (MSG_HEADER + data.len()) as u64 > free as u64 {
            return None;
        }
        let mut header = [0u8; MSG_HEADER];
        header[..8].copy_from_slice(&tag.to_le_bytes());
        header[8..].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let ring = self.base(self.rank).wrapping_add(self.layout.ring(dst));
        copy_ring(ring, size, head, &header);
        let body = head.wrapping_add(MSG_HEADER as u32);
        copy_ring(ring, size, body, data);
        let end = body.wrapping_add(data.len() as u32);
        head_w.publish(end);
        Some(end)
    }

    /// Waits until `dst` has read its mailbox from this rank up to stream
    /// position `end` (a message sent is then received); `dst` dying
    /// first ends the wait with [`GroupError::Dead`].
    pub fn wait_read(&self, dst: usize, end: u32, deadline: Instant) -> Result<(), GroupError> {
        let tail_w = self.word(dst, self.layout.rx_tail(self.rank));
        let dead = || self.dead(&[dst]);
        wait_word(tail_w, |t| reached(t, end), deadline, &dead)?;
        Ok(())
    }

    /// The tag and length of the next message from `src`; its payload must
    /// be read next with [`ShmGroup::recv_body`].
    pub fn recv_header(&self, src: usize, deadline: Instant) -> Result<(i64, usize), GroupError> {
        let mut header = [0u8; MSG_HEADER];
        self.read_stream(src, &mut header, deadline)?;
        let tag = i64::from_le_bytes(header[..8].try_into().unwrap());
        let len = u64::from_le_bytes(header[8..].try_into().unwrap()) as usize;
        Ok((tag, len))
    }

    /// Reads the payload of the message whose header was just read.
    pub fn recv_body(
        &self,
        src: usize,
        out: &mut [u8],
        deadline: Instant,
    ) -> Result<(), GroupError> {
        self.read_stream(src, out, deadline)
    }

    /// Whether a message from `src` is waiting.
    pub fn pending(&self, src: usize) -> bool {
        let head = self
            .word(src, self.layout.tx_head(self.rank))
            .load(Ordering::Acquire);
        let tail = self
            .word(self.rank, self.layout.rx_tail(src))
            .load(Ordering::Relaxed);
        head != tail
    }

    /// Pieces of at most a quarter ring, so the reader copies out one
    /// piece while the writer fills the next.
    fn piece(&self) -> u32 {
        (self.layout.ring_bytes / 4) as u32
    }

    fn write_stream(
        &self,
        dst: usize,
        mut data: &[u8],
        deadline: Instant,
    ) -> Result<(), GroupError> {
        let size = self.layout.ring_bytes as u32;
        let head_w = self.word(self.rank, self.layout.tx_head(dst));
        let tail_w = self.word(dst, self.layout.rx_tail(self.rank));
        let ring = self.base(self.rank).wrapping_add(self.layout.ring(dst));
        let mut head = head_w.load(Ordering::Relaxed);
        let dead = || self.dead(&[dst]);
        while !data.is_empty() {
            wait_word(tail_w, |t| head.wrapping_sub(t) < size, deadline, &dead)?;
            let free = size - head.wrapping_sub(tail_w.load(Ordering::Acquire));
            let n = (data.len() as u32).min(free).min(self.piece());
            copy_ring(ring, size, head, &data[..n as usize]);
            data = &data[n as usize..];
            head = head.wrapping_add(n);
            head_w.publish(head);
        }
        Ok(())
    }

    fn read_stream(
        &self,
        src: usize,
        mut out: &mut [u8],
        deadline: Instant,
    ) -> Result<(), GroupError> {
        let _one_reader = self.rx[src].lock();
        let size = self.layout.ring_bytes as u32;
        let head_w = self.word(src, self.layout.tx_head(self.rank));
        let tail_w = self.word(self.rank, self.layout.rx_tail(src));
        let ring = self.base(src).wrapping_add(self.layout.ring(self.rank));
        let mut tail = tail_w.load(Ordering::Relaxed);
        let dead = || self.dead(&[src]);
        while !out.is_empty() {
            wait_word(head_w, |h| h != tail, deadline, &dead)?;
            let avail = head_w.load(Ordering::Acquire).wrapping_sub(tail);
            let n = (out.len() as u32).min(avail).min(self.piece()) as usize;
            let (now, rest) = std::mem::take(&mut out).split_at_mut(n);
            copy_ring_out(ring, size, tail, now);
            out = rest;
            tail = tail.wrapping_add(n as u32);
            tail_w.publish(tail);
        }
        Ok(())
    }
}

/// Copies `data` into the ring at stream position `pos`, wrapping.
fn copy_ring(ring: *mut u8, size: u32, pos: u32, data: &[u8]) {
    let at = (pos % size) as usize;
    let first = data.len().min(size as usize - at);
    // SAFETY: `ring` is a mapped region of `size` bytes; the two copies
    // stay inside it, and the protocol gives the writer these bytes alone.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), ring.add(at), first);
        std::ptr::copy_nonoverlapping(data.as_ptr().add(first), ring, data.len() - first);
    }
}

/// Copies bytes out of the ring from stream position `pos`, wrapping.
fn copy_ring_out(ring: *const u8, size: u32, pos: u32, out: &mut [u8]) {
    let at = (pos % size) as usize;
    let first = out.len().min(size as usize - at);
    // SAFETY: as in copy_ring, for the reader's bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(ring.add(at), out.as_mut_ptr(), first);
        std::ptr::copy_nonoverlapping(ring, out.as_mut_ptr().add(first), out.len() - first);
    }
}

impl Drop for ShmGroup {
    fn drop(&mut self) {
        self.unlink();
    }
}
