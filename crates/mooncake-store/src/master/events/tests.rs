use std::time::{Duration, Instant};

use super::encode::{self, seq_hash, Numbered};
use super::*;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn format(backend: &str, legacy: bool, object_key: bool) -> Format {
    Format {
        backend_id: backend.into(),
        legacy,
        object_key,
    }
}

fn pending(kind: Kind, key: &str, medium: Medium) -> Pending {
    Pending {
        kind,
        key: key.into(),
        medium,
    }
}

// The reference's `KvEventKeyUtilTest.ParseSeqHashFromObjectKey`, and what
// `strtoull` makes of signs, blanks and overflow.
#[test]
fn keys_parse_as_the_reference_does() {
    assert_eq!(seq_hash("12345"), Some(12345));
    assert_eq!(seq_hash("0x2a"), Some(42));
    assert_eq!(seq_hash("0XFF"), Some(255));
    assert_eq!(seq_hash(""), None);
    assert_eq!(seq_hash("not-a-hash"), None);
    assert_eq!(seq_hash("123abc"), None);
    assert_eq!(seq_hash("99"), Some(99));
    assert_eq!(seq_hash("18446744073709551615"), Some(u64::MAX));
    assert_eq!(seq_hash("18446744073709551616"), None);
    assert_eq!(seq_hash("0xFFFFFFFFFFFFFFFF"), Some(u64::MAX));
    assert_eq!(seq_hash("0x10000000000000000"), None);
    assert_eq!(seq_hash("0x"), None);
    assert_eq!(seq_hash("0x-1"), None);
    assert_eq!(seq_hash(" 7"), Some(7));
    assert_eq!(seq_hash("+7"), Some(7));
    assert_eq!(seq_hash("-1"), Some(u64::MAX));
    assert_eq!(seq_hash("7 "), None);
    assert_eq!(seq_hash("-"), None);
    assert_eq!(seq_hash("e3b0c442_0_k"), None);
}

// Golden bytes written by Python's msgpack from maps in the reference's key
// order (20 keys stored, 17 removed, with both variants on): the same
// smallest encodings msgpack-c picks.
const BOTH: &str = "93cf0000019af232b27b92de0014a86576656e745f696401a974696d657374616d70cf0000019af232b27baa6576656e745f74797065a673746f726564a474797065ab426c6f636b53746f726564aa6d6f64656c5f6e616d65c0aa626c6f636b5f73697a65c0af6164646974696f6e616c5f73616c74c0a96c6f72615f6e616d65c0a974656e616e745f6964a764656661756c74aa6261636b656e645f6964ad6d6f6f6e63616b652d74657374a867726f75705f6964c0a66d656469756da3637075a764705f72616e6bc0aa6f626a6563745f6b6579b2307846464646464646464646464646464645aa7365715f68617368657391cffffffffffffffffeac626c6f636b5f68617368657391feae626173655f626c6f636b5f69647800ab706172656e745f68617368c0a9746f6b656e5f696473c0b1706172656e745f626c6f636b5f68617368c0de0011a86576656e745f696402a974696d657374616d70cf0000019af232b27baa6576656e745f74797065a772656d6f766564a474797065ac426c6f636b52656d6f766564aa6d6f64656c5f6e616d65c0aa626c6f636b5f73697a65c0af6164646974696f6e616c5f73616c74c0a96c6f72615f6e616d65c0a974656e616e745f6964a764656661756c74aa6261636b656e645f6964ad6d6f6f6e63616b652d74657374a867726f75705f6964c0a66d656469756da46469736ba764705f72616e6bc0aa6f626a6563745f6b6579a53132333435aa7365715f68617368657391cd3039ac626c6f636b5f68617368657391cd3039ae626173655f626c6f636b5f696478c000";

