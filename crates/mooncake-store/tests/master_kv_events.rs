//! The master's KV events seen by a ZMQ subscriber, as a router would see
//! them: a put's end is `stored`, a remove `removed`; a put of an existing
//! key, a batch remove and remove_all publish nothing (as the reference).
//! Each payload is compared byte for byte with the encoder's output, whose
//! format `master::events` tests against golden bytes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use mooncake_store::master::events::encode::{self, seq_hash, Numbered};
use mooncake_store::master::events::{Format, Kind, Medium, Pending};
use mooncake_store::master::{MasterConfig, MasterHandle};
use mooncake_store::types::{SegmentInfo, WriteOptions};
use mooncake_store::MasterClient;
use test_support::ports::MASTER_ANY_PORTS;

const BACKEND: &str = "pool-a";

struct Sub {
    _ctx: zmq::Context,
    socket: zmq::Socket,
    /// The last sequence number seen.
    seq: u64,
    /// The id the next event gets.
    next_id: u64,
}

impl Sub {
    /// The next message: its sequence number (one more than the last) and
    /// the events it carries, checked against the encoder byte for byte.
    fn expect(&mut self, events: &[(Kind, &str, Medium)]) {
        let frames = self.socket.recv_multipart(0).expect("an event batch");
        assert_eq!(frames.len(), 3);
        assert!(frames[0].is_empty(), "empty topic");
        let seq = u64::from_be_bytes(frames[1].as_slice().try_into().unwrap());
        assert_eq!(seq, self.seq + 1, "one sequence number per batch");
        self.seq = seq;
        let payload = &frames[2];
        // [timestamp as a msgpack u64, ...]
        assert_eq!(payload[..2], [0x93, 0xcf]);
        let ts = u64::from_be_bytes(payload[2..10].try_into().unwrap());
        let pending: Vec<Pending> = events
            .iter()
            .map(|&(kind, key, medium)| Pending {
                kind,
                key: key.into(),
                medium,
            })
            .collect();
        let numbered: Vec<Numbered<'_>> = pending
            .iter()
            .map(|p| {
                self.next_id += 1;
                Numbered {
                    event: p,
                    id: self.next_id - 1,
                    hash: seq_hash(&p.key),
                }
            })
            .collect();
        let format = Format {
            backend_id: BACKEND.into(),
            legacy: true,
            object_key: true,
        };
        assert_eq!(*payload, encode::batch(&format, ts, &numbered));
    }

    fn expect_nothing(&self) {
        self.socket.set_rcvtimeo(300).unwrap();
        assert!(self.socket.recv_multipart(0).is_err(), "no event expected");
        self.socket.set_rcvtimeo(5_000).unwrap();
    }
}

fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

