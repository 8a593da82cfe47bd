//! The monitoring stack against a live cluster, with the real programs:
//! - a real Prometheus scrapes two HA masters (a leader and a standby), a
//!   `mooncake_client` storage node and a dummy client's HTTP server while a
//!   workload runs, and every expression of the Grafana dashboard in
//!   `monitoring/` returns data through Prometheus's query API;
//! - headless Chromium loads the master's status page, with and without
//!   JavaScript, and every number it shows matches `/metrics`.
//!
//! Prometheus and Chromium come from `scripts/install-deps.sh --test`.
//! Waits are bounded hang guards, never speed checks.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use mooncake_store::client::Client;
use mooncake_store::types::{ReplicaPolicy, WriteOptions};
use test_support::services;

const DASHBOARD: &str = include_str!("../../../monitoring/grafana/mooncake-store.json");

fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// `name{labels}` -> value of every sample in a text exposition.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Every `expr` of the dashboard's panels.
fn dashboard_exprs() -> Vec<String> {
    let d: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    out
}

/// A storage node with its HTTP server on `http_port`; its dummy address.
fn storage_node(master: &str, metadata: &str, http_port: u16) -> (Proc, String) {
    let args = vec![
        format!("--master_server_address={master}"),
        format!("--metadata_server={metadata}"),
        "--host=127.0.0.1".into(),
        "--port=0".into(),
        "--global_segment_size=32MB".into(),
        "--enable_http_server=true".into(),
        format!("--http_port={http_port}"),
    ];
    let (proc, line) = spawn_until_line(&STORAGE, &args, "mooncake_client ready");
    (proc, ready_dummy_addr(&line))
}

/// Puts, gets (one of them of a missing key) and exists until `stop`.
fn workload(client: Client, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let cfg = ReplicaPolicy::default();
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let key = format!("w{}", i % 64);
            let v = value(&key, 4096 + (i % 7) as usize * 1000);
            let _ = client.put(&key, &v, WriteOptions::upsert(&cfg));
            let _ = client.get(&key);
            let _ = client.get("missing");
            let _ = client.is_exist(&key);
            let keys = vec![key.clone(), "missing".to_string()];
            let _ = client.get_batch(&keys);
            i += 1;
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    })
}