// Without the legacy names, with a key that names no hash: 17 keys,
// `seq_hashes` empty, `object_key` kept.
const NO_LEGACY: &str = "93cf0000019af232b27b91de0011a86576656e745f696407a974696d657374616d70cf0000019af232b27baa6576656e745f74797065a673746f726564aa6d6f64656c5f6e616d65c0aa626c6f636b5f73697a65c0af6164646974696f6e616c5f73616c74c0a96c6f72615f6e616d65c0a974656e616e745f6964a764656661756c74aa6261636b656e645f6964a162a867726f75705f6964c0a66d656469756da3637075a764705f72616e6bc0aa6f626a6563745f6b6579aa6e6f742d612d68617368aa7365715f68617368657390ae626173655f626c6f636b5f69647800ab706172656e745f68617368c0a9746f6b656e5f696473c000";

const TS: u64 = 1_765_000_000_123;

#[test]
fn batches_encode_as_the_reference_does() {
    let stored = pending(Kind::Stored, "0xFFFFFFFFFFFFFFFE", Medium::Cpu);
    let removed = pending(Kind::Removed, "12345", Medium::Disk);
    let events = [
        Numbered {
            event: &stored,
            id: 1,
            hash: seq_hash(&stored.key),
        },
        Numbered {
            event: &removed,
            id: 2,
            hash: seq_hash(&removed.key),
        },
    ];
    let f = format("mooncake-test", true, true);
    assert_eq!(hex(&encode::batch(&f, TS, &events)), BOTH);

    let odd = pending(Kind::Stored, "not-a-hash", Medium::Cpu);
    let events = [Numbered {
        event: &odd,
        id: 7,
        hash: None,
    }];
    assert_eq!(
        hex(&encode::batch(&format("b", false, true), TS, &events)),
        NO_LEGACY
    );
}

/// Reads one message: its frames.
fn recv(sub: &zmq::Socket) -> Vec<Vec<u8>> {
    sub.recv_multipart(0).expect("a message")
}

fn subscriber(endpoint: &str) -> (zmq::Context, zmq::Socket) {
    let ctx = zmq::Context::new();
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_rcvtimeo(5_000).unwrap();
    sub.connect(endpoint).unwrap();
    sub.set_subscribe(b"").unwrap();
    (ctx, sub)
}

/// Waits until a PUB/SUB pair is connected: probes until one arrives.
fn await_joined(p: &Publisher, sub: &zmq::Socket) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    sub.set_rcvtimeo(50).unwrap();
    loop {
        p.publish(Kind::Stored, "1", Medium::Cpu);
        if let Ok(frames) = sub.recv_multipart(0) {
            sub.set_rcvtimeo(5_000).unwrap();
            return u64::from_be_bytes(frames[1].as_slice().try_into().unwrap());
        }
        assert!(Instant::now() < deadline, "subscriber never joined");
    }
}

fn ipc(dir: &tempfile::TempDir) -> String {
    format!("ipc://{}/events", dir.path().display())
}

// The reference's `PublishesSglangObjectKeyOverZmq`: three frames, the
// sequence number big-endian, and the event's fields.
#[test]
fn publishes_three_frames_with_a_growing_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = ipc(&dir);
    let p = Publisher::bind(Config {
        bind_endpoint: endpoint.clone(),
        format: format("mooncake-test", true, true),
        queue_capacity: 64,
        replay_endpoint: None,
        replay_buffer: 0,
    })
    .unwrap();
    let (_ctx, sub) = subscriber(&endpoint);
    let first = await_joined(&p, &sub);
    let key = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855_0_k";
    p.publish(Kind::Stored, key, Medium::Cpu);
    let frames = recv(&sub);
    assert_eq!(frames.len(), 3);
    assert!(frames[0].is_empty());
    assert_eq!(frames[1], (first + 1).to_be_bytes());
    let payload = &frames[2];
    // [ts, [map], 0]: the map names the key and leaves seq_hashes empty.
    let needle = |s: &[u8]| payload.windows(s.len()).any(|w| w == s);
    assert!(needle(key.as_bytes()) && needle(b"stored") && needle(b"mooncake-test"));
    assert!(needle(b"seq_hashes\x90"));
    assert_eq!(payload[payload.len() - 1], 0);

    let deadline = Instant::now() + Duration::from_secs(5);
    while p.stats().published_batches < first + 1 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = p.stats();
    assert_eq!(s.published_batches, s.published_events);
    assert_eq!(s.dropped_events, 0);
    assert_eq!(s.skipped_unparsed_keys, 1);
}

