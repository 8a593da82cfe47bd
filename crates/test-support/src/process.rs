//! Child processes for tests: processes killed on drop, ready lines read
//! from stdout, bounded waits.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bound of every wait here: a hang guard, never a speed check.
pub const WAIT: Duration = Duration::from_secs(60);

/// A child process killed (by pid) when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    pub fn kill9(&mut self) {
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        assert_eq!(unsafe { libc::kill(self.0.id() as i32, libc::SIGKILL) }, 0);
        let _ = self.0.wait();
    }
}

/// Where a child's stderr goes: nowhere, or with `MOONCAKE_TEST_LOG_DIR`
/// set, a file of its own in that directory, to read after a failed run.
pub fn child_stderr(bin: &str) -> Stdio {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let Some(dir) = std::env::var_os("MOONCAKE_TEST_LOG_DIR") else {
        return Stdio::null();
    };
    let name = std::path::Path::new(bin)
        .file_name()
        .map_or_else(|| "child".into(), |n| n.to_string_lossy().into_owned());
    let path = std::path::Path::new(&dir).join(format!(
        "{name}-{}-{}.log",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    match std::fs::File::create(&path) {
        Ok(f) => f.into(),
        Err(e) => panic!("MOONCAKE_TEST_LOG_DIR: {}: {e}", path.display()),
    }
}

/// Spawns `bin`; its stdout lines containing `marker` arrive on the receiver.
pub fn spawn_watching(bin: &str, args: &[String], marker: &str) -> (Proc, mpsc::Receiver<String>) {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(child_stderr(bin))
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let marker = marker.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if line.contains(&marker) && tx.send(line).is_err() {
                return;
            }
        }
    });
    (Proc(child), rx)
}

/// Spawns `bin` and returns it with the first stdout line containing `marker`.
pub fn spawn_until_line(bin: &str, args: &[String], marker: &str) -> (Proc, String) {
    let (proc, lines) = spawn_watching(bin, args, marker);
    let line = lines
        .recv_timeout(WAIT)
        .unwrap_or_else(|_| panic!("{bin} printed no {marker:?} line"));
    (proc, line)
}

/// The value after `key=` in a ready line (`rpc=127.0.0.1:1234 …`).
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .map(|v| v.trim_end_matches([';', ',']))
}

/// Waits until something listens on loopback `port`.
pub fn wait_port(port: u16) {
    let deadline = Instant::now() + WAIT;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `cond` until it holds (bounded; no timing is asserted).
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_fields() {
        let line = "mooncake_master listening on rpc=127.0.0.1:4000 metadata=127.0.0.1:4002";
        assert_eq!(field(line, "rpc"), Some("127.0.0.1:4000"));
        assert_eq!(field(line, "metadata"), Some("127.0.0.1:4002"));
        assert_eq!(field(line, "nope"), None);
        assert_eq!(field("a rpc=x; b", "rpc"), Some("x"));
    }
}
