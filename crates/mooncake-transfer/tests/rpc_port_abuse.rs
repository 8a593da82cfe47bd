//! Idle and trickling sockets held against an engine's RPC port must not
//! keep a working peer out: the listener sheds the longest-idle connections
//! past its caps, closes idle ones, and cuts off a trickled header.
//!
//! Timeouts here only guard against hangs; nothing asserts on durations.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use mooncake_transfer::{EngineConfig, Opcode, TransferEngine, TransferRequest};
use socket2::{Domain, Socket, Type};

/// Generous bound on anything that should happen by itself.
const HANG_GUARD: Duration = Duration::from_secs(60);

fn engine(tweak: impl FnOnce(&mut EngineConfig)) -> TransferEngine {
    let mut c = EngineConfig::defaults("P2PHANDSHAKE", "127.0.0.1");
    c.rpc_bind_address = Some("127.0.0.1".into());
    c.force_tcp = true;
    c.transfer_timeout = Duration::from_secs(20);
    tweak(&mut c);
    TransferEngine::new(c).unwrap()
}

fn managed(e: &TransferEngine, len: usize) -> &'static mut [u8] {
    let addr = e.allocate_managed_buffer(len).unwrap();
    // SAFETY: the engine keeps `len` bytes mapped at `addr` until freed,
    // which these tests never do.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

/// Writes a pattern from `a` into `b`'s buffer and reads it back.
fn round_trip(a: &TransferEngine, b: &TransferEngine, seed: u8) {
    const LEN: usize = 200_000;
    let local = managed(a, LEN);
    let remote = managed(b, LEN);
    let pattern: Vec<u8> = (0..LEN).map(|i| (i as u8) ^ seed).collect();
    local.copy_from_slice(&pattern);
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    let remote_addr = remote.as_ptr() as u64;
    let req = |opcode| TransferRequest {
        opcode,
        source: local.as_ptr() as usize,
        target_id: seg,
        target_offset: remote_addr,
        length: LEN,
    };
    a.transfer_sync(&[req(Opcode::Write)]).unwrap();
    assert!(remote[..] == pattern[..], "write landed");
    remote.iter_mut().for_each(|b| *b = !*b);
    a.transfer_sync(&[req(Opcode::Read)]).unwrap();
    assert!(
        local.iter().zip(&pattern).all(|(l, p)| *l == !*p),
        "read landed"
    );
}

/// A connection from `from` to `to` that sends nothing.
fn idle_socket(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    s.connect_timeout(&to.into(), HANG_GUARD).unwrap();
    let s: TcpStream = s.into();
    s.set_nonblocking(true).unwrap();
    s
}

/// Whether the engine closed `s` (a read sees the end or a reset).
fn closed(mut s: &TcpStream) -> bool {
    match s.read(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => panic!("the engine sent bytes unasked"),
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// Enough descriptors for the sockets both ends of the test hold.
fn raise_fd_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
}

#[test]
fn thousands_of_idle_sockets_do_not_keep_a_peer_out() {
    raise_fd_limit(16_384);
    // Default limits: 4096 connections, 256 per peer address.
    let target = engine(|_| {});
    let initiator = engine(|_| {});
    let port = SocketAddr::from(([127, 0, 0, 1], target.rpc_port()));

    // 300 from the initiator's own address (past the per-peer cap), the
    // rest from 19 other loopback addresses (past the total cap).
    let mut same_host = Vec::new();
    for _ in 0..300 {
        same_host.push(idle_socket([127, 0, 0, 1], port));
    }
    let mut others = Vec::new();
    for i in 0..4700u32 {
        others.push(idle_socket([127, 0, 0, 2 + (i % 19) as u8], port));
    }

    // The engine answers its peer at once, though it has kept at most its
    // caps of idle sockets.
    round_trip(&initiator, &target, 7);

    // Poll until the engine has shed past its caps (it does so as it
    // accepts, which may lag the connects a little).
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let open_same = same_host.iter().filter(|s| !closed(s)).count();
        let open_all = open_same + others.iter().filter(|s| !closed(s)).count();
        if open_same <= 256 && open_all <= 4096 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open_same} idle sockets from one address and {open_all} in all still open"
        );
        thread::sleep(Duration::from_millis(100));
    }
    // More of them again: still served.
    for _ in 0..300 {
        same_host.push(idle_socket([127, 0, 0, 1], port));
    }
    round_trip(&initiator, &target, 9);
}

#[test]
fn idle_connections_are_closed_and_peers_reconnect() {
    let short = |c: &mut EngineConfig| c.rpc_limits.idle_timeout = Duration::from_millis(300);
    let target = engine(short);
    let initiator = engine(short);
    let port = SocketAddr::from(([127, 0, 0, 1], target.rpc_port()));
    let s = idle_socket([127, 0, 0, 1], port);
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(HANG_GUARD)).unwrap();
    let got = (&s).read(&mut [0u8; 1]);
    assert!(
        matches!(got, Ok(0))
            || got
                .as_ref()
                .is_err_and(|e| e.kind() != ErrorKind::WouldBlock),
        "an idle connection stayed open: {got:?}"
    );
    // The initiator's own connections go idle and get closed between
    // transfers; the next transfer still works.
    round_trip(&initiator, &target, 1);
    thread::sleep(Duration::from_millis(800));
    round_trip(&initiator, &target, 2);
}

#[test]
fn a_trickled_header_is_cut_off() {
    let target = engine(|c| c.transfer_timeout = Duration::from_millis(500));
    let mut s = TcpStream::connect(("127.0.0.1", target.rpc_port())).unwrap();
    // One byte of a 32-byte header per 300 ms: each read comes well within
    // the I/O timeout, the header as a whole does not.
    let header = [0u8; 32];
    let mut cut_off = false;
    for b in header.chunks(1) {
        if s.write_all(b).is_err() {
            cut_off = true;
            break;
        }
        thread::sleep(Duration::from_millis(300));
    }
    // (Sent whole, the zero header is malformed and closes the connection
    // too, but only after the loop has ended.)
    assert!(cut_off, "a header trickled over 10 s was read to its end");
}