#[test]
fn a_subscriber_sees_puts_and_removes() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("ipc://{}/kv-events", dir.path().display());
    let config = MasterConfig::from_settings(MASTER_ANY_PORTS.into_iter().chain([
        ("rpc_address", "127.0.0.1"),
        ("metrics_host", "127.0.0.1"),
        ("enable_kv_events", "true"),
        ("kv_events_bind_endpoint", endpoint.as_str()),
        ("kv_events_backend_id", BACKEND),
    ]))
    .unwrap();
    let master = MasterHandle::spawn(config).unwrap();
    let client = MasterClient::connect(&master.rpc_addr().to_string()).unwrap();
    let id = 7u128;
    client
        .mount_segment(
            id,
            &SegmentInfo {
                name: "events:1".into(),
                base: 1 << 32,
                size: 1 << 30,
                transport_endpoint: "events:1".into(),
            },
        )
        .unwrap();
    let opts = WriteOptions::default();
    let put = |key: &str| {
        client.put_start(id, key, 1024, &opts)?;
        client.put_end(id, key)
    };

    // A SUB socket misses what was sent before it joined: put probe keys
    // until one arrives, then let the rest drain.
    let ctx = zmq::Context::new();
    let socket = ctx.socket(zmq::SUB).unwrap();
    socket.connect(&endpoint).unwrap();
    socket.set_subscribe(b"").unwrap();
    socket.set_rcvtimeo(50).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut probes = 0u64;
    let mut seq = loop {
        put(&format!("{}", 1_000_000 + probes)).unwrap();
        probes += 1;
        if let Ok(frames) = socket.recv_multipart(0) {
            break u64::from_be_bytes(frames[1].as_slice().try_into().unwrap());
        }
        assert!(Instant::now() < deadline, "the subscriber never joined");
    };
    socket.set_rcvtimeo(300).unwrap();
    while let Ok(frames) = socket.recv_multipart(0) {
        seq = u64::from_be_bytes(frames[1].as_slice().try_into().unwrap());
    }
    socket.set_rcvtimeo(5_000).unwrap();
    let mut sub = Sub {
        _ctx: ctx,
        socket,
        seq,
        next_id: probes + 1,
    };

    put("12345").unwrap();
    sub.expect(&[(Kind::Stored, "12345", Medium::Cpu)]);
    put("0xABC").unwrap();
    sub.expect(&[(Kind::Stored, "0xABC", Medium::Cpu)]);
    // A key that names no hash still goes out, by its object_key.
    put("prefix_0_k").unwrap();
    sub.expect(&[(Kind::Stored, "prefix_0_k", Medium::Cpu)]);

    // A put of an existing key fails: nothing.
    let again = put("12345").unwrap_err();
    assert_eq!(again.code, ErrorCode::OBJECT_ALREADY_EXISTS, "{again}");
    sub.expect_nothing();

    // An upsert's end is stored again.
    let upsert = WriteOptions {
        upsert: true,
        ..WriteOptions::default()
    };
    client.put_start(id, "12345", 1024, &upsert).unwrap();
    client.put_end(id, "12345").unwrap();
    sub.expect(&[(Kind::Stored, "12345", Medium::Cpu)]);

    client.remove("12345", false).unwrap();
    sub.expect(&[(Kind::Removed, "12345", Medium::Cpu)]);

    // Batch remove and remove_all: nothing, as in the reference.
    let removed = client.batch_remove(&["0xABC".to_string()], false).unwrap();
    assert!(removed[0].is_ok());
    sub.expect_nothing();
    assert!(client.remove_all(false).unwrap() > 0);
    sub.expect_nothing();

    let status = http_get(&master.http_addr().to_string(), "/kv_events/status");
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["enabled"], true);
    assert_eq!(v["published_batches"], sub.seq);
    assert_eq!(v["published_events"], sub.next_id - 1);
    assert_eq!(v["dropped_events"], 0);
    assert_eq!(v["skipped_unparsed_keys"], 1);
    master.stop().unwrap();
}

#[test]
fn kv_events_need_an_endpoint_and_a_backend_id() {
    for (flag, missing) in [
        ("kv_events_backend_id", "kv_events_bind_endpoint"),
        ("kv_events_bind_endpoint", "kv_events_backend_id"),
    ] {
        let e = MasterConfig::from_settings(
            MASTER_ANY_PORTS
                .into_iter()
                .chain([("enable_kv_events", "true"), (flag, "x")]),
        )
        .unwrap_err();
        assert!(e.to_string().contains(missing), "{e}");
    }
}

#[test]
fn an_endpoint_in_use_stops_the_master() {
    let ctx = zmq::Context::new();
    // A free port, then held (an ipc path could be taken over).
    let holder = ctx.socket(zmq::PUB).unwrap();
    holder.bind("tcp://127.0.0.1:*").unwrap();
    let taken = holder.get_last_endpoint().unwrap().unwrap();
    let config = MasterConfig::from_settings(MASTER_ANY_PORTS.into_iter().chain([
        ("enable_kv_events", "true"),
        ("kv_events_bind_endpoint", taken.as_str()),
        ("kv_events_backend_id", BACKEND),
    ]))
    .unwrap();
    let e = MasterHandle::spawn(config).err().expect("refused");
    assert!(e.to_string().contains("cannot bind"), "{e}");
}
