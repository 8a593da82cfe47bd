//! The worst request frames we know, streamed at a real `mooncake_master`
//! and a real transfer engine (`transfer_engine_bench --mode=target`): the
//! server's RSS (read from `/proc/<pid>/status`) may grow by at most twice
//! the bytes sent plus a fixed bound, and comes back afterwards.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use common::{free_port, wait_port, MasterPorts, Proc, MASTER};
use mooncake_store::proto::frame::{encode_frame, read_frame};
use mooncake_store::proto::wire::{put_varint, MAX_SEQUENCE_LEN};
use mooncake_store::proto::Request;

const MIB: usize = 1 << 20;

/// `(VmRSS, VmHWM)` of process `pid`, in bytes.
fn rss(pid: u32) -> (usize, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> usize {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib << 10
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets the peak (VmHWM) of `pid` to its current RSS.
fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}

/// Measures what `attack` (which returns the bytes it sent) costs `pid`:
/// asserts the peak growth and what stays afterwards.
fn assert_bounded(pid: u32, what: &str, fixed: usize, attack: impl FnOnce() -> usize) {
    let (base, _) = rss(pid);
    reset_peak(pid);
    let sent = attack();
    let (_, peak) = rss(pid);
    let grew = peak.saturating_sub(base);
    println!("{what}: sent {} KiB, peak +{} KiB", sent >> 10, grew >> 10);
    assert!(
        grew <= 2 * sent + fixed,
        "{what}: RSS grew {} MiB for {} MiB sent",
        grew / MIB,
        sent / MIB
    );
    // Freed memory goes back to the system (allocator trims are not
    // immediate everywhere: poll, bounded).
    let mut left = usize::MAX;
    for _ in 0..100 {
        left = rss(pid).0.saturating_sub(base);
        if left <= fixed / 4 {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    assert!(
        left <= fixed / 4,
        "{what}: {} MiB still held afterwards",
        left / MIB
    );
}

/// A `BatchExistKey` frame of `n` empty keys, encoded by hand.
fn empty_keys_frame(n: usize) -> Vec<u8> {
    let probe = Request::BatchExistKey { keys: vec![] };
    let mut tagged = Vec::new();
    encode_frame(&probe, &mut tagged).unwrap();
    let mut payload = vec![tagged[4], tagged[5]]; // version, tag
    put_varint(&mut payload, n as u64);
    payload.resize(payload.len() + n, 0);
    let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&payload);
    frame
}

#[test]
fn master_answers_the_worst_batches_within_the_memory_bound() {
    let port = free_port();
    let http = free_port();
    let master = Proc(
        Command::new(&*MASTER)
            .args(
                MasterPorts {
                    rpc: port,
                    metrics: http,
                    ..MasterPorts::ANY
                }
                .args(),
            )
            .args(["--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_port(port);
    let pid = master.0.id();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut answer = Vec::new();
    let mut call = |frame: &[u8]| {
        s.write_all(frame).unwrap();
        read_frame(&mut s, &mut answer).unwrap();
        frame.len()
    };
    call(&empty_keys_frame(1)); // warm the connection up

    // Over the sequence cap: refused at the decoder.
    let over = empty_keys_frame(4 * MAX_SEQUENCE_LEN);
    assert_bounded(pid, "master, 2 frames over the cap", 16 * MIB, || {
        call(&over) + call(&over)
    });
    // At the cap: decoded and answered, one result per key.
    let at_cap = empty_keys_frame(MAX_SEQUENCE_LEN);
    assert_bounded(pid, "master, 4 frames at the cap", 96 * MIB, || {
        (0..4).map(|_| call(&at_cap)).sum()
    });
}

/// A transfer-engine request header (see `mooncake_transfer`'s `frame.rs`).
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
const DESC_REQ: u8 = 5;
/// `MC_HANDSHAKE_MAX_LENGTH` for the target.
const CONTROL_MAX: usize = MIB;

struct Target(Proc, u16);

impl Target {
    fn start() -> Target {
        let mut child = Command::new(mooncake_system_tests::program("transfer_engine_bench"))
            .args([
                "--mode=target",
                "--local_server_name=127.0.0.1",
                "--buffer_size=8388608",
            ])
            .env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
            .env("MC_FORCE_TCP", "1")
            .env("MC_HANDSHAKE_MAX_LENGTH", CONTROL_MAX.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut port = None;
        for line in stdout.lines() {
            let line = line.unwrap();
            if let Some(s) = line.split("segment_id=").nth(1) {
                port = s.trim().rsplit(':').next().and_then(|p| p.parse().ok());
                break;
            }
        }
        let port = port.expect("target announced its segment");
        wait_port(port);
        Target(Proc(child), port)
    }
}

#[test]
fn engine_takes_the_worst_frames_within_the_memory_bound() {
    let target = Target::start();
    let pid = target.0 .0.id();
    let port = target.1;

    // Many connections, each announcing the largest control payload and
    // sending a little of it: buffers grow with what arrived, not with
    // what the header claims.
    assert_bounded(pid, "engine, 200 lying control headers", 48 * MIB, || {
        let mut held = Vec::new();
        let mut sent = 0;
        for i in 0..200 {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(&header(DESC_REQ, i, 0, CONTROL_MAX as u64))
                .unwrap();
            s.write_all(&[b'x'; 1000]).unwrap();
            sent += 32 + 1000;
            held.push(s);
        }
        thread::sleep(Duration::from_millis(500)); // let the engine read
        drop(held);
        sent
    });

    // Whole control frames at the limit, then huge writes to memory that
    // is not registered (payloads skipped, not buffered).
    assert_bounded(pid, "engine, full descriptor requests", 48 * MIB, || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let name = vec![b'n'; CONTROL_MAX];
        let mut sent = 0;
        for i in 0..16 {
            s.write_all(&header(DESC_REQ, i, 0, name.len() as u64))
                .unwrap();
            s.write_all(&name).unwrap();
            sent += 32 + name.len();
            let mut resp = [0u8; 32];
            s.read_exact(&mut resp).unwrap();
            let len = u64::from_le_bytes(resp[24..32].try_into().unwrap());
            std::io::copy(&mut (&s).take(len), &mut std::io::sink()).unwrap();
        }
        let chunk = vec![0u8; 4 * MIB];
        for i in 0..8 {
            s.write_all(&header(WRITE_REQ, 100 + i, 0x1000, chunk.len() as u64))
                .unwrap();
            s.write_all(&chunk).unwrap();
            sent += 32 + chunk.len();
            let mut ack = [0u8; 32];
            s.read_exact(&mut ack).unwrap();
        }
        sent
    });
}
