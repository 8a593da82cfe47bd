//! Real etcd, redis and S3-compatible servers for integration tests.
//!
//! `MOONCAKE_TEST_ETCD` / `MOONCAKE_TEST_REDIS` (set by scripts/services.sh)
//! name running servers; when unset, the server is started here from PATH on
//! free loopback ports with a temporary directory, and killed (by pid) when
//! the [`Service`] is dropped. The S3 server is moto's (`moto_server`, from
//! PyPI `moto[server]`: on PATH or in `MOONCAKE_TEST_MOTO_VENV`), always one
//! of the test's own.

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use crate::ports::free_port;

pub struct Service {
    /// `host:port` clients connect to.
    pub addr: String,
    child: Option<Child>,
    _dir: Option<tempfile::TempDir>,
}

impl Service {
    /// Whether this test started (and owns) the server.
    pub fn owned(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// etcd from `MOONCAKE_TEST_ETCD`, or a fresh one.
pub fn etcd() -> Service {
    if let Some(addr) = env_addr("MOONCAKE_TEST_ETCD") {
        return Service {
            addr,
            child: None,
            _dir: None,
        };
    }
    start_etcd()
}

/// A fresh etcd of this test's own, whatever the environment says.
pub fn start_etcd() -> Service {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let log = std::fs::File::create(dir.path().join("etcd.log")).unwrap();
    let child = Command::new("etcd")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--name", "test"])
        .args([
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("test={peer_url}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("etcd not on PATH (scripts/install-deps.sh --test installs it)");
    started(format!("127.0.0.1:{client}"), child, dir)
}

/// redis from `MOONCAKE_TEST_REDIS`, or a fresh one.
pub fn redis() -> Service {
    if let Some(addr) = env_addr("MOONCAKE_TEST_REDIS") {
        return Service {
            addr,
            child: None,
            _dir: None,
        };
    }
    start_redis(&[])
}

/// A fresh redis-server of this test's own, with `extra` arguments
/// (e.g. `["--requirepass", "pw"]`).
pub fn start_redis(extra: &[&str]) -> Service {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("redis.log")).unwrap();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path())
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("redis-server not on PATH (scripts/install-deps.sh --test installs it)");
    started(format!("127.0.0.1:{port}"), child, dir)
}

/// A fresh S3-compatible server (moto) with an empty bucket `bucket`;
/// `addr` is its `host:port` (plain HTTP, any credentials accepted).
pub fn start_s3(bucket: &str) -> Service {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("moto.log")).unwrap();
    let bin = std::env::var("MOONCAKE_TEST_MOTO_VENV")
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| format!("{v}/bin/moto_server"))
        .unwrap_or_else(|| "moto_server".into());
    let child = Command::new(&bin)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{bin}: {e} (scripts/install-deps.sh --test installs moto[server])")
        });
    let service = started(format!("127.0.0.1:{port}"), child, dir);
    // CreateBucket; moto does not check signatures.
    let mut s = TcpStream::connect(&service.addr).unwrap();
    let req = format!(
        "PUT /{bucket} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        service.addr
    );
    std::io::Write::write_all(&mut s, req.as_bytes()).unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut s, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "CreateBucket: {answer}");
    service
}

fn env_addr(var: &str) -> Option<String> {
    std::env::var(var)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Waits (bounded) until the server accepts connections.
fn started(addr: String, child: Child, dir: tempfile::TempDir) -> Service {
    let mut service = Service {
        addr,
        child: Some(child),
        _dir: Some(dir),
    };
    let sock: SocketAddr = service.addr.parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect_timeout(&sock, Duration::from_millis(200)).is_err() {
        if let Some(status) = service.child.as_mut().unwrap().try_wait().unwrap() {
            panic!("server for {} exited early: {status}", service.addr);
        }
        assert!(
            Instant::now() < deadline,
            "server for {} did not start",
            service.addr
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    service
}
