//! Helpers shared by the store tests that run real processes
//! (`mooncake_master`, `mooncake_http_metadata_server`, `mooncake_client`):
//! a small cluster, values and replica checks; the generic process helpers
//! (free ports, child processes killed on drop, bounded waits) are
//! `test_support`'s.

// Each test crate uses a different subset.
#![allow(dead_code, unused_imports)]

pub mod dummy;
pub mod ha;
pub mod load;
pub mod raw;

use std::process::{Command, Stdio};

use mooncake_common::ErrorCode;
use mooncake_store::client::{Client, ClientConfig};
use mooncake_store::types::{ReplicaKind, ReplicaPolicy};
pub use test_support::ports::{free_port, MasterPorts};
pub use test_support::process::{
    eventually, spawn_until_line, spawn_watching, wait_port, Proc, WAIT,
};

pub static MASTER: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| mooncake_system_tests::program("mooncake_master"));
pub static METADATA: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| mooncake_system_tests::program("mooncake_http_metadata_server"));
pub static STORAGE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| mooncake_system_tests::program("mooncake_client"));

pub struct Cluster {
    pub master_addr: String,
    /// The master's HTTP service (metrics, status page).
    pub http_addr: String,
    pub metadata: String,
    _procs: Vec<Proc>,
}

pub struct Storage {
    pub proc: Proc,
    /// Segment name (the node's engine endpoint).
    pub segment: String,
    /// Where dummy clients connect.
    pub dummy_addr: String,
}

impl Storage {
    /// Sends `sig` to this storage process.
    pub fn signal(&self, sig: i32) {
        // SAFETY: a signal to a child process the test owns.
        assert_eq!(unsafe { libc::kill(self.proc.0.id() as i32, sig) }, 0);
    }

    /// Stops this process (SIGSTOP) and waits until every thread of it
    /// stopped: kill(2) only queues the signal, and on a loaded machine
    /// its threads can go on serving reads for milliseconds after.
    pub fn stop(&self) {
        self.signal(libc::SIGSTOP);
        let pid = self.proc.0.id() as i32;
        let mut status = 0;
        // SAFETY: waits on a child the test owns; WUNTRACED reports its
        // stop without reaping it.
        assert_eq!(
            unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) },
            pid
        );
        assert!(libc::WIFSTOPPED(status), "not stopped: {status:#x}");
    }
}

/// A `mooncake_http_metadata_server` on a free port, and its URL.
pub fn metadata_server() -> (Proc, String) {
    metadata_server_on("127.0.0.1")
}

/// A `mooncake_http_metadata_server` on a free port of `host`, and its URL.
pub fn metadata_server_on(host: &str) -> (Proc, String) {
    let (meta, line) = spawn_until_line(
        &METADATA,
        &["-port=0".into(), format!("--host={host}")],
        "listening on",
    );
    let meta_addr = line.trim().rsplit(' ').next().unwrap().to_owned();
    (meta, format!("http://{meta_addr}/metadata"))
}

impl Cluster {
    pub fn start(extra_master_flags: &[&str]) -> Cluster {
        let (mport, hport) = (free_port(), free_port());
        let (meta, metadata) = metadata_server();
        let mut args = MasterPorts {
            rpc: mport,
            metrics: hport,
            ..MasterPorts::ANY
        }
        .args();
        args.extend([
            "--rpc_address=127.0.0.1".into(),
            "--metrics_host=127.0.0.1".into(),
        ]);
        // Short timeouts unless the test names its own.
        for default in ["--client_ttl=2", "--default_kv_lease_ttl=50"] {
            let name = default.split('=').next().unwrap();
            if !extra_master_flags
                .iter()
                .any(|f| f.split('=').next() == Some(name))
            {
                args.push(default.into());
            }
        }
        args.extend(extra_master_flags.iter().map(|s| s.to_string()));
        let master = Proc(
            Command::new(&*MASTER)
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        wait_port(mport);
        wait_port(hport);
        Cluster {
            master_addr: format!("127.0.0.1:{mport}"),
            http_addr: format!("127.0.0.1:{hport}"),
            metadata,
            _procs: vec![meta, master],
        }
    }

    pub fn storage(&self, segment_size: &str) -> Storage {
        let args = vec![
            format!("--master_server_address={}", self.master_addr),
            format!("--metadata_server={}", self.metadata),
            "--host=127.0.0.1".into(),
            "--port=0".into(),
            format!("--global_segment_size={segment_size}"),
        ];
        let (proc, line) = spawn_until_line(&STORAGE, &args, "mooncake_client ready");
        let dummy_addr = ready_dummy_addr(&line);
        let segment = ready_segment(&line);
        Storage {
            proc,
            segment,
            dummy_addr,
        }
    }

    pub fn config(&self, global_segment_size: u64, local_buffer_size: u64) -> ClientConfig {
        ClientConfig {
            local_hostname: "127.0.0.1".into(),
            metadata_server: self.metadata.clone(),
            global_segment_size,
            local_buffer_size,
            protocol: "tcp".into(),
            device_name: String::new(),
            master_server_address: self.master_addr.clone(),
            ..ClientConfig::default()
        }
    }

    pub fn pure_client(&self) -> Client {
        Client::setup(&self.config(0, 64 << 20)).unwrap()
    }
}

pub fn value(key: &str, len: usize) -> Vec<u8> {
    let seed = key
        .bytes()
        .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect()
}

pub fn code<T: std::fmt::Debug>(r: mooncake_common::Result<T>) -> ErrorCode {
    r.expect_err("expected an error").code
}

pub fn segments_of(client: &Client, key: &str) -> Vec<String> {
    let mut v: Vec<String> = client
        .get_replica_desc(key)
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.kind {
            ReplicaKind::Memory(m) => Some(m.segment_name),
            ReplicaKind::Disk(_) | ReplicaKind::LocalDisk(_) => None,
        })
        .collect();
    v.sort();
    v
}

pub fn pinned_to(segment: &str) -> ReplicaPolicy {
    ReplicaPolicy {
        preferred_segment: segment.to_owned(),
        ..Default::default()
    }
}

/// The value of the unlabelled sample `name` on the master's `/metrics`
/// (at `http_addr`), 0 when absent.
pub fn metric(http_addr: &str, name: &str) -> f64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(http_addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {http_addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The dummy-service address in `mooncake_client`'s ready line
/// ("mooncake_client ready: dummy clients connect to ADDR; segment NAME (SIZE)").
pub fn ready_dummy_addr(line: &str) -> String {
    let rest = line
        .split("connect to ")
        .nth(1)
        .expect("no dummy address in the ready line");
    rest.split(';').next().unwrap().to_owned()
}

/// The segment name in `mooncake_client`'s ready line.
pub fn ready_segment(line: &str) -> String {
    let rest = line
        .split("segment ")
        .nth(1)
        .expect("no segment in the ready line");
    rest.split(' ').next().unwrap().to_owned()
}
