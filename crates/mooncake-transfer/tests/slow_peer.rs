//! A peer that trickles its frames (slowloris) must not stall the engine:
//! no registry lock is held while a peer's bytes cross the socket, and a
//! frame is cut off after at most twice MC_TRANSFER_TIMEOUT.
//!
//! Timeouts here only guard against hangs; nothing asserts on durations.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use mooncake_common::ErrorCode;
use mooncake_transfer::{EngineConfig, Opcode, TransferEngine, TransferRequest};

/// Generous bound on any call that should not wait for the slow peer.
const HANG_GUARD: Duration = Duration::from_secs(60);

fn engine(timeout: Duration) -> TransferEngine {
    let mut c = EngineConfig::defaults("P2PHANDSHAKE", "127.0.0.1");
    c.rpc_bind_address = Some("127.0.0.1".into());
    c.force_tcp = true;
    c.transfer_timeout = timeout;
    TransferEngine::new(c).unwrap()
}

/// A request header as a raw peer would send it (see `frame.rs`).
fn header(kind: u8, seq: u32, addr: u64, len: u64) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0..4].copy_from_slice(b"MCTE");
    b[4] = 1;
    b[5] = kind;
    b[12..16].copy_from_slice(&seq.to_le_bytes());
    b[16..24].copy_from_slice(&addr.to_le_bytes());
    b[24..32].copy_from_slice(&len.to_le_bytes());
    b
}
const WRITE_REQ: u8 = 1;
const READ_REQ: u8 = 3;

fn leaked(len: usize) -> &'static mut [u8] {
    Box::leak(vec![0u8; len].into_boxed_slice())
}

/// Sends a WriteReq header for `[addr, addr+len)`, then one payload byte
/// (0xAB) per `every` until told to stop or the engine closes the connection.
struct Trickler {
    sent: Arc<AtomicUsize>,
    cut_off: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<()>,
}

impl Trickler {
    fn start(port: u16, addr: usize, len: u64, every: Duration) -> Trickler {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(&header(WRITE_REQ, 1, addr as u64, len))
            .unwrap();
        let sent = Arc::new(AtomicUsize::new(0));
        let cut_off = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (sent2, cut2, stop2) = (sent.clone(), cut_off.clone(), stop.clone());
        let thread = thread::spawn(move || {
            // Outlasts the hang guard, but ends by itself whatever happens.
            let most = (3 * HANG_GUARD.as_millis() / every.as_millis().max(1)) as usize;
            for _ in 0..most {
                if stop2.load(Ordering::Acquire) {
                    return;
                }
                if s.write_all(&[0xAB]).is_err() {
                    cut2.store(true, Ordering::Release);
                    return;
                }
                sent2.fetch_add(1, Ordering::AcqRel);
                thread::sleep(every);
            }
        });
        Trickler {
            sent,
            cut_off,
            stop,
            thread,
        }
    }

