//! The processes a benchmark runs against: a `mooncake_master` and, for the
//! remote topology, a `mooncake_client` holding the segment. They are this
//! executable re-run as those programs (`--run-as NAME`, which calls the
//! same library entry point as the binary of that name), so a benchmark
//! always measures the code it was built with, never a stale binary on
//! `PATH`. They start on loopback with port 0 and are read back from their
//! ready lines, so nothing races for ports.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mooncake_common::{Error, ErrorCode, Result};
use mooncake_store::client::{Client, ClientConfig};

/// How long a process may take to print its ready line (a master
/// restoring a large snapshot included).
const READY_TIMEOUT: Duration = Duration::from_secs(600);

/// First argument that turns this executable into one of the programs.
const RUN_AS: &str = "--run-as";

fn err(msg: impl Into<std::borrow::Cow<'static, str>>) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, msg)
}

/// `argv` = `[_, "--run-as", NAME, ARGS…]`: runs program NAME with `ARGS`
/// as its own binary would and returns its exit code; `None` for any other
/// command line.
pub(crate) fn run_as_program(argv: &[String]) -> Option<i32> {
    if argv.get(1).map(String::as_str) != Some(RUN_AS) {
        return None;
    }
    let Some(name) = argv.get(2) else {
        eprintln!("mooncake-bench {RUN_AS}: which program?");
        return Some(2);
    };
    Some(mooncake_cli::entry::run(name, argv[2..].to_vec()))
}

/// This executable and the arguments that make it run program `name`.
pub(crate) fn program(name: &str) -> Result<(PathBuf, Vec<String>)> {
    let exe = std::env::current_exe().map_err(|e| err(format!("own executable: {e}")))?;
    Ok((exe, vec![RUN_AS.to_string(), name.to_string()]))
}

/// A child process stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `program args…` with `env`, stderr to `log`, and waits until a
    /// stdout line contains `ready_marker`; returns it with that line.
    pub fn spawn<I, S>(
        name: &str,
        program: &Path,
        args: I,
        env: &[(String, String)],
        log: PathBuf,
        ready_marker: &str,
    ) -> Result<(Proc, String)>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let stderr = std::fs::File::create(&log)
            .map_err(|e| err(format!("cannot create {}: {e}", log.display())))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        // SAFETY: prctl is async-signal-safe; the closure touches no memory
        // of the parent. PDEATHSIG makes the child die with us, so a crashed
        // benchmark leaves no process behind.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| err(format!("cannot start {}: {e}", program.display())))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut proc = Proc {
            name: name.to_owned(),
            child,
            log,
        };
        // Read lines on a thread so the wait has a deadline; the thread then
        // drains stdout until the child exits, so it never blocks on a pipe.
        let (tx, rx) = mpsc::channel();
        let marker = ready_marker.to_owned();
        std::thread::Builder::new()
            .name(format!("{name}-stdout"))
            .spawn(move || {
                let mut sent = false;
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if !sent && line.contains(&marker) {
                        let _ = tx.send(line);
                        sent = true;
                    }
                }
            })
            .map_err(|e| err(format!("cannot start a reader thread: {e}")))?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => return Ok((proc, line)),
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                    if let Ok(Some(status)) = proc.child.try_wait() {
                        return Err(proc.failure(&format!("exited with {status}")));
                    }
                }
                Err(_) => {
                    let e = proc.failure("did not become ready");
                    return Err(e);
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn failure(&self, what: &str) -> Error {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        err(format!(
            "{} {what}; log tail:\n{}",
            self.name,
            tail.join("\n")
        ))
    }

    /// SIGTERM, up to 10 s to exit, then SIGKILL.
    fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: plain syscall on the pid of our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The value after `key=` in a ready line (`rpc=127.0.0.1:1234 …`).
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .map(|v| v.trim_end_matches([';', ',']))
}

/// A running `mooncake_master` on loopback.
pub struct Master {
    pub proc: Proc,
    /// `host:port` of the RPC service.
    pub rpc: String,
    /// `http://host:port/metadata`.
    pub metadata_server: String,
}

