//! Replicated HA masters for the process tests: starting one
//! (`--enable_ha --enable_oplog` on etcd or redis, optionally with HA
//! snapshots under a directory), and reading its role, in-sync set and
//! replication state from its admin HTTP.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use super::{eventually, spawn_watching, MasterPorts, Proc, MASTER};

pub struct Master {
    pub proc: Proc,
    pub rpc: u16,
    pub http: u16,
    pub up: Receiver<String>,
}

pub fn start_master(coordination: &str, cluster: &str, rpc: u16, http: u16) -> Master {
    start_master_with(coordination, cluster, rpc, http, 3)
}

pub fn start_master_with(
    coordination: &str,
    cluster: &str,
    rpc: u16,
    http: u16,
    client_ttl: u32,
) -> Master {
    start_master_in(coordination, cluster, rpc, http, client_ttl, None, &[])
}

/// With `snapshots`: HA snapshots every second, stored under that
/// directory (shared by the masters, as an S3 bucket would be).
pub fn start_master_in(
    coordination: &str,
    cluster: &str,
    rpc: u16,
    http: u16,
    client_ttl: u32,
    snapshots: Option<&std::path::Path>,
    extra: &[&str],
) -> Master {
    let mut args = MasterPorts {
        rpc,
        metrics: http,
        ..MasterPorts::ANY
    }
    .args();
    args.extend([
        "--enable_ha=true".to_string(),
        "--enable_oplog=true".into(),
        format!("--etcd_endpoints={coordination}"),
        format!("--cluster_id={cluster}"),
        "--rpc_address=127.0.0.1".into(),
        "--metrics_host=127.0.0.1".into(),
        format!("--client_ttl={client_ttl}"),
        "--default_kv_lease_ttl=200".into(),
        "--oplog_poll_interval_ms=200".into(),
    ]);
    let Some(dir) = snapshots else {
        let (proc, up) = spawn_watching(&MASTER, &args, "listening on");
        return Master {
            proc,
            rpc,
            http,
            up,
        };
    };
    args.extend([
        "--enable_snapshot=true".to_string(),
        "--snapshot_retention_count=2".into(),
    ]);
    // Every second unless `extra` says otherwise (a flag may not repeat).
    if !extra
        .iter()
        .any(|e| e.starts_with("--snapshot_interval_seconds="))
    {
        args.push("--snapshot_interval_seconds=1".into());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut child = std::process::Command::new(&*MASTER)
        .args(&args)
        .env("MOONCAKE_SNAPSHOT_LOCAL_PATH", dir)
        .stdout(std::process::Stdio::piped())
        .stderr(test_support::process::child_stderr(&MASTER))
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, up) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(|l| l.ok())
        {
            if line.contains("listening on") && tx.send(line).is_err() {
                return;
            }
        }
    });
    let proc = Proc(child);
    Master {
        proc,
        rpc,
        http,
        up,
    }
}

/// One HTTP GET; `None` while nothing listens.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let status = resp.split_whitespace().nth(1)?.parse().ok()?;
    let (_, body) = resp.split_once("\r\n\r\n")?;
    Some((status, body.to_string()))
}

pub fn role(m: &Master) -> Option<String> {
    http_get(m.http, "/role").map(|(_, b)| b)
}

/// How many standbys the leader has recorded as in sync.
pub fn in_sync(m: &Master) -> usize {
    let Some((_, body)) = http_get(m.http, "/replication") else {
        return 0;
    };
    body.split("\"in_sync\":[")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .map_or(0, |list| list.matches('#').count())
}

pub fn leader(masters: &[Master]) -> usize {
    let mut found = None;
    eventually("one master leads", || {
        found = masters
            .iter()
            .position(|m| role(m).as_deref() == Some("leader"));
        found.is_some()
    });
    found.unwrap()
}

/// A cluster of its own for each test: tests share one etcd.
pub fn cluster(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

pub fn mounted_client(etcd: &str, cluster: &str, client_id: u128) -> mooncake_store::MasterClient {
    let m = mooncake_store::MasterClient::connect_in_cluster(&format!("etcd://{etcd}"), cluster)
        .unwrap();
    let _ = m.ping(client_id);
    let segment = mooncake_store::types::SegmentInfo {
        name: "seg".into(),
        base: 1 << 30,
        size: 64 << 20,
        transport_endpoint: "127.0.0.1:1".into(),
    };
    m.mount_segment(client_id, &segment).unwrap();
    m
}

/// A number from `/replication` (`"name":123`).
/// Puts `keys` (64 bytes each, nothing written) through `m` as client
/// `client_id` in one batch, after a ping, and asserts every step.
pub fn put_keys(m: &mooncake_store::MasterClient, client_id: u128, keys: &[String]) {
    let opts = mooncake_store::types::WriteOptions::default();
    m.ping(client_id).unwrap();
    for r in m
        .batch_put_start(client_id, keys, &vec![64; keys.len()], &opts)
        .unwrap()
    {
        r.unwrap();
    }
    for r in m.batch_put_end(client_id, keys).unwrap() {
        r.unwrap();
    }
}

pub fn replication_field(m: &Master, name: &str) -> u64 {
    http_get(m.http, "/replication")
        .and_then(|(_, b)| {
            let rest = b.split(&format!("\"{name}\":")).nth(1)?;
            rest.split([',', '}']).next()?.parse().ok()
        })
        .unwrap_or(0)
}

/// The value of an unlabelled metric on `m`'s `/metrics`.
pub fn gauge(m: &Master, name: &str) -> Option<i64> {
    let (_, body) = http_get(m.http, "/metrics")?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}
