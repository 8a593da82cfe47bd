//! With a cluster token, an engine serves only peers that present it: an
//! anonymous `ReadReq` gets no byte of registered memory, and a peer with
//! no token or a wrong one cannot even fetch the descriptor; peers with
//! the token move bytes as usual.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use mooncake_common::auth::ClusterToken;
use mooncake_transfer::{EngineConfig, Opcode, TransferEngine, TransferRequest};

fn engine(token: Option<&str>) -> TransferEngine {
    let mut c = EngineConfig::defaults("P2PHANDSHAKE", "127.0.0.1");
    c.rpc_bind_address = Some("127.0.0.1".into());
    c.force_tcp = true;
    c.transfer_timeout = Duration::from_secs(10);
    c.cluster_token = token.map(|t| ClusterToken::new(t).unwrap());
    TransferEngine::new(c).unwrap()
}

fn managed(e: &TransferEngine, len: usize) -> &'static mut [u8] {
    let addr = e.allocate_managed_buffer(len).unwrap();
    // SAFETY: the engine keeps `len` bytes mapped at `addr` until freed,
    // and the test never frees them.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

/// A raw engine frame header (see `frame.rs`): magic, version, kind, no
/// flags, status 0, `seq`, `addr`, `len`.
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

/// Everything the engine sends back to `frames` before it closes the
/// connection (or goes quiet).
fn exchange(port: u16, frames: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(frames).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

const LEN: usize = 4096;
const READ_REQ: u8 = 3;
const AUTH_REQ: u8 = 9;

#[test]
fn the_token_guards_an_engines_memory() {
    let target = engine(Some("s3cret"));
    let memory = managed(&target, LEN);
    memory.fill(0xAB);
    let addr = memory.as_ptr() as u64;
    let port = target.rpc_port();

    // An anonymous read: one refusal header, no data, connection closed.
    let got = exchange(port, &header(READ_REQ, 1, addr, LEN as u64));
    assert_eq!(got.len(), 32, "only a refusal comes back: {got:?}");
    let status = i32::from_le_bytes(got[8..12].try_into().unwrap());
    assert_ne!(status, 0);
    assert!(!got.windows(64).any(|w| w.iter().all(|&b| b == 0xAB)));

    // A wrong token is refused, and the read behind it is not served.
    let mut frames = header(AUTH_REQ, 0, 0, 5).to_vec();
    frames.extend_from_slice(b"wrong");
    frames.extend_from_slice(&header(READ_REQ, 1, addr, LEN as u64));
    let got = exchange(port, &frames);
    // The refused AuthAck, unless the close outran it.
    assert!(got.len() == 32 || got.is_empty(), "no data: {got:?}");
    if got.len() == 32 {
        assert_ne!(i32::from_le_bytes(got[8..12].try_into().unwrap()), 0);
    }

    // The right token: the same read is served.
    let mut frames = header(AUTH_REQ, 0, 0, 6).to_vec();
    frames.extend_from_slice(b"s3cret");
    frames.extend_from_slice(&header(READ_REQ, 1, addr, LEN as u64));
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&frames).unwrap();
    let mut answer = vec![0u8; 32 + 32 + LEN];
    s.read_exact(&mut answer).unwrap();
    assert_eq!(i32::from_le_bytes(answer[8..12].try_into().unwrap()), 0);
    assert_eq!(i32::from_le_bytes(answer[40..44].try_into().unwrap()), 0);
    assert!(answer[64..].iter().all(|&b| b == 0xAB));

    // Engines: without the token, or with another, nothing opens.
    let name = target.local_server_name();
    assert!(engine(None).open_segment(&name).is_err());
    assert!(engine(Some("other")).open_segment(&name).is_err());

    // With it, reads and writes work.
    let peer = engine(Some("s3cret"));
    let local = managed(&peer, LEN);
    let seg = peer.open_segment(&name).unwrap();
    let source = local.as_ptr() as usize;
    let req = |opcode| TransferRequest {
        opcode,
        source,
        target_id: seg,
        target_offset: addr,
        length: LEN,
    };
    peer.transfer_sync(&[req(Opcode::Read)]).unwrap();
    assert!(local.iter().all(|&b| b == 0xAB));
    local.fill(0x5C);
    peer.transfer_sync(&[req(Opcode::Write)]).unwrap();
    assert!(memory.iter().all(|&b| b == 0x5C));
}

#[test]
fn an_engine_without_a_token_accepts_one() {
    // Mixed clusters while a token is rolled out: presenting one to an
    // engine that has none is harmless.
    let target = engine(None);
    let memory = managed(&target, LEN);
    memory.fill(7);
    let peer = engine(Some("s3cret"));
    let local = managed(&peer, LEN);
    let seg = peer.open_segment(&target.local_server_name()).unwrap();
    peer.transfer_sync(&[TransferRequest {
        opcode: Opcode::Read,
        source: local.as_ptr() as usize,
        target_id: seg,
        target_offset: memory.as_ptr() as u64,
        length: LEN,
    }])
    .unwrap();
    assert!(local.iter().all(|&b| b == 7));
}