impl Master {
    /// A client of this master over TCP on loopback, mounting `segment`
    /// bytes.
    pub fn tcp_client(&self, segment: u64) -> Result<Client> {
        Client::setup(&ClientConfig {
            local_hostname: "127.0.0.1".into(),
            metadata_server: self.metadata_server.clone(),
            global_segment_size: segment,
            local_buffer_size: 16 << 20,
            protocol: "tcp".into(),
            device_name: String::new(),
            master_server_address: self.rpc.clone(),
            ..ClientConfig::default()
        })
    }
}

/// Where child processes write their logs.
pub fn work_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("mooncake-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
    Ok(dir)
}

/// Starts `mooncake_master` with the same flags `benchmarks/compare.py`
/// gives both systems (ports chosen by the kernel).
pub fn start_master(env: &[(String, String)], extra: &[String]) -> Result<Master> {
    let (exe, mut args) = program("mooncake_master")?;
    args.extend(
        [
            "--port=0",
            "--rpc_port=0",
            "--rpc_address=127.0.0.1",
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            "--http_metadata_server_port=0",
            "--metrics_host=127.0.0.1",
            "--metrics_port=0",
        ]
        .map(String::from),
    );
    args.extend(extra.iter().cloned());
    let log = work_dir()?.join("master.log");
    let (proc, line) = Proc::spawn("mooncake_master", &exe, &args, env, log, "listening")?;
    let get = |k: &str| {
        field(&line, k)
            .map(str::to_owned)
            .ok_or_else(|| err(format!("no {k}= in {line:?}")))
    };
    Ok(Master {
        rpc: get("rpc")?,
        metadata_server: format!("http://{}/metadata", get("metadata")?),
        proc,
    })
}

/// Starts a `mooncake_client` contributing `segment` bytes to `master`.
pub fn start_storage(master: &Master, segment: u64, env: &[(String, String)]) -> Result<Proc> {
    let (exe, mut args) = program("mooncake_client")?;
    args.extend([
        format!("--master_server_address={}", master.rpc),
        format!("--metadata_server={}", master.metadata_server),
        format!("--global_segment_size={segment}"),
        "--host=127.0.0.1".into(),
        "--port=0".into(),
        "--protocol=tcp".into(),
    ]);
    let log = work_dir()?.join("storage.log");
    let (proc, _) = Proc::spawn("mooncake_client", &exe, args, env, log, "ready")?;
    Ok(proc)
}

/// Resident set size of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| err(format!("/proc/{pid}/status: {e}")))?;
    parse_vm_rss(&status).ok_or_else(|| err(format!("no VmRSS for pid {pid}")))
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_fields() {
        let line = "mooncake_master listening on rpc=127.0.0.1:4000 http=127.0.0.1:4001 metadata=127.0.0.1:4002";
        assert_eq!(field(line, "rpc"), Some("127.0.0.1:4000"));
        assert_eq!(field(line, "metadata"), Some("127.0.0.1:4002"));
        assert_eq!(field(line, "nope"), None);
        assert_eq!(field("a rpc=x; b", "rpc"), Some("x"));
    }

    #[test]
    fn vm_rss() {
        assert_eq!(
            parse_vm_rss("Name:\tx\nVmRSS:\t  1234 kB\n"),
            Some(1234 * 1024)
        );
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert!(rss_bytes(std::process::id()).unwrap() > 0);
    }

    #[test]
    fn runs_as_a_program_only_when_asked() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(run_as_program(&argv(&["mooncake-bench", "store"])), None);
        assert_eq!(run_as_program(&argv(&["mooncake-bench"])), None);
        assert_eq!(run_as_program(&argv(&["mooncake-bench", RUN_AS])), Some(2));
        assert_eq!(
            run_as_program(&argv(&["mooncake-bench", RUN_AS, "no_such_program"])),
            Some(127)
        );
    }
}
