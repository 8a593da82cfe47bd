//! Store client metrics over HTTP: a `mooncake_client` run with
//! `--enable_http_server` counts what it serves for a dummy client, and an
//! embedded client's own server counts its operations, bytes, routes and
//! master RPCs, after a known workload.

use std::io::{Read, Write};
use std::net::TcpStream;

use mooncake_store::client::Client;
use mooncake_store::types::ReplicaPolicy;

mod common;
use common::*;

fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

/// The value of the sample `name{labels}` (exact).
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
}

#[test]
fn mooncake_client_serves_metrics_and_health() {
    let cluster = Cluster::start(&[]);
    let http_port = free_port();
    let args = vec![
        format!("--master_server_address={}", cluster.master_addr),
        format!("--metadata_server={}", cluster.metadata),
        "--host=127.0.0.1".into(),
        "--port=0".into(),
        "--global_segment_size=32MB".into(),
        "--enable_http_server".into(),
        format!("--http_port={http_port}"),
    ];
    let (_node, line) = spawn_until_line(&STORAGE, &args, "mooncake_client ready");
    let dummy_addr = ready_dummy_addr(&line);
    wait_port(http_port);
    let addr = format!("127.0.0.1:{http_port}");
    assert_eq!(
        http_get(&addr, "/health"),
        (200, r#"{"status":"healthy","code":0}"#.into())
    );

    let dummy = Client::setup_dummy(16 << 20, 16 << 20, &dummy_addr).unwrap();
    let cfg = ReplicaPolicy::default();
    for i in 0..5 {
        dummy
            .put(&format!("d{i}"), &value("d", 1000), &cfg)
            .unwrap();
    }
    for i in 0..6 {
        let _ = dummy.get(&format!("d{i}"));
    }
    let (status, text) = http_get(&addr, "/metrics");
    assert_eq!(status, 200);
    let real = |name: &str, op: &str| {
        sample(
            &text,
            &format!("{name}{{client_mode=\"real\",op_name=\"{op}\"}}"),
        )
    };
    // The real client wrote and read on the dummy's behalf, from and into
    // the memory they share.
    assert_eq!(
        real("mooncake_transfer_write_operation_count", "put_from"),
        5.0
    );
    assert_eq!(
        real("mooncake_transfer_read_operation_count", "get_into"),
        5.0
    );
    assert_eq!(
        real("mooncake_transfer_write_operation_bytes", "put_from"),
        5000.0
    );
    assert_eq!(
        sample(&text, "mooncake_transfer_write_bytes{client_mode=\"real\"}"),
        5000.0
    );
    assert!(text.contains("# TYPE mooncake_transfer_read_bytes counter"));
    assert!(
        text.contains("mooncake_client_rpc_count{client_mode=\"real\",rpc_name=\"PutStart\"} 5")
    );
    assert!(
        text.contains("mooncake_transfer_put_latency_count 5"),
        "{text}"
    );

    // The dummy's own metrics count its calls, the missing key as an error.
    let own = dummy.metrics().unwrap().render();
    let dummy_op = |name: &str, op: &str| {
        sample(
            &own,
            &format!("{name}{{client_mode=\"dummy\",op_name=\"{op}\"}}"),
        )
    };
    assert_eq!(
        dummy_op("mooncake_transfer_write_operation_count", "put"),
        5.0
    );
    assert_eq!(
        dummy_op("mooncake_transfer_read_operation_count", "get"),
        5.0
    );
    assert_eq!(
        dummy_op("mooncake_transfer_read_operation_bytes", "get"),
        5000.0
    );
    assert_eq!(
        dummy_op("mooncake_transfer_operation_errors_total", "get"),
        1.0
    );
    dummy.close().unwrap();
}

#[test]
fn an_embedded_client_counts_routes_and_rpcs() {
    let cluster = Cluster::start(&[]);
    let _node = cluster.storage("32MB");
    // A client with its own segment: a value lands on it (memcpy) or on
    // the node (engine), and reads come back the same way.
    let client = Client::setup(&cluster.config(16 << 20, 16 << 20)).unwrap();
    let server = client.start_http_server("127.0.0.1", 0).unwrap();
    let addr = server.addr().to_string();
    let cfg = ReplicaPolicy {
        replica_num: 2,
        ..Default::default()
    };
    for i in 0..4 {
        client
            .put(&format!("e{i}"), &value("e", 4096), &cfg)
            .unwrap();
    }
    let keys: Vec<String> = (0..4).map(|i| format!("e{i}")).collect();
    for r in client.get_batch(&keys) {
        assert_eq!(r.unwrap().len(), 4096);
    }
    let (_, text) = http_get(&addr, "/metrics");
    let route = |r: &str, d: &str| {
        let name = format!(
            "mooncake_transfer_route_bytes{{client_mode=\"real\",route=\"{r}\",direction=\"{d}\"}}"
        );
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name.as_str())?
                    .strip_prefix(' ')?
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    // Two replicas of four 4 KiB values: 32 KiB written over some route.
    let written: f64 = ["local", "shm", "engine"]
        .iter()
        .map(|r| route(r, "write"))
        .sum();
    assert_eq!(written, 8.0 * 4096.0, "{text}");
    let read: f64 = ["local", "shm", "engine"]
        .iter()
        .map(|r| route(r, "read"))
        .sum();
    assert_eq!(read, 4.0 * 4096.0, "{text}");
    assert_eq!(
        sample(
            &text,
            "mooncake_transfer_read_operation_count{client_mode=\"real\",op_name=\"get_batch\"}"
        ),
        1.0
    );
    assert!(text.contains("mooncake_transfer_batch_get_latency_count 1"));
    assert!(
        text.contains("rpc_name=\"BatchGetReplicaList\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("mooncake_transfer_engine_requests{client_mode=\"real\",transport=\"tcp\"}")
    );
    let summary = client.metrics().unwrap().summary(true);
    assert!(
        summary.contains("=== Transfer Metrics Summary ==="),
        "{summary}"
    );
    assert!(
        summary.contains("get_batch: count=1, bytes=16.00 KiB"),
        "{summary}"
    );
    drop(server);
    client.close().unwrap();
}
