//! Two TENT engines in one process, each with two paths (127.0.0.1 and
//! 127.0.0.2): large transfers are sprayed over both paths and move the
//! right bytes; a path whose peer endpoint dies mid-transfer leaves
//! rotation, its slices are retried on the other, and every transfer
//! completes; it comes back once its endpoint listens again; with no path
//! left the caller gets an error, not a hang.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use mooncake_tent::health::PathState;
use mooncake_tent::{TentConfig, TentEngine};
use mooncake_transfer::{EngineConfig, Opcode, TransferEngine, TransferRequest};

fn config() -> TentConfig {
    let mut c = TentConfig::defaults("P2PHANDSHAKE", "127.0.0.1");
    c.addresses = vec!["127.0.0.1".into(), "127.0.0.2".into()];
    c.slice_size = 256 << 10;
    c.metrics.enabled = true;
    c.metrics.http_port = 0; // a free port
    c.metrics.report_interval_seconds = 0;
    // Generous on a loaded machine; the no-path test shortens it.
    c.stall_timeout = Duration::from_secs(3);
    c.transfer_timeout = Duration::from_secs(20);
    c
}

fn engine(c: TentConfig) -> TentEngine {
    TentEngine::new(c).expect("engine starts")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / 7) as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A registered buffer of `len` bytes (leaked: engines may outlive the test's frames).
fn buffer(e: &TentEngine, len: usize, remote: bool) -> &'static mut [u8] {
    let b: &'static mut [u8] = Box::leak(vec![0u8; len].into_boxed_slice());
    e.register_local_memory(b.as_ptr() as usize, len, "cpu:0", remote)
        .unwrap();
    b
}

fn req(op: Opcode, local: &[u8], target: u64, remote: u64, len: usize) -> TransferRequest {
    TransferRequest {
        opcode: op,
        source: local.as_ptr() as usize,
        target_id: target,
        target_offset: remote,
        length: len,
    }
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn sprays_over_both_paths_and_moves_every_byte() {
    let a = engine(config());
    let b = engine(config());
    assert_eq!(a.paths().len(), 2);
    const LEN: usize = 24 << 20;
    let src = buffer(&a, LEN, false);
    let dst = buffer(&b, LEN, true);
    src.copy_from_slice(&pattern(LEN, 3));
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    let paths = a.path_info(seg).unwrap();
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert!(paths[1].endpoint.starts_with("127.0.0.2:"), "{paths:?}");

    let remote = dst.as_ptr() as u64;
    a.transfer_sync(&[req(Opcode::Write, src, seg, remote, LEN)])
        .unwrap();
    assert!(dst[..] == pattern(LEN, 3)[..], "write landed");
    dst.copy_from_slice(&pattern(LEN, 8));
    // Two requests, one not slice-aligned.
    a.transfer_sync(&[
        req(Opcode::Read, src, seg, remote, 5_000_001),
        req(
            Opcode::Read,
            &src[5_000_001..],
            seg,
            remote + 5_000_001,
            LEN - 5_000_001,
        ),
    ])
    .unwrap();
    assert!(src[..] == pattern(LEN, 8)[..], "read landed");

    let paths = a.path_info(seg).unwrap();
    for p in &paths {
        assert_eq!(p.state, PathState::Healthy, "{paths:?}");
        assert!(
            p.completed_slices >= 10,
            "both paths carried slices: {paths:?}"
        );
    }
    let port = a.metrics_port().expect("metrics served");
    let text = http_get(port, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains(&format!(
            "tent_write_bytes_total{{transport=\"tcp\"}} {LEN}"
        )),
        "{text}"
    );
    assert!(http_get(port, "/metrics/summary").contains("Write: 24.00 MB"));
    assert!(http_get(port, "/metrics/json").contains("\"tent_read_bytes_total\":25165824"));
    let health = http_get(port, "/health");
    assert!(health.contains("\"paths_up\":2"), "{health}");
    assert!(http_get(port, "/nope").starts_with("HTTP/1.1 404"));
    let json = a.metrics().json();
    assert_eq!(json["tent_write_bytes_total"], LEN as u64);
    assert_eq!(json["tent_read_bytes_total"], LEN as u64);
    assert_eq!(json["tent_slice_retries_total"], 0);
}

#[test]
fn bad_requests_are_refused_before_anything_moves() {
    let a = engine(config());
    let b = engine(config());
    let src = buffer(&a, 1 << 20, false);
    let dst = buffer(&b, 1 << 20, true);
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    let remote = dst.as_ptr() as u64;
    let unregistered = vec![0u8; 4096];
    let e = a
        .transfer_sync(&[req(Opcode::Write, &unregistered, seg, remote, 4096)])
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::ERR_ADDRESS_NOT_REGISTERED);
    let e = a
        .transfer_sync(&[req(Opcode::Write, src, seg, remote + (1 << 20), 1)])
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::ERR_ADDRESS_NOT_REGISTERED);
    let e = a
        .transfer_sync(&[req(Opcode::Write, src, 99, remote, 1)])
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::ERR_INVALID_ARGUMENT);
    assert!(a.open_segment("127.0.0.1:1").is_err(), "nobody listens");
    // Staged: unregistered local memory goes through a registered buffer.
    let mut plain = pattern(100_000, 5);
    // SAFETY: `plain` is a live Vec for the whole call.
    unsafe {
        a.transfer_sync_staged(&[req(Opcode::Write, &plain, seg, remote, 100_000)])
            .unwrap();
    }
    assert!(dst[..100_000] == pattern(100_000, 5)[..]);
    dst[..100_000].copy_from_slice(&pattern(100_000, 6));
    // SAFETY: as above.
    unsafe {
        a.transfer_sync_staged(&[req(Opcode::Read, &plain, seg, remote, 100_000)])
            .unwrap();
    }
    plain.truncate(100_000);
    assert!(plain == pattern(100_000, 6));
}

