//! Two engines in separate processes: this test binary re-executes itself as
//! the peer (`peer_process`, ignored unless asked for) and drives it through
//! stdin/stdout. Covers both transports, every metadata backend, and bad
//! inputs: wrong addresses, unknown segments, an unreachable
//! metadata server, a peer that dies or stalls mid-batch, and malformed
//! frames sent straight to the engine's port.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use mooncake_common::ErrorCode;
use mooncake_transfer::metadata::http_server::MetadataServer;
use mooncake_transfer::metadata::{connect, segment_key, MetadataUri};
use mooncake_transfer::{
    EngineConfig, Notify, Opcode, TransferEngine, TransferRequest, TransferState,
};
use test_support::services;

const PEER_LEN: usize = 4 << 20;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

// ---------------------------------------------------------------- the peer

/// The peer process. Environment: `MC_TEST_PEER_META` (metadata server),
/// `MC_TEST_PEER_NAME`, `MC_TEST_PEER_USER_MEMORY` (register a Vec instead of
/// a managed buffer). Prints `@@READY name addr len port`, then answers
/// `hash`, `fill <seed>`, `notifies` and `quit` on stdin.
#[test]
#[ignore = "entry point of the peer process that the other tests spawn"]
fn peer_process() {
    let meta = std::env::var("MC_TEST_PEER_META").unwrap_or_else(|_| "P2PHANDSHAKE".into());
    let name = std::env::var("MC_TEST_PEER_NAME").unwrap_or_else(|_| "127.0.0.1".into());
    let mut config = EngineConfig::new(&meta, &name);
    config.rpc_bind_address = Some("127.0.0.1".into());
    let engine = match TransferEngine::new(config) {
        Ok(e) => e,
        Err(e) => {
            println!("@@ERR {}", e.code.code());
            return;
        }
    };
    let mut owned = Vec::new();
    let buf: &mut [u8] = if std::env::var_os("MC_TEST_PEER_USER_MEMORY").is_some() {
        owned.resize(PEER_LEN, 0u8);
        engine
            .register_local_memory(owned.as_mut_ptr() as usize, PEER_LEN, "cpu:0", true)
            .unwrap();
        &mut owned
    } else {
        let addr = engine.allocate_managed_buffer(PEER_LEN).unwrap();
        // SAFETY: the engine keeps PEER_LEN bytes mapped at `addr` for its lifetime.
        unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, PEER_LEN) }
    };
    buf.copy_from_slice(&pattern(PEER_LEN, 0));
    println!(
        "@@READY {} {} {} {}",
        engine.local_server_name(),
        buf.as_ptr() as usize,
        PEER_LEN,
        engine.rpc_port()
    );
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["hash"] => println!("@@HASH {}", fnv(buf)),
            ["fill", seed] => {
                buf.copy_from_slice(&pattern(PEER_LEN, seed.parse().unwrap()));
                println!("@@OK");
            }
            ["notifies"] => {
                for n in engine.get_notifies() {
                    println!("@@NOTIFY {} {}", n.name, n.msg);
                }
                println!("@@OK");
            }
            ["quit"] => break,
            _ => println!("@@ERR unknown command"),
        }
    }
    engine.shutdown();
}

/// A running peer process.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    name: String,
    addr: u64,
    port: u16,
}

