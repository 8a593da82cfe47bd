use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::frame::Header;
use super::*;

const SLOT: usize = 1 << 20;

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

/// `n` ranks connected over loopback.
fn mesh(n: usize) -> Vec<TcpGroup> {
    let groups: Vec<TcpGroup> = (0..n).map(|r| TcpGroup::new(r, n, SLOT).unwrap()).collect();
    let ports: Vec<u16> = groups.iter().map(|g| g.port()).collect();
    std::thread::scope(|s| {
        for g in &groups {
            let peers: Vec<(usize, String, u16)> = (0..n)
                .filter(|&p| p != g.rank())
                .map(|p| (p, "127.0.0.1".to_string(), ports[p]))
                .collect();
            s.spawn(move || g.connect_all(&peers, soon()).unwrap());
        }
    });
    groups
}

/// A copy of `rank`'s slot `s` as `g` holds it.
fn slot(g: &TcpGroup, rank: usize, s: usize) -> Vec<u8> {
    let addr = g.slot_addr(rank, s).unwrap();
    // SAFETY: the group's slot memory, written by no thread while a test
    // reads it (the words ordered the writes before).
    unsafe { std::slice::from_raw_parts(addr as *const u8, g.slot_bytes()) }.to_vec()
}

/// Writes `data` at `at` of this rank's slot `s`, as the plane does.
fn fill(g: &TcpGroup, s: usize, at: usize, data: &[u8]) {
    let addr = g.slot_addr(g.rank(), s).unwrap();
    // SAFETY: this rank's own slot, `at + data.len()` within it (the
    // slice would panic otherwise), written by this thread only.
    let mine = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, g.slot_bytes()) };
    mine[at..at + data.len()].copy_from_slice(data);
}

#[test]
fn a_post_carries_the_touched_bytes_to_every_peer() {
    let g = mesh(3);
    // Large enough to go out in pieces to two peers.
    let (lo, hi) = (1000, 1000 + 3 * PIECE + 17);
    let data: Vec<u8> = (0..hi - lo).map(|i| (i % 251) as u8).collect();
    fill(&g[0], 1, lo, &data);
    g[0].touch(1, lo, hi).unwrap();
    g[0].post(Flag::Arrive, 1);
    for peer in &g[1..] {
        assert_eq!(
            peer.wait(&[0], Flag::Arrive, 1, soon()).unwrap(),
            Vec::<usize>::new()
        );
        assert_eq!(peer.flag(0, Flag::Arrive), 1);
        let copy = slot(peer, 0, 1);
        assert_eq!(&copy[lo..hi], &data[..]);
        assert_eq!(slot(peer, 0, 1)[lo - 1], 0, "untouched bytes stay");
    }
    // A Done carries no bytes; a cleaned slot sends nothing either.
    g[0].clean(1);
    g[0].post(Flag::Done, 1);
    assert!(g[2].wait(&[0], Flag::Done, 1, soon()).unwrap().is_empty());
}