/// Kills B's second endpoint while A writes: every write completes with
/// the right bytes, the path leaves rotation and its slices are retried;
/// a new listener on the same address and port brings it back.
#[test]
fn a_path_dying_mid_transfer_is_failed_over_and_comes_back() {
    let a = engine(config());
    let b = engine(config());
    const LEN: usize = 16 << 20;
    let src = buffer(&a, LEN, false);
    let dst = buffer(&b, LEN, true);
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    let remote = dst.as_ptr() as u64;

    let killed = Arc::new(AtomicBool::new(false));
    let killer = {
        let (a, b, killed) = (a.clone(), b.clone(), killed.clone());
        std::thread::spawn(move || {
            // Once path 1 has carried traffic, its peer endpoint dies.
            let deadline = Instant::now() + Duration::from_secs(60);
            while a.path_info(seg).unwrap()[1].completed_slices < 20 {
                assert!(Instant::now() < deadline, "path 1 never used");
                std::thread::sleep(Duration::from_millis(1));
            }
            b.paths()[1].shutdown();
            killed.store(true, Ordering::SeqCst);
        })
    };
    let mut round = 0u8;
    let mut after_kill = 0;
    while after_kill < 3 {
        round = round.wrapping_add(1);
        src.copy_from_slice(&pattern(LEN, round));
        let was_killed = killed.load(Ordering::SeqCst);
        a.transfer_sync(&[req(Opcode::Write, src, seg, remote, LEN)])
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(dst[..] == pattern(LEN, round)[..], "round {round}");
        if was_killed {
            after_kill += 1;
        }
        assert!(round < 200, "the kill never happened");
    }
    killer.join().unwrap();
    let info = a.path_info(seg).unwrap();
    assert!(info[1].trips >= 1, "{info:?}");
    assert_ne!(info[1].state, PathState::Healthy, "{info:?}");
    assert_eq!(info[0].state, PathState::Healthy, "{info:?}");
    assert!(a.metrics().path_down_total() >= 1);
    eprintln!("after the kill: {}", a.metrics().summary());
    let text = a.metrics().prometheus();
    assert!(text.contains("tent_path_up{peer=\""), "{text}");

    // The endpoint listens again (same address and port, same memory).
    let port: u16 = info[1]
        .endpoint
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut c = EngineConfig::defaults("P2PHANDSHAKE", "127.0.0.2");
    c.rpc_bind_address = Some("127.0.0.2".into());
    c.rpc_port = Some(port);
    let revived = TransferEngine::new(c).expect("port free again");
    revived
        .register_local_memory(dst.as_ptr() as usize, LEN, "cpu:0", true)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        a.transfer_sync(&[req(Opcode::Write, src, seg, remote, LEN)])
            .unwrap();
        let info = a.path_info(seg).unwrap();
        if info[1].state == PathState::Healthy {
            break;
        }
        assert!(Instant::now() < deadline, "path never came back: {info:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = a.path_info(seg).unwrap()[1].completed_slices;
    a.transfer_sync(&[req(Opcode::Write, src, seg, remote, LEN)])
        .unwrap();
    assert!(
        a.path_info(seg).unwrap()[1].completed_slices > before,
        "back in rotation"
    );
}

#[test]
fn no_path_left_is_an_error_not_a_hang() {
    let mut c = config();
    c.stall_timeout = Duration::from_secs(1);
    c.transfer_timeout = Duration::from_secs(2);
    let a = engine(c.clone());
    let b = engine(c);
    let src = buffer(&a, 4 << 20, false);
    let dst = buffer(&b, 4 << 20, true);
    let seg = a.open_segment(&b.local_server_name()).unwrap();
    let remote = dst.as_ptr() as u64;
    a.transfer_sync(&[req(Opcode::Write, src, seg, remote, 4 << 20)])
        .unwrap();
    b.shutdown();
    let start = Instant::now();
    let e = a
        .transfer_sync(&[req(Opcode::Write, src, seg, remote, 4 << 20)])
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(30), "{e}");
    assert_ne!(e.code, ErrorCode::OK, "{e}");
    let info = a.path_info(seg).unwrap();
    assert!(
        info.iter().all(|p| p.state != PathState::Healthy),
        "{info:?}"
    );
}