// A key that names no hash is skipped without `object_key`, and takes no
// event id.
#[test]
fn unparsed_keys_are_skipped_without_object_key() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = ipc(&dir);
    let p = Publisher::bind(Config {
        bind_endpoint: endpoint.clone(),
        format: format("b", true, false),
        queue_capacity: 0,
        replay_endpoint: None,
        replay_buffer: 0,
    })
    .unwrap();
    let (_ctx, sub) = subscriber(&endpoint);
    let first = await_joined(&p, &sub);
    p.publish(Kind::Stored, "k", Medium::Cpu);
    p.publish(Kind::Removed, "0x10", Medium::Cpu);
    let frames = recv(&sub);
    let seq = u64::from_be_bytes(frames[1].as_slice().try_into().unwrap());
    assert_eq!(seq, first + 1);
    let payload = &frames[2];
    // [ts (a u64: 9 bytes), [one map], 0]
    assert_eq!(payload[..2], [0x93, 0xcf]);
    assert_eq!(payload[10], 0x91);
    assert!(!payload.windows(10).any(|w| w == b"object_key"));
    assert!(payload.windows(7).any(|w| w == b"removed"));
    assert_eq!(p.stats().skipped_unparsed_keys, 1);
}

// The reference's `DropsOldestWhenQueueFull`, plus the gap it leaves: the
// next batch's sequence number skips one per dropped event.
#[test]
fn a_full_queue_drops_its_oldest_and_skips_sequence_numbers() {
    let inner = Inner::new();
    for i in 0..100 {
        inner.push(2, pending(Kind::Stored, &i.to_string(), Medium::Cpu));
    }
    let keys: Vec<String> = inner.queue.lock().iter().map(|e| e.key.clone()).collect();
    assert_eq!(keys, ["98", "99"]);
    assert_eq!(inner.dropped_events.load(Ordering::Relaxed), 98);
    assert_eq!(inner.next_seq.load(Ordering::Relaxed), 99);
    // Unbounded: nothing dropped.
    let inner = Inner::new();
    for i in 0..1000 {
        inner.push(0, pending(Kind::Removed, &i.to_string(), Medium::Disk));
    }
    assert_eq!(inner.queue.lock().len(), 1000);
    assert_eq!(inner.dropped_events.load(Ordering::Relaxed), 0);
}

#[test]
fn an_endpoint_in_use_is_an_error() {
    let ctx = zmq::Context::new();
    // A free port, then held.
    let holder = ctx.socket(zmq::PUB).unwrap();
    holder.bind("tcp://127.0.0.1:*").unwrap();
    let taken = holder.get_last_endpoint().unwrap().unwrap();
    let config = |bind_endpoint: String| Config {
        bind_endpoint,
        format: format("b", true, true),
        queue_capacity: 0,
        replay_endpoint: None,
        replay_buffer: 0,
    };
    let e = Publisher::bind(config(taken)).unwrap_err();
    assert!(e.to_string().contains("cannot bind"), "{e}");
    assert!(Publisher::bind(config("nonsense://x".into())).is_err());
}

/// Asks `endpoint` for the batches from `start` on: their (seq, payload),
/// and whether the end marker came.
fn ask_replay(ctx: &zmq::Context, endpoint: &str, start: u64) -> (Vec<(u64, Vec<u8>)>, bool) {
    let dealer = ctx.socket(zmq::DEALER).unwrap();
    dealer.set_rcvtimeo(5_000).unwrap();
    dealer.set_linger(0).unwrap();
    dealer.connect(endpoint).unwrap();
    dealer
        .send_multipart([&b""[..], &start.to_be_bytes()[..]], 0)
        .unwrap();
    let mut got = Vec::new();
    loop {
        let Ok(f) = dealer.recv_multipart(0) else {
            return (got, false);
        };
        assert_eq!(f.len(), 3, "[\"\", seq, payload]");
        assert!(f[0].is_empty());
        if f[1] == replay::END {
            assert!(f[2].is_empty());
            return (got, true);
        }
        got.push((
            u64::from_be_bytes(f[1].as_slice().try_into().unwrap()),
            f[2].clone(),
        ));
    }
}