#[test]
fn post_parts_sends_each_peer_only_its_part() {
    for n in [2usize, 4] {
        let g = mesh(n);
        // Large parts go out in turns; each peer's lands where it was.
        let len = 3 * PIECE + 100;
        let data: Vec<u8> = (0..len).map(|i| (i % 241) as u8 + 1).collect();
        fill(&g[0], 0, 0, &data);
        let parts = crate::schedule::owned_parts(len, &(0..n).collect::<Vec<_>>(), n);
        g[0].post_parts(Flag::Arrive, 2, &parts, None).unwrap();
        for (r, peer) in g.iter().enumerate().skip(1) {
            assert!(peer.wait(&[0], Flag::Arrive, 2, soon()).unwrap().is_empty());
            let copy = slot(peer, 0, 0);
            let (lo, hi) = parts[r];
            assert_eq!(&copy[lo..hi], &data[lo..hi], "peer {r} of {n}");
            assert!(
                copy[..lo].iter().chain(&copy[hi..len]).all(|&b| b == 0),
                "peer {r} of {n} got only its part"
            );
        }
        // From a caller's buffer: the same offsets, into the slot copies.
        let other: Vec<u8> = data.iter().map(|b| b ^ 0x5a).collect();
        g[0].post_parts(Flag::Reduced, 2, &parts, Some(&other))
            .unwrap();
        for (r, peer) in g.iter().enumerate().skip(1) {
            assert!(peer
                .wait(&[0], Flag::Reduced, 2, soon())
                .unwrap()
                .is_empty());
            let (lo, hi) = parts[r];
            assert_eq!(&slot(peer, 0, 0)[lo..hi], &other[lo..hi], "peer {r} of {n}");
        }
        assert!(g[0].post_parts(Flag::Arrive, 4, &parts[1..], None).is_err());
        let mut bad = parts.clone();
        bad[1] = (0, SLOT + 1);
        assert!(g[0].post_parts(Flag::Arrive, 4, &bad, None).is_err());
        bad[1] = (5, 4);
        assert!(g[0].post_parts(Flag::Arrive, 4, &bad, None).is_err());
        bad[1] = (0, len + 1);
        let e = g[0].post_parts(Flag::Arrive, 4, &bad, Some(&other));
        assert!(e.is_err(), "beyond the source");
        assert_eq!(g[0].flag(0, Flag::Arrive), 2, "a refused post sets nothing");
    }
}

#[test]
fn messages_arrive_in_order_and_are_acknowledged() {
    let g = mesh(2);
    let big: Vec<u8> = (0..(3 << 20) + 5).map(|i| (i % 13) as u8).collect();
    assert_eq!(g[0].try_send(1, 7, b"hello").unwrap(), Some(1));
    assert_eq!(
        g[0].try_send(1, 7, &big).unwrap(),
        None,
        "too large for try_send"
    );
    assert_eq!(g[0].send(1, -3, &big, soon()).unwrap(), 2);
    assert_eq!(g[1].recv_header(0, soon()).unwrap(), (7, 5));
    assert!(g[1].pending(0));
    let mut small = [0u8; 5];
    g[1].recv_body(0, &mut small, soon()).unwrap();
    assert_eq!(&small, b"hello");
    g[0].wait_read(1, 1, soon()).unwrap();
    assert_eq!(g[1].recv_header(0, soon()).unwrap(), (-3, big.len()));
    let mut out = vec![0u8; big.len()];
    g[1].recv_body(0, &mut out, soon()).unwrap();
    assert_eq!(out, big);
    g[0].wait_read(1, 2, soon()).unwrap();
    assert!(!g[1].pending(0));
}

