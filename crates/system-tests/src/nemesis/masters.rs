//! The three masters of a nemesis run: `--enable_ha --enable_oplog` with a
//! log directory each (on a small file system of its own when the harness
//! may mount one, so that it can be filled), snapshots, and a relay of
//! their own to the coordination service (frozen for a partition).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use test_support::ports::MasterPorts;
use test_support::{free_port, FreezeProxy, Proc};

use super::coordination::Coordination;

/// Size of a master's log file system: room for minutes of load between
/// snapshots (every 5 s, after which the log is compacted), small enough
/// to fill at once.
const LOG_FS: &str = "size=96m";

pub struct Master {
    pub index: usize,
    pub rpc: u16,
    pub http: u16,
    pub pod: String,
    pub wal: PathBuf,
    snapshots: PathBuf,
    log: PathBuf,
    kubeconfig: PathBuf,
    pub relay: FreezeProxy,
    pub proc: Option<Proc>,
    /// Whether `wal` is a file system of its own (mounted here).
    pub own_fs: bool,
}

impl Master {
    /// Prepares master `index` under `dir` (nothing runs yet).
    pub fn new(index: usize, dir: &Path, coord: &Coordination, mount: bool) -> Master {
        let home = dir.join(format!("master-{index}"));
        let wal = home.join("wal");
        let snapshots = home.join("snapshots");
        std::fs::create_dir_all(&wal).expect("log directory");
        std::fs::create_dir_all(&snapshots).expect("snapshot directory");
        let own_fs = mount && mount_tmpfs(&wal);
        let relay = FreezeProxy::start(&coord.addr);
        let pod = format!("nemesis-{index}");
        coord.add_pod(&pod);
        let kubeconfig = home.join("kubeconfig");
        coord.write_kubeconfig(&kubeconfig, &relay.addr);
        Master {
            index,
            rpc: free_port(),
            http: free_port(),
            pod,
            wal,
            snapshots,
            log: home.join("master.log"),
            kubeconfig,
            relay,
            proc: None,
            own_fs,
        }
    }

    /// Starts the process on its ports and directories.
    pub fn spawn(&mut self, master_bin: &str, coord: &Coordination, cluster: &str) {
        let mut args = MasterPorts {
            rpc: self.rpc,
            metrics: self.http,
            ..MasterPorts::ANY
        }
        .args();
        args.extend(coord.master_flags(&self.relay.addr, &self.pod));
        args.extend([
            "--enable_ha=true".to_string(),
            "--enable_oplog=true".into(),
            format!("--cluster_id={cluster}"),
            format!("--wal_dir={}", self.wal.display()),
            "--enable_snapshot=true".into(),
            "--snapshot_interval_seconds=5".into(),
            "--snapshot_retention_count=2".into(),
            "--rpc_address=127.0.0.1".into(),
            "--metrics_host=127.0.0.1".into(),
            // Generous: a client is never expired for the harness's
            // own stalls, only the masters are under test.
            "--client_ttl=30".into(),
            "--default_kv_lease_ttl=200".into(),
            "--oplog_poll_interval_ms=200".into(),
        ]);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("master log");
        let child = Command::new(master_bin)
            .args(&args)
            .env("MOONCAKE_SNAPSHOT_LOCAL_PATH", &self.snapshots)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("mooncake_master");
        self.proc = Some(Proc(child));
    }

    /// Whether the process runs (reaps it when it exited).
    pub fn running(&mut self) -> bool {
        match &mut self.proc {
            Some(p) => matches!(p.0.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    pub fn signal(&self, sig: i32) {
        if let Some(p) = &self.proc {
            // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
            unsafe { libc::kill(p.0.id() as i32, sig) };
        }
    }

    pub fn role(&self) -> Option<String> {
        http_get(self.http, "/role").map(|(_, b)| b)
    }

    /// How many standbys this master (as leader) records in sync.
    pub fn in_sync(&self) -> usize {
        let Some((_, body)) = http_get(self.http, "/replication") else {
            return 0;
        };
        body.split("\"in_sync\":[")
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .map_or(0, |list| list.matches('#').count())
    }

    /// The last lines of its log, for a failure message.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Fills its log's file system; the filler is removed by [`Self::free_disk`].
    pub fn fill_disk(&self) {
        let mut f = std::fs::File::create(self.filler()).expect("filler");
        let chunk = vec![0u8; 1 << 20];
        while f.write_all(&chunk).is_ok() {}
        let small = vec![0u8; 4096];
        while f.write_all(&small).is_ok() {}
        let _ = f.sync_all();
    }

    pub fn free_disk(&self) {
        let _ = std::fs::remove_file(self.filler());
    }

    fn filler(&self) -> PathBuf {
        self.wal.join("nemesis-filler")
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        self.kill9();
        if self.own_fs {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.wal)
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Whether the harness may mount small file systems (root): the full-disk
/// fault needs them.
pub fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn mount_tmpfs(dir: &Path) -> bool {
    Command::new("mount")
        .args(["-t", "tmpfs", "-o", LOG_FS, "nemesis-log"])
        .arg(dir)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// One HTTP GET on loopback `port`; `None` while nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let sock = ([127, 0, 0, 1], port).into();
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
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
