//! The real `mooncake_master` process driven through `MasterClient`, raw
//! sockets (malformed frames) and its HTTP services; stops on SIGTERM.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use mooncake_store::proto::frame::{decode_payload, encode_frame, read_frame};
use mooncake_store::proto::{Request, Response};
use mooncake_store::types::{SegmentInfo, WriteOptions};
use mooncake_store::MasterClient;
use test_support::ports::MasterPorts;

static BIN: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| mooncake_system_tests::program("mooncake_master"));
const TIMEOUT: Duration = Duration::from_secs(30);

/// Kills the master (by pid) if a test fails before stopping it.
struct Master {
    child: Child,
    addrs: HashMap<String, String>,
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Master {
    /// Starts the binary on free ports and waits (bounded) for its `listening on` line.
    fn start(extra: &[&str]) -> Master {
        let mut child = Command::new(&*BIN)
            .args(MasterPorts::ANY.args())
            .args(["--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut master = Master {
            child,
            addrs: HashMap::new(),
        };
        let line = rx.recv_timeout(TIMEOUT).expect("no 'listening on' line");
        assert!(line.contains("listening on"), "{line:?}");
        for part in line.split_whitespace() {
            if let Some((k, v)) = part.split_once('=') {
                master.addrs.insert(k.to_string(), v.to_string());
            }
        }
        master
    }

    fn addr(&self, which: &str) -> &str {
        &self.addrs[which]
    }

    fn client(&self) -> MasterClient {
        MasterClient::connect_with_timeouts(self.addr("rpc"), TIMEOUT, TIMEOUT).unwrap()
    }

    fn terminate(&mut self) -> ExitStatus {
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) },
            0
        );
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "master did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A minimal HTTP/1.1 request; returns (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        unchunk(body)
    } else {
        body.into()
    };
    (status, body)
}

fn unchunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (len, rest) = s.split_once("\r\n").unwrap();
        let n = usize::from_str_radix(len.trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}

fn segment(name: &str, size: u64) -> SegmentInfo {
    SegmentInfo {
        name: name.into(),
        base: 0x7f00_0000_0000,
        size,
        transport_endpoint: format!("{name}:1"),
    }
}

/// Sends raw bytes on a fresh connection and reads one answer frame, if any.
fn raw_exchange(addr: &str, bytes: &[u8]) -> Option<Response> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.write_all(bytes).unwrap();
    let mut buf = Vec::new();
    read_frame(&mut s, &mut buf).ok()?;
    Some(decode_payload(&buf).unwrap())
}

fn failed_code(resp: Option<Response>) -> ErrorCode {
    match resp {
        Some(Response::Failed { error }) => error.code,
        other => panic!("expected an error answer, got {other:?}"),
    }
}

