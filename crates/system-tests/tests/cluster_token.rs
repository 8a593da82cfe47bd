//! A cluster with a token (`--cluster_token_file` on the master, the
//! metadata server and `mooncake_client`): members that hold it work end
//! to end; a peer without it can neither change metadata (master calls,
//! metadata PUT and DELETE, admin POSTs) nor read a segment's bytes.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use mooncake_common::auth::ClusterToken;
use mooncake_common::ErrorCode;
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::master_client::MasterClient;
use mooncake_store::types::ReplicaPolicy;

const TOKEN: &str = "4f1c0d9e-cluster-secret";

/// One HTTP/1.1 exchange on a fresh connection: (status, body).
fn http(
    addr: &str,
    method: &str,
    target: &str,
    bearer: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

/// A raw engine `ReadReq` of `len` bytes at `addr`: everything sent back.
fn raw_read(engine: &str, addr: u64, len: u64) -> Vec<u8> {
    let mut h = [0u8; 32];
    h[0..4].copy_from_slice(b"MCTE");
    h[4] = 1;
    h[5] = 3; // ReadReq
    h[12..16].copy_from_slice(&1u32.to_le_bytes());
    h[16..24].copy_from_slice(&addr.to_le_bytes());
    h[24..32].copy_from_slice(&len.to_le_bytes());
    let mut s = TcpStream::connect(engine).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&h).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

#[test]
fn the_cluster_token_guards_every_port() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let token_flag = format!("--cluster_token_file={}", token_file.display());

    let (_meta, meta_line) = spawn_until_line(
        &METADATA,
        &[
            "-port=0".into(),
            "--host=127.0.0.1".into(),
            token_flag.clone(),
        ],
        "listening on",
    );
    let meta_addr = meta_line.trim().rsplit(' ').next().unwrap().to_owned();
    let metadata = format!("http://{meta_addr}/metadata");
    let (mport, hport) = (free_port(), free_port());
    let _master = Proc(
        Command::new(&*MASTER)
            .args(
                MasterPorts {
                    rpc: mport,
                    metrics: hport,
                    ..MasterPorts::ANY
                }
                .args(),
            )
            .args([
                "--rpc_address=127.0.0.1".into(),
                "--metrics_host=127.0.0.1".into(),
                "--default_kv_lease_ttl=50".into(),
                token_flag.clone(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_port(mport);
    wait_port(hport);
    let master_addr = format!("127.0.0.1:{mport}");
    let (_storage, ready) = spawn_until_line(
        &STORAGE,
        &[
            format!("--master_server_address={master_addr}"),
            format!("--metadata_server={metadata}"),
            "--host=127.0.0.1".into(),
            "--port=0".into(),
            "--global_segment_size=16MB".into(),
            token_flag.clone(),
        ],
        "mooncake_client ready",
    );
    let dummy_addr = ready_dummy_addr(&ready);
    let segment = ready_segment(&ready);

    // Members: a pure client with the token puts and gets through the
    // storage node's segment (master, metadata and engine all check it).
    let member = Client::setup(&ClientConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata.clone(),
        global_segment_size: 0,
        local_buffer_size: 16 << 20,
        master_server_address: master_addr.clone(),
        cluster_token: Some(ClusterToken::new(TOKEN).unwrap()),
        ..ClientConfig::default()
    })
    .unwrap();
    let v = value("k1", 100_000);
    member.put("k1", &v, &ReplicaPolicy::default()).unwrap();
    assert_eq!(member.get("k1").unwrap(), v);

    // A dummy with the token in its environment is served too (the only
    // test here, so setting the environment races no other thread).
    std::env::set_var(mooncake_common::auth::TOKEN_ENV, TOKEN);
    let dummy = Client::setup_dummy(1 << 20, 1 << 20, &dummy_addr).unwrap();
    assert_eq!(dummy.get("k1").unwrap(), v);
    std::env::remove_var(mooncake_common::auth::TOKEN_ENV);
    let e = Client::setup_dummy(1 << 20, 1 << 20, &dummy_addr)
        .err()
        .unwrap();
    assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT, "{e}");

    // Strangers, master RPC: no token, then a wrong one.
    let anon = MasterClient::connect(&master_addr).unwrap();
    assert_eq!(code(anon.get_size("k1")), ErrorCode::ILLEGAL_CLIENT);
    assert_eq!(code(anon.remove("k1", true)), ErrorCode::ILLEGAL_CLIENT);
    assert_eq!(code(anon.remove_all(false)), ErrorCode::ILLEGAL_CLIENT);
    let wrong = ClusterToken::new("guess").unwrap();
    let e = MasterClient::connect_with_token(&master_addr, "mooncake_cluster", Some(wrong))
        .err()
        .unwrap();
    assert_eq!(e.code, ErrorCode::ILLEGAL_CLIENT);
    // Force removal is an admin call, even for members.
    let m = MasterClient::connect_with_token(
        &master_addr,
        "mooncake_cluster",
        Some(ClusterToken::new(TOKEN).unwrap()),
    )
    .unwrap();
    assert_eq!(code(m.remove_all(true)), ErrorCode::ILLEGAL_CLIENT);
    assert_eq!(m.get_size("k1").unwrap(), v.len() as u64);

    // Strangers, metadata server: reads are open, writes need the token.
    let rpc_meta = format!("/metadata?key=mooncake/rpc_meta/{segment}");
    let ram = format!("/metadata?key=mooncake/ram/{segment}");
    let (status, meta) = http(&meta_addr, "GET", &rpc_meta, None, b"");
    assert_eq!(status, 200, "{meta}");
    let (status, desc) = http(&meta_addr, "GET", &ram, None, b"");
    assert_eq!(status, 200);
    assert_eq!(http(&meta_addr, "PUT", &ram, None, b"{}").0, 401);
    assert_eq!(http(&meta_addr, "PUT", &ram, Some("guess"), b"{}").0, 401);
    assert_eq!(http(&meta_addr, "DELETE", &rpc_meta, None, b"").0, 401);
    assert_eq!(
        http(&meta_addr, "GET", &ram, None, b"").1,
        desc,
        "unchanged"
    );
    let probe = "/metadata?key=probe/by-member";
    assert_eq!(http(&meta_addr, "PUT", probe, Some(TOKEN), b"{}").0, 200);
    assert_eq!(http(&meta_addr, "DELETE", probe, Some(TOKEN), b"").0, 200);

    // Strangers, master admin HTTP: state changes need the token.
    let http_addr = format!("127.0.0.1:{hport}");
    let drain = br#"{"segments":["nope"]}"#;
    let (status, _) = http(&http_addr, "POST", "/api/v1/drain_jobs", None, drain);
    assert_eq!(status, 401);
    let (status, body) = http(&http_addr, "POST", "/api/v1/drain_jobs", Some(TOKEN), drain);
    assert_ne!(status, 401, "{body}");
    assert_eq!(http(&http_addr, "GET", "/health", None, b"").0, 200);

    // Strangers, the storage node's engine: a read of its first buffer
    // gets a refusal and none of the bytes.
    let meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
    let engine = format!(
        "{}:{}",
        meta["ip_or_host_name"].as_str().unwrap(),
        meta["rpc_port"].as_u64().unwrap()
    );
    let desc: serde_json::Value = serde_json::from_str(&desc).unwrap();
    let base = desc["buffers"][0]["addr"].as_u64().unwrap();
    let got = raw_read(&engine, base, 1 << 20);
    assert_eq!(got.len(), 32, "a refusal header only");
    assert_ne!(i32::from_le_bytes(got[8..12].try_into().unwrap()), 0);

    dummy.close().unwrap();
    member.close().unwrap();
}