    /// Waits until a few payload bytes are out, so the engine is inside the frame.
    fn wait_started(&self) {
        for _ in 0..6000 {
            if self.sent.load(Ordering::Acquire) >= 3 {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        panic!("trickler never started");
    }

    fn finish(self) -> bool {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap();
        self.cut_off.load(Ordering::Acquire)
    }
}

/// Runs `f` on its own thread; panics if it has not returned within the guard.
fn guarded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(HANG_GUARD)
        .unwrap_or_else(|_| panic!("{what} waited for a slow peer"))
}

#[test]
fn registry_calls_and_transfers_proceed_while_a_peer_trickles() {
    // A long timeout: the trickled frame stays open for the whole test.
    let e = engine(Duration::from_secs(300));
    let trickled = leaked(4096);
    let other = leaked(4096);
    let (t_addr, o_addr) = (trickled.as_ptr() as usize, other.as_ptr() as usize);
    e.register_local_memory(t_addr, 4096, "cpu:0", true)
        .unwrap();
    e.register_local_memory(o_addr, 4096, "cpu:0", true)
        .unwrap();
    let slow = Trickler::start(e.rpc_port(), t_addr, 4096, Duration::from_millis(50));
    slow.wait_started();

    let e2 = e.clone();
    guarded("unregister + register of another buffer", move || {
        e2.unregister_local_memory(o_addr).unwrap();
        e2.register_local_memory(o_addr, 4096, "cpu:0", true)
            .unwrap();
    });
    let e2 = e.clone();
    guarded("a local transfer", move || {
        let seg = e2.open_segment(&e2.local_server_name()).unwrap();
        e2.transfer_sync(&[TransferRequest {
            opcode: Opcode::Write,
            source: o_addr,
            target_id: seg,
            target_offset: o_addr as u64 + 100,
            length: 10,
        }])
        .unwrap();
    });
    // A second peer's frames are served too.
    let mut s = TcpStream::connect(("127.0.0.1", e.rpc_port())).unwrap();
    s.set_read_timeout(Some(HANG_GUARD)).unwrap();
    s.write_all(&header(WRITE_REQ, 7, o_addr as u64, 3))
        .unwrap();
    s.write_all(b"xyz").unwrap();
    let mut ack = [0u8; 32];
    s.read_exact(&mut ack).unwrap();
    assert_eq!((ack[5], &ack[8..12]), (2, &0i32.to_le_bytes()[..]));
    assert_eq!(&other[..3], b"xyz");

    // All of that happened while the slow peer was still inside its frame.
    assert!(!slow.finish(), "the slow peer was cut off early");
}

/// A peer connection that wrote to and read from a buffer, then went idle,
/// holds nothing: unregistering that buffer does not wait for it.
#[test]
fn idle_connections_hold_no_memory() {
    let e = engine(Duration::from_secs(300));
    let buf = leaked(4096);
    let addr = buf.as_ptr() as usize;
    e.register_local_memory(addr, 4096, "cpu:0", true).unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", e.rpc_port())).unwrap();
    s.set_read_timeout(Some(HANG_GUARD)).unwrap();
    // A burst: two writes and a read of the same buffer, in one send.
    let mut burst = Vec::new();
    burst.extend_from_slice(&header(WRITE_REQ, 1, addr as u64, 4));
    burst.extend_from_slice(b"abcd");
    burst.extend_from_slice(&header(WRITE_REQ, 2, addr as u64 + 4, 4));
    burst.extend_from_slice(b"efgh");
    burst.extend_from_slice(&header(READ_REQ, 3, addr as u64, 8));
    s.write_all(&burst).unwrap();
    let mut answers = [0u8; 3 * 32 + 8];
    s.read_exact(&mut answers).unwrap();
    assert_eq!(&answers[96..], b"abcdefgh");
    // The connection stays open and idle.
    let e2 = e.clone();
    guarded("unregister after an idle peer used the buffer", move || {
        e2.unregister_local_memory(addr)
    })
    .unwrap();
    // The same connection's next frame is refused.
    s.write_all(&header(WRITE_REQ, 4, addr as u64, 4)).unwrap();
    s.write_all(b"late").unwrap();
    let mut ack = [0u8; 32];
    s.read_exact(&mut ack).unwrap();
    let status = i32::from_le_bytes(ack[8..12].try_into().unwrap());
    assert_eq!(status, ErrorCode::ERR_ADDRESS_NOT_REGISTERED.wire());
    assert_eq!(&buf[..8], b"abcdefgh");
}

#[test]
fn unregister_cuts_off_a_peer_trickling_into_that_buffer() {
    let e = engine(Duration::from_secs(1));
    let buf = leaked(4096);
    let addr = buf.as_ptr() as usize;
    e.register_local_memory(addr, 4096, "cpu:0", true).unwrap();
    let slow = Trickler::start(e.rpc_port(), addr, 4096, Duration::from_millis(20));
    slow.wait_started();

    let e2 = e.clone();
    guarded("unregister of the trickled buffer", move || {
        e2.unregister_local_memory(addr)
    })
    .unwrap();
    // From here the buffer is the application's again: nothing may land.
    let snapshot = buf.to_vec();
    assert!(
        slow.thread_cut_off_eventually(),
        "the engine never closed the slow peer's connection"
    );
    assert_eq!(buf[..], snapshot[..], "bytes landed after unregister");

    // New frames for that memory are refused.
    let mut s = TcpStream::connect(("127.0.0.1", e.rpc_port())).unwrap();
    s.set_read_timeout(Some(HANG_GUARD)).unwrap();
    s.write_all(&header(WRITE_REQ, 1, addr as u64, 4)).unwrap();
    s.write_all(b"late").unwrap();
    let mut ack = [0u8; 32];
    s.read_exact(&mut ack).unwrap();
    let status = i32::from_le_bytes(ack[8..12].try_into().unwrap());
    assert_eq!(status, ErrorCode::ERR_ADDRESS_NOT_REGISTERED.wire());
    assert_eq!(buf[..], snapshot[..]);
}

#[test]
fn unregister_completes_while_a_peer_does_not_read_its_read_data() {
    let e = engine(Duration::from_secs(1));
    // More than loopback socket buffers hold, so the engine's write blocks.
    const LEN: usize = 48 << 20;
    let buf = leaked(LEN);
    let addr = buf.as_ptr() as usize;
    e.register_local_memory(addr, LEN, "cpu:0", true).unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", e.rpc_port())).unwrap();
    s.write_all(&header(READ_REQ, 1, addr as u64, LEN as u64))
        .unwrap();
    // Make sure the engine started answering (some data arrives), then stop reading.
    s.set_read_timeout(Some(HANG_GUARD)).unwrap();
    let mut head = [0u8; 32];
    s.read_exact(&mut head).unwrap();
    assert_eq!(head[5], 4, "a ReadResp");

    let e2 = e.clone();
    guarded("unregister of memory being read", move || {
        e2.unregister_local_memory(addr)
    })
    .unwrap();
    drop(s);
}

impl Trickler {
    /// Keeps trickling until the engine closes the connection (or the guard ends).
    fn thread_cut_off_eventually(self) -> bool {
        self.thread.join().unwrap();
        self.cut_off.load(Ordering::Acquire)
    }
}

/// A fake peer: answers the P2P handshake with one 1 MiB buffer at 0x10000,
/// then answers the first read request with a ReadResp header and 1000
/// bytes of 0xEE, stalls until `release`, and sends the rest.
fn stalling_reader_peer(release: mpsc::Receiver<()>) -> (u16, thread::JoinHandle<()>) {
    use mooncake_transfer::{BufferDesc, SegmentDesc};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = thread::spawn(move || {
        for s in l.incoming() {
            let mut s = s.unwrap();
            s.set_read_timeout(Some(HANG_GUARD)).unwrap();
            let mut h = [0u8; 32];
            if s.read_exact(&mut h).is_err() {
                continue;
            }
            let seq = u32::from_le_bytes(h[12..16].try_into().unwrap());
            let len = u64::from_le_bytes(h[24..32].try_into().unwrap());
            match h[5] {
                5 => {
                    let mut name = vec![0u8; len as usize];
                    s.read_exact(&mut name).unwrap();
                    let desc = SegmentDesc {
                        name: format!("127.0.0.1:{port}"),
                        protocol: "tcp".into(),
                        devices: vec![],
                        buffers: vec![BufferDesc {
                            name: "cpu:0".into(),
                            addr: 0x10000,
                            length: 1 << 20,
                            rkey: vec![],
                            lkey: vec![],
                            shm: None,
                        }],
                        tcp_data_port: Some(port),
                        host_id: None,
                    };
                    let json = desc.to_json();
                    s.write_all(&header(6, seq, 0, json.len() as u64)).unwrap();
                    s.write_all(&json).unwrap();
                }
                READ_REQ => {
                    s.write_all(&header(4, seq, 0, len)).unwrap();
                    s.write_all(&[0xEE; 1000]).unwrap();
                    let _ = release.recv_timeout(HANG_GUARD);
                    // The initiator gave up: these bytes must go nowhere.
                    let _ = s.write_all(&vec![0xEE; len as usize - 1000]);
                    return;
                }
                k => panic!("unexpected frame kind {k}"),
            }
        }
    });
    (port, h)
}

#[test]
fn read_bytes_never_land_after_the_timeout_is_reported() {
    let (release, rx) = mpsc::channel();
    let (port, peer) = stalling_reader_peer(rx);
    let mut c = EngineConfig::defaults("P2PHANDSHAKE", "127.0.0.1");
    c.rpc_bind_address = Some("127.0.0.1".into());
    c.transfer_timeout = Duration::from_secs(1);
    c.slice_size = 1 << 20; // one frame
    c.tcp_connections = 1;
    let e = TransferEngine::new(c).unwrap();
    const LEN: usize = 200_000;
    let buf = leaked(LEN);
    e.register_local_memory(buf.as_ptr() as usize, LEN, "cpu:0", true)
        .unwrap();
    let seg = e.open_segment(&format!("127.0.0.1:{port}")).unwrap();
    let e2 = e.clone();
    let addr = buf.as_ptr() as usize;
    let r = guarded("a read from a stalled peer", move || {
        e2.transfer_sync(&[TransferRequest {
            opcode: Opcode::Read,
            source: addr,
            target_id: seg,
            target_offset: 0x10000,
            length: LEN,
        }])
    });
    assert_eq!(r.unwrap_err().code, ErrorCode::TRANSFER_FAIL);
    // The application may reuse the buffer now.
    buf.fill(0x11);
    release.send(()).unwrap();
    peer.join().unwrap();
    assert!(buf.iter().all(|&b| b == 0x11), "bytes landed after TIMEOUT");
}