#[test]
fn serves_clients_and_survives_malformed_frames() {
    let mut master = Master::start(&["--client_ttl=5"]);
    let rpc = master.addr("rpc").to_string();
    let c = master.client();
    let me = 0xabcd_u128;

    assert_eq!(
        c.put_start(me, "k", 10, &WriteOptions::default())
            .unwrap_err()
            .code,
        ErrorCode::SEGMENT_NOT_FOUND
    );
    c.mount_segment(me, &segment("seg-a", 1 << 20)).unwrap();
    c.ping(me).unwrap();
    let replicas = c
        .put_start(me, "k", 4096, &WriteOptions::default())
        .unwrap();
    assert_eq!(replicas.len(), 1);
    assert_eq!(
        c.get_replica_list("k").unwrap_err().code,
        ErrorCode::REPLICA_IS_NOT_READY
    );
    c.put_end(me, "k").unwrap();
    let got = c.get_replica_list("k").unwrap();
    assert_eq!(
        got.replicas[0].memory().unwrap().buffer_address,
        replicas[0].memory().unwrap().buffer_address
    );
    assert_eq!(got.lease_ttl_ms, 10_000, "the reference's default lease");
    assert!(c.exist_key("k").unwrap());
    assert_eq!(c.get_size("k").unwrap(), 4096);
    assert_eq!(
        c.remove("k", false).unwrap_err().code,
        ErrorCode::OBJECT_HAS_LEASE
    );

    // Batches: one round trip, per-key answers.
    let keys: Vec<String> = (0..20).map(|i| format!("b{i}")).collect();
    let lens = vec![100u64; 20];
    let starts = c
        .batch_put_start(me, &keys, &lens, &WriteOptions::default())
        .unwrap();
    assert!(starts.iter().all(|r| r.is_ok()));
    assert!(c
        .batch_put_end(me, &keys)
        .unwrap()
        .iter()
        .all(|r| r.is_ok()));
    assert!(c
        .batch_exist_key(&keys)
        .unwrap()
        .iter()
        .all(|r| *r.as_ref().unwrap()));
    assert_eq!(
        c.batch_put_start(me, &keys, &lens[..3], &WriteOptions::default())
            .unwrap_err()
            .code,
        ErrorCode::INVALID_PARAMS
    );
    // A check leases nothing (unlike the reference); a read does.
    assert!(c
        .batch_get_replica_list(&keys)
        .unwrap()
        .iter()
        .all(|r| r.is_ok()));
    assert_eq!(c.remove_by_regex("^b1", true).unwrap(), 11);
    assert_eq!(c.remove_all(false).unwrap(), 0, "every object is leased");
    assert_eq!(c.remove_by_regex("^b", true).unwrap(), 9);

    // Malformed frames: an absurd length is answered, then the connection closes.
    assert_eq!(
        failed_code(raw_exchange(&rpc, &u32::MAX.to_le_bytes())),
        ErrorCode::DESERIALIZE_FAIL
    );
    assert_eq!(
        failed_code(raw_exchange(&rpc, &0u32.to_le_bytes())),
        ErrorCode::DESERIALIZE_FAIL
    );
    // A well-framed but undecodable payload is answered and the connection goes on.
    {
        let mut s = TcpStream::connect(&rpc).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        let mut garbage = 5u32.to_le_bytes().to_vec();
        garbage.extend_from_slice(&[mooncake_store::proto::PROTOCOL_VERSION, 200, 1, 2, 3]);
        s.write_all(&garbage).unwrap();
        let mut buf = Vec::new();
        read_frame(&mut s, &mut buf).unwrap();
        assert!(
            matches!(decode_payload::<Response>(&buf).unwrap(), Response::Failed { error } if error.code == ErrorCode::DESERIALIZE_FAIL)
        );
        // Wrong protocol version.
        let mut frame = Vec::new();
        encode_frame(&Request::ExistKey { key: "k" }, &mut frame).unwrap();
        frame[4] = 99;
        s.write_all(&frame).unwrap();
        read_frame(&mut s, &mut buf).unwrap();
        assert!(
            matches!(decode_payload::<Response>(&buf).unwrap(), Response::Failed { error } if error.code == ErrorCode::INVALID_VERSION)
        );
        // Then a good request on the same connection.
        frame.clear();
        encode_frame(&Request::ExistKey { key: "k" }, &mut frame).unwrap();
        s.write_all(&frame).unwrap();
        read_frame(&mut s, &mut buf).unwrap();
        assert_eq!(
            decode_payload::<Response>(&buf).unwrap(),
            Response::Bool { result: Ok(true) }
        );
    }
    // A truncated frame, then the peer goes away.
    {
        let mut s = TcpStream::connect(&rpc).unwrap();
        s.write_all(&[100, 0, 0, 0, 1, 4]).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        let _ = s.read_to_end(&mut rest);
    }
    // The master still serves, on the old pooled connections and new ones.
    assert!(c.exist_key("k").unwrap());
    assert!(master.client().exist_key("k").unwrap());

    // HTTP service (a heartbeat first, so the client outlives these checks).
    c.ping(me).unwrap();
    let http_addr = master.addr("http").to_string();
    let (status, body) = http(&http_addr, "GET", "/health", "");
    assert_eq!(status, 200);
    assert!(body.contains(r#""status":"ok""#), "{body}");
    let (status, metrics) = http(&http_addr, "GET", "/metrics", "");
    assert_eq!(status, 200);
    for name in [
        "master_key_count 1",
        "master_total_capacity_bytes 1048576",
        "master_active_clients 1",
        "master_put_start_requests_total",
        "master_batch_put_start_items_total 20",
        "master_malformed_requests_total 4",
        "master_value_size_bytes_bucket",
        "segment_allocated_bytes{segment=\"seg-a\"} 4096",
    ] {
        assert!(metrics.contains(name), "missing {name} in\n{metrics}");
    }
    let (status, body) = http(&http_addr, "GET", "/query_key?key=k", "");
    assert_eq!(status, 200);
    assert!(body.contains(r#""size_":4096"#), "{body}");
    let (status, body) = http(&http_addr, "GET", "/query_key?key=nope", "");
    assert_eq!(
        (status, body.as_str()),
        (
            404,
            r#"{"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}"#
        )
    );
    let (status, body) = http(&http_addr, "GET", "/batch_query_keys?keys=k,nope", "");
    assert_eq!(status, 200);
    assert!(
        body.contains(r#""nope":{"ok":false,"error":"OBJECT_NOT_FOUND""#),
        "{body}"
    );
    assert_eq!(http(&http_addr, "GET", "/batch_query_keys", "").0, 400);
    assert_eq!(
        http(&http_addr, "GET", "/get_all_keys", ""),
        (200, "k\n".into())
    );
    assert_eq!(
        http(&http_addr, "GET", "/get_all_segments", ""),
        (200, "seg-a\n".into())
    );
    assert_eq!(
        http(&http_addr, "GET", "/query_segment?segment=seg-a", ""),
        (
            200,
            "seg-a\nUsed(bytes): 4096\nCapacity(bytes) : 1048576\n".into()
        )
    );
    assert_eq!(
        http(&http_addr, "GET", "/query_segment?segment=x", "").0,
        500
    );
    let (status, body) = http(&http_addr, "GET", "/get_segments_detail", "");
    assert_eq!(status, 200);
    let detail: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(detail["total_segments"], 1, "{body}");
    let seg = &detail["segments"][0];
    for (field, want) in [
        ("segment_name", serde_json::json!("seg-a")),
        ("size_bytes", serde_json::json!(1 << 20)),
        ("size_human", serde_json::json!("0.0009765625 GiB")),
        ("status", serde_json::json!("OK")),
        ("protocol", serde_json::json!("tcp")),
        ("allocator_used_bytes", serde_json::json!(4096)),
        ("allocator_capacity_bytes", serde_json::json!(1 << 20)),
        ("allocator_usage_percent", serde_json::json!(0.390625)),
    ] {
        assert_eq!(seg[field], want, "{field} in {body}");
    }
    for field in ["segment_id", "client_id", "base_address", "te_endpoint"] {
        assert!(seg[field].is_string(), "{field} in {body}");
    }
    assert_eq!(http(&http_addr, "POST", "/health", "").0, 404);
    assert_eq!(http(&http_addr, "GET", "/nope", "").0, 404);
    let (_, summary) = http(&http_addr, "GET", "/metrics/summary", "");
    assert!(summary.contains("Keys: 1"), "{summary}");

    // A silent client is dropped after client_ttl, with its segment.
    let deadline = Instant::now() + TIMEOUT;
    while c.exist_key("k").unwrap() {
        assert!(Instant::now() < deadline, "client never expired");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        c.put_start(me, "k2", 10, &WriteOptions::default())
            .unwrap_err()
            .code,
        ErrorCode::SEGMENT_NOT_FOUND
    );
    assert_eq!(c.ping(me).unwrap_err().code, ErrorCode::CLIENT_NOT_FOUND);

    assert!(master.terminate().success());
}

#[test]
fn embedded_metadata_server_and_config_file() {
    let dir = std::env::temp_dir().join(format!("mc-master-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("master.yaml");
    std::fs::write(&cfg, "enable_http_metadata_server: true\nhttp_metadata_server_port: 0\nhttp_metadata_server_host: 127.0.0.1\ndefault_kv_lease_ttl: 2s\n").unwrap();
    let mut master = Master::start(&[&format!("--config_path={}", cfg.display())]);
    let meta = master.addr("metadata").to_string();
    assert_eq!(
        http(&meta, "GET", "/metadata?key=a", ""),
        (404, "metadata not found".into())
    );
    assert_eq!(http(&meta, "PUT", "/metadata?key=a", "{\"x\":1}").0, 200);
    assert_eq!(
        http(&meta, "GET", "/metadata?key=a", ""),
        (200, "{\"x\":1}".into())
    );

    let c = master.client();
    c.mount_segment(7, &segment("s", 1 << 16)).unwrap();
    c.put_start(7, "k", 8, &WriteOptions::default()).unwrap();
    c.put_end(7, "k").unwrap();
    assert_eq!(
        c.get_replica_list("k").unwrap().lease_ttl_ms,
        2000,
        "from the config file"
    );
    assert!(master.terminate().success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_command_lines_fail_fast() {
    for args in [
        &["--no_such_flag=1"][..],
        &["--allocation_strategy=bogus"],
        &["--config_path=/nonexistent/m.yaml"],
    ] {
        let out = Command::new(&*BIN)
            .args(MasterPorts::ANY.args())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        assert!(!out.stderr.is_empty());
    }
    let out = Command::new(&*BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--eviction_high_watermark_ratio"));
}
