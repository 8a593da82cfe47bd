//! Memory the master spends on hostile but well-formed requests: batch
//! calls of millions of empty keys. The master runs in this process, alone
//! in this test binary, so the process's RSS is the master's (plus the
//! test's own buffers, built before measuring).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use mooncake_common::ErrorCode;
use mooncake_store::master::{MasterConfig, MasterHandle};
use mooncake_store::proto::frame::{decode_payload, encode_frame, read_frame};
use mooncake_store::proto::wire::{put_varint, MAX_SEQUENCE_LEN};
use mooncake_store::proto::{Request, Response};
use test_support::eventually;
use test_support::ports::MASTER_ANY_PORTS;

/// `(VmRSS, VmHWM)` of this process in bytes.
fn rss() -> (usize, usize) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> usize {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib << 10
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets the peak (VmHWM) to the current RSS.
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

/// A `BatchExistKey` frame of `n` empty keys, encoded by hand (our encoder
/// would refuse nothing: the cap is the decoder's).
fn empty_keys_frame(n: usize) -> Vec<u8> {
    let mut payload = vec![mooncake_store::proto::PROTOCOL_VERSION];
    let probe = Request::BatchExistKey { keys: vec![] };
    let mut tagged = Vec::new();
    encode_frame(&probe, &mut tagged).unwrap();
    // Version, tag, then the key count and `n` zero-length keys.
    payload.push(tagged[5]);
    put_varint(&mut payload, n as u64);
    payload.resize(payload.len() + n, 0);
    let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&payload);
    frame
}

const MIB: usize = 1 << 20;
/// What the master may keep per connection beyond twice the bytes sent:
/// one batch at the sequence cap, decoded and answered (keys, results,
/// the encoded answer).
const FIXED: usize = 96 * MIB;

#[test]
fn batch_of_empty_keys_costs_a_bounded_multiple_of_its_bytes() {
    let config = MasterConfig::from_settings(MASTER_ANY_PORTS.into_iter().chain([
        ("rpc_address", "127.0.0.1"),
        ("metrics_host", "127.0.0.1"),
        ("rpc_thread_num", "2"),
    ]))
    .unwrap();
    let master = MasterHandle::spawn(config).unwrap();
    let mut s = TcpStream::connect(master.rpc_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut answer = Vec::with_capacity(16 * MIB);
    let call = |s: &mut TcpStream, frame: &[u8], answer: &mut Vec<u8>| {
        s.write_all(frame).unwrap();
        read_frame(s, answer).unwrap();
    };
    // Warm up the connection's thread and buffers.
    let small = empty_keys_frame(1);
    call(&mut s, &small, &mut answer);

    // Over the cap: refused whole, at the decoder.
    let over = empty_keys_frame(4 << 20);
    let (base, _) = rss();
    reset_peak();
    for _ in 0..2 {
        call(&mut s, &over, &mut answer);
        match decode_payload::<Response>(&answer).unwrap() {
            Response::Failed { error } => assert_eq!(error.code, ErrorCode::DESERIALIZE_FAIL),
            other => panic!("{other:?}"),
        }
    }
    let (_, peak) = rss();
    let sent = 2 * over.len();
    eprintln!(
        "over the cap: {sent} bytes sent, peak RSS +{} KiB",
        (peak - base) >> 10
    );
    assert!(
        peak.saturating_sub(base) <= 2 * sent + FIXED,
        "{} MiB sent raised RSS by {} MiB at its peak",
        sent / MIB,
        (peak - base) / MIB
    );

    // At the cap: answered, one cheap error per key.
    let at_cap = empty_keys_frame(MAX_SEQUENCE_LEN);
    let (base, _) = rss();
    reset_peak();
    call(&mut s, &at_cap, &mut answer);
    let (_, peak) = rss();
    eprintln!(
        "at the cap: {} bytes sent, peak RSS +{} KiB",
        at_cap.len(),
        (peak - base) >> 10
    );
    assert!(
        peak.saturating_sub(base) <= 2 * at_cap.len() + FIXED,
        "{} MiB sent raised RSS by {} MiB at its peak",
        at_cap.len() / MIB,
        (peak - base) / MIB
    );
    match decode_payload::<Response>(&answer).unwrap() {
        Response::Bools { results } => {
            assert_eq!(results.len(), MAX_SEQUENCE_LEN);
            assert!(results
                .iter()
                .all(|r| r.as_ref().unwrap_err().code == ErrorCode::INVALID_KEY));
        }
        other => panic!("{other:?}"),
    }
    drop(at_cap);
    drop(over);
    // And the memory returns once the call is over.
    drop(answer);
    eventually("the master's heap shrinks back", || {
        rss().0 <= base + 16 * MIB
    });
    eprintln!("after: RSS {:+} KiB", (rss().0 as i64 - base as i64) >> 10);
    let mut byte = [0u8; 1];
    s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    assert!(
        s.read(&mut byte).is_err(),
        "no stray bytes after the answers"
    );
    master.stop().unwrap();
}
