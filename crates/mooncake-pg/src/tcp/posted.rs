//! Receiving straight into the receiver's buffer: a receive posted
//! before its message arrives, or a round's payload redirected before it
//! arrives, is filled by the peer's reader thread from the socket,
//! without the message buffer or slot copy and the copy out of it.

use std::io::Read;
use std::net::TcpStream;
use std::time::Instant;

use super::frame::{Header, MAX_MSG_BYTES};
use super::{Shared, State, TcpGroup};
use crate::group::{Flag, GroupError};

/// A receive waiting for the next message from one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Posted {
    tag: i64,
    addr: usize,
    len: usize,
    stage: Stage,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Nothing read yet: the receiver may still withdraw it.
    Waiting,
    /// The reader is writing into the buffer: the receiver waits it out
    /// (the read ends, or the connection fails).
    Filling,
    Filled,
}

/// Whether the reader may read a message of `tag` and `len` bytes into
/// `posted`: the tag and length match and no earlier message waits.
pub(super) fn takes(posted: Option<Posted>, queued: bool, tag: i64, len: u64) -> bool {
    matches!(posted, Some(p) if p.stage == Stage::Waiting && !queued && p.tag == tag && p.len as u64 == len)
}

/// Where a peer's payload for one word goes instead of its slot copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Redirect {
    flag: u8,
    value: u32,
    addr: usize,
    len: usize,
    stage: Stage,
}

/// Whether a `Word` frame of `flag`, `value` with payload `lo..hi` goes
/// into `r`'s buffer: the word matches and the payload fits.
pub(super) fn redirects(r: Option<Redirect>, flag: u8, value: u32, hi: usize) -> bool {
    matches!(r, Some(r) if r.stage == Stage::Waiting && r.flag == flag && r.value == value && hi <= r.len)
}

impl TcpGroup {
    /// Has the payload of `peer`'s `flag` = `value` post (bytes `lo..hi`
    /// of its slot) written to `addr + lo` instead of this rank's copy of
    /// the slot, if that post has not arrived yet: false (nothing
    /// redirected) when it has. [`TcpGroup::end_redirect`] says whether
    /// the payload went there.
    ///
    /// # Safety
    /// `len` bytes at `addr` stay valid, and untouched by the caller,
    /// until `end_redirect(peer, ..)` returns.
    pub unsafe fn redirect(
        &self,
        peer: usize,
        flag: Flag,
        value: u32,
        addr: *mut u8,
        len: usize,
    ) -> Result<bool, GroupError> {
        let sh = &self.shared;
        if peer >= sh.size || peer == sh.rank {
            return Err(GroupError::Setup(format!("rank {peer} is not a peer")));
        }
        let mut st = sh.state.lock();
        if crate::wait::reached(st.words[peer][flag as usize], value) || st.dead[peer] {
            return Ok(false);
        }
        st.redirect[peer] = Some(Redirect {
            flag: flag as u8,
            value,
            addr: addr as usize,
            len,
            stage: Stage::Waiting,
        });
        Ok(true)
    }

    /// Ends `peer`'s redirect: true when its payload went into the buffer.
    /// A payload still being written is waited out (past `deadline` the
    /// connection is broken, which ends the write).
    pub fn end_redirect(&self, peer: usize, deadline: Instant) -> bool {
        let sh = &self.shared;
        if peer >= sh.size {
            return false;
        }
        let mut st = sh.state.lock();
        loop {
            match st.redirect[peer].map(|r| r.stage) {
                Some(Stage::Filling) => {
                    if sh.cv.wait_until(&mut st, deadline).timed_out() {
                        drop(st);
                        sh.break_inbound(peer);
                        st = sh.state.lock();
                    }
                }
                stage => {
                    st.redirect[peer] = None;
                    return stage == Some(Stage::Filled);
                }
            }
        }
    }

    /// Receives the next message from `src` into `out` when it has `tag`
    /// and `out`'s length and no other message from `src` waits: true
    /// once it is there (and acknowledged). False, with nothing read, when
    /// another message is first: the caller reads it with `recv_header`.
    pub fn recv_into(
        &self,
        src: usize,
        tag: i64,
        out: &mut [u8],
        deadline: Instant,
    ) -> Result<bool, GroupError> {
        let sh = &self.shared;
        let mut st = sh.state.lock();
        if !st.inbox[src].is_empty() {
            return Ok(false);
        }
        if st.gone(sh.rank, src) {
            return Err(GroupError::Dead(vec![src]));
        }
        st.posted[src] = Some(Posted {
            tag,
            addr: out.as_mut_ptr() as usize,
            len: out.len(),
            stage: Stage::Waiting,
        });
        loop {
            let stage = st.posted[src].map(|p| p.stage);
            match stage {
                Some(Stage::Filled) => break,
                // The reader failed while filling: the peer is dead.
                None => return Err(GroupError::Dead(vec![src])),
                // Never give the buffer back while the reader writes it; a
                // message stalled past the deadline breaks the connection
                // (as a stalled send does), which ends the read.
                Some(Stage::Filling) => {
                    if sh.cv.wait_until(&mut st, deadline).timed_out() {
                        drop(st);
                        sh.break_inbound(src);
                        st = sh.state.lock();
                    }
                    continue;
                }
                Some(Stage::Waiting) => {}
            }
            let outcome = if !st.inbox[src].is_empty() {
                Some(Ok(false))
            } else if st.gone(sh.rank, src) {
                Some(Err(GroupError::Dead(vec![src])))
            } else if Instant::now() >= deadline {
                Some(Err(GroupError::Timeout))
            } else {
                None
            };
            if let Some(r) = outcome {
                st.posted[src] = None;
                return r;
            }
            let _ = sh.cv.wait_until(&mut st, deadline);
        }
        st.posted[src] = None;
        st.read[src] = st.read[src].wrapping_add(1);
        let count = st.read[src];
        drop(st);
        sh.send_frame(src, &Header::ack(count), &[]);
        Ok(true)
    }
}