#[test]
fn a_posted_receive_is_filled_in_place_or_left_to_recv_header() {
    let g = mesh(2);
    let big: Vec<u8> = (0..(3 << 20) + 5).map(|i| (i % 11) as u8).collect();
    // Posted before the message is sent: filled straight from the socket.
    let mut out = vec![0u8; big.len()];
    std::thread::scope(|s| {
        let g0 = &g[0];
        let big = &big;
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            g0.send(1, 5, big, soon()).unwrap();
        });
        assert!(g[1].recv_into(0, 5, &mut out, soon()).unwrap());
    });
    assert_eq!(out, big);
    g[0].wait_read(1, 1, soon()).unwrap();
    assert!(!g[1].pending(0));
    // Another tag (or a message already queued) is left to recv_header.
    g[0].send(1, 6, b"abc", soon()).unwrap();
    let mut three = [0u8; 3];
    let until = Instant::now() + Duration::from_secs(30);
    while !g[1].pending(0) {
        assert!(Instant::now() < until, "the message never arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!g[1].recv_into(0, 5, &mut three, soon()).unwrap());
    assert_eq!(g[1].recv_header(0, soon()).unwrap(), (6, 3));
    g[1].recv_body(0, &mut three, soon()).unwrap();
    assert_eq!(&three, b"abc");
    g[0].wait_read(1, 2, soon()).unwrap();
    // Nothing comes: the deadline, and a later message still arrives.
    let e = g[1].recv_into(
        0,
        5,
        &mut three,
        Instant::now() + Duration::from_millis(100),
    );
    assert_eq!(e, Err(GroupError::Timeout));
    g[0].send(1, 5, b"xyz", soon()).unwrap();
    assert_eq!(g[1].recv_header(0, soon()).unwrap(), (5, 3));
}

#[test]
fn bad_sizes_are_refused_without_side_effects() {
    let g = mesh(2);
    assert!(g[0].touch(0, 0, SLOT + 1).is_err());
    assert!(g[0].touch(0, 10, 5).is_err());
    assert!(g[0].touch(2, 0, 1).is_err());
    assert_eq!(g[0].slot_addr(2, 0), None);
    assert_eq!(g[0].slot_addr(0, 2), None);
    g[0].send(1, 1, &[9; 100], soon()).unwrap();
    assert_eq!(g[1].recv_header(0, soon()).unwrap(), (1, 100));
    let mut wrong = [0u8; 99];
    let e = g[1].recv_body(0, &mut wrong, soon()).unwrap_err();
    assert!(matches!(e, GroupError::Setup(m) if m.contains("100 bytes")));
    assert!(g[1].pending(0), "the message is still there");
    let mut right = [0u8; 100];
    g[1].recv_body(0, &mut right, soon()).unwrap();
    assert_eq!(right, [9; 100]);
    assert!(TcpGroup::new(2, 2, SLOT).is_err());
    assert!(TcpGroup::new(0, 2, 100).is_err(), "not a multiple of 64");
}

#[test]
fn a_closed_peer_is_not_dead_and_a_wait_for_it_times_out() {
    let g = mesh(2);
    g[1].close();
    let e = g[0].wait(
        &[1],
        Flag::Arrive,
        1,
        Instant::now() + Duration::from_millis(300),
    );
    assert_eq!(e, Err(GroupError::Timeout));
    assert!(g[0].dead(&[1]).is_empty());
}

/// A peer that connects, greets, and then does `then` with its socket to
/// rank 0 (one process side of a fake rank 1).
fn fake_peer(then: impl FnOnce(&mut TcpStream) + Send) -> TcpGroup {
    let g = TcpGroup::new(0, 2, SLOT).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let target = g.port();
    let (g, got) = std::thread::scope(|s| {
        let peer = s.spawn(move || {
            let mut to0 = TcpStream::connect(("127.0.0.1", target)).unwrap();
            to0.write_all(&super::peers::hello(1, 42)).unwrap();
            let (from0, _) = listener.accept().unwrap();
            then(&mut to0);
            from0
        });
        g.connect_all(&[(1, "127.0.0.1".into(), port)], soon())
            .unwrap();
        (g, peer.join().unwrap())
    });
    // Keep rank 0's connection to the fake peer open while the test runs.
    std::mem::forget(got);
    g
}

#[test]
fn a_killed_peer_fails_waits_receives_and_sends() {
    let g = fake_peer(|s| {
        // A word, then the connection ends without a goodbye: a killed
        // process's kernel closes its sockets.
        s.write_all(&Header::word(0, 1, 0, 0, 0).encode()).unwrap();
        s.shutdown(Shutdown::Both).unwrap();
    });
    assert!(g.wait(&[1], Flag::Arrive, 1, soon()).unwrap().is_empty());
    assert_eq!(g.wait(&[0, 1], Flag::Arrive, 2, soon()).unwrap(), vec![1]);
    assert_eq!(g.dead(&[1]), vec![1]);
    assert_eq!(g.recv_header(1, soon()), Err(GroupError::Dead(vec![1])));
    assert_eq!(g.wait_read(1, 1, soon()), Err(GroupError::Dead(vec![1])));
    assert_eq!(g.send(1, 0, b"x", soon()), Err(GroupError::Dead(vec![1])));
}

#[test]
fn a_frame_beyond_the_slot_breaks_the_connection() {
    let g = fake_peer(|s| {
        let mut h = Header::word(0, 1, 1, SLOT - 8, 16);
        s.write_all(&h.encode()).unwrap();
        s.write_all(&[0; 16]).unwrap();
        h.slot = 0;
        let _ = s.write_all(&h.encode());
    });
    assert_eq!(g.wait(&[1], Flag::Arrive, 1, soon()).unwrap(), vec![1]);
    assert_eq!(
        g.flag(1, Flag::Arrive),
        0,
        "the bad frame's word is not taken"
    );
}

#[test]
fn a_goodbye_is_not_a_death() {
    let g = fake_peer(|s| {
        s.write_all(&Header::bye().encode()).unwrap();
        s.shutdown(Shutdown::Both).unwrap();
    });
    let e = g.wait(
        &[1],
        Flag::Done,
        1,
        Instant::now() + Duration::from_millis(300),
    );
    assert_eq!(e, Err(GroupError::Timeout));
    assert!(g.dead(&[1]).is_empty());
}

#[test]
fn a_message_stalled_into_a_posted_receive_breaks_the_connection() {
    let keep = parking_lot::Mutex::new(None);
    let g = fake_peer(|s| *keep.lock() = Some(s.try_clone().unwrap()));
    let mut to0 = keep.lock().take().unwrap();
    let mut out = vec![0u8; 100];
    let started = Instant::now();
    let got = std::thread::scope(|sc| {
        sc.spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            // Ten of the hundred bytes, then nothing (the peer lives on).
            to0.write_all(&Header::msg(7, 100).encode()).unwrap();
            to0.write_all(&[1; 10]).unwrap();
            std::mem::forget(to0);
        });
        g.recv_into(1, 7, &mut out, Instant::now() + Duration::from_millis(800))
    });
    assert_eq!(got, Err(GroupError::Dead(vec![1])));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(g.dead(&[1]), vec![1]);
}