fn ha_master(etcd: &str, cluster: &str, rpc: u16, http: u16) -> Proc {
    let mut args = MasterPorts {
        rpc,
        metrics: http,
        ..MasterPorts::ANY
    }
    .args();
    args.extend([
        "--enable_ha=true".to_string(),
        format!("--etcd_endpoints={etcd}"),
        format!("--cluster_id={cluster}"),
        "--rpc_address=127.0.0.1".into(),
        "--metrics_host=127.0.0.1".into(),
        "--client_ttl=2".into(),
    ]);
    Proc(
        Command::new(&*MASTER)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

#[test]
fn prometheus_answers_every_dashboard_expression() {
    let etcd = services::etcd();
    let cluster = format!("monitoring-{}", std::process::id());
    let (_meta, metadata) = metadata_server();
    let (rpc_a, http_a, rpc_b, http_b) = (free_port(), free_port(), free_port(), free_port());
    let _a = ha_master(&etcd.addr, &cluster, rpc_a, http_a);
    wait_port(http_a);
    // The standby campaigns and waits; it binds nothing while A leads.
    let _b = ha_master(&etcd.addr, &cluster, rpc_b, http_b);
    let node_http = free_port();
    let (_node, dummy_addr) = storage_node(&format!("127.0.0.1:{rpc_a}"), &metadata, node_http);
    wait_port(node_http);
    let dummy = Client::setup_dummy(16 << 20, 16 << 20, &dummy_addr).unwrap();
    let dummy_http = dummy.start_http_server("127.0.0.1", 0).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let load = workload(dummy.clone(), stop.clone());

    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
         - job_name: mooncake-master\n    static_configs:\n      - targets: ['127.0.0.1:{http_a}', '127.0.0.1:{http_b}']\n  \
         - job_name: mooncake-client\n    static_configs:\n      - targets: ['127.0.0.1:{node_http}', '{}']\n",
        dummy_http.addr()
    );
    let config_path = dir.path().join("prometheus.yml");
    std::fs::write(&config_path, config).unwrap();
    let prom_port = free_port();
    let _prometheus = Proc(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (scripts/install-deps.sh --test installs it)"),
    );
    wait_port(prom_port);
    let prom = format!("127.0.0.1:{prom_port}");
    eventually("prometheus is ready", || {
        http_get(&prom, "/-/ready").0 == 200
    });
    let query = |expr: &str| -> usize {
        let (status, body) = http_get(&prom, &format!("/api/v1/query?query={}", urlencode(expr)));
        assert_eq!(status, 200, "{expr}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["data"]["result"].as_array().map_or(0, Vec::len)
    };

    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 30, "the dashboard lost its panels");
    let mut empty: Vec<String> = exprs.clone();
    eventually("every dashboard expression returns data", || {
        empty.retain(|e| query(e) == 0);
        empty.is_empty()
    });
    // The leader and the storage client are up, the standby is not serving.
    assert_eq!(
        query(&format!("up{{instance=\"127.0.0.1:{http_a}\"}} == 1")),
        1
    );
    assert_eq!(
        query(&format!("up{{instance=\"127.0.0.1:{http_b}\"}} == 0")),
        1
    );
    assert_eq!(query("up{job=\"mooncake-client\"} == 1"), 2);
    assert_eq!(query("master_is_leader == 1"), 1);
    assert!(query("rate(master_put_start_requests_total[1m]) > 0") == 1);

    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    drop(dummy_http);
    dummy.close().unwrap();
}

/// Runs headless Chromium on `url` with `extra` flags; its stdout.
fn chromium(url: &str, extra: &[&str]) -> String {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--virtual-time-budget=5000",
        ])
        .args(extra)
        .arg(url)
        .stderr(Stdio::null())
        .output()
        .expect("chromium (scripts/install-deps.sh --test installs it)");
    assert!(out.status.success(), "chromium failed on {url}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `(data-metric, data-value)` of every live number in a DOM dump.
fn shown_numbers(dom: &str) -> Vec<(String, f64)> {
    let unescape = |s: &str| {
        s.replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&")
    };
    dom.split("data-metric=\"")
        .skip(1)
        .map(|rest| {
            let (metric, rest) = rest.split_once('"').unwrap();
            let value = rest.split("data-value=\"").nth(1).unwrap();
            let value = value.split('"').next().unwrap();
            (unescape(metric), value.parse().unwrap())
        })
        .collect()
}

#[test]
fn status_page_in_headless_chromium_matches_metrics() {
    let cluster = Cluster::start(&[]);
    let node = cluster.storage("32MB");
    let client = Client::setup_dummy(16 << 20, 16 << 20, &node.dummy_addr).unwrap();
    let cfg = ReplicaPolicy::default();
    for i in 0..20 {
        let key = format!("s{i}");
        client
            .put(&key, &value(&key, 10_000 + i * 100), &cfg)
            .unwrap();
        let _ = client.get(&key);
    }
    let _ = client.get("missing");
    drop(client);
    let http = cluster.http_addr.clone();
    let (_, metrics) = http_get(&http, "/metrics");
    let expected = samples(&metrics);
    let url = format!("http://{http}/");
    // Without JavaScript a browser shows the markup as served (Chromium's
    // DOM dump itself needs scripts, so that mode is read over HTTP); with
    // it, the DOM after the page refreshed itself from /metrics.
    let (_, served) = http_get(&http, "/");
    let rendered = chromium(&url, &["--dump-dom"]);
    for (mode, dom) in [
        ("without JavaScript", &served),
        ("with JavaScript", &rendered),
    ] {
        assert!(dom.contains("Mooncake master"), "{mode}: {dom}");
        let shown = shown_numbers(dom);
        assert!(shown.len() >= 15, "{mode}: {} numbers", shown.len());
        for (metric, value) in &shown {
            // Clients heartbeat: pings move between the two reads.
            if metric.starts_with("master_ping") {
                continue;
            }
            let want = expected
                .get(metric)
                .unwrap_or_else(|| panic!("{mode}: {metric} not in /metrics"));
            assert_eq!(value, want, "{mode}: {metric}");
        }
        assert!(shown
            .iter()
            .any(|(m, v)| m == "master_key_count" && *v == 20.0));
        assert!(dom.contains(&node.segment), "{mode}: the segment's row");
        let live = dom.contains(r#"id="updated">live, updated"#);
        assert_eq!(
            live,
            mode == "with JavaScript",
            "{mode}: refreshed from /metrics"
        );
    }
    let shot = tempfile::tempdir().unwrap();
    let png = shot.path().join("status.png");
    chromium(
        &url,
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1280,900",
        ],
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG"), "a PNG screenshot");
    // `MOONCAKE_STATUS_SCREENSHOT=docs/img/status-page.png` refreshes the
    // documentation's picture (with JavaScript, as most users see it).
    if let Ok(dest) = std::env::var("MOONCAKE_STATUS_SCREENSHOT") {
        let shoot = format!("--screenshot={dest}");
        chromium(&url, &[&shoot, "--window-size=1280,1000"]);
    }
}