impl Shared {
    /// Ends the connection `peer`'s frames come in on: its reader fails
    /// and the peer is dead.
    fn break_inbound(&self, peer: usize) {
        for (p, s) in self.inbound.lock().iter() {
            if *p == peer {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// The reader's side of a message frame `h` from `peer`: into the posted
/// receive when it takes it, else into a buffer queued in the inbox.
pub(super) fn read_msg(
    sh: &Shared,
    peer: usize,
    s: &mut TcpStream,
    h: &Header,
) -> Result<(), String> {
    if h.len > MAX_MSG_BYTES {
        return Err(format!("message of {} bytes", h.len));
    }
    let n = h.len as usize;
    let target = {
        let mut st = sh.state.lock();
        let queued = !st.inbox[peer].is_empty();
        if takes(st.posted[peer], queued, h.tag, h.len) {
            let p = st.posted[peer].as_mut().expect("takes checked");
            p.stage = Stage::Filling;
            Some(p.addr)
        } else {
            None
        }
    };
    if let Some(addr) = target {
        // SAFETY: the posted buffer of `n` bytes, which its receiver keeps
        // and does not touch until the stage leaves Filling.
        let buf = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, n) };
        let got = s.read_exact(buf);
        let mut st = sh.state.lock();
        finish(&mut st, peer, got.is_ok());
        sh.cv.notify_all();
        return got.map_err(|e| e.to_string());
    }
    let mut buf = sh.state.lock().spare[peer].take().unwrap_or_default();
    buf.resize(n, 0);
    s.read_exact(&mut buf).map_err(|e| e.to_string())?;
    let mut st = sh.state.lock();
    st.inbox[peer].push_back((h.tag, buf));
    sh.cv.notify_all();
    Ok(())
}

/// The reader's side of a `Word` payload `lo..hi` from `peer`: true when
/// it went into a redirect's buffer, false (nothing read) when it goes to
/// the slot copy.
pub(super) fn read_redirected(
    sh: &Shared,
    peer: usize,
    s: &mut TcpStream,
    h: &Header,
    lo: usize,
    hi: usize,
) -> Result<bool, String> {
    let addr = {
        let mut st = sh.state.lock();
        if !redirects(st.redirect[peer], h.flag, h.value, hi) {
            return Ok(false);
        }
        let r = st.redirect[peer].as_mut().expect("redirects checked");
        r.stage = Stage::Filling;
        r.addr
    };
    // SAFETY: lo..hi lies in the redirect's buffer (checked), which its
    // owner keeps and leaves alone until the stage leaves Filling.
    let buf = unsafe { std::slice::from_raw_parts_mut((addr as *mut u8).add(lo), hi - lo) };
    let got = s.read_exact(buf);
    let mut st = sh.state.lock();
    match st.redirect[peer].as_mut() {
        Some(r) if got.is_ok() => r.stage = Stage::Filled,
        _ => {
            st.redirect[peer] = None;
            st.dead[peer] = true;
        }
    }
    sh.cv.notify_all();
    got.map(|()| true).map_err(|e| e.to_string())
}

fn finish(st: &mut State, peer: usize, ok: bool) {
    if ok {
        if let Some(p) = st.posted[peer].as_mut() {
            p.stage = Stage::Filled;
        }
    } else {
        // The connection failed mid-message: the reader ends and the peer
        // is dead (said here, so the receiver sees both at once).
        st.posted[peer] = None;
        st.dead[peer] = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_waiting_matching_redirect_that_fits_takes_a_payload() {
        let r = Redirect {
            flag: 0,
            value: 9,
            addr: 8,
            len: 100,
            stage: Stage::Waiting,
        };
        assert!(redirects(Some(r), 0, 9, 100));
        assert!(!redirects(None, 0, 9, 100));
        assert!(!redirects(Some(r), 1, 9, 100), "another flag");
        assert!(!redirects(Some(r), 0, 10, 100), "another round");
        assert!(!redirects(Some(r), 0, 9, 101), "past the buffer");
        for stage in [Stage::Filling, Stage::Filled] {
            assert!(!redirects(Some(Redirect { stage, ..r }), 0, 9, 100));
        }
    }

    #[test]
    fn only_a_waiting_matching_receive_with_nothing_queued_takes_a_message() {
        let p = Posted {
            tag: 3,
            addr: 8,
            len: 100,
            stage: Stage::Waiting,
        };
        assert!(takes(Some(p), false, 3, 100));
        assert!(!takes(None, false, 3, 100));
        assert!(!takes(Some(p), true, 3, 100), "an earlier message first");
        assert!(!takes(Some(p), false, 4, 100), "another tag");
        assert!(!takes(Some(p), false, 3, 99), "another length");
        for stage in [Stage::Filling, Stage::Filled] {
            assert!(!takes(Some(Posted { stage, ..p }), false, 3, 100));
        }
    }
}