#[test]
fn a_redirected_payload_lands_in_the_buffer_not_the_slot_copy() {
    let g = mesh(3);
    let len = 3 * PIECE + 7;
    let data: Vec<u8> = (0..len).map(|i| (i % 239) as u8 + 1).collect();
    fill(&g[0], 1, 0, &data);
    let mut bufs = vec![vec![0u8; len]; 3];
    for (r, buf) in bufs.iter_mut().enumerate().skip(1) {
        // SAFETY: the buffer outlives the redirect, ended below.
        let ok = unsafe { g[r].redirect(0, Flag::Arrive, 1, buf.as_mut_ptr(), len) };
        assert!(ok.unwrap());
    }
    g[0].touch(1, 0, len).unwrap();
    g[0].post(Flag::Arrive, 1);
    for (r, peer) in g.iter().enumerate().skip(1) {
        assert!(peer.wait(&[0], Flag::Arrive, 1, soon()).unwrap().is_empty());
        assert!(peer.end_redirect(0, soon()));
        assert!(slot(peer, 0, 1)[..len].iter().all(|&b| b == 0), "rank {r}");
    }
    assert_eq!(bufs[1], data);
    assert_eq!(bufs[2], data);
    // The word is there already: nothing to redirect.
    let mut late = vec![0u8; len];
    // SAFETY: as above.
    let ok = unsafe { g[1].redirect(0, Flag::Arrive, 1, late.as_mut_ptr(), len) };
    assert!(!ok.unwrap());
    // Another round's word, or a buffer too short: the slot copy.
    let mut short = vec![0u8; len - 1];
    // SAFETY: as above.
    let ok = unsafe { g[1].redirect(0, Flag::Arrive, 3, short.as_mut_ptr(), len - 1) };
    assert!(ok.unwrap());
    g[0].clean(1);
    g[0].touch(1, 0, len).unwrap();
    g[0].post(Flag::Arrive, 3);
    assert!(g[1].wait(&[0], Flag::Arrive, 3, soon()).unwrap().is_empty());
    assert!(!g[1].end_redirect(0, soon()));
    assert!(short.iter().all(|&b| b == 0));
    assert_eq!(&slot(&g[1], 0, 1)[..len], &data[..]);
    // SAFETY: not a peer: refused before anything is kept.
    assert!(unsafe { g[1].redirect(1, Flag::Arrive, 5, short.as_mut_ptr(), 1) }.is_err());
}