// vLLM's replay protocol: a consumer that missed batches asks for them from
// a sequence number on and gets exactly what the PUB socket sent, then the
// end marker; batches older than the buffer are gone.
#[test]
fn the_replay_endpoint_resends_what_was_published() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = ipc(&dir);
    let replay_ep = format!("ipc://{}/replay", dir.path().display());
    let p = Publisher::bind(Config {
        bind_endpoint: endpoint.clone(),
        format: format("b", true, true),
        queue_capacity: 0,
        replay_endpoint: Some(replay_ep.clone()),
        replay_buffer: 4,
    })
    .unwrap();
    let (ctx, sub) = subscriber(&endpoint);
    let first = await_joined(&p, &sub);
    let mut live = Vec::new();
    for i in 0..6u64 {
        p.publish(Kind::Stored, &format!("{:x}", 0x100 + i), Medium::Cpu);
        let f = recv(&sub);
        live.push((
            u64::from_be_bytes(f[1].as_slice().try_into().unwrap()),
            f[2].clone(),
        ));
    }
    assert_eq!(live.last().unwrap().0, first + 6);
    // The last four batches are kept, byte for byte as published.
    let (got, ended) = ask_replay(&ctx, &replay_ep, first + 1);
    assert!(ended);
    assert_eq!(got, live[2..]);
    let (got, ended) = ask_replay(&ctx, &replay_ep, first + 5);
    assert!(ended);
    assert_eq!(got, live[4..]);
    // Nothing newer than the last: just the end marker.
    assert_eq!(ask_replay(&ctx, &replay_ep, first + 7), (vec![], true));
    // A malformed request is ignored, and the endpoint keeps serving.
    let bad = ctx.socket(zmq::DEALER).unwrap();
    bad.set_linger(0).unwrap();
    bad.connect(&replay_ep).unwrap();
    bad.send_multipart([&b""[..], &b"short"[..]], 0).unwrap();
    assert_eq!(ask_replay(&ctx, &replay_ep, first + 6).0, live[5..]);
    assert_eq!(p.replay_requests(), 4);
}

#[test]
fn a_replay_endpoint_in_use_is_an_error() {
    let ctx = zmq::Context::new();
    let holder = ctx.socket(zmq::ROUTER).unwrap();
    holder.bind("tcp://127.0.0.1:*").unwrap();
    let taken = holder.get_last_endpoint().unwrap().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let e = Publisher::bind(Config {
        bind_endpoint: ipc(&dir),
        format: format("b", true, true),
        queue_capacity: 0,
        replay_endpoint: Some(taken),
        replay_buffer: 10,
    })
    .unwrap_err();
    assert!(e.to_string().contains("replay endpoint"), "{e}");
}

// A new leader numbers on from a wall-clock base, never back.
#[test]
fn a_leader_numbers_on_from_its_base() {
    let p = Publisher::unsent();
    assert_eq!(p.inner.next_seq.load(Ordering::Relaxed), 1);
    p.lead(1_765_000_000_000);
    assert_eq!(
        p.inner.next_seq.load(Ordering::Relaxed),
        1_765_000_000_000_000
    );
    // An earlier clock (a second election in the same process, a clock
    // stepped back) never moves the numbers back.
    p.inner.next_seq.fetch_add(5, Ordering::Relaxed);
    p.lead(1_764_000_000_000);
    assert_eq!(
        p.inner.next_seq.load(Ordering::Relaxed),
        1_765_000_000_000_005
    );
    p.lead(u64::MAX);
    assert_eq!(p.inner.next_seq.load(Ordering::Relaxed), u64::MAX);
}