impl Peer {
    fn spawn(meta: &str, name: &str, env: &[(&str, &str)]) -> Peer {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["peer_process", "--exact", "--ignored", "--nocapture", "-q"])
            .env("MC_TEST_PEER_META", meta)
            .env("MC_TEST_PEER_NAME", name)
            .env_remove("MC_FORCE_TCP")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // libtest may print on the same line; our messages carry a marker.
                if let Some(i) = line.find("@@") {
                    if tx.send(line[i + 2..].to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        let mut peer = Peer {
            child,
            stdin,
            lines,
            name: String::new(),
            addr: 0,
            port: 0,
        };
        let ready = peer.next_line();
        let w: Vec<&str> = ready.split_whitespace().collect();
        assert_eq!(w[0], "READY", "peer said {ready:?}");
        peer.name = w[1].to_string();
        peer.addr = w[2].parse().unwrap();
        assert_eq!(w[3].parse::<usize>().unwrap(), PEER_LEN);
        peer.port = w[4].parse().unwrap();
        peer
    }

    fn next_line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(60))
            .expect("peer process answered in time")
    }

    fn command(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        self.next_line()
    }

    fn hash(&mut self) -> u64 {
        let r = self.command("hash");
        r.strip_prefix("HASH ").unwrap().parse().unwrap()
    }

    fn notifies(&mut self) -> Vec<String> {
        writeln!(self.stdin, "notifies").unwrap();
        let mut out = vec![];
        loop {
            let l = self.next_line();
            if l == "OK" {
                return out;
            }
            out.push(l);
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    fn quit(mut self) {
        let _ = writeln!(self.stdin, "quit");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "peer exited with {status}");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------- the initiator

fn engine(meta: &str, name: &str, force_tcp: bool, timeout: Duration) -> TransferEngine {
    let mut c = EngineConfig::defaults(meta, name);
    c.rpc_bind_address = Some("127.0.0.1".into());
    c.force_tcp = force_tcp;
    c.transfer_timeout = timeout;
    TransferEngine::new(c).unwrap()
}

fn local_buffer(e: &TransferEngine, len: usize) -> &'static mut [u8] {
    let addr = e.allocate_managed_buffer(len).unwrap();
    // SAFETY: mapped by the engine until freed; these tests never free it.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

fn req(op: Opcode, local: &[u8], seg: u64, remote: u64, len: usize) -> TransferRequest {
    TransferRequest {
        opcode: op,
        source: local.as_ptr() as usize,
        target_id: seg,
        target_offset: remote,
        length: len,
    }
}

/// Writes, reads back and checks the peer's bytes through its own hash.
fn exchange(e: &TransferEngine, peer: &mut Peer) {
    let seg = e.open_segment(&peer.name).unwrap();
    assert_eq!(e.first_buffer_address(&peer.name).unwrap(), peer.addr);
    let local = local_buffer(e, PEER_LEN);

    // Read the peer's initial pattern.
    e.transfer_sync(&[req(Opcode::Read, local, seg, peer.addr, PEER_LEN)])
        .unwrap();
    assert!(local[..] == pattern(PEER_LEN, 0)[..]);

    // Overwrite a middle range with our bytes; the peer hashes the result.
    let mut mirror = pattern(PEER_LEN, 0);
    let ours = pattern(PEER_LEN, 77);
    local.copy_from_slice(&ours);
    let (off, len) = (123_457, 2_000_003);
    e.transfer_sync(&[req(
        Opcode::Write,
        &local[off..],
        seg,
        peer.addr + off as u64,
        len,
    )])
    .unwrap();
    mirror[off..off + len].copy_from_slice(&ours[off..off + len]);
    assert_eq!(peer.hash(), fnv(&mirror));

    // A batch of many small reads and writes at odd places.
    let batch = e.allocate_batch(256).unwrap();
    let mut reqs = vec![];
    for i in 0..200usize {
        let (loc, rem, n) = (i * 5003, 3_000_000 + i * 4001, 1 + i * 17 % 3000);
        if i % 3 == 0 {
            reqs.push(req(
                Opcode::Read,
                &local[loc..],
                seg,
                peer.addr + rem as u64,
                n,
            ));
        } else {
            reqs.push(req(
                Opcode::Write,
                &local[loc..],
                seg,
                peer.addr + rem as u64,
                n,
            ));
        }
    }
    // Ranges are disjoint, so the outcome does not depend on ordering.
    let before_local = local.to_vec();
    e.submit(batch, &reqs).unwrap();
    let s = e.wait_batch(batch).unwrap();
    assert_eq!(s.state, TransferState::Completed, "{s:?}");
    e.free_batch(batch).unwrap();
    for i in 0..200usize {
        let (loc, rem, n) = (i * 5003, 3_000_000 + i * 4001, 1 + i * 17 % 3000);
        if i % 3 == 0 {
            assert_eq!(&local[loc..loc + n], &mirror[rem..rem + n], "read {i}");
        } else {
            mirror[rem..rem + n].copy_from_slice(&before_local[loc..loc + n]);
        }
    }
    assert_eq!(peer.hash(), fnv(&mirror));
}

#[test]
fn tcp_between_processes() {
    let mut peer = Peer::spawn("P2PHANDSHAKE", "127.0.0.1", &[]);
    let e = engine("P2PHANDSHAKE", "127.0.0.1", true, Duration::from_secs(30));
    exchange(&e, &mut peer);
    let s = e.transport_stats();
    assert!(s.tcp > 0 && s.shm == 0, "{s:?}");
    peer.quit();
}

#[test]
fn shm_between_processes() {
    let mut peer = Peer::spawn("P2PHANDSHAKE", "127.0.0.1", &[]);
    let e = engine("P2PHANDSHAKE", "127.0.0.1", false, Duration::from_secs(30));
    exchange(&e, &mut peer);
    let s = e.transport_stats();
    assert!(s.shm > 0 && s.tcp == 0, "{s:?}");
    peer.quit();
}

#[test]
fn peer_with_force_tcp_is_not_mapped() {
    let mut peer = Peer::spawn("P2PHANDSHAKE", "127.0.0.1", &[("MC_FORCE_TCP", "1")]);
    let e = engine("P2PHANDSHAKE", "127.0.0.1", false, Duration::from_secs(30));
    exchange(&e, &mut peer);
    let s = e.transport_stats();
    assert!(s.tcp > 0 && s.shm == 0, "{s:?}");
    peer.quit();
}

#[test]
fn user_memory_of_a_peer_goes_over_tcp() {
    let mut peer = Peer::spawn(
        "P2PHANDSHAKE",
        "127.0.0.1",
        &[("MC_TEST_PEER_USER_MEMORY", "1")],
    );
    let e = engine("P2PHANDSHAKE", "127.0.0.1", false, Duration::from_secs(30));
    exchange(&e, &mut peer);
    let s = e.transport_stats();
    assert!(s.tcp > 0 && s.shm == 0, "{s:?}");
    peer.quit();
}

/// Publishes, transfers and unpublishes through a metadata server.
fn over_metadata(meta: &str) {
    let tag = format!("{}-{}", std::process::id(), rand::random::<u32>());
    // Outside P2P mode the name is kept as given; its port only names the
    // segment, and the engine listens on a port it picks (published).
    let port = services::free_port();
    let peer_name = format!("127.0.0.1:{port}");
    let mut peer = Peer::spawn(meta, &peer_name, &[]);
    assert_eq!(peer.name, peer_name);
    assert_ne!(peer.port, port);
    let e = engine(
        meta,
        &format!("initiator-{tag}"),
        true,
        Duration::from_secs(30),
    );
    exchange(&e, &mut peer);
    let seg = e.open_segment(&peer_name).unwrap();
    e.send_notify(
        seg,
        Notify {
            name: "x".into(),
            msg: "y".into(),
        },
    )
    .unwrap();
    assert_eq!(peer.notifies(), vec!["NOTIFY x y".to_string()]);

    let store = connect(&MetadataUri::parse(meta).unwrap()).unwrap();
    let desc: serde_json::Value =
        serde_json::from_slice(&store.get(&segment_key(&peer_name)).unwrap().unwrap()).unwrap();
    assert_eq!(desc["name"], peer_name.as_str());
    assert_eq!(desc["buffers"][0]["addr"], peer.addr);
    assert_eq!(desc["buffers"][0]["length"], PEER_LEN as u64);
    let meta_json: serde_json::Value = serde_json::from_slice(
        &store
            .get(&format!("mooncake/rpc_meta/{peer_name}"))
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(meta_json["rpc_port"], peer.port);
    assert_eq!(meta_json["ip_or_host_name"], "127.0.0.1");

    peer.quit();
    // A clean exit removes the peer's keys.
    assert_eq!(store.get(&segment_key(&peer_name)).unwrap(), None);
    let fresh = engine(meta, &format!("late-{tag}"), true, Duration::from_secs(30));
    assert_eq!(
        fresh.open_segment(&peer_name).unwrap_err().code,
        ErrorCode::ERR_METADATA
    );
}

#[test]
fn http_metadata_between_processes() {
    let server = MetadataServer::spawn("127.0.0.1", 0).unwrap();
    over_metadata(&server.url());
    server.stop();
}

#[test]
fn etcd_metadata_between_processes() {
    let etcd = services::etcd();
    over_metadata(&format!("etcd://{}", etcd.addr));
}

#[test]
fn redis_metadata_between_processes() {
    let redis = services::redis();
    over_metadata(&format!("redis://{}", redis.addr));
}

#[test]
fn unreachable_metadata_server_is_err_metadata() {
    let port = services::free_port();
    for meta in [
        format!("http://127.0.0.1:{port}/metadata"),
        format!("etcd://127.0.0.1:{port}"),
        format!("127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
    ] {
        let c = EngineConfig::defaults(&meta, "node");
        let e = TransferEngine::new(c).err().expect(&meta);
        assert_eq!(e.code, ErrorCode::ERR_METADATA, "{meta}: {e}");
    }
}

#[test]
fn bad_addresses_against_a_peer_process() {
    let mut peer = Peer::spawn("P2PHANDSHAKE", "127.0.0.1", &[]);
    let e = engine("P2PHANDSHAKE", "127.0.0.1", true, Duration::from_secs(30));
    let seg = e.open_segment(&peer.name).unwrap();
    let local = local_buffer(&e, 8192);
    let stray = [0u8; 16];
    let code = |r: TransferRequest| e.transfer_sync(&[r]).unwrap_err().code;
    assert_eq!(
        code(req(Opcode::Write, &stray, seg, peer.addr, 16)),
        ErrorCode::ERR_ADDRESS_NOT_REGISTERED
    );
    let end = peer.addr + PEER_LEN as u64;
    assert_eq!(
        code(req(Opcode::Write, local, seg, end - 10, 11)),
        ErrorCode::ERR_ADDRESS_NOT_REGISTERED
    );
    assert_eq!(
        code(req(Opcode::Read, local, seg, peer.addr - 1, 2)),
        ErrorCode::ERR_ADDRESS_NOT_REGISTERED
    );
    assert_eq!(
        code(req(Opcode::Read, local, seg, 0, 8)),
        ErrorCode::ERR_ADDRESS_NOT_REGISTERED
    );
    assert_eq!(
        code(req(Opcode::Read, local, seg + 100, peer.addr, 8)),
        ErrorCode::ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        peer.hash(),
        fnv(&pattern(PEER_LEN, 0)),
        "the peer's memory is untouched"
    );
    let dead = format!("127.0.0.1:{}", services::free_port());
    assert_eq!(
        e.open_segment(&dead).unwrap_err().code,
        ErrorCode::ERR_METADATA
    );
    peer.quit();
}

#[test]
fn peer_killed_mid_batch_fails_the_batch() {
    let peer = Peer::spawn("P2PHANDSHAKE", "127.0.0.1", &[]);
    let e = engine("P2PHANDSHAKE", "127.0.0.1", true, Duration::from_secs(30));
    let seg = e.open_segment(&peer.name).unwrap();
    let local = local_buffer(&e, PEER_LEN);
    // Stopped, the peer cannot finish anything: the batch is surely mid-way
    // when it dies.
    peer.signal(libc::SIGSTOP);
    let batch = e.allocate_batch(64).unwrap();
    let reqs: Vec<_> = (0..64)
        .map(|i| {
            let op = if i % 2 == 0 {
                Opcode::Write
            } else {
                Opcode::Read
            };
            let off = i * (PEER_LEN / 64);
            req(
                op,
                &local[off..],
                seg,
                peer.addr + off as u64,
                PEER_LEN / 64,
            )
        })
        .collect();
    e.submit(batch, &reqs).unwrap();
    assert_eq!(e.batch_status(batch).unwrap().state, TransferState::Waiting);
    peer.signal(libc::SIGKILL);
    let s = e.wait_batch(batch).unwrap();
    assert_eq!(s.state, TransferState::Failed, "{s:?}");
    assert_eq!(s.error, Some(ErrorCode::ERR_SOCKET));
    e.free_batch(batch).unwrap();
    drop(peer);
}

#[test]
fn dead_peer_is_not_written_through_its_old_mapping() {
    let peer = Peer::spawn("P2PHANDSHAKE", "127.0.0.1", &[]);
    let e = engine("P2PHANDSHAKE", "127.0.0.1", false, Duration::from_secs(30));
    let seg = e.open_segment(&peer.name).unwrap();
    let local = local_buffer(&e, 4096);
    e.transfer_sync(&[req(Opcode::Write, local, seg, peer.addr, 4096)])
        .unwrap();
    assert_eq!(e.transport_stats().shm, 1);
    let addr = peer.addr;
    drop(peer); // SIGKILL and reap
                // Our mapping would still "work"; the engine notices the owner is gone.
    let err = e
        .transfer_sync(&[req(Opcode::Write, local, seg, addr, 4096)])
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::ERR_SOCKET, "{err}");
    assert_eq!(e.transport_stats().shm, 1);
}

#[test]
fn stalled_peer_times_out_then_recovers() {
    let peer = Peer::spawn("P2PHANDSHAKE", "127.0.0.1", &[]);
    let e = engine("P2PHANDSHAKE", "127.0.0.1", true, Duration::from_secs(2));
    let seg = e.open_segment(&peer.name).unwrap();
    let local = local_buffer(&e, PEER_LEN);
    peer.signal(libc::SIGSTOP);
    let batch = e.allocate_batch(4).unwrap();
    let reqs = [
        req(Opcode::Read, local, seg, peer.addr, PEER_LEN / 2),
        req(
            Opcode::Write,
            &local[PEER_LEN / 2..],
            seg,
            peer.addr,
            PEER_LEN / 2,
        ),
    ];
    e.submit(batch, &reqs).unwrap();
    let s = e.wait_batch(batch).unwrap();
    assert_eq!(s.state, TransferState::Timeout, "{s:?}");
    assert_eq!(
        e.transfer_status(batch, 0).unwrap().state,
        TransferState::Timeout
    );
    e.free_batch(batch).unwrap();
    peer.signal(libc::SIGCONT);
    // The timed-out connections were closed; new ones carry new requests.
    // (Bytes of the timed-out write that were already in the peer's socket
    // may still land when it resumes: a timeout does not undo a write.)
    let tail = PEER_LEN / 2;
    e.transfer_sync(&[req(
        Opcode::Read,
        &local[tail..],
        seg,
        peer.addr + tail as u64,
        4096,
    )])
    .unwrap();
    assert_eq!(
        &local[tail..tail + 4096],
        &pattern(PEER_LEN, 0)[tail..tail + 4096]
    );
    peer.quit();
}

// ------------------------------------------------------------ raw frames

/// A header in the documented wire format (see `frame.rs`).
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

fn raw(peer: &Peer) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", peer.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// The peer closed the connection (EOF or reset) instead of answering.
fn assert_closed(mut s: TcpStream, what: &str) {
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => {}
        other => panic!("{what}: expected the connection closed, got {other:?}"),
    }
}

fn read_response(s: &mut TcpStream) -> (u8, i32, u32, u64) {
    let mut b = [0u8; 32];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b[0..4], b"MCTE");
    let status = i32::from_le_bytes(b[8..12].try_into().unwrap());
    let seq = u32::from_le_bytes(b[12..16].try_into().unwrap());
    let len = u64::from_le_bytes(b[24..32].try_into().unwrap());
    (b[5], status, seq, len)
}

#[test]
fn malformed_and_oversized_frames_close_the_connection() {
    let mut peer = Peer::spawn("P2PHANDSHAKE", "127.0.0.1", &[]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "garbage",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\0\0\0\0\0".to_vec(),
        ),
        ("bad version", {
            let mut h = header(1, 1, peer.addr, 4);
            h[4] = 9;
            h.to_vec()
        }),
        ("unknown kind", header(99, 1, peer.addr, 0).to_vec()),
        ("nonzero flags", {
            let mut h = header(3, 1, peer.addr, 4);
            h[6] = 1;
            h.to_vec()
        }),
        ("oversized write", header(1, 1, peer.addr, 1 << 40).to_vec()),
        ("oversized read", header(3, 1, peer.addr, u64::MAX).to_vec()),
        ("oversized handshake", header(5, 1, 0, 1 << 30).to_vec()),
        ("response kind sent as request", header(2, 1, 0, 0).to_vec()),
    ];
    for (what, bytes) in cases {
        let mut s = raw(&peer);
        s.write_all(&bytes).unwrap();
        assert_closed(s, what);
    }
    // A truncated header, then a truncated payload, each followed by a
    // hang-up. Payload bytes that arrived before the hang-up may have landed
    // (the receiver reads straight into the segment, as RDMA would), but only
    // inside the range the frame named.
    let mut s = raw(&peer);
    s.write_all(&header(1, 1, peer.addr, 100)[..20]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_closed(s, "truncated header");
    let torn = 1_000_000;
    let mut s = raw(&peer);
    s.write_all(&header(1, 1, peer.addr + torn as u64, 100))
        .unwrap();
    s.write_all(&[1u8; 50]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    // Closed by the peer once it gave up on the frame: nothing more lands.
    assert_closed(s, "truncated payload");
    let mut mirror = pattern(PEER_LEN, 0);
    let hash = peer.hash();
    let landed = (0..=50).find(|&n| {
        mirror[torn..torn + n].fill(1);
        fnv(&mirror) == hash
    });
    assert!(
        landed.is_some(),
        "only a prefix of the torn write's range changed"
    );
    let original = hash;

    // Well-formed frames naming memory outside the segment get a code, and
    // the connection stays usable.
    let mut s = raw(&peer);
    s.write_all(&header(1, 7, peer.addr + PEER_LEN as u64 - 8, 16))
        .unwrap();
    s.write_all(&[0xee; 16]).unwrap();
    assert_eq!(
        read_response(&mut s),
        (2, ErrorCode::ERR_ADDRESS_NOT_REGISTERED.wire(), 7, 0)
    );
    s.write_all(&header(3, 8, 4096, 16)).unwrap();
    assert_eq!(
        read_response(&mut s),
        (4, ErrorCode::ERR_ADDRESS_NOT_REGISTERED.wire(), 8, 0)
    );
    s.write_all(&header(3, 9, peer.addr, 16)).unwrap();
    let (kind, status, seq, len) = read_response(&mut s);
    assert_eq!((kind, status, seq, len), (4, 0, 9, 16));
    let mut data = [0u8; 16];
    s.read_exact(&mut data).unwrap();
    assert_eq!(&data[..], &pattern(PEER_LEN, 0)[..16]);
    // A notify payload that is not UTF-8 is refused with a code.
    s.write_all(&header(7, 10, 0, 5)).unwrap();
    s.write_all(&[1, 0, 0, 0, 0xff]).unwrap();
    assert_eq!(
        read_response(&mut s),
        (8, ErrorCode::ERR_INVALID_ARGUMENT.wire(), 10, 0)
    );
    drop(s);

    // The peer survived all of it, with its memory untouched.
    assert_eq!(peer.hash(), original);
    let e = engine("P2PHANDSHAKE", "127.0.0.1", true, Duration::from_secs(30));
    let seg = e.open_segment(&peer.name).unwrap();
    let local = local_buffer(&e, 4096);
    e.transfer_sync(&[req(Opcode::Read, local, seg, peer.addr, 4096)])
        .unwrap();
    assert_eq!(&local[..], &pattern(PEER_LEN, 0)[..4096]);
    peer.quit();
}
